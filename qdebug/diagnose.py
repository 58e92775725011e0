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
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from qdebug.data import DataSource, open_data
from qdebug.errors import InputFileError
from qdebug.graph_index import GraphIndex
from qdebug.io import atomic_write_text
from qdebug.model_io import input_specs
from qdebug.ort import expose_outputs, make_session
from qdebug.qdq_values import qdq_parameter_issues
from qdebug.report import ActivationResult, DebugReport, WeightResult, decode_number, encode_number
from qdebug.sentinel import MaskedSqnr, Sentinel, clamp_value, find_sentinels, masked_sqnr

if TYPE_CHECKING:
    import pandas as pd

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

DIAGNOSTICS_SCHEMA_VERSION = 1

#: Integer range of each quantization type.
QRANGE = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767)}
#: Ops whose outputs live on a few decades near zero (Softmax, Sigmoid) or that divide by a small statistic
#: (LayerNorm and its decomposed Pow/Sqrt/Reciprocal): 8 bits there is a known cliff (docs/diagnostics.md).
CLIFF_OPS = frozenset(
    {"Softmax", "LogSoftmax", "LayerNormalization", "Sigmoid", "HardSigmoid", "Pow", "Sqrt", "Reciprocal"}
)
#: Ops whose inputs meet on one output grid (Concat: side by side; Add/Sum: an integer kernel rescales each input
#: to the output's scale). Sub is left out: LayerNorm's ``x - mean(x)`` has a tiny mean by construction.
JOIN_OPS = frozenset({"Concat", "Add", "Sum"})
WEIGHT_OPS = {"Conv": 0, "ConvTranspose": 1, "Gemm": 0, "MatMul": -1}  # op → output-channel axis of the weight


class DiagnosticKind(StrEnum):
    """What is wrong (one value per check; docs/diagnostics.md has an example model for each)."""

    OUTLIER_RANGE = "outlier_range"
    NEGATIVE_UNSIGNED = "negative_unsigned"
    WASTED_RANGE = "wasted_range"
    SCALE_MISMATCH = "scale_mismatch"
    PER_CHANNEL_WEIGHT = "per_channel_weight"
    SATURATION = "saturation"
    PRECISION_CLIFF = "precision_cliff"
    BAD_QPARAMS = "bad_qparams"
    SENTINEL = "sentinel"


class Severity(StrEnum):
    """How much it matters: ``error`` (the numbers are meaningless), ``warning`` (costs accuracy), ``info``."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class RemedyKind(StrEnum):
    """The fix to try. ``promote_16bit`` and ``per_channel`` are ``TensorQuantOverrides`` the mixed-precision engine
    applies and measures (:func:`qdebug.mixed.promote.promote`, the app's Promote button, ``qdebug quantize
    --overrides``); the others change the whole quantization (``qdebug quantize`` options)."""

    PROMOTE_16BIT = "promote_16bit"
    PER_CHANNEL = "per_channel"
    PERCENTILE_CALIBRATION = "percentile_calibration"
    FIX_QPARAMS = "fix_qparams"
    #: rewrite a sentinel mask constant to a finite value Softmax maps identically
    #: (:func:`qdebug.sentinel.clamp_sentinels`)
    SENTINEL_CLAMP = "sentinel_clamp"
    #: keep ``nodes`` in float (ORT's ``nodes_to_exclude``, ``QuantConfig.nodes_to_exclude``)
    FLOAT_FALLBACK = "float_fallback"


@dataclass(frozen=True)
class Remedy:
    """A fix for one diagnostic: what to do, to which tensors, and the overrides entry that does it."""

    kind: RemedyKind
    tensors: tuple[str, ...]
    text: str
    #: node names the remedy keeps in float (``float_fallback``)
    nodes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``nodes`` only when there are some)."""
        d: dict[str, Any] = {"kind": str(self.kind), "tensors": list(self.tensors), "text": self.text}
        if self.nodes:
            d["nodes"] = list(self.nodes)
        return d

    @classmethod
    def from_dict(cls, r: Mapping[str, Any]) -> Remedy:
        """Inverse of :meth:`to_dict`."""
        return cls(
            RemedyKind(r["kind"]), tuple(r.get("tensors", ())), str(r.get("text", "")), tuple(r.get("nodes", ()))
        )

    def overrides(self) -> dict[str, list[dict[str, Any]]]:
        """The ``TensorQuantOverrides`` (JSON form, docs/overrides.md) applying this remedy; ``{}`` for a remedy
        that is not a per-tensor override."""
        if self.kind is RemedyKind.PROMOTE_16BIT:
            return {t: [{"quant_type": "QUInt16"}] for t in self.tensors}
        if self.kind is RemedyKind.PER_CHANNEL:
            return {t: [{"axis": 0}] for t in self.tensors}
        return {}


