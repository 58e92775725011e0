"""Resident memory along one ``qdebug.debugger`` run (issue 12): ``VmRSS`` after given samples, to tell a process that
settles (arenas and heaps reaching their working size in the first samples) from one that grows with N.

Models are corpus names; the quantized model and the data come from ``bench_realmodels.py --work`` (run it first).

Usage::

    .venv/bin/python benchmarks/rss_curve.py --models ppocrv4-det ppocr-cls --samples 256 --work /tmp/bpipe
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MARKS = (1, 4, 8, 16, 32, 64, 128, 192, 256, 384, 512)


def rss_mb() -> int:
    """This process's resident set (``VmRSS``) in MB."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) // 1024 for line in fh if line.startswith("VmRSS:"))


def child(model: str, n: int, work: Path) -> None:
    """One run in this process; prints ``sample: MB`` at each of :data:`MARKS` up to ``n``."""
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_realmodels import prepare

    from qdebug.debugger import DebugOptions, debug

    fp, qp, _ = prepare(model, work, n)
    marks: dict[int, int] = {}

    def progress(i: int, total: int) -> None:
        if i in MARKS:
            marks[i] = rss_mb()

    debug(fp, qp, work / "data" / model / f"n{n}", DebugOptions(), progress=progress)
    print(f"| {model} | " + " | ".join(f"{marks.get(m, '')}" for m in MARKS if m <= n) + " |", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["ppocrv4-det", "ppocr-cls"])
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--work", type=Path, default=Path("/tmp/qdebug-bench"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(a.child, a.samples, a.work)
        return 0
    marks = [m for m in MARKS if m <= a.samples]
    print(f"RSS MB after sample k (N = {a.samples}, `auto`, fresh process per model)\n")
    print("| model | " + " | ".join(str(m) for m in marks) + " |")
    print("|---|" + "---|" * len(marks), flush=True)
    for model in a.models:  # a fresh process each: nothing of one model's run stays in the next one's memory
        cmd = [sys.executable, __file__, "--child", model, "--samples", str(a.samples), "--work", str(a.work)]
        subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
