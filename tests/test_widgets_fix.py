"""The debugger's Fix tab (``widgets.fix_panel.FixPanel`` inside ``DebuggerApp``), driven from Python without a
browser: the real ``qdebug fix`` on the bundled digits CNN (ONNX Runtime, never mocked); inputs are set, handlers
called, and what the tab shows and writes is read back."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from qdebug.fix import FixOptions, FixResult
from qdebug.mixed.overrides import OverridesFile
from qdebug.render.fix import summary_rows
from widgets.app import DebuggerApp
from widgets.session import QuantDebugger

SAMPLES = Path(__file__).resolve().parents[1] / "sample_models"
CNN, CALIB = SAMPLES / "digits_cnn.onnx", SAMPLES / "digits_calib.npz"
#: Short and without PTQ libraries (NNCF's environment need not exist here); the tab's budget and goal go on top.
FAST = FixOptions(libraries=(), max_trials=24)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DebuggerApp]:
    work = tmp_path_factory.mktemp("fix-tab")
    dbg = QuantDebugger(CNN, data=CALIB, workdir=work / "session")
    a = DebuggerApp(dbg, export_path=work / "run" / "overrides.json")
    a.fix_panel.base_options = FAST
    yield a
    dbg.close()


@pytest.fixture(scope="module")
def fixed(app: DebuggerApp) -> tuple[FixResult, list[tuple[bool, bool, bool]]]:
    """One fix through the tab (budget 20 %), with the buttons' state recorded at every status line it showed."""
    panel = app.fix_panel
    seen: list[tuple[bool, bool, bool]] = []
    record = lambda ch: seen.append(  # noqa: E731 — an observer, kept to be removed afterwards
        (panel.fix_button.disabled, app.promote_button.disabled, app.search_button.disabled)
    )
    app.observe(record, names="status")
    panel.budget.value = 20.0
    try:
        result = panel.on_fix_clicked()
    finally:
        app.unobserve(record, names="status")
    assert result is not None, panel.message.value
    return result, seen


def test_the_tab_is_there_with_its_defaults(app: DebuggerApp) -> None:
    app.show_tab("Fix")
    panel = app.fix_panel
    assert app.tabs.children[app.tabs.selected_index] is panel
    assert panel.budget.value == 10.0 and (panel.budget.min, panel.budget.max) == (0.0, 100.0)
    assert panel.goal.value == "" and panel.save_button.disabled  # nothing to save before a fix
    assert panel.fix_options().budget_16bit == pytest.approx(0.10) and panel.fix_options().goal_db is None


def test_fix_shows_the_table_the_ceilings_and_what_caps_it(
    app: DebuggerApp, fixed: tuple[FixResult, list[tuple[bool, bool, bool]]]
) -> None:
    result, _ = fixed
    panel = app.fix_panel
    assert result.budget_16bit == pytest.approx(0.20)  # the tab's budget reached the fix
    assert len(result.trials) <= FAST.max_trials and not [t for t in result.trials if t.library_recipe]
    shown = panel.result_view.value
    rows = re.findall(r"<tr class='qd-fix-row'>(.*?)</tr>", shown)
    assert len(rows) == 3
    for row, (label, _, debug_db, held_db, share) in zip(rows, summary_rows(result), strict=True):
        cells = re.findall(r"<td>(.*?)</td>", row)
        assert cells[0] == label and cells[2:] == [debug_db, held_db, share]
        assert re.fullmatch(r"-?\d+(\.\d+)? dB", debug_db) and re.fullmatch(r"-?\d+(\.\d+)? dB", held_db)
    assert [r[0] for r in summary_rows(result)] == ["before", "best 8-bit recipe", "fixed"]
    assert "ceilings (debug samples): W16A16" in shown
    assert ("what each remedy bought (debug samples):" in shown) == bool(result.steps)
    assert all(html.escape(s.remedy, quote=True) in shown for s in result.steps)
    assert ("what caps it: " in shown) == bool(result.caps) and (result.reached or result.caps)
    assert "fix done: worst output SQNR" in app.status and "fix done" in panel.message.value


def test_the_buttons_are_disabled_while_it_runs_and_enabled_after(
    app: DebuggerApp, fixed: tuple[FixResult, list[tuple[bool, bool, bool]]]
) -> None:
    _, seen = fixed
    assert len(seen) > 3  # the fix's own steps reached the status line, and the tab's line next to the button
    # Fix, Promote and Search disabled at every step of the fix; the last line ("fix done: …") comes after
    assert all(all(buttons) for buttons in seen[:-1]), seen
    assert not any(seen[-1])
    panel = app.fix_panel
    assert not panel.fix_button.disabled and not app.promote_button.disabled and not panel.save_button.disabled
    assert panel.progress.value == panel.progress.max and panel.progress_line.value


def test_save_writes_the_model_the_recipe_and_the_report(
    app: DebuggerApp, fixed: tuple[FixResult, list[tuple[bool, bool, bool]]]
) -> None:
    result, _ = fixed
    panel = app.fix_panel
    saved = panel.on_save_clicked()
    assert set(saved) == {"model", "recipe", "result", "html"}
    assert all(p.is_file() and p.parent == app.export_path.parent / "fixed" for p in saved.values())
    assert saved["model"].read_bytes() == Path(str(result.model_path)).read_bytes()
    doc = json.loads(saved["recipe"].read_text())
    if doc.get("kind") == "qdebug-ptq-recipe":  # a PTQ library won (not with libraries=()): its recipe instead
        assert doc["recipe"]
    else:
        recipe = OverridesFile.load(saved["recipe"])
        assert "qdebug fix" in recipe.note
    assert FixResult.from_dict(json.loads(saved["result"].read_text())).chosen == result.chosen
    assert "<h1>qdebug fix</h1>" in saved["html"].read_text(encoding="utf-8")
    links = panel.links.value
    for key in ("model", "recipe", "html"):
        assert f"qd-fix-download-{key}" in links and f"download='{saved[key].name}'" in links
    assert "written to" in app.status


def test_a_goal_above_the_ceiling_is_one_sentence_and_nothing_breaks(
    app: DebuggerApp, fixed: tuple[FixResult, list[tuple[bool, bool, bool]]]
) -> None:
    panel = app.fix_panel
    before = panel.result_view.value
    panel.goal.value = "300"
    try:
        assert panel.on_fix_clicked() is None
    finally:
        panel.goal.value = ""
    assert app.status.startswith("fix failed: goal 300.0 dB is above") and "W16A16" in app.status
    assert "\n" not in app.status and "Traceback" not in app.status
    assert "qd-msg-error" in panel.message.value
    assert not panel.fix_button.disabled and not app.promote_button.disabled  # enabled again
    assert panel.result_view.value == before and panel.last_fix is fixed[0]  # the last good fix is kept


@pytest.mark.parametrize(
    ("goal", "said"), [("thirty", "'thirty' is not a number"), ("inf", "finite")], ids=["text", "infinite"]
)
def test_a_goal_it_cannot_use_starts_nothing(app: DebuggerApp, goal: str, said: str) -> None:
    panel = app.fix_panel
    panel.goal.value = goal
    try:
        assert panel.on_fix_clicked() is None
    finally:
        panel.goal.value = ""
    assert app.status.startswith("fix not started: goal dB:") and said in app.status
    assert not panel.fix_button.disabled
