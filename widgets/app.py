"""``DebuggerApp``: the interactive debugger. It holds only view state (traitlets) and composes widgets; every
number comes from a :class:`~widgets.session.QuantDebugger`, every figure from a pure function of
:mod:`qdebug.render.figures`, shown as a live plotly ``FigureWidget`` (clicks select tensors and search points).

Handlers are plain methods (``on_select``, ``on_promote_clicked``, ``on_undo_clicked``, ``on_export_clicked``,
``on_search_clicked``, ``on_pareto_point``, ``on_heatmap_click``, ``on_netron_clicked``, the Fix tab's
``fix_panel.on_fix_clicked`` and ``fix_panel.on_save_clicked``…) so behaviour is tested in
Python by setting traits and calling them, without a browser; the browser tests click the same widgets by their
``qd-*`` CSS classes.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ipywidgets as w
import traitlets as tr

from qdebug.errors import ConfigError, DataError
from qdebug.render.bands import SQNR_HIGH, SQNR_LOW
from qdebug.render.fmt import fmt_db_text, fmt_pct, fmt_task
from qdebug.render.text import capture_line

from .report_panel import ReportPanel
from .resize import WindowResize
from .status import StepClock, verdict

if TYPE_CHECKING:
    import pandas as pd

    from qdebug.mixed.promote import PromotionPlan
    from qdebug.mixed.search import SearchGoal, SearchPoint, SearchResult
    from qdebug.mixed.session import Evaluation
    from qdebug.mixed.suggest import Suggestion
    from qdebug.report import DebugReport
    from qdebug.targets.recompile import RecompileResult

    from .session import QuantDebugger

#: Metrics the graph colours by (columns of ``DebugReport.to_dataframe()``).
METRICS = ("local_sqnr_db", "cumulative_sqnr_db", "mse", "max_abs_error")
#: Columns the tensor table sorts by (columns of :func:`qdebug.render.figures.tensor_table`).
SORT_KEYS = ("topo_index", "local_sqnr_db", "cumulative_sqnr_db", "weight_sqnr_db", "op", "tensor_name")
#: What the pickers show for those columns (the data keeps its column names).
LABELS = {
    "topo_index": "order in the graph",
    "local_sqnr_db": "local SQNR",
    "cumulative_sqnr_db": "cumulative SQNR",
    "weight_sqnr_db": "weight SQNR",
    "op": "op type",
    "tensor_name": "tensor name",
    "mse": "mean squared error",
    "max_abs_error": "max abs error",
}
#: Suggestions listed with a checkbox in the mixed-precision panel (the table shows every reason).
SUGGESTIONS_SHOWN = 10
#: Rows per page of the tensor table: one widget row per tensor keeps a ~900-tensor model responsive.
PAGE_SIZE = 20


def _db(v: float | None) -> str:
    return fmt_db_text(v)


def _pct(v: float | None) -> str:
    return fmt_pct(v, missing="n/a")


def _task(v: float | None) -> str:
    """A task metric's score in the before/after table."""
    return "n/a" if v is None else f"{v:.4f}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _button_layout() -> w.Layout:
    """A button as wide as its label, never squeezed by its row."""
    return w.Layout(width="auto", flex="0 0 auto")


def _placeholder(what: str, why: str) -> w.HTML:
    return w.HTML(f"<div class='qd-placeholder'><i>{html.escape(what)} unavailable: {html.escape(why)}</i></div>")


def _weight_owners(float_model: Any, df: Any) -> dict[str, str] | None:
    """Map fused nodes (Conv followed by a removed Relu) to the tensor that shows their weights."""
    from qdebug.tensor_values import weight_owners

    return weight_owners(float_model, map(str, df["tensor_name"]))


def _figure(name: str, *args: Any, css: str | None = None) -> w.Widget:
    """The figure ``qdebug.render.figures.<name>(*args)`` as a live ``FigureWidget``, or a placeholder saying why
    there is none (a figure bug must not take the dashboard down; plotly's FigureWidget needs anywidget)."""
    try:
        from qdebug.render import figures
    except Exception as exc:
        return _placeholder(name, f"qdebug.render.figures does not import ({type(exc).__name__}: {exc})")
    fn: Callable[..., Any] | None = getattr(figures, name, None)
    if fn is None:
        return _placeholder(name, f"qdebug.render.figures has no {name}()")
    try:
        fig = fn(*args)
    except Exception as exc:
        return _placeholder(name, f"{type(exc).__name__}: {exc}")
    try:
        from .live_figure import live_figure

        widget = live_figure(_json_safe(fig))  # plotly's FigureWidget, its 5 MB front end sent once per kernel
        # plotly.js then follows window resizes itself (the FigureWidget's own listener is never installed under
        # anywidget), which is how a figure drawn in a hidden tab gets its width (widgets/resize.py)
        widget._config = {**widget._config, "responsive": True}
    except Exception as exc:  # no anywidget: say so rather than show a static image nobody can click
        return _placeholder(name, f"plotly FigureWidget unavailable ({exc}); pip install 'qdebug[ui]'")
    if css:
        widget._dom_classes = (*widget._dom_classes, css)  # a stable selector for the browser tests
    return widget


