"""Quantizing for Deeploy by Deeploy's rules (docs/deeploy.md, "Quantizing for Deeploy"): the target states its
constraints (:data:`qdebug.targets.deeploy.DEEPLOY_CONSTRAINTS`) and the quantizer meets them beforehand, so an
ImageNet-normalised CNN with a padded stem Conv builds and its generated Generic code runs bit-exact. The build
test needs the Deeploy environment and gcc (it fails, not skips, under ``CI=true``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from test_deeploy_env import deeploy, deeploy_env  # noqa: F401  (fixtures)
from test_deeploy_host import gcc  # noqa: F401  (fixture)

from qdebug.build import BuildOptions, build
from qdebug.config import QuantConfig
from qdebug.quantizer import quantize
from qdebug.targets.base import get_target
from qdebug.targets.deeploy import DEEPLOY_CONSTRAINTS, compile_deeploy
from qdebug.targets.quant_constraints import QuantConstraints, constrained_overrides, constrained_tensors


def _w(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)


def padded_stem_cnn(stem_input: str = "x") -> onnx.ModelProto:
    """x → padded Conv → Relu → MaxPool → padded Conv → Relu → GAP → Flatten → Gemm (a tiny ImageNet-style CNN).

    ``stem_input="add"``: the stem Conv reads ``x + x`` through a MaxPool instead (a computed, signed tensor whose
    grid MaxPool shares)."""
    rng = np.random.default_rng(0)
    pre = []
    if stem_input == "add":
        pool = helper.make_node("MaxPool", ["s"], ["sp"], kernel_shape=[1, 1])
        pre = [helper.make_node("Add", ["x", "x"], ["s"]), pool]
    nodes = [
        *pre,
        helper.make_node("Conv", ["sp" if pre else "x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], transB=1),
    ]
    inits = [_w(rng, "w1", (4, 3, 3, 3)), _w(rng, "b1", (4,)), _w(rng, "w2", (8, 4, 3, 3)), _w(rng, "b2", (8,)),
             _w(rng, "w3", (5, 8)), _w(rng, "b3", (5,))]  # fmt: skip
    graph = helper.make_graph(
        nodes, "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _normalised(n: int = 48) -> np.ndarray:
    """ImageNet-style normalised images: signed, a mean away from 0 (ORT's asymmetric grid: zero point ≠ 0)."""
    rng = np.random.default_rng(1)
    return ((rng.random((n, 3, 8, 8)) - 0.485) / 0.229).astype(np.float32)


def _zero_points(qdq: Path) -> dict[str, int]:
    m = onnx.load(str(qdq))
    c = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    return {n.input[0]: int(c[n.input[2]].reshape(-1)[0]) for n in m.graph.node if n.op_type == "QuantizeLinear"}


def test_the_deeploy_target_states_its_constraints() -> None:
    c = get_target("deeploy").quant_constraints()
    assert c is DEEPLOY_CONSTRAINTS and c.weight_symmetric and not c.power_of_two_scales
    assert [(r.op_type, r.when.value, r.zero_point.value) for r in c.rules] == [("Conv", "padded", "zero")]
    assert QuantConstraints.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    assert get_target("cpu").quant_constraints() is None  # the default: nothing beyond the config


def test_which_tensors_a_padded_conv_puts_on_a_symmetric_grid() -> None:
    stem = padded_stem_cnn()
    # The graph input feeds the padded stem; the second Conv reads Relu → MaxPool (non-negative: stored unsigned).
    assert [(t.tensor, t.op_type) for t in constrained_tensors(stem, DEEPLOY_CONSTRAINTS)] == [("x", "Conv")]
    assert constrained_tensors(stem, DEEPLOY_CONSTRAINTS, frozenset({"x"})) == ()  # non-negative data
    # A computed signed tensor through a MaxPool: both the MaxPool's output and its input (they share one grid).
    names = [t.tensor for t in constrained_tensors(padded_stem_cnn("add"), DEEPLOY_CONSTRAINTS)]
    assert names == ["sp", "s"]
    for node in stem.graph.node:  # no padding, no rule
        for a in node.attribute:
            if a.name == "pads":
                del a.ints[:]
                a.ints.extend([0, 0, 0, 0])
    assert constrained_tensors(stem, DEEPLOY_CONSTRAINTS) == ()
    for node in stem.graph.node:  # no pads attribute at all (ONNX's default: none)
        for i in [i for i, a in enumerate(node.attribute) if a.name == "pads"][::-1]:
            del node.attribute[i]
    assert constrained_tensors(stem, DEEPLOY_CONSTRAINTS) == ()


def test_overrides_keep_what_the_user_fixed() -> None:
    stem = padded_stem_cnn()
    assert constrained_overrides(DEEPLOY_CONSTRAINTS, stem, None, None) == {"x": [{"symmetric": True}]}
    mine = {"x": [{"symmetric": False}], "r1": [{"rmax": 4.0}]}
    assert constrained_overrides(DEEPLOY_CONSTRAINTS, stem, None, mine) == mine  # the user's own grid wins
    assert constrained_overrides(DEEPLOY_CONSTRAINTS, stem, None, {"x": [{"axis": 1}]}) == {
        "x": [{"axis": 1, "symmetric": True}]
    }
    assert constrained_overrides(None, stem, None, None) is None


def test_quantize_for_deeploy_gives_the_padded_stem_a_zero_point_of_zero(tmp_path: Path) -> None:
    model = tmp_path / "stem.onnx"
    onnx.save(padded_stem_cnn(), str(model))
    cfg = QuantConfig(activation_type="int8", weight_type="int8", target="deeploy")
    res = quantize(model, {"x": _normalised()}, cfg, tmp_path / "s.onnx")
    signed = _zero_points(Path(res.model_path))
    assert signed["x"] == 0 and signed["r1"] == -128, signed  # symmetric input; the ReLU keeps its unsigned grid
    assert "target 'deeploy': 1 tensor(s) quantized symmetric to meet its kernels' constraints" in " ".join(
        res.warnings
    ), res.warnings
    cpu = QuantConfig(activation_type="int8", weight_type="int8", target="cpu")
    assert _zero_points(Path(quantize(model, {"x": _normalised()}, cpu, tmp_path / "c.onnx").model_path))["x"] != 0
    # Non-negative data (images in [0, 1]) keeps ORT's zero point −128: stored unsigned, no bit lost.
    images = np.random.default_rng(2).random((32, 3, 8, 8)).astype(np.float32)
    assert _zero_points(Path(quantize(model, {"x": images}, cfg, tmp_path / "u.onnx").model_path))["x"] == -128


def test_a_normalised_cnn_with_a_padded_stem_builds_and_runs_bit_exact(
    deeploy: Path,  # noqa: F811
    gcc: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The issue's case: before, the build's own quantization gave the input an asymmetric grid and the export
    refused the padded stem Conv; now it builds, and the Generic code on the host equals the integer network."""
    onnx.save(padded_stem_cnn(), str(tmp_path / "stem.onnx"))
    np.savez(tmp_path / "calib.npz", x=_normalised())
    out = tmp_path / "out"
    build(tmp_path / "stem.onnx", out, BuildOptions(device="deeploy", precision="int8"), data=tmp_path / "calib.npz")
    d = json.loads((out / "manifest.json").read_text())["deeploy"]
    assert d["codegen"]["Generic"]["ok"] and d["codegen"]["Generic"]["integer_only"] is True
    run = d["run"]["Generic"]
    assert run["ran"] and run["bit_exact"] and run["num_samples"] == 32, run
    assert run["equal_fraction_vs_integer_onnx"] == 1.0 and run["max_diff_vs_integer_onnx"] == 0, run
    assert d["export"]["max_lsb_diff"] <= 1, d["export"]
    assert _zero_points(out / "stem.qdq.onnx")["x"] == 0


def test_a_qdq_model_quantized_elsewhere_pads_its_asymmetric_stem_explicitly(
    deeploy: Path,  # noqa: F811
    gcc: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A QDQ model not quantized by the target's rules (here ORT's asymmetric input grid, as another tool or
    recompile would hand it over): the export writes the stem Conv's padding as a Pad whose value is the input's
    zero point, and the generated Generic code equals the integer network."""
    onnx.save(padded_stem_cnn(), str(tmp_path / "stem.onnx"))
    cpu = QuantConfig(activation_type="int8", weight_type="int8", target="cpu")
    qdq = Path(quantize(tmp_path / "stem.onnx", {"x": _normalised()}, cpu, tmp_path / "c.onnx", check=False).model_path)
    zp = _zero_points(qdq)["x"]
    assert zp != 0
    samples = [{"x": s[None]} for s in _normalised(16)]
    built = compile_deeploy(qdq, tmp_path / "deeploy", samples, platforms=("Generic",))
    net = onnx.load(str(tmp_path / "deeploy" / "network.onnx"))
    pads = [n for n in net.graph.node if n.op_type == "Pad"]
    assert len(pads) == 1 and pads[0].input[0] == "x", [n.op_type for n in net.graph.node]
    assert helper.get_attribute_value(next(a for a in pads[0].attribute if a.name == "value")) == zp
    assert built.info["export"]["max_lsb_diff"] <= 1, built.info["export"]
    run = built.info["run"]["Generic"]
    assert run["ran"] and run["equal_fraction_vs_integer_onnx"] == 1.0 and run["max_diff_vs_integer_onnx"] == 0, run
