"""The known HTP numeric behaviours (qdebug.targets.htp_numerics), each reproduced on a single-op QDQ model on the
real HTP simulator: the divergence from ONNX Runtime's CPU QDQ exists, and the rewrite removes at least 80 % of
the loss (CPU-QDQ vs float minus HTP vs float). The numbers are in docs/qnn.md, "Known HTP numeric behaviours"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_qnn import require_qnn

from qdebug.build import BuildOptions, build
from qdebug.metrics import sqnr_from_energies
from qdebug.ort import make_session
from qdebug.targets.base import get_target
from qdebug.targets.htp_numerics import HtpBehaviour, HtpFinding, find_behaviours, rewrite_qdq
from qdebug.targets.qnn_compile import compile_qnn
from qdebug.targets.qnn_diagnosis_record import MANIFEST_KEY, QnnDiagnosis, RemedyKind
from qdebug.targets.qnn_session import qnn_session

#: (ONNX type, qmax) of the activation grids tested
_GRIDS = {"uint8": (TensorProto.UINT8, 255), "uint16": (TensorProto.UINT16, 65535)}
#: the grids of a decomposed LayerNorm's Reciprocal in the byte classifier magika at uint8 (its 1/sqrt(var + eps))
_X_TOP, _Y_TOP = 0.1619, 289.4


def _reciprocal_qdq(act: str, x_top: float = _X_TOP, y_top: float = _Y_TOP) -> onnx.ModelProto:
    """x → Q/DQ → Reciprocal → Q/DQ → y, both grids from 0 on ``act``."""
    elem, qmax = _GRIDS[act]
    inits = []
    for name, top in (("x", x_top), ("y", y_top)):
        inits += [
            numpy_helper.from_array(np.array(top / qmax, np.float32), f"{name}_scale"),
            helper.make_tensor(f"{name}_zp", elem, [], [0]),
        ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["x_q"]),
        helper.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zp"], ["x_dq"]),
        helper.make_node("Reciprocal", ["x_dq"], ["r"], name="recip"),
        helper.make_node("QuantizeLinear", ["r", "y_scale", "y_zp"], ["r_q"]),
        helper.make_node("DequantizeLinear", ["r_q", "y_scale", "y_zp"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "reciprocal",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def _x() -> np.ndarray:
    """sqrt of a small variance, as in the LayerNorm: within the input grid, away from 0."""
    rng = np.random.default_rng(0)
    return np.sqrt(np.exp(rng.uniform(np.log(3.5e-4), np.log(1.7e-2), size=(1, 256)))).astype(np.float32)


def _db(ref: np.ndarray, x: np.ndarray) -> float:
    ref64, x64 = ref.astype(np.float64), x.astype(np.float64)
    db, _ = sqnr_from_energies(float(np.sum(ref64**2)), float(np.sum((ref64 - x64) ** 2)))
    assert db is not None
    return db


def _htp(model: onnx.ModelProto, x: np.ndarray, work: Path, out: str = "y") -> np.ndarray:
    """The model compiled for the HTP (one partition, nothing on the CPU) and run on the simulator."""
    work.mkdir()
    path = work / "m.onnx"
    onnx.save(model, str(path))
    rep = compile_qnn(path, work)
    assert rep.ok, rep.error
    assert rep.accelerator_partitions == 1 and rep.cpu_nodes == 0
    return np.asarray(qnn_session(rep.compiled_model).run([out], {"x": x})[0])


def _cpu(model: onnx.ModelProto, x: np.ndarray, out: str = "y") -> np.ndarray:
    return np.asarray(make_session(model, ["CPUExecutionProvider"]).run([out], {"x": x})[0])


def test_the_reciprocal_behaviour_is_found_only_below_one() -> None:
    found = find_behaviours(_reciprocal_qdq("uint8"))
    assert [(f.behaviour, f.node, f.tensor) for f in found] == [(HtpBehaviour.RECIPROCAL_INPUT_BELOW_ONE, "recip", "r")]
    assert "0.1619" in found[0].detail
    assert HtpFinding.from_dict(found[0].to_dict()) == found[0]
    assert find_behaviours(_reciprocal_qdq("uint16", x_top=1.5, y_top=10.0)) == ()


@pytest.mark.parametrize("act", ["uint8", "uint16"])
def test_the_rewrite_computes_the_same_on_the_cpu_and_leaves_its_input_alone(act: str) -> None:
    model = _reciprocal_qdq(act)
    before = model.SerializeToString()
    fixed, done = rewrite_qdq(model)
    assert done == ("recip",) and model.SerializeToString() == before
    assert [n.op_type for n in fixed.graph.node].count("Reciprocal") == 0
    onnx.checker.check_model(fixed)
    np.testing.assert_array_equal(_cpu(fixed, _x()), _cpu(model, _x()))
    assert find_behaviours(fixed) == ()


@pytest.mark.parametrize("act", ["uint8", "uint16"])
def test_reciprocal_with_an_input_grid_below_one_is_off_by_its_top_on_the_htp(act: str, tmp_path: Path) -> None:
    require_qnn()
    model, x = _reciprocal_qdq(act), _x()
    ref = 1.0 / x.astype(np.float64)
    cpu, htp = _cpu(model, x), _htp(model, x, tmp_path / "base")
    # the HTP returns x_top / x: the float result times the input grid's top value
    ratio = np.median(htp / ref)
    assert abs(ratio - _X_TOP) < 0.05 * _X_TOP, ratio
    loss = _db(ref, cpu) - _db(ref, htp)
    assert loss > 25.0, loss
    fixed, _ = rewrite_qdq(model)
    htp_fixed = _htp(fixed, x, tmp_path / "fixed")
    remaining = _db(ref, cpu) - _db(ref, htp_fixed)
    assert remaining <= 0.2 * loss, (loss, remaining)
    assert _db(cpu, htp_fixed) > 60.0


def _layernorm_float(path: Path) -> Path:
    """x · 1/sqrt(mean(x²) + eps), the RMS half of a LayerNorm decomposed as exporters write it (Sqrt, then
    Reciprocal); small inputs put the Reciprocal's input grid below 1.0."""
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"], name="square"),
        helper.make_node("ReduceMean", ["sq", "axes"], ["var"], name="mean", keepdims=1),
        helper.make_node("Add", ["var", "eps"], ["var_eps"], name="add_eps"),
        helper.make_node("Sqrt", ["var_eps"], ["std"], name="sqrt"),
        helper.make_node("Reciprocal", ["std"], ["inv_std"], name="reciprocal"),
        helper.make_node("Mul", ["x", "inv_std"], ["y"], name="normalise"),
    ]
    inits = [
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
        numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
    ]
    graph = helper.make_graph(
        nodes,
        "rms",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 64])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def test_the_build_names_the_cause_and_chooses_the_rewrite(tmp_path: Path) -> None:
    require_qnn()
    rng = np.random.default_rng(0)
    scales = rng.uniform(0.02, 0.2, size=(16, 1, 1, 1))
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=(rng.standard_normal((16, 1, 4, 64)) * scales).astype(np.float32))
    opts = BuildOptions("qnn", "uint8", debug_samples=8, bisect="never", remedies=True)
    m = build(_layernorm_float(tmp_path / "rms.onnx"), tmp_path / "out", opts, data=calib).manifest
    d = QnnDiagnosis.from_dict(m.target_details[MANIFEST_KEY])
    assert [(c.behaviour, c.node) for c in d.causes] == [(HtpBehaviour.RECIPROCAL_INPUT_BELOW_ONE, "reciprocal")]
    named = [line for line in d.describe() if line.startswith("known HTP behaviour")]
    assert len(named) == 1 and "reciprocal_input_below_one at reciprocal" in named[0], d.describe()
    r = d.remedies
    assert r is not None and r.baseline_db is not None and r.cpu_vs_float_db is not None
    loss = r.cpu_vs_float_db - r.baseline_db
    assert loss > 10.0, (r.baseline_db, r.cpu_vs_float_db)
    best = r.best
    assert best is not None and best.kind is RemedyKind.HTP_REWRITE and best.target_vs_float_db is not None
    assert r.cpu_vs_float_db - best.target_vs_float_db <= 0.2 * loss, (best, r.cpu_vs_float_db)
    assert (tmp_path / "out" / r.files["remedy_compiled_model"]).is_file()


