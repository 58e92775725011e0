"""The record of a QNN build's diagnosis (:class:`QnnDiagnosis`: where the HTP diverges, how it was found, what
each remedy measured), as it lands in the manifest under :data:`MANIFEST_KEY`, and its plain-text description.

:mod:`qdebug.targets.qnn_diagnose` fills it in; :mod:`qdebug.targets.qnn_remedies` measures the trials.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from qdebug.errors import QDebugError
from qdebug.report import decode_number, encode_number
from qdebug.targets.htp_numerics import HtpFinding
from qdebug.targets.qnn_bisect import PrefixBisection

__all__ = ["MANIFEST_KEY", "MIN_GAIN_DB", "LocatedBy", "QnnDiagnosis", "Remedies", "RemedyKind", "RemedyTrial"]


MANIFEST_KEY = "qnn_divergence"
DIAGNOSIS_SCHEMA_VERSION = 1
#: A remedy is chosen only when its worst output gains at least this much (HTP vs float, dB).
MIN_GAIN_DB = 1.0


class LocatedBy(StrEnum):
    """Which measurement named the first divergent tensor."""

    BISECTION = "bisection"
    PROBE = "probe"
    NONE = "none"


class RemedyKind(StrEnum):
    """The standard remedies tried on a located region."""

    REGION_16BIT = "region_16bit"
    PER_CHANNEL = "per_channel"
    SOC = "soc"
    FP16_REGION = "fp16_region"
    #: the QDQ model rewritten around a known HTP behaviour (:mod:`qdebug.targets.htp_numerics`), same grids
    HTP_REWRITE = "htp_rewrite"


def _db(v: Any) -> float | None:
    return decode_number(v)


@dataclass(frozen=True)
class RemedyTrial:
    """One remedy compiled and run on the HTP simulator (``ok`` False: it could not be built; ``detail`` says why)."""

    kind: RemedyKind
    label: str
    ok: bool
    partitions: int = 0
    cpu_nodes: int = 0
    target_vs_float_db: float | None = None  # worst model output
    gain_db: float | None = None  # vs the build's compiled model
    seconds: float = 0.0
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "kind": self.kind.value,
            "label": self.label,
            "ok": self.ok,
            "partitions": self.partitions,
            "cpu_nodes": self.cpu_nodes,
            "target_vs_float_db": encode_number(self.target_vs_float_db),
            "gain_db": encode_number(self.gain_db),
            "seconds": round(self.seconds, 3),
            "detail": self.detail,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RemedyTrial:
        """Inverse of :meth:`to_dict`."""
        return cls(
            RemedyKind(d["kind"]),
            d["label"],
            bool(d["ok"]),
            int(d.get("partitions", 0)),
            int(d.get("cpu_nodes", 0)),
            _db(d.get("target_vs_float_db")),
            _db(d.get("gain_db")),
            float(d.get("seconds", 0.0)),
            d.get("detail", ""),
        )


@dataclass(frozen=True)
class Remedies:
    """Every remedy tried on the region, the one chosen (index into ``trials``) and the files written for it."""

    baseline_db: float | None  # the build's compiled model, worst output, HTP vs float
    cpu_vs_float_db: float | None  # the CPU-QDQ model at the same output
    trials: tuple[RemedyTrial, ...]
    skipped: tuple[tuple[RemedyKind, str], ...] = ()
    chosen: int | None = None
    files: Mapping[str, str] = field(default_factory=dict)  # role → file name in the build folder

    @property
    def best(self) -> RemedyTrial | None:
        """The chosen trial, ``None`` when no remedy gained :data:`MIN_GAIN_DB` without adding partitions or CPU
        nodes."""
        return None if self.chosen is None else self.trials[self.chosen]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "baseline_db": encode_number(self.baseline_db),
            "cpu_vs_float_db": encode_number(self.cpu_vs_float_db),
            "min_gain_db": MIN_GAIN_DB,
            "trials": [t.to_dict() for t in self.trials],
            "skipped": [{"kind": k.value, "why": why} for k, why in self.skipped],
            "chosen": self.chosen,
            "files": dict(self.files),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Remedies:
        """Inverse of :meth:`to_dict`."""
        return cls(
            _db(d.get("baseline_db")),
            _db(d.get("cpu_vs_float_db")),
            tuple(RemedyTrial.from_dict(t) for t in d.get("trials", ())),
            tuple((RemedyKind(s["kind"]), s["why"]) for s in d.get("skipped", ())),
            d.get("chosen"),
            dict(d.get("files", {})),
        )


@dataclass(frozen=True)
class QnnDiagnosis:
    """Where the HTP diverges in the real graph, how it was found, and what the remedies measured."""

    located_by: LocatedBy
    first_divergent: str | None
    region_nodes: tuple[tuple[str, str], ...]  # (op type, node name) of the float model, graph order
    region_tensors: tuple[str, ...]  # the region's activations (what a 16-bit promotion covers)
    bisect_reason: str  # why bisection ran or did not
    bisection: PrefixBisection | None = None
    probe_first_divergent: str | None = None
    remedies: Remedies | None = None
    seconds: float = 0.0
    #: the known HTP behaviours present in the QDQ model (:func:`qdebug.targets.htp_numerics.find_behaviours`)
    causes: tuple[HtpFinding, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``schema_version``."""
        return {
            "schema_version": DIAGNOSIS_SCHEMA_VERSION,
            "located_by": self.located_by.value,
            "first_divergent": self.first_divergent,
            "region_nodes": [{"op_type": op, "node": n} for op, n in self.region_nodes],
            "region_tensors": list(self.region_tensors),
            "bisect_reason": self.bisect_reason,
            "bisection": None if self.bisection is None else self.bisection.to_dict(),
            "probe_first_divergent": self.probe_first_divergent,
            "remedies": None if self.remedies is None else self.remedies.to_dict(),
            "seconds": round(self.seconds, 3),
            "causes": [c.to_dict() for c in self.causes],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> QnnDiagnosis:
        """Inverse of :meth:`to_dict`; refuses other schema versions."""
        if d.get("schema_version") != DIAGNOSIS_SCHEMA_VERSION:
            raise QDebugError(f"qnn_divergence schema_version {d.get('schema_version')!r} is not supported")
        return cls(
            LocatedBy(d["located_by"]),
            d.get("first_divergent"),
            tuple((n["op_type"], n["node"]) for n in d.get("region_nodes", ())),
            tuple(d.get("region_tensors", ())),
            d.get("bisect_reason", ""),
            None if d.get("bisection") is None else PrefixBisection.from_dict(d["bisection"]),
            d.get("probe_first_divergent"),
            None if d.get("remedies") is None else Remedies.from_dict(d["remedies"]),
            float(d.get("seconds", 0.0)),
            tuple(HtpFinding.from_dict(c) for c in d.get("causes", ())),
        )

    def describe(self) -> list[str]:
        """What ``qdebug build`` prints about it."""
        return _describe(self)


def _causes(d: QnnDiagnosis) -> list[str]:
    """One line per known behaviour: where (the first few nodes), whether it is the located region, what it is."""
    region = {n for _, n in d.region_nodes} | ({d.first_divergent} if d.first_divergent else set())
    lines = []
    for kind in dict.fromkeys(c.behaviour for c in d.causes):
        these = [c for c in d.causes if c.behaviour is kind]
        here = " (in the divergent region)" if any(c.node in region or c.tensor in region for c in these) else ""
        if len(these) == 1:
            lines.append(f"known HTP behaviour{here}: {these[0].describe()}")
            continue
        where = ", ".join(c.node for c in these[:3]) + (", …" if len(these) > 3 else "")
        lines.append(f"known HTP behaviour{here}: {kind.value} at {len(these)} nodes ({where}): {kind.summary}")
    return lines


def _describe(d: QnnDiagnosis) -> list[str]:
    """Plain lines for the CLI."""
    lines: list[str] = []
    if d.bisection is not None:
        b = d.bisection
        ratio = b.ratio_of(b.first_divergent) if b.first_divergent else None
        what = (
            f"{b.first_divergent} (ratio {ratio:.3g})"
            if b.first_divergent
            else "nothing (the last tensor is within its quantization error)"
        )
        lines.append(
            f"bisection over prefix compiles ({d.bisect_reason}): first divergent {what}; {b.compiles} compile(s) "
            f"for {b.candidates} tensors (bound {b.max_compiles}), {b.seconds:.1f} s; the probe said "
            f"{d.probe_first_divergent or 'nothing'}"
        )
    if d.first_divergent is not None:
        ops = ", ".join(f"{op} {n}" for op, n in d.region_nodes) or "-"
        lines.append(f"divergent region ({d.located_by.value}): {ops}")
    lines += _causes(d)
    r = d.remedies
    if r is None:
        return lines
    base = "-" if r.baseline_db is None else f"{r.baseline_db:.2f} dB"
    cpu = "-" if r.cpu_vs_float_db is None else f"{r.cpu_vs_float_db:.2f} dB"
    lines.append(f"remedies for the region (worst output, HTP vs float; build {base}, CPU-QDQ {cpu}):")
    for k, t in enumerate(r.trials):
        mark = "*" if k == r.chosen else " "
        if t.ok:
            db = "-" if t.target_vs_float_db is None else f"{t.target_vs_float_db:.2f} dB"
            gain = "-" if t.gain_db is None else f"{t.gain_db:+.2f} dB"
            lines.append(
                f" {mark} {t.kind.value:13s} {t.label}: {db} ({gain}), {t.partitions} partition(s), "
                f"{t.cpu_nodes} CPU node(s)"
            )
        else:
            lines.append(f" {mark} {t.kind.value:13s} {t.label}: failed: {t.detail}")
    for kind, why in r.skipped:
        lines.append(f"   {kind.value:13s} not tried: {why}")
    best = r.best
    if best is None:
        lines.append(f"no remedy gained {MIN_GAIN_DB:g} dB without adding partitions or CPU nodes")
    else:
        lines.append(
            f"chosen: {best.kind.value} ({best.label}), {best.partitions} partition(s); "
            f"wrote {', '.join(r.files.values())}"
        )
    return lines
