"""qdebug.targets.deeploy_export: each pass on a purpose-built graph, the integer evaluator, and end-to-end
bit-exactness of the integer export against ONNX Runtime's QDQ run (no Deeploy needed)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from builders import _model, qdq_pair, scalar, value_info
from conftest import SAMPLE_MODELS
from onnx import TensorProto, helper, numpy_helper

from qdebug import quantize
from qdebug.config import QuantConfig
from qdebug.errors import DataError, TargetError
from qdebug.targets import deeploy_evaluate as dv
from qdebug.targets import deeploy_export as de
from qdebug.targets import deeploy_passes as dp
from qdebug.targets.model_fixes import fold_batchnorm

DEEPLOY = QuantConfig(activation_type="int8", weight_type="int8", target="deeploy", num_samples=16)


def residual_convnet(seed: int = 0) -> onnx.ModelProto:
    """Conv(+bias) → Relu → Conv → Add(residual) → MaxPool → Flatten → Gemm, float."""
    rng = np.random.default_rng(seed)

    def init(shape: tuple[int, ...], scale: float, name: str) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [
        init((8, 3, 3, 3), 0.5, "w1"), init((8,), 0.1, "b1"), init((8, 8, 3, 3), 0.2, "w2"),
        init((8,), 0.1, "b2"), init((5, 8 * 4 * 4), 0.2, "wg"), init((5,), 0.1, "bg"),
    ]  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["a1"], name="add1"),
        helper.make_node("MaxPool", ["a1"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wg", "bg"], ["y"], name="gemm", transB=1),
    ]
    return _model(nodes, [value_info("x", [1, 3, 8, 8])], [value_info("y", [1, 5])], inits)


def qdq_linear(
    op: str, *, x_zp: int, pads: int = 0, bias: bool = False, seed: int = 0
) -> tuple[onnx.ModelProto, np.ndarray]:
    """Hand-built int8 QDQ: x → Q/DQ → op(DQ(W int8)[, DQ(b int32)]) → Q/DQ → y, with the input zero point chosen."""
    rng = np.random.default_rng(seed)
    if op == "Conv":
        w_q = rng.integers(-127, 128, (4, 2, 3, 3)).astype(np.int8)
        x_shape, y_shape = [1, 2, 5, 5], [1, 4, 5 - 2 + 2 * pads, 5 - 2 + 2 * pads]
        attrs = {"pads": [pads] * 4}
    else:
        w_q = rng.integers(-127, 128, (6, 4)).astype(np.int8)
        x_shape, y_shape, attrs = [1, 6], [1, 4], {}
    inits = [
        numpy_helper.from_array(w_q, "w_quantized"),
        scalar("w_scale", 0.01, np.float32), scalar("w_zero_point", 0, np.int8),
        scalar("x_scale", 0.02, np.float32), scalar("x_zero_point", x_zp, np.int8),
        scalar("y_scale", 0.5, np.float32), scalar("y_zero_point", 3, np.int8),
    ]  # fmt: skip
    nodes = [
        *qdq_pair("x", "x_scale", "x_zero_point"),
        helper.make_node("DequantizeLinear", ["w_quantized", "w_scale", "w_zero_point"], ["w_dq"], name="w_DQ"),
    ]
    op_inputs = ["x_DequantizeLinear_Output", "w_dq"]
    if bias:
        b_q = rng.integers(-500, 500, 4).astype(np.int32)
        inits += [numpy_helper.from_array(b_q, "b_quantized"), scalar("b_scale", 0.0002, np.float32)]
        nodes.append(helper.make_node("DequantizeLinear", ["b_quantized", "b_scale"], ["b_dq"], name="b_DQ"))
        op_inputs.append("b_dq")
    nodes += [
        helper.make_node(op, op_inputs, ["acc"], name="op", **attrs),
        helper.make_node("QuantizeLinear", ["acc", "y_scale", "y_zero_point"], ["y_q"], name="y_Q"),
        helper.make_node("DequantizeLinear", ["y_q", "y_scale", "y_zero_point"], ["y"], name="y_DQ"),
    ]
    return _model(nodes, [value_info("x", x_shape)], [value_info("y", y_shape)], inits), w_q


def run_passes(model: onnx.ModelProto, upto: str) -> de.GraphState:
    """A fresh state after every default pass up to and including ``upto``."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    state = de.GraphState(m)
    for name, fn in de.PASSES:
        if name in dp.OPTIONAL_PASSES:
            continue
        fn(state)
        if name == upto:
            return state
    raise AssertionError(upto)


