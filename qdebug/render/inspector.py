"""What the tensor inspector shows: where the quantization grid sits relative to the data, and figures that
say it (pure functions; plotly, the ``ui`` extra, loads on the first figure).

* :func:`grid_stats` — the grid's range ``[(qmin − zp)·scale, (qmax − zp)·scale]``, the fraction of float values
  clipped outside it, the fraction of quantized values saturated at its ends, the integer levels used out of
  2^bits, and the levels the data's range spans;
* :func:`value_histogram` — float vs quantized values with bins adapted to the data (one bin per grid level when
  the data spans few levels, so each used level is one bar; otherwise bins over the data's own range), a log
  count axis (a spike at 0 no longer hides the rest), the grid's ends marked; and the error histogram with the
  ±½ step band;
* :func:`value_scatter` — float vs quantized for one sample (subsampled), with the identity line and the grid's
  ends: clipping and saturation are the flat parts;
* :func:`channel_figure` — a per-channel weight: each output channel's SQNR (band colours) and range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from qdebug._lazy import LazyModule
from qdebug.metrics import channel_sqnr
from qdebug.render.bands import HIGHLIGHT, sqnr_color
from qdebug.render.fmt import fmt_db_text

if TYPE_CHECKING:
    import plotly.graph_objects as go
else:
    go = LazyModule("plotly.graph_objects")

#: Integer range of each quantization type.
TYPE_RANGES: dict[str, tuple[int, int]] = {
    "uint8": (0, 255),
    "int8": (-128, 127),
    "uint16": (0, 65535),
    "int16": (-32768, 32767),
    "uint4": (0, 15),
    "int4": (-8, 7),
}
#: Most bins of a value histogram (one per used level below this).
MAX_BINS = 120
#: Most points drawn by the scatter.
MAX_SCATTER_POINTS = 4000


@dataclass(frozen=True)
class GridStats:
    """Where a tensor's quantization grid sits relative to its values (one sample)."""

    elements: int
    float_min: float
    float_max: float
    grid_min: float | None
    grid_max: float | None
    clipped_low: float  # fraction of float values below the grid (by more than half a step)
    clipped_high: float
    saturated_low: float  # fraction of quantized values at the lowest level
    saturated_high: float
    levels_used: int | None  # distinct integer levels among the quantized values
    levels_total: int | None  # 2^bits
    levels_spanned: int | None  # levels between the data's min and max

    def describe(self) -> str:
        """One line: clipping, saturation and levels used."""
        if self.grid_min is None or self.levels_total is None:
            return f"{self.elements} values in [{self.float_min:.4g}, {self.float_max:.4g}] (not quantized)"
        clip = self.clipped_low + self.clipped_high
        sat = self.saturated_low + self.saturated_high
        return (
            f"grid [{self.grid_min:.4g}, {self.grid_max:.4g}] vs data [{self.float_min:.4g}, {self.float_max:.4g}]; "
            f"clipped {100 * clip:.2f}% · saturated {100 * sat:.2f}% (low {100 * self.saturated_low:.1f}%, "
            f"high {100 * self.saturated_high:.1f}%) · levels used {self.levels_used} of {self.levels_total}"
            f" (data spans {self.levels_spanned})"
        )


def _finite(float_values: Any, quant_values: Any) -> tuple[np.ndarray, np.ndarray]:
    f = np.asarray(float_values, dtype=np.float64).ravel()
    q = np.asarray(quant_values, dtype=np.float64).ravel()
    if f.shape != q.shape:
        raise ValueError(f"inspector: float and quantized sizes differ ({f.size} vs {q.size})")
    ok = np.isfinite(f) & np.isfinite(q)
    return f[ok], q[ok]


