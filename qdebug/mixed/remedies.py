"""Remedies beyond "promote activations to 16 bits", each *measured* before it is recommended.

Promotion does not touch weights: on a conv net whose error is in its 8-bit per-tensor weights, all-16-bit
activations gain ~0.1 dB. The remedies here change other parts of the recipe:

* ``per_channel_weights`` — one scale per output channel (whole model);
* ``weights_16bit`` — the worst weights (lowest weight SQNR in the base report) in 16 bits, as per-tensor
  overrides (QNN: 16-bit weights need HTP v73 or newer, e.g. SM8550 — said in the remedy's note);
* ``symmetric_activations`` / ``asymmetric_activations`` — the other activation range mode (whole model);
* ``calibration`` — for the tensors with the worst local SQNR, the range another calibration method
  (percentile, entropy) gives, as per-tensor ``rmin``/``rmax`` overrides. That method's ranges come from one more
  calibration pass (ORT keeps only min/max in its cache, no histograms); every measurement after it reuses them.

Each remedy is a :class:`~qdebug.config.QuantConfig`; :func:`measure_remedies` quantizes it from the session's
cached calibration ranges (no re-calibration) and debugs it. :func:`remedy_overrides` turns a measured remedy into
the same :class:`~qdebug.mixed.overrides.OverridesFile` the CLI consumes (``qdebug quantize --overrides``),
checked against the float model and, for overrides, passed through ORT's mixed-precision fixer.
"""

from __future__ import annotations

import contextlib
import io
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
import onnx

from qdebug.config import QuantConfig, make_overrides
from qdebug.errors import ConfigError, QDebugError
from qdebug.report import DebugReport, encode_number
from qdebug.sentinel import Sentinel, clamp_sentinels
from qdebug.target_registry import lookup

SCHEMA_VERSION = 1


class RemedyKind(StrEnum):
    """What a remedy changes."""

    PER_CHANNEL_WEIGHTS = "per_channel_weights"
    WEIGHTS_16BIT = "weights_16bit"
    SYMMETRIC_ACTIVATIONS = "symmetric_activations"
    ASYMMETRIC_ACTIVATIONS = "asymmetric_activations"
    CALIBRATION = "calibration"
    #: the float model's sentinel mask constants clamped (:func:`qdebug.sentinel.clamp_sentinels`): the remedy
    #: carries the rewritten float model, quantized with a calibration of its own
    SENTINEL_CLAMP = "sentinel_clamp"
    #: nodes kept in float (``QuantConfig.nodes_to_exclude``), e.g. a sentinel mask's path
    FLOAT_FALLBACK = "float_fallback"


@dataclass(frozen=True)
class Remedy:
    """A recipe change, not yet measured."""

    kind: RemedyKind
    description: str
    config: QuantConfig
    tensors: tuple[str, ...] = ()
    note: str = ""
    #: a rewritten float model (``sentinel_clamp``) quantized instead of the session's: it is calibrated afresh, and
    #: debugged against the session's original float model (the rewrite must keep the float outputs, which
    #: :func:`qdebug.sentinel.clamp_sentinels` checks)
    float_model: onnx.ModelProto | None = None


@dataclass(frozen=True)
class RemedyResult:
    """A remedy measured against the base: worst output SQNR and its gain (``error``: it could not be built)."""

    remedy: Remedy
    output_sqnr_db: float | None
    gain_db: float | None
    seconds: float
    error: str | None = None

    @property
    def recommended(self) -> bool:
        """Measured, and better than the base by at least 0.1 dB (the noise of a small debug set)."""
        return self.gain_db is not None and self.gain_db >= 0.1

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "kind": str(self.remedy.kind),
            "description": self.remedy.description,
            "tensors": list(self.remedy.tensors),
            "note": self.remedy.note,
            "config": self.remedy.config.to_dict(),
            "output_sqnr_db": encode_number(self.output_sqnr_db),
            "gain_db": encode_number(self.gain_db),
            "seconds": self.seconds,
            "error": self.error,
            "recommended": self.recommended,
        }


def _worst_weights(report: DebugReport, n: int) -> list[str]:
    ws = [w for w in report.weights if w.kind == "weight" and w.weight_sqnr_db is not None]
    ws = [w for w in ws if math.isfinite(w.weight_sqnr_db or 0.0) and not w.quant_type.endswith("16")]
    ws.sort(key=lambda w: w.weight_sqnr_db or 0.0)
    return list(dict.fromkeys(w.weight_name for w in ws))[:n]


def _worst_local(report: DebugReport, n: int) -> list[str]:
    acts = [a for a in report.activations if a.quantized and a.local_sqnr_db is not None]
    acts = [a for a in acts if math.isfinite(a.local_sqnr_db or 0.0)]
    acts.sort(key=lambda a: a.local_sqnr_db or 0.0)
    return [a.tensor_name for a in acts[:n]]


