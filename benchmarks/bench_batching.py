"""Batched vs one-sample-per-call capture, same model, same process (issue 12, item 2).

For each model, ``qdebug.debugger`` runs once per ``--specs`` entry ``CAPTURE:BATCH`` (``BATCH`` a number, or
``auto`` for the default: ``auto`` decides), best of ``--rounds`` wall times, in one process (the first round
also warms numba's cache and the OS's file cache). Prints wall time, per-sample time (end of sample 0 to the end),
the backend and batch that ran, and the largest SQNR difference of any tensor against the first spec.

Models are corpus names (``benchmarks/realmodels``; quantized models and data from ``bench_realmodels.py`` in
``--work``) or the bundled ``digits_cnn`` / ``digits_transformer`` (quantized into ``--work`` on first use, run on
``sample_models/digits_eval.npz``).

Usage::

    .venv/bin/python benchmarks/bench_batching.py --models digits_cnn digits_transformer silero-vad minilm-l3 \\
        ppocr-cls --specs graph:1 numpy:1 auto:1 auto:auto --samples 64 --work /tmp/bpipe
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

BUNDLED = ("digits_cnn", "digits_transformer")


def _inputs(model: str, n: int, work: Path) -> tuple[Path, Path, Path, tuple[str, ...]]:
    """(float model, quantized model, data, data keys to ignore) for a bundled or corpus model."""
    if model in BUNDLED:
        from qdebug.quantizer import quantize

        fp, qp = REPO / "sample_models" / f"{model}.onnx", work / f"{model}.qdq.onnx"
        if not qp.exists():
            work.mkdir(parents=True, exist_ok=True)
            quantize(fp, REPO / "sample_models" / "digits_calib.npz", output=qp)
        return fp, qp, REPO / "sample_models" / "digits_eval.npz", ("label",)
    from bench_realmodels import prepare

    fp, qp, folder = prepare(model, work, n)
    return fp, qp, folder, ()


def _worst_db(a: Any, b: Any) -> float:
    """The largest |dB| difference of any tensor's cumulative or local SQNR between two reports."""
    worst = 0.0
    for x, y in zip(a.activations, b.activations, strict=True):
        for k in ("cumulative_sqnr_db", "local_sqnr_db"):
            u, v = getattr(x, k), getattr(y, k)
            if u is not None and v is not None and math.isfinite(u) and math.isfinite(v):
                worst = max(worst, abs(u - v))
    return worst


def run(model: str, specs: list[str], n: int, rounds: int, work: Path) -> None:
    """Print one row per spec for ``model``."""
    from qdebug.debugger import DebugOptions, debug

    fp, qp, data, ignore = _inputs(model, n, work)
    first = None
    for spec in specs:
        capture, batch = spec.split(":")
        opts = DebugOptions(
            capture=capture, batch=None if batch == "auto" else int(batch), num_samples=n, ignore_data_keys=ignore
        )
        best, per = math.inf, math.inf
        for _ in range(rounds):
            ends: list[float] = []
            t0 = time.perf_counter()
            rep = debug(fp, qp, data, opts, progress=lambda i, k, e=ends: e.append(time.perf_counter()))
            best = min(best, time.perf_counter() - t0)
            per = min(per, (ends[-1] - ends[0]) / max(1, len(ends) - 1))
        cap = rep.meta.capture
        first = first or rep
        print(
            f"| {model} | {n} | {spec} | {best:.2f} | {per * 1e3:.2f} | {cap.backend if cap else '?'} | "
            f"{cap.batch if cap else 1} | {_worst_db(first, rep):.1e} |",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(BUNDLED))
    ap.add_argument("--specs", nargs="+", default=["graph:1", "numpy:1", "auto:1", "auto:auto"])
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("/tmp/qdebug-bench"))
    a = ap.parse_args(argv)
    print(f"Machine: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}")
    print("| model | N | capture:batch | best wall s | per sample ms | backend | batch | max dB diff vs first |")
    print("|---|---|---|---|---|---|---|---|")
    for model in a.models:
        run(model, a.specs, a.samples, a.rounds, a.work)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