def rqs_attrs(node: onnx.NodeProto) -> dict[str, np.ndarray]:
    return {a.name: numpy_helper.to_array(a.t) for a in node.attribute}


@pytest.fixture(scope="module")
def conv_qdq(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("deeploy") / "conv.qdq.onnx"
    return Path(quantize(residual_convnet(), None, DEEPLOY, out).model_path)


# --------------------------------------------------------------------------- the passes, one by one


def test_pass_registry_lists_every_pass_in_order() -> None:
    names = de.pass_names()
    assert names[0] == "check_supported" and names[-1] == "check_integer_only"
    assert names.index("fold_dequant_quant_to_requantshift") < names.index("fold_conv_bias")
    assert len(set(names)) == len(names) >= 10
    assert all(fn.__doc__ for _, fn in de.PASSES)


def test_check_supported_rejects_a_float_model() -> None:
    with pytest.raises(TargetError, match="not a QDQ model"):
        dp.check_supported(de.GraphState(residual_convnet()))


def test_check_supported_names_the_first_unsupported_node() -> None:
    model, _ = qdq_linear("MatMul", x_zp=0)
    model.graph.node.insert(3, helper.make_node("Tanh", ["x_DequantizeLinear_Output"], ["th"], name="my_tanh"))
    with pytest.raises(TargetError, match="Tanh node 'my_tanh'"):
        dp.check_supported(de.GraphState(model))


def test_check_supported_names_a_16_bit_tensor() -> None:
    model, _ = qdq_linear("MatMul", x_zp=0)
    for init in model.graph.initializer:
        if init.name == "y_zero_point":
            init.CopyFrom(scalar("y_zero_point", 3, np.int16))
    with pytest.raises(TargetError, match="tensor 'y_q' is quantized to int16"):
        dp.check_supported(de.GraphState(model))


def test_fold_weight_quantization_keeps_the_int8_values() -> None:
    model, w_q = qdq_linear("MatMul", x_zp=0)
    state = run_passes(model, "fold_weight_quantization")
    assert not any(n.name == "w_DQ" for n in state.graph.node)
    ints, scale = state.weights["w_dq"]
    np.testing.assert_array_equal(ints, w_q)
    assert float(scale) == pytest.approx(0.01)


def test_fold_weight_quantization_rejects_asymmetric_weights() -> None:
    model, _ = qdq_linear("MatMul", x_zp=0)
    for init in model.graph.initializer:
        if init.name == "w_zero_point":
            init.CopyFrom(scalar("w_zero_point", 5, np.int8))
    with pytest.raises(TargetError, match="weight 'w_quantized' has a non-zero zero point"):
        run_passes(model, "fold_weight_quantization")


@pytest.mark.parametrize(("zp", "elem"), [(0, TensorProto.INT8), (7, TensorProto.INT8), (-128, TensorProto.UINT8)])
def test_strip_input_quant_declares_the_integer_input(zp: int, elem: int) -> None:
    model, _ = qdq_linear("MatMul", x_zp=zp)
    state = run_passes(model, "strip_input_quant")
    assert not any(n.op_type == "QuantizeLinear" and n.input[0] == "x" for n in state.graph.node)
    assert state.graph.input[0].name == "x"
    assert state.graph.input[0].type.tensor_type.elem_type == elem
    assert state.inputs["x"].residual_zp == (0 if zp == -128 else zp)


def test_fold_dequant_quant_to_requantshift_emits_deeploy_requantshift() -> None:
    model, _ = qdq_linear("MatMul", x_zp=0)
    state = run_passes(model, "fold_dequant_quant_to_requantshift")
    ops = [n.op_type for n in state.graph.node]
    assert ops == ["MatMul", "RequantShift"]
    rq = state.graph.node[1]
    attrs = rqs_attrs(rq)
    assert {k: v.shape for k, v in attrs.items()} == {"div": (1,), "n_levels": (1,), "signed": (1,)}
    div = int(attrs["div"][0])
    assert div & (div - 1) == 0 and attrs["n_levels"][0] == 256 and attrs["signed"][0] == 1
    consts = state.consts()
    mul, add = consts[rq.input[1]], consts[rq.input[2]]
    assert mul.dtype == add.dtype == np.int32
    np.testing.assert_array_equal(add, 3 * div)  # zp_out·div, without Deeploy's own div/2
    m = float(np.float32(0.02)) * float(np.float32(0.01)) / 0.5
    assert mul[0] / div == pytest.approx(m, rel=1.0 / mul[0])
    assert max(state.requant_errors.values()) <= 0.5 / mul[0]
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in state.graph.node)


