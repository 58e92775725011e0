"""Typed results of a debug run, with JSON (``schema_version``) and pandas views.

``DebugReport.to_dict()`` has the shape::

    {"schema_version": 4,
     "activations":   [{"tensor_name", "local_sqnr_db", "cumulative_sqnr_db", ...}],
     "weights":       [{"weight_name", "weight_sqnr_db", ...}],
     "model_outputs": [{"output_name", "cumulative_sqnr_db", ...}],
     "summary": {"local"|"cumulative"|"weight"|"output": {"count", "mean", "std", "min", "max", ...}},
     "per_sample": {...}, "meta": {...},
     "task": null | {"metric", "value", "samples", "per_output", ...}}

+inf (identical tensors) is written as the string ``"inf"``; undefined values as ``null`` with the reason
in the matching ``*_status`` field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from qdebug.errors import InputFileError
from qdebug.io import atomic_write_text, parse_json, read_input_text
from qdebug.metrics import SqnrStatus, Summary
from qdebug.task_score import TaskScore

if TYPE_CHECKING:
    import pandas as pd

#: 2: per-result ``metrics`` and ``meta.capture`` (version-1 reports, which have neither, are still read).
#: 3: the target check's per-tensor divergence (excess-noise ratio, starts, op types; docs/qnn.md)
#: 4: the task metric's score (``task``: docs/metrics.md, "Task metrics"; ``null`` in older reports)
SCHEMA_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)
T = TypeVar("T")


def encode_number(v: float | None) -> float | str | None:
    """JSON-safe number: +inf/-inf as strings, NaN as null."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def decode_number(v: Any) -> float | None:
    """Inverse of :func:`encode_number`."""
    if v is None:
        return None
    if v == "inf":
        return math.inf
    if v == "-inf":
        return -math.inf
    return float(v)


_FLOAT_FIELDS = {
    "target_vs_float_db", "cpu_vs_float_db", "target_vs_cpu_db", "sqnr_db",
    "local_sqnr_db", "cumulative_sqnr_db", "weight_sqnr_db", "worst_channel_sqnr_db", "float_min",
    "float_max", "mse", "max_abs_error", "scale", "mean", "std", "min", "max", "excess_noise_ratio",
    "sqnr_drop_db",
}  # fmt: skip


_STATUS_FIELDS = {"local_status", "cumulative_status", "weight_status"}


def _to_dict(obj: Any) -> dict[str, Any]:
    d: dict[str, Any] = {k: encode_number(v) if k in _FLOAT_FIELDS else v for k, v in asdict(obj).items()}
    if "metrics" in d:
        d["metrics"] = {n: encode_number(v) for n, v in d["metrics"].items()}
    return {k: str(v) if k in _STATUS_FIELDS else v for k, v in d.items()}


def _from_dict(cls: type[T], d: dict[str, Any]) -> T:
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    kw: dict[str, Any] = {k: (decode_number(v) if k in _FLOAT_FIELDS else v) for k, v in d.items() if k in names}
    for k, v in list(kw.items()):
        if isinstance(v, list):
            kw[k] = tuple(v)
        elif k in _STATUS_FIELDS:
            kw[k] = SqnrStatus(v)
        elif k == "metrics":
            kw[k] = {n: decode_number(x) for n, x in v.items()}
    return cls(**kw)


class SqnrKind(StrEnum):
    """Which SQNR :meth:`DebugReport.worst` ranks: an activation's own rounding, the damage so far, a weight."""

    LOCAL = "local"
    CUMULATIVE = "cumulative"
    WEIGHT = "weight"


def _flat(row: dict[str, Any]) -> dict[str, Any]:
    """A result row for a DataFrame: ``metrics`` spread into ``metric.<name>`` columns, statuses as text."""
    metrics = row.pop("metrics", {}) or {}
    row = {k: str(v) if k in _STATUS_FIELDS else v for k, v in row.items()}
    return {**row, **{f"metric.{n}": v for n, v in metrics.items()}}


