"""Helpers shared by the reduction tests: synthetic reduction plans, the comparison of sums to float32-product
rounding, and a numba warm-up that finishes before the next sample (so ``auto``'s switch is deterministic)."""

from __future__ import annotations

import numpy as np
import onnx

from qdebug.capture import CaptureResult, CaptureTuning, compiled, open_run, run_info
from qdebug.capture.base import CaptureRun, CaptureSums, ModelPair, OpenOptions
from qdebug.capture.kernels.reference import ReductionPlan
from qdebug.capture.loop import SampleLoop
from qdebug.data import DataSource
from qdebug.metrics import BatchSums
from qdebug.pairing import ActivationPair, OutputPair, Pairing, pair_models

Bounds = tuple[str, float, float] | None


def plan_of(specs: list[tuple[bool, Bounds, Bounds]]) -> ReductionPlan:
    """A plan of ``len(specs)`` activations ``t{i}`` (quantized, fused activation, measured through) + one output."""
    acts = tuple(
        ActivationPair(f"t{i}", f"t{i}_pre", f"t{i}_post", quant, "Op", f"n{i}", i, None, (), fa, mt)
        for i, (quant, fa, mt) in enumerate(specs)
    )
    return ReductionPlan.of(Pairing(acts, (), (OutputPair("out", "out_q"),)))


def assert_same_sums(want: BatchSums, got: BatchSums, rtol: float = 2e-6) -> None:
    """Equal counts; sums equal to float32-product rounding (``rtol``); max equal where finite."""
    for name in ("count", "nonfinite_reference", "nonfinite_test"):
        np.testing.assert_array_equal(getattr(want, name), getattr(got, name), err_msg=name)
    for name in ("signal", "noise"):
        x, y = getattr(want, name), getattr(got, name)
        np.testing.assert_array_equal(np.isfinite(x), np.isfinite(y), err_msg=name)
        fin = np.isfinite(x)
        np.testing.assert_allclose(x[fin], y[fin], rtol=rtol, atol=1e-30, err_msg=name)
    np.testing.assert_allclose(want.max_abs, got.max_abs, rtol=1e-6, atol=1e-6)


def loaded_warm_up() -> compiled.WarmUp:
    """A :func:`compiled.start_warm_up` whose numba has loaded when it returns."""
    thread = compiled.WarmUp()
    thread.start()
    thread.join()
    return thread


def capture_run(
    backend: str, fm: onnx.ModelProto, qm: onnx.ModelProto, source: DataSource, tuning: CaptureTuning
) -> tuple[CaptureRun, CaptureResult]:
    """What :func:`qdebug.capture.capture` does, keeping the run for inspection: ``backend`` opened with ``tuning``
    (e.g. ``CaptureTuning(cores=1)`` for a run that does not pipeline), every sample of ``source`` reduced through
    the one sample loop, the run closed."""
    pairing = pair_models(fm, qm)
    pair = ModelPair(fm, qm, pairing, ("CPUExecutionProvider",))
    run, reason = open_run(backend, pair, OpenOptions(samples=len(source), tuning=tuning))
    sums = CaptureSums(len(pairing.activations), sum(a.quantized for a in pairing.activations), len(pairing.outputs))
    loop = SampleLoop(run, pair, tuning)
    try:
        loop.reduce_all(enumerate(iter(source)), sums)
    finally:
        loop.close()
    return run, CaptureResult.of(sums, pairing, backend, run_info(run, reason))
