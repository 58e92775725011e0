"""What every room of the debugger (:class:`~widgets.app.DebuggerApp`) shares: the view state in traitlets, the
progress line and the messages, the long jobs (promote, search, compile: :meth:`AppBase.run_job`, each with its
:class:`JobBar` next to the button that started it), and the formats of its numbers. The rooms (``app_views``,
``app_promote``, ``app_search``, ``app_netron``) subclass :class:`AppBase`; ``app`` composes them."""

from __future__ import annotations

import html
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import ipywidgets as w
import traitlets as tr

from qdebug.cancel import Cancelled, CancelToken, cancellable, check_cancelled
from qdebug.render.bands import SQNR_LOW
from qdebug.render.fmt import fmt_db_text, fmt_pct

from .status import StepClock, hide_paths

if TYPE_CHECKING:
    from .session import QuantDebugger

__all__ = ["METRICS", "SORT_KEYS", "AppBase", "JobBar", "button_layout", "count_text", "db_text", "pct_text"]

T = TypeVar("T")

#: Metrics the graph colours by (columns of ``DebugReport.to_dataframe()``).
METRICS = ("local_sqnr_db", "cumulative_sqnr_db", "mse", "max_abs_error")
#: Columns the tensor table sorts by (columns of :func:`qdebug.render.figures.tensor_table`).
SORT_KEYS = ("topo_index", "local_sqnr_db", "cumulative_sqnr_db", "weight_sqnr_db", "op", "tensor_name")


def db_text(v: float | None) -> str:
    """An SQNR in dB as the debugger writes it."""
    return fmt_db_text(v)


def pct_text(v: float | None) -> str:
    """A share in percent, ``n/a`` when unknown."""
    return fmt_pct(v, missing="n/a")


