"""``DebuggerApp``: the interactive debugger. It holds only view state (traitlets) and composes widgets; every
number comes from a :class:`~widgets.session.QuantDebugger`, every figure from a pure function of
:mod:`qdebug.render.figures`, shown as a live plotly ``FigureWidget`` (clicks select tensors and search points).

The class is a composition of rooms, one purpose each: :mod:`~widgets.app_base` (the view state, the progress line
and messages), :mod:`~widgets.app_views` (the report's table, heatmaps, graph, inspector and the selection),
:mod:`~widgets.app_promote` (promotion, undo, export, the compile for the chosen target),
:mod:`~widgets.app_search` (the Search tab) and :mod:`~widgets.app_netron` (the Netron opt-in); this module lays them
out in tabs and columns. The Fix tab is :class:`~widgets.fix_panel.FixPanel`, the report's buttons
:class:`~widgets.report_panel.ReportPanel`.

Handlers are plain methods (``on_select``, ``on_promote_clicked``, ``on_undo_clicked``, ``on_export_clicked``,
``on_search_clicked``, ``on_pareto_point``, ``on_heatmap_click``, ``on_netron_clicked``, the Fix tab's
``fix_panel.on_fix_clicked`` and ``fix_panel.on_save_clicked``…) so behaviour is tested in
Python by setting traits and calling them, without a browser; the browser tests click the same widgets by their
``qd-*`` CSS classes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from .app_base import METRICS, SORT_KEYS
from .app_netron import NetronOptIn
from .app_promote import PromoteFlow
from .app_search import SearchFlow
from .app_views import PAGE_SIZE, TensorViews
from .report_panel import ReportPanel
from .resize import WindowResize

if TYPE_CHECKING:
    from .session import QuantDebugger

TAB_TITLES = ("Tensors", "Heatmap", "Samples", "Graph", "Search", "Fix", "Before/after")


class DebuggerApp(TensorViews, PromoteFlow, SearchFlow, NetronOptIn):
    """The interactive debugger for one :class:`~widgets.session.QuantDebugger`.

    View state lives in traitlets (``selected``, ``promotion``, ``metric``, ``threshold``, ``sort_key``,
    ``descending``, ``filter_text``, ``only_low``, ``page``, ``target``, ``status``); the session owns the data
    and the computation. ``export_path`` is where "Export overrides JSON" writes; the Fix tab saves its files in
    the folder ``fixed`` beside it. ``background``: promote, search and compile run on a thread with a Cancel next
    to their button (the dashboard); off, each is over when its handler returns.
    """

    def __init__(
        self,
        debugger: QuantDebugger,
        *,
        export_path: str | Path | None = None,
        target: str | None = None,
        background: bool = False,
        **kwargs: Any,
    ) -> None:
        self.debugger = debugger
        self.background = background
        self.busy_listeners = []
        self.export_path = Path(export_path) if export_path is not None else debugger.workdir / "overrides.json"
        self._make_status_widgets()
        self._make_table_widgets()
        self._make_view_widgets()
        self._make_netron_widgets()
        self._make_promote_widgets()
        self._make_search_widgets()
        self._make_panels()
        self._wire_views()
        self._wire_promote()
        self._wire_search()
        super().__init__(self._layout_children(), **kwargs)
        self.add_class("qd-app")
        debugger.progress = self._on_progress
        self._refresh_targets()
        if target is not None:
            self.target = target
            self.target_picker.value = target if target in self.targets_info else "cpu"
        base = debugger.report.min_output_sqnr_db
        self.goal_db.value = round(base + 2.0, 1) if base is not None and math.isfinite(base) else 30.0
        self.refresh()

    def _make_panels(self) -> None:
        """The report's buttons (Diagnose, Download HTML report) and the Fix tab."""
        self.report_panel = ReportPanel(self.debugger, applied=self.show_applied)
        from .fix_panel import FixPanel

        # qdebug fix on the debugger's models; its files go where the overrides JSON goes (the run's own folder)
        self.fix_panel = FixPanel(
            self.debugger, folder=self.export_path.parent / "fixed", set_busy=self.set_busy,
            status=lambda text: setattr(self, "status", text), applied=self.show_applied,
        )  # fmt: skip

    def _layout_children(self) -> list[w.Widget]:
        """Tabs (tensors, heatmaps, graph, search, before/after) over the inspector and the fix panel."""
        graph_tab = w.VBox([w.HBox([self.metric_picker, self.netron_button]), self.graph_panel, self.netron_view])
        self.tabs = w.Tab(
            children=[
                self._tensors_tab(),
                w.VBox([self.heatmap_groups, self.heatmap_box]),
                self.samples_box,
                graph_tab,
                self._search_tab(),
                self.fix_panel,
                self.comparison_box,
            ]
        )
        for i, title in enumerate(TAB_TITLES):
            self.tabs.set_title(i, title)
        # Figures drawn in a hidden tab have no width to fill: a window resize when a tab opens makes them fill it.
        self.resizer = WindowResize()
        self.tabs.observe(self.resizer.fire, names="selected_index")
        self.inspector_panel.tabs.observe(self.resizer.fire, names="selected_index")
        columns = w.HBox([self._inspector_column(), self._promote_column()])
        return [w.HBox([self.progress, self.status_line]), self.capture_note, self.tabs, columns, self.resizer]

    def show_tab(self, title: str) -> None:
        """Open the tab titled ``title`` ("Tensors", "Heatmap", "Samples", "Graph", "Search", "Fix",
        "Before/after")."""
        titles = [self.tabs.get_title(i) for i in range(len(self.tabs.children))]
        if title not in titles:
            raise ValueError(f"no tab {title!r}; the tabs are {', '.join(titles)}")
        self.tabs.selected_index = titles.index(title)

    def set_busy(self, busy: bool) -> None:
        """Disable (or enable again) every button that starts work: a second click while the kernel works would
        queue and later overwrite the first one's result."""
        for b in (
            self.promote_button,
            self.undo_button,
            self.export_button,
            self.export_fix_button,
            self.search_button,
            self.netron_button,
            self.target_picker,
        ):
            b.disabled = busy
        self.fix_panel.set_busy(busy)  # Fix and Save fixed model too (and Fix disables the rest through here)
        super().set_busy(busy)  # and what listens (the dashboard's Run)

    def show(self) -> DebuggerApp:
        """The root widget (display it in a notebook or Voila)."""
        return self


__all__ = ["METRICS", "PAGE_SIZE", "SORT_KEYS", "DebuggerApp"]
