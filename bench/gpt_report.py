#!/usr/bin/python3
"""gpt_report.py — the tables of bench/gpt.sh, from its runs file.

    gpt_report.py --runs bench/out/gpt_runs.jsonl [--warmup 2] [--json-out bench/out/gpt.json]

Each line of the runs file is one process: {"part": "tiny" | "sweep" |
"gpt2-estimate" | "gpt2-plan" | "gpt2-train", "impl": "frugal" | "torch",
"round", "seq", "batch", "steps", "rc", "lines": [its stdout lines]}.
torch_gpt.py prints one JSON object; frugal prints JSON events, the last a
{"event": "summary", ...}. What is read from frugal:

- step time: the median of its per-step events after the first --warmup
  ({"event": "step", ...} with "ms", "step_ms" or "seconds"), or else a
  median the summary states ("median_step_ms", "step_ms_median",
  "median_ms", "ms_per_step"), or else the summary's "seconds" over the
  steps run, which includes the warm-up steps and the setup (said so in the
  table);
- peak RSS: the summary's "peak_rss_bytes";
- bytes held for backward: the summary's memory.allocated_peak.activations
  (the activations category: forward values saved for backward);
- predicted and measured peaks: "predicted_step_reserved" and
  "measured_reserved_peak" (train), every key with "peak" in its name
  (estimate, plan).

A cell over several runs is the median of the runs' values. Prints markdown;
--json-out writes everything as one JSON document (bench/gpt_chart.py reads
its "sweep").
"""
import argparse
import json
import re
import statistics
import sys

GOALS = {"time": 0.8, "rss": 0.25, "held": 0.3}  # frugal / torch at most
STEP_KEYS = ("ms", "step_ms", "time_ms")
SUMMARY_MS_KEYS = ("median_step_ms", "step_ms_median", "median_ms", "ms_per_step")


def json_objects(lines):
    """Every JSON object in the text, however it is split into lines."""
    text, dec, at, out = "\n".join(lines), json.JSONDecoder(), 0, []
    while True:
        at = text.find("{", at)
        if at < 0:
            return out
        try:
            obj, at = dec.raw_decode(text, at)
            out.append(obj)
        except json.JSONDecodeError:
            at += 1


def peaks(obj, prefix="", inside=False):
    """{dotted key: value} of every number under a key with 'peak' in its name
    (memory.allocated_peak.activations too)."""
    out = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            name, hit = f"{prefix}{k}", inside or "peak" in k
            if isinstance(v, (int, float)) and not isinstance(v, bool) and hit:
                out[name] = v
            elif isinstance(v, dict):
                out.update(peaks(v, name + ".", hit))
    return out


UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
SIZE = r"([\d.]+) (B|KiB|MiB|GiB)"


def size(m, at=1):
    return round(float(m.group(at)) * UNITS[m.group(at + 1)])


def step_times(lines):
    """Each step's ms from frugal's log lines ('step i/n loss L M ms/step ...',
    M the mean over steps 1..i): as [(first step, last step, mean ms)] per
    interval between two lines."""
    out, prev_i, prev_total = [], 0, 0.0
    for l in lines:
        m = re.search(r"\bstep (\d+)/(\d+) loss \S+ ([\d.]+) ms/step", l)
        if not m:
            continue
        i, total = int(m.group(1)), int(m.group(1)) * float(m.group(3))
        if i > prev_i:
            out.append((prev_i + 1, i, (total - prev_total) / (i - prev_i)))
            prev_i, prev_total = i, total
    return out


def text_memory(lines):
    """peak_rss_bytes, held_bytes, predicted_step_reserved, measured_reserved_peak
    from frugal's text memory lines (to the 0.1 MiB they print)."""
    out = {}
    for l in lines:
        m = re.search(r"process peak RSS " + SIZE, l)
        if m:
            out["peak_rss_bytes"] = size(m)
        m = re.search(r"predicted for the training step " + SIZE + " reserved", l)
        if m:
            out["predicted_step_reserved"] = size(m)
        m = re.search(r"measured peak reserved " + SIZE, l)
        if m:
            out["measured_reserved_peak"] = size(m)
        m = re.match(r"\|\s+activations\s+\|[^|]*\|\s+" + SIZE + r"\s+\|", l)
        if m:
            out["held_bytes"] = size(m)
    return out


