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
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from qdebug._lazy import LazyModule
from qdebug.mixed.compare import Comparison
from qdebug.mixed.search import SearchPoint, SearchResult
from qdebug.mixed.target_cost import TargetCost
from qdebug.render.bands import GREY, HIGHLIGHT, SQNR_COLORSCALE, SQNR_HIGH, SQNR_LOW, Z_MAX, Z_MIN, sqnr_color
from qdebug.render.fmt import fmt_db_text
from qdebug.render.layout import layered_layout
from qdebug.report import decode_number
from qdebug.tensor_values import weight_owners as _engine_weight_owners

if TYPE_CHECKING:
    import onnx
    import plotly.graph_objects as go
else:  # plotly is the ``ui`` extra: imported on the first figure, a missing one names the extra then
    go = LazyModule("plotly.graph_objects")


def make_subplots(*args: Any, **kwargs: Any) -> go.Figure:
    """plotly's ``make_subplots`` (imported on first use)."""
    return LazyModule("plotly.subplots").make_subplots(*args, **kwargs)


_GREY_SCALE: list[list[float | str]] = [[0.0, GREY], [1.0, GREY]]
_MISSING_SHOWN = ("undefined", "nonfinite")


def _num(v: Any) -> float | None:
    """A DataFrame cell as float or None (NaN, None and JSON's ``"inf"`` handled)."""
    if v is None:
        return None
    if isinstance(v, str):
        return decode_number(v)
    f = float(v)
    return None if math.isnan(f) else f


def _fmt(v: float | None, status: str | None = None) -> str:
    return fmt_db_text(v, status)


def _z(v: float | None) -> float | None:
    """Heatmap value: +inf at the top of the scale, missing as None (drawn by the grey trace or left blank)."""
    if v is None:
        return None
    if math.isinf(v):
        return Z_MAX if v > 0 else Z_MIN
    return v


def _coloraxis_kwargs() -> dict[str, Any]:
    return {
        "colorscale": SQNR_COLORSCALE,
        "zmin": Z_MIN,
        "zmax": Z_MAX,
        "colorbar": {"title": {"text": "SQNR dB"}, "tickvals": [0, SQNR_LOW, SQNR_HIGH, Z_MAX]},
    }


def _ordered(df: pd.DataFrame) -> pd.DataFrame:
    if "topo_index" in df.columns:
        return df.sort_values("topo_index", kind="stable").reset_index(drop=True)
    return df.reset_index(drop=True)


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
            (_num(w.weight_sqnr_db), str(w.weight_status), str(w.weight_name))
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
        [1.0 if (v is None and s in _MISSING_SHOWN) else np.nan for v, s in zip(zr, sr, strict=True)]
        for zr, sr in zip(z, status, strict=True)
    ]
    # Gaps between cells only while cells are wide enough to keep them (900 columns of 1 px gaps are all gap).
    gap = 1 if max(len(x), len(y)) <= 200 else 0
    common: dict[str, Any] = {"x": x, "y": y, "text": hover, "hovertemplate": "%{text}<extra></extra>", "xgap": gap}
    main = go.Heatmap(z=zz, name="SQNR", hoverongaps=False, **common, **_coloraxis_kwargs())
    missing = go.Heatmap(
        z=grey, name="undefined / nonfinite", colorscale=_GREY_SCALE, showscale=False, zmin=0, zmax=1,
        hoverongaps=False, **common,
    )  # fmt: skip
    return [main, missing]


#: Most tensor names written under a heatmap; above that the names are in the hover only (they would overlap).
MAX_TICK_LABELS = 60


def _group_axis(
    idx: list[int], names: list[str], groups: Mapping[str, str]
) -> tuple[list[float], list[str], list[float]]:
    """(tick positions, group labels, boundaries) for a heatmap axis whose tensors are grouped (runs of the same
    group in topological order are one tick; a boundary line separates runs)."""
    ticks: list[float] = []
    labels: list[str] = []
    bounds: list[float] = []
    start = 0
    for i in range(1, len(names) + 1):
        if i == len(names) or groups.get(names[i], names[i]) != groups.get(names[start], names[start]):
            ticks.append((idx[start] + idx[i - 1]) / 2)
            labels.append(_short(groups.get(names[start], names[start]), 24))
            if i < len(names):
                bounds.append((idx[i - 1] + idx[i]) / 2)
            start = i
    return ticks, labels, bounds


