"""Diagnostics (qdebug.diagnose, docs/diagnostics.md): each purpose-built example model shows exactly its problem,
named on the right tensor with evidence and a remedy; the statistics are mergeable; results round-trip."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from diag_models import EXAMPLES

from qdebug.activation_stats import TensorStats
from qdebug.debugger import DebugOptions, debug
from qdebug.diagnose import diagnose, diagnose_models
from qdebug.findings import DiagnosticKind, Diagnostics, RemedyKind, Severity
from qdebug.report import DebugReport

REMEDY = {
    "outlier_range": RemedyKind.PROMOTE_16BIT,
    "negative_unsigned": RemedyKind.PROMOTE_16BIT,
    "wasted_range": RemedyKind.PROMOTE_16BIT,
    "saturation": RemedyKind.PERCENTILE_CALIBRATION,
    "scale_mismatch": RemedyKind.PROMOTE_16BIT,
    "per_channel_weight": RemedyKind.PER_CHANNEL,
    "precision_cliff": RemedyKind.PROMOTE_16BIT,
    "bad_qparams": RemedyKind.FIX_QPARAMS,
}


@pytest.fixture(scope="module")
def example_results() -> dict[str, tuple[DebugReport, Diagnostics]]:
    out = {}
    for kind, (build, _) in EXAMPLES.items():
        f, q = build()
        report = debug(f, q, None, DebugOptions(num_samples=4))
        out[kind] = (report, diagnose_models(report, f, q, max_samples=4))
    return out


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_example_model_shows_exactly_its_problem(
    kind: str, example_results: dict[str, tuple[DebugReport, Diagnostics]]
) -> None:
    _, diags = example_results[kind]
    tensor = EXAMPLES[kind][1]
    assert [(d.kind.value, d.tensor) for d in diags.items] == [(kind, tensor)], diags.to_json()
    d = diags.items[0]
    assert d.remedy.kind is REMEDY[kind]
    assert tensor in d.remedy.tensors
    assert d.evidence and d.values  # numbers behind the sentence
    assert diags.stats_samples == 4
    assert set(diags.checks) == set(DiagnosticKind)


def test_evidence_numbers(example_results: dict[str, tuple[DebugReport, Diagnostics]]) -> None:
    outlier = example_results["outlier_range"][1].items[0]
    assert outlier.values["ratio"] is not None and outlier.values["ratio"] > 100  # one value of 16384 is x1000
    sat = example_results["saturation"][1].items[0]
    assert sat.values["clipped_fraction"] == pytest.approx(0.5, abs=0.1)  # x*2 on a [0, 1] grid
    wasted = example_results["wasted_range"][1].items[0]
    assert wasted.values["wasted_bits"] == pytest.approx(math.log2(100), abs=0.2)  # 1% of the codes used
    mismatch = example_results["scale_mismatch"][1].items[0]
    assert mismatch.values["scale_ratio"] == pytest.approx(1000, rel=1e-3)
    assert mismatch.severity is Severity.WARNING  # Concat; an Add would be a note
    pc = example_results["per_channel_weight"][1].items[0]
    assert pc.values["channel_ratio"] is not None and pc.values["channel_ratio"] > 100
    assert pc.remedy.overrides() == {"W": [{"axis": 0}]}
    bad = example_results["bad_qparams"][1].items[0]
    assert bad.severity is Severity.ERROR and "scale -0.01" in bad.evidence


def test_report_only_checks_without_models(example_results: dict[str, tuple[DebugReport, Diagnostics]]) -> None:
    """From a saved report alone: the checks that need no statistics or constants still find their problem."""
    for kind in ("negative_unsigned", "wasted_range", "scale_mismatch", "bad_qparams"):
        report = DebugReport.from_json(example_results[kind][0].to_json())
        diags = diagnose(report)
        assert [d.kind.value for d in diags.items] == [kind]
        assert diags.stats_samples == 0
        assert DiagnosticKind.OUTLIER_RANGE not in diags.checks


def test_well_quantized_model_has_no_warnings(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    """A conv net quantized by qdebug on its own (synthetic) calibration data: nothing worth a warning."""
    q = tiny_quant("u8")
    report = debug(tiny_float, q, None, DebugOptions(num_samples=4))
    diags = diagnose_models(report, tiny_float, q, max_samples=4)
    assert not [d for d in diags.items if d.severity is not Severity.INFO], diags.to_json()


def test_round_trip_and_dataframe(example_results: dict[str, tuple[DebugReport, Diagnostics]]) -> None:
    diags = Diagnostics(
        tuple(d for _, ds in example_results.values() for d in ds.items), 4, tuple(DiagnosticKind)
    )  # fmt: skip
    text = diags.to_json()
    assert json.loads(text)["schema_version"] == 1
    back = Diagnostics.from_dict(json.loads(text))
    assert back == diags
    df = diags.to_dataframe()
    assert list(df["kind"]) == [d.kind.value for d in diags.items]
    assert {"severity", "tensor", "evidence", "remedy"} <= set(df.columns)
    assert diags.overrides()["m"] == [{"quant_type": "QUInt16"}]


def test_stats_merge_exactly_and_percentiles() -> None:
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(5000).astype(np.float32) for _ in range(3)]
    grid = (-2.0, 2.0, 4.0 / 255)
    one = TensorStats()
    for x in xs:
        one.update(x, grid)
    parts = []
    for x in xs:
        s = TensorStats()
        s.update(x, grid)
        parts.append(s)
    merged = parts[0].merge(parts[1]).merge(parts[2])
    assert merged.count == one.count == 15000
    assert np.array_equal(merged.hist, one.hist)
    assert (merged.clipped_low, merged.clipped_high, merged.negative) == (
        one.clipped_low,
        one.clipped_high,
        one.negative,
    )
    allx = np.abs(np.concatenate(xs))
    assert merged.clipped_low + merged.clipped_high == np.count_nonzero(allx > 2.0 + grid[2] / 2)
    for q in (50, 99, 99.99):
        # the upper edge of a quarter-octave bin: at most 25% above the true percentile, never below it
        assert np.percentile(allx, q) <= merged.abs_percentile(q) <= 1.25 * np.percentile(allx, q) + 1e-6
    assert merged.abs_percentile(100) == pytest.approx(float(allx.max()))


def test_scale_mismatch_compares_ranges_across_types() -> None:
    """A uint16 and a uint8 input of the same range have scales 257x apart, yet lose nothing: no diagnostic."""
    from builders import _model, value_info
    from diag_models import insert_qdq
    from onnx import helper, numpy_helper

    k = numpy_helper.from_array(np.array(2.0, np.float32), "k")
    nodes = [
        helper.make_node("Mul", ["x", "k"], ["a"], name="mul"),
        helper.make_node("Add", ["a", "x"], ["s"], name="add"),
        helper.make_node("Neg", ["s"], ["y"], name="neg"),
    ]
    f = _model(nodes, [value_info("x", [1, 16])], [value_info("y", [1, 16])], [k], opset=21)  # 16-bit Q/DQ
    q = insert_qdq(f, {"x": (2.0 / 65535, 0, np.uint16), "a": (2.0 / 255, 0, np.uint8), "s": (3.0 / 255, 0, np.uint8)})
    report = debug(f, q, None, DebugOptions(num_samples=2))
    assert not diagnose(report).of_kind(DiagnosticKind.SCALE_MISMATCH)
