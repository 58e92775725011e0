"""The Deeploy export's op coverage (docs/deeploy.md, "Op coverage"): the data-movement ops Deeploy 0.2.1 maps on
Generic (Pad, Slice, Squeeze, Unsqueeze, with Concat across grids) in one small network that builds and whose
generated Generic code runs on the host bit-exact to the integer network; and the refusals, which name the node and
say whether Deeploy has no mapping for its op or the export has no integer form for it yet. The build test needs
the Deeploy environment and gcc (it fails, not skips, under ``CI=true``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_deeploy_env import deeploy, deeploy_env  # noqa: F401  (fixtures)
from test_deeploy_host import gcc  # noqa: F401  (fixture)

from qdebug.build import BuildOptions, build
from qdebug.config import QuantConfig
from qdebug.errors import TargetError
from qdebug.quantizer import quantize
from qdebug.targets.deeploy_export import export
from qdebug.targets.deeploy_passes import DEEPLOY_GENERIC_OPS, SUPPORTED_OPS

_INT64_MAX = 2**63 - 1


def _w(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)


def _i64(name: str, v: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(v, np.int64), name)


def _model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], out_shape: list[int]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "ops", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def movement_net() -> onnx.ModelProto:
    """x → Unsqueeze → Squeeze → Conv (signed c1) → {Pad → Conv, Relu → Pad → Conv, c1} → Concat → Slice → Relu
    → {GAP, ReduceMax} → Concat → Squeeze → Unsqueeze → Flatten → Gemm: the graph input read by a Reshape, Pad on
    a signed and on an unsigned grid, a three-input Concat of several grids, a Slice with a negative start and an
    INT64_MAX end that ORT requantizes (its Relu fused), a ReduceMax (as a MaxPool), both reshape forms."""
    rng = np.random.default_rng(0)
    pads = [0, 0, 1, 1, 0, 0, 1, 1]
    nodes = [
        helper.make_node("Unsqueeze", ["x", "uq5"], ["x5"], name="in_unsqueeze"),
        helper.make_node("Squeeze", ["x5", "uq5"], ["x4"], name="in_squeeze"),
        helper.make_node("Conv", ["x4", "w1", "b1"], ["c1"], name="conv1", kernel_shape=[3, 3]),
        helper.make_node("Pad", ["c1", "pads"], ["p1"], name="pad_signed", mode="constant"),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], name="conv2", kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Pad", ["r1", "pads"], ["p2"], name="pad_unsigned", mode="constant"),
        helper.make_node("Conv", ["p2", "w3", "b3"], ["c3"], name="conv3", kernel_shape=[3, 3]),
        helper.make_node("Concat", ["c2", "c3", "c1"], ["cat"], name="concat", axis=1),
        helper.make_node("Slice", ["cat", "st", "en", "ax"], ["s"], name="slice"),
        helper.make_node("Relu", ["s"], ["sr"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["sr"], ["ga"], name="gap"),
        helper.make_node("ReduceMax", ["sr"], ["gm"], name="max", axes=[2, 3], keepdims=1),
        helper.make_node("Concat", ["ga", "gm"], ["g"], name="pools", axis=1),
        helper.make_node("Squeeze", ["g", "sq"], ["gs"], name="squeeze"),
        helper.make_node("Unsqueeze", ["gs", "uq"], ["gu"], name="unsqueeze"),
        helper.make_node("Flatten", ["gu"], ["f"], name="flatten", axis=1),
        helper.make_node("Gemm", ["f", "w4", "b4"], ["y"], name="fc", transB=1),
    ]
    inits = [
        _w(rng, "w1", (4, 3, 3, 3)), _w(rng, "b1", (4,)), _w(rng, "w2", (4, 4, 3, 3)), _w(rng, "b2", (4,)),
        _w(rng, "w3", (4, 4, 3, 3)), _w(rng, "b3", (4,)), _w(rng, "w4", (5, 24)), _w(rng, "b4", (5,)),
        _i64("pads", pads), _i64("st", [-5, 1]), _i64("en", [_INT64_MAX, 5]), _i64("ax", [2, -1]),
        _i64("sq", [2, 3]), _i64("uq", [1]), _i64("uq5", [4]),
    ]  # fmt: skip
    return _model(nodes, inits, [1, 5])


def _calib(n: int = 40) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((n, 3, 8, 8)).astype(np.float32)


def _qdq(model: onnx.ModelProto, tmp_path: Path) -> Path:
    onnx.save(model, str(tmp_path / "m.onnx"))
    cfg = QuantConfig(activation_type="int8", weight_type="int8", target="deeploy")
    return Path(quantize(tmp_path / "m.onnx", {"x": _calib()}, cfg, tmp_path / "m.qdq.onnx", check=False).model_path)


def test_the_movement_ops_build_and_run_bit_exact_on_the_host(
    deeploy: Path,  # noqa: F811
    gcc: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    onnx.save(movement_net(), str(tmp_path / "ops.onnx"))
    np.savez(tmp_path / "calib.npz", x=_calib())
    out = tmp_path / "out"
    build(tmp_path / "ops.onnx", out, BuildOptions(device="deeploy", precision="int8"), data=tmp_path / "calib.npz")
    d = json.loads((out / "manifest.json").read_text())["deeploy"]
    assert d["export"]["equal_fraction"] == 1.0 and d["export"]["max_lsb_diff"] == 0, d["export"]
    generic = d["codegen"]["Generic"]
    assert generic["ok"] and generic["integer_only"] is True, generic
    ops = [n.op_type for n in onnx.load(str(out / generic["network"])).graph.node]
    assert ops.count("Pad") == 2 and ops.count("Slice") == 1 and ops.count("Concat") == 3, ops  # two inputs each
    assert ops.count("MaxPool") == 1 and "ReduceMax" not in ops, ops  # ReduceMax as a MaxPool
    assert "Squeeze" not in ops and "Unsqueeze" not in ops, ops  # as Reshapes, Deeploy's own form
    assert ops[:2] == ["RequantShift", "Reshape"], ops  # the input is copied before a Reshape aliases it
    run = d["run"]["Generic"]
    assert run["ran"] and run["bit_exact"] and run["num_samples"] == 32, run
    assert run["equal_fraction_vs_integer_onnx"] == 1.0 and run["max_diff_vs_integer_onnx"] == 0, run
    assert run["equal_fraction_vs_qdq"] == 1.0, run


def keras_bn_net() -> onnx.ModelProto:
    """x → Cast(float) → Conv → Relu → MaxPool → BatchNorm → padded Conv → Relu → GlobalMaxPool → Flatten → Gemm →
    Mul(vector) → Add(vector): a Cast to the input's own type (a streaming model's cache input), Keras' order, a
    BatchNorm with no Conv before it (and a negative γ), then a decomposed one."""
    rng = np.random.default_rng(3)
    gamma = np.array([1.5, -0.7, 0.2, 1.1], np.float32)
    bn = [numpy_helper.from_array(v, n) for n, v in (("gamma", gamma), ("beta", np.array([0.1, -0.3, 0.5, 0.0],
          np.float32)), ("mean", np.array([0.4, 0.2, 0.9, 0.1], np.float32)), ("var", np.array([0.5, 1.5, 0.3, 2.0],
          np.float32)))]  # fmt: skip
    nodes = [
        helper.make_node("Cast", ["x"], ["xc"], name="same_type", to=TensorProto.FLOAT),
        helper.make_node("Conv", ["xc", "w1", "b1"], ["c1"], name="conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("BatchNormalization", ["p1", "gamma", "beta", "mean", "var"], ["n1"], name="bn"),
        helper.make_node("Conv", ["n1", "w2", "b2"], ["c2"], name="conv2", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalMaxPool", ["r2"], ["g"], name="gmp"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten", axis=1),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["h"], name="fc", transB=1),
        helper.make_node("Mul", ["h", "scale"], ["hs"], name="bn_mul"),
        helper.make_node("Add", ["hs", "shift"], ["y"], name="bn_add"),
    ]
    inits = [
        _w(rng, "w1", (4, 3, 3, 3)), _w(rng, "b1", (4,)), *bn, _w(rng, "w2", (6, 4, 3, 3)), _w(rng, "b2", (6,)),
        _w(rng, "w3", (5, 6)), _w(rng, "b3", (5,)),
        numpy_helper.from_array(np.array([[0.5, -1.2, 2.0, 0.8, 1.0]], np.float32), "scale"),
        numpy_helper.from_array(np.array([[0.1, 0.2, -0.4, 0.0, 0.3]], np.float32), "shift"),
    ]  # fmt: skip
    return _model(nodes, inits, [1, 5])


def test_a_free_standing_batchnorm_and_a_vector_scale_build_bit_exact(
    deeploy: Path,  # noqa: F811
    gcc: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """BatchNorm after a MaxPool (nothing to fold into: one per-channel RequantShift) feeding a padded Conv (its
    output quantized symmetric by the target's constraint), and a Mul by a vector: the integer network equals the
    CPU QDQ model and the generated Generic code equals the integer network."""
    onnx.save(keras_bn_net(), str(tmp_path / "bn.onnx"))
    np.savez(tmp_path / "calib.npz", x=_calib())
    out = tmp_path / "out"
    build(tmp_path / "bn.onnx", out, BuildOptions(device="deeploy", precision="int8"), data=tmp_path / "calib.npz")
    d = json.loads((out / "manifest.json").read_text())["deeploy"]
    assert d["export"]["equal_fraction"] >= 0.999 and d["export"]["max_lsb_diff"] <= 1, d["export"]
    ops = [n.op_type for n in onnx.load(str(out / d["codegen"]["Generic"]["network"])).graph.node]
    assert "BatchNormalization" not in ops and "Mul" not in ops and "Cast" not in ops, ops
    run = d["run"]["Generic"]
    assert run["ran"] and run["bit_exact"] and run["equal_fraction_vs_integer_onnx"] == 1.0, run


def _one_op(op: str, tmp_path: Path, extra: tuple[onnx.TensorProto, ...] = (), **attrs: object) -> Path:
    """x → Conv → ``op`` (its other inputs ``extra``) → Conv → GAP → Flatten (y): ``op`` between two quantized
    tensors."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", kernel_shape=[1, 1]),
        helper.make_node(op, ["c1", *(e.name for e in extra)], ["o"], name="the_op", **attrs),
        helper.make_node("Conv", ["o", "w2"], ["c2"], name="conv2", kernel_shape=[1, 1]),
        helper.make_node("GlobalAveragePool", ["c2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["y"], name="flatten", axis=1),
    ]
    inits = [_w(rng, "w1", (4, 3, 1, 1)), _w(rng, "w2", (4, 4, 1, 1)), *extra]
    return _qdq(_model(nodes, inits, [1, 4]), tmp_path)


def test_an_op_deeploy_does_not_map_is_refused_naming_the_node(tmp_path: Path) -> None:
    for op in ("Sigmoid", "LeakyRelu", "HardSigmoid", "Tanh", "PRelu", "Cast", "Expand", "ReduceMin"):
        assert op not in DEEPLOY_GENERIC_OPS, op
    qdq = _one_op("Sigmoid", tmp_path)
    why = "Sigmoid node 'the_op' cannot be exported to Deeploy: Deeploy 0.2.1 has no Generic mapping for Sigmoid"
    with pytest.raises(TargetError, match=re.escape(why)):
        export(qdq, tmp_path / "ex", verbose=False, num_samples=2)
    assert not (tmp_path / "ex").exists()


def test_an_op_deeploy_maps_but_the_export_lacks_says_so(tmp_path: Path) -> None:
    assert "ReduceSum" in DEEPLOY_GENERIC_OPS and "ReduceSum" not in SUPPORTED_OPS
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", kernel_shape=[1, 1]),
        helper.make_node("ReduceSum", ["c1", "axes"], ["y"], name="the_sum", keepdims=0),
    ]
    model = _model(nodes, [_w(rng, "w1", (4, 3, 1, 1)), _i64("axes", [2, 3])], [1, 4])
    why = (
        "ReduceSum node 'the_sum' cannot be exported to Deeploy: Deeploy 0.2.1 maps ReduceSum on Generic, but "
        "qdebug's export has no integer form for it yet"
    )
    with pytest.raises(TargetError, match=re.escape(why)):
        export(_qdq(model, tmp_path), tmp_path / "ex", verbose=False, num_samples=2)


def test_what_deeploys_pad_and_maxpool_templates_cannot_do_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    lopsided = _one_op("Pad", tmp_path / "a", (_i64("pads", [0, 0, 1, 0, 0, 0, 0, 0]),), mode="constant")
    with pytest.raises(TargetError, match="Pad node 'the_op': Deeploy's Pad template pads each axis equally"):
        export(lopsided, tmp_path / "a" / "ex", verbose=False, num_samples=2)
    pooled = _one_op("MaxPool", tmp_path / "b", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    with pytest.raises(TargetError, match="MaxPool node 'the_op': Deeploy pads a MaxPool's input with the stored 0"):
        export(pooled, tmp_path / "b" / "ex", verbose=False, num_samples=2)
