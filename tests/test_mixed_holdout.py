"""Issue 14: a search's choice checked on held-out samples (:mod:`qdebug.mixed.holdout`), and ``stepwise`` within the
issue's evaluation bound N + 2·⌈log2 N⌉ by default — on the bundled ``digits_cnn`` sample, real ONNX Runtime
quantization and debug passes.

Measured (ORT 1.31.1, 16 calibration / 8 debug samples, held out: digits_eval samples 9–72): the goal all-16 − 0.5 dB
is met on the debug samples by a 71 % prefix (34.26 dB), which gives 31.10 dB on the held-out samples against a
held-out goal of 31.22 dB: it does not hold; with the goal all-16 − 1.0 dB the choice (35 %) holds."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import SAMPLE_MODELS, assert_one_line_error

from qdebug.config import QuantConfig
from qdebug.data import Window, open_data
from qdebug.debugger import DebugOptions
from qdebug.errors import EXIT_DATA, EXIT_OK, EXIT_USAGE, DataError
from qdebug.mixed.candidates import candidates
from qdebug.mixed.holdout import HoldoutCheck, check_holdout
from qdebug.mixed.search import SCHEMA_VERSION, SearchGoal, evaluation_bound
from qdebug.mixed.session import MixedPrecisionSession
from qdebug.model_io import input_specs, load_model

CNN = SAMPLE_MODELS / "digits_cnn.onnx"
CALIB = SAMPLE_MODELS / "digits_calib.npz"
EVAL = SAMPLE_MODELS / "digits_eval.npz"


def _source() -> object:
    return open_data(EVAL, input_specs(load_model(CNN, "float model")), ignore=("label",))


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> MixedPrecisionSession:
    return MixedPrecisionSession(
        CNN, CALIB, QuantConfig(num_samples=16), debug_data=EVAL,
        debug_options=DebugOptions(ignore_data_keys=("label",), num_samples=8), workdir=tmp_path_factory.mktemp("ho"),
        holdout_data=Window(_source(), 8, 72),  # type: ignore[arg-type]
    )  # fmt: skip


def test_window_takes_the_samples_after_the_debug_ones() -> None:
    src = _source()
    w = Window(src, 8, 12)  # type: ignore[arg-type]
    got = [s["input"] for s in w]
    want = [s["input"] for i, s in enumerate(src) if 8 <= i < 12]  # type: ignore[attr-defined]
    assert len(w) == 4 and len(got) == 4 and all((a == b).all() for a, b in zip(got, want, strict=True))
    assert "samples 9-12" in w.description
    with pytest.raises(DataError, match=r"digits_eval.npz \(540 samples\): holds 540 samples; samples 531-550"):
        Window(src, 530, 550)  # type: ignore[arg-type]


def test_stepwise_keeps_to_the_evaluation_bound_by_default(session: MixedPrecisionSession) -> None:
    s = session
    n = len(candidates(s.float_proto, s.base.report))
    r = s.search(SearchGoal(near_all16_db=0.5, strategy="stepwise", max_steps=16, candidates_per_step=3))
    assert r.evaluations <= evaluation_bound(n) == n + 2 * 4  # N = 14 candidates: ⌈log2 14⌉ = 4
    assert f"of {evaluation_bound(n)} evaluations" in r.stop_reason
    # The greedy alone does not get there within the bound on this model; the prefixes of its ranking do.
    assert r.reached and "goal met by a prefix" in r.stop_reason, r.stop_reason
    assert r.final.output_sqnr_db is not None and r.ceiling_db is not None
    assert r.final.output_sqnr_db >= r.ceiling_db - 0.5
    # A user's budget is the whole search's, the ceiling and the sweep included.
    small = s.search(SearchGoal(output_sqnr_db=1e3, strategy="stepwise", candidates_per_step=2, max_evaluations=9))
    assert small.evaluations <= 9 and not small.reached and "of 9 evaluations" in small.stop_reason


def test_a_choice_that_does_not_hold_is_said(session: MixedPrecisionSession) -> None:
    s = session
    before = s.requantizations
    r = s.search(SearchGoal(near_all16_db=0.5, strategy="stepwise", max_steps=16, candidates_per_step=3))
    h = r.holdout
    assert h is not None and h.samples == 64 and r.evaluations == s.requantizations - before  # not search evaluations
    assert h.base_db is not None and h.ceiling_db is not None and h.goal_db == pytest.approx(h.ceiling_db - 0.5)
    first = h.points[0]
    assert first.label == r.final.label and first.search_db == r.final.output_sqnr_db
    assert first.holdout_db is not None and first.search_db is not None and first.holdout_db < first.search_db
    assert not h.holds and not h.moved and not first.holds and "does NOT hold" in h.note
    assert h.evaluations == 2 + len(h.points)  # base, all-16, each point checked
    d = json.loads(r.to_json())
    assert d["schema_version"] == SCHEMA_VERSION == 4 and d["goal"]["holdout_checks"] == 3
    assert HoldoutCheck.from_dict(d["holdout"]) == h
    ok = s.search(SearchGoal(near_all16_db=1.0, strategy="stepwise", max_steps=16, candidates_per_step=3))
    assert ok.holdout is not None and ok.holdout.holds and not ok.holdout.moved and "holds" in ok.holdout.note


def test_a_choice_that_does_not_hold_moves_to_the_next_front_point_that_does(session: MixedPrecisionSession) -> None:
    s = session
    r = s.search(SearchGoal(near_all16_db=0.5, strategy="measured", max_steps=16))
    ceiling = s.evaluate(s.base.config.replace(activation_type="uint16", tensor_overrides=()), name="all16")
    front = [p for p in r.pareto() if p.label != "all16" and p.promoted]
    # Pretend the search chose the cheapest promotion of the front, with a goal every front point meets on the debug
    # samples: the check walks up the front until a point holds on the held-out samples.
    cheap = front[0]
    i = next(i for i, p in enumerate(r.steps) if p is cheap)
    forced = replace(r, steps=tuple(replace(p, chosen=j == i) for j, p in enumerate(r.steps)), chosen_step=i)
    search_goal = min(p.output_sqnr_db for p in front if p.output_sqnr_db is not None)
    out = check_holdout(s, replace(r.goal, holdout_checks=len(front)), search_goal, forced, ceiling)
    h = out.holdout
    assert h is not None and h.goal_db is not None
    assert [p.label for p in h.points] == [p.label for p in front[: len(h.points)]]
    assert not h.points[0].holds and h.holds and h.moved and "chosen instead" in h.note
    assert h.points[-1].holdout_db is not None and h.points[-1].holdout_db >= h.goal_db
    assert out.final.label == h.points[-1].label and out.final.chosen
    assert sum(p.chosen for p in out.steps) == 1
    assert out.plan is not None and set(out.plan.requested) == set(out.final.promoted)


def test_cli_holdout_samples(tmp_path: Path, run_cli) -> None:
    o = tmp_path / "o.json"
    r = run_cli("search", "-f", CNN, "--calib", CALIB, "--data", EVAL, "--debug-samples", "8",
                "--holdout-samples", "64", "--strategy", "stepwise", "--goal-near-all16", "1.0",
                "--candidates-per-step", "3", "--max-steps", "16", "-o", o)  # fmt: skip
    assert r.code == EXIT_OK, r.stderr
    assert "Held out: the choice measured again on 64 samples" in r.out and "held out: the choice " in r.out
    # here (all 128 calibration samples) the choice fits the 8 debug samples only: a warning, the overrides written
    assert "the choice does NOT hold" in r.out and "qdebug: warning: held out: the choice does NOT hold" in r.stderr
    assert o.exists()
    bad = run_cli("search", "-f", CNN, "--calib", CALIB, "--data", EVAL, "--debug-samples", "8",
                  "--holdout-samples", "600", "--goal-near-all16", "0.5", "-o", tmp_path / "x.json")  # fmt: skip
    assert_one_line_error(bad, EXIT_DATA, "digits_eval.npz", "samples 9-608")
    same = run_cli("search", "-f", CNN, "--calib", CALIB, "--data", EVAL, "--holdout", EVAL,
                   "--goal-near-all16", "0.5", "-o", tmp_path / "y.json")  # fmt: skip
    assert_one_line_error(same, EXIT_USAGE, "is the debug data")
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "y.json").exists()
