# st_tools.py — what the shell tests' Python helpers share (imported, not a
# test itself): a safetensors file read by hand (8-byte header length, JSON,
# raw little-endian data), two checkpoints compared tensor by tensor, a
# field of a JSON-lines run, two numbers within a relative bound.
# `run(argv)` serves the commands below; a test's own helper imports this
# module and adds its own commands before calling it.
import json, struct, sys


def read(path):
    """{name: (dtype, shape, bytes)}, the metadata left out"""
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    d = b[8 + n:]
    return {k: (v["dtype"], v["shape"], d[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in h.items()}


def vals(t):
    """a tensor's numbers: I64 as integers, F32 as floats"""
    if t[0] == "I64":
        return struct.unpack("<%dq" % (len(t[2]) // 8), t[2])
    return struct.unpack("<%df" % (len(t[2]) // 4), t[2])


def compare(pa, pb, rel, skip=None):
    """None, or why not: the same names, dtypes and shapes, and every F32
    tensor (but those whose name starts with `skip`) within rel of a's
    largest magnitude"""
    a, b = read(pa), read(pb)
    if sorted(a) != sorted(b):
        return "names differ: %s vs %s" % (sorted(a), sorted(b))
    for k in a:
        if a[k][:2] != b[k][:2]:
            return "%s: dtype/shape %s vs %s" % (k, a[k][:2], b[k][:2])
        if a[k][0] != "F32" or (skip and k.startswith(skip)):
            continue
        x, y = vals(a[k]), vals(b[k])
        scale = max(abs(v) for v in x)
        worst = max(abs(p - q) for p, q in zip(x, y))
        if worst > rel * scale:
            return "%s: max |b - a| = %g > %g * %g" % (k, worst, rel, scale)
    return None


def field(path, event, keys):
    """the value at keys ("a.b") of the last JSON line with this event"""
    ev = [json.loads(l) for l in open(path) if l.startswith("{")]
    v = [e for e in ev if e.get("event") == event][-1]
    for key in keys.split("."):
        v = v[key]
    return v


def run(argv):
    cmd = argv[1]
    if cmd == "tensors":  # a b rel: every F32 tensor within rel
        sys.exit(compare(argv[2], argv[3], float(argv[4])))
    elif cmd == "weights":  # a b rel: the same, the optimizer's state left out
        sys.exit(compare(argv[2], argv[3], float(argv[4]), skip="optimizer."))
    elif cmd == "field":  # file event key.path
        print(repr(field(argv[2], argv[3], argv[4])))
    elif cmd == "close":  # A B rel: |A - B| <= rel |A|
        a, b, rel = float(argv[2]), float(argv[3]), float(argv[4])
        sys.exit(0 if abs(a - b) <= rel * abs(a) else "%r vs %r (rel %g)" % (a, b, rel))
    else:
        sys.exit("st_tools: unknown command %s" % cmd)
