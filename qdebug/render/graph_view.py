"""The model graph view: tensors collapsed into groups (name scopes, or blocks of the graph when names carry
no scope), a layered drawing of what is visible, the path of the worst tensor back to the inputs, and the
plotly figure of it. Its widget is :mod:`widgets.graph_view`.

Pure functions of the report's tensors and edges (no widget, no file): a view widget keeps only which groups
are expanded and which tensor is selected, and calls :func:`graph_view` and :func:`graph_view_figure`.

The groups are made in :mod:`qdebug.render.graph_view_groups` (how: its docstring), what is visible in
:mod:`qdebug.render.graph_view_nodes`; this module draws the figure and names the view's whole API, so that the
widget and its callers read one namespace.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from qdebug._lazy import LazyModule
from qdebug.render.bands import GREY, HIGHLIGHT, SQNR_COLORSCALE, SQNR_HIGH, SQNR_LOW, Z_MAX, Z_MIN, sqnr_color
from qdebug.render.fmt import fmt_db_text
from qdebug.render.graph_view_groups import MAX_GROUPS, Group, Grouping, group_tensors, merge_repeats, scope_path
from qdebug.render.graph_view_nodes import (
    GROUP,
    TENSOR,
    GraphView,
    find_tensors,
    graph_view,
    ranks_respect_edges,
    worst_path,
)

if TYPE_CHECKING:
    import plotly.graph_objects as go
else:
    go = LazyModule("plotly.graph_objects")

#: Graph figures get 48 px per layer up to this height (px), then 10 px per layer (and smaller markers).
MAX_HEIGHT = 2400
#: Metrics the view colours by; the SQNR ones use the anchored bands, the error ones a log scale.
SQNR_METRICS = ("local_sqnr_db", "cumulative_sqnr_db")
ERROR_METRICS = ("mse", "max_abs_error")
#: What each colouring shows, for the title and the colour bar: local SQNR is where the error is born (the
#: tensor's own rounding), cumulative SQNR the error that has reached the tensor (red from the first loss on).
COLOURINGS = {
    "local_sqnr_db": ("where the error is born", "local SQNR"),
    "cumulative_sqnr_db": ("error accumulated so far", "cumulative SQNR"),
    "mse": ("error accumulated so far", "mean squared error"),
    "max_abs_error": ("error accumulated so far", "max abs error"),
}
_ERROR_SCALE: list[list[float | str]] = [[0.0, "#fff5f0"], [0.5, "#fb6a4a"], [1.0, "#67000d"]]


def _metric_value(row: Mapping[str, Any], metric: str) -> float | None:
    v = row.get(metric)
    if v is None or isinstance(v, str):
        return None
    f = float(v)
    return None if math.isnan(f) else f


def _worst(vals: Sequence[float | None], metric: str) -> float | None:
    known = [v for v in vals if v is not None]
    if not known:
        return None
    return min(known) if metric in SQNR_METRICS else max(known)


def _colours(values: Sequence[float | None], metric: str) -> list[str] | list[float | None]:
    if metric in SQNR_METRICS:
        return [sqnr_color(v) for v in values]
    return [None if v is None or v <= 0 else math.log10(v) for v in values]


def _fmt_metric(v: float | None, metric: str) -> str:
    if metric in SQNR_METRICS:
        return fmt_db_text(v)
    return "n/a" if v is None else f"{v:.3g}"


@dataclass(frozen=True)
class _NodeTexts:
    hover: list[str]
    labels: list[str]
    values: list[float | None]


def _node_texts(view: GraphView, rows: Mapping[str, Mapping[str, Any]], metric: str) -> _NodeTexts:
    hover, labels, values = [], [], []
    for node in view.nodes:
        mem = view.members[node]
        worst = _worst([_metric_value(rows.get(m, {}), metric) for m in mem], metric)
        values.append(worst)
        if view.kind[node] == GROUP:
            group = view.grouping.group(node)
            label = group.label
            ops = Counter(str(rows.get(m, {}).get("producer_op", "?")) for m in mem).most_common(4)
            repeat = f" in {len(group.parts)} identical blocks" if group.parts else ""
            hover.append(
                f"<b>{label}</b><br>{len(mem)} tensors{repeat}: "
                + ", ".join(f"{o}×{k}" for o, k in ops)
                + f"<br>worst {metric}: {_fmt_metric(worst, metric)}<br><i>click to expand</i>"
            )
            short = label if len(label) <= 34 else label[:33] + "…"
            labels.append(f"{short} ({len(mem)})")
        else:
            r = rows.get(node, {})
            hover.append(
                f"<b>{node}</b><br>op: {r.get('producer_op')} ({r.get('producer_node')})"
                f"<br>type: {r.get('quant_type') or 'float'}"
                f"<br>local: {fmt_db_text(_metric_value(r, 'local_sqnr_db'))}"
                f"<br>cumulative: {fmt_db_text(_metric_value(r, 'cumulative_sqnr_db'))}"
                + ("" if metric in SQNR_METRICS else f"<br>{metric}: {_fmt_metric(worst, metric)}")
            )
            labels.append(str(r.get("producer_op", "")))
    return _NodeTexts(hover, labels, values)


def _path_lines(view: GraphView, path: Sequence[str]) -> tuple[list[float | None], list[float | None]]:
    """The worst path mapped onto visible nodes, drawn along the edges' routes."""
    seq: list[str] = []
    for t in path:
        n = view.node_of(t)
        if n in view.kind and (not seq or seq[-1] != n):
            seq.append(n)
    xs: list[float | None] = []
    ys: list[float | None] = []
    for a, b in itertools.pairwise(seq):
        pts = view.drawing.routes.get((a, b)) or [view.drawing.pos[a], view.drawing.pos[b]]
        xs += [p[0] for p in pts] + [None]
        ys += [p[1] for p in pts] + [None]
    if len(seq) == 1:
        x, y = view.drawing.pos[seq[0]]
        xs, ys = [x], [y]
    return xs, ys


