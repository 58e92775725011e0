"""``qdebug.qat``: every canonicalisation pass keeps the model's outputs (run in ORT) and changes its
structure as documented; the canonical QCDQ model debugs against its float parent like a QDQ model."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import qat_models as qm
from onnx import TensorProto, helper, numpy_helper

from qdebug import qat
from qdebug.data import open_data
from qdebug.debugger import DebugOptions, debug
from qdebug.errors import ConfigError, InputFileError
from qdebug.model_io import input_specs

RTOL = 1e-5  # of the output range: only float rounding may differ


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run a model in ORT (CPU, default optimizations)."""
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in sess.run(None, feeds)]


def random_feeds(model: onnx.ModelProto, n: int = 6, seed: int = 7) -> list[dict[str, np.ndarray]]:
    """``n`` random float inputs in [-0.5, 1.5) (beyond the calibrated range, to exercise saturation)."""
    rng = np.random.default_rng(seed)
    specs = input_specs(model)
    return [
        {s.name: (rng.random([int(d) for d in s.shape]) * 2 - 0.5).astype(np.float32) for s in specs} for _ in range(n)
    ]


def assert_equivalent(
    reference: onnx.ModelProto, candidate: onnx.ModelProto, feeds: list[dict[str, np.ndarray]] | None = None
) -> float:
    """The candidate passes the checker and matches the reference within float rounding; the max diff."""
    onnx.checker.check_model(candidate)
    worst = 0.0
    for f in feeds or random_feeds(reference):
        for a, b in zip(run(reference, f), run(candidate, f), strict=True):
            span = max(float(a.max() - a.min()), float(np.abs(a).max()), 1e-12)
            diff = float(np.abs(a - b).max())
            assert diff <= RTOL * span, (diff, span)
            worst = max(worst, diff)
    return worst


def ops(model: onnx.ModelProto) -> Counter[str]:
    """Op-type counts."""
    return Counter(n.op_type for n in model.graph.node)


def apply(model: onnx.ModelProto, *passes: qat.Pass) -> tuple[onnx.ModelProto, list[qat.PassReport]]:
    """Run passes in order."""
    reports = []
    for p in passes:
        model, r = p(model)
        reports.append(r)
    return model, reports


@pytest.fixture(scope="module")
def qcdq() -> onnx.ModelProto:
    """Model (a): the decomposed QCDQ conv model."""
    return qm.qat_convnet("qcdq")


# --------------------------------------------------------------------------- the passes one by one
def test_fold_decomposed_quant(qcdq: onnx.ModelProto) -> None:
    before = onnx.ModelProto()
    before.CopyFrom(qcdq)
    out, rep = qat.fold_decomposed_quant(qcdq)
    assert qcdq == before  # the input proto is not modified
    assert_equivalent(qcdq, out)
    # 4 activations + 3 weights become QuantizeLinear; the 3 int32 biases are folded to constants.
    assert ops(out)["QuantizeLinear"] == 7
    assert ops(out)["Round"] == ops(out)["Clip"] == ops(out)["Div"] == ops(out)["Add"] == 0
    assert rep.rewrites == 10
    assert (rep.nodes_before, rep.nodes_after) == (len(qcdq.graph.node), len(out.graph.node))
    assert "→" in rep.summary
    q_types = {out.graph.node[i].input[2] for i, n in enumerate(out.graph.node) if n.op_type == "QuantizeLinear"}
    inits = {i.name: i.data_type for i in out.graph.initializer}
    assert {inits[z] for z in q_types} == {TensorProto.INT8}


@pytest.mark.parametrize(
    ("lo", "hi", "dtype"),
    [(-128, 127, np.int8), (0, 255, np.uint8), (-32768, 32767, np.int16), (0, 65535, np.uint16)],
)
def test_clip_range_gives_zero_point_type(lo: int, hi: int, dtype: type[np.generic]) -> None:
    scale, zp = 0.5, 3
    inits = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
             [("s", scale), ("z", zp), ("lo", lo), ("hi", hi)]]  # fmt: skip
    nodes = [
        helper.make_node("Div", ["x", "s"], ["d"]),
        helper.make_node("Round", ["d"], ["r"]),
        helper.make_node("Add", ["r", "z"], ["a"]),  # Round-then-Add order
        helper.make_node("Clip", ["a", "lo", "hi"], ["c"]),
        helper.make_node("Sub", ["c", "z"], ["u"]),
        helper.make_node("Mul", ["u", "s"], ["y"]),
    ]
    m = qm._model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64])],
        inits,
        opset=21,
    )
    out, _ = apply(m, qat.fold_decomposed_quant, qat.fold_decomposed_dequant)
    assert ops(out) == Counter({"QuantizeLinear": 1, "DequantizeLinear": 1})
    z = next(i for i in out.graph.initializer if i.name == out.graph.node[0].input[2])
    assert numpy_helper.to_array(z).dtype == np.dtype(dtype)
    feeds = [{"x": np.linspace((lo - 20) * scale, (hi + 20) * scale, 64, dtype=np.float32)}]  # saturates both ends
    assert_equivalent(m, out, feeds)