def _with_overrides(base: QuantConfig, extra: dict[str, list[dict[str, Any]]]) -> QuantConfig:
    merged: dict[str, Any] = {n: list(es) for n, es in base.tensor_overrides}
    for name, entries in extra.items():
        if name in merged:
            raise ConfigError(f"{name!r} already has an override in the base config")
        merged[name] = entries
    return base.replace(tensor_overrides=make_overrides(merged))


def propose_remedies(
    base: QuantConfig,
    report: DebugReport,
    *,
    worst_weights: int = 4,
    worst_tensors: int = 8,
    calibration_ranges: dict[str, dict[str, tuple[float, float]]] | None = None,
) -> list[Remedy]:
    """The remedies worth measuring for ``base`` (the config of ``report``). ``calibration_ranges`` maps a method
    name to each tensor's ``(rmin, rmax)`` under that method (:func:`method_ranges`)."""
    out: list[Remedy] = []
    if not base.per_channel:
        with contextlib.suppress(ConfigError):  # the target cannot run per-channel weights of this type
            out.append(Remedy(RemedyKind.PER_CHANNEL_WEIGHTS, "per-channel weights", base.replace(per_channel=True)))
    weights = _worst_weights(report, worst_weights)
    if weights:
        wtype = "int16" if base.weight_type.startswith("int") else "uint16"
        note = str(lookup(base.target).sixteen_bit_weights_note())
        try:
            cfg = _with_overrides(base, {w: [{"quant_type": wtype}] for w in weights})
            out.append(
                Remedy(
                    RemedyKind.WEIGHTS_16BIT, f"{len(weights)} worst weight(s) in {wtype}", cfg, tuple(weights), note
                )
            )
        except ConfigError:
            pass
    kind = RemedyKind.ASYMMETRIC_ACTIVATIONS if base.activation_symmetric else RemedyKind.SYMMETRIC_ACTIVATIONS
    try:
        sym = base.replace(activation_symmetric=not base.activation_symmetric)
        out.append(Remedy(kind, f"{'asymmetric' if base.activation_symmetric else 'symmetric'} activations", sym))
    except ConfigError:
        pass
    tensors = _worst_local(report, worst_tensors)
    for method, ranges in (calibration_ranges or {}).items():
        have = [t for t in tensors if t in ranges and t not in base.overrides_dict]
        if not have:
            continue
        extra = {t: [{"rmin": float(ranges[t][0]), "rmax": float(ranges[t][1])}] for t in have}
        desc = f"{method} ranges for the {len(have)} tensor(s) with the worst local SQNR"
        out.append(Remedy(RemedyKind.CALIBRATION, desc, _with_overrides(base, extra), tuple(have)))
    return out


def method_ranges(session: Any, method: str) -> dict[str, tuple[float, float]]:
    """Every calibrated tensor's ``(rmin, rmax)`` under ``method`` (one calibration pass of the session's data)."""
    from onnxruntime.quantization.calibrate import load_tensors_data

    from qdebug.quantizer import quantize

    cfg = session.base_config.replace(calibration_method=method, activation_symmetric=False)
    # ORT's histogram calibrators print their settings to stdout, which is the CLI's table/JSON channel.
    with contextlib.redirect_stdout(io.StringIO()):
        q = quantize(session.float_path, session.data, cfg, session.workdir / f"calib_{method}.qdq.onnx", check=False)
    data = load_tensors_data(q.calibration_cache)
    out = {}
    for name, td in data.data.items():
        lo, hi = td.range_value
        out[name] = (float(lo), float(hi))
    return out


def sentinel_remedies(
    base: QuantConfig,
    float_model: onnx.ModelProto,
    sentinels: Sequence[Sentinel],
    score_ranges: Mapping[str, tuple[float, float]],
    *,
    samples: Iterable[Mapping[str, np.ndarray]] | None = None,
) -> list[Remedy]:
    """The two remedies of sentinel mask constants (:mod:`qdebug.sentinel`): the clamp (carrying the rewritten float
    model; left out when ``samples`` show it changes the float outputs) and the mask paths kept in float
    (``nodes_to_exclude``; the target's note says what float costs there). ``score_ranges``: the scores' calibrated
    (min, max) per ``Sentinel.scores`` tensor."""
    if not sentinels:
        return []
    out = []
    clamped, report = clamp_sentinels(float_model, sentinels, score_ranges, samples=samples)
    if report.changed:
        out.append(
            Remedy(RemedyKind.SENTINEL_CLAMP, f"sentinel mask constant(s) clamped ({'; '.join(report.details)})",
                   base, tuple(dict.fromkeys(s.constant for s in sentinels)), float_model=clamped)
        )  # fmt: skip
    nodes = tuple(dict.fromkeys(n for s in sentinels for n in s.float_nodes))
    with contextlib.suppress(ConfigError):
        cfg = base.replace(nodes_to_exclude=tuple({*base.nodes_to_exclude, *nodes}))
        unnamed = sorted({u for s in sentinels for u in s.unnamed})
        note = str(lookup(base.target).float_fallback_note())
        if unnamed:
            note = "; ".join(x for x in (note, f"{len(unnamed)} unnamed node(s) stay quantized") if x)
        out.append(
            Remedy(RemedyKind.FLOAT_FALLBACK, f"{len(nodes)} mask-path node(s) kept in float", cfg,
                   tuple(dict.fromkeys(s.join_output for s in sentinels)), note)
        )  # fmt: skip
    return out