@dataclass(frozen=True)
class Diagnostic:
    """One finding: the tensor, what is wrong, the evidence (a sentence and its numbers) and the remedy."""

    kind: DiagnosticKind
    severity: Severity
    tensor: str
    op: str
    evidence: str
    remedy: Remedy
    values: Mapping[str, float | None] = field(default_factory=dict)
    #: other remedies for the same cause (a sentinel: keeping its path in float beside the clamp)
    alternatives: tuple[Remedy, ...] = ()

    @property
    def remedies(self) -> tuple[Remedy, ...]:
        """The remedy, then the alternatives: what ``qdebug diagnose --measure`` measures."""
        return (self.remedy, *self.alternatives)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``alternatives`` only when there are some)."""
        d: dict[str, Any] = {
            "kind": str(self.kind),
            "severity": str(self.severity),
            "tensor": self.tensor,
            "op": self.op,
            "evidence": self.evidence,
            "remedy": self.remedy.to_dict(),
            "values": {k: encode_number(v) for k, v in self.values.items()},
        }
        if self.alternatives:
            d["alternatives"] = [r.to_dict() for r in self.alternatives]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Diagnostic:
        """Inverse of :meth:`to_dict`."""
        return cls(
            kind=DiagnosticKind(d["kind"]),
            severity=Severity(d["severity"]),
            tensor=str(d["tensor"]),
            op=str(d.get("op", "")),
            evidence=str(d["evidence"]),
            remedy=Remedy.from_dict(d["remedy"]),
            values={k: decode_number(v) for k, v in d.get("values", {}).items()},
            alternatives=tuple(Remedy.from_dict(r) for r in d.get("alternatives", ())),
        )


_SEVERITY_ORDER = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}


@dataclass(frozen=True)
class Diagnostics:
    """Every diagnostic of one model pair, most severe first; ``stats_samples`` says how many samples the
    per-tensor statistics saw (0: report and constants only — the checks that need statistics did not run)."""

    items: tuple[Diagnostic, ...]
    stats_samples: int = 0
    checks: tuple[DiagnosticKind, ...] = ()

    def __len__(self) -> int:
        return len(self.items)

    def of_kind(self, kind: DiagnosticKind | str) -> tuple[Diagnostic, ...]:
        """The diagnostics of one kind."""
        k = DiagnosticKind(kind)
        return tuple(d for d in self.items if d.kind is k)

    def for_tensor(self, name: str) -> tuple[Diagnostic, ...]:
        """The diagnostics naming ``name``."""
        return tuple(d for d in self.items if d.tensor == name)

    def overrides(self) -> dict[str, list[dict[str, Any]]]:
        """The union of every remedy's ``TensorQuantOverrides`` (a tensor keeps its first entry)."""
        out: dict[str, list[dict[str, Any]]] = {}
        for d in self.items:
            for t, e in d.remedy.overrides().items():
                out.setdefault(t, e)
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``schema_version``."""
        return {
            "schema_version": DIAGNOSTICS_SCHEMA_VERSION,
            "stats_samples": self.stats_samples,
            "checks": [str(c) for c in self.checks],
            "items": [d.to_dict() for d in self.items],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Diagnostics:
        """Inverse of :meth:`to_dict`; refuses other schema versions."""
        if d.get("schema_version") != DIAGNOSTICS_SCHEMA_VERSION:
            raise InputFileError(f"diagnostics schema_version {d.get('schema_version')!r} is not supported")
        return cls(
            items=tuple(Diagnostic.from_dict(x) for x in d.get("items", ())),
            stats_samples=int(d.get("stats_samples", 0)),
            checks=tuple(DiagnosticKind(c) for c in d.get("checks", ())),
        )

    def to_json(self, indent: int | None = 2) -> str:
        """Strict JSON text."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def save(self, path: str | Path) -> Path:
        """Write as JSON, atomically."""
        return atomic_write_text(path, self.to_json())

    def to_dataframe(self) -> pd.DataFrame:
        """One row per diagnostic: severity, kind, tensor, op, evidence, remedy, remedy_tensors, then the values."""
        import pandas as pd

        rows = [
            {
                "severity": str(d.severity), "kind": str(d.kind), "tensor": d.tensor, "op": d.op,
                "evidence": d.evidence, "remedy": str(d.remedy.kind), "remedy_tensors": ", ".join(d.remedy.tensors),
                **{f"value.{k}": v for k, v in d.values.items()},
            }
            for d in self.items
        ]  # fmt: skip
        return pd.DataFrame(rows, columns=None if rows else ["severity", "kind", "tensor", "op", "evidence", "remedy"])