def test_narrow_clip_range_is_left_with_a_warning() -> None:
    inits = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in [("s", 0.1), ("lo", -127), ("hi", 127)]]
    nodes = [
        helper.make_node("Div", ["x", "s"], ["d"]),
        helper.make_node("Round", ["d"], ["r"]),
        helper.make_node("Clip", ["r", "lo", "hi"], ["c"]),
        helper.make_node("Mul", ["c", "s"], ["y"]),
    ]
    m = qm._model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        inits,
    )
    out, rep = qat.fold_decomposed_quant(m)
    assert rep.rewrites == 0 and ops(out) == ops(m)
    assert any("not a full integer range" in w for w in rep.warnings)


def test_fold_decomposed_dequant(qcdq: onnx.ModelProto) -> None:
    mid, _ = qat.fold_decomposed_quant(qcdq)
    out, rep = qat.fold_decomposed_dequant(mid)
    assert_equivalent(qcdq, out)
    assert rep.rewrites == 10  # 4 activations, 3 weights, 3 biases
    counts = ops(out)
    assert counts["DequantizeLinear"] == 10
    assert counts["Cast"] == counts["Sub"] == counts["Mul"] == 0


def test_dequant_with_a_different_zero_point_is_not_merged() -> None:
    inits = [
        numpy_helper.from_array(np.array(0.1, np.float32), "s"),
        numpy_helper.from_array(np.array(0, np.int8), "z"),
        numpy_helper.from_array(np.array(5.0, np.float32), "z5"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("Cast", ["q"], ["c"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["c", "z5"], ["u"]),
        helper.make_node("Mul", ["u", "s"], ["y"]),
    ]
    m = qm._model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        inits,
    )
    out, rep = qat.fold_decomposed_dequant(m)
    assert ops(out) == ops(m) and rep.warnings


def test_normalize_qdq_domain() -> None:
    m = qm.qat_convnet("msft")
    out, rep = qat.normalize_qdq_domain(m)
    assert_equivalent(m, out)
    assert all(n.domain == "" for n in out.graph.node)
    assert rep.rewrites == ops(m)["QuantizeLinear"] + ops(m)["DequantizeLinear"] == 14
    assert "com.microsoft" not in {o.domain for o in out.opset_import}


def _msft16(opset: int) -> onnx.ModelProto:
    inits = [
        numpy_helper.from_array(np.array(0.001, np.float32), "s"),
        numpy_helper.from_array(np.array(0, np.int16), "z"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], domain="com.microsoft"),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], domain="com.microsoft"),
    ]
    return qm._model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])],
        inits,
        opset=opset,
        domains=("com.microsoft",),
    )


@pytest.mark.parametrize(("opset", "moved"), [(17, False), (21, True)])
def test_normalize_16_bit_needs_opset_21(opset: int, moved: bool) -> None:
    m = _msft16(opset)
    out, rep = qat.normalize_qdq_domain(m)
    assert all((n.domain == "") is moved for n in out.graph.node)
    assert bool(rep.warnings) is not moved
    assert_equivalent(m, out, [{"x": np.linspace(-40, 40, 8).astype(np.float32)}])


def test_fakequant_from_minmax(qcdq: onnx.ModelProto) -> None:
    m = qm.qat_convnet("fakequant")
    out, rep = qat.fakequant_from_minmax(m)
    assert ops(m)["FakeQuantize"] == 7 and ops(out)["FakeQuantize"] == 0
    assert ops(out)["QuantizeLinear"] == ops(out)["DequantizeLinear"] - 3 == 7  # + 3 int32 bias DQs
    assert "org.openvinotoolkit" not in {o.domain for o in out.opset_import}
    assert rep.rewrites == 7 and not rep.warnings
    # ORT cannot run FakeQuantize: the reference is the QCDQ spelling of the same scales.
    assert_equivalent(qcdq, out)