@dataclass(frozen=True)
class ActivationResult:
    """SQNR of one activation tensor (local: its own Q/DQ rounding; cumulative: vs the float model)."""

    tensor_name: str
    producer_op: str
    producer_node: str
    topo_index: int
    quantized: bool
    quant_type: str | None
    scale: float | None
    zero_point: int | None
    local_sqnr_db: float | None
    local_status: SqnrStatus
    cumulative_sqnr_db: float | None
    cumulative_status: SqnrStatus
    mse: float | None = None
    max_abs_error: float | None = None
    float_min: float | None = None
    float_max: float | None = None
    elements: int = 0
    nonfinite_float: int = 0
    nonfinite_quant: int = 0
    worst_sample: int | None = None
    converted_to: tuple[str, ...] = ()
    fused_activation: str | None = None
    measured_through: str | None = None
    inputs: tuple[str, ...] = ()
    #: every streaming metric (:data:`qdebug.metrics.STREAMING_METRICS`) of the cumulative pair
    metrics: Mapping[str, float | None] = field(default_factory=dict)

    @property
    def flagged(self) -> bool:
        """True when a tensor held NaN/Inf in either model."""
        return bool(self.nonfinite_float or self.nonfinite_quant)


@dataclass(frozen=True)
class WeightResult:
    """SQNR of one quantized weight or bias against the float model's value."""

    weight_name: str
    consumer_node: str
    consumer_op: str
    kind: str
    quant_type: str
    channels: int
    weight_sqnr_db: float | None
    weight_status: SqnrStatus
    worst_channel_sqnr_db: float | None = None
    max_abs_error: float | None = None
    elements: int = 0
    shape: tuple[int, ...] = ()
    #: every whole-tensor metric (:data:`qdebug.metrics.METRICS`) of the weight
    metrics: Mapping[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True)
class OutputResult:
    """SQNR of one model output, quantized vs float, over all samples."""

    output_name: str
    cumulative_sqnr_db: float | None
    cumulative_status: SqnrStatus
    mse: float | None = None
    max_abs_error: float | None = None
    worst_sample: int | None = None
    nonfinite_float: int = 0
    nonfinite_quant: int = 0
    #: every streaming metric (:data:`qdebug.metrics.STREAMING_METRICS`) of the output pair
    metrics: Mapping[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True)