@dataclass(frozen=True)
class Thresholds:
    """When each check fires (docs/diagnostics.md explains each number)."""

    #: max |x| / 99.99th percentile of |x| above this: the range is set by a few outliers
    outlier_ratio: float = 8.0
    #: fraction of values outside the grid (clipped) above this: saturation
    saturation: float = 1e-3
    #: fraction of the representable range the data leaves unused above this (as bits: log2(1/used) ≥ 1)
    wasted_fraction: float = 0.5
    #: ratio of the largest to the smallest input grid range (scale × steps: the scale, across types) above this
    scale_ratio: float = 16.0
    #: ratio of the largest to the smallest nonzero output-channel |w| max of a per-tensor weight above this
    channel_ratio: float = 100.0
    #: local SQNR (dB) below which a Softmax/LayerNorm/Sigmoid at 8 bits is a precision cliff
    cliff_local_db: float = 30.0
    #: fraction of nonzero values a cliff op's grid flushes to zero above this
    flush_fraction: float = 0.5


# ---------------------------------------------------------------------------------------------- statistics
#: |x| histogram: the top 10 bits of a float32's magnitude, i.e. its 8-bit exponent and 2 mantissa bits — 4 linear
#: bins per octave over the whole float32 range (bins 0-3: zero and subnormals), read straight from the bits.
BINS_PER_OCTAVE = 4
N_BINS = 256 * BINS_PER_OCTAVE
_SHIFT = 23 - 2  # float32: 23 mantissa bits, keep 2


@dataclass
class TensorStats:
    """Mergeable per-tensor statistics of the float model's values (a few hundred numbers per tensor, whatever
    the number of samples): counts, a fixed-bin ``|x|`` histogram (4 bins per octave, :data:`N_BINS`), and
    against the tensor's grid (when it has one) the values clipped below / above it and those it flushes to zero."""

    count: int = 0
    negative: int = 0
    abs_max: float = 0.0
    hist: np.ndarray = field(default_factory=lambda: np.zeros(N_BINS, dtype=np.int64))
    clipped_low: int = 0
    clipped_high: int = 0
    flushed: int = 0

    def update(self, x: np.ndarray, grid: tuple[float, float, float] | None) -> None:
        """Add one sample's values; ``grid`` is ``(lowest, highest, step)`` of the tensor's quantization."""
        v = np.ascontiguousarray(x, dtype=np.float32).ravel()
        if not np.isfinite(v).all():
            v = v[np.isfinite(v)]
        a = np.abs(v)
        # The histogram bin of |x| is its float32 bit pattern shifted (exponent and 2 mantissa bits): no log.
        self.hist += np.bincount(a.view(np.int32) >> _SHIFT, minlength=N_BINS)[:N_BINS]
        self.count += v.size
        self.negative += int(np.count_nonzero(v < 0))
        if a.size:
            self.abs_max = max(self.abs_max, float(a.max()))
        if grid is not None:
            lo, hi, step = grid
            # A grid reaching past float32 (a −FLT_MAX mask's) clips no finite value; compared as float32 it would
            # overflow.
            self.clipped_low += int(np.count_nonzero(v < max(lo - step / 2, -_FLT_MAX)))
            self.clipped_high += int(np.count_nonzero(v > min(hi + step / 2, _FLT_MAX)))
            self.flushed += int(np.count_nonzero(a < step / 2))

    @property
    def zeros(self) -> int:
        """Values that are 0 (or float32 subnormals)."""
        return int(self.hist[:BINS_PER_OCTAVE].sum())

    @property
    def nonzero_flushed(self) -> int:
        """Nonzero values the grid rounds to 0."""
        return max(0, self.flushed - self.zeros)

    def merge(self, other: TensorStats) -> TensorStats:
        """The statistics of both sample sets (exact: every field is a count, a sum or a max)."""
        return TensorStats(
            self.count + other.count, self.negative + other.negative,
            max(self.abs_max, other.abs_max), self.hist + other.hist, self.clipped_low + other.clipped_low,
            self.clipped_high + other.clipped_high, self.flushed + other.flushed,
        )  # fmt: skip

    def abs_percentile(self, q: float) -> float:
        """The ``q``-th percentile (0–100) of ``|x|``, to a quarter octave (the upper edge of its bin)."""
        if self.count == 0:
            return 0.0
        k = int(np.searchsorted(np.cumsum(self.hist), q / 100.0 * self.count))
        if k < BINS_PER_OCTAVE:  # zero (or subnormal)
            return 0.0
        octave, j = divmod(k, BINS_PER_OCTAVE)
        upper = 2.0 ** (octave - 127) * (1 + (j + 1) / BINS_PER_OCTAVE)  # bin k: [2^o (1 + j/4), 2^o (1 + (j+1)/4))
        return float(min(upper, self.abs_max))


