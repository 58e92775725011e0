"""One purpose-built model per failure mode of ORT's qdq_loss_debug recipe, each asserting the numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import builders
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import TINY_R1_CONVERT, save
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

from qdebug.config import QuantConfig
from qdebug.debugger import DebugOptions, debug
from qdebug.quantizer import quantize
from qdebug.report import DebugReport


def _sqnr64(ref: np.ndarray, test: np.ndarray) -> float:
    x = np.asarray(ref, dtype=np.float64).ravel()
    y = np.asarray(test, dtype=np.float64).ravel()
    return 10 * math.log10(float(x @ x) / float((x - y) @ (x - y)))


def _run(tmp_path: Path, f: onnx.ModelProto, q: onnx.ModelProto, data=None, n: int = 4) -> DebugReport:
    fp, qp = save(f, tmp_path / "float.onnx"), save(q, tmp_path / "quant.onnx")
    return debug(fp, qp, data, DebugOptions(num_samples=n))


def _activation_q_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """QuantizeLinear nodes on activations (not on constants, not a DQ→Q convert)."""
    consts = {i.name for i in model.graph.initializer} | {
        n.output[0] for n in model.graph.node if n.op_type == "Constant"
    }
    dq_out = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    return [
        n
        for n in model.graph.node
        if n.op_type == "QuantizeLinear" and n.input[0] not in consts and n.input[0] not in dq_out
    ]


def _tensors(model: onnx.ModelProto, names: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for n in names:
        m.graph.output.append(onnx.ValueInfoProto(name=n))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(names, feed)


class _Reader(CalibrationDataReader):
    def __init__(self, shape: tuple[int, ...], n: int = 8) -> None:
        rng = np.random.default_rng(0)
        self._it = iter([{"x": rng.random(shape).astype(np.float32)} for _ in range(n)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


# ------------------------------------------------------------------ (a) 16-bit com.microsoft Q/DQ
def test_16bit_com_microsoft_qdq_is_paired(tiny_float: Path, tiny_quant) -> None:
    qpath = tiny_quant("u16_qnn")
    qm = onnx.load(str(qpath))
    qdq = [n for n in qm.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert qdq and {n.domain for n in qdq} == {"com.microsoft"}
    # The trap of the recipe: ONNX shape inference leaves these outputs untyped.
    inferred = onnx.shape_inference.infer_shapes(qm)
    typed = {vi.name for vi in inferred.graph.value_info if vi.type.tensor_type.elem_type}
    q_outs = [n.output[0] for n in qdq if n.op_type == "QuantizeLinear"]
    assert not any(o in typed for o in q_outs)

    report = debug(tiny_float, qpath, None, DebugOptions(num_samples=3))
    quantized = [a for a in report.activations if a.quantized]
    assert len(quantized) > 0
    assert len(quantized) == len(_activation_q_nodes(qm)) == 7
    assert {a.quant_type for a in quantized} == {"uint16"}
    # 16-bit activations: the input's own rounding is ~100 dB, far above any 8-bit value.
    assert report.activation("x").local_sqnr_db > 90
    assert len(report.weights) == 6


# ------------------------------------------------------------------ (b) Constant-node weights
def test_constant_node_weights_are_found(tmp_path: Path) -> None:
    f, q, info = builders.matmul_constant_weight()
    assert not f.graph.initializer  # the float weight really is a Constant node
    report = _run(tmp_path, f, q)
    assert len(report.weights) == 1
    w = report.weights[0]
    assert (w.weight_name, w.kind, w.quant_type, w.channels, w.shape) == ("W", "weight", "int8", 1, (8, 4))
    expected = _sqnr64(info["w"], info["w_q"].astype(np.float64) * np.float64(np.float32(info["w_scale"])))
    assert w.weight_sqnr_db == pytest.approx(expected, abs=1e-9)
    assert 35 < w.weight_sqnr_db < 60
    # the Constant outputs are not mistaken for activations
    assert [a.tensor_name for a in report.activations] == ["x", "y"]


# ------------------------------------------------------------------ (c) 0-d scalar weight
def test_scalar_weight(tmp_path: Path) -> None:
    f, q, info = builders.scalar_weight_mul()
    report = _run(tmp_path, f, q)
    assert len(report.weights) == 1
    w = report.weights[0]
    assert (w.weight_name, w.shape, w.elements, w.quant_type) == ("s", (), 1, "uint8")
    ref = np.float64(np.float32(info["value"]))
    deq = (float(info["s_q"]) - info["zero_point"]) * np.float64(np.float32(info["scale"]))
    assert deq == pytest.approx(0.74)
    expected = 20 * math.log10(abs(ref) / abs(ref - deq))
    assert w.weight_sqnr_db == pytest.approx(expected, abs=1e-9)
    assert w.weight_sqnr_db == pytest.approx(48.10, abs=0.01)
    assert w.max_abs_error == pytest.approx(abs(ref - deq), rel=1e-9)


# ------------------------------------------------------------------ (d) per-channel weights
def test_per_channel_weights_and_worst_channel(tmp_path: Path) -> None:
    f, q, info = builders.per_channel_weights()
    report = _run(tmp_path, f, q)
    by_name = {w.weight_name: w for w in report.weights}
    assert set(by_name) == {"W1", "W2", "W3"}
    for name, w in info["weights"].items():
        axis = (info["axes"][name] if info["axes"][name] is not None else 1) % w.ndim
        scales = info["scales"][name].astype(np.float64)
        shape = [1] * w.ndim
        shape[axis] = -1
        deq = info["quantized"][name].astype(np.float64) * scales.reshape(shape)
        wm = np.moveaxis(w.astype(np.float64), axis, 0)
        dm = np.moveaxis(deq, axis, 0)
        per = [_sqnr64(wm[c], dm[c]) for c in range(wm.shape[0])]
        got = by_name[name]
        assert got.channels == w.shape[axis]
        assert got.weight_sqnr_db == pytest.approx(_sqnr64(w, deq), abs=1e-9)
        assert got.worst_channel_sqnr_db == pytest.approx(min(per), abs=1e-9)
        assert int(np.argmin(per)) == info["coarse"][name]  # the deliberately coarse channel
        assert got.worst_channel_sqnr_db < got.weight_sqnr_db - 3


def test_per_channel_quantized_by_ort(tiny_float: Path, tiny_quant) -> None:
    report = debug(tiny_float, tiny_quant("s8_per_channel"), None, DebugOptions(num_samples=2))
    w1 = next(w for w in report.weights if w.weight_name == "w1")
    assert (w1.channels, w1.quant_type, w1.shape) == (4, "int8", (4, 1, 3, 3))
    assert w1.worst_channel_sqnr_db is not None
    assert w1.worst_channel_sqnr_db <= w1.weight_sqnr_db


# ------------------------------------------------------------------ (e) uint8 weights, non-zero zero point
def test_unsigned_weight_with_zero_point_is_not_wrapped(tmp_path: Path) -> None:
    f, q, info = builders.uint8_weight_with_zero_point()
    assert info["zero_point"] > 0 and (info["w_q"] < info["zero_point"]).any()
    report = _run(tmp_path, f, q)
    (w,) = report.weights
    scale64 = np.float64(info["scale"])
    expected = _sqnr64(info["w"], (info["w_q"].astype(np.float64) - info["zero_point"]) * scale64)
    with np.errstate(over="ignore"):  # what dequantizing in uint8 arithmetic gives
        wrapped = (info["w_q"] - np.uint8(info["zero_point"])).astype(np.float64) * scale64
    wrapped_db = _sqnr64(info["w"], wrapped)
    assert expected > 40
    assert wrapped_db < 0
    assert w.weight_sqnr_db == pytest.approx(expected, abs=1e-9)
    assert w.quant_type == "uint8"


# ------------------------------------------------------------------ (f) outputs of non-quantized ops
def test_outputs_of_non_quantized_ops(tmp_path: Path) -> None:
    fp = save(builders.matmul_div_unsqueeze(), tmp_path / "f.onnx")
    qp = tmp_path / "q.onnx"
    quantize_static(str(fp), str(qp), _Reader((1, 8)), quant_format=QuantFormat.QDQ, op_types_to_quantize=["MatMul"])
    qm = onnx.load(str(qp))
    producers = {o: n.op_type for n in qm.graph.node for o in n.output}
    assert producers["out_div"] == "Div" and producers["out_unsq"] == "Unsqueeze"  # not re-quantized by ORT
    report = debug(fp, qp, None, DebugOptions(num_samples=4))
    assert {o.output_name for o in report.model_outputs} == {"out_div", "out_unsq"}
    m = report.activation("m")
    assert m.quantized
    for name in ("out_div", "out_unsq"):
        a = report.activation(name)
        assert not a.quantized
        assert a.local_status == "not_quantized" and a.local_sqnr_db is None
        # Div by 2 and Unsqueeze are exact: the damage is the MatMul's, to the last digit.
        assert a.cumulative_sqnr_db == pytest.approx(m.cumulative_sqnr_db, abs=1e-6)
        assert report.output(name).cumulative_sqnr_db == pytest.approx(m.cumulative_sqnr_db, abs=1e-6)


# ------------------------------------------------------------------ (g) all-zero and identical tensors
def test_all_zero_tensors_are_never_zero_db(tmp_path: Path) -> None:
    f, q = builders.zero_tensors()
    report = _run(tmp_path, f, q)
    zeros = report.activation("zeros")
    assert zeros.quantized
    assert (zeros.cumulative_sqnr_db, zeros.cumulative_status) == (math.inf, "identical")
    assert (zeros.local_sqnr_db, zeros.local_status) == (math.inf, "identical")
    cz = report.activation("cz")
    assert (cz.producer_op, cz.cumulative_sqnr_db, cz.cumulative_status) == ("ConstantOfShape", math.inf, "identical")
    diff = report.activation("diff")  # 0 in the float model, DQ(Q(x)) − x ≠ 0 in the quantized one
    assert (diff.cumulative_sqnr_db, diff.cumulative_status) == (None, "undefined")
    assert diff.mse is not None and diff.mse > 0
    assert (report.output("diff").cumulative_sqnr_db, report.output("diff").cumulative_status) == (None, "undefined")
    assert report.output("zsum").cumulative_status == "identical"
    assert all(a.cumulative_sqnr_db != 0.0 for a in report.activations)
    assert "shp" not in {a.tensor_name for a in report.activations}  # int64 Shape output is not compared
    weight = report.weights[0]
    assert (weight.weight_name, weight.weight_sqnr_db, weight.weight_status) == ("Z", math.inf, "identical")
    assert report.summary.cumulative.undefined == 1
    assert report.summary.cumulative.infinite == 3
    assert report.worst("cumulative", 1)[0].tensor_name == "diff"  # undefined sorts first: it needs a look
    d = json.loads(report.to_json())
    row = next(a for a in d["activations"] if a["tensor_name"] == "diff")
    assert row["cumulative_sqnr_db"] is None and row["cumulative_status"] == "undefined"


def test_identical_tensors_are_plus_inf(tmp_path: Path) -> None:
    f, q = builders.exact_grid()
    data = {"x": (np.arange(24, dtype=np.float32) % 11).reshape(3, 1, 8)}  # on the scale-1 grid
    report = _run(tmp_path, f, q, data)
    for name in ("x", "r"):
        a = report.activation(name)
        assert (a.cumulative_sqnr_db, a.cumulative_status) == (math.inf, "identical")
        assert a.max_abs_error == 0.0
    assert report.activation("x").local_status == "identical"
    assert report.activation("r").local_status == "not_quantized"
    assert report.output("r").cumulative_sqnr_db == math.inf
    assert np.isposinf(report.per_sample.values).all()
    assert report.summary.cumulative.count == 0 and report.summary.cumulative.infinite == 2
    assert json.loads(report.to_json())["model_outputs"][0]["cumulative_sqnr_db"] == "inf"


# ------------------------------------------------------------------ (h) NaN/Inf inside tensors
def test_nan_and_inf_inside_tensors_are_flagged(tmp_path: Path) -> None:
    f, q = builders.nonfinite_model()
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 1, 8)
    x[:, 0, 3] = 0.0
    report = _run(tmp_path, f, q, {"x": x})
    xq = np.clip(np.rint(x.astype(np.float64) / np.float32(2.0 / 255.0)), -128, 127)
    logx = report.activation("logx")
    assert logx.nonfinite_float == int((x <= 0).sum()) == 13
    assert logx.nonfinite_quant == int((xq <= 0).sum())
    assert (logx.cumulative_sqnr_db, logx.cumulative_status, logx.flagged) == (None, "nonfinite", True)
    recip = report.activation("recip")  # 1/0 = inf in the float model; the Q saturates it
    assert recip.quantized
    assert (recip.nonfinite_float, recip.nonfinite_quant) == (3, 0)
    assert recip.cumulative_status == "nonfinite" and recip.local_status == "nonfinite"
    assert recip.max_abs_error is None and report.output("neg").max_abs_error is None  # not a fake 0.0
    assert report.output("neg").cumulative_status == "nonfinite"
    assert report.output("logx").nonfinite_float == 13
    assert report.activation("x").cumulative_status == "ok"
    assert any("NaN/Inf" in w for w in report.meta.warnings)
    assert report.summary.cumulative.undefined == 3
    json.loads(report.to_json(), parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))


# ------------------------------------------------------------------ (i) −inf constant feeding a Max
@pytest.mark.filterwarnings("ignore::RuntimeWarning:onnxruntime")  # ORT's own scale computation on −inf
def test_neg_inf_constant_into_max_is_localised(tmp_path: Path) -> None:
    # The broken model as ONNX Runtime's own recipe writes it (qdebug.quantize now keeps the -inf constant's
    # reader in float, tests/test_output_guard.py): the debugger must localise the damage it does.
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize as ort_quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    from qdebug.data import as_ort_reader, open_data
    from qdebug.model_io import input_specs

    model = builders.max_with_neg_inf()
    fp = save(model, tmp_path / "f.onnx")
    qp = tmp_path / "q.onnx"
    reader = as_ort_reader(open_data(None, input_specs(model), num_samples=8))
    cfg = get_qnn_qdq_config(str(fp), reader, activation_type=QuantType.QUInt16, weight_type=QuantType.QUInt8)
    ort_quantize(str(fp), str(qp), cfg)
    report = debug(fp, qp, None, DebugOptions(num_samples=4))
    ninf = next(w for w in report.weights if w.weight_name == "ninf")
    assert ninf.weight_status == "nonfinite" and ninf.weight_sqnr_db is None
    assert report.worst("weight", 1)[0].weight_name == "ninf"
    mx = report.activation("mx")
    assert mx.local_status == "nonfinite"
    assert report.worst("local", 1)[0].tensor_name == "mx"
    # Everything before the Max is fine; the damage starts exactly there.
    assert report.activation("x").cumulative_sqnr_db > 60
    assert report.activation("m").cumulative_sqnr_db > 30
    first_bad = next(a for a in report.activations if a.cumulative_sqnr_db is None or a.cumulative_sqnr_db < 20)
    assert first_bad.tensor_name == "mx"
    assert report.output("y").cumulative_sqnr_db < 10  # the recipe's symptom, reproduced


def test_infinite_weight_on_both_sides(tmp_path: Path) -> None:
    # −inf − (−inf) is NaN: the weight is reported as non-finite, with no numpy warning and a clean JSON.
    f, q = builders.neg_inf_weight()
    report = _run(tmp_path, f, q)
    (w,) = report.weights
    assert (w.weight_name, w.weight_sqnr_db, w.weight_status, w.max_abs_error) == ("ninf", None, "nonfinite", None)
    assert report.output("y").cumulative_status == "ok"  # Max(x, −inf) = x on both sides
    text = report.to_json()
    assert DebugReport.from_json(text).weights == report.weights


# ------------------------------------------------------------------ (j) fused Relu / Clip
def test_fused_relu_local_sqnr_is_high(tiny_float: Path, tiny_quant) -> None:
    qpath = tiny_quant("u8")
    qm = onnx.load(str(qpath))
    assert "Relu" not in {n.op_type for n in qm.graph.node}  # ORT folded the Relu into the Q
    report = debug(tiny_float, qpath, None, DebugOptions(num_samples=4))
    r1 = report.activation("r1")
    assert r1.fused_activation == "Relu"
    assert r1.local_sqnr_db > 30
    # What a comparison without the folded Relu gives (the recipe's ~1 dB): this test can fail.
    x = np.random.default_rng(0).random((1, 1, 6, 6)).astype(np.float32)
    pre, post = _tensors(qm, ["r1", "r1_DequantizeLinear_Output"], {"x": x})
    assert _sqnr64(pre, post) < 10
    assert _sqnr64(np.maximum(pre, 0), post) > 30


def test_fused_clip_local_sqnr_is_high(tmp_path: Path) -> None:
    fp = save(builders.conv_clip(), tmp_path / "f.onnx")
    qp = tmp_path / "q.onnx"
    quantize(fp, None, QuantConfig(num_samples=8), qp)
    assert "Clip" not in {n.op_type for n in onnx.load(str(qp)).graph.node}
    report = debug(fp, qp, None, DebugOptions(num_samples=4))
    r = report.activation("r")
    assert r.fused_activation == "Clip"
    assert r.local_sqnr_db > 30
    assert r.float_min == 0.0 and r.float_max == 1.0


# ------------------------------------------------------------------ (k) mixed precision with a convert
def test_mixed_precision_convert(tiny_float: Path, tmp_path: Path) -> None:
    cfg = TINY_R1_CONVERT
    qp = tmp_path / "mixed.onnx"
    quantize(tiny_float, None, cfg, qp)
    qm = onnx.load(str(qp))
    converts = [n for n in qm.graph.node if n.op_type == "QuantizeLinear" and "convert" in n.output[0]]
    assert len(converts) == 1
    report = debug(tiny_float, qp, None, DebugOptions(num_samples=4))
    names = [a.tensor_name for a in report.activations]
    assert len(names) == len(set(names))
    assert len([a for a in report.activations if a.quantized]) == len(_activation_q_nodes(qm))
    r1 = report.activation("r1")
    assert r1.quant_type == "uint8"
    assert r1.converted_to == ("uint16",)
    assert all(a.converted_to == () for a in report.activations if a.tensor_name != "r1")
    assert r1.cumulative_status == "ok" and report.output("y").cumulative_sqnr_db > 25
    assert DebugReport.from_json(report.to_json()).activation("r1").converted_to == ("uint16",)


def test_unfused_relu_input_clipped_by_its_q_is_not_a_false_alarm(tiny_float: Path, tmp_path: Path) -> None:
    cfg = TINY_R1_CONVERT
    qp = tmp_path / "q.onnx"
    quantize(tiny_float, None, cfg, qp)
    qm = onnx.load(str(qp))
    assert "Relu" in {n.op_type for n in qm.graph.node}
    init = {i.name: onnx.numpy_helper.to_array(i) for i in qm.graph.initializer}
    assert float(init["c1_zero_point"]) == 0 and init["c1_zero_point"].dtype == np.uint8  # range [0, max]
    report = debug(tiny_float, qp, None, DebugOptions(num_samples=4))
    assert report.activation("r1").local_sqnr_db > 30
    c1 = report.activation("c1")
    assert c1.measured_through == "Relu"
    assert c1.local_sqnr_db > 30
    assert c1.cumulative_sqnr_db > 30


def test_biases_that_are_not_initializers_are_one_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ORT logs one root-logger warning per bias that is not an initializer (38 lines on ppocrv4-rec); quantize
    turns them into one note in the result and prints nothing of ORT's."""
    m = builders.tiny_convnet()
    b1 = next(i for i in m.graph.initializer if i.name == "b1")
    m.graph.node.insert(0, onnx.helper.make_node("Identity", ["b1"], ["b1_run"], name="b1_identity"))
    m.graph.node[1].input[2] = "b1_run"  # conv1's bias is now computed in the graph
    assert b1.name == "b1"
    path = save(m, tmp_path / "bias.onnx")
    capsys.readouterr()
    result = quantize(path, None, QuantConfig(num_samples=2), tmp_path / "bias.qdq.onnx")
    err = capsys.readouterr().err
    assert "Expected bias" not in err
    notes = [w for w in result.warnings if "bias" in w]
    assert len(notes) == 1 and notes[0].startswith("1 bias(es)") and "b1_run" in notes[0]


