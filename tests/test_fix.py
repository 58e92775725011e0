"""``qdebug fix`` and :func:`qdebug.fix.fix` on real tiny models (ONNX Runtime, never mocked)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from qdebug.cli import main
from qdebug.errors import EXIT_GATE, EXIT_OK, EXIT_USAGE, ConfigError
from qdebug.fix import FixOptions, FixResult, Stage, fix
from qdebug.fix.probe import OutputProbe
from qdebug.fix.space import Block, Unit, UnitKind, initial_blocks
from tests.test_ptq import nncf, nncf_env  # noqa: F401 — fixtures: NNCF's environment (fails under CI=true)
from tests.test_sentinel import attention, npz, samples

SAMPLES = Path(__file__).resolve().parents[1] / "sample_models"
CNN, CALIB = SAMPLES / "digits_cnn.onnx", SAMPLES / "digits_calib.npz"


@pytest.fixture(scope="module")
def cnn_fix(tmp_path_factory: pytest.TempPathFactory) -> FixResult:
    work = tmp_path_factory.mktemp("fix")
    return fix(CNN, CALIB, FixOptions(libraries=(), max_trials=24, metric="top1"), workdir=work)


def test_every_stage_measured_and_nothing_worse_than_its_start(cnn_fix: FixResult) -> None:
    r = cnn_fix
    base, best8, chosen = (r.trial(n) for n in (r.base, r.best_8bit, r.chosen))
    assert base.name == "ort_default" and base.stage is Stage.BASE
    assert base.db is not None and best8.db is not None and chosen.db is not None
    assert chosen.db >= best8.db >= base.db
    assert best8.share_16bit == 0.0 and chosen.share_16bit <= r.budget_16bit + 1e-9
    assert {t.stage for t in r.trials} >= {Stage.BASE, Stage.RECIPE, Stage.CEILING, Stage.SIXTEEN_BIT}
    assert len(r.trials) <= 24
    # the W16A16 ceiling is measured and above the 8-bit recipe; the default goal sits between them
    assert set(r.ceilings) == {"W16A16", "A16W8", "W16A8"}
    assert r.ceilings["W16A16"] is not None and r.ceilings["W16A16"] > best8.db
    assert r.goal_db is not None and best8.db < r.goal_db < r.ceilings["W16A16"]
    assert r.reached or r.caps  # short of the goal, it says what caps it


def test_held_out_samples_are_the_last_ones_and_checked(cnn_fix: FixResult) -> None:
    assert set(cnn_fix.holdout) == {"base", "best_8bit", "fixed"}
    assert {m.samples for m in cnn_fix.holdout.values()} == {24}  # a quarter of 128, at most 24
    assert cnn_fix.holdout["fixed"].task is not None and 0.0 <= cnn_fix.holdout["fixed"].task <= 1.0
    assert cnn_fix.metric == "top1"


def test_the_fixed_model_measures_what_the_result_says(cnn_fix: FixResult) -> None:
    data = dict(np.load(CALIB))
    held = [{"input": data["input"][i]} for i in range(104, 128)]
    probe = OutputProbe(onnx.load(str(CNN)), held)
    assert cnn_fix.model_path is not None
    again = probe.measure(cnn_fix.model_path)
    assert again.worst_db == pytest.approx(cnn_fix.holdout["fixed"].worst_db, abs=1e-6)


def test_result_round_trips_through_json(cnn_fix: FixResult) -> None:
    again = FixResult.from_dict(json.loads(cnn_fix.to_json()))
    assert again == cnn_fix
    frame = cnn_fix.to_dataframe()
    assert len(frame) == len(cnn_fix.trials) and frame["chosen"].sum() == 1


def test_goal_above_the_ceiling_is_refused_before_the_search(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="W16A16"):
        fix(CNN, CALIB, FixOptions(libraries=(), goal_db=300.0), workdir=tmp_path)


def test_no_budget_means_no_sixteen_bit_search(tmp_path: Path) -> None:
    r = fix(CNN, CALIB, FixOptions(libraries=(), budget_16bit=0.0), workdir=tmp_path)
    assert not [t for t in r.trials if t.stage is Stage.SIXTEEN_BIT]
    assert r.trial(r.chosen).share_16bit == 0.0


def test_blocks_split_by_kind_then_in_halves() -> None:
    units = [Unit(UnitKind.WEIGHT, f"w{i}", 10, i) for i in range(4)]
    units += [Unit(UnitKind.ACTIVATION, f"a{i}", 30, i) for i in range(4)]
    mixed = Block(tuple(units))
    by_kind = mixed.split()
    assert [b.kinds for b in by_kind] == [frozenset({UnitKind.ACTIVATION}), frozenset({UnitKind.WEIGHT})]
    halves = by_kind[1].split()
    assert [len(b.units) for b in halves] == [2, 2] and sum(b.elements for b in halves) == 40
    blocks = initial_blocks(units, 2)
    assert sum(len(b.units) for b in blocks) == 8 and all(len(b.kinds) == 1 for b in blocks)


def test_sentinel_mask_kept_in_float_when_it_measures_better(tmp_path: Path) -> None:
    model = tmp_path / "attention.onnx"
    onnx.save(attention(), str(model))
    data = npz(tmp_path / "data.npz", samples(48))
    r = fix(model, data, FixOptions(libraries=(), budget_16bit=0.0, holdout_samples=16), workdir=tmp_path / "w")
    kept = [s.remedy for s in r.steps]
    assert any("mask path in float" in k for k in kept), kept
    chosen = r.trial(r.chosen)
    assert chosen.config is not None and chosen.config.nodes_to_exclude
    assert r.holdout["fixed"].worst_db is not None and r.holdout["base"].worst_db is not None
    assert r.holdout["fixed"].worst_db > r.holdout["base"].worst_db + 3.0


def test_cli_writes_all_outputs_and_the_recipe_applies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, html = tmp_path / "fixed.qdq.onnx", tmp_path / "fix.html"
    rc = main(["fix", "-f", str(CNN), "-d", str(CALIB), "-o", str(out), "--html", str(html), "--no-library",
               "--max-trials", "16"])  # fmt: skip
    text = capsys.readouterr().out
    assert rc == EXIT_OK
    assert "before" in text and "fixed" in text and "held-out (24)" in text
    recipe, result = out.with_suffix(".recipe.json"), out.with_suffix(".fix.json")
    assert out.is_file() and recipe.is_file() and result.is_file() and html.is_file()
    assert "Before and after" in html.read_text() and "<script" not in html.read_text()
    assert json.loads(result.read_text())["model_path"] == str(out)
    again = tmp_path / "again.qdq.onnx"
    assert main(["quantize", "-f", str(CNN), "--calib", str(CALIB), "--overrides", str(recipe), "-o", str(again)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".qd-")) == []


def test_cli_exit_10_when_the_goal_is_not_reached(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = fix(CNN, CALIB, FixOptions(libraries=(), budget_16bit=0.0), workdir=tmp_path / "probe")
    goal = (r.ceilings["W16A16"] or 0.0) - 0.5  # reachable in 16 bits, not with no 16-bit share
    rc = main(["fix", "-f", str(CNN), "-d", str(CALIB), "-o", str(tmp_path / "m.onnx"), "--no-library",
               "--budget", "0", "--goal", f"{goal:.2f}"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == EXIT_GATE and "was not reached" in err
    assert (tmp_path / "m.onnx").is_file()  # the best it found is still written


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--budget", "2"], "between 0 and 1"),
        (["--budget", "ten"], "share"),
        (["--no-library", "--library", "nncf-default"], "contradict"),
        (["--library", "no-such-recipe"], "no-such-recipe"),
        (["--label-key", "y"], "--label-key"),
    ],
)
def test_cli_refuses_bad_options_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    out = tmp_path / "m.onnx"
    rc = main(["fix", "-f", str(CNN), "-d", str(CALIB), "-o", str(out), *extra])
    assert rc == EXIT_USAGE and message in capsys.readouterr().err
    assert not out.exists()


def test_cli_never_writes_over_an_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "float.onnx"
    model.write_bytes(CNN.read_bytes())
    rc = main(["fix", "-f", str(model), "-d", str(CALIB), "-o", str(model), "--no-library"])
    assert rc != EXIT_OK and "float" in capsys.readouterr().err
    assert model.read_bytes() == CNN.read_bytes()


def test_the_notebook_debugger_fixes_its_own_model(tmp_path: Path) -> None:
    from widgets.session import QuantDebugger

    dbg = QuantDebugger(CNN, data=CALIB, workdir=tmp_path)
    r = dbg.fix(FixOptions(libraries=(), max_trials=12))
    assert r.model_path is not None and Path(r.model_path).is_file()
    assert str(tmp_path) in r.model_path and r.holdout
    dbg.close()


@pytest.mark.usefixtures("nncf")
def test_a_ptq_library_recipe_is_measured_beside_ort_and_its_recipe_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "fixed.qdq.onnx"
    rc = main(["fix", "-f", str(CNN), "-d", str(CALIB), "-o", str(out), "--library", "nncf-default", "--budget", "0"])
    assert rc == EXIT_OK, capsys.readouterr().err
    result = FixResult.from_dict(json.loads(out.with_suffix(".fix.json").read_text()))
    lib = result.trial("nncf-default")
    assert lib.stage is Stage.LIBRARY and lib.db is not None and lib.error is None
    recipe = json.loads(out.with_suffix(".recipe.json").read_text())
    if result.chosen == "nncf-default":  # the library's model won: its recipe is what is written
        assert recipe["kind"] == "qdebug-ptq-recipe" and recipe["recipe"]["name"] == "nncf-default"
    else:
        assert "tensor_quant_overrides" in recipe


def test_sixteen_bit_choices_carry_their_prediction(cnn_fix: FixResult) -> None:
    choices = [t for t in cnn_fix.trials if t.stage is Stage.SIXTEEN_BIT and t.description.startswith("16-bit:")]
    assert choices and all(t.predicted_db is not None for t in choices)
    median, n = cnn_fix.prediction_error_db or (None, 0)
    assert n == len([t for t in choices if t.db is not None]) and median is not None and median >= 0.0


def test_with_no_budget_the_goal_is_met_and_the_choice_shrunk_while_it_holds(tmp_path: Path) -> None:
    r = fix(CNN, CALIB, FixOptions(libraries=(), budget_16bit=1.0), workdir=tmp_path)
    assert r.reached
    choices = [t for t in r.trials if t.stage is Stage.SIXTEEN_BIT and t.description.startswith("16-bit:")]
    first_met = next(
        i for i, t in enumerate(choices) if t.db is not None and r.goal_db is not None and t.db >= r.goal_db
    )
    tried_smaller = choices[first_met + 1 :]
    assert tried_smaller, "a choice that meets the goal is measured again with fewer blocks"
    chosen = r.trial(r.chosen)
    assert chosen.share_16bit <= choices[first_met].share_16bit
    assert all(t.db is None or t.db < (r.goal_db or 0) for t in tried_smaller if t.share_16bit < chosen.share_16bit)
