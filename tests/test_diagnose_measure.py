"""Diagnose → fix (issue 35, deliverable 5): calibrated gain estimates (no saturated "+48.2 dB"; bounded by the noise
budget, by a measured ceiling, ~0 when the consumer re-quantizes on as coarse a grid) and ``qdebug diagnose
--measure`` (every diagnosis' remedy measured on real quantizations, ranked by measured gain, predicted beside)."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_sentinel import attention, npz, samples

from qdebug.cli import main
from qdebug.config import QuantConfig
from qdebug.debugger import debug
from qdebug.mixed.gains import DiagnosisGain, DiagnosisGains, rank_by_measured
from qdebug.mixed.suggest import SIXTEEN_BIT_NOISE_FACTOR, analyse, noise_budget
from qdebug.quantizer import quantize

SATURATED = -10 * math.log10(1 / SIXTEEN_BIT_NOISE_FACTOR)  # 48.16 dB: 8 bits × 6.02


def chain(seed: int = 0) -> onnx.ModelProto:
    """x → MatMul → Mul (coarse: the worst local) → Reshape (re-quantizes on the Mul's grid) → MatMul → Add → y."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.3, (32, 32)).astype(np.float32), "W1"),
        numpy_helper.from_array(rng.normal(0, 0.3, (32, 32)).astype(np.float32), "W2"),
        numpy_helper.from_array(np.array(40.0, np.float32), "k"),
        numpy_helper.from_array(np.array([1, 32], np.int64), "shape"),
        numpy_helper.from_array(rng.normal(0, 0.1, (32,)).astype(np.float32), "b"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], "mm1"),
        helper.make_node("Mul", ["h", "k"], ["big"], "scale"),
        helper.make_node("Reshape", ["big", "shape"], ["flat"], "reshape"),
        helper.make_node("MatMul", ["flat", "W2"], ["h2"], "mm2"),
        helper.make_node("Add", ["h2", "b"], ["y"], "bias"),
    ]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])], inits,
    )  # fmt: skip
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.fixture(scope="module")
def chain_report(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    d = tmp_path_factory.mktemp("chain")
    f = d / "chain.onnx"
    onnx.save(chain(), f)
    rng = np.random.default_rng(1)
    data = d / "data.npz"
    np.savez(data, x=rng.normal(0, 1, (8, 1, 32)).astype(np.float32))
    quantize(f, data, QuantConfig(), d / "chain.qdq.onnx", check=False)
    return debug(f, d / "chain.qdq.onnx", data)


def test_estimates_never_saturate_and_stay_within_the_noise_budget(chain_report) -> None:  # type: ignore[no-untyped-def]
    budget = noise_budget(chain_report)
    assert budget > 0
    for s in analyse(chain_report):
        assert s.estimated_output_gain_db < SATURATED - 1, s
        a = next(a for a in chain_report.activations if a.tensor_name == s.tensor_name)
        share = 10 ** (-(a.local_sqnr_db or 0.0) / 10) / budget  # its part of every rounding that reaches the output
        assert s.estimated_output_gain_db <= -10 * math.log10(max(1e-12, 1 - min(share, 1 - 1e-12))) + 1e-9


def test_a_measured_ceiling_bounds_every_estimate(chain_report) -> None:  # type: ignore[no-untyped-def]
    out = chain_report.min_output_sqnr_db
    for s in analyse(chain_report, ceiling_db=out + 0.5):
        assert s.estimated_output_gain_db <= 0.5 + 1e-9


def test_a_consumer_that_requantizes_on_the_same_grid_gets_zero(chain_report) -> None:  # type: ignore[no-untyped-def]
    big = next(a for a in chain_report.activations if a.tensor_name == "big")
    flat = next(a for a in chain_report.activations if a.tensor_name == "flat")
    assert flat.producer_op == "Reshape" and flat.quantized and flat.scale >= 0.5 * big.scale  # the premise
    (s,) = [s for s in analyse(chain_report) if s.tensor_name == "big"]
    assert s.estimated_output_gain_db == 0.0
    if s.role == "originator":
        assert "re-quantize" in s.reason


def test_ranked_by_measured_gain_never_a_no_gain_fix_first() -> None:
    g = [
        DiagnosisGain("a", "precision_cliff", "promote_16bit", "t", 30.0, 0.05, 1.0),
        DiagnosisGain("b", "per_channel_weight", "per_channel", "t", 0.5, 2.0, 3.0),
        DiagnosisGain("c", "saturation", "percentile_calibration", "t", None, None, None, "failed"),
        DiagnosisGain("d", "wasted_range", "promote_16bit", "t", 1.0, -0.3, 0.7),
    ]
    ranked = rank_by_measured(g)
    assert [x.tensor for x in ranked] == ["b", "a", "d", "c"]
    gains = DiagnosisGains(1.0, ranked, 5.0)
    assert gains.median_abs_error_db == pytest.approx(1.5)  # of |0.5 − 2|, |30 − 0.05|, |1 + 0.3|
    assert DiagnosisGains.from_dict(json.loads(json.dumps(gains.to_dict()))) == gains


# ---------------------------------------------------------------------------------------------- the CLI
@pytest.fixture(scope="module")
def sentinel_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("measure")
    f = d / "att.onnx"
    onnx.save(attention(), f)
    calib = npz(d / "calib.npz", samples(16, seed=2))
    quantize(f, calib, QuantConfig(), d / "att.qdq.onnx", check=False)
    return {"f": f, "q": d / "att.qdq.onnx", "calib": calib, "eval": npz(d / "eval.npz", samples(6, seed=3))}


def test_diagnose_measure_ranks_fixes_by_measured_gain(sentinel_files: dict[str, Path]) -> None:
    f = sentinel_files
    argv = ["diagnose", "-f", str(f["f"]), "-q", str(f["q"]), "-d", str(f["eval"]), "--calib", str(f["calib"]),
            "--measure", "--stats-samples", "4"]  # fmt: skip
    out = io.StringIO()
    assert main([*argv, "--json"], out) == 0
    doc = json.loads(out.getvalue())
    measured = doc["measured"]["items"]
    kinds = [m["remedy"] for m in measured]
    assert {"sentinel_clamp", "float_fallback"} <= set(kinds)
    gains = [m["measured_gain_db"] for m in measured if m["measured_gain_db"] is not None]
    assert gains == sorted(gains, reverse=True) and gains[0] > 0.1 and measured[0]["helps"]
    text = io.StringIO()
    assert main(argv, text) == 0
    shown = text.getvalue()
    assert "Fixes measured (gain at the worst output" in shown
    first = shown.split("Fixes measured", 1)[1].splitlines()[1]
    assert first.lstrip().startswith("1.") and "(no gain" not in first


def test_measure_options_need_measure(sentinel_files: dict[str, Path]) -> None:
    f = sentinel_files
    err = io.StringIO()
    code = main(["diagnose", "-f", str(f["f"]), "-q", str(f["q"]), "-d", str(f["eval"]), "--calib", str(f["calib"])],
                err)  # fmt: skip
    assert code == 2


def test_every_remedy_kind_is_measured_before_a_second_of_any() -> None:
    from qdebug.findings import Diagnostic, DiagnosticKind, Diagnostics, Remedy, RemedyKind, Severity
    from qdebug.mixed.diagnosis import select_for_measure

    def diag(t: str, kind: RemedyKind) -> Diagnostic:
        return Diagnostic(DiagnosticKind.SATURATION, Severity.WARNING, t, "Add", "e", Remedy(kind, (t,), "r"))

    items = [diag(f"s{i}", RemedyKind.PERCENTILE_CALIBRATION) for i in range(5)] + [diag("w", RemedyKind.PER_CHANNEL)]
    chosen = select_for_measure(Diagnostics(tuple(items)), 3)
    assert [d.tensor for d in chosen.items] == ["s0", "s1", "w"]


def test_per_channel_prediction_from_the_weight_values() -> None:
    from diag_models import per_channel_weight

    from qdebug.debugger import DebugOptions
    from qdebug.graph_index import GraphIndex
    from qdebug.mixed.diagnosis import predicted_per_channel_gain

    f, q = per_channel_weight()  # one output channel 1000x the others on one int8 scale: its noise is the output's
    report = debug(f, q, None, DebugOptions(num_samples=4))
    gain = predicted_per_channel_gain(report, GraphIndex(f), [("W", "MatMul")])
    assert 1.0 < gain < SATURATED
    assert predicted_per_channel_gain(report, GraphIndex(f), []) == 0.0