def _constant_weight_convnet() -> onnx.ModelProto:
    """tiny_convnet with every weight and bias a Constant node, as paddle2onnx exports them."""
    m = builders.tiny_convnet()
    consts = [builders.constant_node(t.name, onnx.numpy_helper.to_array(t)) for t in m.graph.initializer]
    del m.graph.initializer[:]
    for c in reversed(consts):
        m.graph.node.insert(0, c)
    return m


def test_constant_node_weights_are_quantized_as_weights(tmp_path: Path) -> None:
    """ORT's quantizer treats a Constant node's output as an activation (a calibrated uint8 Q/DQ computed at run
    time instead of the weight type); quantize moves them to initializers first and says so. The user's model is
    not modified, and the QDQ model's weights are stored quantized, of the weight type."""
    from qdebug.graph_index import constants_to_initializers

    f = _constant_weight_convnet()
    moved_model, moved = constants_to_initializers(f)
    assert moved == ["b1", "b2", "bg", "w1", "w2", "wg"] and len(f.graph.initializer) == 0  # input untouched
    x = np.random.default_rng(0).standard_normal((1, 1, 6, 6)).astype(np.float32)
    run = [ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0] for m in (f, moved_model)]
    np.testing.assert_array_equal(run[0], run[1])
    path = save(f, tmp_path / "const.onnx")
    before = path.read_bytes()
    cfg = QuantConfig(num_samples=4, weight_type="int8", weight_symmetric=True)
    result = quantize(path, None, cfg, tmp_path / "const.qdq.onnx")
    assert path.read_bytes() == before
    assert any(w.startswith("6 Constant node(s) quantized as weights") for w in result.warnings)
    q = onnx.load(result.model_path)
    inits = {t.name: t for t in q.graph.initializer}
    conv = next(n for n in q.graph.node if n.op_type == "Conv")
    dq = next(n for n in q.graph.node if n.output[0] == conv.input[1])
    assert dq.op_type == "DequantizeLinear" and inits[dq.input[0]].data_type == onnx.TensorProto.INT8
    report = debug(path, result.model_path, None, DebugOptions(num_samples=2))
    assert {w.weight_name for w in report.weights} >= {"w1", "w2", "wg"}


