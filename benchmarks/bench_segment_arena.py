"""Segment sessions with one shared ONNX Runtime arena vs none (issue 12): per sample, CPU, page faults, peak.

A segmented model (``qdebug/capture/segmented.py``) runs as a dozen sessions, one after the other, every sample.
``heap`` is how they ran before: arena-less, every tensor of every segment fresh memory from the kernel each
sample. ``shared`` is how they run now: one arena registered in ORT's environment, used by every segment
(``qdebug.capture.session.shared_arena``). Each mode runs ``qdebug.debug`` with ``--capture numpy`` (so the
reduction is the same in both) in a fresh process; modes alternate over ``--rounds``.

Usage::

    .venv/bin/python benchmarks/bench_segment_arena.py --models u2netp vit-s-focus ppocrv4-det ppocrv4-rec \\
        yolov8n-nudenet --samples 12 --work /tmp/bpipe

``--work`` holds the quantized corpus models and data ``bench_realmodels.py`` writes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

MODES = ("heap", "shared")


def child(model: str, n: int, mode: str, work: Path) -> dict[str, Any]:
    """One debug pass in this process, with the segment sessions arena-less (``heap``) or sharing one arena."""
    from bench_realmodels import prepare

    from qdebug.capture import segmented
    from qdebug.debug import DebugOptions, debug

    if mode == "heap":  # the segments as they were: no arena at all
        plain = segmented.make_session

        def arena_less(*args: Any, **kwargs: Any) -> Any:
            return plain(*args, **{**kwargs, "arena": False})

        segmented.make_session = arena_less  # type: ignore[assignment]
    fp, qp, folder = prepare(model, work, n)
    ends: list[float] = []
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    rep = debug(
        fp,
        qp,
        folder,
        DebugOptions(capture="numpy", num_samples=n),
        progress=lambda i, k: ends.append(time.perf_counter()),
    )
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    status = Path("/proc/self/status").read_text().splitlines()
    hwm = next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmHWM"))
    cap = rep.meta.capture
    return {
        "model": model,
        "mode": mode,
        "n": n,
        "wall_s": time.perf_counter() - t0,
        "per_sample_ms": (ends[-1] - ends[0]) / (len(ends) - 1) * 1e3,
        "user_s": r1.ru_utime - r0.ru_utime,
        "sys_s": r1.ru_stime - r0.ru_stime,
        "minflt": r1.ru_minflt - r0.ru_minflt,
        "peak_mb": hwm,
        "segments": cap.segments if cap else 1,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["u2netp", "vit-s-focus", "ppocrv4-det", "ppocrv4-rec"])
    ap.add_argument("--samples", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--work", type=Path, default=Path("/tmp/qdebug-bench"))
    ap.add_argument("--child", nargs=3, metavar=("MODEL", "N", "MODE"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child[0], int(a.child[1]), a.child[2], a.work)))
        return 0
    print(f"Machine: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}")
    print("| model | segments | arena | per sample ms | user s | sys s | minor faults | peak MB |")
    print("|---|---|---|---|---|---|---|---|")
    for model in a.models:
        for _ in range(a.rounds):
            for mode in MODES:
                cmd = [sys.executable, __file__, "--work", str(a.work), "--child", model, str(a.samples), mode]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
                r = json.loads(out)
                print(
                    f"| {model} | {r['segments']} | {mode} | {r['per_sample_ms']:.0f} | {r['user_s']:.2f} | "
                    f"{r['sys_s']:.2f} | {r['minflt']:,} | {r['peak_mb']:.0f} |",
                    flush=True,
                )
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