def _tensor_axis(
    idx: list[int], names: list[str], max_label_chars: int, groups: Mapping[str, str] | None
) -> tuple[dict[str, Any], list[float]]:
    """The tensor axis: names when they fit, group names (and boundaries) when grouped, else none (hover)."""
    if groups:
        ticks, labels, bounds = _group_axis(idx, names, groups)
        if len(ticks) > MAX_TICK_LABELS:
            return {"showticklabels": False, "title": f"{len(ticks)} groups (names on hover)"}, bounds
        return {"tickmode": "array", "tickvals": ticks, "ticktext": labels, "tickangle": -45, "title": "group"}, bounds
    if len(names) > MAX_TICK_LABELS:
        return {"showticklabels": False, "title": f"{len(names)} tensors, topological order (names on hover)"}, []
    labels = [_short(n, max_label_chars) for n in names]
    return {"tickmode": "array", "tickvals": idx, "ticktext": labels, "title": "tensor"}, []


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

    Scaling to real models: tick labels only when at most :data:`MAX_TICK_LABELS` fit (else the names are in the
    hover); ``groups`` (``{tensor: group}``, e.g. :func:`qdebug.render.graphview.group_tensors`' ``of``) labels the
    axis by group and draws a boundary between groups; the figure fills its container's width and zooms with
    the mouse (double click resets).
    """
    d = _ordered(df)
    wmap = weight_sqnr_by_tensor(d, weights, owners)
    metrics = ("local", "cumulative", "weight")
    z: list[list[float | None]] = [[], [], []]
    st: list[list[str | None]] = [[], [], []]
    hover: list[list[str]] = [[], [], []]
    for a in d.itertuples(index=False):
        name = str(a.tensor_name)
        wv, wst, wnames = wmap.get(name, (None, "no weights", ""))
        vals = {
            "local": (_num(a.local_sqnr_db), str(a.local_status)),
            "cumulative": (_num(a.cumulative_sqnr_db), str(a.cumulative_status)),
            "weight": (wv, wst),
        }
        text = (
            f"<b>{name}</b><br>op: {a.producer_op}<br>type: {a.quant_type or 'float'}"
            f"<br>local: {_fmt(*vals['local'])}<br>cumulative: {_fmt(*vals['cumulative'])}"
            f"<br>weight: {_fmt(wv, wst)}{' (' + wnames + ')' if wnames else ''}"
        )
        for i, m in enumerate(metrics):
            v, s = vals[m]
            z[i].append(_z(v))
            st[i].append(s)
            hover[i].append(f"<b>{m}</b>: {_fmt(v, s)}<br>{text}")
    # Cells are addressed by position in topological order (0..n-1), not by topo_index: a model whose first
    # 420 nodes are Constants would otherwise give its first tensor a cell 420 columns wide.
    idx = list(range(len(d)))
    axis, bounds = _tensor_axis(idx, [str(n) for n in d["tensor_name"]], max_label_chars, groups)
    rows = list(metrics)
    line = {"color": "#343a40", "width": 1}
    if orientation == "h":
        fig = go.Figure(_grid_traces(z, st, hover, idx, rows))
        fig.update_layout(xaxis=axis, yaxis={"autorange": "reversed", "fixedrange": True})
        for b in bounds:
            fig.add_vline(x=b, line=line)
    elif orientation == "v":
        tz = [list(r) for r in zip(*z, strict=True)]
        ts = [list(r) for r in zip(*st, strict=True)]
        th = [list(r) for r in zip(*hover, strict=True)]
        fig = go.Figure(_grid_traces(tz, ts, th, rows, idx))
        fig.update_layout(yaxis={**axis, "autorange": "reversed"}, xaxis={"fixedrange": True})
        for b in bounds:
            fig.add_hline(y=b, line=line)
    else:
        raise ValueError(f"layer_heatmap: orientation must be 'h' or 'v', got {orientation!r}")
    fig.update_layout(
        # No width: the container's full width (a tab shown later gets it through a window resize, see
        # widgets.resize); a fixed width left two thirds of a wide page empty.
        title="SQNR per tensor (topological order; drag to zoom, double click to reset)", autosize=True,
        margin={"l": 10, "r": 10, "t": 40, "b": 10}, dragmode="zoom",
    )  # fmt: skip
    return fig


def _short(name: str, n: int) -> str:
    return name if len(name) <= n else "…" + name[-(n - 1) :]


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
            v = _num(vals[i, j])
            zr.append(_z(v))
            sr.append(None if v is not None else "undefined")
            hr.append(f"<b>{n}</b><br>sample {s}<br>cumulative: {_fmt(v, 'undefined or nonfinite')}")
        z.append(zr)
        st.append(sr)
        hover.append(hr)
    cols = list(range(len(names)))
    fig = go.Figure(_grid_traces(z, st, hover, cols, samples))
    axis, _ = _tensor_axis(cols, names, max_label_chars, None)
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
    d = _ordered(df)
    wmap = weight_sqnr_by_tensor(d, weights, owners)
    sugg = _suggestion_rows(suggestions)
    rows = []
    for a in d.itertuples(index=False):
        name = str(a.tensor_name)
        wv, wst, _ = wmap.get(name, (None, "no weights", ""))
        role, reason = sugg.get(name, ("", ""))
        local, cum = _num(a.local_sqnr_db), _num(a.cumulative_sqnr_db)
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
        v = _num(getattr(a, col))
        s = str(getattr(a, stcol))
        colors.append(sqnr_color(v))
        hover.append(
            f"<b>{a.tensor_name}</b><br>op: {a.producer_op} ({a.producer_node})<br>type: {a.quant_type or 'float'}"
            f"<br>local: {_fmt(_num(a.local_sqnr_db), str(a.local_status))}"
            f"<br>cumulative: {_fmt(_num(a.cumulative_sqnr_db), str(a.cumulative_status))}"
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
    d = _ordered(df)
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
            text=[_short(n, 24) for n in names] if show_labels else None, textposition="middle right",
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


def _points(
    result: SearchResult | Mapping[str, Any] | Sequence[Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """(steps, evaluated, chosen index into steps) from a SearchResult, its dict, or a list of points."""

    def as_dict(p: Any) -> dict[str, Any]:
        return _point_dict(p) if isinstance(p, SearchPoint) else dict(p)

    if isinstance(result, SearchResult):
        steps = [as_dict(p) for p in result.steps]
        evaluated = [as_dict(p) for p in result.evaluated]
        chosen = result.chosen_step
    elif isinstance(result, Mapping):
        steps = [as_dict(p) for p in result.get("steps", [])]
        evaluated = [as_dict(p) for p in result.get("evaluated", [])]
        chosen = int(result.get("chosen_step", -1))
    else:
        steps, evaluated = [as_dict(p) for p in result], []
        flagged = [i for i, p in enumerate(steps) if p.get("chosen")]
        chosen = flagged[-1] if flagged else -1
    if steps and chosen < 0:
        chosen += len(steps)
    return steps, evaluated, chosen


def _front(result: SearchResult | Mapping[str, Any] | Sequence[Any]) -> list[dict[str, Any]]:
    """The Pareto front of a SearchResult (or the ``pareto`` list of its dict); empty for a bare list of points."""
    if isinstance(result, SearchResult):
        return [_point_dict(p) for p in result.pareto()]
    if isinstance(result, Mapping):
        return [dict(p) for p in result.get("pareto", [])]
    return []


def _point_dict(p: SearchPoint) -> dict[str, Any]:
    """What the figure reads of a point, as in ``SearchResult.to_dict()`` (``target_cost`` with ``splits``)."""
    return {
        "step": p.step, "cost_fraction_16bit": p.cost_fraction_16bit, "output_sqnr_db": p.output_sqnr_db,
        "accuracy": p.accuracy, "chosen": p.chosen, "num_16bit_tensors": p.num_16bit_tensors,
        "target_cost": None if p.target_cost is None else p.target_cost.to_dict(),
    }  # fmt: skip


def _target_text(p: Mapping[str, Any]) -> str:
    """The hover lines of a compiled point: its target graph (SPLIT marked) and its SQNR on the target."""
    tc = p.get("target_cost")
    if not tc:
        return ""
    c = TargetCost.from_dict(tc)  # the dict's one reading, not a second copy of it
    out = f"<br>{c.target.upper()}: {c.describe()}"
    if c.target_sqnr_db is not None or c.accuracy_error is not None:
        out += f"<br>on {c.target.upper()} vs float: {c.describe_accuracy()}"
    return out


def _splits(p: Mapping[str, Any]) -> bool:
    tc = p.get("target_cost")
    return TargetCost.from_dict(tc).splits if tc else False


def pareto_figure(result: SearchResult | Mapping[str, Any] | Sequence[Any]) -> go.Figure:
    """Cost (fraction of 16-bit elements) vs output SQNR of a mixed-precision search.

    ``result`` is a :class:`SearchResult`, its ``to_dict()``, or a list of :class:`SearchPoint` (or their dicts).
    Traces: ``steps`` (the accepted curve), ``evaluated`` (other measured points, if any), ``Pareto front`` (the
    non-dominated measured points, :meth:`SearchResult.pareto`, dashed), ``SPLIT on <TARGET>`` (compiled points that
    split the target graph, a red cross; only when there are some) and ``chosen`` (the chosen point, a star). A
    compiled point's hover adds its target graph and its SQNR on the target.
    Every point's ``customdata`` is its ``step`` so a click handler can apply that step;
    the hover shows accuracy and the number of 16-bit tensors. ``+inf`` SQNR is drawn at :data:`Z_MAX`.
    """
    steps, evaluated, chosen = _points(result)

    def xy(pts: list[dict[str, Any]]) -> tuple[list[float], list[float | None], list[int], list[str]]:
        xs, ys, cd, tx = [], [], [], []
        for p in pts:
            v = _num(p.get("output_sqnr_db"))
            acc = _num(p.get("accuracy"))
            xs.append(float(p["cost_fraction_16bit"]))
            ys.append(None if v is None else (Z_MAX if math.isinf(v) else v))
            cd.append(int(p["step"]))
            tx.append(
                f"step {p['step']}<br>16-bit elements: {100 * float(p['cost_fraction_16bit']):.1f}%"
                f" ({p.get('num_16bit_tensors', '?')} tensors)<br>output SQNR: {_fmt(v)}"
                f"<br>accuracy: {'n/a' if acc is None else f'{100 * acc:.2f}%'}" + _target_text(p)
            )
        return xs, ys, cd, tx

    traces: list[go.Scatter] = []
    x, y, cd, tx = xy(steps)
    traces.append(
        go.Scatter(x=x, y=y, customdata=cd, hovertext=tx, hoverinfo="text", mode="lines+markers", name="steps")
    )
    seen = {int(p["step"]) for p in steps}
    others = [p for p in evaluated if int(p["step"]) not in seen]
    if others:
        x, y, cd, tx = xy(others)
        traces.append(
            go.Scatter(
                x=x, y=y, customdata=cd, hovertext=tx, hoverinfo="text", mode="markers", name="evaluated",
                marker={"color": "#adb5bd"},
            )
        )  # fmt: skip
    front = _front(result)
    if len(front) > 1:  # the measured Pareto front, the same points `qdebug search` lists
        x, y, cd, tx = xy(front)
        traces.append(
            go.Scatter(
                x=x, y=y, customdata=cd, hovertext=tx, hoverinfo="text", mode="lines", name="Pareto front",
                line={"dash": "dash", "color": "#495057"},
            )
        )  # fmt: skip
    split = list({int(p["step"]): p for p in (*steps, *evaluated) if _splits(p)}.values())
    if split:  # compiled points that do not run as one accelerator partition (qdebug search's SPLIT)
        x, y, cd, tx = xy(split)
        target = str(split[0]["target_cost"].get("target", "target")).upper()
        traces.append(
            go.Scatter(
                x=x, y=y, customdata=cd, hovertext=tx, hoverinfo="text", mode="markers", name=f"SPLIT on {target}",
                marker={"symbol": "x", "size": 14, "color": "#d62728", "line": {"width": 1, "color": "black"}},
            )
        )  # fmt: skip
    if steps and 0 <= chosen < len(steps):
        x, y, cd, tx = xy([steps[chosen]])
        traces.append(
            go.Scatter(
                x=x, y=y, customdata=cd, hovertext=tx, hoverinfo="text", mode="markers", name="chosen",
                marker={"symbol": "star", "size": 18, "color": HIGHLIGHT, "line": {"width": 1, "color": "black"}},
            )
        )  # fmt: skip
    fig = go.Figure(traces)
    fig.update_layout(
        title="Mixed precision: cost vs output SQNR",
        xaxis={"title": "fraction of 16-bit elements", "tickformat": ".0%"},
        yaxis={"title": "output SQNR (dB)"},
        hovermode="closest",
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
    )
    return fig


def comparison_figure(comparison: Comparison, max_label_chars: int = 40) -> go.Figure:
    """Per-tensor cumulative SQNR before and after (top) and the change after − before (bottom bars).

    Tensors are in the comparison's (topological) order. Non-finite values leave gaps in the lines and are
    named in the hover ("identical (inf)" or "n/a"); a delta that is not comparable has no bar. Bars are
    green where the change helped and red where it hurt. Traces: ``before``, ``after``, ``delta``. Above
    :data:`MAX_TICK_LABELS` tensors the axis carries no names (the hover has them).
    """
    names = [d.name for d in comparison.cumulative]
    idx = list(range(len(names)))

    def fin(v: float | None) -> float | None:
        return None if v is None or math.isinf(v) else v

    hover = [
        f"<b>{d.name}</b><br>before: {_fmt(d.before_db)} ({d.before_type or 'float'})"
        f"<br>after: {_fmt(d.after_db)} ({d.after_type or 'float'})"
        f"<br>delta: {'n/a' if d.delta_db is None else f'{d.delta_db:+.2f} dB'}"
        for d in comparison.cumulative
    ]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.65, 0.35], vertical_spacing=0.05)
    for label, vals in (
        ("before", [fin(d.before_db) for d in comparison.cumulative]),
        ("after", [fin(d.after_db) for d in comparison.cumulative]),
    ):
        fig.add_trace(
            go.Scatter(x=idx, y=vals, name=label, mode="lines+markers", customdata=names, hovertext=hover,
                       hoverinfo="text"),
            row=1, col=1,
        )  # fmt: skip
    deltas = [d.delta_db for d in comparison.cumulative]
    fig.add_trace(
        go.Bar(
            x=idx, y=deltas, name="delta", customdata=names, hovertext=hover, hoverinfo="text",
            marker={"color": ["#2b8a3e" if (v or 0) >= 0 else "#e03131" for v in deltas]},
        ),
        row=2, col=1,
    )  # fmt: skip
    for y in (SQNR_LOW, SQNR_HIGH):
        fig.add_hline(y=y, line={"dash": "dot", "color": "#adb5bd"}, row=1, col=1)
    if len(names) <= MAX_TICK_LABELS:
        ticks = [_short(n, max_label_chars) for n in names]
        fig.update_xaxes(tickmode="array", tickvals=idx, ticktext=ticks, row=2, col=1)
    else:  # as the heatmap: more names than fit overlap into a band, and plotly measures each one (seconds)
        title = "tensor (topological order; the hover names it)"
        fig.update_xaxes(showticklabels=False, title_text=title, row=2, col=1)
    fig.update_yaxes(title_text="cumulative dB", row=1, col=1)
    fig.update_yaxes(title_text="Δ dB", row=2, col=1)
    fig.update_layout(
        title="Cumulative SQNR before / after", hovermode="closest", margin={"l": 10, "r": 10, "t": 40, "b": 10}
    )
    return fig