def test_fold_input_zero_point_goes_into_the_requantshift_add() -> None:
    model, w_q = qdq_linear("MatMul", x_zp=7)
    state = run_passes(model, "fold_input_zero_point")
    rq = state.graph.node[1]
    consts = state.consts()
    div = int(rqs_attrs(rq)["div"][0])
    expected = 3 * div + consts[rq.input[1]].astype(np.int64) * (-7 * w_q.astype(np.int64).sum(axis=0))
    np.testing.assert_array_equal(consts[rq.input[2]], expected)


def test_fold_input_zero_point_refuses_a_padded_conv() -> None:
    """Padding Deeploy's Pad cannot write (unequal at the two ends) on an input with a zero point is refused."""
    model, _ = qdq_linear("Conv", x_zp=7, pads=1)
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    pads = next(a for a in conv.attribute if a.name == "pads")
    del pads.ints[:]
    pads.ints.extend([1, 1, 0, 0])
    with pytest.raises(TargetError, match="input 'x' has zero point 7 and the Conv pads"):
        run_passes(model, "fold_input_zero_point")


def test_fold_input_zero_point_pads_a_padded_conv_with_the_zero_point(tmp_path: Path) -> None:
    """Padding equal at both ends: an explicit Pad whose value is the zero point, then the unpadded Conv; exact."""
    model, _ = qdq_linear("Conv", x_zp=7, pads=1)
    state = run_passes(model, "fold_input_zero_point")
    pad, conv = state.graph.node[0], state.graph.node[1]
    assert pad.op_type == "Pad" and conv.op_type == "Conv" and conv.input[0] == pad.output[0]
    assert helper.get_attribute_value(next(a for a in pad.attribute if a.name == "value")) == 7
    assert list(next(a for a in conv.attribute if a.name == "pads").ints) == [0, 0, 0, 0]
    res = de.export(model, tmp_path / "out", num_samples=8, verbose=False)
    assert res.max_lsb_diff <= 1 and res.equal_fraction >= 0.99, res


def test_fold_conv_bias_moves_the_bias_into_add() -> None:
    model, _ = qdq_linear("Conv", x_zp=0, bias=True)
    before = run_passes(model, "fold_input_zero_point")
    conv = before.graph.node[0]
    bias = before.consts()[conv.input[2]].astype(np.int64)
    state = run_passes(model, "fold_conv_bias")
    conv, rq = state.graph.node
    assert len(conv.input) == 2
    consts = state.consts()
    div = int(rqs_attrs(rq)["div"][0])
    mul = consts[rq.input[1]].astype(np.int64)
    assert consts[rq.input[2]].shape == (4, 1, 1)
    np.testing.assert_array_equal(consts[rq.input[2]], 3 * div + mul * bias.reshape(4, 1, 1))


def test_explicit_attributes_writes_what_deeploy_parses() -> None:
    model, _ = qdq_linear("Conv", x_zp=0)
    state = run_passes(model, "explicit_attributes")
    conv = state.graph.node[0]
    assert {"dilations", "group", "pads", "strides", "kernel_shape"} <= {a.name for a in conv.attribute}
    gemm_model = _model(
        [helper.make_node("Gemm", ["a", "b"], ["c"], name="g")], [value_info("a", [1, 2])], [value_info("c", [1, 2])]
    )
    gs = de.GraphState(gemm_model)
    dp.explicit_attributes(gs)
    attrs = {a.name: helper.get_attribute_value(a) for a in gs.graph.node[0].attribute}
    assert attrs["alpha"] == 1.0 and attrs["beta"] == 1.0 and isinstance(attrs["alpha"], float)


def test_remove_orphans_drops_unused_nodes_and_initializers() -> None:
    model, _ = qdq_linear("MatMul", x_zp=0)
    state = run_passes(model, "remove_orphans")
    used = {t for n in state.graph.node for t in n.input}
    assert all(i.name in used for i in state.graph.initializer)
    assert not any(i.name.endswith("_scale") for i in state.graph.initializer)


def test_annotate_shapes_gives_every_tensor_a_shape() -> None:
    model, _ = qdq_linear("Conv", x_zp=0, bias=True, pads=1)
    state = run_passes(model, "annotate_shapes")
    info = {v.name: v for v in (*state.graph.value_info, *state.graph.output)}
    for node in state.graph.node:
        for t in node.output:
            assert len(info[t].type.tensor_type.shape.dim) > 0
    assert info["y"].type.tensor_type.elem_type == TensorProto.INT8
    dp.check_integer_only(state)


