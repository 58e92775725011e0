"""The QNN compatibility fixes (qdebug.targets.model_fixes): each on a purpose-built model, first as a graph rewrite
(numbers unchanged, input model untouched), then before/after on the real QNN compiler (onnxruntime-qnn, no mocks).

Tests that need onnxruntime-qnn fail under CI=true when it is missing and are skipped (with the reason) elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdebug.config import QuantConfig, TensorOverride
from qdebug.errors import ConfigError, DataError, ModelError
from qdebug.model_io import input_specs
from qdebug.passes import run_passes
from qdebug.targets.compile_report import CompileReport
from qdebug.targets.model_fixes import (
    FIX_NAMES,
    MODEL_FIXES,
    apply_qnn_fixes,
    dynamic_tensors,
    fix_passes,
    fix_static_shapes,
    fold_batchnorm,
    fuse_gelu,
    layernorm_gamma_unsigned,
)

OPSET = 17


# ------------------------------------------------------------------------------------------------ models
def _model(nodes: list[onnx.NodeProto], inputs: list, outputs: list, inits: list) -> onnx.ModelProto:
    m = helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs, inits), opset_imports=[helper.make_opsetid("", OPSET)]
    )
    m.ir_version = 9
    return m


def _w(rng: np.random.Generator, name: str, shape: tuple[int, ...], scale: float = 0.3) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def dynamic_convnet(seed: int = 0) -> onnx.ModelProto:
    """Conv → Relu → Conv(stride 2) → Relu → Conv 1x1 with input dims ``batch``, ``height``, ``width`` symbolic."""
    rng = np.random.default_rng(seed)
    inits = [
        _w(rng, "w1", (8, 3, 3, 3)),
        _w(rng, "b1", (8,), 0.1),
        _w(rng, "w2", (8, 8, 3, 3)),
        _w(rng, "b2", (8,), 0.1),
        _w(rng, "w3", (4, 8, 1, 1)),
        _w(rng, "b3", (4,), 0.1),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["y"], name="conv3"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "height", "width"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, "oh", "ow"])
    return _model(nodes, [x], [y], inits)


def conv_bn_net(seed: int = 0) -> onnx.ModelProto:
    """Conv → BatchNormalization → Relu → Conv (no bias) → BatchNormalization → GlobalAveragePool, static shapes."""
    rng = np.random.default_rng(seed)

    def bn(prefix: str, c: int) -> list[onnx.TensorProto]:
        return [
            numpy_helper.from_array((1 + 0.5 * rng.standard_normal(c)).astype(np.float32), f"{prefix}_gamma"),
            numpy_helper.from_array((0.3 * rng.standard_normal(c)).astype(np.float32), f"{prefix}_beta"),
            numpy_helper.from_array((0.2 * rng.standard_normal(c)).astype(np.float32), f"{prefix}_mean"),
            numpy_helper.from_array((0.5 + rng.random(c)).astype(np.float32), f"{prefix}_var"),
        ]

    inits = [_w(rng, "w1", (8, 3, 3, 3)), _w(rng, "b1", (8,), 0.1), *bn("bn1", 8), _w(rng, "w2", (8, 8, 3, 3))]
    inits += bn("bn2", 8)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node(
            "BatchNormalization", ["c1", "bn1_gamma", "bn1_beta", "bn1_mean", "bn1_var"], ["n1"], name="bn1"
        ),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node(
            "BatchNormalization", ["c2", "bn2_gamma", "bn2_beta", "bn2_mean", "bn2_var"], ["n2"], name="bn2"
        ),
        helper.make_node("GlobalAveragePool", ["n2"], ["y"], name="gap"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 1, 1])
    return _model(nodes, [x], [y], inits)


def ln_gelu_block(seed: int = 0, *, layernorm: bool = True) -> onnx.ModelProto:
    """[1,8,16] → LayerNormalization → MatMul+Add → exact-erf GELU (Div→Erf→Add→Mul→Mul, PyTorch's export) →
    MatMul+Add → [1,8,16]: the two HTP traps of a transformer MLP in a dozen nodes."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array((1 + 0.1 * rng.standard_normal(16)).astype(np.float32), "ln.weight"),
        numpy_helper.from_array((0.1 * rng.standard_normal(16)).astype(np.float32), "ln.bias"),
        _w(rng, "fc1.weight", (16, 32), 0.25),
        _w(rng, "fc1.bias", (32,), 0.1),
        _w(rng, "fc2.weight", (32, 16), 0.2),
        _w(rng, "fc2.bias", (16,), 0.1),
        numpy_helper.from_array(np.array(1.4142135, np.float32), "sqrt2"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    ]
    nodes = []
    src = "x"
    if layernorm:
        nodes.append(helper.make_node("LayerNormalization", ["x", "ln.weight", "ln.bias"], ["ln"], name="ln", axis=-1))
        src = "ln"
    nodes += [
        helper.make_node("MatMul", [src, "fc1.weight"], ["mm1"], name="fc1/MatMul"),
        helper.make_node("Add", ["mm1", "fc1.bias"], ["h"], name="fc1/Add"),
        helper.make_node("Div", ["h", "sqrt2"], ["d"], name="gelu/Div"),
        helper.make_node("Erf", ["d"], ["e"], name="gelu/Erf"),
        helper.make_node("Add", ["e", "one"], ["e1"], name="gelu/Add"),
        helper.make_node("Mul", ["h", "e1"], ["m"], name="gelu/Mul"),
        helper.make_node("Mul", ["m", "half"], ["g"], name="gelu/Mul_1"),
        helper.make_node("MatMul", ["g", "fc2.weight"], ["mm2"], name="fc2/MatMul"),
        helper.make_node("Add", ["mm2", "fc2.bias"], ["y"], name="fc2/Add"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])
    return _model(nodes, [x], [y], inits)


def erf_only() -> onnx.ModelProto:
    """Two Erf nodes and nothing else: no op QNN can take."""
    nodes = [helper.make_node("Erf", ["x"], ["e"], name="erf"), helper.make_node("Erf", ["e"], ["y"], name="erf2")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    return _model(nodes, [x], [y], [])


def samples(model: onnx.ModelProto, n: int = 4, seed: int = 0, shapes: dict[str, list[int]] | None = None) -> dict:
    """``n`` seeded normal samples per input, as arrays of shape (n, *input shape)."""
    rng = np.random.default_rng(seed)
    out = {}
    for s in input_specs(model):
        shape = (shapes or {}).get(s.name) or [d if isinstance(d, int) else 1 for d in s.shape]
        out[s.name] = rng.standard_normal((n, *shape)).astype(np.float32)
    return out


def run_cpu(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The model's outputs on ORT CPU for one sample."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return list(sess.run(None, feed))


# ------------------------------------------------------------------------------------------------ QNN helpers
def require_qnn() -> None:
    """Fail under CI=true, skip (with the reason) elsewhere, when onnxruntime-qnn cannot be used."""
    from qdebug.targets.qnn_options import qnn_available

    ok, why = qnn_available()
    if ok:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"onnxruntime-qnn is required under CI=true: {why}")
    pytest.skip(f"onnxruntime-qnn is not usable here: {why}")


@pytest.fixture
def qnn() -> None:
    """Marks a test as needing the real QNN compiler / HTP simulator."""
    require_qnn()


def quantize_and_compile(
    model: onnx.ModelProto, tmp: Path, name: str, config: QuantConfig, data: dict | None = None
) -> CompileReport:
    """quantize (qdebug) → compile_qnn, the report."""
    from qdebug.quantizer import quantize
    from qdebug.targets.qnn_compile import compile_qnn

    fpath = tmp / f"{name}.onnx"
    onnx.save(model, str(fpath))
    q = quantize(fpath, data, config, tmp / f"{name}.qdq.onnx")
    return compile_qnn(q.model_path, tmp, name=name)


# ------------------------------------------------------------------------------------------------ static shapes
def test_static_shapes_fixes_inputs_and_infers_every_tensor() -> None:
    model = dynamic_convnet()
    before = model.SerializeToString()
    fixed, rep = fix_static_shapes(model, {"x": [1, 3, 16, 16]})
    assert model.SerializeToString() == before  # the caller's model is untouched
    assert rep.name == "static_shapes" and rep.changed
    assert "['batch', 3, 'height', 'width'] -> [1, 3, 16, 16]" in rep.detail
    assert input_specs(fixed)[0].shape == (1, 3, 16, 16)
    assert dynamic_tensors(fixed) == []
    assert [d.dim_value for d in fixed.graph.output[0].type.tensor_type.shape.dim] == [1, 4, 8, 8]
    feed = {"x": samples(model, 1, shapes={"x": [1, 3, 16, 16]})["x"][0]}
    np.testing.assert_array_equal(run_cpu(model, feed)[0], run_cpu(fixed, feed)[0])


def test_static_shapes_on_a_static_model_changes_nothing() -> None:
    model = conv_bn_net()
    _, rep = fix_static_shapes(model)
    assert not rep.changed
    assert "all inputs already static" in rep.detail


@pytest.mark.parametrize(
    ("shapes", "needle"),
    [
        (None, "no shape was given"),
        ({"x": [1, 4, 16, 16]}, "does not fit"),
        ({"x": [1, 3, 16]}, "does not fit"),
        ({"x": [1, 3, 0, 16]}, "non-positive"),
        ({"x": [1, 3, 16, 16], "nope": [1]}, "unknown input"),
    ],
)
def test_static_shapes_bad_shapes_are_data_errors(shapes: dict | None, needle: str) -> None:
    with pytest.raises(DataError, match=needle):
        fix_static_shapes(dynamic_convnet(), shapes)


def test_dynamic_model_before_and_after_the_static_shape_fix(qnn: None, tmp_path: Path) -> None:
    from qdebug.quantizer import quantize
    from qdebug.targets.qnn_compile import compile_qnn

    model = dynamic_convnet()
    data = samples(model, 4, shapes={"x": [1, 3, 16, 16]})
    # Before: quantizing works (ORT calibrates on the data's shapes) but QNN cannot take a symbolic shape:
    # with it ORT's QNN provider takes nothing ("Cannot get shape") — compile_qnn says so up front.
    onnx.save(model, str(tmp_path / "dyn.onnx"))
    q = quantize(tmp_path / "dyn.onnx", data, QuantConfig(target="qnn"), tmp_path / "dyn.qdq.onnx")
    with pytest.raises(ModelError, match="dynamic dimensions"):
        compile_qnn(q.model_path, tmp_path, name="dyn")
    # After: dims fixed and shapes inferred *before* quantizing → one HTP partition.
    fixed, _ = fix_static_shapes(model, {"x": [1, 3, 16, 16]})
    rep = quantize_and_compile(fixed, tmp_path, "fixed", QuantConfig(target="qnn"), data)
    assert rep.ok and rep.single_partition, rep
    assert rep.accelerator_nodes > 0 and rep.graph_io_qdq_on_cpu == 2


# ------------------------------------------------------------------------------------------------ BatchNorm folding
def test_fold_batchnorm_keeps_the_numbers_and_the_output_names() -> None:
    model = conv_bn_net()
    before = model.SerializeToString()
    fixed, rep = fold_batchnorm(model)
    assert model.SerializeToString() == before
    assert rep.changed and rep.detail.startswith("2 BatchNormalization")
    assert [n.op_type for n in fixed.graph.node] == ["Conv", "Relu", "Conv", "GlobalAveragePool"]
    assert [n.output[0] for n in fixed.graph.node][:1] == ["n1"]  # the Conv now produces the BN's tensor
    names = {t.name for t in fixed.graph.initializer}
    assert not any(n.startswith("bn") for n in names)  # BN parameters are gone
    onnx.checker.check_model(fixed, full_check=True)
    feed = {"x": samples(model, 1)["x"][0]}
    np.testing.assert_allclose(run_cpu(model, feed)[0], run_cpu(fixed, feed)[0], rtol=1e-5, atol=1e-5)


def test_fold_batchnorm_leaves_a_bn_it_cannot_fold() -> None:
    model = conv_bn_net()
    # conv1's output also becomes a graph output: folding would change that output, so bn1 stays.
    model.graph.output.append(helper.make_tensor_value_info("c1", TensorProto.FLOAT, [1, 8, 8, 8]))
    fixed, rep = fold_batchnorm(model)
    assert rep.changed and "1 left" in rep.detail and "bn1" in rep.detail
    assert [n.op_type for n in fixed.graph.node].count("BatchNormalization") == 1
    _, none = fold_batchnorm(ln_gelu_block())
    assert not none.changed and none.detail == "no BatchNormalization node"


# ------------------------------------------------------------------------------------------------ GELU fusion
def test_fuse_gelu_same_numbers_fewer_nodes() -> None:
    model = ln_gelu_block()
    before = model.SerializeToString()
    fused, rep = fuse_gelu(model)
    assert model.SerializeToString() == before
    assert rep.changed and "1 Erf GELU(s) fused" in rep.detail
    ops = [(n.domain, n.op_type) for n in fused.graph.node]
    assert ("com.microsoft", "Gelu") in ops and ("", "Erf") not in ops and ("", "Div") not in ops
    assert any(o.domain == "com.microsoft" for o in fused.opset_import)
    assert "sqrt2" not in {t.name for t in fused.graph.initializer}  # the pattern's constants went with it
    feed = {"x": samples(model, 1)["x"][0]}
    np.testing.assert_allclose(run_cpu(model, feed)[0], run_cpu(fused, feed)[0], rtol=1e-5, atol=1e-6)


def test_fuse_gelu_leaves_an_erf_that_is_not_a_gelu() -> None:
    model = erf_only()
    same, rep = fuse_gelu(model)
    assert not rep.changed and "none part of a GELU" in rep.detail
    assert same is model
    _, nothing = fuse_gelu(dynamic_convnet())
    assert nothing.detail == "no Erf node"


def test_gelu_before_and_after_fusion_on_qnn(qnn: None, tmp_path: Path) -> None:
    model = ln_gelu_block(layernorm=False)
    data = samples(model, 4)
    cfg = QuantConfig(target="qnn")
    before = quantize_and_compile(model, tmp_path, "erf", cfg, data)
    assert before.ok and not before.single_partition
    assert before.fallback_by_op().get("Erf", 0) > 0
    assert any("Erf" in f.reason for f in before.fallback if not f.by_design)
    fused, _ = fuse_gelu(model)
    after = quantize_and_compile(fused, tmp_path, "gelu", cfg, data)
    assert after.ok and after.single_partition, after


# ------------------------------------------------------------------------------------------------ LayerNorm gamma
def test_layernorm_gamma_override_for_signed_weights() -> None:
    model = ln_gelu_block()
    cfg = QuantConfig(target="qnn", weight_type="int8", weight_symmetric=True)
    new, rep = layernorm_gamma_unsigned(model, cfg)
    assert rep.changed and "'ln.weight'" in rep.detail
    assert new.overrides_dict["ln.weight"] == (TensorOverride(quant_type="uint8", symmetric=False),)
    assert new.replace(tensor_overrides=()) == cfg  # nothing else changed
    assert new.ort_overrides()["ln.weight"][0]["quant_type"].name == "QUInt8"


def test_layernorm_gamma_respects_the_config() -> None:
    model = ln_gelu_block()
    unsigned = QuantConfig(target="qnn", weight_type="uint8")
    same, rep = layernorm_gamma_unsigned(model, unsigned)
    assert same is unsigned and not rep.changed and "unsigned" in rep.detail
    # A type the user set is kept (and the report warns that the HTP will not take a signed gamma) ...
    mine = QuantConfig(target="qnn", weight_type="int8", tensor_overrides={"ln.weight": [{"quant_type": "int8"}]})
    kept, rep = layernorm_gamma_unsigned(model, mine)
    assert kept.overrides_dict == mine.overrides_dict and not rep.changed
    assert "kept" in rep.detail and "signed gamma" in rep.detail
    # ... an entry without a type gets the type added, its values kept.
    ranged = QuantConfig(target="qnn", weight_type="int8", tensor_overrides={"ln.weight": [{"rmin": -1.0}]})
    typed, rep = layernorm_gamma_unsigned(model, ranged)
    assert typed.overrides_dict["ln.weight"] == (TensorOverride(quant_type="uint8", rmin=-1.0),) and rep.changed
    _, none = layernorm_gamma_unsigned(ln_gelu_block(layernorm=False), QuantConfig(weight_type="int8"))
    assert not none.changed and "no LayerNormalization" in none.detail


def test_layernorm_before_and_after_the_gamma_fix_on_qnn(qnn: None, tmp_path: Path) -> None:
    model, _ = fuse_gelu(ln_gelu_block())  # Erf out of the way: only the LayerNorm trap is left
    data = samples(model, 4)
    cfg = QuantConfig(target="qnn", weight_type="int8", weight_symmetric=True)
    before = quantize_and_compile(model, tmp_path, "s8", cfg, data)
    assert before.ok and not before.single_partition
    assert before.fallback_by_op().get("LayerNormalization", 0) > 0
    fixed_cfg, _ = layernorm_gamma_unsigned(model, cfg)
    after = quantize_and_compile(model, tmp_path, "s8_gamma_u8", fixed_cfg, data)
    assert after.ok and after.single_partition, after


# ------------------------------------------------------------------------------------------------ all of them
def test_apply_qnn_fixes_runs_every_rule_in_order() -> None:
    model = ln_gelu_block()
    before = model.SerializeToString()
    cfg = QuantConfig(target="qnn", weight_type="int8")
    fixed = apply_qnn_fixes(model, cfg)
    assert model.SerializeToString() == before
    assert [r.name for r in fixed.reports] == list(FIX_NAMES)
    assert fixed.changed == ("gelu_fusion", "layernorm_gamma_unsigned")
    assert fixed.config is not None and "ln.weight" in fixed.config.overrides_dict
    skipped = apply_qnn_fixes(model, cfg, skip=("gelu_fusion",))
    assert skipped.changed == ("layernorm_gamma_unsigned",)
    assert next(r for r in skipped.reports if r.name == "gelu_fusion").detail == "skipped on request"
    fp16 = apply_qnn_fixes(model, None)
    assert fp16.config is None and "fp16" in fp16.reports[-1].detail
    with pytest.raises(ConfigError, match="unknown fix"):
        apply_qnn_fixes(model, cfg, skip=("gelu",))


def test_model_fixes_run_through_the_one_pass_runner() -> None:
    model = conv_bn_net()
    fixed = apply_qnn_fixes(model, None)
    bn = next(r for r in fixed.reports if r.name == "batchnorm_folding")
    assert (bn.nodes_before, bn.nodes_after) == (len(model.graph.node), len(model.graph.node) - 2)
    assert all(r.seconds is not None for r in fixed.reports if r.name in MODEL_FIXES)
    # The same passes, for a target that runs only some of them (Deeploy: static shapes and BN folding).
    said: list[str] = []
    out, reports = run_passes(
        model, fix_passes(("static_shapes", "batchnorm_folding"), skip=("static_shapes",)), progress=said.append
    )
    assert [r.name for r in reports] == ["static_shapes", "batchnorm_folding"]
    assert reports[0].skipped and reports[0].detail == "skipped on request" and reports[1].changed
    assert said == ["[1/2] static_shapes: skipped", f"[2/2] {reports[1].summary}"]
    assert len(out.graph.node) == len(model.graph.node) - 2
    with pytest.raises(ConfigError, match="unknown model fix"):
        fix_passes(("layernorm_gamma_unsigned",))


def range_model() -> onnx.ModelProto:
    """``y = x + Range(0, N)[:, None]`` with ``x: [N, 4]`` dynamic — the shape arithmetic detectors carry."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Range", ["start", "n", "one"], ["r"]),
        helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["rf", "ax1"], ["ru"]),
        helper.make_node("Add", ["x", "ru"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("zero", 0), ("start", 0), ("one", 1))] + [
        numpy_helper.from_array(np.array([1], np.int64), "ax1")
    ]
    g = helper.make_graph(
        nodes,
        "range",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_static_shapes_fold_the_shape_arithmetic() -> None:
    import onnxruntime as ort

    from qdebug.targets.model_fixes import fix_static_shapes

    m = range_model()
    fixed, rep = fix_static_shapes(m, {"x": [3, 4]})
    assert [n.op_type for n in fixed.graph.node] == ["Add"] and "5 node(s) of shape arithmetic folded" in rep.detail
    x = np.random.default_rng(0).random((3, 4), dtype=np.float32)
    before = ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]
    after = ort.InferenceSession(fixed.SerializeToString()).run(None, {"x": x})[0]
    assert np.array_equal(before, after)
    assert [n.op_type for n in m.graph.node][2] == "Range"  # the input model is untouched


def test_folded_shape_arithmetic_compiles_to_one_partition(tmp_path: Path) -> None:
    require_qnn()
    from qdebug.build import build
    from qdebug.targets.base import BuildOptions

    path = tmp_path / "range.onnx"
    onnx.save(range_model(), str(path))
    res = build(path, tmp_path / "out", BuildOptions("qnn", "uint8", input_shapes={"x": [3, 4]}, debug_samples=2))
    c = res.manifest.compile
    assert c.single_partition and c.cpu_nodes == 0, c