def grid_stats(
    float_values: Any, quant_values: Any, scale: float | None, zero_point: int | None, quant_type: str | None
) -> GridStats:
    """:class:`GridStats` of one tensor: ``quant_values`` are the dequantized values of the quantized model."""
    f, q = _finite(float_values, quant_values)
    fmin = float(f.min()) if f.size else 0.0
    fmax = float(f.max()) if f.size else 0.0
    rng = TYPE_RANGES.get(quant_type or "")
    if scale is None or not scale > 0 or rng is None or not f.size:
        return GridStats(int(f.size), fmin, fmax, None, None, 0.0, 0.0, 0.0, 0.0, None, None, None)
    zp = int(zero_point or 0)
    lo, hi = (rng[0] - zp) * scale, (rng[1] - zp) * scale
    levels = np.rint(q / scale) + zp
    half = scale / 2
    n = f.size
    spanned = int(min(rng[1], math.floor(fmax / scale + zp + 0.5)) - max(rng[0], math.ceil(fmin / scale + zp - 0.5)))
    return GridStats(
        elements=int(n),
        float_min=fmin,
        float_max=fmax,
        grid_min=float(lo),
        grid_max=float(hi),
        clipped_low=float(np.count_nonzero(f < lo - half) / n),
        clipped_high=float(np.count_nonzero(f > hi + half) / n),
        saturated_low=float(np.count_nonzero(levels <= rng[0]) / n),
        saturated_high=float(np.count_nonzero(levels >= rng[1]) / n),
        levels_used=int(np.unique(levels).size),
        levels_total=rng[1] - rng[0] + 1,
        levels_spanned=max(spanned + 1, 1),
    )


def bin_edges(f: np.ndarray, q: np.ndarray, scale: float | None, zero_point: int | None) -> np.ndarray:
    """Histogram bin edges adapted to the values: one bin per grid level (edges at the half steps) when the
    values span at most :data:`MAX_BINS` levels, else :data:`MAX_BINS` bins over the values' own range."""
    both = np.concatenate([f, q]) if f.size else np.zeros(1)
    lo, hi = float(both.min()), float(both.max())
    if hi <= lo:
        return np.array([lo - 0.5, hi + 0.5])
    if scale is not None and scale > 0:
        zp = float(zero_point or 0)
        k0, k1 = math.floor(lo / scale + zp), math.ceil(hi / scale + zp)
        if k1 - k0 + 1 <= MAX_BINS:
            return (np.arange(k0, k1 + 2) - 0.5 - zp) * scale
    return np.linspace(lo, hi, MAX_BINS + 1)


def value_histogram(
    float_values: Any,
    quant_values: Any,
    scale: float | None = None,
    zero_point: int | None = None,
    quant_type: str | None = None,
) -> go.Figure:
    """Float vs quantized values (log counts, bins from :func:`bin_edges`, the grid's ends as dashed lines) over
    the error ``quantized − float`` (the ±½ step band marked). Traces ``float``, ``quantized``, ``error``; the
    title carries :meth:`GridStats.describe`."""
    f, q = _finite(float_values, quant_values)
    stats = grid_stats(f, q, scale, zero_point, quant_type)
    edges = bin_edges(f, q, scale, zero_point)
    fc, _ = np.histogram(f, bins=edges)
    qc, _ = np.histogram(q, bins=edges)
    err = q - f
    eedges = np.histogram_bin_edges(err if err.size else np.zeros(1), bins=60)
    ec, _ = np.histogram(err, bins=eedges)
    centers = (edges[:-1] + edges[1:]) / 2
    fig = LazyModule("plotly.subplots").make_subplots(
        rows=2, cols=1, row_heights=[0.65, 0.35], vertical_spacing=0.14,
        subplot_titles=("values (log count)", "error: quantized − float"),
    )  # fmt: skip
    width = np.diff(edges)
    fig.add_trace(go.Bar(x=centers, y=fc, width=width, name="float", opacity=0.55), row=1, col=1)
    fig.add_trace(go.Bar(x=centers, y=qc, width=width, name="quantized", opacity=0.55), row=1, col=1)
    fig.add_trace(
        go.Bar(x=(eedges[:-1] + eedges[1:]) / 2, y=ec, width=np.diff(eedges), name="error",
               marker={"color": "#868e96"}),
        row=2, col=1,
    )  # fmt: skip
    if stats.grid_min is not None and stats.grid_max is not None:
        for x in (stats.grid_min, stats.grid_max):
            if edges[0] - (edges[-1] - edges[0]) <= x <= edges[-1] + (edges[-1] - edges[0]):
                fig.add_vline(x=x, line={"dash": "dash", "color": "#c92a2a"}, row=1, col=1)
    if scale is not None:
        for x in (-scale / 2, scale / 2):
            fig.add_vline(x=x, line={"dash": "dash", "color": HIGHLIGHT}, row=2, col=1)
    fig.update_yaxes(type="log", row=1, col=1)
    step = "" if scale is None else f"step {scale:.4g}, zero point {zero_point} · "
    fig.update_layout(
        barmode="overlay", bargap=0, title={"text": f"{step}{stats.describe()}", "font": {"size": 11}},
        margin={"l": 10, "r": 10, "t": 70, "b": 10}, legend={"orientation": "h", "y": -0.08},
    )  # fmt: skip
    return fig