_FLT_MAX = float(np.finfo(np.float32).max)


def _bits(quant_type: str | None) -> int:
    return 16 if (quant_type or "").endswith("16") else 8


def _grid(a: ActivationResult) -> tuple[float, float, float] | None:
    if not a.quantized or a.scale is None or a.zero_point is None or a.quant_type not in QRANGE:
        return None
    if not (math.isfinite(a.scale) and a.scale > 0):
        return None
    qmin, qmax = QRANGE[a.quant_type]
    return (qmin - a.zero_point) * a.scale, (qmax - a.zero_point) * a.scale, a.scale


def collect_stats(
    float_model: onnx.ModelProto,
    report: DebugReport,
    data: Any = None,
    *,
    max_samples: int = 8,
    providers: Sequence[str] = ("CPUExecutionProvider",),
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    synthetic: Mapping[str, Any] | None = None,
) -> tuple[dict[str, TensorStats], int]:
    """:class:`TensorStats` of every activation of ``report`` over the first ``max_samples`` samples of ``data``
    (a data spec as :func:`qdebug.debugger` takes; ``None``: synthetic), one sample in memory at a time.

    ``synthetic`` passes ``seed`` / ``distribution`` / ``ignore`` to :func:`qdebug.data.open_data` (the same samples
    as the debug run). Returns ``({tensor: stats}, samples seen)``.
    """
    acts = [a for a in report.activations]
    names = [a.tensor_name for a in acts]
    sess: Any = make_session(expose_outputs(float_model, names), providers, role="float model")
    fetched = {o.name for o in sess.get_outputs()}
    acts = [a for a in acts if a.tensor_name in fetched]
    grids = {a.tensor_name: _grid(a) for a in acts}
    stats = {a.tensor_name: TensorStats() for a in acts}
    source: DataSource = open_data(
        data, input_specs(float_model), num_samples=max_samples, input_shapes=input_shapes, **(synthetic or {})
    )
    seen = 0
    wanted = list(stats)
    for sample in source:
        if seen >= max_samples:
            break
        feed = {k: v for k, v in sample.items() if k in {i.name for i in sess.get_inputs()}}
        for name, value in zip(wanted, sess.run(wanted, feed), strict=True):
            stats[name].update(value, grids[name])
        seen += 1
    return stats, seen


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
    grid = _grid(a)
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
    grid = _grid(a)
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
        if a is None or not a.quantized or _grid(a) is None:
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
    items.sort(key=lambda d: (_SEVERITY_ORDER[d.severity], topo.get(d.tensor, 1 << 30)))
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