def frugal_run(run, warmup):
    """{ms, ms_source, peak_rss_bytes, held_bytes, ...} of one `frugal train` run
    (--json or text), or None."""
    if run["rc"]:
        return None
    events = json_objects(run["lines"])
    summary = next((e for e in reversed(events) if e.get("event") == "summary"), None)
    steps = []
    for e in events:
        if e.get("event") != "step":
            continue
        for k in STEP_KEYS:
            if isinstance(e.get(k), (int, float)):
                steps.append(float(e[k]))
                break
        else:
            if isinstance(e.get("seconds"), (int, float)):
                steps.append(1e3 * e["seconds"])
    logged = [(a, b, ms) for a, b, ms in step_times(run["lines"]) if a > warmup]
    if len(steps) > warmup:
        ms, src = statistics.median(steps[warmup:]), f"median of {len(steps) - warmup} step events"
    elif logged:
        ms = statistics.median(v for _, _, v in logged)
        src = f"median of the steps after the first {warmup}, from frugal's log lines"
    elif summary and any(isinstance(summary.get(k), (int, float)) for k in SUMMARY_MS_KEYS):
        k = next(k for k in SUMMARY_MS_KEYS if isinstance(summary.get(k), (int, float)))
        ms, src = float(summary[k]), f"summary {k}"
    elif summary and summary.get("seconds"):
        total = run["steps"] + warmup
        ms, src = 1e3 * summary["seconds"] / total, f"seconds / {total} steps (setup and warm-up included)"
    else:
        ms, src = None, "none"
    out = {"ms": ms, "ms_source": src, "step_ms": [round(v, 1) for _, _, v in step_times(run["lines"])]}
    if summary:
        mem = summary.get("memory") or {}
        out.update({"peak_rss_bytes": summary.get("peak_rss_bytes"),
                    "held_bytes": (mem.get("allocated_peak") or {}).get("activations"),
                    "predicted_step_reserved": summary.get("predicted_step_reserved"),
                    "measured_reserved_peak": summary.get("measured_reserved_peak"),
                    "allocated_peak": mem.get("allocated_peak"), "summary": summary, "exact": True})
    else:
        tm = text_memory(run["lines"])
        if not tm and ms is None:
            return None
        out.update(tm)
        out["exact"] = False
    return out


def torch_run(run):
    objs = json_objects(run["lines"])
    if run["rc"] or not objs:
        return None
    r = objs[-1]
    r["ms"], r["held_bytes"] = r["median_ms"], r["saved_bytes"]
    return r


def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def cell(runs, key):
    return med([r.get(key) for r in runs if r])


def fmt(v, f):
    return "-" if v is None else f(v)


def mib(v):
    return f"{v / 2**20:.1f}"