def _act_qdq(name: str, lo: float, hi: float, elem: int, qmax: int) -> tuple[list[onnx.NodeProto], list[Any]]:
    """Q → DQ of ``name`` (read as ``<name>_dq``) on the asymmetric grid covering [lo, hi] and 0."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / qmax
    inits = [
        numpy_helper.from_array(np.array(scale, np.float32), f"{name}_scale"),
        helper.make_tensor(f"{name}_zp", elem, [], [round(-lo / scale)]),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", [name, f"{name}_scale", f"{name}_zp"], [f"{name}_q"]),
        helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_scale", f"{name}_zp"], [f"{name}_dq"]),
    ]
    return nodes, inits


def _conv_silu(act: str) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    """x → Conv 1×1 (8 → 32 channels, 10×10, uint8 weights, int32 bias as ORT writes it) → x·Sigmoid(x), every
    activation on ``act``: the QDQ model, an input and the float SiLU of it."""
    elem, qmax = _GRIDS[act]
    rng = np.random.default_rng(0)
    x = np.abs(rng.standard_normal((1, 8, 10, 10))).astype(np.float32)
    w = (rng.standard_normal((32, 8, 1, 1)) / np.sqrt(8)).astype(np.float32)
    b = (rng.standard_normal(32) * 0.1).astype(np.float32)
    conv = np.einsum("oc,chw->ohw", w[:, :, 0, 0], x[0])[None] + b[None, :, None, None]
    silu = conv / (1.0 + np.exp(-conv))
    nodes, inits = _act_qdq("x", 0.0, float(x.max()), elem, qmax)
    w_lo, w_hi = min(float(w.min()), 0.0), max(float(w.max()), 0.0)
    w_scale = (w_hi - w_lo) / 255
    w_zp = round(-w_lo / w_scale)
    b_scale = float(x.max()) / qmax * w_scale  # the Conv's accumulator grid: x's scale times w's
    inits += [
        numpy_helper.from_array(np.clip(np.round(w / w_scale) + w_zp, 0, 255).astype(np.uint8), "w_q"),
        numpy_helper.from_array(np.array(w_scale, np.float32), "w_scale"),
        helper.make_tensor("w_zp", TensorProto.UINT8, [], [w_zp]),
        numpy_helper.from_array(np.round(b / b_scale).astype(np.int32), "b_q"),
        numpy_helper.from_array(np.array(b_scale, np.float32), "b_scale"),
        helper.make_tensor("b_zp", TensorProto.INT32, [], [0]),
    ]
    nodes += [
        helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zp"], ["w"]),
        helper.make_node("DequantizeLinear", ["b_q", "b_scale", "b_zp"], ["b"]),
        helper.make_node("Conv", ["x_dq", "w", "b"], ["c"], name="conv", kernel_shape=[1, 1]),
    ]
    for name, lo, hi in (("c", conv.min(), conv.max()), ("s", 0.0, 1.0), ("y", silu.min(), silu.max())):
        if name == "s":
            nodes.append(helper.make_node("Sigmoid", ["c_dq"], ["s"], name="sigmoid"))
        if name == "y":
            nodes.append(helper.make_node("Mul", ["c_dq", "s_dq"], ["y"], name="silu"))
        more_nodes, more_inits = _act_qdq(name, float(lo), float(hi), elem, qmax)
        nodes += more_nodes
        inits += more_inits
    graph = helper.make_graph(
        nodes,
        "conv_silu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 10, 10])],
        [helper.make_tensor_value_info("y_dq", TensorProto.FLOAT, [1, 32, 10, 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model, x, silu


def test_the_conv_silu_behaviour_is_found_only_at_16_bits() -> None:
    found = find_behaviours(_conv_silu("uint16")[0])
    assert [(f.behaviour, f.node, f.tensor) for f in found] == [(HtpBehaviour.CONV_SILU_16BIT, "sigmoid", "y")]
    assert find_behaviours(_conv_silu("uint8")[0]) == ()
    fixed, done = rewrite_qdq(_conv_silu("uint16")[0])
    assert done == ("sigmoid",) and find_behaviours(fixed) == ()
    onnx.checker.check_model(fixed)


def test_conv_then_silu_at_16_bits_is_wrong_in_a_block_on_the_htp(tmp_path: Path) -> None:
    require_qnn()
    model, x, ref = _conv_silu("uint16")
    cpu = _cpu(model, x, "y_dq")
    htp = _htp(model, x, tmp_path / "base", "y_dq")
    loss = _db(ref, cpu) - _db(ref, htp)
    assert loss > 20.0, loss
    # the wrong values sit in whole pairs of rows (here the first and the last two); the rows between are right
    wrong = np.abs(htp - cpu) > 0.05 * np.abs(ref).max()
    assert wrong[0, :, :2].any() and wrong[0, :, 8:].any() and not wrong[0, :, 2:8].any()
    fixed, _ = rewrite_qdq(model)
    remaining = _db(ref, cpu) - _db(ref, _htp(fixed, x, tmp_path / "fixed", "y_dq"))
    assert remaining <= 0.2 * loss, (loss, remaining)


def test_the_qnn_target_notes_the_behaviours_for_the_fix_engine() -> None:
    notes = get_target("qnn").qdq_notes(_reciprocal_qdq("uint8"))
    assert notes[0].startswith("on qnn, known HTP behaviour: reciprocal_input_below_one at recip")
    assert "--remedies" in notes[-1]
    assert get_target("qnn").qdq_notes(_reciprocal_qdq("uint8", x_top=2.0)) == []
    assert get_target("cpu").qdq_notes(_reciprocal_qdq("uint8")) == []


def _hardsigmoid_qdq(act: str, y_top: float) -> onnx.ModelProto:
    """x → Q/DQ → HardSigmoid(0.2 x + 0.5) → Q/DQ, the grids of a squeeze-and-excitation gate of ppocr-cls."""
    elem, qmax = _GRIDS[act]
    nodes, inits = _act_qdq("x", -2.0907, 1.1858, elem, qmax)
    nodes.append(helper.make_node("HardSigmoid", ["x_dq"], ["y"], name="gate", alpha=0.2, beta=0.5))
    more_nodes, more_inits = _act_qdq("y", 0.0, y_top, elem, qmax)
    graph = helper.make_graph(
        nodes + more_nodes,
        "hardsigmoid",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 1, 1])],
        [helper.make_tensor_value_info("y_dq", TensorProto.FLOAT, [1, 64, 1, 1])],
        inits + more_inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def test_hardsigmoid_with_a_16_bit_grid_below_one_is_scaled_by_its_top_on_the_htp(tmp_path: Path) -> None:
    assert find_behaviours(_hardsigmoid_qdq("uint8", 0.7372)) == ()
    assert find_behaviours(_hardsigmoid_qdq("uint16", 1.0)) == ()
    model = _hardsigmoid_qdq("uint16", 0.7372)
    assert [f.behaviour for f in find_behaviours(model)] == [HtpBehaviour.HARDSIGMOID_16BIT_BELOW_ONE]
    require_qnn()
    x = np.random.default_rng(0).uniform(-2.09, 1.18, (1, 64, 1, 1)).astype(np.float32)
    ref = np.clip(0.2 * x.astype(np.float64) + 0.5, 0.0, 1.0)
    cpu, htp = _cpu(model, x, "y_dq"), _htp(model, x, tmp_path / "base", "y_dq")
    assert abs(np.median(htp / ref) - 0.7372) < 0.01  # y · y_max
    loss = _db(ref, cpu) - _db(ref, htp)
    assert loss > 50.0, loss
    fixed, done = rewrite_qdq(model)
    assert done == ("gate",) and find_behaviours(fixed) == ()
    remaining = _db(ref, cpu) - _db(ref, _htp(fixed, x, tmp_path / "fixed", "y_dq"))
    assert remaining <= 0.2 * loss, (loss, remaining)


#: the grids of openWakeWord's mel front end's ``log(power)`` at uint16 (oww-melspec's Log_17)
_LOG_X_TOP, _LOG_Y_TOP = 9.149e9, 22.937


def _log_qdq(act: str, x_top: float = _LOG_X_TOP) -> onnx.ModelProto:
    """x → Q/DQ → Log → Q/DQ, both grids from 0."""
    elem, qmax = _GRIDS[act]
    nodes, inits = _act_qdq("x", 0.0, x_top, elem, qmax)
    nodes.append(helper.make_node("Log", ["x_dq"], ["y"], name="log"))
    more_nodes, more_inits = _act_qdq("y", 0.0, _LOG_Y_TOP, elem, qmax)
    graph = helper.make_graph(
        nodes + more_nodes,
        "log",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
        [helper.make_tensor_value_info("y_dq", TensorProto.FLOAT, [1, 256])],
        inits + more_inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def _log_x() -> np.ndarray:
    """Mel powers, log-uniform over the upper five decades of the grid (all above its first step)."""
    rng = np.random.default_rng(0)
    return np.exp(rng.uniform(np.log(_LOG_X_TOP * 1e-5), np.log(_LOG_X_TOP), (1, 256))).astype(np.float32)


def test_the_log_rewrite_is_found_only_above_fp16_and_keeps_the_cpu_result() -> None:
    assert find_behaviours(_log_qdq("uint8")) == ()
    assert find_behaviours(_log_qdq("uint16", x_top=65000.0)) == ()
    model = _log_qdq("uint16")
    found = find_behaviours(model)
    assert [(f.behaviour, f.node, f.tensor) for f in found] == [(HtpBehaviour.LOG_16BIT_INPUT_ABOVE_FP16, "log", "y")]
    before = model.SerializeToString()
    fixed, done = rewrite_qdq(model)
    assert done == ("log",) and model.SerializeToString() == before and find_behaviours(fixed) == ()
    onnx.checker.check_model(fixed)
    # the same integers on the CPU, but for a rounding tie now and then (log(x/c) + log c is not bit-exact)
    step = _LOG_Y_TOP / 65535
    diff = np.abs(_cpu(fixed, _log_x(), "y_dq") - _cpu(model, _log_x(), "y_dq"))
    assert diff.max() <= 1.01 * step and np.mean(diff > 0) < 0.05


def test_log_with_a_16_bit_input_grid_above_fp16_is_wrong_on_the_htp(tmp_path: Path) -> None:
    require_qnn()
    model, x = _log_qdq("uint16"), _log_x()
    ref = np.log(x.astype(np.float64))
    cpu, htp = _cpu(model, x, "y_dq"), _htp(model, x, tmp_path / "base", "y_dq")
    loss = _db(ref, cpu) - _db(ref, htp)
    assert loss > 40.0, loss
    fixed, _ = rewrite_qdq(model)
    htp_fixed = _htp(fixed, x, tmp_path / "fixed", "y_dq")
    remaining = _db(ref, cpu) - _db(ref, htp_fixed)
    assert remaining <= 0.2 * loss, (loss, remaining)
    assert _db(cpu, htp_fixed) > 60.0
