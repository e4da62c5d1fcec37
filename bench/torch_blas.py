"""torch_blas.py — the BLAS check shared by torch_step.py, torch_gpt.py and torch_remat.py.

Debian's torch calls whatever libblas.so.3 the dynamic loader finds; the
reference BLAS runs nn.Linear at about 4 GFLOP/s. blas_check() lists the BLAS
libraries mapped into the process and measures the GFLOP/s of a 1024x1024
matmul; below SLOW_BLAS_GFLOPS the scripts warn to set
LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp.
"""
import os
import sys
import time

import torch

SLOW_BLAS_GFLOPS = 15.0  # below this, nn.Linear is on a reference-grade BLAS


def blas_check():
    """The libblas/openblas files mapped into this process and the GFLOP/s of a
    1024x1024 float32 matmul (best of 5)."""
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "blas" in os.path.basename(path):
                libs.add(path)
    a, b = torch.rand(1024, 1024), torch.rand(1024, 1024)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return sorted(libs), 2 * 1024 ** 3 / best / 1e9


def blas_report(script):
    """blas_check(), a warning on stderr naming `script` when the matmul is
    slow, and whether it is fast enough: (libs, gflops, blas_ok)."""
    libs, gflops = blas_check()
    blas_ok = gflops >= SLOW_BLAS_GFLOPS
    if not blas_ok:
        print(f"{script}: warning: a 1024x1024 matmul runs at {gflops:.1f} GFLOP/s "
              f"({', '.join(libs) or 'no BLAS mapped'}): nn.Linear is on a slow BLAS; set "
              "LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp", file=sys.stderr)
    return libs, gflops, blas_ok