def test_per_channel_on_an_opset_11_model_loads(tmp_path: Path) -> None:
    """Per-channel Q/DQ need opset 13's ``axis``: ORT's quantizer wrote it into an opset-11 model that ONNX Runtime
    then refused to load (u2netp); quantize raises the opset first, so the model loads and debugs."""
    f = builders.tiny_convnet()
    f.opset_import[0].version = 11
    path = save(f, tmp_path / "op11.onnx")
    cfg = QuantConfig(num_samples=4, per_channel=True, weight_type="int8", weight_symmetric=True)
    result = quantize(path, None, cfg, tmp_path / "op11.qdq.onnx")
    q = onnx.load(result.model_path)
    assert q.opset_import[0].version >= 13
    assert any(a.name == "axis" for n in q.graph.node if n.op_type == "DequantizeLinear" for a in n.attribute)
    ort.InferenceSession(result.model_path)  # loads
    report = debug(path, result.model_path, None, DebugOptions(num_samples=2))
    assert all(o.cumulative_sqnr_db is not None and o.cumulative_sqnr_db > 20 for o in report.model_outputs)


def test_quantize_writes_nothing_beside_the_users_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ORT's quantizer writes '<model>-inferred.onnx' next to the file it is given (and a Ctrl-C would leave it
    there): quantize hands it a copy in its own temporary folder, so nothing ever appears in the user's folder."""
    user = tmp_path / "user"
    user.mkdir()
    path = save(builders.tiny_convnet(), user / "m.onnx")
    written: list[str] = []
    real = onnx.shape_inference.infer_shapes_path

    def spy(src: str, dst: str = "", *args: object, **kwargs: object) -> None:
        written.append(dst or src)
        real(src, dst, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes_path", spy)
    quantize(path, None, QuantConfig(num_samples=2), tmp_path / "out" / "m.qdq.onnx")
    assert written and not [w for w in written if Path(w).parent == user]
    assert sorted(p.name for p in user.iterdir()) == ["m.onnx"]


def _dead_channel_data(tmp_path: Path) -> Path:
    x = np.random.default_rng(0).uniform(0, 1, (8, 1, 2, 8, 8)).astype(np.float32)
    x[:, :, 0] = 0.0  # channel 0 is dead
    path = tmp_path / "calib.npz"
    np.savez(path, x=x)
    return path


def test_quantize_measures_its_outputs_and_never_writes_a_lost_one(tmp_path: Path) -> None:
    """Per-tensor weights lose channel 1 (its weights round to 0: the output is at 0 dB); quantize measures that
    on its calibration samples and writes per-channel weights instead, saying so, with the numbers debug finds."""
    path = save(builders.dead_channel_conv(), tmp_path / "m.onnx")
    data = _dead_channel_data(tmp_path)
    plain = quantize(path, data, QuantConfig(), tmp_path / "plain.qdq.onnx", check=False)
    lost = debug(path, plain.model_path, data, DebugOptions(num_samples=4)).model_outputs[0].cumulative_sqnr_db
    assert lost is not None and lost <= 0.0 and plain.output_sqnr_db == {} and not plain.config.per_channel

    result = quantize(path, data, QuantConfig(), tmp_path / "m.qdq.onnx")
    assert result.config.per_channel and result.checked_samples == 4
    assert result.output_sqnr_db["y"] is not None and result.output_sqnr_db["y"] > 30
    assert result.choice is not None and result.choice.switched and result.warnings == ()
    assert result.choice.trials[0].label == "per-tensor uint8" and result.choice.trials[0].worst_db == lost
    assert result.choice.written.output_sqnr_db == result.output_sqnr_db
    assert result.checked_on == "the first 4 calibration sample(s) (the data has no others)"
    dq_axes = [
        a.name for n in onnx.load(result.model_path).graph.node if n.op_type == "DequantizeLinear" for a in n.attribute
    ]
    assert "axis" in dq_axes  # the written model really has per-channel weights
    fixed = debug(path, result.model_path, data, DebugOptions(num_samples=4)).model_outputs[0].cumulative_sqnr_db
    assert fixed is not None and abs(fixed - result.output_sqnr_db["y"]) < 0.01  # the same number debug reports
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["m.onnx", "calib.npz", "plain.qdq.onnx", "plain.qdq.calib.json", "m.qdq.onnx", "m.qdq.calib.json"]
    )  # no trial model or temporary file left beside the output


