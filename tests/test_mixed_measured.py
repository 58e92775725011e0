"""Issue 14: candidate groups, measured sensitivity (predicted vs measured), the ``measured`` search with its
Pareto front, and the measured remedies — on a purpose-built block (decomposed LayerNorm + attention) and
``tiny_convnet``, with real ONNX Runtime quantization and debug passes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import builders
import numpy as np
import onnx
import pytest
from conftest import assert_one_line_error
from onnx import TensorProto, helper, numpy_helper

from qdebug.config import QuantConfig
from qdebug.debugger import DebugOptions
from qdebug.errors import EXIT_OK, EXIT_USAGE
from qdebug.graph_index import GraphIndex
from qdebug.mixed.candidates import CandidateKind, _attention_groups, _layernorm_groups, candidates
from qdebug.mixed.overrides import OverridesFile
from qdebug.mixed.remedies import (
    RemedyKind,
    measure_remedies,
    method_ranges,
    propose_remedies,
    remedy_overrides,
)
from qdebug.mixed.search import STRATEGIES, SearchGoal
from qdebug.mixed.session import MixedPrecisionSession


def _block(seed: int = 0) -> onnx.ModelProto:
    """x[1,6,8] → MatMul → decomposed LayerNorm (ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div, Mul/Add) → q,k,v →
    MatMul(q, kᵀ) → Mul(scale) → Softmax → MatMul(·, v) → MatMul → y."""
    rng = np.random.default_rng(seed)

    def w(name: str, shape: tuple[int, ...], s: float = 0.5) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * s).astype(np.float32), name)

    inits = [
        w("W0", (8, 8)), w("Wq", (8, 8)), w("Wk", (8, 8)), w("Wv", (8, 8)), w("Wo", (8, 8)),
        w("gamma", (8,), 0.2), w("beta", (8,), 0.1),
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
        numpy_helper.from_array(np.array(0.35, np.float32), "scale"),
    ]  # fmt: skip
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "W0"], ["h"], name="mm0"),
        n("ReduceMean", ["h"], ["mean"], name="ln_mean", axes=[-1]),
        n("Sub", ["h", "mean"], ["d"], name="ln_sub"),
        n("Pow", ["d", "two"], ["p"], name="ln_pow"),
        n("ReduceMean", ["p"], ["var"], name="ln_var", axes=[-1]),
        n("Add", ["var", "eps"], ["ve"], name="ln_add"),
        n("Sqrt", ["ve"], ["sd"], name="ln_sqrt"),
        n("Div", ["d", "sd"], ["nrm"], name="ln_div"),
        n("Mul", ["nrm", "gamma"], ["g"], name="ln_gamma"),
        n("Add", ["g", "beta"], ["ln"], name="ln_beta"),
        n("MatMul", ["ln", "Wq"], ["q"], name="mq"),
        n("MatMul", ["ln", "Wk"], ["k"], name="mk"),
        n("MatMul", ["ln", "Wv"], ["v"], name="mv"),
        n("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
        n("MatMul", ["q", "kt"], ["scores"], name="qk"),
        n("Mul", ["scores", "scale"], ["scaled"], name="scale_mul"),
        n("Softmax", ["scaled"], ["probs"], name="softmax", axis=-1),
        n("MatMul", ["probs", "v"], ["ctx"], name="av"),
        n("MatMul", ["ctx", "Wo"], ["y"], name="mo"),
    ]
    return builders._model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 8])],
        inits,
    )


LAYERNORM = ["mean", "d", "p", "var", "ve", "sd", "nrm", "g", "ln"]
ATTENTION = ["scores", "scaled", "probs", "ctx"]


@pytest.fixture(scope="module")
def block_session(tmp_path_factory: pytest.TempPathFactory) -> MixedPrecisionSession:
    d = tmp_path_factory.mktemp("block")
    onnx.save(_block(), str(d / "block.onnx"))
    rng = np.random.default_rng(3)
    np.savez(d / "calib.npz", x=rng.standard_normal((8, 1, 6, 8)).astype(np.float32))
    np.savez(d / "eval.npz", x=rng.standard_normal((8, 1, 6, 8)).astype(np.float32))
    return MixedPrecisionSession(
        d / "block.onnx", d / "calib.npz", QuantConfig(num_samples=8), debug_data=d / "eval.npz",
        debug_options=DebugOptions(num_samples=8), workdir=d / "work",
    )  # fmt: skip


def test_groups_are_found_in_the_graph() -> None:
    ix = GraphIndex(_block())
    assert _layernorm_groups(ix) == [LAYERNORM]
    assert _attention_groups(ix) == [ATTENTION]


def test_candidates_merge_groups_and_rank_by_estimate(block_session: MixedPrecisionSession) -> None:
    cands = candidates(block_session.float_proto, block_session.base.report)
    kinds = {c.kind: c for c in cands if c.kind != CandidateKind.TENSOR}
    assert set(kinds) == {CandidateKind.LAYERNORM, CandidateKind.ATTENTION}
    grouped = {t for c in kinds.values() for t in c.tensors}
    assert set(kinds[CandidateKind.ATTENTION].tensors) <= set(ATTENTION)
    assert len(kinds[CandidateKind.LAYERNORM].tensors) >= 2
    singles = [c.tensors[0] for c in cands if c.kind == CandidateKind.TENSOR]
    assert not grouped & set(singles)  # a grouped tensor is never also its own candidate
    gains = [c.estimated_output_gain_db for c in cands]
    assert gains == sorted(gains, reverse=True)
    assert json.loads(json.dumps([c.to_dict() for c in cands]))


def test_measured_search_front_and_predicted_vs_measured(block_session: MixedPrecisionSession) -> None:
    s = block_session
    start = s.requantizations
    # all-16 is only ~0.5 dB above the base here (the weights dominate): a goal 0.1 dB below it is one the base misses
    r = s.search(SearchGoal(near_all16_db=0.1, strategy="measured", measure_top=3, max_steps=8))
    assert r.evaluations == s.requantizations - start
    sens = r.sensitivity
    assert sens is not None and len(sens.measured) == 3
    for m in sens.measured:  # every single measured, with the estimate it was ranked by next to it
        assert m.error is None and m.measured_gain_db is not None
        assert math.isclose(m.measured_gain_db, m.output_sqnr_db - s.base.output_sqnr_db)
        assert m.predicted_gain_db == m.candidate.estimated_output_gain_db
    ranked = [c.name for c in sens.ranking()[:3]]
    by_gain = sorted(sens.measured, key=lambda m: -(m.measured_gain_db or 0.0))
    assert ranked[0] == by_gain[0].candidate.name  # the ranking follows the measured gain
    assert r.ceiling_db is not None
    labels = {p.label for p in (*r.steps, *r.evaluated)}
    assert {"base", "all16"} <= labels
    # Budget: singles + prefix probes (+ the all-16 ceiling).
    assert r.evaluations <= 3 + 8 + 1
    front = r.pareto()
    assert front and all(p in (*r.steps, *r.evaluated) for p in front)
    costs = [p.cost_fraction_16bit for p in front]
    assert costs == sorted(costs)
    dbs = [p.output_sqnr_db for p in front]
    assert dbs == sorted(dbs)
    if r.reached:
        assert r.final.output_sqnr_db >= r.ceiling_db - 0.1
        assert r.plan is not None and set(r.plan.requested) == set(r.final.promoted)
    by_converts = r.pareto(cost="converts")
    assert by_converts and all(p.label != "all16" for p in by_converts)
    assert [p.num_converts for p in by_converts] == sorted(p.num_converts for p in by_converts)
    assert any(p.num_converts > 0 for p in (*r.steps, *r.evaluated))  # a promotion has 8/16-bit boundaries
    d = json.loads(json.dumps(r.to_dict()))
    assert d["sensitivity"]["measured"] and d["pareto"] and d["ceiling_db"] is not None


def test_goal_validation() -> None:
    from qdebug.errors import ConfigError

    with pytest.raises(ConfigError, match="near_all16_db"):
        SearchGoal(near_all16_db=-1.0)
    with pytest.raises(ConfigError, match="strategy"):
        SearchGoal(output_sqnr_db=1.0, strategy="beam")


def test_cli_and_library_strategies_agree() -> None:
    from qdebug.cli import search as cli_search

    assert cli_search.STRATEGIES == STRATEGIES


def test_remedies_are_measured_and_end_in_a_checked_overrides_file(tmp_path: Path) -> None:
    onnx.save(builders.tiny_convnet(), str(tmp_path / "m.onnx"))
    cfg = QuantConfig(num_samples=8, target="qnn")
    with MixedPrecisionSession(
        tmp_path / "m.onnx", None, cfg, debug_options=DebugOptions(num_samples=8, seed=1), workdir=tmp_path / "w"
    ) as s:
        ranges = {"percentile": method_ranges(s, "percentile")}
        remedies = propose_remedies(s.base_config, s.base.report, calibration_ranges=ranges)
        kinds = {r.kind for r in remedies}
        assert {RemedyKind.PER_CHANNEL_WEIGHTS, RemedyKind.WEIGHTS_16BIT, RemedyKind.CALIBRATION} <= kinds
        w16 = next(r for r in remedies if r.kind == RemedyKind.WEIGHTS_16BIT)
        assert "v73" in w16.note  # the QNN target's own note (Target.sixteen_bit_weights_note)
        results = measure_remedies(s, remedies)
        assert all(r.error is None and r.gain_db is not None for r in results)
        best = max(results, key=lambda r: r.gain_db or 0.0)
        assert best.recommended
        path = remedy_overrides(best, s).save(tmp_path / "remedy.json")
        not_better = [r for r in results if not r.recommended]
        for r in not_better:  # nothing is recommended that was not measured better
            with pytest.raises(Exception, match="not recommended"):
                remedy_overrides(r, s)
    ofile = OverridesFile.load(path)
    assert ofile.base_config is not None and "+" in ofile.note


def test_cli_measured_search_shows_front_and_remedies(tmp_path: Path, run_cli) -> None:
    onnx.save(builders.tiny_convnet(), str(tmp_path / "m.onnx"))
    o, rem = tmp_path / "o.json", tmp_path / "remedy.json"
    r = run_cli("search", "-f", tmp_path / "m.onnx", "--debug-samples", "8", "--strategy", "measured",
                "--measure-top", "2", "--goal-near-all16", "0", "--max-steps", "4", "--remedies",
                "--remedy-output", rem, "-o", o)  # fmt: skip
    assert r.code in (EXIT_OK, 10), r.stderr
    assert "predicted vs measured" in r.out and "Pareto front" in r.out and "Remedies" in r.out
    assert "all-16-bit" in r.out
    if rem.exists():
        assert OverridesFile.load(rem).base_config is not None
    bad = run_cli("search", "-f", tmp_path / "m.onnx", "--goal-sqnr", "9", "--remedy-output", rem, "-o", o)
    assert_one_line_error(bad, EXIT_USAGE, "--remedies")


def test_ui_does_not_apply_the_all16_point_as_a_promotion(tiny_float: Path, tmp_path: Path) -> None:
    from conftest import TINY_CONFIGS

    from qdebug.mixed.search import SearchPoint, SearchResult
    from widgets.app import DebuggerApp
    from widgets.session import QuantDebugger

    dbg = QuantDebugger(tiny_float, config=TINY_CONFIGS["u8"], workdir=tmp_path / "work")
    app = DebuggerApp(dbg)
    base = SearchPoint(0, (), 0.0, 0, 20.0, None, True, 0.1, "base")
    all16 = SearchPoint(-1, (), 1.0, 9, 30.0, None, False, 0.1, "all16")
    app.last_search = SearchResult(
        goal=SearchGoal(near_all16_db=0.5), steps=(base,), evaluated=(all16,), reached=True, stop_reason="goal",
        requantizations=1, seconds=0.1, float_accuracy=None, chosen_step=0, ceiling_db=30.0,
    )  # fmt: skip
    app.on_pareto_point(-1)
    assert "ceiling" in app.status and dbg.history == ()


def test_suggest_groups_expands_a_member_to_its_group(block_session: MixedPrecisionSession) -> None:
    from qdebug.cli.suggest import _with_groups

    cands = candidates(block_session.float_proto, block_session.base.report)
    ln = next(c for c in cands if c.kind == CandidateKind.LAYERNORM)
    got = _with_groups(str(block_session.float_path), block_session.base.report, [ln.tensors[-1], "y"])
    assert got == [*ln.tensors, "y"]  # the member brings its whole group; a tensor in no group stays alone


def test_smallest_passing_prefix_from_any_start_finds_the_threshold() -> None:
    from qdebug.mixed.search_base import smallest_passing_prefix

    n_max = 37
    bound = 2 * math.ceil(math.log2(n_max)) + 2
    for threshold in range(1, n_max + 1):
        for start in (1, 2, threshold, threshold + 3, n_max):
            probed: list[int] = []

            def meets(n: int, t: int = threshold, seen: list[int] = probed) -> bool:
                seen.append(n)
                return n >= t

            lo, hi = smallest_passing_prefix(n_max, meets, start=start)
            assert (lo, hi) == (threshold - 1, threshold), (threshold, start, probed)
            assert len(probed) <= bound and len(set(probed)) == len(probed)
    assert smallest_passing_prefix(8, lambda n: False) == (8, None)
    assert smallest_passing_prefix(8, lambda n: True, budget=0) == (0, None)


def test_efficient_search_demotes_blocks_and_ranks_by_noise_per_element(
    block_session: MixedPrecisionSession,
) -> None:
    s = block_session
    start = s.requantizations
    n = len(candidates(s.float_proto, s.base.report))
    r = s.search(SearchGoal(near_all16_db=0.1, strategy="efficient", max_steps=8))
    assert r.evaluations == s.requantizations - start
    assert r.evaluations <= n + 2 * math.ceil(math.log2(n)) + 2 + 1  # sweep + prefixes (+ the ceiling)
    sens = r.sensitivity
    assert sens is not None and str(sens.mode) == "demote" and sens.measured
    assert sens.base_output_sqnr_db == r.ceiling_db  # demotions are measured against the all-16-bit model
    # The leaves cover every candidate once; each demotion lowers (or keeps) the ceiling's SQNR.
    covered = [t for m in sens.measured for t in m.candidate.tensors]
    assert sorted(covered) == sorted(t for c in candidates(s.float_proto, s.base.report) for t in c.tensors)
    for m in sens.measured:
        assert m.error is None and m.output_sqnr_db is not None and 0 < m.cost_fraction_16bit <= 1
        assert math.isclose(m.measured_gain_db, r.ceiling_db - m.output_sqnr_db)
    effs = [sens.efficiency(m) for m in sens.measured]
    ranked = sens.ranking("efficiency")
    assert ranked[0] == sens.measured[effs.index(max(effs))].candidate
    front = r.pareto()
    assert front and all(p in (*r.steps, *r.evaluated) for p in front)
    if r.reached:
        assert r.final.output_sqnr_db >= r.ceiling_db - 0.1
    d = json.loads(json.dumps(r.to_dict()))
    assert d["sensitivity"]["mode"] == "demote" and d["goal"]["strategy"] == "efficient"


@pytest.mark.parametrize("strategy", ["prefix", "greedy"])
def test_prefix_and_greedy_promote_groups_whole(block_session: MixedPrecisionSession, strategy: str) -> None:
    s = block_session
    groups = [set(c.tensors) for c in candidates(s.float_proto, s.base.report) if len(c.tensors) > 1]
    assert len(groups) == 2
    r = s.search(SearchGoal(output_sqnr_db=1e3, strategy=strategy, max_steps=3, candidates_per_step=2))
    points = [p for p in (*r.steps, *r.evaluated) if p.promoted]
    assert points
    for p in points:  # a group is in a promotion set whole or not at all
        for g in groups:
            assert not (g & set(p.promoted)) or g <= set(p.promoted), (p.label, g - set(p.promoted))
    assert any(any(g <= set(p.promoted) for g in groups) for p in points)


def test_cli_efficient_search_prints_the_demotion_table(tmp_path: Path, run_cli) -> None:
    onnx.save(builders.tiny_convnet(), str(tmp_path / "m.onnx"))
    o = tmp_path / "o.json"
    r = run_cli("search", "-f", tmp_path / "m.onnx", "--debug-samples", "4", "--strategy", "efficient",
                "--goal-near-all16", "0.2", "--max-steps", "4", "-o", o)  # fmt: skip
    assert r.code in (EXIT_OK, 10), r.stderr
    assert "left in 8 bits alone in the all-16-bit model" in r.out and "noise/element" in r.out
    assert "Pareto front" in r.out and "all-16-bit" in r.out
    assert o.exists() == (r.code == EXIT_OK)
