"""What ``quantize``'s weight-recipe choice costs and buys on corpus models (issue 35, deliverable 7).

Per model, in this process, ``--repeats`` times (the best time kept): ``qdebug.quantize(float, calib.npz)`` with the
output check and the recipe followed as given (``per_channel_fallback=False``: calibration, one QDQ insertion, one
check run), then as ``qdebug quantize`` runs it by default (the same, plus one QDQ insertion and one check run per
alternative weight recipe). Prints each recipe's worst output on the check samples, the one written, both wall
times, and the alternatives' own seconds from ``QuantizeResult.choice`` (their share of the plain quantize).
``--samples N`` calibrates on the first N samples of ``calib.npz`` so the check runs on samples calibration did not
see (the corpus files hold 32).

Usage::

    .venv/bin/python benchmarks/bench_quantize_choice.py [--models ppocrv4-rec u2netp silero-vad] [--samples 28]
        [--repeats 2] [--work /tmp/qdebug-choice]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
DEFAULT_MODELS = ("ppocrv4-rec", "u2netp", "silero-vad")


def _timed(fn: Any, repeats: int) -> tuple[float, Any]:
    """(best wall seconds, last result) of ``repeats`` calls."""
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return min(times), result


def measure(model: str, samples: int | None, repeats: int, work: Path) -> dict[str, Any]:
    """One model: the plain quantize and the default one, their times and the choice made."""
    from realmodels import registry

    from qdebug.config import QuantConfig
    from qdebug.quantizer import quantize

    src = registry.cache_dir() / model
    fp, calib = src / f"{model}.onnx", src / "calib.npz"
    if not fp.exists():
        raise SystemExit(f"{fp}: not cached; run benchmarks/realmodels/fetch.py --only {model}")
    w = work / model
    shutil.rmtree(w, ignore_errors=True)
    w.mkdir(parents=True)
    cfg = QuantConfig(num_samples=samples)
    plain_s, plain = _timed(lambda: quantize(fp, calib, cfg, w / "plain.onnx", per_channel_fallback=False), repeats)
    chosen_s, chosen = _timed(lambda: quantize(fp, calib, cfg, w / "chosen.onnx"), repeats)
    return {"model": model, "plain_s": plain_s, "chosen_s": chosen_s, "plain": plain, "chosen": chosen}


def _row(r: dict[str, Any]) -> str:
    choice = r["chosen"].choice
    trials = " / ".join(
        f"{t.label} {t.worst_db:.1f}" if t.worst_db is not None else f"{t.label} n/a" for t in choice.trials
    )
    # the alternatives' own cost from the record (their QDQ insertion + check run): the wall-time difference of two
    # quantize calls also carries the calibration's noise on a shared machine
    own = sum(t.seconds for t in choice.trials[1:])
    return (
        f"| {r['model']} | {r['chosen'].num_calibration_samples} | {r['chosen'].checked_on} | {trials} | "
        f"**{choice.written.label}** | {r['plain_s']:.2f} | {r['chosen_s']:.2f} | {own:.2f} "
        f"({100 * own / r['plain_s']:.0f} %) |"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the models and print a markdown table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    p.add_argument("--samples", type=int, default=None, help="calibrate on the first N samples of calib.npz")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--work", type=Path, default=Path("/tmp/qdebug-choice"))
    args = p.parse_args(argv)
    rows = [measure(m, args.samples, args.repeats, args.work) for m in args.models]
    import onnxruntime

    print(
        "| model | calibration samples | check samples | worst output dB per recipe (measured in this order) | "
        "written | quantize, recipe as given s | quantize, default s | alternatives' QDQ + check s (÷ as given) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(_row(r))
    print(
        f"\nMachine: {os.cpu_count()} cores shared, {platform.machine()}, Python {platform.python_version()}, "
        f"onnxruntime {onnxruntime.__version__}; load average at the end {os.getloadavg()[0]:.1f}."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