def test_fakequant_unsupported_levels_are_reported() -> None:
    m = qm.qat_convnet("fakequant")
    for n in m.graph.node:
        for a in n.attribute:
            if a.name == "levels":
                a.i = 255
    out, rep = qat.fakequant_from_minmax(m)
    assert rep.rewrites == 0 and len(rep.warnings) == 7 and ops(out) == ops(m)


def test_fold_weight_fakequant(qcdq: onnx.ModelProto) -> None:
    mid, _ = apply(qcdq, qat.fold_decomposed_quant, qat.fold_decomposed_dequant)
    out, rep = qat.fold_weight_fakequant(mid)
    assert_equivalent(qcdq, out)
    assert rep.rewrites == 3
    assert ops(mid)["QuantizeLinear"] - ops(out)["QuantizeLinear"] == 3
    inits = {i.name: i for i in out.graph.initializer}
    for w in ("w1", "w2", "wg"):
        assert inits[f"{w}_quantized"].data_type == TensorProto.INT8


def test_eliminate_redundant_dq_q() -> None:
    m = qm.redundant_dq_q()
    out, rep = qat.eliminate_redundant_dq_q(m)
    assert rep.rewrites == 1  # the re-quantization to another scale stays
    assert (ops(m)["QuantizeLinear"], ops(out)["QuantizeLinear"]) == (4, 3)
    assert (ops(m)["DequantizeLinear"], ops(out)["DequantizeLinear"]) == (4, 3)
    assert_equivalent(m, out, [{"x": np.linspace(-3, 3, 32, dtype=np.float32).reshape(2, 16)}])


def test_prune_training_leftovers() -> None:
    m = qm.training_leftovers()
    out, rep = qat.prune_training_leftovers(m)
    assert rep.rewrites == 7  # 2 Identity, Dropout, 2 orphans, unused initializers, the shadowing input
    assert ops(m) == Counter({"Identity": 3, "Relu": 1, "Dropout": 1, "Neg": 1, "Abs": 1, "Mul": 1})
    assert ops(out) == Counter({"Relu": 1, "Mul": 1, "Identity": 1})  # the Identity making 'y' stays
    assert [o.name for o in out.graph.output] == ["y"]
    assert {i.name for i in out.graph.initializer} == {"k"}
    assert [i.name for i in out.graph.input] == ["x"]
    assert_equivalent(m, out, [{"x": np.linspace(-2, 2, 16, dtype=np.float32).reshape(2, 8)}])


