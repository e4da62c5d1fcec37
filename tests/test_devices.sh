#!/usr/bin/env bash
# test_devices.sh — `frugal devices`: the table and its JSON agree with what
# clinfo reports of the same devices, no device is exit 1 with what to
# install (the ICD loader pointed at an empty vendor directory), a usage
# error is exit 2, --help teaches. Skipped (77) in a build without OpenCL.
. "$(dirname "$0")/lib.sh"

"$bin" devices >/dev/null 2>"$tmp/err0"
if grep -q "built without OpenCL" "$tmp/err0"; then
    expect_fail "devices without OpenCL" 1 "built without OpenCL" "$bin" devices
    echo "skipped: frugal built without OpenCL"
    exit 77
fi

expect "devices --help" "$bin" devices --help
grep -q -- "--json" "$tmp/out" && grep -q "exit status" "$tmp/out" && ok || no "--help: $(head -3 "$tmp/out")"
expect_fail "an unknown option" 2 "unknown option '--bogus'" "$bin" devices --bogus
"$bin" help | grep -q "^  devices " && ok || no "devices in frugal help"

# No platform: the loader finds no vendor file.
mkdir -p "$tmp/novendors"
expect_fail "no device" 1 "no OpenCL device found; install pocl-opencl-icd" \
    env OCL_ICD_VENDORS="$tmp/novendors" "$bin" devices
OCL_ICD_VENDORS="$tmp/novendors" "$bin" devices --json 2>/dev/null | python3 -c \
    'import json,sys; d=json.load(sys.stdin); sys.exit(0 if d["devices"]==[] else 1)' && ok ||
    no "--json with no device: an empty list"

if ! "$bin" devices >"$tmp/table" 2>"$tmp/err"; then
    cat "$tmp/err"
    echo "skipped: no OpenCL device"
    exit 77
fi
"$bin" devices --json >"$tmp/json" && ok || no "devices --json failed"
# the CPU's line first (test_cpu_provider checks it), then the devices' table
head -1 "$tmp/table" | grep -q "^cpu " && ok || no "first line: $(head -1 "$tmp/table")"
sed -n 2p "$tmp/table" | grep -q "^index *platform *device *memory *largest *fp16 *units$" && ok ||
    no "table header: $(sed -n 2p "$tmp/table")"

# The JSON against clinfo's own view (an independent reader of the same ICDs).
if command -v clinfo >/dev/null; then
    clinfo --raw >"$tmp/clinfo" 2>/dev/null
    python3 - "$tmp/json" "$tmp/clinfo" "$tmp/table" <<'PY' && ok || no "devices vs clinfo"
import json, re, sys
devs = json.load(open(sys.argv[1]))["devices"]
raw = open(sys.argv[2]).read()
rows = open(sys.argv[3]).read().splitlines()[2:]  # after the cpu line and the header
def field(name):  # clinfo --raw lines: "[PLAT/DEV] CL_DEVICE_X  value"
    return [l.split(None, 2)[2] if len(l.split(None, 2)) > 2 else ""
            for l in raw.splitlines() if re.match(r"\s*\[[^\]]*/\d+\]\s+%s\s" % name, l + " ")]
names, mem, alloc = field("CL_DEVICE_NAME"), field("CL_DEVICE_GLOBAL_MEM_SIZE"), field("CL_DEVICE_MAX_MEM_ALLOC_SIZE")
units, ext = field("CL_DEVICE_MAX_COMPUTE_UNITS"), field("CL_DEVICE_EXTENSIONS")
bad = []
if len(devs) != len(names): bad.append("count %d vs clinfo %d" % (len(devs), len(names)))
for i, d in enumerate(devs[:len(names)]):
    if d["index"] != i: bad.append("index %d" % i)
    if d["name"] != names[i].strip(): bad.append("name %r vs %r" % (d["name"], names[i]))
    if d["global_mem"] != int(mem[i]): bad.append("global_mem %d vs %s" % (d["global_mem"], mem[i]))
    if d["max_alloc"] != int(alloc[i]): bad.append("max_alloc %d vs %s" % (d["max_alloc"], alloc[i]))
    if d["compute_units"] != int(units[i]): bad.append("units %d vs %s" % (d["compute_units"], units[i]))
    if d["fp16"] != ("cl_khr_fp16" in ext[i].split()): bad.append("fp16")
    if d["fp64"] != ("cl_khr_fp64" in ext[i].split()): bad.append("fp64")
    r = rows[i].split()
    if r[0] != str(i) or r[-1] != str(d["compute_units"]) or r[-2] != ("yes" if d["fp16"] else "no"):
        bad.append("table row %d: %s" % (i, rows[i]))
if bad:
    print("\n".join(bad), file=sys.stderr)
    sys.exit(1)
PY
fi
finish
