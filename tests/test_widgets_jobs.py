"""The debugger's long jobs in the background (the dashboard, issue 38): promote, search and compile run on a thread
with their progress and a Cancel next to their button; every control that starts work (the dashboard's Run too) is
disabled meanwhile; a Cancel stops the engine at its next sample, changes nothing and leaves no file behind. Real
tiny models through real ONNX Runtime; the cancel is pressed while the engine is inside the promotion."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from conftest import TINY_CONFIGS

from widgets.app import DebuggerApp
from widgets.session import QuantDebugger


@pytest.fixture
def app(tiny_float: Path, tmp_path: Path) -> DebuggerApp:
    dbg = QuantDebugger(tiny_float, config=TINY_CONFIGS["u8"], workdir=tmp_path / "work")
    return DebuggerApp(dbg, background=True)


def _hold_apply(app: DebuggerApp, inside: threading.Event) -> None:
    """Make the promotion wait, inside the engine call, until its Cancel is pressed (then go on into the engine)."""
    real = app.debugger.apply

    def apply(plan):  # type: ignore[no-untyped-def]
        inside.set()
        deadline = time.monotonic() + 20
        while not (app.promote_job.token and app.promote_job.token.cancelled) and time.monotonic() < deadline:
            time.sleep(0.02)
        return real(plan)

    app.debugger.apply = apply  # type: ignore[method-assign]


def test_cancel_stops_a_promotion_and_leaves_nothing(app: DebuggerApp) -> None:
    assert app.wait(60)  # the compile Run starts is not the test's; here none was started
    busy: list[bool] = []
    app.busy_listeners.append(busy.append)
    files = set(app.debugger.workdir.rglob("*"))
    plan_before = app.plan_view.value
    inside = threading.Event()
    _hold_apply(app, inside)
    app.selected = app.debugger.suggestions()[0].tensor_name
    app.promote_button.click()
    assert inside.wait(30)
    # while it runs: its bar and Cancel are next to the button, nothing can start a second job
    assert app.promote_job.layout.display == "flex" and not app.promote_job.cancel_button.disabled
    assert app.promote_button.disabled and app.search_button.disabled and app.target_picker.disabled
    assert busy == [True]
    app.search_button.click()  # disabled in the page; called anyway it starts nothing
    assert app.job_running and app.search_job.layout.display == "none"
    t0 = time.monotonic()
    app.promote_job.cancel_button.click()
    assert app.wait(30), "the promotion did not stop"
    assert time.monotonic() - t0 < 10
    assert "cancelled: nothing changed" in app.fix_message.value
    assert not app.promote_button.disabled and not app.search_button.disabled and busy == [True, False]
    assert app.promote_job.layout.display == "none"
    assert app.debugger.history == () and set(app.debugger.workdir.rglob("*")) == files
    assert app.plan_view.value == plan_before  # the cancelled plan is not shown as if it were applied
    # the session is usable after a cancel: the same promotion goes through
    app.debugger.apply = type(app.debugger).apply.__get__(app.debugger)  # type: ignore[method-assign]
    app.promote_button.click()
    assert app.wait(60) and len(app.debugger.history) == 1 and "promoted 1 tensor" in app.fix_message.value


def test_a_background_search_shows_its_progress_by_its_button(app: DebuggerApp) -> None:
    seen: list[str] = []
    app.search_job.text.observe(lambda c: seen.append(str(c["new"])), names="value")
    app.goal_db.value = 99.0
    app.strategy_picker.value = "prefix"
    app.search_button.click()
    assert app.wait(120) and app.last_search is not None
    assert any("search, point" in s for s in seen), seen[:5]
    assert app.search_job.layout.display == "none" and not app.search_button.disabled


def test_cancel_stops_a_compile_and_keeps_the_last_report(app: DebuggerApp) -> None:
    assert app.wait(60)
    shown, last = app.compile_view.value, app.last_recompile
    inside = threading.Event()
    real = app.debugger.recompile

    def recompile(target, options=None):  # type: ignore[no-untyped-def]
        inside.set()
        while not (app.promote_job.token and app.promote_job.token.cancelled):
            time.sleep(0.02)
        from qdebug.cancel import check_cancelled

        check_cancelled()  # where a worker's poll or the next sample would see it
        return real(target, options)

    app.debugger.recompile = recompile  # type: ignore[method-assign]
    app.compile_current()
    assert inside.wait(30) and app.promote_job.layout.display == "flex"
    app.promote_job.cancel_button.click()
    assert app.wait(30)
    assert "the compile for cpu cancelled: nothing changed" in app.fix_message.value
    assert app.compile_view.value == shown and app.last_recompile is last and not app.promote_button.disabled
