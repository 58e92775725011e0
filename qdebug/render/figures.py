"""Pure figure builders for every view (widgets, the HTML report): ``DataFrame`` (or a typed result) →
``plotly.graph_objects.Figure``. plotly (the ``ui`` extra) is imported when the first figure is built.

Nothing here touches ipywidgets, the file system or a kernel: every function takes data and options and returns
a new figure (or, for :func:`tensor_table`, a DataFrame), so the views can be tested without a browser.

**Colour anchoring** (:mod:`qdebug.render.bands`). All SQNR colours share one scale with fixed breakpoints at
``SQNR_LOW`` (20 dB) and ``SQNR_HIGH`` (40 dB): red below 20 dB, yellow from 20 to 40 dB, green above 40 dB.
Heatmaps use the custom colour scale ``SQNR_COLORSCALE`` with ``zmin=Z_MIN`` (0 dB) and ``zmax=Z_MAX`` (60 dB), so
20 dB and 40 dB sit exactly at 1/3 and 2/3 of the scale whatever the data's range; values outside [0, 60] dB
saturate at the ends (the hover still shows the true value). ``+inf`` (status ``identical``) is drawn at ``Z_MAX`` —
the top colour — with hover "identical (inf)". Missing values whose status is ``undefined`` or ``nonfinite`` are
drawn in :data:`GREY` by a second, single-colour trace and the status is shown on hover; values that simply do not
apply (``not_quantized`` local SQNR, a node without weights) are left blank.

The graph's figure lives in :mod:`qdebug.render.figures_graph`, the search's in :mod:`qdebug.render.figures_search`,
what they share in :mod:`qdebug.render.figures_base`; every figure is named here too, since this module is the one
namespace the dashboard looks a figure up in by name (``widgets.app_figure.figure``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from qdebug._lazy import LazyModule
from qdebug.render.bands import HIGHLIGHT
from qdebug.render.figures_base import (
    GREY_SCALE,
    MAX_TICK_LABELS,
    MISSING_SHOWN,
    as_number,
    db_text,
    heat_z,
    in_graph_order,
    make_subplots,
    short_name,
    sqnr_coloraxis,
)
from qdebug.render.figures_graph import graph_edges, graph_figure
from qdebug.render.figures_search import comparison_figure, pareto_figure
from qdebug.tensor_values import weight_owners as _engine_weight_owners

if TYPE_CHECKING:
    import onnx
    import plotly.graph_objects as go
else:  # plotly is the ``ui`` extra: imported on the first figure, a missing one names the extra then
    go = LazyModule("plotly.graph_objects")

#: Every figure builder, those of the graph and the search rooms included (see the module docstring).
__all__ = [
    "comparison_figure",
    "graph_edges",
    "graph_figure",
    "histogram_figure",
    "layer_heatmap",
    "make_subplots",
    "pareto_figure",
    "samples_heatmap",
    "tensor_table",
    "weight_owners",
    "weight_sqnr_by_tensor",
]


def weight_owners(float_model: onnx.ModelProto, df: pd.DataFrame) -> dict[str, str]:
    """``{node name: activation tensor}`` for nodes whose output is not an activation of ``df``
    (:func:`qdebug.tensor_values.weight_owners` on the table's tensors)."""
    return _engine_weight_owners(float_model, map(str, df["tensor_name"]))


def weight_sqnr_by_tensor(
    df: pd.DataFrame, weights: pd.DataFrame | None, owners: Mapping[str, str] | None = None
) -> dict[str, tuple[float | None, str, str]]:
    """Worst weight SQNR of each activation's producer node: ``{tensor: (value, status, weight names)}``.

    Each weight is mapped to the activation produced by its consumer node (``consumer_node`` ↔
    ``producer_node``); consumer nodes without an activation of their own are mapped through ``owners``
    (``{node: tensor}``, see :func:`weight_owners`), else left out. A ``nonfinite`` weight makes the node
    ``nonfinite``; otherwise the lowest value wins
    (``+inf`` only if every weight is identical); ``undefined`` weights count only when nothing else is known.
    """
    out: dict[str, tuple[float | None, str, str]] = {}
    if weights is None or weights.empty or "producer_node" not in df.columns:
        return out
    by_node: dict[str, list[tuple[float | None, str, str]]] = {}
    for w in weights.itertuples(index=False):
        by_node.setdefault(str(w.consumer_node), []).append(
            (as_number(w.weight_sqnr_db), str(w.weight_status), str(w.weight_name))
        )
    producers = {str(a.producer_node) for a in df.itertuples(index=False)}
    for node, tensor in (owners or {}).items():
        if node in by_node and node not in producers:
            by_node.setdefault(f"\0{tensor}", []).extend(by_node[node])
    for a in df.itertuples(index=False):
        ws = by_node.get(str(a.producer_node), []) + by_node.get(f"\0{a.tensor_name}", [])
        if not ws:
            continue
        names = ", ".join(n for _, _, n in ws)
        bad = [w for w in ws if w[1] == "nonfinite"]
        known = [w for w in ws if w[0] is not None]
        if bad:
            out[str(a.tensor_name)] = (None, "nonfinite", names)
        elif known:
            v, st, _ = min(known, key=lambda w: w[0] if w[0] is not None else math.inf)
            out[str(a.tensor_name)] = (v, st, names)
        else:
            out[str(a.tensor_name)] = (None, ws[0][1], names)
    return out


def _grid_traces(
    z: list[list[float | None]],
    status: list[list[str | None]],
    hover: list[list[str]],
    x: list[Any],
    y: list[Any],
) -> list[go.Heatmap]:
    """The value heatmap plus the grey heatmap of undefined/nonfinite cells (same grid, same hover)."""
    zz = [[np.nan if v is None else v for v in row] for row in z]
    grey = [
        [1.0 if (v is None and s in MISSING_SHOWN) else np.nan for v, s in zip(zr, sr, strict=True)]
        for zr, sr in zip(z, status, strict=True)
    ]
    # Gaps between cells only while cells are wide enough to keep them (900 columns of 1 px gaps are all gap).
    gap = 1 if max(len(x), len(y)) <= 200 else 0
    common: dict[str, Any] = {"x": x, "y": y, "text": hover, "hovertemplate": "%{text}<extra></extra>", "xgap": gap}
    main = go.Heatmap(z=zz, name="SQNR", hoverongaps=False, **common, **sqnr_coloraxis())
    missing = go.Heatmap(
        z=grey, name="undefined / nonfinite", colorscale=GREY_SCALE, showscale=False, zmin=0, zmax=1,
        hoverongaps=False, **common,
    )  # fmt: skip
    return [main, missing]


#: Group labels that fit side by side across a heatmap (slanted 12 px text on a page-wide figure).
GROUP_LABELS = 70


def _group_axis(
    idx: list[int], names: list[str], groups: Mapping[str, str]
) -> tuple[list[float], list[str], list[float]]:
    """(tick positions, group labels, boundaries) for a heatmap axis whose tensors are grouped: one tick per group
    (as many as the graph's groups), at the middle of its longest run in topological order; a boundary line
    wherever the group changes."""
    runs: dict[str, tuple[int, int]] = {}
    bounds: list[float] = []
    start = 0
    for i in range(1, len(names) + 1):
        if i == len(names) or groups.get(names[i], names[i]) != groups.get(names[start], names[start]):
            g = groups.get(names[start], names[start])
            if g not in runs or i - start > runs[g][1] - runs[g][0]:
                runs[g] = (start, i)
            if i < len(names):
                bounds.append((idx[i - 1] + idx[i]) / 2)
            start = i
    ticks = [(idx[a] + idx[b - 1]) / 2 for a, b in runs.values()]
    # Labels closer than a label's height would overlap: the bigger group keeps its label, a small neighbour's
    # stays blank (its tick, hover and the names above still tell it); a group as wide as the gap always fits.
    gap = len(names) / GROUP_LABELS
    kept: list[float] = []
    labels = [""] * len(ticks)
    for i in sorted(range(len(ticks)), key=lambda i: -(list(runs.values())[i][1] - list(runs.values())[i][0])):
        if all(abs(ticks[i] - t) >= gap for t in kept):
            kept.append(ticks[i])
            labels[i] = _group_label(list(runs)[i])
    return ticks, labels, bounds


def _group_label(label: str, n: int = 30) -> str:
    """A group's label for a tick: a run of blocks ``a/b.1 … a/b.3 ×3`` shortened to ``b.1 … b.3 ×3`` first."""
    if len(label) > n and " … " in label:
        first, last = label.split(" … ", 1)
        label = f"{first.rsplit('/', 1)[-1]} … {last.rsplit('/', 1)[-1]}"
    return short_name(label, n)


def _zoom_names(names: list[str], max_label_chars: int) -> dict[str, Any]:
    """A tensor axis whose names follow the zoom: plotly picks the ticks (a few across the whole model, every
    tensor once zoomed in) and ``labelalias`` writes each position's tensor name in place of the number."""
    alias = {str(i): short_name(n.removesuffix("_output_0"), max_label_chars) for i, n in enumerate(names)}
    # deep in a zoom plotly ticks every 0.5 or 0.1: those positions are no tensor, and show nothing
    alias.update({f"{i}.{d}": " " for i in range(len(names)) for d in range(1, 10)})
    return {"tickmode": "auto", "nticks": MAX_TICK_LABELS // 2, "labelalias": alias, "tickangle": -45,
            "showgrid": False, "zeroline": False}  # fmt: skip


def _tensor_axis(
    idx: list[int], names: list[str], max_label_chars: int, groups: Mapping[str, str] | None
) -> tuple[dict[str, Any], dict[str, Any] | None, list[float]]:
    """The tensor axis (group labels when grouped, else names) and, when grouped, a second axis on the other side
    with the tensor names that follow the zoom; and the boundaries between groups. Names all fit up to
    :data:`MAX_TICK_LABELS` tensors; past that some are written, and zooming in writes the rest."""
    if groups:
        ticks, labels, bounds = _group_axis(idx, names, groups)
        axis = {"tickmode": "array", "tickvals": ticks, "ticktext": labels, "tickangle": -45,
                "title": f"{len(ticks)} groups (as in the graph); tensor names above follow the zoom"}  # fmt: skip
        return axis, _zoom_names(names, min(max_label_chars, 32)), bounds
    if len(names) > MAX_TICK_LABELS:
        title = f"{len(names)} tensors, topological order (drag to zoom: every name appears)"
        return {**_zoom_names(names, max_label_chars), "title": title}, None, []
    labels = [short_name(n, max_label_chars) for n in names]
    return {"tickmode": "array", "tickvals": idx, "ticktext": labels, "title": "tensor"}, None, []


def _oriented(
    grid: Any,
    cells: tuple[list[list[float | None]], list[list[str | None]], list[list[str]]],
    idx: list[int],
    orientation: str,
    axes: tuple[dict[str, Any], dict[str, Any] | None, list[float]],
) -> go.Figure:
    """The heatmap with tensors on x (``"h"``) or y (``"v"``): its tensor axis, the names' axis on the other side
    when grouped, and the boundaries between groups."""
    z, st, hover = cells
    axis, names_axis, bounds = axes
    rows = ["local", "cumulative", "weight"]
    line = {"color": "#495057", "width": 0.6}  # thin: a scattered group (a head's glue) has many runs
    if orientation == "h":
        fig = go.Figure(grid(z, st, hover, idx, rows))
        fig.update_layout(xaxis=axis, yaxis={"autorange": "reversed", "fixedrange": True})
        if names_axis:  # an empty trace keeps the names' axis drawn, its range the x axis's
            fig.add_trace(go.Scatter(x=[], y=[], xaxis="x2", name="names", showlegend=False, hoverinfo="skip"))
            fig.update_layout(xaxis2={**names_axis, "overlaying": "x", "side": "top", "matches": "x"})
        for b in bounds:
            fig.add_vline(x=b, line=line)
        return fig
    if orientation != "v":
        raise ValueError(f"layer_heatmap: orientation must be 'h' or 'v', got {orientation!r}")
    tz = [list(r) for r in zip(*z, strict=True)]
    ts = [list(r) for r in zip(*st, strict=True)]
    th = [list(r) for r in zip(*hover, strict=True)]
    fig = go.Figure(grid(tz, ts, th, rows, idx))
    fig.update_layout(yaxis={**axis, "autorange": "reversed"}, xaxis={"fixedrange": True})
    if names_axis:
        fig.add_trace(go.Scatter(x=[], y=[], yaxis="y2", name="names", showlegend=False, hoverinfo="skip"))
        fig.update_layout(yaxis2={**names_axis, "overlaying": "y", "side": "right", "matches": "y"})
    for b in bounds:
        fig.add_hline(y=b, line=line)
    return fig


def layer_heatmap(
    df: pd.DataFrame,
    weights: pd.DataFrame | None = None,
    orientation: str = "h",
    max_label_chars: int = 40,
    owners: Mapping[str, str] | None = None,
    groups: Mapping[str, str] | None = None,
) -> go.Figure:
    """Tensors (topological order) × {local, cumulative, weight} SQNR as an anchored heatmap.

    ``df`` is :meth:`DebugReport.to_dataframe`, ``weights`` :meth:`DebugReport.weights_dataframe` (the weight
    row shows the worst weight of each tensor's producer node — and of fused nodes via ``owners`` — see
    :func:`weight_sqnr_by_tensor`).
    ``orientation="h"`` puts tensors on x (rows = metrics); ``"v"`` puts tensors on y. Colours follow the module's
    anchoring (red < 20 dB, yellow 20–40, green > 40; +inf top colour, undefined/nonfinite grey). Cells are
    addressed by their position in topological order (0..n-1, equal widths) and labelled with truncated names;
    the hover shows the full tensor name,
    op, quantization type, all three values and the statuses.

    Scaling to real models: every name is written up to :data:`MAX_TICK_LABELS` tensors; past that plotly writes
    as many as fit and zooming in writes the others (``labelalias``). ``groups`` (``{tensor: group label}``, the
    graph's :meth:`~qdebug.render.graph_view.Grouping.labels`) labels the axis with one tick per group, draws a
    boundary between groups, puts the group in the hover and the tensor names on a second axis on the other
    side; the figure fills its container's width and zooms with the mouse (double click resets).
    """
    d = in_graph_order(df)
    wmap = weight_sqnr_by_tensor(d, weights, owners)
    metrics = ("local", "cumulative", "weight")
    z: list[list[float | None]] = [[], [], []]
    st: list[list[str | None]] = [[], [], []]
    hover: list[list[str]] = [[], [], []]
    for a in d.itertuples(index=False):
        name = str(a.tensor_name)
        wv, wst, wnames = wmap.get(name, (None, "no weights", ""))
        vals = {
            "local": (as_number(a.local_sqnr_db), str(a.local_status)),
            "cumulative": (as_number(a.cumulative_sqnr_db), str(a.cumulative_status)),
            "weight": (wv, wst),
        }
        text = (
            f"<b>{name}</b><br>op: {a.producer_op}<br>type: {a.quant_type or 'float'}"
            f"<br>local: {db_text(*vals['local'])}<br>cumulative: {db_text(*vals['cumulative'])}"
            f"<br>weight: {db_text(wv, wst)}{' (' + wnames + ')' if wnames else ''}"
        )
        for i, m in enumerate(metrics):
            v, s = vals[m]
            z[i].append(heat_z(v))
            st[i].append(s)
            hover[i].append(f"<b>{m}</b>: {db_text(v, s)}<br>{text}")
    # Cells are addressed by position in topological order (0..n-1), not by topo_index: a model whose first
    # 420 nodes are Constants would otherwise give its first tensor a cell 420 columns wide.
    idx = list(range(len(d)))
    names = [str(n) for n in d["tensor_name"]]
    if groups:  # the hover names the group too
        hover = [[f"{h}<br>group: {groups.get(n, n)}" for h, n in zip(row, names, strict=True)] for row in hover]
    axis, names_axis, bounds = _tensor_axis(idx, names, max_label_chars, groups)
    fig = _oriented(_grid_traces, (z, st, hover), idx, orientation, (axis, names_axis, bounds))
    top = bool(names_axis) and orientation == "h"  # room above the cells for the names, below the title
    fig.update_layout(
        # No width: the container's full width (a tab shown later gets it through a window resize, see
        # widgets.resize); a fixed width left two thirds of a wide page empty.
        title={"text": "SQNR per tensor (topological order; drag to zoom, double click to reset)", "y": 1,
               "yref": "container", "yanchor": "top", "pad": {"t": 8}, "automargin": True},  # above the names
        autosize=True,
        margin={"l": 10, "r": 10, "t": 200 if top else 40, "b": 10}, dragmode="zoom", height=560 if top else None,
    )  # fmt: skip
    return fig


def samples_heatmap(per_sample_df: pd.DataFrame, max_label_chars: int = 40) -> go.Figure:
    """Samples × tensors per-sample cumulative SQNR (which inputs hurt), anchored like :func:`layer_heatmap`.

    ``per_sample_df`` is :meth:`PerSample.to_dataframe` (rows = samples, columns = tensors in topological order).
    NaN (undefined/nonfinite for that sample) is grey; ``+inf`` is the top colour with hover "identical (inf)".
    """
    names = [str(c) for c in per_sample_df.columns]
    samples = [int(s) if isinstance(s, int | np.integer) else s for s in per_sample_df.index]
    vals = per_sample_df.to_numpy(dtype=np.float64)
    z: list[list[float | None]] = []
    st: list[list[str | None]] = []
    hover: list[list[str]] = []
    for i, s in enumerate(samples):
        zr: list[float | None] = []
        sr: list[str | None] = []
        hr: list[str] = []
        for j, n in enumerate(names):
            v = as_number(vals[i, j])
            zr.append(heat_z(v))
            sr.append(None if v is not None else "undefined")
            hr.append(f"<b>{n}</b><br>sample {s}<br>cumulative: {db_text(v, 'undefined or nonfinite')}")
        z.append(zr)
        st.append(sr)
        hover.append(hr)
    cols = list(range(len(names)))
    fig = go.Figure(_grid_traces(z, st, hover, cols, samples))
    axis, _, _ = _tensor_axis(cols, names, max_label_chars, None)
    fig.update_layout(
        title="Per-sample cumulative SQNR",
        autosize=True,
        xaxis=axis,
        yaxis={"title": "sample", "autorange": "reversed", **_sample_ticks(samples)},
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
    )  # fmt: skip
    return fig


def _sample_ticks(samples: Sequence[Any]) -> dict[str, Any]:
    """Whole sample numbers on the axis (plotly's automatic ticks put "0.5" and "-0.5" on a 4-sample heatmap)."""
    ints = [s for s in samples if isinstance(s, int)]
    if not ints or len(ints) != len(samples):
        return {}
    span = max(ints) - min(ints) + 1
    return {"tickmode": "linear", "tick0": min(ints), "dtick": max(1, -(-span // 20)), "tickformat": "d"}


def _suggestion_rows(suggestions: Any) -> dict[str, tuple[str, str]]:
    if suggestions is None:
        return {}
    if isinstance(suggestions, pd.DataFrame):
        recs: Iterable[Any] = suggestions.itertuples(index=False)
    else:
        recs = suggestions
    out: dict[str, tuple[str, str]] = {}
    for s in recs:
        out.setdefault(str(s.tensor_name), (str(s.role), str(s.reason)))
    return out


def tensor_table(
    df: pd.DataFrame,
    suggestions: Any = None,
    weights: pd.DataFrame | None = None,
    owners: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """The sortable tensor table's data (a DataFrame, not a figure), one row per tensor in topological order.

    Columns: ``tensor_name, topo_index, op, type, local_sqnr_db, cumulative_sqnr_db, weight_sqnr_db,
    local_status, cumulative_status, weight_status, role, reason``. ``suggestions`` is the output of
    :func:`qdebug.mixed.suggest.analyse` (or its DataFrame); tensors it does not mention get empty role/reason.
    ``weights`` (:meth:`DebugReport.weights_dataframe`) fills the weight columns (worst weight of the producer,
    fused nodes mapped through ``owners``, see :func:`weight_owners`).
    SQNR columns are floats (``+inf`` identical, NaN missing) so they sort numerically.
    """
    d = in_graph_order(df)
    wmap = weight_sqnr_by_tensor(d, weights, owners)
    sugg = _suggestion_rows(suggestions)
    rows = []
    for a in d.itertuples(index=False):
        name = str(a.tensor_name)
        wv, wst, _ = wmap.get(name, (None, "no weights", ""))
        role, reason = sugg.get(name, ("", ""))
        local, cum = as_number(a.local_sqnr_db), as_number(a.cumulative_sqnr_db)
        rows.append(
            {
                "tensor_name": name,
                "topo_index": int(a.topo_index),
                "op": str(a.producer_op),
                "type": a.quant_type or "float",
                "local_sqnr_db": math.nan if local is None else local,
                "cumulative_sqnr_db": math.nan if cum is None else cum,
                "weight_sqnr_db": math.nan if wv is None else wv,
                "local_status": str(a.local_status),
                "cumulative_status": str(a.cumulative_status),
                "weight_status": wst,
                "role": role,
                "reason": reason,
            }
        )
    return pd.DataFrame(rows)


def histogram_figure(
    float_values: np.ndarray | Sequence[float],
    quant_values: np.ndarray | Sequence[float],
    scale: float | None = None,
    zero_point: int | None = None,
    bins: int = 100,
) -> go.Figure:
    """Float vs (dequantized) quantized values overlaid, and the error ``quant − float`` in a second subplot.

    Histograms are computed here with numpy (``bins`` bars per trace) so the figure stays small for
    million-element tensors. With ``scale``, the error plot marks ±scale/2 (the rounding bound of one
    quantization step) and the title gives the step; ``zero_point`` is shown in the title. Three traces:
    ``float``, ``quantized``, ``error``.
    """
    f = np.asarray(float_values, dtype=np.float64).ravel()
    q = np.asarray(quant_values, dtype=np.float64).ravel()
    if f.shape != q.shape:
        raise ValueError(f"histogram_figure: float and quantized sizes differ ({f.size} vs {q.size})")
    ok = np.isfinite(f) & np.isfinite(q)
    f, q = f[ok], q[ok]
    err = q - f
    both = np.concatenate([f, q]) if f.size else np.zeros(1)
    edges = np.histogram_bin_edges(both, bins=bins)
    fc, _ = np.histogram(f, bins=edges)
    qc, _ = np.histogram(q, bins=edges)
    ec, eedges = np.histogram(err if err.size else np.zeros(1), bins=bins)
    centers = (edges[:-1] + edges[1:]) / 2
    ecenters = (eedges[:-1] + eedges[1:]) / 2
    fig = make_subplots(rows=2, cols=1, subplot_titles=("values", "error (quantized − float)"), vertical_spacing=0.15)
    width = float(edges[1] - edges[0]) if len(edges) > 1 else None
    fig.add_trace(go.Bar(x=centers, y=fc, name="float", opacity=0.55, width=width), row=1, col=1)
    fig.add_trace(go.Bar(x=centers, y=qc, name="quantized", opacity=0.55, width=width), row=1, col=1)
    fig.add_trace(
        go.Bar(x=ecenters, y=ec, name="error", marker={"color": "#868e96"}, width=float(eedges[1] - eedges[0])),
        row=2,
        col=1,
    )
    title = "Float vs quantized values"
    if scale is not None:
        title += f" — step {scale:.4g}"
        for x in (-scale / 2, scale / 2):
            fig.add_vline(x=x, line={"dash": "dash", "color": HIGHLIGHT}, row=2, col=1)
    if zero_point is not None:
        title += f", zero point {zero_point}"
    fig.update_layout(barmode="overlay", title=title, bargap=0, margin={"l": 10, "r": 10, "t": 60, "b": 10})
    return fig