class PerSample:
    """Per-sample cumulative SQNR: a samples × tensors matrix (NaN where undefined, +inf if identical)."""

    tensor_names: tuple[str, ...]
    values: np.ndarray  # shape (samples, tensors), float64

    def to_dict(self) -> dict[str, Any]:
        """JSON form (rows of encoded numbers)."""
        return {
            "tensor_names": list(self.tensor_names),
            "values": [[encode_number(float(v)) for v in row] for row in self.values],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PerSample:
        """Inverse of :meth:`to_dict`."""
        names = tuple(d.get("tensor_names", ()))
        rows = [[math.nan if (x := decode_number(v)) is None else x for v in row] for row in d.get("values", [])]
        arr = np.array(rows, dtype=np.float64).reshape(len(rows), len(names))
        return cls(names, arr)

    def to_dataframe(self) -> pd.DataFrame:
        """Samples as rows, tensors as columns."""
        import pandas as pd

        return pd.DataFrame(self.values, columns=list(self.tensor_names)).rename_axis("sample")


@dataclass(frozen=True)
class Summaries:
    """Summary of each SQNR kind."""

    local: Summary
    cumulative: Summary
    weight: Summary
    output: Summary


@dataclass(frozen=True)
class CaptureInfo:
    """Which capture backend produced the sums, and every sample it had to hand to another backend.

    ``requested`` is what the options asked for (e.g. ``"auto"``, ``"graph"``, ``"numpy"``); ``backend`` is the
    one that ran; ``reason`` says why it was chosen or why the requested one could not run at all;
    ``fallback_samples`` counts samples redone by the fallback backend, ``fallback_reasons`` groups them as
    ``(reason, count)`` pairs. ``batch`` is the most samples one inference call took (``--batch``), and
    ``batch_reason`` says why batching stopped or never started when it was asked for. ``segments`` is how many
    consecutive parts each sample ran in (one sample's tensors would not fit at once) and ``segment_note`` how each
    sample was fetched: why it was segmented (or could not be), how many post-Q/DQ tensors were computed from
    the quantized integers instead of fetched, and how many nodes and activations of constants alone were computed
    and reduced once for the whole run instead of every sample (:mod:`qdebug.capture.constants`).
    """

    requested: str
    backend: str
    reason: str | None = None
    fallback_backend: str | None = None
    fallback_samples: int = 0
    fallback_reasons: tuple[tuple[str, int], ...] = ()
    batch: int = 1
    batch_reason: str | None = None
    segments: int = 1
    segment_note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        d = asdict(self)
        d["fallback_reasons"] = [list(r) for r in self.fallback_reasons]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CaptureInfo:
        """Inverse of :meth:`to_dict`."""
        kw = dict(d)
        kw["fallback_reasons"] = tuple((str(r), int(n)) for r, n in kw.get("fallback_reasons", ()))
        return cls(**kw)


@dataclass(frozen=True)
class ReportMeta:
    """Where a report came from (``capture``: how the tensors were captured; ``None`` in reports before it)."""

    float_model: str
    quant_model: str
    float_sha256: str
    quant_sha256: str
    num_samples: int
    data: str
    qdebug_version: str
    onnxruntime_version: str
    seconds: float
    unmatched_float_tensors: int = 0
    warnings: tuple[str, ...] = field(default_factory=tuple)
    capture: CaptureInfo | None = None


@dataclass(frozen=True)
class TargetOutputAccuracy:
    """One model output on a target (e.g. the HTP simulator) against float and against CPU-QDQ."""

    output_name: str
    target_vs_float_db: float | None
    cpu_vs_float_db: float | None
    target_vs_cpu_db: float | None


@dataclass(frozen=True)
class TargetTensorDiff:
    """One quantized activation on a target vs ONNX Runtime CPU: in steps of its grid (LSB, for information) and
    in units of its own quantization error (``excess_noise_ratio``, what ``flagged`` is decided on).

    ``excess_noise_ratio`` = (Σ(target − float)² − Σ(CPU − float)²) / max(Σ(CPU − float)², Σ scale²/12)
    (qdebug.targets.divergence); ``sqnr_drop_db`` = 10·log10(1 + ratio), the SQNR vs float lost on the target;
    ``cpu_vs_float_db`` the CPU-QDQ model's cumulative SQNR there (the debug report's), ``target_vs_float_db``
    the target's. Reports written before
    schema 3 have only the LSB figures (the new fields read as ``None`` / ``False`` / ``""``).
    """

    tensor_name: str
    topo_index: int
    quant_type: str
    max_lsb: int
    fraction_differ: float
    sqnr_db: float | None  # dequantized target vs dequantized CPU-QDQ
    op_type: str = ""  # the float model's op producing the tensor
    cpu_vs_float_db: float | None = None
    target_vs_float_db: float | None = None
    excess_noise_ratio: float | None = None
    sqnr_drop_db: float | None = None
    flagged: bool = False


#: How ``TargetAccuracy.first_divergent`` was decided: ``excess_noise`` (schema 3) or ``lsb`` (older reports:
#: the first tensor more than ``lsb_threshold`` LSB from ORT CPU).
DIVERGENCE_RULES = ("excess_noise", "lsb")


@dataclass(frozen=True)
class TargetAccuracy:
    """How a compiled model's numbers differ from the CPU QDQ model's, per output and per tensor.

    ``first_divergent`` is the first *start* in topological order that is not isolated: a flagged tensor
    (``excess_noise_ratio > excess_threshold``) none of whose nearest compared inputs is flagged;
    ``divergence_starts`` lists every start, ``isolated_starts`` those whose compared consumers are all
    unflagged, ``divergence_ops`` the op types of the nodes computing the flagged tensors (most first).
    ``lsb_threshold`` only counts tensors for information (``divergence_rule`` ``"lsb"``: an old report, where
    it decided).
    """

    target: str
    device: str
    num_samples: int
    seconds_per_sample: float
    outputs: tuple[TargetOutputAccuracy, ...]
    tensors: tuple[TargetTensorDiff, ...] = ()
    lsb_threshold: int = 1
    first_divergent: str | None = None
    probe_single_partition: bool | None = None
    notes: tuple[str, ...] = ()
    divergence_rule: str = "excess_noise"
    excess_threshold: float = 1.0
    divergence_starts: tuple[str, ...] = ()
    #: starts with compared consumers, none of them flagged (error absorbed, or a probe artefact); not named first
    isolated_starts: tuple[str, ...] = ()
    divergence_ops: tuple[tuple[str, int], ...] = ()
    #: (op type, node name) of the float model's nodes computing ``first_divergent`` from its compared inputs
    first_divergent_nodes: tuple[tuple[str, str], ...] = ()
    #: how far the probe's model outputs were from the compiled model's (0: the probe did not change the graph's
    #: numbers; ``None``: no probe ran)
    probe_vs_compiled: float | None = None

    @property
    def flagged(self) -> tuple[TargetTensorDiff, ...]:
        """The tensors the rule flags (topological order)."""
        if self.divergence_rule == "lsb":
            return tuple(t for t in self.tensors if t.max_lsb > self.lsb_threshold)
        return tuple(t for t in self.tensors if t.flagged)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            **{k: getattr(self, k) for k in ("target", "device", "num_samples", "seconds_per_sample")},
            "outputs": [_to_dict(o) for o in self.outputs],
            "tensors": [_to_dict(t) for t in self.tensors],
            "lsb_threshold": self.lsb_threshold,
            "first_divergent": self.first_divergent,
            "probe_single_partition": self.probe_single_partition,
            "notes": list(self.notes),
            "divergence_rule": self.divergence_rule,
            "excess_threshold": self.excess_threshold,
            "divergence_starts": list(self.divergence_starts),
            "isolated_starts": list(self.isolated_starts),
            "divergence_ops": [{"op_type": op, "nodes": n} for op, n in self.divergence_ops],
            "first_divergent_nodes": [{"op_type": op, "node": n} for op, n in self.first_divergent_nodes],
            "probe_vs_compiled": self.probe_vs_compiled,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TargetAccuracy:
        """Inverse of :meth:`to_dict`; JSON without ``divergence_rule`` (before schema 3) read as the LSB rule."""
        return cls(
            target=d["target"],
            device=d["device"],
            num_samples=d["num_samples"],
            seconds_per_sample=d["seconds_per_sample"],
            outputs=tuple(_from_dict(TargetOutputAccuracy, o) for o in d.get("outputs", ())),
            tensors=tuple(_from_dict(TargetTensorDiff, t) for t in d.get("tensors", ())),
            lsb_threshold=d.get("lsb_threshold", 1),
            first_divergent=d.get("first_divergent"),
            probe_single_partition=d.get("probe_single_partition"),
            notes=tuple(d.get("notes", ())),
            divergence_rule=d.get("divergence_rule", "lsb"),
            excess_threshold=float(d.get("excess_threshold", 1.0)),
            divergence_starts=tuple(d.get("divergence_starts", ())),
            isolated_starts=tuple(d.get("isolated_starts", ())),
            divergence_ops=tuple((o["op_type"], int(o["nodes"])) for o in d.get("divergence_ops", ())),
            first_divergent_nodes=tuple((o["op_type"], o["node"]) for o in d.get("first_divergent_nodes", ())),
            probe_vs_compiled=d.get("probe_vs_compiled"),
        )


@dataclass(frozen=True)
class DebugReport:
    """The result of :func:`qdebug.debugger`."""

    activations: tuple[ActivationResult, ...]
    weights: tuple[WeightResult, ...]
    model_outputs: tuple[OutputResult, ...]
    summary: Summaries
    per_sample: PerSample
    per_sample_outputs: PerSample
    meta: ReportMeta
    target_accuracy: TargetAccuracy | None = None
    #: the task metric's score against the float model (``debug(..., metric=...)``); ``None``: none was asked
    task: TaskScore | None = None

    def with_target_accuracy(self, acc: TargetAccuracy) -> DebugReport:
        """A copy carrying a target's accuracy (e.g. the HTP simulator's), for the views."""
        from dataclasses import replace

        return replace(self, target_accuracy=acc)

    # ----------------------------------------------------------------- lookups
    def activation(self, name: str) -> ActivationResult:
        """The result for one activation tensor (KeyError if absent)."""
        for a in self.activations:
            if a.tensor_name == name:
                return a
        raise KeyError(name)

    def output(self, name: str) -> OutputResult:
        """The result for one model output (KeyError if absent)."""
        for o in self.model_outputs:
            if o.output_name == name:
                return o
        raise KeyError(name)

    def worst(self, kind: SqnrKind | str, n: int = 10) -> list[Any]:
        """The ``n`` lowest finite-or-undefined SQNR entries of ``kind`` (:class:`SqnrKind`; its value as text too)."""

        def key(v: float | None) -> tuple[int, float]:
            # Non-finite/undefined first (they need attention), then ascending dB, +inf last.
            return (0, 0.0) if v is None else (1, v)

        try:
            k = SqnrKind(kind)
        except ValueError:
            raise ValueError(f"unknown kind {kind!r}; use local, cumulative or weight") from None
        if k is SqnrKind.LOCAL:
            items = [a for a in self.activations if a.quantized]
            return sorted(items, key=lambda a: key(a.local_sqnr_db))[:n]
        if k is SqnrKind.CUMULATIVE:
            return sorted(self.activations, key=lambda a: key(a.cumulative_sqnr_db))[:n]
        return sorted(self.weights, key=lambda w: key(w.weight_sqnr_db))[:n]

    @property
    def min_output_sqnr_db(self) -> float | None:
        """The lowest model-output SQNR (None if any output is undefined/non-finite)."""
        vals = [o.cumulative_sqnr_db for o in self.model_outputs]
        if not vals or any(v is None for v in vals):
            return None
        return min(v for v in vals if v is not None)

    # ----------------------------------------------------------------- serialisation
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (see the module docstring for the shape)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "activations": [_to_dict(a) for a in self.activations],
            "weights": [_to_dict(w) for w in self.weights],
            "model_outputs": [_to_dict(o) for o in self.model_outputs],
            "summary": {k: _to_dict(getattr(self.summary, k)) for k in ("local", "cumulative", "weight", "output")},
            "per_sample": self.per_sample.to_dict(),
            "per_sample_outputs": self.per_sample_outputs.to_dict(),
            "meta": asdict(self.meta),
            "target_accuracy": None if self.target_accuracy is None else self.target_accuracy.to_dict(),
            "task": None if self.task is None else self.task.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DebugReport:
        """Inverse of :meth:`to_dict`; refuses other schema versions."""
        version = d.get("schema_version")
        if version not in READABLE_VERSIONS:
            raise InputFileError(f"debug report schema_version {version!r} is not supported (need {SCHEMA_VERSION})")
        meta = dict(d["meta"])
        meta["warnings"] = tuple(meta.get("warnings", ()))
        if meta.get("capture") is not None:
            meta["capture"] = CaptureInfo.from_dict(meta["capture"])
        return cls(
            activations=tuple(_from_dict(ActivationResult, a) for a in d["activations"]),
            weights=tuple(_from_dict(WeightResult, w) for w in d["weights"]),
            model_outputs=tuple(_from_dict(OutputResult, o) for o in d["model_outputs"]),
            summary=Summaries(**{k: _from_dict(Summary, v) for k, v in d["summary"].items()}),
            per_sample=PerSample.from_dict(d.get("per_sample", {})),
            per_sample_outputs=PerSample.from_dict(d.get("per_sample_outputs", {})),
            meta=ReportMeta(**meta),
            target_accuracy=None
            if d.get("target_accuracy") is None
            else TargetAccuracy.from_dict(d["target_accuracy"]),
            task=None if d.get("task") is None else TaskScore.from_dict(d["task"]),
        )

    def to_json(self, indent: int | None = 2) -> str:
        """JSON text (strict JSON: no NaN/Infinity literals)."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> DebugReport:
        """Parse JSON text."""
        return cls.from_dict(parse_json(text))

    def save(self, path: str | Path) -> Path:
        """Write the report as JSON, atomically."""
        return atomic_write_text(path, self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> DebugReport:
        """Read a report written by :meth:`save`."""
        text = read_input_text(path, "debug report")  # a regular file, UTF-8
        try:
            return cls.from_json(text)
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise InputFileError(f"{path}: not a qdebug debug report ({exc})") from exc

    def to_dataframe(self) -> pd.DataFrame:
        """One row per activation tensor in topological order (the main table of the views)."""
        import pandas as pd

        return pd.DataFrame([_flat(asdict(a)) for a in self.activations])

    def weights_dataframe(self) -> pd.DataFrame:
        """One row per weight/bias."""
        import pandas as pd

        return pd.DataFrame([_flat(asdict(w)) for w in self.weights])

    def outputs_dataframe(self) -> pd.DataFrame:
        """One row per model output."""
        import pandas as pd

        return pd.DataFrame([_flat(asdict(o)) for o in self.model_outputs])