def value_scatter(
    float_values: Any,
    quant_values: Any,
    scale: float | None = None,
    zero_point: int | None = None,
    quant_type: str | None = None,
    max_points: int = MAX_SCATTER_POINTS,
) -> go.Figure:
    """Quantized vs float for one sample (an even subsample of at most ``max_points``), with ``y = x`` and the
    grid's ends: points off the diagonal are rounding, flat runs at the ends are clipping. Traces ``values``,
    ``identity``."""
    f, q = _finite(float_values, quant_values)
    if f.size > max_points:
        pick = np.linspace(0, f.size - 1, max_points).astype(np.int64)
        f, q = f[pick], q[pick]
    lo = float(min(f.min(), q.min())) if f.size else 0.0
    hi = float(max(f.max(), q.max())) if f.size else 1.0
    fig = go.Figure(
        [
            go.Scattergl(x=f, y=q, mode="markers", name="values", marker={"size": 3, "opacity": 0.5}),
            go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="identity",
                       line={"dash": "dot", "color": "#868e96"}),
        ]
    )  # fmt: skip
    stats = grid_stats(f, q, scale, zero_point, quant_type)
    if stats.grid_min is not None and stats.grid_max is not None:
        for y in (stats.grid_min, stats.grid_max):
            if lo - (hi - lo) <= y <= hi + (hi - lo):
                fig.add_hline(y=y, line={"dash": "dash", "color": "#c92a2a"})
    fig.update_layout(
        title={"text": f"quantized vs float, {f.size} points of one sample", "font": {"size": 12}},
        xaxis={"title": "float"}, yaxis={"title": "quantized (dequantized)"}, showlegend=False,
        margin={"l": 10, "r": 10, "t": 40, "b": 10}, height=320,
    )  # fmt: skip
    return fig


def channel_figure(name: str, ref: Any, test: Any, axis: int = 0) -> go.Figure:
    """A weight per output channel: SQNR bars (band colours; +inf drawn at 60 dB) over each channel's float
    range (min–max). Traces ``sqnr``, ``range``."""
    ref = np.asarray(ref, np.float64)
    test = np.asarray(test, np.float64)
    per = channel_sqnr(ref, test, axis)
    ax = axis % ref.ndim if ref.ndim else 0
    flat = np.moveaxis(ref, ax, 0).reshape(len(per), -1)
    ch = list(range(len(per)))
    fig = LazyModule("plotly.subplots").make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                                                      row_heights=[0.6, 0.4])  # fmt: skip
    fig.add_trace(
        go.Bar(x=ch, y=[60.0 if v is not None and math.isinf(v) else v for v in per], name="sqnr",
               marker={"color": [sqnr_color(v) for v in per]},
               hovertext=[f"channel {c}: {fmt_db_text(v)}" for c, v in zip(ch, per, strict=True)],
               hoverinfo="text"),
        row=1, col=1,
    )  # fmt: skip
    lo, hi = flat.min(axis=1), flat.max(axis=1)
    fig.add_trace(
        go.Bar(x=ch, y=hi - lo, base=lo, name="range", marker={"color": "#adb5bd"},
               hovertext=[f"channel {c}: [{a:.4g}, {b:.4g}]" for c, a, b in zip(ch, lo, hi, strict=True)],
               hoverinfo="text"),
        row=2, col=1,
    )  # fmt: skip
    known = [v for v in per if v is not None]
    worst = min(known) if known else None
    fig.update_yaxes(title_text="dB", row=1, col=1)
    fig.update_yaxes(title_text="float range", row=2, col=1)
    fig.update_xaxes(title_text=f"channel (axis {ax})", row=2, col=1)
    fig.update_layout(
        title={"text": f"{name}: {len(per)} channels, worst {fmt_db_text(worst)}", "font": {"size": 12}},
        showlegend=False, bargap=0.1, margin={"l": 10, "r": 10, "t": 40, "b": 10}, height=360,
    )  # fmt: skip
    return fig


__all__ = [
    "MAX_BINS",
    "TYPE_RANGES",
    "GridStats",
    "bin_edges",
    "channel_figure",
    "channel_sqnr",
    "grid_stats",
    "value_histogram",
    "value_scatter",
]
