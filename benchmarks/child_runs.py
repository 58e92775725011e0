"""One ``qdebug.debugger`` pass per fresh process, for the A/B benchmarks (bench_segment_arena, bench_dequant,
bench_segment_threads): the parent re-runs its own script with ``--child MODEL N MODE`` and reads one JSON line."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = ["add_child_args", "child_main", "each_run", "run_child", "timed_debug"]


def add_child_args(ap: argparse.ArgumentParser, models: Sequence[str], samples: int) -> None:
    """``--models``, ``--samples``, ``--rounds``, ``--work`` (the quantized corpus ``bench_realmodels.py`` writes)
    and the hidden ``--child MODEL N MODE``."""
    ap.add_argument("--models", nargs="+", default=list(models))
    ap.add_argument("--samples", type=int, default=samples)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--work", type=Path, default=Path("/tmp/qdebug-bench"))
    ap.add_argument("--child", nargs=3, metavar=("MODEL", "N", "MODE"), help=argparse.SUPPRESS)


def child_main(ap: argparse.ArgumentParser, argv: list[str] | None, child: Any) -> argparse.Namespace | None:
    """Parse ``argv``. In a child process, run ``child(model, n, mode, work)``, print its JSON and return ``None``;
    in the parent, print the machine line and return the arguments."""
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child[0], int(a.child[1]), a.child[2], a.work)))
        return None
    print(f"Machine: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}; N = {a.samples}")
    return a


def run_child(script: str, work: Path, model: str, n: int, mode: str) -> dict[str, Any]:
    """``script``'s child run in a fresh process (its last stdout line, as JSON)."""
    cmd = [sys.executable, script, "--work", str(work), "--child", model, str(n), mode]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()
    return dict(json.loads(out[-1]))


def each_run(script: str, a: argparse.Namespace, modes: Sequence[str]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """``(model, mode, result)`` of every child run: per model of ``a.models``, ``a.rounds`` rounds of ``modes``
    in turn (interleaved, so the machine's drift reaches every mode alike)."""
    for model in a.models:
        for _ in range(a.rounds):
            for mode in modes:
                yield model, mode, run_child(script, a.work, model, a.samples, mode)


def timed_debug(
    model: str, n: int, work: Path, capture: str, skip: int = 0, tuning: Any = None
) -> tuple[Any, dict[str, float]]:
    """``qdebug.debugger`` on a corpus model in this process: the report, and its wall time, per-sample time after the
    first ``skip`` + 1 samples, and the process's peak RSS so far (``tuning``: a ``CaptureTuning``, else defaults)."""
    from bench_realmodels import prepare

    from qdebug.debugger import DebugOptions, debug

    fp, qp, folder = prepare(model, work, n)
    ends: list[float] = []
    t0 = time.perf_counter()
    rep = debug(
        fp,
        qp,
        folder,
        DebugOptions(capture=capture, num_samples=n, tuning=tuning),
        progress=lambda i, k: ends.append(time.perf_counter()),
    )
    status = Path("/proc/self/status").read_text().splitlines()
    return rep, {
        "wall_s": time.perf_counter() - t0,
        "per_sample_ms": (ends[-1] - ends[skip]) / (len(ends) - 1 - skip) * 1e3,
        "peak_mb": next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmHWM")),
    }