def _finite(v: Any) -> Any:
    """``v`` with every NaN/±inf float replaced by None (plotly draws None as a gap, as it draws NaN)."""
    import numpy as np

    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, np.ndarray):
        if v.dtype.kind == "f" and not np.isfinite(v).all():
            return [_finite(x) for x in v.tolist()]
        if v.dtype.kind == "O":
            return [_finite(x) for x in v.tolist()]
        return v
    if isinstance(v, list | tuple):
        return [_finite(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _json_safe(fig: Any) -> Any:
    """The figure without non-finite numbers: the widget's state travels as JSON, and a NaN or inf there makes
    jupyter_client print "Out of range float values are not JSON compliant" above the app (every hover and colour
    already says "n/a" / "identical (inf)" in text)."""
    try:
        d = fig.to_dict()
    except AttributeError:
        return fig
    return {"data": _finite(d.get("data", [])), "layout": _finite(d.get("layout", {}))}


def _sqnr_cell(v: Any, low: float) -> str:
    """One SQNR table cell: red below the view's threshold, yellow up to the upper band edge (the heatmap's
    reading, :mod:`qdebug.render.bands`)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return "<span>n/a</span>"
    if math.isnan(f):
        return "<span class='qd-na'>n/a</span>"
    style = "background:#f8d7da" if f < low else ("background:#fff3bf" if f <= SQNR_HIGH else "")
    return f"<span style='{style};padding:0 4px'>{html.escape(_db(f))}</span>"


@dataclass(frozen=True)
class _ReportViews:
    """The per-report data behind the views (``report`` is the object it was derived from)."""

    report: DebugReport
    df: pd.DataFrame
    weights: pd.DataFrame
    owners: dict[str, str] | None
    suggestions: tuple[Suggestion, ...]
    table: pd.DataFrame


class DebuggerApp(w.VBox):  # type: ignore[misc]
    """The interactive debugger for one :class:`~widgets.session.QuantDebugger`.

    View state lives in traitlets (``selected``, ``promotion``, ``metric``, ``threshold``, ``sort_key``,
    ``descending``, ``filter_text``, ``only_low``, ``page``, ``target``, ``status``); the session owns the data
    and the computation. ``export_path`` is where "Export overrides JSON" writes; the Fix tab saves its files in
    the folder ``fixed`` beside it.
    """

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

    def __init__(
        self,
        debugger: QuantDebugger,
        *,
        export_path: str | Path | None = None,
        target: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.debugger = debugger
        self.export_path = Path(export_path) if export_path is not None else debugger.workdir / "overrides.json"
        self.last_plan_text = ""
        self.last_recompile: RecompileResult | None = None
        self.last_search: SearchResult | None = None
        self.netron: Any = None
        self._views: _ReportViews | None = None
        self._syncing = False
        self.targets_info: dict[str, tuple[bool, str]] = {}
        self._make_table_widgets()
        self._make_figure_boxes()
        self._make_fix_widgets()
        self._wire()
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

    # ------------------------------------------------------------------ building the widgets
    def _make_table_widgets(self) -> None:
        """Progress, status and the tensor table with its filter/sort/page controls."""
        self.progress = w.IntProgress(value=0, min=0, max=1, description="", layout=w.Layout(width="320px"))
        self.status_line = w.HTML("")
        self.clock = StepClock()
        self.capture_note = w.HTML("")  # which capture backend ran, and every sample that fell back
        # Tensor table: filter/sort/page controls, then one widget row per visible tensor.
        self.table = w.VBox()
        self.filter_box = w.Text(placeholder="filter: name or op", description="filter", continuous_update=False)
        self.sort_picker = w.Dropdown(
            description="sort by", options=[(LABELS[k], k) for k in SORT_KEYS], value=self.sort_key
        )
        self.desc_box = w.Checkbox(description="descending", value=False, indent=False)
        self.low_box = w.Checkbox(description="only below threshold", value=False, indent=False)
        self.threshold_picker = w.FloatText(
            description="threshold dB", value=self.threshold, style={"description_width": "initial"}
        )
        self.prev_button = w.Button(description="◀", layout=w.Layout(width="40px"))
        self.next_button = w.Button(description="▶", layout=w.Layout(width="40px"))
        self.page_label = w.HTML("")
        self.row_boxes: dict[str, w.Checkbox] = {}

    def _make_figure_boxes(self) -> None:
        """The figure containers, the Netron opt-in and the inspector."""
        # Figures.
        self.heatmap_box = w.VBox(layout=w.Layout(width="100%"))  # a column stretches the figure: full width
        self.samples_box = w.VBox(layout=w.Layout(width="100%"))
        self.heatmap_groups = w.Checkbox(description="group by scope / block", value=False, indent=False)
        self.heatmap_groups.add_class("qd-heatmap-groups")
        self.heatmap_groups.observe(lambda ch: self._render_heatmap(), names="value")
        from .graph_view import GraphPanel

        self.graph_panel = GraphPanel(self.on_select)
        self.graph_box = self.graph_panel.box  # holds the live graph figure
        self.comparison_box = w.VBox(layout=w.Layout(width="100%"))  # a plain Box shrank the figure to ~500 px
        self.pareto_box = w.Box()
        self.metric_picker = w.Dropdown(
            description="colour by", options=[(LABELS[k], k) for k in METRICS], value=self.metric
        )
        # Netron: an explicit opt-in (docs/netron.md), never the primary graph view.
        self.netron_button = w.Button(
            description="Open in Netron (opt-in)", icon="external-link", layout=w.Layout(width="auto")
        )
        self.netron_view = w.HTML("")
        # Inspector.
        self.tensor_picker = w.Dropdown(description="tensor", options=[])
        from .inspector import InspectorPanel

        self.inspector_panel = InspectorPanel()
        self.inspector = self.inspector_panel.table
        self.histogram_box = self.inspector_panel.histogram_box

    def _make_fix_widgets(self) -> None:
        """The mixed-precision panel and the search tab's controls."""
        # Fix panel.
        self.suggestion_boxes: dict[str, w.Checkbox] = {}
        self.suggestions_box = w.VBox()
        self.promotion_view = w.HTML("")
        self.target_picker = w.Dropdown(description="target")
        self.target_note = w.HTML("")
        # flex "0 0 auto": a narrow column wraps the row instead of cutting the labels ("Promote to…")
        self.promote_button = w.Button(
            description="Promote to 16-bit", button_style="primary", icon="arrow-up", layout=_button_layout()
        )
        self.undo_button = w.Button(description="Undo", icon="undo", layout=_button_layout())
        self.export_button = w.Button(description="Export overrides JSON", icon="download", layout=_button_layout())
        self.fix_message = w.HTML("")  # the outcome of Promote / Undo / Export, right under those buttons
        self.compile_view = w.HTML("")  # the last compile for the chosen target (Run compiles too)
        self.plan_view = w.HTML("")
        self.before_after = w.HTML("")
        self.download = w.HTML("")
        # Search.
        self.goal_db = w.FloatText(description="goal dB", value=0.0)
        self.goal_drop = w.FloatText(description="max drop %", value=0.0)
        from qdebug.mixed.search import STRATEGIES  # the engine's list: a new strategy shows up here by itself

        from .search_form import SearchBudgets  # imports the search engine too: when the app is built, as above

        self.strategy_picker = w.Dropdown(description="strategy", options=list(STRATEGIES), value="prefix")
        self.budgets = SearchBudgets(str(self.strategy_picker.value))  # shown per strategy, as the CLI's options
        self.search_button = w.Button(description="Search", icon="search", layout=_button_layout())
        # Samples the search never sees: its choice is measured again on them (qdebug search --holdout-samples K).
        self.holdout_box = w.Text(
            description="held-out samples", placeholder="none", style={"description_width": "initial"},
            layout=w.Layout(width="210px"),
            tooltip="How many samples after the debug ones the search never sees: the point it chooses is measured "
            "again on them, and a choice that only fits the debug samples is said (or replaced by one that holds). "
            "Empty: no check.",
        )  # fmt: skip
        self.search_summary = w.HTML("")
        # After the search: compile the front for the fix panel's target (what `qdebug search --compile-points front`
        # does), each point also run on the target over a few debug samples; the front table shows both.
        self.compile_front_box = w.Checkbox(description="compile the front for the target", value=False, indent=False)
        self.target_samples = w.BoundedIntText(description="samples on target", value=2, min=0, max=256)
        self.front_view = w.HTML("")
        self.report_panel = ReportPanel(self.debugger)  # Diagnose + Download HTML report
        from .fix_panel import FixPanel

        # qdebug fix on the debugger's models; its files go where the overrides JSON goes (the run's own folder)
        self.fix_panel = FixPanel(
            self.debugger, folder=self.export_path.parent / "fixed", set_busy=self.set_busy,
            status=lambda text: setattr(self, "status", text),
        )  # fmt: skip

    def _wire(self) -> None:
        """CSS classes for the browser tests, click handlers, and widgets ↔ traits links."""
        for widget, cls in (
            (self.promote_button, "qd-promote"),
            (self.undo_button, "qd-undo"),
            (self.export_button, "qd-export"),
            (self.status_line, "qd-status"),
            (self.progress, "qd-progress"),
            (self.table, "qd-table"),
            (self.filter_box, "qd-filter"),
            (self.sort_picker, "qd-sort"),
            (self.next_button, "qd-next-page"),
            (self.prev_button, "qd-prev-page"),
            (self.inspector, "qd-inspector"),
            (self.target_picker, "qd-target"),
            (self.before_after, "qd-before-after-box"),
            (self.plan_view, "qd-plan-box"),
            (self.search_button, "qd-search"),
            (self.search_summary, "qd-search-summary"),
            (self.compile_front_box, "qd-compile-front"),
            (self.front_view, "qd-front-box"),
            (self.netron_button, "qd-netron"),
            (self.promotion_view, "qd-promotion"),
            (self.fix_message, "qd-fix-message"),
            (self.compile_view, "qd-compile-box"),
        ):
            widget.add_class(cls)
        self.promote_button.on_click(self.on_promote_clicked)
        self.undo_button.on_click(self.on_undo_clicked)
        self.export_button.on_click(self.on_export_clicked)
        self.search_button.on_click(self.on_search_clicked)
        self.netron_button.on_click(self.on_netron_clicked)
        self.prev_button.on_click(lambda b: self._turn(-1))
        self.next_button.on_click(lambda b: self._turn(+1))
        # Widgets ↔ traits: the pickers write the view state, the observers below redraw from it.
        for src, trait in (
            (self.metric_picker, "metric"),
            (self.sort_picker, "sort_key"),
            (self.threshold_picker, "threshold"),
            (self.desc_box, "descending"),
            (self.low_box, "only_low"),
            (self.filter_box, "filter_text"),
        ):
            w.link((src, "value"), (self, trait))
        self.tensor_picker.observe(self._on_picker, names="value")
        self.target_picker.observe(self._on_target_picker, names="value")
        self.strategy_picker.observe(lambda c: self.budgets.show_for(str(c["new"])), names="value")

    def _layout_children(self) -> list[w.Widget]:
        """Tabs (tensors, heatmaps, graph, search, before/after) over the inspector and the fix panel."""
        table_tab = w.VBox(
            [
                w.HBox([self.filter_box, self.sort_picker, self.desc_box]),
                w.HBox([self.threshold_picker, self.low_box, self.prev_button, self.page_label, self.next_button]),
                self.table,
            ]
        )
        graph_tab = w.VBox([w.HBox([self.metric_picker, self.netron_button]), self.graph_panel, self.netron_view])
        search_tab = w.VBox(
            [
                w.HTML(
                    "<b>Automatic search</b>: promote the fewest tensors that reach the goal (0 = no goal on "
                    "that axis). Click a point of the curve to apply it."
                ),
                w.HBox([self.goal_db, self.goal_drop, self.strategy_picker, self.search_button]),
                self.budgets.box,
                w.HBox([self.holdout_box, self.compile_front_box, self.target_samples]),
                self.search_summary,
                self.pareto_box,
                self.front_view,
            ]
        )
        self.tabs = w.Tab(
            children=[
                table_tab,
                w.VBox([self.heatmap_groups, self.heatmap_box]),
                self.samples_box,
                graph_tab,
                search_tab,
                self.fix_panel,
                self.comparison_box,
            ]
        )
        for i, title in enumerate(("Tensors", "Heatmap", "Samples", "Graph", "Search", "Fix", "Before/after")):
            self.tabs.set_title(i, title)
        # Figures drawn in a hidden tab have no width to fill: a window resize when a tab opens makes them fill it.
        self.resizer = WindowResize()
        self.tabs.observe(self.resizer.fire, names="selected_index")
        self.inspector_panel.tabs.observe(self.resizer.fire, names="selected_index")
        inspect = w.VBox(
            [w.HTML("<b>Tensor inspector</b>"), self.tensor_picker, self.inspector_panel],
            layout=w.Layout(width="50%"),
        )
        fix = w.VBox(
            [
                w.HTML("<b>Mixed precision</b> — tick suggestions or table rows, then promote"),
                self.suggestions_box,
                self.promotion_view,
                w.HBox(
                    [self.target_picker, self.promote_button, self.undo_button, self.export_button],
                    layout=w.Layout(flex_flow="row wrap"),
                ),
                self.fix_message,
                self.target_note,
                self.compile_view,
                self.plan_view,
                self.before_after,
                self.download,
                self.report_panel,
            ],
            layout=w.Layout(width="50%"),
        )
        return [w.HBox([self.progress, self.status_line]), self.capture_note, self.tabs, w.HBox([inspect, fix]),
                self.resizer]  # fmt: skip

    # ------------------------------------------------------------------ progress and status
    def _on_progress(self, done: int, total: int, message: str) -> None:
        self.progress.max = max(total, 1)
        self.progress.value = min(done, self.progress.max)
        self.status = self.clock.text(done, total, message)

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
            self.search_button,
            self.netron_button,
            self.target_picker,
        ):
            b.disabled = busy
        self.fix_panel.set_busy(busy)  # Fix and Save fixed model too (and Fix disables the rest through here)

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

    # ------------------------------------------------------------------ data for the views
    def views(self) -> _ReportViews:
        """What every view derives from the current report, computed once per report (a click, a sort or a
        page turn only filters and sorts the cached table; an undo brings back the earlier report)."""
        from qdebug.render.figures import tensor_table

        report = self.debugger.report
        if self._views is None or self._views.report is not report:
            df = report.to_dataframe()
            weights = report.weights_dataframe()
            owners = _weight_owners(self.debugger.session.float_proto, df)
            picks = self.debugger.suggestions(top=None)
            self._views = _ReportViews(report, df, weights, owners, picks, tensor_table(df, picks, weights, owners))
        return self._views

    def table_frame(self) -> pd.DataFrame:
        """The tensor table as shown: :func:`qdebug.render.figures.tensor_table` filtered and sorted by the view
        state (all pages)."""
        t = self.views().table
        if self.filter_text:
            needle = self.filter_text.lower()
            keep = t["tensor_name"].str.lower().str.contains(needle, regex=False) | t["op"].str.lower().str.contains(
                needle, regex=False
            )
            t = t[keep]
        if self.only_low:
            low = float(self.threshold)
            t = t[(t["local_sqnr_db"] < low) | (t["cumulative_sqnr_db"] < low)]
        # n/a (a tensor with no SQNR) last in both directions: the rows worth reading come first
        return t.sort_values(self.sort_key, ascending=not self.descending, na_position="last", kind="stable")

    def table_names(self) -> list[str]:
        """Tensor names on the current page of the table, in display order."""
        t = self.table_frame()
        return [str(n) for n in t["tensor_name"].iloc[self.page * PAGE_SIZE : (self.page + 1) * PAGE_SIZE]]

    # ------------------------------------------------------------------ rendering
    def refresh(self) -> None:
        """Redraw everything that depends on the current report."""
        report = self.debugger.report
        names = [a.tensor_name for a in report.activations]
        # New options would make the dropdown pick its first entry (and so "select" it): keep the user's choice.
        self.tensor_picker.unobserve(self._on_picker, names="value")
        self.tensor_picker.options = names
        self.tensor_picker.value = self.selected if self.selected in names else None
        self.tensor_picker.observe(self._on_picker, names="value")
        if self.selected not in names:
            self.selected = ""
        self.promotion = [n for n in self.promotion if n in names]
        self.capture_note.value = self._notes_html(report)
        self._render_suggestions()
        self._render_table()
        self._render_graph()  # first: the heatmap's optional groups are the graph's
        self._render_heatmap()
        samples = _figure("samples_heatmap", report.per_sample.to_dataframe(), css="qd-samples-heatmap")
        self._on_click(samples, self.on_samples_click)
        self.samples_box.children = [samples]
        self._render_inspector()

    def _render_heatmap(self) -> None:
        v = self.views()
        # The graph's groups (name scopes or blocks), so both views speak of the same regions.
        groups = self.graph_panel.grouping.finest() if self.heatmap_groups.value else None  # blocks of a ×N group
        heat = _figure("layer_heatmap", v.df, v.weights, "h", 40, v.owners, groups, css="qd-heatmap")
        self._on_click(heat, self.on_heatmap_click)
        self.heatmap_box.children = [heat]

    @staticmethod
    def _notes_html(report: DebugReport) -> str:
        """How the tensors were captured, and every warning of the report (e.g. a QDQ scale that cannot be right)."""
        line = f"<span class='qd-capture'>{html.escape(capture_line(report.meta.capture) or '')}</span>"
        if report.task is not None:  # the user's task beside the SQNR: whether the answer changed
            line = f"<div class='qd-task'>{html.escape(fmt_task(report.task))}</div>" + line
        warns = "".join(f"<li>{html.escape(w)}</li>" for w in report.meta.warnings)
        return line + (f"<ul class='qd-warnings' style='color:#c92a2a'>{warns}</ul>" if warns else "")

    @staticmethod
    def _on_click(fig: Any, handler: Callable[..., None]) -> None:
        for trace in getattr(fig, "data", ()):
            if hasattr(trace, "on_click"):
                trace.on_click(handler)

    def _render_table(self) -> None:
        t = self.table_frame()
        pages = max(1, math.ceil(len(t) / PAGE_SIZE))
        if self.page >= pages:
            self.page = pages - 1  # the observer redraws
            return
        start = self.page * PAGE_SIZE
        shown = t.iloc[start : start + PAGE_SIZE]
        self.page_label.value = (
            f"<span class='qd-page'>{start + 1 if len(t) else 0}–{start + len(shown)} of {len(t)}</span>"
        )
        widths = ("28px", "280px", "150px", "70px", "95px", "95px", "95px", "420px")
        head = ("", "tensor", "op", "type", "local", "cumulative", "weight", "suggestion")
        rows: list[w.Widget] = [
            w.HBox(
                [w.HTML(f"<b>{h}</b>", layout=w.Layout(width=wd)) for h, wd in zip(head, widths, strict=True)],
                layout=w.Layout(border_bottom="1px solid #adb5bd"),
            )
        ]
        self.row_boxes = {}
        low = float(self.threshold)
        for r in shown.itertuples(index=False):
            name = str(r.tensor_name)
            box = w.Checkbox(value=name in self.promotion, indent=False, layout=w.Layout(width=widths[0]))
            box.add_class("qd-row-check")
            box.observe(lambda ch, n=name: self._tick(n, bool(ch["new"])), names="value")
            self.row_boxes[name] = box
            short = name if len(name) <= 36 else "…" + name[-35:]
            btn = w.Button(description=short, tooltip=name, layout=w.Layout(width=widths[1]))
            btn.add_class("qd-row-name")
            btn.on_click(lambda b, n=name: self.on_select(n))
            reason = str(r.reason) if r.role else ""  # the reason starts with the role
            qtype = r.type if isinstance(r.type, str) and r.type else "float"  # not quantized: no `nan`
            cells = [
                html.escape(str(r.op)),
                html.escape(qtype),
                _sqnr_cell(r.local_sqnr_db, low),
                _sqnr_cell(r.cumulative_sqnr_db, low),
                _sqnr_cell(r.weight_sqnr_db, low),
                f"<span class='qd-reason' style='white-space:normal'>{html.escape(reason)}</span>",
            ]
            row = w.HBox(
                [box, btn, *(w.HTML(c, layout=w.Layout(width=wd)) for c, wd in zip(cells, widths[2:], strict=True))]
            )
            row.add_class("qd-row")
            if name == self.selected:
                row.add_class("qd-row-selected")
                btn.button_style = "info"
            rows.append(row)
        if len(rows) == 1:
            rows.append(w.HTML("<i>no tensor matches the filter</i>"))
        self.table.children = rows
        # The order on display as classes: a browser waits for them instead of guessing when a re-sort landed.
        order = f"qd-sort-{self.sort_key}" + ("-desc" if self.descending else "")
        self.table._dom_classes = ("qd-table", order, f"qd-page-{self.page}")

    def _render_suggestions(self) -> None:
        picks: tuple[Suggestion, ...] = self.views().suggestions[:SUGGESTIONS_SHOWN]
        self.suggestion_boxes = {}
        rows = []
        for s in picks:
            label = f"{s.tensor_name} ({s.producer_op}, {s.role}): est. +{s.estimated_output_gain_db:.1f} dB at output"
            box = w.Checkbox(value=s.tensor_name in self.promotion, indent=False, layout=w.Layout(width="28px"))
            box.add_class("qd-suggestion")
            box.observe(lambda ch, n=s.tensor_name: self._tick(n, bool(ch["new"])), names="value")
            self.suggestion_boxes[s.tensor_name] = box
            # the whole label, wrapped: a checkbox description is cut at the widget's width
            text = w.HTML(f"<span class='qd-suggestion-text' style='white-space:normal'>{html.escape(label)}</span>")
            rows.append(w.HBox([box, text], layout=w.Layout(align_items="flex-start")))
        if not rows:
            rows = [w.HTML("<i>no promotion candidates</i>")]
        self.suggestions_box.children = rows

    def _render_graph(self) -> None:
        # Grouped, laid out and drawn by qdebug.render.graphview; colours follow the chosen metric (mse too).
        rows = self.views().df.sort_values("topo_index", kind="stable").to_dict("records")
        try:
            self.graph_panel.show(rows, self.metric, self.selected)
        except Exception as exc:  # a figure bug must not take the dashboard down
            self.graph_box.children = [_placeholder("graph", f"{type(exc).__name__}: {exc}")]

    def _render_inspector(self) -> None:
        if not self.selected:
            self.inspector_panel.clear()
            return
        self.inspector_panel.show(self.debugger, self.selected, self.views().owners)

    def _refresh_targets(self) -> None:
        targets = self.debugger.targets()
        opts = []
        notes = []
        for name, (ok, reason) in targets.items():
            opts.append((name if ok else f"{name} (unavailable)", name))
            if not ok:
                notes.append(f"<li><b>{html.escape(name)}</b> unavailable: {html.escape(reason)}</li>")
        self.targets_info = targets
        self.target_picker.options = opts
        self.target_picker.value = self.target if self.target in targets else "cpu"
        self.target_note.value = f"<ul>{''.join(notes)}</ul>" if notes else ""

    # ------------------------------------------------------------------ observers
    @tr.observe("selected")
    def _selected_changed(self, change: dict[str, Any]) -> None:
        if change["new"] and self.tensor_picker.value != change["new"]:
            self.tensor_picker.value = change["new"]
        if change["new"]:
            self.status = f"inspecting {change['new']}"
        self._render_inspector()
        self._render_table()
        self._highlight_graph(change["new"])

    def _highlight_graph(self, name: str) -> None:
        # Move the highlight ring of the live figure instead of rebuilding the figure per click.
        self.graph_panel.select(name)

    @tr.observe("metric")
    def _metric_changed(self, change: dict[str, Any]) -> None:
        self._render_graph()

    @tr.observe("sort_key", "threshold", "descending", "filter_text", "only_low")
    def _table_changed(self, change: dict[str, Any]) -> None:
        if self.page != 0:
            self.page = 0  # the page observer redraws
        else:
            self._render_table()

    @tr.observe("page")
    def _page_changed(self, change: dict[str, Any]) -> None:
        self._render_table()

    @tr.observe("promotion")
    def _promotion_changed(self, change: dict[str, Any]) -> None:
        wanted = set(change["new"])
        self._syncing = True
        try:
            for boxes in (self.suggestion_boxes, self.row_boxes):
                for n, b in boxes.items():
                    if b.value != (n in wanted):
                        b.value = n in wanted
        finally:
            self._syncing = False
        names = list(change["new"])
        self.promotion_view.value = (
            f"<span>to promote ({len(names)}): {html.escape(', '.join(names))}</span>" if names else ""
        )

    @tr.observe("target")
    def _target_changed(self, change: dict[str, Any]) -> None:
        if self.target_picker.value != change["new"] and change["new"] in self.targets_info:
            self.target_picker.value = change["new"]

    def _on_picker(self, change: dict[str, Any]) -> None:
        if change["new"]:
            self.selected = change["new"]

    def _on_target_picker(self, change: dict[str, Any]) -> None:
        if change["new"]:
            self.target = change["new"]

    def _tick(self, name: str, on: bool) -> None:
        if self._syncing:
            return
        cur = list(self.promotion)
        if on and name not in cur:
            self.promotion = [*cur, name]
        elif not on and name in cur:
            self.promotion = [n for n in cur if n != name]

    def _turn(self, step: int) -> None:
        pages = max(1, math.ceil(len(self.table_frame()) / PAGE_SIZE))
        self.page = min(max(self.page + step, 0), pages - 1)

    # ------------------------------------------------------------------ selection handlers
    def on_select(self, tensor: str) -> None:
        """Inspect ``tensor`` (what a click on the table, heatmap or graph does)."""
        self.selected = tensor

    def on_heatmap_click(self, trace: Any, points: Any, state: Any = None) -> None:
        """A click on the layer heatmap: its x is the tensor's position in topological order."""
        xs = list(getattr(points, "xs", []) or [])
        names = list(self.views().table["tensor_name"])  # topological order, as the heatmap's columns
        if xs and 0 <= int(xs[0]) < len(names):
            self.on_select(str(names[int(xs[0])]))

    def on_samples_click(self, trace: Any, points: Any, state: Any = None) -> None:
        """A click on the samples × tensors heatmap: its x is the tensor's column."""
        xs = list(getattr(points, "xs", []) or [])
        names = self.debugger.report.per_sample.tensor_names
        if xs and 0 <= int(xs[0]) < len(names):
            self.on_select(names[int(xs[0])])

    def checked(self) -> list[str]:
        """The tensors ticked for promotion (suggestions and table rows)."""
        return list(self.promotion)

    # ------------------------------------------------------------------ promotion
    def on_promote_clicked(self, b: Any = None) -> None:
        """Promote the ticked tensors (or the selected one): plan → apply → recompile → before/after."""
        tensors = self.checked() or ([self.selected] if self.selected else [])
        if not tensors:
            self._say(self.fix_message, "tick at least one suggestion or table row (or select a tensor) to promote")
            return
        self._apply(lambda: self.debugger.promote(tensors), f"the promotion of {', '.join(tensors)}")

    def _apply(self, make_plan: Callable[[], PromotionPlan], what: str) -> Evaluation | None:
        """Plan, re-quantize, re-debug and compile with the buttons disabled; a failure is said next to the button
        and in the Before/after tab (where the user looks for the result), and the current variant stays."""
        before = self.debugger.report
        before_ev = self.debugger.current
        self.set_busy(True)
        try:
            self._busy(f"planning {what}")
            plan = make_plan()
            self.last_plan_text = plan.describe()
            self.plan_view.value = f"<pre class='qd-plan'>{html.escape(self.last_plan_text)}</pre>"
            ev = self.debugger.apply(plan)
            compiled, note = self._recompile()
        except Exception as exc:
            self._failed(what, exc)
            return None
        finally:
            self.set_busy(False)
        self.promotion = []
        self.refresh()
        self.before_after.value = self._before_after_html(before.min_output_sqnr_db, before_ev, ev, compiled)
        if ev.comparison is not None:
            self.comparison_box.children = [_figure("comparison_figure", ev.comparison, css="qd-comparison")]
        v = verdict(ev.output_sqnr_db)
        self._say(
            self.fix_message,
            f"promoted {len(plan.requested)} tensor(s) (with the tensors around them: {len(plan.promoted)} in 16 "
            f"bits): output SQNR {_db(before.min_output_sqnr_db)} → {_db(ev.output_sqnr_db)}, {v.kind}"
            + ("" if ev.accuracy is None else f", accuracy {_pct(ev.accuracy)}")
            + (f"; {note}" if compiled is None else f"; {self.target}: {'ok' if compiled.ok else 'failed'}"),
            colour=v.colour,
        )
        return ev

    def _failed(self, what: str, exc: BaseException) -> None:
        """Say that ``what`` failed, and why, where the user will look: next to the button, in the status line
        and in the Before/after tab; the model shown is still the previous one."""
        why = f"{type(exc).__name__}: {exc}"
        shown = _db(self.debugger.report.min_output_sqnr_db)
        self._say(self.fix_message, f"{what} failed: {why}", "error")
        self.before_after.value = ""
        box = w.HTML(
            f"<div class='qd-failed' style='color:#c92a2a'><b>{html.escape(what)} failed</b>: {html.escape(why)}"
            f"<br>The model shown is unchanged (worst output SQNR {html.escape(shown)}); the session is usable: "
            "try other tensors or undo.</div>"
        )
        self.comparison_box.children = [box]

    def compile_current(self) -> RecompileResult | None:
        """Compile the current variant for the chosen target (Run does it too, as ``qdebug build`` would) and show
        the compile report under the target picker."""
        self.set_busy(True)
        try:
            compiled, note = self._recompile()
        finally:
            self.set_busy(False)
        if compiled is None:
            self.compile_view.value = f"<p class='qd-compile-note'>{html.escape(note)}</p>"
        else:
            self.compile_view.value = self._compile_html(compiled)
            self.status = f"compiled for {self.target}: {'ok' if compiled.ok else 'FAILED (see below the target)'}"
        return compiled

    def _recompile(self) -> tuple[RecompileResult | None, str]:
        ok, reason = self.targets_info.get(self.target, (False, "unknown target"))
        self.last_recompile = None
        if not ok:
            return None, f"not compiled: {self.target} unavailable ({reason})"
        self._busy(f"compiling for {self.target}")
        try:
            self.last_recompile = self.debugger.recompile(self.target)
        except Exception as exc:
            return None, f"compile for {self.target} failed: {type(exc).__name__}: {exc}"
        self.compile_view.value = self._compile_html(self.last_recompile)
        return self.last_recompile, ""

    @staticmethod
    def _compile_html(compiled: RecompileResult) -> str:
        c = compiled.compile
        fallback = ", ".join(f"{op}×{n}" for op, n in c.fallback_by_op().items()) or "none"
        out = (
            f"<p class='qd-compile'>{html.escape(c.target)} {html.escape(c.device)}: "
            f"{'ok' if compiled.ok else 'FAILED'}; {c.accelerator_partitions} accelerator partition(s), "
            f"{c.accelerator_nodes} node(s) on it, {c.cpu_nodes} on the CPU; fallback: {html.escape(fallback)}</p>"
        )
        if compiled.problems:
            out += "<ul>" + "".join(f"<li>{html.escape(p)}</li>" for p in compiled.problems) + "</ul>"
        return out

    def _before_after_html(
        self,
        before_db: float | None,
        before_ev: Evaluation | None,
        ev: Evaluation,
        compiled: RecompileResult | None,
    ) -> str:
        rows = [("worst output SQNR", _db(before_db), _db(ev.output_sqnr_db))]
        if ev.accuracy is not None:
            rows.append(("top-1 accuracy", _pct(None if before_ev is None else before_ev.accuracy), _pct(ev.accuracy)))
        if ev.report.task is not None:
            before_task = None if before_ev is None or before_ev.report.task is None else before_ev.report.task.value
            rows.append((f"task {ev.report.task.metric}", _task(before_task), _task(ev.report.task.value)))
        body = "".join(
            f"<tr><th>{html.escape(k)}</th><td class='qd-before'>{html.escape(a)}</td>"
            f"<td class='qd-after'>{html.escape(b)}</td></tr>"
            for k, a, b in rows
        )
        out = f"<table class='qd-before-after'><tr><th></th><th>before</th><th>after</th></tr>{body}</table>"
        if compiled is not None:
            out += self._compile_html(compiled)
        return out

    def on_undo_clicked(self, b: Any = None) -> None:
        """Return to the variant before the last promotion."""
        undone = self.debugger.undo()
        if undone is None:
            self._say(self.fix_message, "nothing to undo")
            return
        self.refresh()
        self.before_after.value = ""
        self.plan_view.value = ""
        self.comparison_box.children = []
        self._say(
            self.fix_message,
            f"undone {undone.name}: output SQNR back to {_db(self.debugger.report.min_output_sqnr_db)}",
        )

    def on_export_clicked(self, b: Any = None) -> None:
        """Write the current overrides JSON (atomically) and offer it as a download link."""
        try:
            path = self.debugger.export_overrides(self.export_path)
        except Exception as exc:
            self._say(self.fix_message, f"export failed: {type(exc).__name__}: {exc}", "error")
            return
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        self.download.value = (
            f"<a class='qd-download' download='{html.escape(path.name)}' "
            f"href='data:application/json;base64,{data}'>download {html.escape(path.name)}</a>"
            f" <span class='qd-export-path'>{html.escape(str(path))}</span>"
        )
        self._say(self.fix_message, f"overrides written to {path}", "ok")

    # ------------------------------------------------------------------ search
    def on_search_clicked(self, b: Any = None) -> None:
        """Run the automatic search from the base and draw its cost/quality curve (the history is unchanged)."""
        try:
            goal = self.search_goal()
            from .search_form import whole_number

            self.debugger.hold_out(whole_number("held-out samples", self.holdout_box.value, like=8))
        except (ConfigError, DataError) as exc:  # a goal, budget or sample count it cannot use: said, nothing starts
            self._say(self.search_summary, f"search not started: {exc}", "error")
            return
        self.set_busy(True)
        try:
            self._busy("searching promotions (each point is re-quantized and measured)")
            res = self.debugger.search(goal)
            note = ""
            if self.compile_front_box.value:
                res, note = self._compile_front(res)
        except Exception as exc:
            self._say(self.search_summary, f"search failed: {type(exc).__name__}: {exc}", "error")
            return
        finally:
            self.set_busy(False)
        self.last_search = res
        fig = _figure("pareto_figure", res, css="qd-pareto")
        self._on_click(fig, self._on_pareto_click)
        self.pareto_box.children = [fig]
        self.search_summary.value = self._search_text(res)
        self.front_view.value = self._front_html(res, note)
        self.status = "search done: click a point of the curve to apply it" + (f"; {note}" if note else "")

    def search_goal(self) -> SearchGoal:
        """The goal of the tab's inputs, built as ``qdebug search`` builds it from its options
        (:func:`~qdebug.mixed.search.user_goal`): 0 dB or 0 % is no goal on that axis, an empty budget its default;
        a value it cannot use raises :class:`~qdebug.errors.ConfigError` naming the input."""
        from qdebug.mixed.search import user_goal

        db = float(self.goal_db.value) or None
        drop = float(self.goal_drop.value) or None
        if db is None and drop is None:
            raise ConfigError("set a goal first: goal dB (the worst output's SQNR to reach) and/or max drop % (top-1 "
                              "accuracy lost vs the float model)")  # fmt: skip
        if drop is not None and not 0 < drop < 100:
            raise ConfigError(f"max drop %: must be more than 0 and less than 100 (percentage points), got {drop:g}")
        return user_goal(
            str(self.strategy_picker.value), output_sqnr_db=db, max_accuracy_drop_points=drop, **self.budgets.values()
        )

    def _compile_front(self, res: SearchResult) -> tuple[SearchResult, str]:
        """The search's front compiled for the chosen target (and run on it); a target that is unavailable or a
        compile that fails is a note, the search's result stands."""
        ok, reason = self.targets_info.get(self.target, (False, "unknown target"))
        if not ok:
            return res, f"front not compiled: {self.target} unavailable ({reason})"
        self._busy(f"compiling the Pareto front for {self.target}")
        try:
            return self.debugger.compile_points(res, "front", self.target, int(self.target_samples.value)), ""
        except Exception as exc:
            return res, f"compiling the front for {self.target} failed: {type(exc).__name__}: {exc}"

    @staticmethod
    def _front_html(res: SearchResult, note: str = "") -> str:
        """The Pareto front as ``qdebug search`` prints it (same columns and cells); SPLIT rows in red."""
        from qdebug.render.search_table import front_columns, points_html, split_note

        front = res.pareto()
        out = (
            "<style>.qd-front td,.qd-front th{padding:1px 8px;text-align:left}"
            ".qd-front tr.qd-split td{color:#d62728;font-weight:bold}.qd-front tr.qd-chosen td{background:#fff3bf}"
            "</style><b>Pareto front</b> (every point measured; cost: 16-bit elements; # as in "
            "<code>qdebug search --compile-points</code>)" + points_html(front, front_columns(front))
        )
        split = split_note(front)
        if split:
            out += f"<p class='qd-split-note' style='color:#d62728'><b>{html.escape(split)}</b></p>"
        if note:
            out += f"<p class='qd-compile-note'>{html.escape(note)}</p>"
        return out

    @staticmethod
    def _search_text(res: SearchResult) -> str:
        """The search's outcome in one line: what ``qdebug search`` ends with (reached or not and why, evaluations,
        time), then the points on the curve and the chosen one."""
        from qdebug.render.search_table import outcome_line

        points = {p.step: p for p in (*res.steps, *res.evaluated)}
        chosen = res.steps[res.chosen_step] if res.steps else None
        start = points.get(0)
        worse = (
            chosen is not None
            and start is not None
            and chosen.output_sqnr_db is not None
            and start.output_sqnr_db is not None
            and chosen.output_sqnr_db < start.output_sqnr_db
        )
        text = f"{outcome_line(res)}; {_count(len(points), 'point')} measured"  # the CLI's last line, then more
        if chosen is not None:
            name = chosen.label or f"step {chosen.step}"  # as the CLI's tables name it ("step 3: +x", "prefix 4")
            text += f"; chosen: {name}, {_count(len(chosen.promoted), 'tensor')}, {_db(chosen.output_sqnr_db)}"
        if worse:
            text += " — worse than the start: keep the current model or pick another point"
        if res.target_fixes is not None and res.target_fixes.changed:  # what `qdebug search --target` prints too
            text += f"; {res.target_fixes.describe()}"
        if res.holdout is not None:  # the CLI's "held out: …" line
            text += f"; held out ({res.holdout.samples} samples): {res.holdout.note}"
        return f"<span class='qd-search-result'>{html.escape(text)}</span>"

    def _on_pareto_click(self, trace: Any, points: Any, state: Any = None) -> None:
        idx = list(getattr(points, "point_inds", []) or [])
        if idx and getattr(trace, "customdata", None) is not None:
            self.on_pareto_point(int(trace.customdata[idx[0]]))

    def search_point(self, step: int) -> SearchPoint | None:
        """The measured point of the last search with that step number."""
        if self.last_search is None:
            return None
        for p in (*self.last_search.steps, *self.last_search.evaluated):
            if p.step == step:
                return p
        return None

    def on_pareto_point(self, step: int) -> None:
        """Apply a point of the search curve: promote exactly its tensors (replacing the current promotion)."""
        point = self.search_point(step)
        if point is None:
            self.status = f"no search point {step}"
            return
        if point.label == "all16":  # a different recipe (every activation 16-bit), not a promotion set
            self.status = "the all-16-bit point is the ceiling: quantize with activation_type uint16 to use it"
            return
        if not point.promoted:
            self.debugger.reset()
            self.refresh()
            self.before_after.value = ""
            self.status = "search point 0 is the base: every promotion dropped"
            return
        tensors = list(point.promoted)
        self._apply(lambda: self.debugger.promote(tensors, replace=True), f"search point {step}")

    # ------------------------------------------------------------------ Netron (opt-in)
    def on_netron_clicked(self, b: Any = None) -> None:
        """Open (or close) the current quantized model in Netron, served from 127.0.0.1 (docs/netron.md)."""
        if self.netron is not None:
            try:
                self.netron.stop()
            finally:
                self.netron = None
                self.netron_view.value = ""
                self.netron_button.description = "Open in Netron (opt-in)"
            self.status = "Netron stopped"
            return
        try:
            from . import netron_view

            info = netron_view.netron_build_info()
            if netron_view.netron_expired():
                # Its page would loop on "Please update to the newest version": say so instead of opening it.
                self.status = (
                    f"Netron {info.version} refuses to run since {info.expires:%Y-%m-%d} (180 days after its "
                    "build): upgrade it with pip install -U netron"
                )
                return
            self.netron = netron_view.open_in_netron(self.debugger.quant_model_path)
            frame = netron_view.netron_iframe_html(self.netron.url)
        except Exception as exc:
            self.status = f"Netron unavailable: {type(exc).__name__}: {exc}"
            return
        self.netron_view.value = (
            "<p><i>Netron is a third-party viewer: offline it needs a consent cookie, after consent it contacts "
            "Google Analytics, and its releases stop working 180 days after their build (docs/netron.md). "
            f"It only shows the graph; the colours by error are in the view above.</i></p>{frame}"
        )
        self.netron_button.description = "Stop Netron"
        left = info.days_left()
        self.status = f"Netron serving a copy of the model at {self.netron.url}" + (
            "" if left is None else f" (netron {info.version} stops working in {left:.0f} days)"
        )

    def show(self) -> DebuggerApp:
        """The root widget (display it in a notebook or Voila)."""
        return self


__all__ = ["METRICS", "PAGE_SIZE", "SORT_KEYS", "DebuggerApp"]
