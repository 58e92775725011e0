"""The search tab's target cost (issue 14): the Pareto front compiled for a target shows the same cells as
``qdebug search --compile-points`` (partitions / CPU nodes / SPLIT, the SQNR on the target), SPLIT points marked in
the table and the figure. Widget state only, no browser."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import TINY_CONFIGS
from test_qnn_fixes import require_qnn

from qdebug.mixed.search import SearchResult
from qdebug.mixed.target_cost import TargetCost
from qdebug.render.search_table import front_columns, point_rows
from widgets.app import DebuggerApp
from widgets.session import QuantDebugger


@pytest.fixture
def dbg(tiny_float: Path, tmp_path: Path) -> QuantDebugger:
    return QuantDebugger(tiny_float, config=TINY_CONFIGS["u8"], workdir=tmp_path / "work")


def _cells(html_table: str) -> list[list[str]]:
    """The body rows of the front table, cell texts unescaped."""
    import html

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