# --------------------------------------------------------------------------- the integer evaluator


def test_requant_shift_matches_deeploys_formula() -> None:
    x = np.array([3, -3, 1000, -1000, 5])
    y = dv.requant_shift(x, np.array(1), np.array(0), 2, 256, True)
    np.testing.assert_array_equal(y, [2, -1, 127, -128, 3])  # floor((x + 1) / 2), clipped
    np.testing.assert_array_equal(dv.requant_shift(x, np.array(1), np.array(0), 2, 256, False), [2, 0, 255, 0, 3])


def test_integer_conv_matches_onnxruntime() -> None:
    rng = np.random.default_rng(1)
    x = rng.integers(-128, 128, (1, 4, 7, 7)).astype(np.float32)
    w = rng.integers(-127, 128, (4, 2, 3, 3)).astype(np.float32)
    attrs = {"pads": [1, 0, 1, 2], "strides": [2, 1], "group": 2}
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="c", **attrs)
    m = _model([node], [value_info("x", [1, 4, 7, 7])], [value_info("y", None)], [numpy_helper.from_array(w, "w")])
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = dv._conv(x.astype(np.int64), w.astype(np.int64), attrs)
    np.testing.assert_array_equal(got, ref.astype(np.int64))


# --------------------------------------------------------------------------- end to end


def test_export_is_bit_exact_on_the_conv_model(conv_qdq: Path, tmp_path: Path) -> None:
    out = tmp_path / "net"
    res = de.export(conv_qdq, out, verbose=False, num_samples=16)
    assert res.num_samples == 16
    assert res.equal_fraction >= 0.999 and res.max_lsb_diff <= 1, res
    assert res and res.worst_requant_rel_error < 1e-3
    assert sorted(p.name for p in out.iterdir()) == ["inputs.npz", "network.onnx", "outputs.npz"]
    net = onnx.load(str(out / "network.onnx"))
    ops = [n.op_type for n in net.graph.node]
    assert set(ops) == {"Conv", "RequantShift", "Add", "MaxPool", "Flatten", "Gemm"}
    assert all(i.data_type in (TensorProto.INT8, TensorProto.INT32, TensorProto.INT64) for i in net.graph.initializer)
    inputs, outputs = dict(np.load(out / "inputs.npz")), dict(np.load(out / "outputs.npz"))
    assert list(inputs) == [i.name for i in net.graph.input] and list(outputs) == [o.name for o in net.graph.output]
    got = de.evaluate_integer(net, inputs)
    np.testing.assert_array_equal(got["y"], outputs["y"])
    assert res.to_dict()["schema_version"] == 1
    assert de.ExportResult.from_dict(res.to_dict()) == res


