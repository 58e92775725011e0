"""Issue 14: the ``stepwise`` search strategy (the step-by-step measured greedy over the demotion sweep's ranking,
:mod:`qdebug.mixed.stepwise`) on the bundled ``digits_cnn`` sample, real ONNX Runtime quantization and debug passes:
it meets a reachable goal and stops there, keeps to its evaluation / step / cost budgets, and ``qdebug search
--strategy stepwise`` runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SAMPLE_MODELS, assert_one_line_error

from qdebug.config import QuantConfig
from qdebug.debugger import DebugOptions
from qdebug.errors import EXIT_OK, EXIT_USAGE, ConfigError
from qdebug.mixed.search import SearchGoal, SearchResult
from qdebug.mixed.session import MixedPrecisionSession
from qdebug.mixed.stepwise import Measurements, stepwise_greedy, stepwise_pool

CNN = SAMPLE_MODELS / "digits_cnn.onnx"
CALIB = SAMPLE_MODELS / "digits_calib.npz"
EVAL = SAMPLE_MODELS / "digits_eval.npz"
# Measured (ORT 1.31.1, 16 calibration / 8 debug samples): base 33.13 dB, all-16 34.47 dB; the goal all-16 − 0.5 dB
# is met after 5 kept additions (34.26 dB at 71 % of the elements), 15 greedy evaluations after a 14-evaluation sweep.
WIDE = SearchGoal(near_all16_db=0.5, strategy="stepwise", max_steps=16, candidates_per_step=3, max_evaluations=60)


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> MixedPrecisionSession:
    return MixedPrecisionSession(
        CNN, CALIB, QuantConfig(num_samples=16), debug_data=EVAL,
        debug_options=DebugOptions(ignore_data_keys=("label",), num_samples=8), workdir=tmp_path_factory.mktemp("sw"),
    )  # fmt: skip


def _greedy_evaluations(r: SearchResult) -> int:
    """Evaluations after the ceiling and the demotion sweep."""
    assert r.sensitivity is not None
    return r.evaluations - 1 - r.sensitivity.evaluations


def test_stepwise_meets_a_reachable_goal_and_stops_there(session: MixedPrecisionSession) -> None:
    s = session
    start = s.requantizations
    # 60 evaluations: room for the greedy (the default bound, 22 here, hands the goal to the prefixes:
    # test_mixed_holdout.py)
    r = s.search(WIDE)
    assert r.evaluations == s.requantizations - start
    assert r.ceiling_db is not None and s.base.output_sqnr_db is not None
    assert s.base.output_sqnr_db < r.ceiling_db - 0.5  # the goal is not met by the base: the greedy has work to do
    assert r.reached and r.stop_reason.startswith("goal met"), r.stop_reason
    assert r.final.output_sqnr_db is not None and r.final.output_sqnr_db >= r.ceiling_db - 0.5
    assert r.final.label.startswith("step ") and 0 < r.final.cost_fraction_16bit < 1
    assert r.plan is not None and set(r.plan.requested) == set(r.final.promoted)

    # Early stop: nothing was measured for a step after the one that met the goal.
    def step(label: str) -> int:
        return int(label.split(":", maxsplit=1)[0].removeprefix("step "))

    assert all(step(p.label) <= step(r.final.label) for p in r.steps if p.label != "base")
    # Every point is measured (no estimate on the curve), the front is made of them, the JSON says the strategy.
    assert all(p.output_sqnr_db is not None for p in r.steps)
    assert r.pareto() and all(p in (*r.steps, *r.evaluated) for p in r.pareto())
    d = json.loads(r.to_json())
    assert d["goal"]["strategy"] == "stepwise" and d["sensitivity"]["mode"] == "demote"


def test_stepwise_keeps_to_its_budgets(session: MixedPrecisionSession) -> None:
    s = session
    far = SearchGoal(output_sqnr_db=1e3, strategy="stepwise", candidates_per_step=2, max_steps=16, max_evaluations=60)
    r = s.search(SearchGoal(**{**far.__dict__, "max_evaluations": 25}))
    # 25 in all: the ceiling, the sweep, the greedy (⌈log2 14⌉ + 1 = 5 kept back), then the prefixes with the rest
    assert not r.reached and r.evaluations <= 25 and "max evaluations" in r.stop_reason
    assert "then prefixes" in r.stop_reason and "of 25 evaluations" in r.stop_reason
    r = s.search(SearchGoal(**{**far.__dict__, "max_steps": 1}))
    assert "max steps (1)" in r.stop_reason
    cheap = s.search(SearchGoal(**{**far.__dict__, "max_cost_fraction": 0.3}))
    assert not cheap.reached and cheap.evaluations <= 60 and "then prefixes" not in cheap.stop_reason
    assert cheap.final.cost_fraction_16bit <= 0.3  # the chosen point keeps to the budget (rejected ones may not)
    assert cheap.final.output_sqnr_db is not None and cheap.final.output_sqnr_db > s.base.output_sqnr_db


def test_greedy_core_caches_sets_and_follows_its_gains(session: MixedPrecisionSession) -> None:
    s = session
    r = s.search(WIDE)
    assert r.sensitivity is not None
    pool, share = stepwise_pool(r.sensitivity)
    assert pool and all(0 < share[c.name] <= 1 for c in pool)
    memo = Measurements(s)
    goal = r.ceiling_db - 0.5
    before = s.requantizations
    walk = stepwise_greedy(memo, r.sensitivity, lambda ev: ev.output_sqnr_db >= goal, width=3)
    assert walk.reached and walk.new == s.requantizations - before == len(walk.trials) <= walk.asked
    dbs = [s.base.output_sqnr_db, *(t.db for t in walk.path)]
    assert dbs == sorted(dbs) and len(set(dbs)) == len(dbs)  # every kept step gains
    assert all(t.db < goal for t in walk.path[:-1])  # early stop: at the first kept point that meets the goal
    assert walk.path[-1].db == r.final.output_sqnr_db  # the product search took the same steps
    # Towards an unreachable goal the same greedy walks on past it (the same first steps, from the cache).
    before = len(memo.seen)
    far = stepwise_greedy(memo, r.sensitivity, lambda ev: False, width=3)
    assert not far.reached and far.asked > walk.asked and len(far.path) > len(walk.path)
    assert [t.tensors for t in far.path[: len(walk.path)]] == [t.tensors for t in walk.path]
    assert far.new == len(memo.seen) - before < far.asked  # the shared trajectory was not measured again


def test_goal_validation() -> None:
    for bad in ({"max_cost_fraction": 0.0}, {"max_cost_fraction": 1.5}, {"max_evaluations": 0}):
        with pytest.raises(ConfigError):
            SearchGoal(near_all16_db=0.5, strategy="stepwise", **bad)


def test_cli_stepwise_search_writes_the_chosen_overrides(tmp_path: Path, run_cli) -> None:
    o = tmp_path / "o.json"
    r = run_cli("search", "-f", CNN, "--calib", CALIB, "--data", EVAL, "--debug-samples", "8",
                "--strategy", "stepwise", "--goal-near-all16", "0.5", "--candidates-per-step", "3",
                "--max-steps", "16", "--max-evaluations", "30", "--json", "-o", o)  # fmt: skip
    assert r.code == EXIT_OK, r.stderr
    d = json.loads(r.out)
    assert d["reached"] and d["goal"]["strategy"] == "stepwise" and d["goal"]["max_evaluations"] == 30
    assert o.exists() and set(json.loads(o.read_text())) >= {"schema_version"}
    bad = run_cli("search", "-f", CNN, "--strategy", "stepwise", "--goal-near-all16", "0.5",
                  "--max-cost-fraction", "2", "-o", tmp_path / "x.json")  # fmt: skip
    assert_one_line_error(bad, EXIT_USAGE, "--max-cost-fraction")  # the option, not the goal's field
