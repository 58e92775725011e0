"""Transformer ops in the Deeploy export (qdebug.targets.deeploy_transformer): one tiny purpose-built model per op
family, quantized for target ``deeploy``, exported, checked against ONNX Runtime's QDQ run and handed to the real
Deeploy code generator (these fail, not skip, under ``CI=true``); the bundled transformer end to end is in
tests/test_build_deeploy.py."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import _model, value_info
from onnx import helper, numpy_helper
from test_deeploy_env import deeploy, deeploy_env  # noqa: F401  (fixtures)
from test_deeploy_host import gcc  # noqa: F401  (fixture)

from qdebug import quantize
from qdebug.config import QuantConfig
from qdebug.errors import TargetError
from qdebug.targets import deeploy_env as denv
from qdebug.targets import deeploy_export as de
from qdebug.targets import deeploy_kernels as dk
from qdebug.targets import deeploy_zero_centre as dz
from qdebug.targets.deeploy_snap import snap_scales_for_deeploy

DEEPLOY = QuantConfig(activation_type="int8", weight_type="int8", target="deeploy", num_samples=32)
T, D = 4, 16


def _w(rng: np.random.Generator, name: str, shape: tuple[int, ...], scale: float = 0.3) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _c(name: str, value: float) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, np.float32), name)


def family_model(family: str, seed: int = 0) -> onnx.ModelProto:
    """x[1, T, D] → MatMul → <the op family> → y (float)."""
    rng = np.random.default_rng(seed)
    mm = helper.make_node("MatMul", ["x", "w1"], ["h"], name="proj")
    inits = [_w(rng, "w1", (D, D))]
    out_shape = [1, T, D]
    if family == "layernorm":
        inits += [numpy_helper.from_array((1 + 0.2 * rng.standard_normal(D)).astype(np.float32), "g"),
                  numpy_helper.from_array((0.1 * rng.standard_normal(D)).astype(np.float32), "b")]  # fmt: skip
        body = [helper.make_node("LayerNormalization", ["h", "g", "b"], ["y"], name="ln", axis=-1, epsilon=1e-5)]
    elif family == "softmax":
        body = [helper.make_node("Softmax", ["h"], ["y"], name="softmax", axis=-1)]
    elif family == "gelu":
        inits += [_c("sqrt2", math.sqrt(2)), _c("one", 1.0), _c("half", 0.5)]
        body = [
            helper.make_node("Div", ["h", "sqrt2"], ["d"], name="gelu_div"),
            helper.make_node("Erf", ["d"], ["e"], name="gelu_erf"),
            helper.make_node("Add", ["e", "one"], ["e1"], name="gelu_add"),
            helper.make_node("Mul", ["h", "e1"], ["m"], name="gelu_mul"),
            helper.make_node("Mul", ["m", "half"], ["y"], name="gelu_half"),
        ]
    elif family in ("gelu_tanh", "gelu_tanh_pow"):  # 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))): PyTorch's
        # approximate="tanh" (x·(x·x)), or with Pow(x, 3) as other exporters write the cube
        inits += [_c("kappa", 0.044715), _c("beta", math.sqrt(2 / math.pi)), _c("one", 1.0), _c("half", 0.5)]
        inits += [_c("three", 3.0)] if family == "gelu_tanh_pow" else []
        cube = [
            helper.make_node("Mul", ["h", "h"], ["h2"], name="g_sq"),
            helper.make_node("Mul", ["h", "h2"], ["h3"], name="g_cube"),
        ]
        body = [
            *(cube if family == "gelu_tanh" else [helper.make_node("Pow", ["h", "three"], ["h3"], name="g_pow")]),
            helper.make_node("Mul", ["kappa", "h3"], ["kh3"], name="g_kappa"),
            helper.make_node("Add", ["h", "kh3"], ["inner0"], name="g_add"),
            helper.make_node("Mul", ["beta", "inner0"], ["inner"], name="g_beta"),
            helper.make_node("Tanh", ["inner"], ["t"], name="g_tanh"),
            helper.make_node("Add", ["one", "t"], ["t1"], name="g_add1"),
            helper.make_node("Mul", ["h", "t1"], ["m"], name="g_mul"),
            helper.make_node("Mul", ["half", "m"], ["y"], name="g_half"),
        ]
    elif family == "attention":  # q·kᵀ·0.25 with a biased q, a Transpose and a MatMul of two activations
        inits += [_w(rng, "w2", (D, D)), _w(rng, "bq", (D,), 0.1), _c("scale", 0.25)]
        body = [
            helper.make_node("Add", ["bq", "h"], ["q"], name="q_bias"),
            helper.make_node("MatMul", ["x", "w2"], ["k"], name="k_proj"),
            helper.make_node("Transpose", ["k"], ["kt"], name="k_t", perm=[0, 2, 1]),
            helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
            helper.make_node("Mul", ["s", "scale"], ["y"], name="scaled"),
        ]
        out_shape = [1, T, T]
    elif family == "reduce":  # position-embedding Add, ReduceMean over the tokens, Concat
        inits += [_w(rng, "pos", (1, T, D), 0.2)]
        body = [
            helper.make_node("Add", ["h", "pos"], ["hp"], name="pos_add"),
            helper.make_node("ReduceMean", ["hp"], ["r"], name="pool", axes=[1], keepdims=0),
            helper.make_node("Concat", ["r", "r"], ["y"], name="cat", axis=1),
        ]
        out_shape = [1, 2 * D]
    elif family == "pv":  # non-negative x → q·kᵀ → Softmax → p·v: uint8 operands of three MatMuls
        inits = [_w(rng, "w1", (D, T)), _w(rng, "w2", (D, D))]
        body = [
            helper.make_node("Softmax", ["h"], ["p"], name="softmax", axis=-1),
            helper.make_node("MatMul", ["x", "w2"], ["v"], name="v_proj"),
            helper.make_node("MatMul", ["p", "v"], ["y"], name="pv"),
        ]
    else:
        raise ValueError(family)
    return _model([mm, *body], [value_info("x", [1, T, D])], [value_info("y", out_shape)], inits)


def _export(
    family: str, tmp_path: Path, low: float = -1.0, **kw: str
) -> tuple[de.ExportResult, onnx.ModelProto, list[str]]:
    rng = np.random.default_rng(1)
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = {"x": rng.uniform(low, 1, (64, 1, T, D)).astype(np.float32)}
    float_path = tmp_path / f"{family}.onnx"
    onnx.save(family_model(family), str(float_path))
    qdq = onnx.load(str(quantize(float_path, data, DEEPLOY, tmp_path / f"{family}.qdq.onnx").model_path))
    centred, changed = dz.zero_centre_operands(qdq)
    snapped, _ = snap_scales_for_deeploy(centred)
    res = de.export(snapped, tmp_path / "out", data=data, num_samples=32, verbose=False, **kw)
    return res, onnx.load(str(tmp_path / "out" / "network.onnx")), changed


#: family → (the Deeploy op it must produce, least equal fraction, largest LSB difference) — measured on these
#: models (docs/deeploy.md, "Transformer ops"); the exact families meet the CNN's target.
FAMILIES = {
    "attention": ("Transpose", 0.999, 1),
    "reduce": ("Concat", 0.999, 1),
    "layernorm": ("iLayerNorm", 0.3, 255),  # the kernel's int8 cast wraps an out-of-range value
    "softmax": ("iSoftmax", 0.3, 4),
    "gelu": ("RequantizediGELU", 0.3, 4),
    "gelu_tanh": ("RequantizediGELU", 0.3, 4),  # the same I-BERT erf kernel: Deeploy has no integer tanh GELU
    "gelu_tanh_pow": ("RequantizediGELU", 0.3, 4),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_exports_and_generates_integer_code(
    family: str,
    deeploy: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    op, least_equal, most_lsb = FAMILIES[family]
    res, net, changed = _export(family, tmp_path)
    ops = {n.op_type for n in net.graph.node}
    assert op in ops, ops
    assert ops <= {"MatMul", "RequantShift", "Reshape", "Transpose", "Add", "Concat", op}, ops
    assert res.equal_fraction >= least_equal and res.max_lsb_diff <= most_lsb, (res.equal_fraction, res.max_lsb_diff)
    if family in (
        "attention",
        "gelu",
        "gelu_tanh",
        "gelu_tanh_pow",
    ):  # their MatMul/GELU operands were requantized to zero point 0
        assert changed, changed
    gen = denv.generate(tmp_path / "out", tmp_path / "generic", "Generic")
    assert gen.ok and gen.integer_only is True, gen.error


def test_layernorm_as_irmsnorm_generates_for_siracusa(deeploy: Path, tmp_path: Path) -> None:  # noqa: F811
    res, net, _ = _export("layernorm", tmp_path, layernorm="iRMSNorm")
    ops = {n.op_type for n in net.graph.node}
    assert "iRMSNorm" in ops and "iLayerNorm" not in ops, ops
    assert res.equal_fraction >= 0.3 and res.max_lsb_diff <= 6, (res.equal_fraction, res.max_lsb_diff)  # 42.5 %, 4
    gen = denv.generate(tmp_path / "out", tmp_path / "siracusa", "Siracusa")
    assert gen.ok and gen.integer_only is True, gen.error
    with pytest.raises(TargetError, match="layernorm must be one of"):
        de.export(family_model("layernorm"), tmp_path / "x", layernorm="LayerNorm")


def test_zero_centring_moves_a_whole_reshape_transpose_chain(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    data = {"x": rng.uniform(-1, 1, (32, 1, T, D)).astype(np.float32)}
    qdq = onnx.load(str(quantize(family_model("attention"), data, DEEPLOY, tmp_path / "a.qdq.onnx").model_path))
    before = onnx.ModelProto()
    before.CopyFrom(qdq)
    centred, changed = dz.zero_centre_operands(qdq)
    assert qdq == before  # the input model is untouched
    consts = {i.name: numpy_helper.to_array(i) for i in centred.graph.initializer}
    # k and its Transpose share one quantization: both Q nodes now have zero point 0 and the same scale.
    qs = {n.output[0]: n for n in centred.graph.node if n.op_type == "QuantizeLinear"}
    k_q = [q for t, q in qs.items() if t.startswith("k_") or t.startswith("kt_")]
    assert len(k_q) == 2 and all(int(consts[q.input[2]]) == 0 for q in k_q)
    assert len({float(consts[q.input[1]]) for q in k_q}) == 1
    _, more = dz.zero_centre_operands(centred)
    assert not more and len(changed) >= 1  # idempotent


def test_kernels_follow_deeploys_c_arithmetic() -> None:
    """The numpy kernels against a literal, element-by-element transcription of Deeploy's C semantics."""
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (3, 8)).astype(np.int64)
    w, b, log2d = rng.integers(-3000, 3000, 8), rng.integers(-40000, 40000, 8), 10
    want = np.zeros_like(x)
    for r in range(3):
        row = [int(v) for v in x[r]]
        mean = int(sum(row) / 8)  # C: truncation toward zero
        var = sum((v - mean) ** 2 for v in row) // 8 + 1
        std = math.isqrt(var)
        for j, v in enumerate(row):
            num = (v - mean) * int(w[j])
            y = (int(num / std) + int(b[j])) >> log2d
            want[r, j] = (y + 128) % 256 - 128
    np.testing.assert_array_equal(dk._ilayernorm(x, w, b, log2d), want)
    g = dk._rqgelu(np.arange(-128, 128), b=-60, one=5000, mul=300, add=0, shift=20)
    assert g[128] == 0 and g[-1] > 0 and g.min() >= -128  # gelu(0) = 0, gelu(x) > 0 for x > 0
    sm = dk._isoftmax(np.array([[0, 0, 0, 0], [100, 0, 0, 0]]), a=400, b=36, c=1442840, log2=18, n_levels=256)
    assert sm[0].tolist() == [63, 63, 63, 63] and 230 < sm[1, 0] < 245  # e^-3.85 ≈ 0.021: 1/(1 + 3·0.021) of 255 ≈ 240


