"""Sentinel mask constants (qdebug.sentinel, docs/diagnostics.md#sentinels): found by structure and magnitude on a
tiny attention model built here (−FLT_MAX, −1e9 through ``(1 − mask) · −1e9``, ``Where`` with ``ConstantOfShape``),
clamped to a value Softmax maps identically (proved on ONNX Runtime), SQNR over the non-mask elements, the
diagnostic at the top with both remedies, and both remedies measured on a real quantization."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdebug.config import QuantConfig
from qdebug.debugger import debug
from qdebug.diagnose import diagnose_models
from qdebug.findings import DiagnosticKind, Diagnostics, RemedyKind, Severity
from qdebug.mixed.remedies import RemedyKind as MixedRemedyKind
from qdebug.mixed.remedies import measure_remedies, remedy_overrides, sentinel_remedies
from qdebug.mixed.session import MixedPrecisionSession
from qdebug.quantizer import quantize
from qdebug.sentinel import (
    SOFTMAX_MARGIN,
    Sentinel,
    check_identical,
    clamp_sentinels,
    clamp_value,
    find_sentinels,
    masked_sqnr,
)

FLT_MAX = float(np.finfo(np.float32).max)
T, D = 8, 16


def attention(mask_value: float = -FLT_MAX, style: str = "mul", names: bool = True, seed: int = 0) -> onnx.ModelProto:
    """x [1, T, D], mask [1, T] (int64 1 = keep) → one attention head whose scores get the mask before Softmax:
    ``mul``: (1 − Cast(mask)) · value added to the scores (BERT's export); ``where``: Where(mask, scores,
    ConstantOfShape(value))."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (D, D)).astype(np.float32), n) for n in ("Wq", "Wk", "Wv")]
    inits += [numpy_helper.from_array(np.array(1.0 / math.sqrt(D), np.float32), "inv_sqrt_d"),
              numpy_helper.from_array(np.array([1], np.int64), "axis1")]  # fmt: skip
    nodes = [
        helper.make_node("MatMul", ["x", "Wq"], ["q"], "q_proj"),
        helper.make_node("MatMul", ["x", "Wk"], ["k"], "k_proj"),
        helper.make_node("MatMul", ["x", "Wv"], ["v"], "v_proj"),
        helper.make_node("Transpose", ["k"], ["kt"], "k_t", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"], "qk"),
        helper.make_node("Mul", ["qk", "inv_sqrt_d"], ["scores"], "scale"),
        helper.make_node("Unsqueeze", ["mask", "axis1"], ["mask3"], "mask_unsqueeze"),  # [1, 1, T]
    ]
    if style == "mul":
        inits += [numpy_helper.from_array(np.array(1.0, np.float32), "one"),
                  numpy_helper.from_array(np.array(mask_value, np.float32), "mask_value")]  # fmt: skip
        nodes += [
            helper.make_node("Cast", ["mask3"], ["maskf"], "mask_cast", to=TensorProto.FLOAT),
            helper.make_node("Sub", ["one", "maskf"], ["inverted"], "mask_invert"),
            helper.make_node("Mul", ["inverted", "mask_value"], ["mask_add"], "mask_scale"),
            helper.make_node("Add", ["scores", "mask_add"], ["masked"], "mask_join"),
        ]
    else:
        inits.append(numpy_helper.from_array(np.array([1, T, T], np.int64), "score_shape"))
        value = numpy_helper.from_array(np.array([mask_value], np.float32), "value")
        nodes += [
            helper.make_node("Cast", ["mask3"], ["keep"], "mask_cast", to=TensorProto.BOOL),
            helper.make_node("ConstantOfShape", ["score_shape"], ["fill"], "mask_fill", value=value),
            helper.make_node("Where", ["keep", "scores", "fill"], ["masked"], "mask_join"),
        ]
    nodes += [
        helper.make_node("Softmax", ["masked"], ["probs"], "softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["y"], "pv"),
    ]
    if not names:
        for n in nodes:
            if n.name.startswith("mask"):
                n.name = ""
    graph = helper.make_graph(
        nodes, "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, T, D]),
         helper.make_tensor_value_info("mask", TensorProto.INT64, [1, T])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, T, D])], inits,
    )  # fmt: skip
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def samples(n: int, seed: int = 1, full_row_masked: bool = False) -> list[dict[str, np.ndarray]]:
    """Padded sequences: the first L positions kept, L from 2 to T (never all masked unless asked)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = 0 if full_row_masked and i == 0 else int(rng.integers(2, T + 1))
        mask = (np.arange(T) < length).astype(np.int64)[None]
        out.append({"x": rng.normal(0, 1, (1, T, D)).astype(np.float32), "mask": mask})
    return out


def npz(path: Path, items: list[dict[str, np.ndarray]]) -> Path:
    np.savez(path, **{k: np.stack([s[k] for s in items]) for k in items[0]})
    return path


# ---------------------------------------------------------------------------------------------- detection
@pytest.mark.parametrize(("value", "style"), [(-FLT_MAX, "mul"), (-1e9, "mul"), (-FLT_MAX, "where"), (-1e4, "where")])
def test_found_with_its_join_softmax_and_float_nodes(value: float, style: str) -> None:
    (s,) = find_sentinels(attention(value, style))
    assert s.value == pytest.approx(value, rel=1e-6)
    assert (s.join_node, s.join_op, s.join_output, s.scores, s.softmax) == (
        "mask_join", "Add" if style == "mul" else "Where", "masked", "scores", "softmax"
    )  # fmt: skip
    assert s.carriers == ("masked",)
    expected_path = ("mask_scale",) if style == "mul" else ()
    assert s.path_nodes == expected_path
    assert s.float_nodes == (*expected_path, "mask_join", "softmax")
    assert s.constant == ("mask_value" if style == "mul" else "fill")
    assert Sentinel.from_dict(s.to_dict()) == s


def test_no_sentinel_without_a_softmax_or_below_the_magnitude() -> None:
    m = attention(-FLT_MAX)
    m.graph.node[-2].op_type = "Relu"  # the Softmax is gone: a big constant alone is no mask
    m.graph.node[-2].ClearField("attribute")
    assert find_sentinels(m) == ()
    assert find_sentinels(attention(-1000.0)) == ()  # below MIN_SENTINEL_ABS
    # Known data ranges: a constant only 10x beyond the scores is part of the data, not a mask.
    assert find_sentinels(attention(-1e4), {"scores": (-1000.0, 1000.0)}) == ()
    assert len(find_sentinels(attention(-1e4), {"scores": (-10.0, 10.0)})) == 1


def test_unnamed_nodes_are_listed_not_excluded() -> None:
    (s,) = find_sentinels(attention(-FLT_MAX, names=False))
    assert s.float_nodes == ("softmax",)  # ORT's nodes_to_exclude matches names: "" would match every unnamed node
    assert len(s.unnamed) == 2 and all("unnamed" in u for u in s.unnamed)


# ---------------------------------------------------------------------------------------------- the clamp
@pytest.mark.parametrize(("value", "style"), [(-FLT_MAX, "mul"), (-1e9, "mul"), (-FLT_MAX, "where")])
def test_clamp_is_identical_in_float_on_onnx_runtime(value: float, style: str) -> None:
    m = attention(value, style)
    before = m.SerializeToString()
    sentinels = find_sentinels(m)
    clamped, report = clamp_sentinels(m, sentinels, (-6.0, 5.0), samples=samples(8))
    assert m.SerializeToString() == before  # the input is never modified
    assert report.changed and report.rewrites == 1 and report.name == "clamp_sentinels"
    assert "bit-identical" in report.details[-1], report.details
    new = [i for i in clamped.graph.initializer if i.name == "mask_value"] or None
    if new is not None:
        assert float(numpy_helper.to_array(new[0])) == pytest.approx(-(6 + 5 + SOFTMAX_MARGIN))
    # Deterministic: the same inputs give the same bytes.
    again, _ = clamp_sentinels(m, sentinels, (-6.0, 5.0))
    assert again.SerializeToString() == clamped.SerializeToString()
    assert check_identical(m, clamped, samples(4, seed=7)).bit_identical


def test_clamp_refused_when_a_row_is_masked_entirely() -> None:
    # −FLT_MAX on every element of a row makes Softmax uniform there; a finite value does not: outputs differ.
    m = attention(-FLT_MAX)
    out, report = clamp_sentinels(m, find_sentinels(m), (-6.0, 5.0), samples=samples(3, full_row_masked=True))
    assert not report.changed and report.warnings and "beyond" in report.warnings[0]
    assert out.SerializeToString() == m.SerializeToString()


def test_clamp_value_sign_and_margin() -> None:
    assert clamp_value(-FLT_MAX, (-3.0, 4.0)) == pytest.approx(-117.0)
    assert clamp_value(1e9, (-3.0, 4.0)) == pytest.approx(117.0)


def test_shared_constant_gets_a_copy_for_the_mask_path() -> None:
    m = attention(-1e9)
    # Something else reads the mask constant too: it must keep its value.
    m.graph.node.append(helper.make_node("Identity", ["mask_value"], ["raw"], "other_reader"))
    m.graph.output.append(helper.make_tensor_value_info("raw", TensorProto.FLOAT, []))
    clamped, report = clamp_sentinels(m, find_sentinels(m), (-6.0, 5.0))
    assert "as mask_value/sentinel_clamped" in report.details[0]
    values = {i.name: float(numpy_helper.to_array(i)) for i in clamped.graph.initializer if i.name.startswith("mask")}
    assert values["mask_value"] == pytest.approx(-1e9) and values["mask_value/sentinel_clamped"] == pytest.approx(-121)


# ---------------------------------------------------------------------------------------------- quantized
@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("sentinel")
    out = {}
    for tag, value in (("flt", -FLT_MAX), ("1e9", -1e9)):
        f = d / f"{tag}.onnx"
        onnx.save(attention(value), f)
        calib = npz(d / f"{tag}_calib.npz", samples(16, seed=2))
        quantize(f, calib, QuantConfig(), d / f"{tag}.qdq.onnx", check=False)
        out[tag], out[f"{tag}_calib"], out[f"{tag}_q"] = f, calib, d / f"{tag}.qdq.onnx"
    out["eval"] = npz(d / "eval.npz", samples(6, seed=3))
    return out


@pytest.mark.parametrize("tag", ["flt", "1e9"])
def test_masked_sqnr_and_the_diagnostic_at_the_top(quantized: dict[str, Path], tag: str) -> None:
    f, q, data = quantized[tag], quantized[f"{tag}_q"], quantized["eval"]
    report = debug(f, q, data)
    masked_add = next(a for a in report.activations if a.tensor_name == "masked")
    assert masked_add.cumulative_sqnr_db is not None and masked_add.cumulative_sqnr_db > 100  # the mask's energy
    diags = diagnose_models(report, f, q, data, max_samples=4)
    top = diags.items[0]
    assert (top.kind, top.severity, top.tensor) == (DiagnosticKind.SENTINEL, Severity.ERROR, "masked")
    assert [r.kind for r in top.remedies] == [RemedyKind.SENTINEL_CLAMP, RemedyKind.FLOAT_FALLBACK]
    assert top.remedies[1].nodes == ("mask_scale", "mask_join", "softmax")
    masked_db = top.values["masked_sqnr_db"]
    assert masked_db is not None and masked_db < 10  # the scores lost their bits on the mask's grid
    assert "non-mask elements" in top.evidence and "left out" in top.evidence
    # One cause named once: no scale mismatch at the join the sentinel explains.
    assert not [d for d in diags.items if d.tensor == "masked" and d.kind is not DiagnosticKind.SENTINEL]
    assert Diagnostics.from_dict(diags.to_dict()) == diags
    m = masked_sqnr(onnx.load(f), onnx.load(q), {"masked": (top.values["sentinel"] or 0.0, 1.0)}, data, max_samples=4)
    assert m["masked"].sentinel_elements > 0 and m["masked"].elements == 4 * T * T


def test_both_remedies_measured_better(quantized: dict[str, Path], tmp_path: Path) -> None:
    f = quantized["flt"]
    with MixedPrecisionSession(f, quantized["flt_calib"], QuantConfig(), debug_data=quantized["eval"],
                               workdir=tmp_path) as session:  # fmt: skip
        base = session.base
        ranges = {a.tensor_name: (a.float_min, a.float_max) for a in base.report.activations if a.float_min is not None}
        model = onnx.load(f)
        rems = sentinel_remedies(session.base_config, model, find_sentinels(model), ranges, samples=samples(4))
        assert [r.kind for r in rems] == [MixedRemedyKind.SENTINEL_CLAMP, MixedRemedyKind.FLOAT_FALLBACK]
        assert rems[1].config.nodes_to_exclude == ("mask_join", "mask_scale", "softmax")
        assert "no extra cost" in rems[1].note  # the CPU target's note
        results = measure_remedies(session, rems)
        for r in results:
            assert r.error is None and r.gain_db is not None and r.gain_db > 3, r.to_dict()
        with pytest.raises(Exception, match="rewrites the float model"):
            remedy_overrides(results[0], session)