def ratio(a, b):
    return a / b if a is not None and b else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", required=True)
    ap.add_argument("--warmup", type=int, default=2, help="frugal step events to drop at the start")
    ap.add_argument("--json-out")
    o = ap.parse_args()
    runs = [json.loads(l) for l in open(o.runs) if l.strip()]

    def parsed(part, impl, seq=None):
        out = []
        for r in runs:
            if r["part"] == part and r["impl"] == impl and (seq is None or r["seq"] == seq):
                out.append(frugal_run(r, o.warmup if part == "tiny" else 1) if impl == "frugal" else torch_run(r))
        return out

    doc = {"goals": GOALS}
    # 1. gpt-tiny
    tiny = {}
    for impl in ("frugal", "torch"):
        rs = parsed("tiny", impl)
        if not rs:
            continue
        ok = [r for r in rs if r]
        tiny[impl] = {"runs": len(rs), "failed": len(rs) - len(ok), "ms": cell(ok, "ms"),
                      "ms_each": [r["ms"] for r in ok], "peak_rss_bytes": cell(ok, "peak_rss_bytes"),
                      "held_bytes": cell(ok, "held_bytes")}
        if impl == "frugal" and ok:
            tiny[impl]["ms_source"] = ok[0]["ms_source"]
            tiny[impl]["step_ms"] = [r["step_ms"] for r in ok]
            exact = [r for r in parsed("tiny-json", "frugal") if r and r.get("held_bytes") is not None]
            if exact:  # the --json run's bytes, not the text's 0.1 MiB
                tiny[impl]["held_bytes"] = exact[0]["held_bytes"]
                tiny[impl]["allocated_peak"] = exact[0]["allocated_peak"]
                tiny[impl]["predicted_step_reserved"] = exact[0]["predicted_step_reserved"]
                tiny[impl]["measured_reserved_peak"] = exact[0]["measured_reserved_peak"]
        if impl == "torch" and ok:
            t = tiny[impl]
            t["gemm_share"] = cell(ok, "gemm_share")
            t["saved_tt_bytes"] = cell(ok, "saved_tt_bytes")
            t["saved_formula_bytes"] = ok[0].get("saved_formula_bytes")
            t["params"] = ok[0]["params"]
            t["matmul_1024_gflops"] = [r["matmul_1024_gflops"] for r in ok]
            t["loss"] = [(r["first_loss"], r["last_loss"]) for r in ok]
    doc["tiny"] = tiny
    errors = sorted({f"{r['part']} {r['impl']} T {r['seq']}: exit {r['rc']}: " + " / ".join(r.get("stderr", [])[-2:])
                     for r in runs if r["rc"] and r["part"] in ("tiny", "sweep")})
    doc["errors"] = errors
    print("## gpt-tiny: 6 layers, 6 heads, d 384, T 256, batch 8, AdamW\n")
    print("| engine | runs | ms/step | per-run ms/step | peak RSS MiB | held for backward MiB |")
    print("|---|---:|---:|---|---:|---:|")
    for impl, t in tiny.items():
        each = ", ".join(f"{v:.0f}" for v in t["ms_each"] if v is not None)
        fail = f" ({t['failed']} failed)" if t["failed"] else ""
        print(f"| {impl} | {t['runs']}{fail} | {fmt(t['ms'], lambda v: f'{v:.1f}')} | {each} | "
              f"{fmt(t['peak_rss_bytes'], mib)} | {fmt(t['held_bytes'], mib)} |")
    print()
    if "frugal" in tiny and "torch" in tiny:
        f, t = tiny["frugal"], tiny["torch"]
        rat = {"time": ratio(f["ms"], t["ms"]), "rss": ratio(f["peak_rss_bytes"], t["peak_rss_bytes"]),
               "held": ratio(f["held_bytes"], t["held_bytes"])}
        doc["tiny"]["ratios"] = rat
        for k, name in (("time", "step time"), ("rss", "peak RSS"), ("held", "bytes held for backward")):
            v = rat[k]
            verdict = "-" if v is None else ("met" if v <= GOALS[k] else "NOT met")
            print(f"- {name}: frugal / torch = {fmt(v, lambda x: f'{x:.3f}')} (goal <= {GOALS[k]}): {verdict}")
        if f.get("ms_source"):
            print(f"- frugal's ms/step: {f['ms_source']}")
    if "torch" in tiny:
        t = tiny["torch"]
        print(f"- PyTorch: {t['params']} parameters; held {fmt(t['held_bytes'], lambda v: f'{v / 1e6:.1f}')} MB "
              f"({fmt(t['held_bytes'], lambda v: f'{v:.0f}')} bytes; by hand, torch_gpt.saved_formula: "
              f"{fmt(t['saved_formula_bytes'], lambda v: f'{v:.0f}')}), "
              f"of it {fmt(t['saved_tt_bytes'], mib)} MiB in softmax's (B, heads, T, T) outputs; GEMM "
              f"(mm/addmm/bmm) {fmt(t['gemm_share'], lambda v: f'{100 * v:.1f}')}% of its ops' self CPU "
              f"time in a profiled step; 1024x1024 matmul {min(t['matmul_1024_gflops']):.0f}-"
              f"{max(t['matmul_1024_gflops']):.0f} GFLOP/s; loss "
              + ", ".join(f"{a:.3f} -> {b:.3f}" for a, b in t["loss"]))
    for e in errors:
        print(f"- failed: {e}")
    print()

    # 2. the sweep
    seqs = sorted({r["seq"] for r in runs if r["part"] == "sweep"})
    sweep = []
    for s in seqs:
        fr, tr = [r for r in parsed("sweep", "frugal", s) if r], [r for r in parsed("sweep", "torch", s) if r]
        batch = next(r["batch"] for r in runs if r["part"] == "sweep" and r["seq"] == s)
        p = {"seq": s, "batch": batch}
        for impl, rs in (("frugal", fr), ("torch", tr)):
            if rs:
                p[impl] = {"ms": cell(rs, "ms"), "peak_rss_bytes": cell(rs, "peak_rss_bytes"),
                           "held_bytes": cell(rs, "held_bytes")}
                if impl == "torch":
                    p[impl]["saved_tt_bytes"] = cell(rs, "saved_tt_bytes")
                    p[impl]["saved_formula_bytes"] = rs[0].get("saved_formula_bytes")
        sweep.append(p)
    doc["sweep"] = sweep
    if sweep:
        tokens = sweep[0]["seq"] * sweep[0]["batch"]
        print(f"## Context sweep at B x T = {tokens} tokens\n")
        print("| T | B | frugal ms/step | torch ms/step | time ratio | frugal RSS MiB | torch RSS MiB | "
              "frugal held MiB | torch held MiB (T x T) | held ratio |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for p in sweep:
            f, t = p.get("frugal", {}), p.get("torch", {})
            g = lambda d, k: d.get(k)
            print(f"| {p['seq']} | {p['batch']} | {fmt(g(f, 'ms'), lambda v: f'{v:.0f}')} | "
                  f"{fmt(g(t, 'ms'), lambda v: f'{v:.0f}')} | "
                  f"{fmt(ratio(g(f, 'ms'), g(t, 'ms')), lambda v: f'{v:.2f}')} | "
                  f"{fmt(g(f, 'peak_rss_bytes'), mib)} | {fmt(g(t, 'peak_rss_bytes'), mib)} | "
                  f"{fmt(g(f, 'held_bytes'), mib)} | {fmt(g(t, 'held_bytes'), mib)} "
                  f"({fmt(g(t, 'saved_tt_bytes'), mib)}) | "
                  f"{fmt(ratio(g(f, 'held_bytes'), g(t, 'held_bytes')), lambda v: f'{v:.3f}')} |")
        print()

    # 3. GPT-2 124M under 4 GiB
    g2 = {}
    for part in ("gpt2-estimate", "gpt2-plan", "gpt2-train"):
        rs = [r for r in runs if r["part"] == part]
        if not rs:
            continue
        r = rs[-1]
        objs = json_objects(r["lines"])
        entry = {"rc": r["rc"], "peaks": {}}
        for obj in objs:
            entry["peaks"].update(peaks(obj))
        if part == "gpt2-train":
            fr = frugal_run(r, 0)
            if fr:
                entry.update({k: fr[k] for k in ("peak_rss_bytes", "predicted_step_reserved",
                                                  "measured_reserved_peak", "held_bytes")})
                entry["budget"] = (fr.get("summary") or {}).get("budget")
        if r["rc"] or not objs:
            entry["output"] = (r["lines"] + r.get("stderr", []))[-5:]
        g2[part] = entry
    doc["gpt2"] = g2
    if g2:
        print("## GPT-2 124M, batch 4, T 1024, AdamW, --budget 4G (frugal)\n")
        for part, e in g2.items():
            if e["rc"] or "output" in e:
                print(f"- {part}: exit {e['rc']}: " + " / ".join(e.get("output", [])))
                continue
            ps = ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in e["peaks"].items() if v >= 2**20)
            print(f"- {part}: {ps or 'no peak figures'}")
        tr = g2.get("gpt2-train", {})
        if tr.get("predicted_step_reserved") is not None:
            print("\n| predicted step reserved | measured reserved peak | measured / predicted | process peak RSS | budget |")
            print("|---:|---:|---:|---:|---:|")
            pr, me = tr["predicted_step_reserved"], tr["measured_reserved_peak"]
            print(f"| {mib(pr)} MiB | {fmt(me, mib)} MiB | {fmt(ratio(me, pr), lambda v: f'{v:.3f}')} | "
                  f"{fmt(tr['peak_rss_bytes'], mib)} MiB | {fmt(tr.get('budget'), mib)} MiB |")
        print()

    if o.json_out:
        with open(o.json_out, "w") as fo:
            json.dump(doc, fo, indent=1)
            fo.write("\n")


if __name__ == "__main__":
    sys.exit(main())