def test_quantize_reports_a_lost_output_it_cannot_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing left to try (the weights are per-channel int8 already): the model is written, and a warning names the
    output and its measured SQNR. The threshold is raised so that an ordinary model counts as lost."""
    import importlib

    # the module, not the function of the same name that ``qdebug`` exports
    monkeypatch.setattr(importlib.import_module("qdebug.quantizer"), "BROKEN_OUTPUT_DB", 1000.0)
    path = save(builders.tiny_convnet(), tmp_path / "m.onnx")
    result = quantize(path, None, QuantConfig(per_channel=True, weight_type="int8", num_samples=4), tmp_path / "q.onnx")
    db = result.output_sqnr_db["y"]
    assert result.config.per_channel and db is not None and result.choice is None
    assert [w for w in result.warnings if "does not reproduce" in w] == [
        f"output 'y' measures {db:.1f} dB on 4 check sample(s): its quantization error is as large as the "
        "signal, so this model does not reproduce the float model; 'qdebug debug' shows where it is lost"
    ]
    # synthetic data: the check samples are the next seeds, not the calibration samples
    assert result.checked_on == "synthetic samples 5-8 (seed 0) (not calibrated on)"


def test_quantize_cli_prints_the_measured_outputs(tmp_path: Path, run_cli) -> None:
    path = save(builders.dead_channel_conv(), tmp_path / "m.onnx")
    data = _dead_channel_data(tmp_path)
    r = run_cli("quantize", "-f", path, "--calib", data, "-o", tmp_path / "q.onnx")
    assert r.code == 0
    lines = r.out.splitlines()
    assert lines[4].startswith("  outputs vs float on 4 check sample(s): worst 'y' ") and "per-channel" in lines[4]
    assert lines[5] == "  check samples: the first 4 calibration sample(s) (the data has no others)"
    assert "dB per-tensor uint8" in lines[6] and "(worst output) on 4 check sample(s) → written per-channel" in lines[6]
    assert r.stderr == ""  # a better recipe measured is a choice, said on stdout, not a warning
    r = run_cli("quantize", "-f", path, "--calib", data, "-o", tmp_path / "p.onnx", "--no-output-check")
    assert r.code == 0 and "outputs vs float" not in r.out and r.stderr == ""


def test_a_config_file_is_followed_exactly_and_the_lost_output_named(tmp_path: Path, run_cli) -> None:
    """A recipe the user wrote down (--config, --overrides) is not changed: per-tensor weights stay, and the output
    they lose is named in a warning with its measured SQNR."""
    path = save(builders.dead_channel_conv(), tmp_path / "m.onnx")
    data = _dead_channel_data(tmp_path)
    cfg = tmp_path / "cfg.json"
    cfg.write_text(QuantConfig().to_json())
    r = run_cli("quantize", "-f", path, "--calib", data, "--config", cfg, "-o", tmp_path / "q.onnx", "--json")
    assert r.code == 0
    result = json.loads(r.out)
    assert result["config"]["per_channel"] is False and result["output_sqnr_db"]["y"] <= 0.0
    assert result["choice"] is None  # nothing else was measured
    assert [w for w in result["warnings"] if "output 'y' measures" in w and "does not reproduce" in w]
    r = run_cli("quantize", "-f", path, "--calib", data, "--config", cfg, "-o", tmp_path / "q2.onnx")
    assert r.stderr.count("\n") == 1 and "output 'y' measures 0.0 dB" in r.stderr
