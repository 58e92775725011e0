"""Exposing a quantized activation's integers instead of its post-Q/DQ floats (issue 12, ``qdebug/capture/dequant.py``).

Three measurements, each against its own peer in the same run:

``ort``
    The quantized model alone, one sample, in ONNX Runtime (optimizations off, as qdebug runs it): plain (the
    floor), exposing every pre-Q/DQ and post-Q/DQ tensor (as before), and exposing the pre-Q/DQ tensors and the
    integers instead of the post-Q/DQ floats (as segmented runs now do). Median of ``--repeats`` runs.
``debug``
    ``qdebug.debug`` with ``--capture auto`` in a fresh process per run, with the integers exposed (``ints``) and
    without (``floats``: :func:`qdebug.capture.dequant.find_specs` finds nothing), alternating over ``--rounds``:
    per-sample time after the first sample, and the peak.
``kernel``
    The compiled reduction of one quantized activation (48 M elements in 48 tensors): two passes (the kernel
    before, :func:`pair_sums` twice), the fused pass on floats (:func:`both_sums`), the fused pass on integers
    (:func:`dequant_sums`).

Usage::

    .venv/bin/python benchmarks/bench_dequant.py --models ppocrv4-rec ppocrv4-det vit-s-focus yolov8n-nudenet \\
        u2netp --samples 16 --work /tmp/bpipe

``--work`` holds the quantized corpus models and data ``bench_realmodels.py`` writes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from child_runs import add_child_args, child_main, each_run, timed_debug  # noqa: E402


def _median_ms(run: Callable[[], object], repeats: int) -> float:
    run()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


def ort_side(model: str, work: Path, repeats: int) -> dict[str, Any]:
    """The quantized model's inference: plain, exposing floats, exposing integers."""
    import onnx
    from bench_realmodels import prepare

    from qdebug.capture.dequant import find_specs
    from qdebug.capture.reduction import ReductionPlan
    from qdebug.capture.session import expose_outputs, make_session
    from qdebug.graph import pair_models

    fp, qp, data = prepare(model, work, 8)
    fm, qm = onnx.load(fp), onnx.load(qp)
    pairing = pair_models(fm, qm)
    plan, specs = ReductionPlan.of(pairing), find_specs(qm, pairing)
    with np.load(data) as z:
        sample = {k: z[k][0] for k in z.files}
    ints = list(dict.fromkeys(specs[n].ints if n in specs else n for n in plan.quant_names))
    row: dict[str, Any] = {
        "model": model,
        "swapped": len(specs),
        "quantized": sum(a.quantized for a in pairing.activations),
    }
    plain: Any = make_session(qm, ["CPUExecutionProvider"])
    row["floor_ms"] = _median_ms(lambda: plain.run(None, sample), repeats)
    for label, names in (("floats", list(plan.quant_names)), ("ints", ints)):
        sess: Any = make_session(expose_outputs(qm, names), ["CPUExecutionProvider"])
        row[f"{label}_mb"] = sum(v.nbytes for v in sess.run(names, sample)) / 2**20
        row[f"{label}_ms"] = _median_ms(lambda s=sess, n=names: s.run(n, sample), repeats)
        del sess
    return row


def debug_child(model: str, n: int, mode: str, work: Path) -> dict[str, Any]:
    """One ``auto`` debug pass in this process, with the integers exposed or not."""
    from qdebug.capture import numpy_backend

    if mode == "floats":
        numpy_backend.find_specs = lambda *args: {}  # type: ignore[assignment]
    rep, times = timed_debug(model, n, work, "auto")
    cap = rep.meta.capture
    return {**times, "note": (cap.segment_note or "") if cap else ""}


def kernel_side() -> dict[str, float]:
    """The three compiled passes over one quantized activation's tensors (48 x 1 M elements)."""
    from qdebug.capture import compiled

    compiled.warm_up()
    k = compiled.kernel()
    rng = np.random.default_rng(0)
    ints = [rng.integers(0, 256, 1_000_000).astype(np.uint8) for _ in range(48)]
    posts = [(q.astype(np.int32) - 128).astype(np.float32) * np.float32(0.02) for q in ints]
    refs = [p + np.float32(0.01) * rng.standard_normal(p.size).astype(np.float32) for p in posts]
    pres = [p + np.float32(0.005) for p in posts]
    row, inf = np.zeros(k.SLOTS), np.inf

    def two() -> None:
        for r, x, p in zip(refs, pres, posts, strict=True):
            k.pair_sums(r, p, -inf, inf, -inf, inf, row, k.CUM_SIGNAL)
            k.pair_sums(x, p, -inf, inf, -inf, inf, row, k.LOC_SIGNAL)
            k.value_range(r, row, k.REF_MIN)

    def fused() -> None:
        for r, x, p in zip(refs, pres, posts, strict=True):
            k.activation_sums(r, x, p, -inf, inf, -inf, inf, True, row)

    def from_ints() -> None:
        for r, x, q in zip(refs, pres, ints, strict=True):
            k.dequant_sums(r, x, q, 0.02, 128, -inf, inf, -inf, inf, row)

    return {
        name: _median_ms(f, 5) for name, f in (("two passes", two), ("fused", fused), ("fused, integers", from_ints))
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--parts", nargs="+", choices=("ort", "debug", "kernel"), default=["ort", "debug", "kernel"])
    add_child_args(ap, ["ppocrv4-rec", "ppocrv4-det", "vit-s-focus", "yolov8n-nudenet", "u2netp"], 16)
    a = child_main(ap, argv, debug_child)
    if a is None:
        return 0
    if "ort" in a.parts:
        print(
            "\n| model | integers exposed / quantized | floor ms | floats exposed ms (MB) | integers exposed ms (MB) |"
        )
        print("|---|---|---|---|---|")
        for model in a.models:
            r = ort_side(model, a.work, a.repeats)
            print(
                f"| {model} | {r['swapped']} / {r['quantized']} | {r['floor_ms']:.1f} | {r['floats_ms']:.1f} "
                f"({r['floats_mb']:.0f}) | {r['ints_ms']:.1f} ({r['ints_mb']:.0f}) |",
                flush=True,
            )
    if "debug" in a.parts:
        print(f"\n`auto`, N = {a.samples}, fresh process per run\n")
        print("| model | exposed | per sample ms | wall s | peak MB |")
        print("|---|---|---|---|---|")
        for model, mode, r in each_run(__file__, a, ("floats", "ints")):
            print(
                f"| {model} | {mode} | {r['per_sample_ms']:.0f} | {r['wall_s']:.1f} | {r['peak_mb']:.0f} |", flush=True
            )
    if "kernel" in a.parts:
        times = kernel_side()
        print("\n| compiled pass over 48 M elements | ms |\n|---|---|")
        for name, ms in times.items():
            print(f"| {name} | {ms:.1f} |")
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
