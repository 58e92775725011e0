"""The search tab's target cost (issue 14): the Pareto front compiled for a target shows the same cells as
``qdebug search --compile-points`` (partitions / CPU nodes / SPLIT, the SQNR on the target), SPLIT points marked in
the table and the figure. Widget state only, no browser."""

from __future__ import annotations

import html
import re
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import TINY_CONFIGS
from test_qnn_fixes import require_qnn

from qdebug.mixed.search import SearchResult
from qdebug.mixed.search_measured import DEFAULT_MAX_EVALUATIONS
from qdebug.mixed.target_cost import TargetCost
from qdebug.render.search_table import front_columns, point_rows
from widgets.app import DebuggerApp
from widgets.session import QuantDebugger


@pytest.fixture
def dbg(tiny_float: Path, tmp_path: Path) -> QuantDebugger:
    return QuantDebugger(tiny_float, config=TINY_CONFIGS["u8"], workdir=tmp_path / "work")


def _cells(html_table: str) -> list[list[str]]:
    """The body rows of the front table, cell texts unescaped."""

    body = html_table.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return [[html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", row)] for row in body.split("</tr>") if row]


def _search(app: DebuggerApp, dbg: QuantDebugger) -> None:
    base = dbg.report.min_output_sqnr_db
    assert base is not None
    app.goal_db.value = base + 0.5  # a prefix or two past the base: a front of two points or more, quickly
    app.on_search_clicked()
    assert app.last_search is not None


def _with_costs(res: SearchResult) -> SearchResult:
    """``res`` with the front compiled by hand: the cheapest point one partition, every other one SPLIT."""
    front = {id(p) for p in res.pareto()}
    first = res.pareto()[0]

    def cost(p: object) -> TargetCost:
        if p is first:
            return TargetCost("qnn", True, 1, 0, target_sqnr_db=40.0, cpu_sqnr_db=41.0, accuracy_samples=2)
        return TargetCost("qnn", True, 3, 4, (("Convert", 2), ("Softmax", 2)), target_sqnr_db=20.0, cpu_sqnr_db=44.0,
                          accuracy_samples=2)  # fmt: skip

    def mark(ps: tuple) -> tuple:
        return tuple(replace(p, target_cost=cost(p)) if id(p) in front else p for p in ps)

    return replace(res, steps=mark(res.steps), evaluated=mark(res.evaluated))


def test_front_table_marks_split_points_like_the_cli(dbg: QuantDebugger) -> None:
    app = DebuggerApp(dbg)
    _search(app, dbg)
    res = app.last_search
    assert res is not None
    # Without a compile: the front table has no target columns.
    assert "<th>target graph</th>" not in app.front_view.value and "<tr class='qd-split" not in app.front_view.value
    assert len(res.pareto()) >= 2, "the tiny search must give a front of at least two points"
    compiled = _with_costs(res)
    page = DebuggerApp._front_html(compiled)
    front = compiled.pareto()
    cols = front_columns(front)
    assert cols[-2:] == ["target graph", "on target vs float"]
    # The same cells as `qdebug search` prints (one definition: qdebug.render.search_table).
    assert _cells(page) == point_rows(front, cols, index=True)
    assert page.count("<tr class='qd-split") == len(front) - 1 and "SPLIT: 3 partitions, 4 CPU nodes" in page
    assert "20.00 dB (CPU 44.00 dB, 2 samples)" in page
    assert f"{len(front) - 1} compiled point(s) split the QNN graph (SPLIT)" in page
    # The figure marks the same points: a "SPLIT on QNN" trace over exactly the split ones, hover with the graph.
    from qdebug.render.figures import pareto_figure

    fig = pareto_figure(compiled)
    split = next(t for t in fig.data if t.name == "SPLIT on QNN")
    assert sorted(split.customdata) == sorted(p.step for p in front[1:])
    assert all("SPLIT: 3 partitions" in h and "on QNN vs float: 20.00 dB" in h for h in split.hovertext)
    # The JSON form draws the same (what a saved search result gives).
    fig2 = pareto_figure(compiled.to_dict())
    assert sorted(next(t for t in fig2.data if t.name == "SPLIT on QNN").customdata) == sorted(split.customdata)


def test_compile_front_with_an_unavailable_target_is_a_note(dbg: QuantDebugger) -> None:
    app = DebuggerApp(dbg, target="qnn")
    app.targets_info = {**app.targets_info, "qnn": (False, "not installed here")}  # as the picker hears it
    app.compile_front_box.value = True
    _search(app, dbg)
    assert "front not compiled: qnn unavailable (not installed here)" in app.front_view.value
    assert app.last_search is not None and all(p.target_cost is None for p in app.last_search.pareto())


def test_search_tab_compiles_the_front_on_the_htp(dbg: QuantDebugger) -> None:
    require_qnn()  # fails (not skips) under CI=true without onnxruntime-qnn
    app = DebuggerApp(dbg, target="qnn")
    app.compile_front_box.value = True
    app.target_samples.value = 2
    _search(app, dbg)
    res = app.last_search
    assert res is not None
    front = res.pareto()
    assert front and all(p.target_cost is not None for p in front)
    cols = front_columns(front)
    assert "target graph" in cols and "on target vs float" in cols
    assert _cells(app.front_view.value) == point_rows(front, cols, index=True)
    for p in front:
        tc = p.target_cost
        assert tc is not None and tc.ok and tc.partitions >= 1 and tc.accuracy_samples == 2
        assert tc.target_sqnr_db is not None and tc.cpu_sqnr_db is not None
    splits = [p for p in front if p.target_cost is not None and p.target_cost.splits]
    assert app.front_view.value.count("<tr class='qd-split") == len(splits)


def test_search_tab_offers_every_engine_strategy_and_runs_stepwise(dbg: QuantDebugger) -> None:
    from qdebug.mixed.search import STRATEGIES

    app = DebuggerApp(dbg)
    assert tuple(app.strategy_picker.options) == STRATEGIES and "stepwise" in STRATEGIES
    app.strategy_picker.value = "stepwise"
    _search(app, dbg)
    res = app.last_search
    assert res is not None and res.goal.strategy == "stepwise" and res.sensitivity is not None
    assert res.pareto() and "<table" in app.front_view.value


# ---------------------------------------------------------------------------------------------- budgets (stepwise)
#: The budget inputs each strategy shows (the CLI's help says the same: which options each strategy reads).
SHOWN = {
    "prefix": {"max_steps"},
    "greedy": {"max_steps", "candidates_per_step"},
    "measured": {"max_steps", "measure_top"},
    "efficient": {"max_steps", "measure_top"},
    "stepwise": {"max_steps", "measure_top", "candidates_per_step", "max_evaluations", "max_cost_fraction"},
}


def _shown(app: DebuggerApp) -> set[str]:
    return {name for name, box in app.budgets.inputs.items() if box.layout.display != "none"}


def test_budget_inputs_are_shown_only_for_the_strategies_that_read_them(dbg: QuantDebugger) -> None:
    from qdebug.mixed.search import STRATEGIES

    app = DebuggerApp(dbg)
    assert set(SHOWN) == set(STRATEGIES)
    assert _shown(app) == SHOWN["prefix"]  # the default strategy
    for strategy in (*STRATEGIES, "prefix"):
        app.strategy_picker.value = strategy  # the dropdown switches them
        assert _shown(app) == SHOWN[strategy], strategy
        help_text = app.budgets.help.value
        for name, box in app.budgets.inputs.items():
            assert box.tooltip and "Empty: " in box.tooltip  # a plain explanation on every input
            assert (f"<b>{box.description}</b>" in help_text) == (name in SHOWN[strategy])
    app.strategy_picker.value = "stepwise"
    boxes = app.budgets.inputs
    assert boxes["max_cost_fraction"].placeholder == "no limit"
    assert boxes["max_evaluations"].placeholder == DEFAULT_MAX_EVALUATIONS
    assert "16 bits" in boxes["max_cost_fraction"].tooltip and "percent" in boxes["max_cost_fraction"].tooltip
    assert boxes["measure_top"].placeholder == "as many as needed"
    app.strategy_picker.value = "measured"
    assert boxes["measure_top"].placeholder == "8"  # the measured strategy's own default


def _cli_goal(*argv: str) -> object:
    """The goal ``qdebug search`` builds from these options."""
    from qdebug.cli import build_parser
    from qdebug.cli.search import _goal

    return _goal(build_parser().parse_args(["search", "-f", "m.onnx", "-o", "o.json", *argv]))


def test_budgets_build_the_goal_the_cli_builds(dbg: QuantDebugger) -> None:
    from qdebug.mixed.search import SearchGoal

    app = DebuggerApp(dbg)
    app.goal_db.value = 30.0
    # Nothing typed: the CLI's defaults (12 steps, not SearchGoal's 8), for every strategy.
    for strategy in SHOWN:
        app.strategy_picker.value = strategy
        assert app.search_goal() == _cli_goal("--strategy", strategy, "--goal-sqnr", "30")
    assert app.search_goal().max_steps == 12 and app.search_goal().max_cost_fraction is None
    typed = {"max_cost_fraction": "10 %", "max_evaluations": "7", "candidates_per_step": "3", "measure_top": "20",
             "max_steps": "5"}  # fmt: skip
    for name, text in typed.items():
        app.budgets.inputs[name].value = text
    app.goal_drop.value = 0.5
    expected = SearchGoal(output_sqnr_db=30.0, max_accuracy_drop=0.005, strategy="stepwise", max_cost_fraction=0.1,
                          max_evaluations=7, candidates_per_step=3, measure_top=20, max_steps=5)  # fmt: skip
    assert app.search_goal() == expected
    assert expected == _cli_goal("--strategy", "stepwise", "--goal-sqnr", "30", "--max-accuracy-drop", "0.5",
                                 "--max-cost-fraction", "0.1", "--max-evaluations", "7", "--candidates-per-step", "3",
                                 "--measure-top", "20", "--max-steps", "5")  # fmt: skip
    # A strategy that does not read a budget does not get it, whatever its (hidden) input holds.
    app.strategy_picker.value = "greedy"
    assert app.search_goal() == replace(expected, strategy="greedy", max_cost_fraction=None, max_evaluations=None,
                                        measure_top=None)  # fmt: skip
    app.budgets.inputs["max_cost_fraction"].value = "not a number"  # hidden: not read
    assert app.search_goal().strategy == "greedy"


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("max_cost_fraction", "ten", "16-bit budget %: 'ten' is not a number; type a percentage like 10"),
        ("max_cost_fraction", "0", "16-bit budget %: must be more than 0 and at most 100 (percent), got '0'"),
        ("max_cost_fraction", "150%", "16-bit budget %: must be more than 0 and at most 100 (percent), got '150%'"),
        ("max_cost_fraction", "nan", "16-bit budget %: must be more than 0 and at most 100"),
        ("max_evaluations", "2.5", "max evaluations: '2.5' is not a whole number"),
        ("max_evaluations", "0", "max evaluations: must be 1 or more, got 0"),
        ("candidates_per_step", "-1", "candidates/step: must be 1 or more, got -1"),
        ("max_steps", "x", "max steps: 'x' is not a whole number"),
    ],
)
def test_a_bad_budget_is_a_message_in_the_tab(dbg: QuantDebugger, name: str, text: str, message: str) -> None:
    app = DebuggerApp(dbg)
    app.strategy_picker.value = "stepwise"
    app.goal_db.value = 30.0
    app.budgets.inputs[name].value = text
    app.on_search_clicked()
    assert app.last_search is None and not app.search_button.disabled  # nothing started, nothing left busy
    assert "qd-msg-error" in app.search_summary.value
    assert app.status.startswith(f"search not started: {message}"), app.status
    assert "Traceback" not in app.search_summary.value


