"""The in-graph capture path (default) reports what the numpy path reports, and falls back where it must."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import builders
import numpy as np
import onnx
import pytest
from conftest import SAMPLE_MODELS, TINY_CONFIGS, TINY_R1_CONVERT, save

from qdebug.capture import FALLBACK_BACKEND, capture
from qdebug.capture.kernels import ingraph as reduce_graph
from qdebug.config import QuantConfig
from qdebug.data import open_data
from qdebug.debugger import DebugOptions, debug
from qdebug.errors import ConfigError
from qdebug.model_io import input_specs
from qdebug.pairing import pair_models
from qdebug.quantizer import quantize
from qdebug.report import DebugReport

DB = 1e-3  # tests' tolerance; measured deviations are ~1e-8 dB


def _close(a: float | None, b: float | None, tol: float, rel: bool = False) -> bool:
    if a is None or b is None:
        return a is b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if not (math.isfinite(a) and math.isfinite(b)):
        return a == b
    return math.isclose(a, b, rel_tol=tol) if rel else abs(a - b) <= tol


def assert_same(a: DebugReport, b: DebugReport) -> None:
    """Every reported value of two reports agrees (SQNR within 1e-3 dB, statuses, min/max, counts exactly)."""
    assert len(a.activations) == len(b.activations)
    for x, y in zip(a.activations, b.activations, strict=True):
        exact = (
            "tensor_name",
            "local_status",
            "cumulative_status",
            "float_min",
            "float_max",
            "elements",
            "nonfinite_float",
            "nonfinite_quant",
            "quantized",
        )
        for f in exact:
            assert getattr(x, f) == getattr(y, f), (x.tensor_name, f, getattr(x, f), getattr(y, f))
        assert _close(x.local_sqnr_db, y.local_sqnr_db, DB), (x.tensor_name, x.local_sqnr_db, y.local_sqnr_db)
        assert _close(x.cumulative_sqnr_db, y.cumulative_sqnr_db, DB), x.tensor_name
        assert _close(x.mse, y.mse, 1e-6, rel=True), (x.tensor_name, x.mse, y.mse)
        assert _close(x.max_abs_error, y.max_abs_error, 1e-6, rel=True), x.tensor_name
    for o, p in zip(a.model_outputs, b.model_outputs, strict=True):
        assert (o.output_name, o.cumulative_status, o.nonfinite_float, o.nonfinite_quant) == (
            p.output_name,
            p.cumulative_status,
            p.nonfinite_float,
            p.nonfinite_quant,
        )
        assert _close(o.cumulative_sqnr_db, p.cumulative_sqnr_db, DB)
        assert _close(o.mse, p.mse, 1e-6, rel=True)
        assert _close(o.max_abs_error, p.max_abs_error, 1e-6, rel=True)
    assert a.weights == b.weights
    for m, n in ((a.per_sample, b.per_sample), (a.per_sample_outputs, b.per_sample_outputs)):
        assert m.tensor_names == n.tensor_names
        assert m.values.shape == n.values.shape
        np.testing.assert_array_equal(np.isnan(m.values), np.isnan(n.values))
        np.testing.assert_array_equal(np.isinf(m.values), np.isinf(n.values))
        fin = np.isfinite(m.values)
        assert np.all(np.abs(m.values[fin] - n.values[fin]) <= DB)
    assert a.meta.num_samples == b.meta.num_samples
    assert a.summary.local.count == b.summary.local.count
    assert a.summary.cumulative.undefined == b.summary.cumulative.undefined


def both(fm: object, qm: object, data: object = None, n: int = 4, **kw: object) -> tuple[DebugReport, DebugReport]:
    """The numpy-path report and the graph-path report of the same run."""
    reports = tuple(
        debug(fm, qm, data, DebugOptions(num_samples=n, capture=path, **kw))  # type: ignore[arg-type]
        for path in ("numpy", "graph")
    )
    assert_same(*reports)
    return reports  # type: ignore[return-value]


def _capture(f: Path | onnx.ModelProto, q: Path | onnx.ModelProto, data: object = None, n: int = 4, **kw: object):
    fm = f if isinstance(f, onnx.ModelProto) else onnx.load(str(f))
    qm = q if isinstance(q, onnx.ModelProto) else onnx.load(str(q))
    source = open_data(data, input_specs(fm), num_samples=n, seed=0)  # type: ignore[arg-type]
    kw.setdefault("path", "graph")  # the in-graph path these tests are about (capture's default is auto)
    return capture(fm, qm, pair_models(fm, qm), source, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_tiny_configs_agree(name: str, tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    both(tiny_float, tiny_quant(name), n=5)
    cap = _capture(tiny_float, tiny_quant(name))
    assert (cap.path, cap.fallback_samples, cap.fallback_reason) == ("graph", 0, None)


@pytest.mark.parametrize("model", ["digits_cnn", "digits_transformer"])
def test_sample_models_agree(model: str, tmp_path: Path) -> None:
    qp = tmp_path / f"{model}.qdq.onnx"
    quantize(SAMPLE_MODELS / f"{model}.onnx", SAMPLE_MODELS / "digits_calib.npz", QuantConfig(), qp)
    data = {"input": np.load(SAMPLE_MODELS / "digits_eval.npz")["input"][:24]}
    both(SAMPLE_MODELS / f"{model}.onnx", qp, data, n=24)
    cap = _capture(SAMPLE_MODELS / f"{model}.onnx", qp, data, n=24)
    assert (cap.path, cap.fallback_samples) == ("graph", 0)


@pytest.mark.parametrize(
    "build",
    [
        builders.matmul_constant_weight,
        builders.scalar_weight_mul,
        builders.per_channel_weights,
        builders.uint8_weight_with_zero_point,
        builders.zero_tensors,
        builders.exact_grid,
        builders.neg_inf_weight,
    ],
)
def test_edge_case_builders_agree(build: Callable[[], tuple], tmp_path: Path) -> None:
    f, q = build()[:2]
    fp, qp = save(f, tmp_path / "f.onnx"), save(q, tmp_path / "q.onnx")
    both(fp, qp)


def test_nonfinite_samples_fall_back_exactly(tmp_path: Path) -> None:
    f, q = builders.nonfinite_model()
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 1, 8)
    x[:, 0, 3] = 0.0
    x[1] = np.abs(x[1]) + 0.5  # sample 1 is finite everywhere: reduced in-graph
    fp, qp = save(f, tmp_path / "f.onnx"), save(q, tmp_path / "q.onnx")
    a, b = both(fp, qp, {"x": x}, n=3)
    assert b.activation("logx").cumulative_status == "nonfinite"
    assert b.activation("logx").nonfinite_float == a.activation("logx").nonfinite_float > 0
    cap = _capture(fp, qp, {"x": x}, n=3)
    assert (cap.path, cap.fallback_samples) == ("graph", 2)
    assert _capture(fp, qp, {"x": x}, n=3, path="numpy").path == FALLBACK_BACKEND


def test_fused_clip_and_relu_agree(tmp_path: Path, tiny_float: Path) -> None:
    fp = save(builders.conv_clip(), tmp_path / "f.onnx")
    qp = tmp_path / "q.onnx"
    quantize(fp, None, QuantConfig(num_samples=8), qp)
    a, _ = both(fp, qp)
    assert any(x.fused_activation or x.measured_through for x in a.activations)
    both(tiny_float, quantize(tiny_float, None, QuantConfig(num_samples=8), tmp_path / "t.onnx").model_path)


@pytest.mark.filterwarnings("ignore::RuntimeWarning:onnxruntime")
def test_neg_inf_constant_and_16bit_agree(tmp_path: Path) -> None:
    fp = save(builders.max_with_neg_inf(), tmp_path / "f.onnx")
    qp = tmp_path / "q.onnx"
    quantize(fp, None, QuantConfig(activation_type="uint16", weight_type="uint8", target="qnn", num_samples=8), qp)
    both(fp, qp)


def test_mixed_precision_convert_agrees(tiny_float: Path, tmp_path: Path) -> None:
    cfg = TINY_R1_CONVERT
    qp = tmp_path / "mixed.onnx"
    quantize(tiny_float, None, cfg, qp)
    both(tiny_float, qp)


def test_dynamic_batch_agrees(tmp_path: Path) -> None:
    fp = save(builders.tiny_convnet(batch="N"), tmp_path / "f.onnx")
    qp = tmp_path / "q.onnx"
    quantize(fp, None, QuantConfig(num_samples=8), qp, input_shapes={"x": [2, 1, 6, 6]})
    both(fp, qp, input_shapes={"x": [3, 1, 6, 6]})


def test_unsupported_models_use_the_numpy_path(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    fm, qm = onnx.load(str(tiny_float)), onnx.load(str(tiny_quant("u8")))
    pairing = pair_models(fm, qm)
    ext = onnx.ModelProto()
    ext.CopyFrom(fm)
    ext.graph.initializer[0].data_location = onnx.TensorProto.EXTERNAL
    with pytest.raises(reduce_graph.UnsupportedGraphError, match="external data"):
        reduce_graph.build(ext, qm, pairing)
    other = onnx.ModelProto()
    other.CopyFrom(qm)
    for o in other.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version -= 1  # lower than the float model: never converted down
    with pytest.raises(reduce_graph.UnsupportedGraphError, match="different versions"):
        reduce_graph.build(fm, other, pairing)
    with_fn = onnx.ModelProto()
    with_fn.CopyFrom(fm)
    with_fn.functions.add().name = "f"
    with pytest.raises(reduce_graph.UnsupportedGraphError, match="local functions"):
        reduce_graph.build(with_fn, qm, pairing)


def test_merged_graph_rejected_by_ort_falls_back(
    tiny_float: Path, tiny_quant: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = reduce_graph.build

    def broken(*args: object, **kwargs: object) -> tuple[onnx.ModelProto, reduce_graph.Layout]:
        model, layout = real(*args, **kwargs)  # type: ignore[arg-type]
        model.graph.node[-1].op_type = "NoSuchOp"
        return model, layout

    monkeypatch.setattr(reduce_graph, "build", broken)
    cap = _capture(tiny_float, tiny_quant("u8"))
    assert cap.path == FALLBACK_BACKEND and "rejects" in (cap.fallback_reason or "")
    assert debug(tiny_float, tiny_quant("u8"), None, DebugOptions(num_samples=2)).meta.num_samples == 2


def test_capture_option_is_validated() -> None:
    with pytest.raises(ConfigError, match="capture"):
        DebugOptions(capture="gpu")
    assert DebugOptions().capture == "auto"


def test_cli_capture_flag(tiny_float: Path, tiny_quant: Callable[[str], Path], run_cli: Callable[..., object]) -> None:
    import json

    runs = [
        run_cli("debug", "-f", tiny_float, "-q", tiny_quant("u8"), "--samples", "3", "--json", "--capture", path)
        for path in ("numpy", "graph")
    ]
    assert [r.code for r in runs] == [0, 0]  # type: ignore[attr-defined]
    a, b = (json.loads(r.out) for r in runs)  # type: ignore[attr-defined]
    assert [x["cumulative_status"] for x in a["activations"]] == [x["cumulative_status"] for x in b["activations"]]