def count_text(n: int, noun: str) -> str:
    """``"1 point"``, ``"3 points"``."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def button_layout() -> w.Layout:
    """A button as wide as its label, never squeezed by its row."""
    return w.Layout(width="auto", flex="0 0 auto")


def _entries(folder: Path) -> set[Path]:
    """Everything under ``folder`` now (a job's leftovers are what is new after it)."""
    return set(folder.rglob("*")) if folder.is_dir() else set()


def _remove_new(folder: Path, before: set[Path]) -> None:
    """Remove what appeared under ``folder`` since ``before`` (a cancelled job's files)."""
    import shutil

    for p in sorted(_entries(folder) - before, key=lambda p: len(p.parts)):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


class JobBar(w.HBox):  # type: ignore[misc]
    """A long job's place next to the button that started it: its bar, its step with the time so far and an
    estimate of the time left, and Cancel. Hidden while no job runs."""

    def __init__(self, css: str) -> None:
        self.bar = w.IntProgress(value=0, min=0, max=1, layout=w.Layout(width="180px"))
        self.text = w.HTML("")
        self.cancel_button = w.Button(description="Cancel", icon="stop", button_style="warning", layout=button_layout())
        self.token: CancelToken | None = None
        self.cancel_button.on_click(self.cancel)
        for widget, cls in ((self.bar, "qd-job-bar"), (self.text, "qd-job-text"), (self.cancel_button, "qd-cancel")):
            widget.add_class(cls)
        super().__init__(
            [self.bar, self.text, self.cancel_button],
            layout=w.Layout(display="none", align_items="center", flex_flow="row wrap"),
        )
        self.add_class("qd-job")
        self.add_class(css)

    def start(self, token: CancelToken, message: str) -> None:
        """Show the bar for a job that ``token`` can cancel."""
        self.token = token
        self.cancel_button.disabled = False
        self.show(0, 1, message)
        self.layout.display = "flex"

    def show(self, done: int, total: int, text: str) -> None:
        """The job's progress (``text``: the step with its time and estimate)."""
        self.bar.max = max(total, 1)
        self.bar.value = min(done, self.bar.max)
        self.text.value = f"<span>{html.escape(text)}</span>"

    def cancel(self, b: Any = None) -> None:
        """Ask the job to stop: it does at its next sample or within a worker's poll (:mod:`qdebug.cancel`)."""
        if self.token is not None:
            self.token.cancel()
            self.cancel_button.disabled = True
            self.text.value = "<span>cancelling…</span>"

    def end(self) -> None:
        """Hide the bar: the job is over."""
        self.token = None
        self.layout.display = "none"
        self.text.value = ""


class AppBase(w.VBox):  # type: ignore[misc]
    """The debugger's view state and its progress/status line; the rooms add their widgets and handlers."""

    selected = tr.Unicode("", help="the inspected tensor").tag(sync=True)
    promotion = tr.List(tr.Unicode(), help="tensors ticked for promotion").tag(sync=True)
    metric = tr.Enum(METRICS, default_value="local_sqnr_db").tag(sync=True)  # the graph: where the error is born
    threshold = tr.Float(SQNR_LOW, help="SQNR below this (dB) is highlighted").tag(sync=True)
    sort_key = tr.Enum(SORT_KEYS, default_value="topo_index").tag(sync=True)
    descending = tr.Bool(False).tag(sync=True)
    filter_text = tr.Unicode("", help="substring of tensor name or op").tag(sync=True)
    only_low = tr.Bool(False, help="only tensors below the threshold").tag(sync=True)
    page = tr.Int(0).tag(sync=True)
    target = tr.Unicode("cpu").tag(sync=True)
    status = tr.Unicode("").tag(sync=True)

    #: the session shown (the app's constructor sets it): every number comes from it
    debugger: QuantDebugger
    #: where "Export overrides JSON" writes; the Fix tab saves beside it
    export_path: Path

    def _make_status_widgets(self) -> None:
        """The progress bar and the status line over every tab."""
        self.progress = w.IntProgress(value=0, min=0, max=1, description="", layout=w.Layout(width="320px"))
        self.progress.add_class("qd-progress")
        self.status_line = w.HTML("")
        self.status_line.add_class("qd-status")
        self.clock = StepClock()

    def _on_progress(self, done: int, total: int, message: str) -> None:
        self.progress.max = max(total, 1)
        self.progress.value = min(done, self.progress.max)
        self.status = self.clock.text(done, total, message)
        bar = self._job_bar
        if bar is not None:
            bar.show(done, total, self.status)
        check_cancelled()  # every step the engine reports is a place a Cancel can stop it

    #: the page's private folders on the server (the dashboard's): a path inside one is said by its file name only
    hidden_folders: tuple[Path, ...] = ()

    def _say(self, box: w.HTML, text: str, kind: str = "info", colour: str | None = None) -> None:
        """A message in ``box`` (next to the button that caused it) and in the status line."""
        text = hide_paths(text, self.hidden_folders)
        colour = colour or {"error": "#c92a2a", "ok": "#2b8a3e"}.get(kind, "#495057")
        box.value = f"<div class='qd-msg qd-msg-{kind}' style='color:{colour}'>{html.escape(text)}</div>"
        self.status = text

    @tr.observe("status")
    def _status_changed(self, change: dict[str, Any]) -> None:
        self.status_line.value = f"<span>{html.escape(str(change['new']))}</span>"

    def _busy(self, message: str) -> None:
        # Feedback before a long call: the front end shows it while the kernel works.
        self.progress.value = 0
        self.status = self.clock.text(0, 1, message)
        if self._job_bar is not None:
            self._job_bar.show(0, 1, self.status)

    # ------------------------------------------------------------------ long jobs
    #: Run jobs on a thread of their own (the dashboard: the page stays live, so Cancel reaches the kernel); off, a
    #: job runs in the caller and is over when the handler returns (tests, scripts).
    background = False
    _job: threading.Thread | None = None
    _job_bar: JobBar | None = None
    #: called with ``True``/``False`` when a job starts/ends (the dashboard disables Run meanwhile)
    busy_listeners: list[Callable[[bool], None]]

    def set_busy(self, busy: bool) -> None:
        """Disable (or enable again) what starts work; the app's own buttons are added by :class:`DebuggerApp`."""
        for listener in getattr(self, "busy_listeners", ()):
            listener(busy)

    @property
    def job_running(self) -> bool:
        """Whether a job (promote, search, compile) is under way."""
        return self._job_bar is not None

    def run_job(
        self,
        bar: JobBar,
        box: w.HTML,
        what: str,
        work: Callable[[], T],
        done: Callable[[T], None],
        failed: Callable[[BaseException], None],
        cancelled: Callable[[], None] | None = None,
    ) -> None:
        """Run ``work`` with every control that starts work disabled and ``bar`` (next to its button) showing its
        progress and a Cancel; then ``done(result)``, or ``failed(exception)``; a Cancel says so in ``box`` and
        changes nothing (the session keeps its current variant; workers are killed and their folders removed;
        ``cancelled()`` puts back what ``work`` showed on its way)."""
        if self._job_bar is not None:  # the controls are disabled meanwhile: a second job cannot be started
            return
        token = CancelToken()
        folder = Path(self.debugger.workdir)
        before = _entries(folder)
        self.set_busy(True)
        self._job_bar = bar
        bar.start(token, f"{what}: starting")

        def body() -> None:
            try:
                with cancellable(token):
                    result = work()
            except Cancelled:
                _remove_new(folder, before)  # a variant quantized before the cancel came is not kept
                self._finish_job(bar, ok=False)
                if cancelled is not None:
                    cancelled()
                self._say(box, f"{what} cancelled: nothing changed", "info")
                return
            except Exception as exc:
                self._finish_job(bar, ok=False)
                failed(exc)
                return
            self._finish_job(bar, ok=True)
            done(result)

        if not self.background:
            body()
            return
        self._job = threading.Thread(target=self._guarded, args=(body, box), name=f"qdebug {what}", daemon=True)
        self._job.start()

    def _guarded(self, body: Callable[[], None], box: w.HTML) -> None:
        """A job's thread: a bug in showing its result is a message, not a silent dead thread."""
        try:
            body()
        except BaseException as exc:  # the thread's last stop: said in the page, never a silent dead thread
            traceback.print_exc()
            self._finish_job(self._job_bar, ok=False)
            self._say(box, f"Unexpected error ({type(exc).__name__}: {exc})", "error")

    def _finish_job(self, bar: JobBar | None, *, ok: bool) -> None:
        """The job is over: its bar hidden, the top bar full (done) or empty (failed, cancelled), controls back."""
        if bar is not None:
            bar.end()
        self._job_bar = None
        self.progress.value = self.progress.max if ok else 0
        self.set_busy(False)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for a background job to end (``True``: none is running any more)."""
        job = self._job
        if job is not None:
            job.join(timeout_s)
        return not self.job_running
