"""``GraphPanel``: the model graph tab. View state only (expanded groups, the metric, the selected tensor);
the grouping, layout and figure come from :mod:`qdebug.render.graph_view`.

Its colouring toggle (``colour_picker``) chooses what the nodes show: where the error is born (local SQNR, the
default: a block is red where its own rounding hurts) or the error accumulated so far (cumulative SQNR: every block
after the first loss is red), or an error metric. Whoever lays the tab out places the toggle.

A click on a group expands it; a click on a tensor calls ``on_select(name)`` with the tensor under the pointer
(the node trace's own ``customdata``, never an index into another list); the search box selects the first
tensor whose name contains the text and expands its group; "worst path" draws the way from the worst tensor
back to the inputs.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ipywidgets as w

from qdebug.render import graph_view as gv

#: The colouring toggle's choices: (label, report column); local SQNR first, the default.
COLOUR_OPTIONS = (
    ("where the error is born (local SQNR)", "local_sqnr_db"),
    ("accumulated (cumulative SQNR)", "cumulative_sqnr_db"),
    ("mean squared error", "mse"),
    ("max abs error", "max_abs_error"),
)


class GraphPanel(w.VBox):  # type: ignore[misc]
    """The graph view of one report's tensors; call :meth:`show` with a new report's rows to redraw."""

    def __init__(
        self,
        on_select: Callable[[str], None],
        on_colour: Callable[[str], None] | None = None,
        metric: str = "local_sqnr_db",
        **kwargs: Any,
    ) -> None:
        self.on_select = on_select
        self.on_colour = on_colour
        self.colour_picker = w.ToggleButtons(options=COLOUR_OPTIONS, value=metric, description="colour",
                                             style={"button_width": "auto"})  # fmt: skip
        self.colour_picker.add_class("qd-graph-colour")
        self.colour_picker.observe(lambda ch: self.colour(str(ch["new"])), names="value")
        self.search_box = w.Text(placeholder="tensor name", description="find", continuous_update=False)
        self.expand_all = w.Button(description="expand all", layout=w.Layout(width="auto"))
        self.collapse_all = w.Button(description="collapse all", layout=w.Layout(width="auto"))
        self.note = w.HTML("")
        self.box = w.VBox(layout=w.Layout(width="100%"))  # a column stretches the figure to the full width
        self.search_box.add_class("qd-graph-search")
        self.expand_all.add_class("qd-graph-expand-all")
        self.collapse_all.add_class("qd-graph-collapse-all")
        self.note.add_class("qd-graph-note")
        self.search_box.observe(lambda ch: self.find(str(ch["new"])), names="value")
        self.expand_all.on_click(self.on_expand_all)
        self.collapse_all.on_click(self.on_collapse_all)
        super().__init__([w.HBox([self.search_box, self.expand_all, self.collapse_all]), self.note, self.box],
                         **kwargs)  # fmt: skip
        self.names: list[str] = []
        self.edges: list[tuple[str, str]] = []
        self.rows: Mapping[str, Mapping[str, Any]] = {}
        self.grouping: gv.Grouping = gv.Grouping((), "none", {})
        self.expanded: set[str] = set()
        self.metric = metric
        self.selected = ""
        self.view: gv.GraphView | None = None
        self.figure: Any = None
        self.path: list[str] = []
        # Layered drawings by expanded set: grandalf's Sugiyama is most of an "expand all" (1 s on 374 tensors),
        # and the same few views (grouped, all expanded, one group open) come back again and again.
        self._views: dict[frozenset[str], gv.GraphView] = {}

    # ------------------------------------------------------------------ data
    def show(self, rows: Sequence[Mapping[str, Any]], metric: str, selected: str = "") -> None:
        """Draw the tensors of ``rows`` (``DebugReport.to_dataframe()`` records, topological order). The grouping
        is kept while the tensors stay the same (a promotion), so expanded groups stay expanded."""
        names = [str(r["tensor_name"]) for r in rows]
        self.rows = {str(r["tensor_name"]): r for r in rows}
        if names != self.names:
            self.names = names
            known = set(names)
            self.edges = [(str(i), n) for n in names for i in (self.rows[n].get("inputs") or ()) if str(i) in known]
            ops = {n: str(self.rows[n].get("producer_op", "")) for n in names}
            sizes = {n: int(e) for n in names if isinstance(e := self.rows[n].get("elements"), int | float)}
            nodes = {n: str(self.rows[n].get("producer_node") or "") for n in names}
            self.grouping = gv.group_tensors(names, self.edges, ops, sizes=sizes, scopes=nodes)
            self.expanded = set()
            self.view = None
            self._views = {}
        self.metric = metric
        if self.colour_picker.value != metric and metric in {v for _, v in COLOUR_OPTIONS}:
            self.colour_picker.value = metric  # the observer sees the panel's metric already set: no redraw
        self.selected = selected
        self.redraw()

    def colour(self, metric: str) -> None:
        """Colour the nodes by ``metric`` (the toggle's choice): ``on_colour`` decides when given (the app keeps
        the metric as view state and redraws), else the panel redraws itself."""
        if metric == self.metric:
            return
        if self.on_colour is not None:
            self.on_colour(metric)
            return
        self.metric = metric
        self.redraw()

    def _values(self, key: str = "cumulative_sqnr_db") -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for n, r in self.rows.items():
            v = r.get(key)
            out[n] = None if v is None or isinstance(v, str) else float(v)
        return out

    def _worst_path(self) -> list[str]:
        """The orange path, walked back by cumulative SQNR (the damage carried); it starts at the worst tensor of the
        colouring: by local SQNR where the error is born (+inf, exact, and undefined left out), else cumulative."""
        cumulative = self._values()
        start = None
        if self.metric == "local_sqnr_db":
            local = {n: v for n, v in self._values("local_sqnr_db").items() if v is not None and v < math.inf}
            if not local:
                return []
            start = min(local, key=lambda n: local[n])
        return gv.worst_path(self.names, self.edges, cumulative, start)

    # ------------------------------------------------------------------ drawing
    def redraw(self) -> None:
        """Draw the current view as a new ``FigureWidget`` (the layout is computed once per expanded set).

        Why not update the live figure in place (one plotly update message instead of a new widget: 2.4 s → 0.4 s
        for "collapse all" in chromium, measured): in the browser test about one click in four after a window
        resize left the drawing unchanged although the kernel had sent the update (plotly's anywidget front end
        never applied it). A new widget always shows, and costs little since its front end is no longer sent with
        it (:mod:`widgets.live_figure`); the selection ring still moves
        in place."""
        if not self.names:
            self.box.children = []
            self.figure = None
            return
        if self.view is None:
            key = frozenset(self.expanded)
            if key not in self._views:
                self._views[key] = gv.graph_view(self.names, self.edges, self.grouping, self.expanded)
            self.view = self._views[key]
        self.path = self._worst_path()
        fig = gv.graph_view_figure(self.view, self.rows, self.metric, self.selected or None, self.path)
        self._new_widget(fig)
        worst = self.path[-1] if self.path else None
        self.note.value = (
            f"<span>{len(self.names)} tensors in {len(self.grouping.groups)} groups ({self.grouping.method}"
            + (f", {reps} of repeated blocks ×N" if (reps := sum(1 for g in self.grouping.groups if g.parts)) else "")
            + "); "
            "click a square to expand it, a circle to inspect the tensor. "
            + (
                f"Orange: the path from the worst tensor <b>{html.escape(worst)}</b>"
                + (" (lowest local SQNR: where the most error is born)" if self.metric == "local_sqnr_db" else "")
                + " back to the input."
                if worst
                else ""
            )
            + "</span>"
        )

    def _new_widget(self, fig: Any) -> None:
        from .live_figure import live_figure

        widget = live_figure(fig)
        widget._dom_classes = ("qd-graph",)
        widget._config = {**widget._config, "responsive": True}  # full width once shown (widgets/resize.py)
        nodes = next(t for t in widget.data if t.name == "nodes")
        nodes.on_click(self.on_node_click)
        self.figure = widget
        self.box.children = [widget]

    def _set_expanded(self, keys: set[str]) -> None:
        self.expanded = keys
        self.view = None
        self.redraw()

    def on_expand_all(self, b: Any = None) -> None:
        """Draw every tensor (the full layered graph)."""
        self._set_expanded({k for g in self.grouping.groups for k in (g.key, *(p.key for p in g.parts))})

    def on_collapse_all(self, b: Any = None) -> None:
        """Back to one node per group."""
        self._set_expanded(set())

    def expand(self, key: str) -> None:
        """Expand one group (a click on its square)."""
        self._set_expanded(self.expanded | {key})

    def select(self, tensor: str) -> None:
        """Move the ring onto ``tensor`` (or its collapsed group) without rebuilding the figure."""
        self.selected = tensor
        if self.figure is None or self.view is None:
            return
        with self.figure.batch_update():
            gv.ring_at(self.figure, self.view, tensor)

    def find(self, query: str) -> list[str]:
        """Select the first tensor whose name contains ``query``, expanding its group; returns the matches."""
        hits = gv.find_tensors(self.names, query)
        if not query.strip():
            return hits
        if not hits:
            self.note.value = f"<span class='qd-graph-nohit'>no tensor name contains {html.escape(query)!s}</span>"
            return hits
        keys = {k for k in (self.grouping.of.get(hits[0]), self.grouping.part_of.get(hits[0])) if k is not None}
        keys = {k for k in keys if len(self.grouping.group(k).members) > 1}
        if not keys <= self.expanded:
            self.expanded = self.expanded | keys
            self.view = None
        self.selected = hits[0]
        self.redraw()
        self.on_select(hits[0])
        return hits

    def on_node_click(self, trace: Any, points: Any, state: Any = None) -> None:
        """A click on the node trace: expand a group, or select the tensor under the pointer."""
        idx = list(getattr(points, "point_inds", []) or [])
        if not idx or trace.customdata is None:
            return
        kind, node = trace.customdata[idx[0]]
        if kind == gv.GROUP:
            self.expand(str(node))
        else:
            self.on_select(str(node))


__all__ = ["COLOUR_OPTIONS", "GraphPanel"]
