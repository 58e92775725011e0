"""This machine's memory bandwidth as numpy sees it: the yardstick for the exposed-bytes argument in
docs/benchmarks.md ("Real models against the exact-QDQ floor": why PP-OCRv4 rec and ViT-S stay closest to the line).

Copies a float32 array far larger than the caches (``np.copyto``: one read and one write of every byte) and a
sum over it (one read), best of ``--rounds``; prints GB/s of bytes moved.

Usage::

    .venv/bin/python benchmarks/bench_bandwidth.py [--mb 512] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    n = a.mb * (1 << 20) // 4
    src, dst = np.ones(n, np.float32), np.zeros(n, np.float32)
    copy = read = float("inf")
    for _ in range(a.rounds):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        copy = min(copy, time.perf_counter() - t0)
        t0 = time.perf_counter()
        float(src.sum(dtype=np.float32))
        read = min(read, time.perf_counter() - t0)
    size = n * 4 / 1e9
    print(f"copy {2 * size / copy:.1f} GB/s moved (read + write), read {size / read:.1f} GB/s; {a.mb} MB array")
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