def test_export_lists_and_disables_passes_by_name(
    conv_qdq: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    res = de.export(conv_qdq, tmp_path / "a", disable=["explicit_attributes"], num_samples=2)
    printed = capsys.readouterr().out
    assert "[6/13] fold_dequant_quant_to_requantshift … nodes" in printed  # 14 passes, one optional, one disabled
    assert "explicit_attributes" not in [p.name for p in res.passes]
    conv = next(n for n in onnx.load(str(tmp_path / "a" / "network.onnx")).graph.node if n.op_type == "Conv")
    assert "dilations" not in {a.name for a in conv.attribute}
    with pytest.raises(TargetError, match="unknown export pass"):
        de.export(conv_qdq, tmp_path / "b", disable=["no_such_pass"], verbose=False)


def test_export_runs_its_passes_through_the_one_runner(conv_qdq: Path, tmp_path: Path) -> None:
    model = onnx.load(str(conv_qdq))
    before = model.SerializeToString()
    res = de.export(model, tmp_path / "a", num_samples=2, verbose=False)
    assert model.SerializeToString() == before  # the caller's model is never rewritten
    assert [p.name for p in res.passes] == [n for n in de.pass_names() if n not in dp.OPTIONAL_PASSES]
    assert all(p.seconds is not None and p.rewrites >= 0 for p in res.passes)
    # Each pass starts from the graph the previous one left.
    assert all(a.nodes_after == b.nodes_before for a, b in zip(res.passes, res.passes[1:], strict=False))
    assert res.passes[-1].nodes_after == len(onnx.load(str(tmp_path / "a" / "network.onnx")).graph.node)


def test_optional_pass_runs_only_when_enabled(conv_qdq: Path, tmp_path: Path) -> None:
    res = de.export(conv_qdq, tmp_path / "a", enable=["tighten_requant_to_observed_range"], verbose=False)
    assert "tighten_requant_to_observed_range" in [p.name for p in res.passes]
    assert res.max_lsb_diff <= 1


def test_export_takes_float_data(conv_qdq: Path, tmp_path: Path) -> None:
    data = {"x": np.random.default_rng(3).uniform(-1, 1, (5, 1, 3, 8, 8)).astype(np.float32)}
    res = de.export(conv_qdq, tmp_path / "a", data=data, verbose=False)
    assert res.num_samples == 5 and res.max_lsb_diff <= 1
    with pytest.raises(DataError, match="input 'x' has shape"):
        de.export(conv_qdq, tmp_path / "b", data={"x": np.zeros((2, 3, 8, 8))}, verbose=False)


def test_per_channel_weights_export(tmp_path: Path) -> None:
    cfg = QuantConfig(activation_type="int8", weight_type="int8", target="deeploy", per_channel=True, num_samples=8)
    qdq = quantize(residual_convnet(1), None, cfg, tmp_path / "pc.onnx").model_path
    res = de.export(qdq, tmp_path / "out", verbose=False)
    # One shared div per RequantShift: the channel with the widest accumulator limits every channel's mul.
    assert res.max_lsb_diff <= 1 and res.equal_fraction >= 0.95


def test_failed_export_leaves_nothing_behind(conv_qdq: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(de.np, "savez", broken)
    with pytest.raises(OSError, match="disk full"):
        de.export(conv_qdq, tmp_path / "out", verbose=False, num_samples=1)
    assert list(tmp_path.iterdir()) == []


def test_export_refuses_a_folder_with_other_files(conv_qdq: Path, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(TargetError, match="holds other files"):
        de.export(conv_qdq, tmp_path / "out", verbose=False)
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"


def test_float_model_is_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(TargetError, match="not a QDQ model: quantize it first"):
        de.export(residual_convnet(), tmp_path / "out", verbose=False)
    assert not (tmp_path / "out").exists()


def test_digits_cnn_needs_batchnorm_folding_then_exports(tmp_path: Path) -> None:
    float_model = onnx.load(str(SAMPLE_MODELS / "digits_cnn.onnx"))
    calib = SAMPLE_MODELS / "digits_calib.npz"
    raw = quantize(float_model, calib, DEEPLOY, tmp_path / "raw.onnx").model_path
    with pytest.raises(TargetError, match=re.escape("BatchNormalization node '/stem/stem.1/BatchNormalization'")):
        de.export(raw, tmp_path / "raw", verbose=False)
    folded, _ = fold_batchnorm(float_model)
    qdq = quantize(folded, calib, DEEPLOY, tmp_path / "folded.onnx").model_path
    res = de.export(qdq, tmp_path / "out", data=dict(np.load(calib)), num_samples=64, verbose=False)
    assert "GlobalAveragePool" not in {n.op_type for n in onnx.load(str(tmp_path / "out" / "network.onnx")).graph.node}
    # Never more than one step apart; the equal fraction is lower than on the small conv model because the
    # int32 headroom of RequantShift leaves only ~12 bits for mul on the wide layers (see docs/deeploy.md).
    assert res.max_lsb_diff <= 1 and res.equal_fraction >= 0.85


def test_transformer_needs_zero_centred_attention_operands(tmp_path: Path) -> None:
    """The transformer's ops all have integer forms now (tests/test_deeploy_transformer.py); exported as ORT
    quantized it, the first MatMul of two activations is named: its operands need zero point 0."""
    model = onnx.load(str(SAMPLE_MODELS / "digits_transformer.onnx"))
    qdq = quantize(model, SAMPLE_MODELS / "digits_calib.npz", DEEPLOY, tmp_path / "t.onnx").model_path
    with pytest.raises(TargetError, match=re.escape("MatMul node '/blocks/blocks.0/attn/MatMul': operand")) as exc:
        de.export(qdq, tmp_path / "out", verbose=False)
    assert "zero_centre_operands" in str(exc.value)


def test_weights_in_constant_nodes_are_folded(tmp_path: Path) -> None:
    model, _ = qdq_linear("MatMul", x_zp=0)
    w = next(i for i in model.graph.initializer if i.name == "w_quantized")
    model.graph.node.insert(0, helper.make_node("Constant", [], ["w_quantized"], name="w_const", value=w))
    model.graph.initializer.remove(w)
    res = de.export(model, tmp_path / "out", verbose=False)
    net = onnx.load(str(tmp_path / "out" / "network.onnx"))
    assert [n.op_type for n in net.graph.node] == ["MatMul", "RequantShift"]
    assert res.max_lsb_diff <= 1
