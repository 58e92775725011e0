"""Diagnose → fix: every diagnosis' remedy measured (``qdebug diagnose --measure``, docs/diagnostics.md#measure).

Each :class:`~qdebug.diagnose.Diagnostic` names a remedy (and for a sentinel an alternative); this module turns each
into a quantization of the session's float model, re-quantized from the session's cached calibration where the
remedy is a config change (a promotion through ORT's fixer, a per-channel weight override, another calibration
method's range, nodes kept in float) or calibrated afresh where it changes the float model (a sentinel clamp) or the
whole quantization (bad Q/DQ parameters), debugs it on the session's debug samples and reports the gain at the worst
output beside the gain predicted for it (:func:`qdebug.mixed.suggest.analyse`'s calibrated estimate; a weight's
per-channel noise computed from its values). The all-16-bit-activation model is measured first: its worst output is
the ceiling that bounds every promotion's prediction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from qdebug.config import QuantConfig
from qdebug.data import open_data
from qdebug.diagnose import report_ranges
from qdebug.errors import ConfigError, QDebugError
from qdebug.findings import Diagnostic, Diagnostics, RemedyKind
from qdebug.graph_index import GraphIndex
from qdebug.metrics import sqnr_from_energies
from qdebug.mixed.gains import DiagnosisGain, DiagnosisGains, rank_by_measured
from qdebug.mixed.remedies import Remedy, RemedyResult, measure_remedies, method_ranges, sentinel_remedies
from qdebug.mixed.remedies import RemedyKind as MixedKind
from qdebug.mixed.suggest import analyse, gain_from_share, noise_budget
from qdebug.model_io import input_specs
from qdebug.report import DebugReport
from qdebug.sentinel import find_sentinels

__all__ = ["measure_diagnostics", "predicted_per_channel_gain", "predicted_promotion_gain", "select_for_measure"]

_OUT_AXIS = {"Conv": 0, "ConvTranspose": 1, "Gemm": 0, "MatMul": -1}


def predicted_promotion_gain(report: DebugReport, tensors: Sequence[str], ceiling_db: float | None = None) -> float:
    """The calibrated predicted gain at the worst output of promoting ``tensors`` together: their output-noise
    shares (:func:`~qdebug.mixed.suggest.analyse`) added, bounded by the headroom to ``ceiling_db``."""
    est = {s.tensor_name: s.estimated_output_gain_db for s in analyse(report, ceiling_db)}
    share = sum(1.0 - 10.0 ** (-est.get(t, 0.0) / 10.0) for t in tensors)
    gain = gain_from_share(share)
    out = report.min_output_sqnr_db
    if ceiling_db is not None and out is not None and math.isfinite(out):
        gain = min(gain, max(0.0, ceiling_db - out))
    return gain + 0.0


def _weight_sqnr(w: np.ndarray, axis: int | None, bits: int) -> float:
    """SQNR (dB) of ``w`` on a symmetric grid of ``bits``, one scale per slice along ``axis`` (``None``: one)."""
    w = np.asarray(w, dtype=np.float64)
    levels = 2 ** (bits - 1) - 1
    if axis is None:
        m = np.full_like(w, np.abs(w).max())
    else:
        axis %= w.ndim
        m = np.abs(w).max(axis=tuple(i for i in range(w.ndim) if i != axis), keepdims=True)
    scale = np.where(m > 0, m / levels, 1.0)
    noise = float(np.sum((w - np.round(w / scale) * scale) ** 2))
    signal = float(np.sum(w**2))
    db = sqnr_from_energies(signal, noise)[0]
    return math.nan if db is None else db  # NaN/Inf weights: no SQNR, so no gain is estimated from it


def _removed_share(report: DebugReport, float_index: GraphIndex, weight: str, op: str, budget: float) -> float:
    """The part of the noise budget that quantizing ``weight`` per channel removes: its share shrunk by the
    per-channel / per-tensor noise ratio computed from its values (a symmetric grid of the weight's bits)."""
    if weight not in float_index.consts or op not in _OUT_AXIS or budget <= 0:
        return 0.0
    w = float_index.value(weight)
    if w.ndim < 2:
        return 0.0
    measured = next((r for r in report.weights if r.weight_name == weight and r.kind == "weight"), None)
    if measured is None or measured.weight_sqnr_db is None or not math.isfinite(measured.weight_sqnr_db):
        return 0.0
    bits = 16 if measured.quant_type.endswith("16") else 8
    # The share is the report's (what the budget adds up); the improvement is the per-channel / per-tensor noise
    # ratio of one grid family computed from the values, which the quantizer's own scheme shares.
    before, after = _weight_sqnr(w, None, bits), _weight_sqnr(w, _OUT_AXIS[op], bits)
    if not math.isfinite(before):
        return 0.0
    share = min(1.0, 10.0 ** (-measured.weight_sqnr_db / 10.0) / budget)
    kept = 0.0 if not math.isfinite(after) else min(1.0, 10.0 ** ((before - after) / 10.0))
    return float(share * (1.0 - kept))


def predicted_per_channel_gain(
    report: DebugReport, float_index: GraphIndex, weights: Sequence[tuple[str, str]]
) -> float:
    """Predicted gain at the worst output of quantizing ``weights`` ((name, consumer op) pairs) per channel: the
    noise each removes from the report's noise budget (:func:`~qdebug.mixed.suggest.noise_budget`), added."""
    budget = noise_budget(report)
    removed = sum(_removed_share(report, float_index, w, op, budget) for w, op in dict.fromkeys(weights))
    return 0.0 - 10.0 * math.log10(max(1e-12, 1.0 - min(removed, 1.0))) + 0.0


def _all_weights(report: DebugReport) -> list[tuple[str, str]]:
    """Every per-tensor weight of a Conv/Gemm/MatMul (what whole-model per-channel weights change)."""
    return [(w.weight_name, w.consumer_op) for w in report.weights if w.kind == "weight" and w.channels <= 1]


def _per_channel_config(base: QuantConfig, float_index: GraphIndex, weight: str, op: str) -> QuantConfig:
    axis = _OUT_AXIS.get(op, 0)
    if axis < 0:
        axis %= float_index.value(weight).ndim
    return base.replace(tensor_overrides=(*base.tensor_overrides, *_overrides({weight: [{"axis": axis}]})))


def _overrides(d: dict[str, list[dict[str, Any]]]) -> Any:
    from qdebug.config import make_overrides

    return make_overrides(d)


class _Measurer:
    """The state one ``--measure`` run shares: the session, the base report, the ceiling, lazily made ranges."""

    def __init__(self, session: Any, proof_samples: int) -> None:
        self.session = session
        self.base: DebugReport = session.base.report
        self.index = GraphIndex(session.float_proto)
        self.proof_samples = proof_samples
        self.ceiling: float | None = None
        self._percentile: dict[str, tuple[float, float]] | None = None

    def measure_ceiling(self) -> None:
        base = self.session.base_config
        wide = "int16" if base.activation_type.startswith("int") else "uint16"
        try:
            ev = self.session.evaluate(base.replace(activation_type=wide), name="all16_activations")
        except QDebugError:
            return
        self.ceiling = ev.output_sqnr_db

    def percentile(self) -> dict[str, tuple[float, float]]:
        if self._percentile is None:
            self._percentile = method_ranges(self.session, "percentile")
        return self._percentile

    def config_of(self, d: Diagnostic) -> tuple[QuantConfig, float | None]:
        """The config that applies the diagnosis' main remedy, and its predicted gain (``None``: no estimate)."""
        base, r = self.session.base_config, d.remedy
        if r.kind is RemedyKind.PROMOTE_16BIT:
            return self.session.promote(r.tensors).config, predicted_promotion_gain(self.base, r.tensors, self.ceiling)
        if r.kind is RemedyKind.PER_CHANNEL:
            (w,) = r.tensors
            cfg = _per_channel_config(base, self.index, w, d.op)
            return cfg, predicted_per_channel_gain(self.base, self.index, [(w, d.op)])
        if r.kind is RemedyKind.PERCENTILE_CALIBRATION:
            ranges = self.percentile()
            have = {t: [{"rmin": ranges[t][0], "rmax": ranges[t][1]}] for t in r.tensors if t in ranges}
            if not have:
                raise ConfigError(f"no percentile range for {', '.join(r.tensors)}")
            return base.replace(tensor_overrides=(*base.tensor_overrides, *_overrides(have))), None
        raise ConfigError(f"remedy {r.kind} is not a config change")

    def sentinel(self, diags: Sequence[Diagnostic]) -> list[tuple[Diagnostic, Remedy]]:
        """The clamp and the float fallback of every sentinel diagnosis (measured once for all of them)."""
        model = self.session.float_proto
        joins = {d.tensor for d in diags}
        sentinels = [s for s in find_sentinels(model, report_ranges(self.base)) if s.join_output in joins]
        src = open_data(self.session.debug_data, input_specs(model), num_samples=self.proof_samples)
        samples = [dict(s) for _, s in zip(range(self.proof_samples), src, strict=False)]
        rems = sentinel_remedies(self.session.base_config, model, sentinels, report_ranges(self.base), samples=samples)
        return [(diags[0], r) for r in rems]


def select_for_measure(diagnostics: Diagnostics, n: int) -> Diagnostics:
    """At most ``n`` diagnoses to measure, most severe first, but the first of every remedy kind before a second of
    any (twenty saturated tensors must not crowd out the one per-channel weight that would help)."""
    items = diagnostics.items
    first: dict[RemedyKind, int] = {}
    for k, d in enumerate(items):
        first.setdefault(d.remedy.kind, k)
    chosen = sorted(first.values())[:n]
    chosen += [k for k in range(len(items)) if k not in set(chosen)][: max(0, n - len(chosen))]
    return Diagnostics(tuple(items[k] for k in sorted(chosen)), diagnostics.stats_samples, diagnostics.checks)


def _gain(d: Diagnostic, kind: str, text: str, predicted: float | None, r: RemedyResult) -> DiagnosisGain:
    return DiagnosisGain(d.tensor, str(d.kind), kind, text, predicted, r.gain_db, r.output_sqnr_db, r.error)


def measure_diagnostics(session: Any, diagnostics: Diagnostics, *, proof_samples: int = 4) -> DiagnosisGains:
    """Measure every diagnosis' remedy on ``session`` (a :class:`~qdebug.mixed.session.MixedPrecisionSession` whose
    base is the diagnosed model): the same remedy named by several diagnoses is measured once. Sentinel remedies
    are proved on ``proof_samples`` debug samples first (:func:`qdebug.sentinel.clamp_sentinels`). Ranked by
    measured gain (:func:`~qdebug.mixed.gains.rank_by_measured`)."""
    m = _Measurer(session, proof_samples)
    m.measure_ceiling()
    items: list[DiagnosisGain] = []
    seen: set[tuple[str, tuple[str, ...]]] = set()
    sentinels = [d for d in diagnostics.items if d.remedy.kind is RemedyKind.SENTINEL_CLAMP]
    if sentinels:
        pairs = m.sentinel(sentinels)
        for (d, rem), res in zip(pairs, measure_remedies(session, [r for _, r in pairs]), strict=True):
            items.append(_gain(d, str(rem.kind), rem.description + (f"; {rem.note}" if rem.note else ""), None, res))
    if any(d.remedy.kind is RemedyKind.FIX_QPARAMS for d in diagnostics.items):
        d = next(d for d in diagnostics.items if d.remedy.kind is RemedyKind.FIX_QPARAMS)
        fresh = Remedy(MixedKind.CALIBRATION, "re-quantized from the float model (fresh calibration)",
                       session.base_config, float_model=session.float_proto)  # fmt: skip
        (res,) = measure_remedies(session, [fresh])
        items.append(_gain(d, str(d.remedy.kind), fresh.description, None, res))
    for d in diagnostics.items:
        key = (str(d.remedy.kind), d.remedy.tensors)
        if d.remedy.kind in (RemedyKind.SENTINEL_CLAMP, RemedyKind.FIX_QPARAMS) or key in seen:
            continue
        seen.add(key)
        try:
            cfg, predicted = m.config_of(d)
        except QDebugError as exc:
            items.append(DiagnosisGain(d.tensor, str(d.kind), str(d.remedy.kind), d.remedy.text, None, None, None,
                                       str(exc)))  # fmt: skip
            continue
        (res,) = measure_remedies(session, [Remedy(MixedKind.CALIBRATION, d.remedy.text, cfg, d.remedy.tensors)])
        text = d.remedy.text
        if res.error and d.remedy.kind is RemedyKind.PER_CHANNEL and not session.base_config.per_channel:
            # ORT writes one weight's axis only from opset 13 (below, it raises the opset for per_channel alone):
            # the whole model's weights per channel is what this model can take.
            text = f"per-channel weights, whole model (one weight's axis did not load: {res.error[:80]}...)"
            predicted = predicted_per_channel_gain(m.base, m.index, _all_weights(m.base))
            cfg = session.base_config.replace(per_channel=True)
            (res,) = measure_remedies(session, [Remedy(MixedKind.PER_CHANNEL_WEIGHTS, text, cfg)])
        items.append(_gain(d, str(d.remedy.kind), text, predicted, res))
    return DiagnosisGains(session.base.output_sqnr_db, rank_by_measured(items), m.ceiling)
