"""The graph as one figure (:func:`graph_figure`: every tensor a node coloured by its SQNR, laid out by
:func:`qdebug.render.layout.layered_layout`) and its edges (:func:`graph_edges`), as the HTML report draws it. The
grouped, expandable view the dashboard shows is :mod:`qdebug.render.graph_view`. The colours follow
:mod:`qdebug.render.figures`' anchoring."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING

import pandas as pd

from qdebug._lazy import LazyModule
from qdebug.render.bands import HIGHLIGHT, SQNR_COLORSCALE, SQNR_HIGH, SQNR_LOW, Z_MAX, Z_MIN, sqnr_color
from qdebug.render.figures_base import as_number, db_text, in_graph_order, short_name
from qdebug.render.layout import layered_layout

if TYPE_CHECKING:
    import plotly.graph_objects as go
else:  # plotly is the ``ui`` extra: imported on the first figure, a missing one names the extra then
    go = LazyModule("plotly.graph_objects")


def graph_edges(df: pd.DataFrame) -> list[tuple[str, str]]:
    """``(input, tensor)`` edges from the ``inputs`` column, keeping only inputs that are tensors of ``df``."""
    names = set(map(str, df["tensor_name"]))
    return [
        (str(i), str(a.tensor_name)) for a in df.itertuples(index=False) for i in (a.inputs or ()) if str(i) in names
    ]


def _edge_lines(
    edges: Sequence[tuple[str, str]], pos: Mapping[Hashable, tuple[float, float]]
) -> tuple[list[float | None], list[float | None]]:
    """All edges as one polyline with ``None`` separators (one trace is fast on ~900 nodes)."""
    ex: list[float | None] = []
    ey: list[float | None] = []
    for a, b in edges:
        (x0, y0), (x1, y1) = pos[a], pos[b]
        ex += [x0, x1, None]
        ey += [y0, y1, None]
    return ex, ey


def _node_styles(d: pd.DataFrame, metric: str) -> tuple[list[str], list[str]]:
    """Each node's colour (by ``metric``) and hover text."""
    col, stcol = f"{metric}_sqnr_db", f"{metric}_status"
    colors, hover = [], []
    for a in d.itertuples(index=False):
        v = as_number(getattr(a, col))
        s = str(getattr(a, stcol))
        colors.append(sqnr_color(v))
        hover.append(
            f"<b>{a.tensor_name}</b><br>op: {a.producer_op} ({a.producer_node})<br>type: {a.quant_type or 'float'}"
            f"<br>local: {db_text(as_number(a.local_sqnr_db), str(a.local_status))}"
            f"<br>cumulative: {db_text(as_number(a.cumulative_sqnr_db), str(a.cumulative_status))}"
            + (f"<br>status: {s}" if v is None else "")
        )
    return colors, hover


def graph_figure(
    df: pd.DataFrame,
    metric: str = "cumulative",
    layout: Mapping[Hashable, tuple[float, float]] | None = None,
    selected: str | None = None,
    label_limit: int = 60,
) -> go.Figure:
    """The model graph as a layered DAG: one node per activation tensor, edges from the ``inputs`` column.

    ``metric`` is ``"local"`` or ``"cumulative"``; node colours follow the module's anchoring (undefined/nonfinite
    and not-quantized grey). ``layout`` are precomputed positions (e.g. cached by the session) — by default
    :func:`qdebug.render.layout.layered_layout` (grandalf's Sugiyama). Edges are one line trace with ``None``
    separators (fast on ~900 nodes); nodes are one marker trace whose ``customdata`` is the tensor name (for
    click handlers); ``selected`` adds a highlight ring trace. Names are drawn as labels up to ``label_limit``
    nodes; above that only the hover shows them. Traces: ``edges``, ``tensors``, ``scale`` (colour bar only) and
    optionally ``selected``.
    """
    if metric not in ("local", "cumulative"):
        raise ValueError(f"graph_figure: metric must be 'local' or 'cumulative', got {metric!r}")
    d = in_graph_order(df)
    names = [str(n) for n in d["tensor_name"]]
    edges = graph_edges(d)
    pos = dict(layout) if layout is not None else layered_layout(names, edges)
    missing = [n for n in names if n not in pos]
    if missing:
        raise ValueError(f"graph_figure: layout has no position for {len(missing)} tensors, e.g. {missing[0]!r}")
    ex, ey = _edge_lines(edges, pos)
    colors, hover = _node_styles(d, metric)
    xs = [pos[n][0] for n in names]
    ys = [pos[n][1] for n in names]
    show_labels = len(names) <= label_limit
    traces: list[go.Scatter] = [
        go.Scatter(
            x=ex, y=ey, mode="lines", name="edges", hoverinfo="skip", line={"width": 1, "color": "#868e96"},
            showlegend=False,
        ),
        go.Scatter(
            x=xs, y=ys, mode="markers+text" if show_labels else "markers", name="tensors", customdata=names,
            text=[short_name(n, 24) for n in names] if show_labels else None, textposition="middle right",
            hovertext=hover, hoverinfo="text",
            marker={"color": colors, "size": 12, "line": {"width": 1, "color": "#495057"}}, showlegend=False,
        ),
        # Colour bar only: marker colours above are explicit, so the scale is shown by an invisible trace.
        go.Scatter(
            x=[None], y=[None], mode="markers", name="scale", hoverinfo="skip", showlegend=False,
            marker={
                "color": [Z_MIN], "colorscale": SQNR_COLORSCALE, "cmin": Z_MIN, "cmax": Z_MAX, "showscale": True,
                "colorbar": {"title": {"text": f"{metric} dB"}, "tickvals": [0, SQNR_LOW, SQNR_HIGH, Z_MAX]},
            },
        ),
    ]  # fmt: skip
    if selected is not None:
        if selected not in pos:
            raise ValueError(f"graph_figure: selected tensor {selected!r} is not in the graph")
        traces.append(
            go.Scatter(
                x=[pos[selected][0]], y=[pos[selected][1]], mode="markers", name="selected", customdata=[selected],
                hoverinfo="skip", showlegend=False,
                marker={"size": 22, "color": "rgba(0,0,0,0)", "line": {"width": 3, "color": HIGHLIGHT}},
            )
        )  # fmt: skip
    fig = go.Figure(traces)
    fig.update_layout(
        title=f"Model graph — {metric} SQNR",
        xaxis={"visible": False},
        yaxis={"visible": False, "autorange": "reversed"},
        hovermode="closest",
        plot_bgcolor="white",
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
    )
    return fig