def test_erf_outside_gelu_is_refused_naming_the_node(tmp_path: Path) -> None:
    model = family_model("gelu")
    for n in model.graph.node:
        if n.name == "gelu_div":  # not √2 any more: no GELU pattern
            n.input[1] = "one"
    rng = np.random.default_rng(0)
    data = {"x": rng.uniform(-1, 1, (16, 1, T, D)).astype(np.float32)}
    qdq = quantize(model, data, DEEPLOY, tmp_path / "e.qdq.onnx").model_path
    with pytest.raises(TargetError, match="Erf node 'gelu_erf'"):
        de.export(qdq, tmp_path / "out", data=data, verbose=False)


def test_siracusa_form_reencodes_uint8_matmul_operands_exactly(deeploy: Path, tmp_path: Path) -> None:  # noqa: F811
    """PULPOpen's MatMul is int8 × int8: the non-negative input and the Softmax output (uint8) are re-encoded to
    int8 (q = u − 128) and the zero point folded (weight column sums; a ones block for p·v). Exact: the Siracusa
    network computes the Generic network's integers on every sample, and its code generates."""
    generic, gen_net, _ = _export("pv", tmp_path / "g", low=0.0)
    res, net, _ = _export("pv", tmp_path / "s", low=0.0, platform="Siracusa")
    elem = {v.name: v.type.tensor_type.elem_type for v in (*net.graph.value_info, *net.graph.input)}
    inits = {i.name for i in net.graph.initializer}
    mm_ins = [t for n in net.graph.node if n.op_type == "MatMul" for t in n.input]
    assert len(mm_ins) == 6 and all(t in inits or elem[t] == onnx.TensorProto.INT8 for t in mm_ins), mm_ins
    assert net.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.UINT8  # same inputs.npz as Generic
    assert "Concat" in {n.op_type for n in net.graph.node}  # the ones block of p·v
    rng = np.random.default_rng(5)
    for _ in range(8):
        x = {"x": rng.integers(0, 256, (1, T, D)).astype(np.int64)}
        np.testing.assert_array_equal(de.evaluate_integer(net, x)["y"], de.evaluate_integer(gen_net, x)["y"])
    assert (res.equal_fraction, res.max_lsb_diff) == (generic.equal_fraction, generic.max_lsb_diff)
    gen = denv.generate(tmp_path / "s" / "out", tmp_path / "siracusa", "Siracusa")
    assert gen.ok and gen.integer_only is True, gen.error
    with pytest.raises(TargetError, match="platform must be one of"):
        de.export(family_model("pv"), tmp_path / "x", platform="Snitch")


