"""Root-cause diagnostics: *why* a tensor is bad, with the evidence and the remedy to try (docs/diagnostics.md).

Three sources, each bounded in memory:

* the debug report (sums, ranges, scales, SQNR): wasted range, negative values under an unsigned scheme,
  Concat/Add inputs on very different scales, precision cliffs of Softmax/LayerNorm/Sigmoid, a scale or zero point
  that cannot be right;
* the models' constants: per-tensor weights whose output channels differ by orders of magnitude, Q/DQ parameters
  that cannot be right;
* :class:`TensorStats` — a fixed-bin histogram of ``log2 |x|`` per float activation plus clip / flush-to-zero
  counts against the tensor's quantization grid, gathered one sample at a time over the float model and merged
  (:func:`collect_stats`): outlier-dominated ranges (max / 99.99th percentile), saturation, the fraction of values
  an unsigned grid clips, the fraction a coarse grid flushes to zero.

Every :class:`Diagnostic` names the tensor, gives the evidence (numbers and a sentence) and a :class:`Remedy`
the mixed-precision engine can apply and measure (a 16-bit promotion or a per-channel weight as
``TensorQuantOverrides``, or a calibration change for ``qdebug quantize``).

The records (:class:`Diagnostic`, :class:`Diagnostics`, :class:`Thresholds`) are :mod:`qdebug.findings`, the
statistics (:class:`TensorStats`, :func:`collect_stats`) :mod:`qdebug.activation_stats`; this module holds the checks
and :func:`diagnose` / :func:`diagnose_models`, and its ``__all__`` re-exports those names (docs/diagnostics.md refers
to ``qdebug.diagnose.Thresholds``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from qdebug.activation_stats import QRANGE, TensorStats, collect_stats, quant_grid
from qdebug.findings import (
    DIAGNOSTICS_SCHEMA_VERSION,
    SEVERITY_ORDER,
    Diagnostic,
    DiagnosticKind,
    Diagnostics,
    Remedy,
    RemedyKind,
    Severity,
    Thresholds,
)
from qdebug.graph_index import GraphIndex
from qdebug.qdq_values import qdq_parameter_issues
from qdebug.report import ActivationResult, DebugReport, WeightResult
from qdebug.sentinel import MaskedSqnr, Sentinel, clamp_value, find_sentinels, masked_sqnr

__all__ = [
    "DIAGNOSTICS_SCHEMA_VERSION",
    "Diagnostic",
    "DiagnosticKind",
    "Diagnostics",
    "Remedy",
    "RemedyKind",
    "Severity",
    "TensorStats",
    "Thresholds",
    "collect_stats",
    "diagnose",
    "diagnose_models",
    "report_ranges",
]


#: Ops whose outputs live on a few decades near zero (Softmax, Sigmoid) or that divide by a small statistic
#: (LayerNorm and its decomposed Pow/Sqrt/Reciprocal): 8 bits there is a known cliff (docs/diagnostics.md).
CLIFF_OPS = frozenset(
    {"Softmax", "LogSoftmax", "LayerNormalization", "Sigmoid", "HardSigmoid", "Pow", "Sqrt", "Reciprocal"}
)
#: Ops whose inputs meet on one output grid (Concat: side by side; Add/Sum: an integer kernel rescales each input
#: to the output's scale). Sub is left out: LayerNorm's ``x - mean(x)`` has a tiny mean by construction.
JOIN_OPS = frozenset({"Concat", "Add", "Sum"})
WEIGHT_OPS = {"Conv": 0, "ConvTranspose": 1, "Gemm": 0, "MatMul": -1}  # op → output-channel axis of the weight


def _bits(quant_type: str | None) -> int:
    return 16 if (quant_type or "").endswith("16") else 8


# ---------------------------------------------------------------------------------------------- the checks
def _promote(tensors: Iterable[str], why: str) -> Remedy:
    ts = tuple(dict.fromkeys(tensors))
    return Remedy(RemedyKind.PROMOTE_16BIT, ts, f"promote {', '.join(ts)} to 16-bit ({why})")


def _check_qparams_report(a: ActivationResult) -> Diagnostic | None:
    if not a.quantized or a.scale is None:
        return None
    problem = None
    if not (math.isfinite(a.scale) and a.scale > 0):
        problem = f"scale {a.scale:g}: a scale must be finite and positive"
    elif a.quant_type in QRANGE and a.zero_point is not None:
        qmin, qmax = QRANGE[a.quant_type]
        if not qmin <= a.zero_point <= qmax:
            problem = f"zero point {a.zero_point} is outside {a.quant_type}'s range [{qmin}, {qmax}]"
    if problem is None:
        return None
    return Diagnostic(
        DiagnosticKind.BAD_QPARAMS, Severity.ERROR, a.tensor_name, a.producer_op,
        f"{problem}: every value of this tensor is meaningless in the quantized model",
        Remedy(RemedyKind.FIX_QPARAMS, (a.tensor_name,), "re-quantize (recalibrate) the model; check the tool that "
               "wrote this scale / zero point"),
        {"scale": a.scale, "zero_point": None if a.zero_point is None else float(a.zero_point)},
    )  # fmt: skip


def _check_ranges(a: ActivationResult, t: Thresholds) -> list[Diagnostic]:
    """Negative values under an unsigned grid, and a grid much wider than the data (from the report's ranges)."""
    grid = quant_grid(a)
    if grid is None or a.float_min is None or a.float_max is None:
        return []
    lo, hi, step = grid
    out = []
    by_design = a.fused_activation is not None or a.measured_through is not None  # a Relu clips them anyway
    if a.quant_type and a.quant_type.startswith("u") and lo >= 0 and a.float_min < -step / 2 and not by_design:
        out.append(
            Diagnostic(
                DiagnosticKind.NEGATIVE_UNSIGNED, Severity.WARNING, a.tensor_name, a.producer_op,
                f"{a.quant_type} grid starts at {lo:.4g} (zero point {a.zero_point}) but the tensor goes down to "
                f"{a.float_min:.4g}: every negative value is clipped to {lo:.4g}",
                _promote([a.tensor_name], "or recalibrate so the range covers the negative values"),
                {"float_min": a.float_min, "grid_min": lo},
            )
        )  # fmt: skip
    used = (min(hi, a.float_max) - max(lo, a.float_min)) / (hi - lo) if hi > lo else 1.0
    if 0 < used < 1 - t.wasted_fraction:
        bits = math.log2(1 / used)
        out.append(
            Diagnostic(
                DiagnosticKind.WASTED_RANGE, Severity.WARNING if bits >= 2 else Severity.INFO, a.tensor_name,
                a.producer_op,
                f"the data spans [{a.float_min:.4g}, {a.float_max:.4g}] but the {a.quant_type} grid spans "
                f"[{lo:.4g}, {hi:.4g}]: {used:.0%} of the codes are used, ~{bits:.1f} bit(s) wasted",
                _promote([a.tensor_name], "or calibrate on data like this, or an asymmetric activation scheme"),
                {"used_fraction": used, "wasted_bits": bits, "float_min": a.float_min, "float_max": a.float_max,
                 "grid_min": lo, "grid_max": hi},
            )
        )  # fmt: skip
    return out


def _grid_range(x: ActivationResult | None) -> float | None:
    """The width of a quantized tensor's grid (scale × number of steps): its scale made comparable across types
    (a 16-bit tensor's scale is ~256× smaller than an 8-bit one's for the same range)."""
    if x is None or not x.scale or x.scale <= 0 or x.quant_type not in QRANGE:
        return None
    qmin, qmax = QRANGE[x.quant_type]
    return x.scale * (qmax - qmin)


def _check_join(a: ActivationResult, by_name: Mapping[str, ActivationResult], t: Thresholds) -> Diagnostic | None:
    if a.producer_op not in JOIN_OPS:
        return None
    ranges = {i: r for i in a.inputs if (r := _grid_range(by_name.get(i))) is not None}
    if len(ranges) < 2:
        return None
    big, small = max(ranges, key=ranges.__getitem__), min(ranges, key=ranges.__getitem__)
    ratio = ranges[big] / ranges[small]
    if ratio <= t.scale_ratio:
        return None
    # Concat places the small input's values, unchanged in meaning, on the big grid; in a sum the small term also
    # matters less, so Add/Sum is a note.
    severity = Severity.WARNING if a.producer_op == "Concat" else Severity.INFO
    bits = _bits(a.quant_type)
    s_small, s_big = by_name[small].scale, by_name[big].scale
    return Diagnostic(
        DiagnosticKind.SCALE_MISMATCH, severity, a.tensor_name, a.producer_op,
        f"{a.producer_op} inputs have ranges {ratio:.3g}x apart ({small}: scale {s_small:.3g}, {big}: scale "
        f"{s_big:.3g}); on one shared {bits}-bit grid {small} keeps ~{max(0.0, bits - math.log2(ratio)):.1f} bits",
        _promote([a.tensor_name, small], f"{small} loses ~{math.log2(ratio):.1f} bits on the shared grid"),
        {"scale_ratio": ratio, "small_scale": s_small, "large_scale": s_big},
    )  # fmt: skip


def _check_cliff(a: ActivationResult, st: TensorStats | None, t: Thresholds) -> Diagnostic | None:
    if a.producer_op not in CLIFF_OPS or not a.quantized or not (a.quant_type or "").endswith("8"):
        return None
    local = a.local_sqnr_db
    flushed = st.nonzero_flushed / (st.count - st.zeros) if st is not None and st.count > st.zeros else None
    low = local is not None and math.isfinite(local) and local < t.cliff_local_db
    flush = flushed is not None and flushed > t.flush_fraction
    if not (low or flush):
        return None
    parts = []
    if low:
        parts.append(f"local SQNR {local:.1f} dB at 8 bits")
    if flush:
        parts.append(f"{flushed:.0%} of its nonzero values round to 0 (step {a.scale:.3g})")
    return Diagnostic(
        DiagnosticKind.PRECISION_CLIFF, Severity.WARNING, a.tensor_name, a.producer_op,
        f"{a.producer_op} is a known 8-bit precision cliff: " + "; ".join(parts),
        _promote([a.tensor_name], f"{a.producer_op} needs the finer grid"),
        {"local_sqnr_db": local, "flushed_fraction": flushed},
    )  # fmt: skip


def _check_stats(a: ActivationResult, st: TensorStats, t: Thresholds) -> list[Diagnostic]:
    """Outlier-dominated range and saturation (from :class:`TensorStats`)."""
    out = []
    grid = quant_grid(a)
    p = st.abs_percentile(99.99)
    if grid is not None and p > 0 and st.abs_max / p > t.outlier_ratio and not (a.quant_type or "").endswith("16"):
        ratio, bits = st.abs_max / p, _bits(a.quant_type)
        out.append(
            Diagnostic(
                DiagnosticKind.OUTLIER_RANGE, Severity.WARNING, a.tensor_name, a.producer_op,
                f"max |x| {st.abs_max:.4g} is {ratio:.3g}x the 99.99th percentile {p:.4g}: a few outliers set the "
                f"range and 99.99% of the values share ~{max(0.0, bits - math.log2(ratio)):.1f} of {bits} bits",
                _promote([a.tensor_name], "or percentile calibration (qdebug quantize --calibration-method "
                         "percentile) to clip the outliers"),
                {"abs_max": st.abs_max, "p9999": p, "ratio": ratio},
            )
        )  # fmt: skip
    clipped = st.clipped_low + st.clipped_high
    if grid is not None and st.count and clipped / st.count > t.saturation:
        frac = clipped / st.count
        out.append(
            Diagnostic(
                DiagnosticKind.SATURATION, Severity.WARNING, a.tensor_name, a.producer_op,
                f"{frac:.2%} of the values fall outside the grid [{grid[0]:.4g}, {grid[1]:.4g}] and are clipped "
                f"({st.clipped_low} below, {st.clipped_high} above)",
                Remedy(RemedyKind.PERCENTILE_CALIBRATION, (a.tensor_name,),
                       "recalibrate on data like this (qdebug quantize --calib), or promote to 16-bit with a wider "
                       "range"),
                {"clipped_fraction": frac, "clipped_low": float(st.clipped_low),
                 "clipped_high": float(st.clipped_high)},
            )
        )  # fmt: skip
    return out


def _channel_maxima(w: np.ndarray, axis: int) -> np.ndarray:
    a = np.abs(np.asarray(w, dtype=np.float64))
    axis = axis % a.ndim
    return a.max(axis=tuple(i for i in range(a.ndim) if i != axis)) if a.ndim > 1 else a


def _check_weight(w: WeightResult, f_index: GraphIndex, t: Thresholds) -> Diagnostic | None:
    if w.kind != "weight" or w.channels > 1 or w.consumer_op not in WEIGHT_OPS or w.weight_name not in f_index.consts:
        return None
    value = f_index.value(w.weight_name)
    if value.ndim < 2:
        return None
    m = _channel_maxima(value, WEIGHT_OPS[w.consumer_op])
    nz = m[m > 0]
    if nz.size < 2 or nz.max() / nz.min() <= t.channel_ratio:
        return None
    ratio, bits = float(nz.max() / nz.min()), _bits(w.quant_type)
    return Diagnostic(
        DiagnosticKind.PER_CHANNEL_WEIGHT, Severity.WARNING, w.weight_name, w.consumer_op,
        f"one {w.quant_type} scale for {m.size} output channels whose max |w| ranges from {nz.min():.3g} to "
        f"{nz.max():.3g} ({ratio:.3g}x): the smallest channel keeps ~{max(0.0, bits - math.log2(ratio)):.1f} bits",
        Remedy(RemedyKind.PER_CHANNEL, (w.weight_name,), f"quantize {w.weight_name} per channel (one scale per "
               "output channel: qdebug quantize --per-channel, or this override)"),
        {"channel_ratio": ratio, "channels": float(m.size), "min_channel_max": float(nz.min()),
         "max_channel_max": float(nz.max())},
    )  # fmt: skip


def report_ranges(report: DebugReport) -> dict[str, tuple[float, float]]:
    """Each activation's float (min, max) as the report measured it."""
    return {
        a.tensor_name: (a.float_min, a.float_max)
        for a in report.activations
        if a.float_min is not None and a.float_max is not None
    }


def _sentinel_tolerance(a: ActivationResult, value: float) -> float:
    """How close to the sentinel a float value counts as the sentinel: one grid step (a float32 ulp of it at least)."""
    step = a.scale if a.scale is not None and math.isfinite(a.scale) and a.scale > 0 else 0.0
    return max(step, abs(value) * 2.0**-20 if math.isfinite(value) else 0.0)


def _sentinel_evidence(s: Sentinel, a: ActivationResult, scores: ActivationResult | None, m: MaskedSqnr | None) -> str:
    grid = _grid_range(a) or math.inf
    span = (
        (scores.float_max - scores.float_min)
        if scores and scores.float_max is not None and scores.float_min is not None
        else None
    )
    bits = _bits(a.quant_type)
    kept = max(0.0, bits - math.log2(grid / span)) if span else 0.0
    text = (
        f"mask constant {s.value:.3g} ({s.constant}) meets the scores {s.scores} at this {s.join_op} before "
        f"{s.softmax}: on one {a.quant_type} grid (step {a.scale:.3g}) the scores keep ~{kept:.1f} of {bits} bits"
    )
    if m is not None and m.sqnr_db is not None:
        shown = "" if a.cumulative_sqnr_db is None else f"; the table's {a.cumulative_sqnr_db:.0f} dB counts them"
        text += (
            f"; SQNR over its {m.elements - m.sentinel_elements} non-mask elements {m.sqnr_db:.1f} dB (the "
            f"{m.sentinel_elements} mask elements, within one step of the sentinel, left out{shown})"
        )
    else:
        text += "; its SQNR in the tables is the mask elements', which dominate its energy"
    return text


def _check_sentinels(
    report: DebugReport, float_model: onnx.ModelProto, masked: Mapping[str, MaskedSqnr] | None
) -> list[Diagnostic]:
    """A sentinel mask constant sharing a grid with the scores it masks (:mod:`qdebug.sentinel`): one error per
    join, its remedy the clamp, keeping the mask path in float the alternative."""
    by_name = {a.tensor_name: a for a in report.activations}
    ranges = report_ranges(report)
    sentinels = find_sentinels(float_model, ranges)
    clamps: dict[str, float] = {}  # one constant may mask several joins: the value all of them need
    for s in sentinels:
        c = clamp_value(s.value, ranges.get(s.scores, (0.0, 0.0)))
        clamps[s.constant] = c if abs(c) > abs(clamps.get(s.constant, 0.0)) else clamps[s.constant]
    out = []
    for s in sentinels:
        a = by_name.get(s.join_output)
        if a is None or not a.quantized or quant_grid(a) is None:
            continue  # kept in float: nothing shares its grid
        scores = by_name.get(s.scores)
        m = (masked or {}).get(s.join_output)
        clamp = clamps[s.constant]
        clamp_text = (
            f"clamp {s.constant} to {clamp:.6g} (qdebug.sentinel.clamp_sentinels: ≥ 110 below the scores' range, so "
            f"Softmax maps it identically; the grid shrinks from {_grid_range(a):.3g} to ~{abs(clamp) * 2:.3g}), or "
            f"keep the mask path in float (nodes_to_exclude: {', '.join(s.float_nodes)}); diagnose --measure "
            "measures both"
        )
        fallback = Remedy(
            RemedyKind.FLOAT_FALLBACK, (s.join_output,),
            f"keep the mask path in float (nodes_to_exclude: {', '.join(s.float_nodes)}): no cost on the CPU; on an "
            "NPU the target says what float costs (QNN: fp16 on the HTP, or a split to the CPU)"
            + (f"; {len(s.unnamed)} unnamed node(s) cannot be excluded by name" if s.unnamed else ""),
            s.float_nodes,
        )  # fmt: skip
        out.append(
            Diagnostic(
                DiagnosticKind.SENTINEL, Severity.ERROR, s.join_output, s.join_op, _sentinel_evidence(s, a, scores, m),
                Remedy(RemedyKind.SENTINEL_CLAMP, (s.constant,), clamp_text),
                {"sentinel": s.value, "clamp_value": clamp, "masked_sqnr_db": None if m is None else m.sqnr_db,
                 "sentinel_elements": None if m is None else float(m.sentinel_elements),
                 "reported_sqnr_db": a.cumulative_sqnr_db},
                alternatives=(fallback,),
            )
        )  # fmt: skip
    return out


def _model_qparams(quant_model: onnx.ModelProto, known: set[str]) -> list[Diagnostic]:
    return [
        Diagnostic(
            DiagnosticKind.BAD_QPARAMS, Severity.ERROR, tensor, node_op,
            f"{problem}: the quantized model runs but this tensor's numbers are meaningless",
            Remedy(RemedyKind.FIX_QPARAMS, (tensor,), "re-quantize (recalibrate) the model; check the tool that "
                   "wrote these parameters"),
        )
        for tensor, problem, node_op in qdq_parameter_issues(quant_model)
        if tensor not in known
    ]  # fmt: skip


def _by_design(a: ActivationResult, st: TensorStats) -> TensorStats:
    """``st`` without the clipping that a fused or consuming Relu/Clip does anyway: ORT gives such a tensor the
    activation's range, so values its Q clips are values the float graph clips too."""
    if a.fused_activation is None and a.measured_through is None:
        return st
    return replace(st, clipped_low=0, clipped_high=0)


def _one_tensor(
    a: ActivationResult, by_name: Mapping[str, ActivationResult], st: TensorStats | None, t: Thresholds
) -> list[Diagnostic]:
    """The checks of one activation; one cause is named once (a cliff op's unused range is the cliff; values an
    unsigned grid clips below zero are the negative-values diagnostic, not saturation)."""
    found = _check_ranges(a, t)
    found += [d for d in (_check_join(a, by_name, t), _check_cliff(a, st, t)) if d is not None]
    if st is not None:
        if any(d.kind is DiagnosticKind.NEGATIVE_UNSIGNED for d in found):
            st = replace(st, clipped_low=0)
        found += _check_stats(a, _by_design(a, st), t)
    if any(d.kind is DiagnosticKind.PRECISION_CLIFF for d in found):
        found = [d for d in found if d.kind is not DiagnosticKind.WASTED_RANGE]
    return found


def diagnose(
    report: DebugReport,
    float_model: onnx.ModelProto | None = None,
    quant_model: onnx.ModelProto | None = None,
    stats: Mapping[str, TensorStats] | None = None,
    *,
    stats_samples: int = 0,
    thresholds: Thresholds | None = None,
    masked: Mapping[str, MaskedSqnr] | None = None,
) -> Diagnostics:
    """Every diagnostic the inputs allow: from the report alone, plus the weight and sentinel checks with
    ``float_model``, the Q/DQ parameter check with ``quant_model``, and the outlier / saturation / flush checks with
    ``stats`` (:func:`collect_stats`). ``masked`` (:func:`qdebug.sentinel.masked_sqnr`) gives a sentinel-carrying
    tensor's SQNR over its non-sentinel elements. Most severe first, then in topological order."""
    t = thresholds or Thresholds()
    by_name = {a.tensor_name: a for a in report.activations}
    items: list[Diagnostic] = []
    checks = {DiagnosticKind.BAD_QPARAMS, DiagnosticKind.NEGATIVE_UNSIGNED, DiagnosticKind.WASTED_RANGE}
    checks |= {DiagnosticKind.SCALE_MISMATCH, DiagnosticKind.PRECISION_CLIFF}
    for a in report.activations:
        bad = _check_qparams_report(a)
        if bad is not None:  # nothing else about this tensor means anything
            items.append(bad)
            continue
        items += _one_tensor(a, by_name, (stats or {}).get(a.tensor_name), t)
    if stats is not None:
        checks |= {DiagnosticKind.OUTLIER_RANGE, DiagnosticKind.SATURATION}
    if float_model is not None:
        f_index = GraphIndex(float_model)
        items += [d for w in report.weights if (d := _check_weight(w, f_index, t)) is not None]
        checks.add(DiagnosticKind.PER_CHANNEL_WEIGHT)
        items = _with_sentinels(items, _check_sentinels(report, float_model, masked))
        checks.add(DiagnosticKind.SENTINEL)
    if quant_model is not None:
        items += _model_qparams(quant_model, {d.tensor for d in items if d.kind is DiagnosticKind.BAD_QPARAMS})
    topo = {a.tensor_name: a.topo_index for a in report.activations}
    items.sort(key=lambda d: (SEVERITY_ORDER[d.severity], topo.get(d.tensor, 1 << 30)))
    return Diagnostics(tuple(items), stats_samples, tuple(k for k in DiagnosticKind if k in checks))


def _with_sentinels(items: list[Diagnostic], found: list[Diagnostic]) -> list[Diagnostic]:
    """``items`` plus the sentinel errors, without what they explain: the mask's grid is the cause named once (no
    scale mismatch, wasted or outlier range at the tensors it shares a grid with)."""
    if not found:
        return items
    explained = {d.tensor for d in found}
    return [d for d in items if d.tensor not in explained] + found


def diagnose_models(
    report: DebugReport,
    float_model: str | Path | onnx.ModelProto,
    quant_model: str | Path | onnx.ModelProto,
    data: Any = None,
    *,
    max_samples: int = 8,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    synthetic: Mapping[str, Any] | None = None,
    thresholds: Thresholds | None = None,
) -> Diagnostics:
    """Every check: :func:`collect_stats` over the first ``max_samples`` samples of ``data`` (``max_samples=0``:
    no statistics pass; ``synthetic``: see :func:`collect_stats`), then :func:`diagnose` with both models."""
    from qdebug.model_io import load_model

    f = float_model if isinstance(float_model, onnx.ModelProto) else load_model(float_model, "float model")
    q = quant_model if isinstance(quant_model, onnx.ModelProto) else load_model(quant_model, "quantized model")
    stats, seen = (None, 0)
    masked = None
    if max_samples > 0:
        stats, seen = collect_stats(
            f, report, data, max_samples=max_samples, input_shapes=input_shapes, synthetic=synthetic
        )
        by_name = {a.tensor_name: a for a in report.activations}
        carriers = {
            s.join_output: (s.value, _sentinel_tolerance(by_name[s.join_output], s.value))
            for s in find_sentinels(f, report_ranges(report))
            if s.join_output in by_name and by_name[s.join_output].quantized
        }
        if carriers:
            masked = masked_sqnr(
                f, q, carriers, data, max_samples=max_samples, input_shapes=input_shapes, synthetic=synthetic
            )
    return diagnose(report, f, q, stats, stats_samples=seen, thresholds=thresholds, masked=masked)
