"""The capture backend seam: every backend against the one reduction definition, fallbacks recorded with their
reason in the report, shards that merge exactly, and metrics from the registries that the report really carries."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import builders
import numpy as np
import onnx
import pytest
from conftest import save

from qdebug.capture import (
    CaptureSums,
    Fallback,
    backend_names,
    capture,
    get_backend,
)
from qdebug.capture.kernels.reference import ReductionPlan, reduce_sample
from qdebug.data import open_data
from qdebug.debugger import DebugOptions, debug
from qdebug.errors import ConfigError
from qdebug.metrics import ErrorSums, register_streaming_metric
from qdebug.model_io import input_specs
from qdebug.ort import expose_outputs, make_session
from qdebug.pairing import pair_models
from qdebug.report import DebugReport


def _pair(tiny_float: Path, quant: Path) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    return onnx.load(str(tiny_float)), onnx.load(str(quant))


def _reference(fm: onnx.ModelProto, qm: onnx.ModelProto, samples: list[dict[str, np.ndarray]]) -> CaptureSums:
    """The reduction definition applied to fully materialised tensors (no backend involved)."""
    pairing = pair_models(fm, qm)
    plan = ReductionPlan.of(pairing)
    fs = make_session(expose_outputs(fm, plan.float_names), ["CPUExecutionProvider"])
    qs = make_session(expose_outputs(qm, plan.quant_names), ["CPUExecutionProvider"])
    n_quant = sum(1 for a in pairing.activations if a.quantized)
    sums = CaptureSums(len(pairing.activations), n_quant, len(pairing.outputs))
    for i, s in enumerate(samples):
        f = dict(zip(plan.float_names, fs.run(list(plan.float_names), s), strict=True))  # type: ignore[attr-defined]
        q = dict(zip(plan.quant_names, qs.run(list(plan.quant_names), s), strict=True))  # type: ignore[attr-defined]
        sums.add(i, reduce_sample(plan, f, q))
    return sums


@pytest.mark.parametrize("name", ["u8", "u16_qnn", "s8_per_channel"])
@pytest.mark.parametrize("backend", ["graph", "fetch", "compiled"])
def test_every_backend_matches_the_reduction_definition(
    tiny_float: Path, tiny_quant: Callable[[str], Path], name: str, backend: str
) -> None:
    fm, qm = _pair(tiny_float, tiny_quant(name))
    source = open_data(None, input_specs(fm), num_samples=6, seed=4)
    ref = _reference(fm, qm, [dict(s) for s in source])
    cap = capture(fm, qm, pair_models(fm, qm), source, path=backend)
    assert cap.path == backend and cap.fallback_samples == 0
    for j, s in enumerate(cap.cumulative):
        want = ref.cumulative.sums(j, 6)
        assert s.count == want.count and math.isclose(s.signal, want.signal, rel_tol=1e-6)
        assert math.isclose(s.noise, want.noise, rel_tol=1e-5, abs_tol=1e-12)
    ordinal = 0
    for loc in cap.local:
        if loc is None:
            continue
        want = ref.local.sums(ordinal, 6)
        assert math.isclose(loc.noise, want.noise, rel_tol=1e-5, abs_tol=1e-12)
        ordinal += 1
    assert ordinal == ref.n_quant > 0
    np.testing.assert_allclose(cap.per_sample, ref.rows(), rtol=1e-5)


def test_a_nan_sample_falls_back_and_the_report_says_why(tmp_path: Path) -> None:
    f, q = builders.nonfinite_model()
    x = np.full((3, 1, 8), 0.5, np.float32)
    x[1] = -1.0  # Log of a negative number: NaN inside the models on one sample among three
    name = f.graph.input[0].name
    rep = debug(save(f, tmp_path / "f.onnx"), save(q, tmp_path / "q.onnx"), {name: x}, DebugOptions(capture="graph"))
    info = rep.meta.capture
    assert info is not None and info.requested == "graph"
    assert info.fallback_samples >= 1 and info.fallback_backend == "fetch"
    assert any("NaN/Inf" in reason for reason, _ in info.fallback_reasons)
    assert sum(n for _, n in info.fallback_reasons) == info.fallback_samples
    again = DebugReport.from_json(rep.to_json())
    assert again.meta.capture == info


def test_a_pair_the_merge_cannot_express_runs_fetch_with_the_reason(tmp_path: Path) -> None:
    fm = builders.tiny_convnet()
    fn = onnx.FunctionProto(name="f", domain="local")
    fm.functions.append(fn)  # local functions: the merged graph refuses them
    from qdebug.config import QuantConfig
    from qdebug.quantizer import quantize

    qpath = tmp_path / "q.onnx"
    quantize(builders.tiny_convnet(), None, QuantConfig(num_samples=4), qpath)
    rep = debug(fm, qpath, None, DebugOptions(num_samples=2, capture="graph"))
    info = rep.meta.capture
    assert info is not None and info.requested == "graph" and info.backend == "fetch"
    assert info.reason is not None and "local functions" in info.reason
    # auto, unbatched (a batched run never tries the merged graph): 12 tiny samples cannot repay even a session of
    # both models' nodes, so the merged graph is not even built (which is what would find the local functions)
    auto = debug(fm, qpath, None, DebugOptions(num_samples=12, batch=1)).meta.capture
    assert auto is not None and auto.requested == "auto" and auto.backend == "compiled"  # the C kernel's run
    assert auto.reason is not None and "merged graph set-up est. over" in auto.reason


def test_shards_merge_into_the_single_run(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    fm, qm = _pair(tiny_float, tiny_quant("u8"))
    samples = [dict(s) for s in open_data(None, input_specs(fm), num_samples=8, seed=2)]
    whole = _reference(fm, qm, samples)
    first, second = _reference(fm, qm, samples[:5]), _reference(fm, qm, samples[5:])
    second.per_sample = {i + 5: v for i, v in second.per_sample.items()}  # the second shard's sample indices
    second.per_sample_outputs = {i + 5: v for i, v in second.per_sample_outputs.items()}
    merged = first.merge(second)
    for a, b in ((merged.cumulative, whole.cumulative), (merged.local, whole.local), (merged.outputs, whole.outputs)):
        np.testing.assert_allclose(a.signal, b.signal, rtol=1e-12)
        np.testing.assert_allclose(a.noise, b.noise, rtol=1e-12)
        assert np.array_equal(a.count, b.count) and np.array_equal(a.max_abs, b.max_abs)
    assert np.array_equal(merged.float_min, whole.float_min) and np.array_equal(merged.float_max, whole.float_max)
    np.testing.assert_allclose(merged.rows(), whole.rows(), rtol=1e-12)
    with pytest.raises(ValueError, match="overlap"):
        merged.merge(_reference(fm, qm, samples[:1]))


def test_backends_are_registered_and_checked() -> None:
    assert backend_names()[:2] == ("graph", "fetch")
    assert get_backend("fetch").name == "fetch"
    assert get_backend("numpy").name == "fetch"  # the former name still opens it
    assert DebugOptions(capture="numpy").capture == "fetch"
    with pytest.raises(ConfigError, match="capture must be one of"):
        DebugOptions(capture="gpu")
    assert isinstance(Fallback("x"), Fallback)


def test_registered_metrics_reach_the_report(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    from qdebug.metrics import METRICS, STREAMING_METRICS

    register_streaming_metric("noise_energy", lambda s: s.noise)
    try:
        rep = debug(tiny_float, tiny_quant("u8"), None, DebugOptions(num_samples=3))
        a = rep.activations[0]
        assert set(a.metrics) == set(STREAMING_METRICS) and a.metrics["noise_energy"] is not None
        assert a.metrics["sqnr_db"] == a.cumulative_sqnr_db
        assert set(rep.weights[0].metrics) == set(METRICS)
        assert "metric.noise_energy" in rep.to_dataframe().columns
        only = debug(
            tiny_float, tiny_quant("u8"), None, DebugOptions(num_samples=3, metrics=("rmse", "cosine_similarity"))
        )
        assert set(only.activations[0].metrics) == {"rmse"} and set(only.weights[0].metrics) == {"cosine_similarity"}
        assert DebugReport.from_json(rep.to_json()).activations[0].metrics == a.metrics
    finally:
        del STREAMING_METRICS["noise_energy"]
    with pytest.raises(ConfigError, match="unknown metric"):
        DebugOptions(metrics=("nope",))
    with pytest.raises(ConfigError, match="named twice"):
        DebugOptions(metrics=("mse", "mse"))
    with pytest.raises(ValueError, match="already registered"):
        register_streaming_metric("mse", lambda s: ErrorSums().mse)


def test_version_1_reports_are_still_read(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    import json

    rep = debug(tiny_float, tiny_quant("u8"), None, DebugOptions(num_samples=2))
    d = json.loads(rep.to_json())
    d["schema_version"] = 1
    d["meta"].pop("capture")
    for a in d["activations"]:
        a.pop("metrics")
    old = DebugReport.from_dict(d)
    assert old.meta.capture is None and old.activations[0].metrics == {}
    assert old.activations[0].cumulative_sqnr_db == rep.activations[0].cumulative_sqnr_db


def test_the_pipelined_fetch_run_equals_the_sequential_one(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    """Overlapping the next sample's inference with this one's reduction changes no number: the same arrays are
    reduced in the same order (bit-identical sums, per-sample rows included; one core: not pipelined)."""
    from capture_helpers import capture_run

    from qdebug.capture import CaptureTuning
    from qdebug.capture.fetch import FetchRun

    fm, qm = _pair(tiny_float, tiny_quant("u8"))
    source = open_data(None, input_specs(fm), num_samples=9, seed=2)
    runs = {}
    for pipelined in (False, True):
        made, runs[pipelined] = capture_run("fetch", fm, qm, source, CaptureTuning(cores=2 if pipelined else 1))
        assert isinstance(made, FetchRun)
        assert made.pipelining is pipelined and (made.pipeline is None or made.pipeline.pool is None)  # worker stopped
    a, b = runs[False], runs[True]
    assert a.cumulative == b.cumulative and a.local == b.local and a.outputs == b.outputs
    np.testing.assert_array_equal(a.per_sample, b.per_sample)


def test_a_bad_sample_met_by_the_worker_is_the_same_one_line_error(tiny_float: Path, tmp_path: Path) -> None:
    """Sample 4 has the wrong shape: the pipelined run raises the sequential run's DataError, naming the data."""
    from qdebug.errors import DataError

    fm = onnx.load(str(tiny_float))
    spec = input_specs(fm)[0]
    good = np.random.default_rng(0).random((4, *spec.shape)).astype(np.float32)
    folder = tmp_path / "data"
    folder.mkdir()
    np.savez(folder / "a.npz", **{spec.name: good})
    np.savez(folder / "b.npz", **{spec.name: np.zeros((1, 1, 2, 2), np.float32)})  # wrong shape
    q = tmp_path / "q.onnx"
    from qdebug.quantizer import quantize

    quantize(tiny_float, None, None, q, check=False)
    with pytest.raises(DataError, match=r"b\.npz|sample 4|shape"):
        debug(tiny_float, q, folder, DebugOptions(capture="fetch"))


def test_the_tuning_defaults_are_the_kernels_defaults() -> None:
    """The kernels' tuning parameters default to what :class:`CaptureTuning` passes them, so a capture and a direct
    call of a kernel reduce alike."""
    import inspect

    from qdebug.capture import CaptureTuning
    from qdebug.capture.kernels import batched, ingraph

    t = CaptureTuning()
    assert inspect.signature(batched.reduce_batch).parameters["chunk_elements"].default == t.chunk_elements
    build = inspect.signature(ingraph.build).parameters
    assert build["concat_fan_in"].default == t.concat_fan_in
    assert build["max_merged_bytes"].default == t.max_merged_bytes