def test_broadcast_add_is_expanded_and_the_generated_code_runs(
    deeploy: Path,  # noqa: F811
    gcc: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """An Add whose second operand broadcasts (MiniLM's [1, 1, 1, S] attention-mask bias on [1, H, S, S] scores):
    Deeploy's Generic Add gives both operands one shape, so the small operand is expanded by Concats of itself
    first; the integer network stays exact and the generated Generic code, run on the host, equals it (before the
    expansion it wrote past the small buffer: a heap overflow)."""
    from qdebug.targets.deeploy import compile_deeploy

    rng = np.random.default_rng(0)
    # scores [1, 2, 5, 5] from x [1, 5, 8] (Deeploy's Generic MatMul steps a 2-D weight per batch: keep batch 1)
    body = [
        helper.make_node("MatMul", ["x", "W"], ["p"], name="mm"),
        helper.make_node("Reshape", ["p", "heads"], ["ph"], name="split"),
        helper.make_node("Transpose", ["ph"], ["s"], name="perm", perm=[0, 2, 1, 3]),
        helper.make_node("Add", ["s", "m"], ["y"], name="masked"),
    ]
    inits = [_w(rng, "W", (8, 10)), numpy_helper.from_array(np.array([1, 5, 2, 5], np.int64), "heads")]
    model = _model(
        body, [value_info("x", [1, 5, 8]), value_info("m", [1, 1, 1, 5])], [value_info("y", [1, 2, 5, 5])], inits
    )
    data = {
        "x": rng.uniform(-1, 1, (32, 1, 5, 8)).astype(np.float32),
        "m": rng.uniform(-2, 0, (32, 1, 1, 1, 5)).astype(np.float32),
    }
    onnx.save(model, str(tmp_path / "f.onnx"))
    qdq = quantize(tmp_path / "f.onnx", data, DEEPLOY, tmp_path / "q.onnx").model_path
    snapped, _ = snap_scales_for_deeploy(onnx.load(str(qdq)))
    onnx.save(snapped, str(tmp_path / "s.onnx"))
    samples = [{k: v[i] for k, v in data.items()} for i in range(8)]
    built = compile_deeploy(tmp_path / "s.onnx", tmp_path / "out", samples, platforms=("Generic",))
    net = onnx.load(str(tmp_path / "out" / "network.onnx"))
    # 2 heads: one Concat; 5 rows = 2·2 + 1: three
    assert sum(n.op_type == "Concat" for n in net.graph.node) == 4
    assert built.info["export"]["equal_fraction"] == 1.0
    run = built.info["run"]["Generic"]
    assert run["ran"] and run["equal_fraction_vs_integer_onnx"] == 1.0, run


def test_a_softmax_only_mismatch_is_named_in_the_warning(tmp_path: Path) -> None:
    """Only the output after iSoftmax differs from the QDQ model (its exp polynomial); the tensor before it is equal,
    so the warning says so instead of only quoting the bit-exact target; a real mismatch keeps the target line."""
    from dataclasses import replace

    from qdebug.targets.deeploy import _mismatch_warning

    res, _, _ = _export("softmax", tmp_path)
    assert not res.bit_exact_ok, (res.equal_fraction, res.max_lsb_diff)  # iSoftmax's exp is an approximation
    [out] = res.outputs
    assert out.approximated_by == (("iSoftmax", "softmax"),) and out.equal_fraction == res.equal_fraction
    assert (res.before_approx_equal, res.before_approx_max_lsb) == (1.0, 0)
    assert res.approximation_only and de.ExportResult.from_dict(res.to_dict()) == res
    warning = _mismatch_warning("the integer network", res)
    assert "only outputs after Deeploy's integer Softmax (iSoftmax, which approximates exp) differ: y " in warning
    assert "(after softmax); the tensors before it are 100.00% equal (max 0 LSB)" in warning
    assert "the target is" not in warning, warning
    # The tensor before the Softmax differs too: a real mismatch, the target stays and the Softmax is still named.
    real = _mismatch_warning("the integer network", replace(res, before_approx_equal=0.9, before_approx_max_lsb=3))
    assert "the target is ≥ 99.9 % and ≤ 1 LSB" in real and "before it are 90.00% equal (max 3 LSB)" in real
    # An output that differs without any approximating kernel: nothing is explained.
    bare = replace(res, outputs=(replace(out, approximated_by=()),))
    assert not bare.approximation_only and "Softmax" not in _mismatch_warning("the integer network", bare)
