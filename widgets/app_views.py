"""The debugger's views of the current report: the tensor table (filter, sort, pages), the heatmaps, the graph, the
inspector and the suggestions list, with the observers that redraw them from the view state and the selection
handlers (a click on a table row, a heatmap cell or a graph node inspects that tensor)."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ipywidgets as w
import traitlets as tr

from qdebug.render.bands import SQNR_HIGH
from qdebug.render.fmt import fmt_task
from qdebug.render.text import capture_line

from .app_base import SORT_KEYS, AppBase, db_text
from .app_figure import figure, on_click, placeholder

if TYPE_CHECKING:
    import pandas as pd

    from qdebug.mixed.suggest import Suggestion
    from qdebug.report import DebugReport

__all__ = ["LABELS", "PAGE_SIZE", "SUGGESTIONS_SHOWN", "TensorViews"]

#: What the pickers show for the table's and the graph's columns (the data keeps its column names).
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


def _weight_owners(float_model: Any, df: Any) -> dict[str, str] | None:
    """Map fused nodes (Conv followed by a removed Relu) to the tensor that shows their weights."""
    from qdebug.tensor_values import weight_owners

    return weight_owners(float_model, map(str, df["tensor_name"]))


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
    return f"<span style='{style};padding:0 4px'>{html.escape(db_text(f))}</span>"


@dataclass(frozen=True)
class _ReportViews:
    """The per-report data behind the views (``report`` is the object it was derived from)."""

    report: DebugReport
    df: pd.DataFrame
    weights: pd.DataFrame
    owners: dict[str, str] | None
    suggestions: tuple[Suggestion, ...]
    table: pd.DataFrame


class TensorViews(AppBase):
    """The views of the current report and the selection (a room of :class:`~widgets.app.DebuggerApp`)."""

    # ------------------------------------------------------------------ building the widgets
    def _make_table_widgets(self) -> None:
        """The tensor table with its filter/sort/page controls (one widget row per visible tensor)."""
        self.capture_note = w.HTML("")  # which capture backend ran, and every sample that fell back
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

    def _make_view_widgets(self) -> None:
        """The figure containers, the graph panel, the inspector and the suggestions list."""
        self._views: _ReportViews | None = None
        self._syncing = False
        self.heatmap_box = w.VBox(layout=w.Layout(width="100%"))  # a column stretches the figure: full width
        self.samples_box = w.VBox(layout=w.Layout(width="100%"))
        self.heatmap_groups = w.Checkbox(description="group by scope / block", value=False, indent=False)
        self.heatmap_groups.add_class("qd-heatmap-groups")
        self.heatmap_groups.observe(lambda ch: self._render_heatmap(), names="value")
        from .graph_view import GraphPanel

        self.graph_panel = GraphPanel(self.on_select, lambda m: setattr(self, "metric", m), self.metric)
        self.graph_box = self.graph_panel.box  # holds the live graph figure
        self.metric_picker = self.graph_panel.colour_picker  # local (where the error is born) / cumulative / …
        self.tensor_picker = w.Dropdown(description="tensor", options=[])
        from .inspector import InspectorPanel

        self.inspector_panel = InspectorPanel()
        self.inspector = self.inspector_panel.table
        self.histogram_box = self.inspector_panel.histogram_box
        self.suggestion_boxes: dict[str, w.Checkbox] = {}
        self.suggestions_box = w.VBox()
        self.promotion_view = w.HTML("")

    def _wire_views(self) -> None:
        """CSS classes for the browser tests, the page buttons, and the pickers ↔ view state links."""
        for widget, cls in (
            (self.table, "qd-table"),
            (self.filter_box, "qd-filter"),
            (self.sort_picker, "qd-sort"),
            (self.next_button, "qd-next-page"),
            (self.prev_button, "qd-prev-page"),
            (self.inspector, "qd-inspector"),
            (self.promotion_view, "qd-promotion"),
        ):
            widget.add_class(cls)
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

    def _tensors_tab(self) -> w.VBox:
        """The tensor table under its filter, sort and page controls."""
        return w.VBox(
            [
                w.HBox([self.filter_box, self.sort_picker, self.desc_box]),
                w.HBox([self.threshold_picker, self.low_box, self.prev_button, self.page_label, self.next_button]),
                self.table,
            ]
        )

    def _inspector_column(self) -> w.VBox:
        """The tensor inspector with its picker."""
        return w.VBox(
            [w.HTML("<b>Tensor inspector</b>"), self.tensor_picker, self.inspector_panel],
            layout=w.Layout(width="50%"),
        )

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
        samples = figure("samples_heatmap", report.per_sample.to_dataframe(), css="qd-samples-heatmap")
        on_click(samples, self.on_samples_click)
        self.samples_box.children = [samples]
        self._render_inspector()

    def _render_heatmap(self) -> None:
        v = self.views()
        # The graph's groups (name scopes or blocks), so both views speak of the same regions.
        groups = self.graph_panel.grouping.labels() if self.heatmap_groups.value else None  # as many as the graph
        heat = figure("layer_heatmap", v.df, v.weights, "h", 40, v.owners, groups, css="qd-heatmap")
        on_click(heat, self.on_heatmap_click)
        self.heatmap_box.children = [heat]

    @staticmethod
    def _notes_html(report: DebugReport) -> str:
        """How the tensors were captured, and every warning of the report (e.g. a QDQ scale that cannot be right)."""
        line = f"<span class='qd-capture'>{html.escape(capture_line(report.meta.capture) or '')}</span>"
        if report.task is not None:  # the user's task beside the SQNR: whether the answer changed
            line = f"<div class='qd-task'>{html.escape(fmt_task(report.task))}</div>" + line
        warns = "".join(f"<li>{html.escape(w)}</li>" for w in report.meta.warnings)
        return line + (f"<ul class='qd-warnings' style='color:#c92a2a'>{warns}</ul>" if warns else "")

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
            label = self.debugger.suggestion_text(s)  # the estimate, and what it measured once promoted
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
        # Grouped, laid out and drawn by qdebug.render.graph_view; colours follow the chosen metric (mse too).
        rows = self.views().df.sort_values("topo_index", kind="stable").to_dict("records")
        try:
            self.graph_panel.show(rows, self.metric, self.selected)
        except Exception as exc:  # a figure bug must not take the dashboard down
            self.graph_box.children = [placeholder("graph", f"{type(exc).__name__}: {exc}")]

    def _render_inspector(self) -> None:
        if not self.selected:
            self.inspector_panel.clear()
            return
        self.inspector_panel.show(self.debugger, self.selected, self.views().owners)

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

    def _on_picker(self, change: dict[str, Any]) -> None:
        if change["new"]:
            self.selected = change["new"]

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
