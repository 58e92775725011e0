"""Segmented capture A/B on a corpus model (issue 12): the whole-model fetch run against segments of a given size,
pipelined or not, each in a fresh process, interleaved over rounds.

Modes: ``whole`` (segmenting off), ``<MB>-pipe`` / ``<MB>-seq`` (segmenting forced above 160 MB with segments of
``<MB>`` MB, the next segment inferred on a worker thread or, as on one core, not). Prints, per run, the
steady per-sample wall time (end of sample 0 to the end), the process CPU time per sample (all threads) and the peak
RSS (``VmHWM``). Uses the quantized model and data folders ``bench_realmodels.py --work W`` prepared.

Usage::

    .venv/bin/python benchmarks/profile_segments.py --model ppocrv4-rec --work /tmp/bpipe --n 8 \\
        [--modes whole 64-pipe 64-seq] [--method fetch|compiled] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def child(model: str, work: Path, n: int, mode: str, method: str) -> dict[str, Any]:
    """One debug run in this process."""
    from qdebug.capture import CaptureTuning
    from qdebug.debugger import DebugOptions, debug

    sys.path.insert(0, str(REPO / "benchmarks"))
    from realmodels import registry

    if mode == "whole":
        tuning = CaptureTuning(segment_above=1 << 62, pipelined_above=1 << 62)
    else:
        size, kind = mode.split("-")[:2]
        # seq: one core's run, whose segments are not pipelined (the threshold is the same: both are set)
        cores = 1 if kind == "seq" else None
        tuning = CaptureTuning(
            segment_above=160 << 20, pipelined_above=160 << 20, segment_bytes=int(size) << 20, cores=cores
        )
    fp = registry.cache_dir() / model / f"{model}.onnx"
    ends: list[float] = []
    cpu: list[float] = []

    def progress(i: int, total: int) -> None:
        u = resource.getrusage(resource.RUSAGE_SELF)
        ends.append(time.perf_counter())
        cpu.append(u.ru_utime + u.ru_stime)

    rep = debug(
        fp,
        work / f"{model}.qdq.onnx",
        work / "data" / model / f"n{n}",
        DebugOptions(capture=method, tuning=tuning),
        progress=progress,
    )
    with open("/proc/self/status") as fh:
        hwm = next(int(line.split()[1]) / 1024 for line in fh if line.startswith("VmHWM"))
    cap = rep.meta.capture
    return {
        "mode": mode,
        "per_sample_s": (ends[-1] - ends[0]) / (len(ends) - 1),
        "cpu_per_sample_s": (cpu[-1] - cpu[0]) / (len(cpu) - 1),
        "peak_rss_mb": hwm,
        "segments": cap.segments if cap else 1,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--model", required=True)
    p.add_argument("--work", type=Path, default=Path("/tmp/qdebug-bench"))
    p.add_argument("--n", type=int, default=8, help="the data folder n<N> bench_realmodels.py wrote")
    p.add_argument("--modes", nargs="+", default=["whole", "64-pipe", "64-seq"])
    p.add_argument("--method", default="fetch", choices=["fetch", "numpy", "compiled"])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.model, args.work, args.n, args.child, args.method)))
        return 0
    print(f"{args.model}, {args.method} reduction, {args.n} samples")
    for r in range(args.rounds):
        for mode in args.modes:
            cmd = [sys.executable, __file__, "--model", args.model, "--work", str(args.work), "--n", str(args.n)]
            run = [*cmd, "--method", args.method, "--child", mode]
            out = subprocess.run(run, check=False, capture_output=True, text=True)
            if out.returncode:
                print(f"round {r} {mode}: failed: {out.stderr.strip().splitlines()[-1:]}")
                continue
            x = json.loads(out.stdout.strip().splitlines()[-1])
            print(
                f"round {r} {mode:9s} segments {x['segments']:3d}  per-sample {x['per_sample_s']:.3f} s  "
                f"CPU/sample {x['cpu_per_sample_s']:.3f} s  peak {x['peak_rss_mb']:.0f} MB"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
