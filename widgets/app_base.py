"""What every room of the debugger (:class:`~widgets.app.DebuggerApp`) shares: the view state in traitlets, the
progress line and the messages, and the formats of its numbers. The rooms (``app_views``, ``app_promote``,
``app_search``, ``app_netron``) subclass :class:`AppBase`; ``app`` composes them."""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ipywidgets as w
import traitlets as tr

from qdebug.render.bands import SQNR_LOW
from qdebug.render.fmt import fmt_db_text, fmt_pct

from .status import StepClock

if TYPE_CHECKING:
    from .session import QuantDebugger

__all__ = ["METRICS", "SORT_KEYS", "AppBase", "button_layout", "count_text", "db_text", "pct_text"]

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


class AppBase(w.VBox):  # type: ignore[misc]
    """The debugger's view state and its progress/status line; the rooms add their widgets and handlers."""

    selected = tr.Unicode("", help="the inspected tensor").tag(sync=True)
    promotion = tr.List(tr.Unicode(), help="tensors ticked for promotion").tag(sync=True)
    metric = tr.Enum(METRICS, default_value="cumulative_sqnr_db").tag(sync=True)
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

    def _say(self, box: w.HTML, text: str, kind: str = "info", colour: str | None = None) -> None:
        """A message in ``box`` (next to the button that caused it) and in the status line."""
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