def _colour_scale(marker: dict[str, Any], values: Sequence[float | None], metric: str) -> dict[str, Any]:
    """Colour ``marker`` by ``values`` and return the marker of the trace that draws the colour bar."""
    if metric in SQNR_METRICS:
        marker["color"] = _colours(values, metric)
        scale = {"color": [Z_MIN], "colorscale": SQNR_COLORSCALE, "cmin": Z_MIN, "cmax": Z_MAX, "showscale": True,
                 "colorbar": {"title": {"text": f"{COLOURINGS[metric][1]}<br>dB"},
                              "tickvals": [0, SQNR_LOW, SQNR_HIGH, Z_MAX]}}  # fmt: skip
    else:
        logs = [v for v in _colours(values, metric) if isinstance(v, float)]
        lo, hi = (min(logs), max(logs)) if logs else (0.0, 1.0)
        marker.update(color=[GREY if v is None else v for v in _colours(values, metric)])
        marker.update(colorscale=_ERROR_SCALE, cmin=lo, cmax=hi if hi > lo else lo + 1)
        if any(v is None for v in values):  # a mix of numbers and grey names is not allowed by plotly
            marker["color"] = [lo if v is None else v for v in _colours(values, metric)]
        scale = {"color": [lo], "colorscale": _ERROR_SCALE, "cmin": lo, "cmax": marker["cmax"], "showscale": True,
                 "colorbar": {"title": {"text": f"log10 {metric}"}}}  # fmt: skip
    return scale