def test_a_drop_of_100_percent_or_more_is_a_message_in_the_tab(dbg: QuantDebugger) -> None:
    app = DebuggerApp(dbg)  # no goal at all: tests/test_widgets.py::test_bad_search_goal_is_a_message
    app.goal_drop.value = 120.0
    app.on_search_clicked()
    assert app.last_search is None
    assert (
        app.status
        == "search not started: max drop %: must be more than 0 and less than 100 (percentage points), got 120"
    )


def test_a_stepwise_search_with_budgets_shows_what_the_cli_prints(dbg: QuantDebugger) -> None:
    from qdebug.render.search_table import outcome_line

    app = DebuggerApp(dbg)
    base = dbg.report.min_output_sqnr_db
    assert base is not None
    app.strategy_picker.value = "stepwise"
    app.goal_db.value = base + 60  # unreachable: the greedy runs until its evaluation budget stops it
    app.budgets.inputs["max_cost_fraction"].value = "50"
    app.budgets.inputs["max_evaluations"].value = "30"
    app.budgets.inputs["candidates_per_step"].value = "2"
    app.on_search_clicked()
    res = app.last_search
    assert res is not None and not res.reached
    g = res.goal
    assert (g.strategy, g.max_cost_fraction, g.max_evaluations, g.candidates_per_step) == ("stepwise", 0.5, 30, 2)
    # 30 in all, the ceiling and the sweep included; no prefixes after the greedy (a 16-bit budget is set)
    assert res.evaluations <= 30 and f"; {res.evaluations} of 30 evaluations)" in res.stop_reason, res.stop_reason
    assert res.final.cost_fraction_16bit <= 0.5
    summary = html.unescape(app.search_summary.value)
    line = outcome_line(res)  # the last line of `qdebug search`
    assert line in summary and line.startswith(f"goal NOT reached: {res.stop_reason}; {res.evaluations} evaluation")
    assert "all-16-bit" in line and res.ceiling_db is not None  # stepwise measures the ceiling first
    assert f"; chosen: {res.final.label}, " in summary  # named as the CLI's curve table names it


def test_held_out_samples_check_the_choice_and_say_so(dbg: QuantDebugger) -> None:
    app = DebuggerApp(dbg)
    app.holdout_box.value = "8"  # the 8 seeded samples after the 8 the debug passes generate
    _search(app, dbg)
    res = app.last_search
    assert res is not None and res.holdout is not None and res.holdout.samples == 8
    first = res.holdout.points[0]  # the search's own choice; the final one unless it moved up the front
    assert (res.final.label == first.label) != res.holdout.moved
    summary = html.unescape(app.search_summary.value)
    assert f"held out (8 samples): {res.holdout.note}" in summary  # the CLI's "held out: …" line
    app.holdout_box.value = ""  # empty: no check
    _search(app, dbg)
    assert app.last_search is not None and app.last_search.holdout is None
    assert "held out" not in app.search_summary.value
    app.holdout_box.value = "eight"
    app.last_search = None
    app.on_search_clicked()
    assert app.last_search is None and not app.search_button.disabled
    assert (
        app.status == "search not started: held-out samples: 'eight' is not a whole number; type one like 8 (or "
        "leave it empty)"
    )