def _evaluate_rewritten(session: Any, r: Remedy, name: str) -> Any:
    """A remedy carrying a rewritten float model: calibrate and quantize that model, debug it against the session's
    float model (one more calibration pass: the rewrite changes the ranges on its path)."""
    from qdebug.io import atomic_save_model
    from qdebug.quantizer import quantize

    assert r.float_model is not None
    path = session.workdir / f"{name}.float.onnx"
    atomic_save_model(r.float_model, path)
    q = quantize(path, session.data, r.config, session.workdir / f"{name}.qdq.onnx", check=False)
    return session._debug(q.model_path, name)


def measure_remedies(session: Any, remedies: Sequence[Remedy]) -> tuple[RemedyResult, ...]:
    """Quantize each remedy from the cached calibration ranges (a rewritten float model: calibrated afresh), debug
    it, and compare with the base."""
    base_db = session.base.output_sqnr_db
    out = []
    for i, r in enumerate(remedies):
        t0 = time.perf_counter()
        try:
            name = f"remedy{i}_{r.kind}"
            ev = (
                session.evaluate(r.config, name=name)
                if r.float_model is None
                else _evaluate_rewritten(session, r, name)
            )
        except QDebugError as exc:
            out.append(RemedyResult(r, None, None, round(time.perf_counter() - t0, 3), str(exc)))
            continue
        db = ev.min_output_sqnr_db if r.float_model is not None else ev.output_sqnr_db
        gain = None if db is None or base_db is None else db - base_db
        out.append(RemedyResult(r, db, gain, round(time.perf_counter() - t0, 3)))
    return tuple(out)


def remedy_overrides(result: RemedyResult, session: Any) -> Any:
    """The measured remedy as the :class:`~qdebug.mixed.overrides.OverridesFile` ``qdebug quantize --overrides``
    consumes: the remedy's config as ``base_config``, its tensor overrides (ORT's fixer applied) checked against the
    float model."""
    from qdebug.mixed.overrides import OverridesFile, check_against_model
    from qdebug.mixed.promote import fix_overrides, overrides_from_ort

    if not result.recommended:
        raise ConfigError(f"remedy {result.remedy.kind} was not measured better than the base; not recommended")
    if result.remedy.float_model is not None:
        raise ConfigError(
            f"remedy {result.remedy.kind} rewrites the float model, which overrides cannot express: apply "
            "qdebug.sentinel.clamp_sentinels to the float model, then quantize it"
        )
    cfg = result.remedy.config
    overrides = cfg.tensor_overrides
    if overrides:
        from qdebug.ort_view import quantizer_view

        types = [cfg.activation_type, *{e.quant_type for _, es in overrides for e in es if e.quant_type}]
        model = quantizer_view(session.float_proto, cfg.weight_type, types, cfg.ort_overrides()) or session.float_proto
        overrides = overrides_from_ort(
            fix_overrides(model, cfg.ort_overrides(), cfg.activation_type, cfg.activation_symmetric)
        )
    sha, fixes = session.overrides_origin()  # a session on the target-fixed model says so in the file
    ofile = OverridesFile.from_config(
        cfg.replace(tensor_overrides=overrides),
        model_sha256=sha,
        requested=result.remedy.tensors,
        note=f"qdebug remedy {result.remedy.kind}: {result.remedy.description} (+{result.gain_db:.2f} dB measured)"
        + (f"; {result.remedy.note}" if result.remedy.note else ""),
        target_fixes=fixes,
    )
    check_against_model(ofile, session.float_proto, sha)
    return ofile


__all__ = [
    "Remedy",
    "RemedyKind",
    "RemedyResult",
    "measure_remedies",
    "method_ranges",
    "propose_remedies",
    "remedy_overrides",
    "sentinel_remedies",
]