def graph_view_figure(
    view: GraphView,
    rows: Mapping[str, Mapping[str, Any]],
    metric: str = "cumulative_sqnr_db",
    selected: str | None = None,
    path: Sequence[str] = (),
    label_limit: int = 150,
) -> go.Figure:
    """The figure of a :class:`GraphView`: ``rows`` maps each tensor to its report row (a dict of
    ``DebugReport.to_dataframe()`` columns). Top to bottom, one layer per rank; edges follow their routes.

    Nodes are coloured by ``metric`` (a group by its worst member: lowest SQNR, highest error), which the title
    and the colour bar name (:data:`COLOURINGS`: local SQNR shows where the error is born); SQNR metrics use
    the anchored bands, ``mse`` / ``max_abs_error`` a log10 red scale. Every node's ``customdata`` is
    ``[kind, id]`` (:data:`GROUP` + group key, or :data:`TENSOR` + tensor name). Traces: ``edges``, ``path``
    (``path``, the worst tensor's way back to the inputs), ``nodes``, ``selected`` (a ring on the node showing
    ``selected``, not clickable). Labels (group names, op types of tensors) up to ``label_limit`` nodes.
    """
    if metric not in SQNR_METRICS + ERROR_METRICS:
        raise ValueError(f"graph_view_figure: unknown metric {metric!r} ({', '.join(SQNR_METRICS + ERROR_METRICS)})")
    pos = view.drawing.pos
    # Coordinates go in as float arrays (NaN breaks a line): plotly validates arrays in one copy, lists element by
    # element, which was a third of an "expand all" on a 374-tensor model.
    pts: list[tuple[float, float]] = []
    for e in view.edges:
        pts += view.drawing.routes.get(e) or [pos[e[0]], pos[e[1]]]
        pts.append((math.nan, math.nan))
    exy = np.array(pts, dtype=float).reshape(-1, 2)
    texts = _node_texts(view, rows, metric)
    ranks = max(view.drawing.ranks.values(), default=0) + 1
    height = int(max(min(MAX_HEIGHT, 60 + 48 * ranks), 420, 40 + 10 * ranks))  # ≥ 10 px per layer
    # Markers never overlap the next layer: overlapping markers are how a click on one tensor selected its
    # neighbour (issue 15: 364 layers squeezed into 360 px). Zooming in spreads the layers, not the markers.
    cap = max(4.0, 0.8 * (height - 40) / ranks)
    sizes = np.array([min(cap, 12 if view.kind[n] == TENSOR else 14 + 3 * math.sqrt(len(view.members[n])))
                      for n in view.nodes], dtype=float)  # fmt: skip
    symbols = ["circle" if view.kind[n] == TENSOR else "square" for n in view.nodes]
    show = len(view.nodes) <= label_limit
    marker: dict[str, Any] = {"size": sizes, "symbol": symbols, "line": {"width": 1, "color": "#495057"}}
    scale = _colour_scale(marker, texts.values, metric)
    px, py = _path_lines(view, path)
    traces = [
        go.Scatter(x=exy[:, 0], y=exy[:, 1], mode="lines", name="edges", hoverinfo="skip", showlegend=False,
                   line={"width": 1, "color": "#adb5bd"}),
        go.Scatter(x=px, y=py, mode="lines+markers" if len(px) == 1 else "lines", name="path", hoverinfo="skip",
                   showlegend=False, line={"width": 4, "color": "#e8590c"}, opacity=0.6),
        go.Scatter(
            x=np.array([pos[n][0] for n in view.nodes], dtype=float),
            y=np.array([pos[n][1] for n in view.nodes], dtype=float), name="nodes",
            mode="markers+text" if show else "markers", text=texts.labels if show else None,
            textposition="middle right", textfont={"size": 10}, customdata=[[view.kind[n], n] for n in view.nodes],
            hovertext=texts.hover, hoverinfo="text", marker=marker, showlegend=False,
        ),
        go.Scatter(x=[None], y=[None], mode="markers", name="scale", hoverinfo="skip", showlegend=False,
                   marker=scale),
        go.Scatter(x=[], y=[], mode="markers", name="selected", hoverinfo="skip", showlegend=False,
                   marker={"size": 26, "color": "rgba(0,0,0,0)", "line": {"width": 3, "color": HIGHLIGHT}}),
    ]  # fmt: skip
    fig = go.Figure(traces)
    if selected:
        ring_at(fig, view, selected)
    fig.update_layout(
        xaxis={"visible": False}, yaxis={"visible": False, "autorange": "reversed"},
        hovermode="closest", plot_bgcolor="white", dragmode="pan",
        height=height, margin={"l": 10, "r": 10, "t": 30, "b": 10},
        title={"text": f"{len(view.nodes)} nodes ({view.grouping.method}); colour: {COLOURINGS[metric][0]} — "
                       f"worst {COLOURINGS[metric][1]} of each node ({metric})", "font": {"size": 13}},
    )  # fmt: skip
    return fig


def ring_at(fig: go.Figure, view: GraphView, tensor: str) -> str | None:
    """Move the ``selected`` ring of ``fig`` onto the node showing ``tensor`` (its group when collapsed);
    returns that node (``None``: the tensor is not in the view, the ring is hidden)."""
    node = view.node_of(tensor)
    ring = next(t for t in fig.data if t.name == "selected")
    if node not in view.drawing.pos:
        ring.x, ring.y = [], []
        return None
    x, y = view.drawing.pos[node]
    ring.x, ring.y = [x], [y]
    return node


#: The grouping and the visible nodes are made in their own rooms; the view is one namespace for its widget.
__all__ = [
    "COLOURINGS",
    "GROUP",
    "MAX_GROUPS",
    "TENSOR",
    "GraphView",
    "Group",
    "Grouping",
    "find_tensors",
    "graph_view",
    "graph_view_figure",
    "group_tensors",
    "merge_repeats",
    "ranks_respect_edges",
    "ring_at",
    "scope_path",
    "worst_path",
]
