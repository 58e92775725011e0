"""What a diagnosis finds, as records: a :class:`Diagnostic` (the tensor, its kind and severity, the evidence, the
:class:`Remedy` to try and an alternative), the :class:`Diagnostics` of a run (filters, the overrides of every
remedy, JSON and a DataFrame), and the :class:`Thresholds` the checks of :mod:`qdebug.diagnose` compare against.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdebug.errors import InputFileError
from qdebug.io import atomic_write_text
from qdebug.report import decode_number, encode_number

if TYPE_CHECKING:
    import pandas as pd


DIAGNOSTICS_SCHEMA_VERSION = 1


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


#: Severities in the order a list of diagnostics shows them, worst first.
SEVERITY_ORDER = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}


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