def test_prune_keeps_dropout_whose_mask_is_read_and_real_inputs() -> None:
    nodes = [
        helper.make_node("Dropout", ["x"], ["d", "mask"]),
        helper.make_node("Cast", ["mask"], ["mf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["d", "mf"], ["y"]),
    ]
    m = qm._model(
        nodes,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("x", "unused_input")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    out, rep = qat.prune_training_leftovers(m)
    assert ops(out) == ops(m)
    assert [i.name for i in out.graph.input] == ["x", "unused_input"]
    assert any("unused_input" in w for w in rep.warnings)


# --------------------------------------------------------------------------- canonicalize()
def test_canonical_model_is_plain_int8_qdq(qcdq: onnx.ModelProto) -> None:
    res = qat.canonicalize(qcdq)
    m = res.model
    assert_equivalent(qcdq, m)
    assert set(ops(m)) == {"QuantizeLinear", "DequantizeLinear", "Conv", "Relu", "Flatten", "Gemm"}
    assert all(n.domain == "" for n in m.graph.node)
    inits = {i.name: i for i in m.graph.initializer}
    producers = {o for n in m.graph.node for o in n.output}
    kinds: Counter[int] = Counter()
    for n in m.graph.node:
        if n.op_type == "QuantizeLinear":
            assert inits[n.input[2]].data_type == TensorProto.INT8
        if n.op_type == "DequantizeLinear" and n.input[0] not in producers:
            kinds[inits[n.input[0]].data_type] += 1  # weights and biases are stored integers
    assert kinds == Counter({TensorProto.INT8: 3, TensorProto.INT32: 3})
    assert res.nodes_before == len(qcdq.graph.node) and res.nodes_after == len(m.graph.node) == 19
    assert [r.name for r in res.reports] == [n for n, _ in qat.PASSES]
    json.dumps(res.to_dict())
    assert qat.PassReport.from_dict(res.reports[0].to_dict()) == res.reports[0]


@pytest.mark.parametrize("style", ["msft", "fakequant"])
def test_all_styles_canonicalize_to_the_same_graph(style: str, qcdq: onnx.ModelProto) -> None:
    ref = qat.canonicalize(qcdq).model
    out = qat.canonicalize(qm.qat_convnet(style)).model
    assert ops(out) == ops(ref)
    assert_equivalent(qcdq, out)


def test_canonicalize_files_options_and_errors(tmp_path: Path, qcdq: onnx.ModelProto) -> None:
    src = tmp_path / "qat.onnx"
    onnx.save(qcdq, str(src))
    raw = src.read_bytes()
    res = qat.canonicalize(src, output=tmp_path / "out" / "canon.onnx")
    assert src.read_bytes() == raw
    assert res.path is not None and res.path.exists()
    assert onnx.load(str(res.path)) == res.model
    assert not list((tmp_path / "out").glob(".*tmp"))

    only = qat.canonicalize(qcdq, passes=["fold_decomposed_quant", "fold_decomposed_dequant"])
    assert [r.name for r in only.reports] == ["fold_decomposed_quant", "fold_decomposed_dequant"]
    no_fold = qat.canonicalize(qcdq, disable=["fold_weight_fakequant"])
    assert ops(no_fold.model)["QuantizeLinear"] == 7

    seen: list[int] = []

    def count(m: onnx.ModelProto) -> tuple[onnx.ModelProto, qat.PassReport]:
        seen.append(len(m.graph.node))
        return m, qat.PassReport("count", nodes_before=len(m.graph.node), nodes_after=len(m.graph.node))

    custom: list[str | Callable[[onnx.ModelProto], tuple[onnx.ModelProto, qat.PassReport]]] = [count]
    assert qat.canonicalize(qcdq, passes=custom).reports[0].name == "count" and seen

    with pytest.raises(ConfigError, match="unknown pass"):
        qat.canonicalize(qcdq, passes=["nope"])
    with pytest.raises(ConfigError, match="unknown pass"):
        qat.canonicalize(qcdq, disable=["nope"])
    with pytest.raises(InputFileError, match="overwrite"):
        qat.canonicalize(src, output=src)
    with pytest.raises(InputFileError):
        qat.canonicalize(tmp_path / "missing.onnx")


def test_passes_registry_has_docstrings() -> None:
    for name, fn in qat.PASSES:
        assert fn.__name__ == name and fn.__doc__ and "Why" in fn.__doc__


# --------------------------------------------------------------------------- end to end with the debugger
def test_debug_canonical_qcdq_against_float_parent(qcdq: onnx.ModelProto) -> None:
    parent = qm.float_parent()
    canonical = qat.canonicalize(qcdq).model
    report = debug(parent, canonical, None, DebugOptions(num_samples=8))

    quantized = [a for a in report.activations if a.quantized]
    assert {a.tensor_name for a in quantized} == set(qm.ACT_POINTS)
    assert all(a.quant_type == "int8" for a in quantized)
    assert {(w.weight_name, w.kind, w.quant_type) for w in report.weights} == {
        ("w1", "weight", "int8"), ("w2", "weight", "int8"), ("wg", "weight", "int8"),
        ("b1", "bias", "int32"), ("b2", "bias", "int32"), ("bg", "bias", "int32"),
    }  # fmt: skip
    assert all(w.weight_sqnr_db is not None and w.weight_sqnr_db > 20 for w in report.weights)

    # The SQNR between the float parent and the ORIGINAL QCDQ model, on the same samples debug used.
    source = open_data(None, input_specs(parent), num_samples=8, seed=0)
    signal = noise = 0.0
    for sample in source:
        ref, test = run(parent, sample)[0].astype(np.float64), run(qcdq, sample)[0].astype(np.float64)
        signal += float(np.sum(ref * ref))
        noise += float(np.sum((ref - test) ** 2))
    direct = 10 * math.log10(signal / noise)
    measured = report.model_outputs[0].cumulative_sqnr_db
    assert measured is not None
    print(f"output SQNR: debug(canonical) {measured:.4f} dB, direct(original QCDQ) {direct:.4f} dB")
    assert abs(measured - direct) <= 0.01
