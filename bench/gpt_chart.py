#!/usr/bin/python3
"""gpt_chart.py — bench/gpt.sh's chart: the bytes each engine holds for the
backward against the context length T (B x T fixed), as one self-contained
SVG (no scripts, no external fonts or files).

    gpt_chart.py bench/out/gpt.json bench/out/gpt_context.svg

Reads the "sweep" list of gpt_report.py's JSON: per point "seq", "batch" and
per engine "held_bytes" (PyTorch: what saved_tensors_hooks packs in one
forward; frugal: its activations peak), PyTorch's "saved_tt_bytes" (the
softmax (B, heads, T, T) outputs among them) drawn dashed. The x axis is T on
a log2 scale, the y axis MiB from 0; every point carries its value.
"""
import json
import math
import sys
from xml.sax.saxutils import escape

W, H = 760, 500
LEFT, RIGHT, TOP, BOTTOM = 80, 30, 70, 70
FRUGAL, TORCH, TORCH_TT = "#1f5fa8", "#d2691e", "#d2691e"


def nice_step(span, ticks=6):
    raw = span / ticks
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def chart(sweep):
    series = []  # (name, colour, dashed, marker, [(T, MiB)])
    for impl, name, colour, marker in (("frugal", "frugal (activations peak)", FRUGAL, "circle"),
                                       ("torch", "PyTorch 1.13 (saved for backward)", TORCH, "square")):
        pts = [(p["seq"], p[impl]["held_bytes"] / 2**20) for p in sweep
               if p.get(impl) and p[impl].get("held_bytes") is not None]
        if pts:
            series.append((name, colour, False, marker, pts))
    tt = [(p["seq"], p["torch"]["saved_tt_bytes"] / 2**20) for p in sweep
          if p.get("torch") and p["torch"].get("saved_tt_bytes") is not None]
    if tt:
        series.append(("of it PyTorch's T x T softmax outputs", TORCH_TT, True, "none", tt))
    if not series:
        raise SystemExit("gpt_chart.py: no held bytes in the sweep")

    seqs = sorted({t for s in series for t, _ in s[4]})
    x0, x1 = math.log2(seqs[0]), math.log2(seqs[-1])
    x0, x1 = x0 - 0.3, x1 + 0.3  # the first and last points off the frame
    ymax = max(v for s in series for _, v in s[4]) * 1.12
    step = nice_step(ymax)
    ymax = math.ceil(ymax / step) * step
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def X(t):
        return LEFT + (math.log2(t) - x0) / (x1 - x0) * pw

    def Y(v):
        return TOP + ph - v / ymax * ph

    tokens = sweep[0]["seq"] * sweep[0]["batch"]
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}">',
         '<rect width="100%" height="100%" fill="white"/>',
         f'<text x="{W / 2}" y="24" text-anchor="middle" font-family="sans-serif" font-size="15">'
         f'GPT (6 layers, 6 heads, d 384): bytes held for backward against context length</text>',
         f'<text x="{W / 2}" y="44" text-anchor="middle" font-family="sans-serif" font-size="12" fill="#444">'
         f'B x T = {tokens} tokens at every T; AdamW; float32</text>',
         '<g font-family="sans-serif" font-size="11">',
         f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>']
    v = 0.0
    while v <= ymax + 1e-9:
        y = Y(v)
        o.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + pw}" y2="{y:.1f}" stroke="#eee"/>')
        o.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#444">{v:g}</text>')
        v += step
    for t in seqs:
        x = X(t)
        o.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + ph}" stroke="#eee"/>')
        o.append(f'<text x="{x:.1f}" y="{TOP + ph + 16}" text-anchor="middle" fill="#444">{t}</text>')
        batch = next(p["batch"] for p in sweep if p["seq"] == t)
        o.append(f'<text x="{x:.1f}" y="{TOP + ph + 30}" text-anchor="middle" fill="#888">B {batch}</text>')
    o.append(f'<text x="{LEFT + pw / 2}" y="{H - 12}" text-anchor="middle" font-size="12">'
             'context length T (tokens per sequence, log scale)</text>')
    o.append(f'<text x="18" y="{TOP + ph / 2}" text-anchor="middle" font-size="12" '
             f'transform="rotate(-90 18 {TOP + ph / 2})">held for backward (MiB)</text>')

    for name, colour, dashed, marker, pts in series:
        pts = sorted(pts)
        path = " ".join(f"{X(t):.1f},{Y(v):.1f}" for t, v in pts)
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        o.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        for t, v in pts:
            x, y = X(t), Y(v)
            if marker == "circle":
                o.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{colour}"/>')
            elif marker == "square":
                o.append(f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" fill="{colour}"/>')
            ly = y + 17 if dashed else y - 8  # the dashed series' values below it, clear of the others
            o.append(f'<text x="{x:.1f}" y="{ly:.1f}" text-anchor="middle" fill="{colour}">{v:.1f}</text>')

    ly = TOP + 14
    for name, colour, dashed, marker, _ in series:
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        o.append(f'<line x1="{LEFT + 12}" y1="{ly - 4}" x2="{LEFT + 40}" y2="{ly - 4}" stroke="{colour}" '
                 f'stroke-width="2"{dash}/>')
        o.append(f'<text x="{LEFT + 46}" y="{ly}" fill="#222">{escape(name)}</text>')
        ly += 16
    o.append("</g>")
    o.append("</svg>")
    return "\n".join(o) + "\n"


def main():
    if len(sys.argv) != 3:
        raise SystemExit("usage: gpt_chart.py GPT.json OUT.svg")
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    svg = chart(doc.get("sweep") or [])
    with open(sys.argv[2], "w") as f:
        f.write(svg)


if __name__ == "__main__":
    main()
