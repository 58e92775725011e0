"""Measured gains, gathered for display next to the predicted ones (the HTML report's suggestions).

A search (:mod:`qdebug.mixed.search`, ``qdebug search --json``) measures promotion sets — prefixes of a ranking,
greedy steps, candidates promoted alone (its ``sensitivity``) — and, with ``--remedies``, recipe changes
(:mod:`qdebug.mixed.remedies`). :class:`MeasuredGains` is what of that a reader compares with the estimates:

* ``tensors``: per tensor, the worst output's measured gain when it was promoted alone, or as one member of a
  group candidate (a decomposed LayerNorm, an attention core: the group's gain is shown for each member), with the
  estimate it was ranked by;
* ``sets``: every measured promotion set, cheapest first, with its gain over the search's base;
* ``remedies``: every measured remedy with its gain.

Gains are in dB of the worst model output's SQNR, against the search's own base (its quantization and its debug
samples), which need not be the report's: the report says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qdebug.errors import ConfigError
from qdebug.report import decode_number, encode_number

if TYPE_CHECKING:
    import pandas as pd

SCHEMA_VERSION = 1

__all__ = [
    "MIN_MEASURED_GAIN_DB",
    "DiagnosisGain",
    "DiagnosisGains",
    "MeasuredGains",
    "RemedyGain",
    "SetGain",
    "TensorGain",
    "rank_by_measured",
]


def _num(x: Any) -> float | None:
    v = decode_number(x)
    return None if v is None or math.isnan(v) else float(v)


@dataclass(frozen=True)
class TensorGain:
    """One tensor's measured gain: promoted alone, or as a member of ``candidate`` (a group, promoted together)."""

    tensor: str
    candidate: str
    group_size: int
    measured_gain_db: float | None
    predicted_gain_db: float | None


@dataclass(frozen=True)
class SetGain:
    """One measured promotion set: its label in the search, its tensors, the worst output and the gain over base."""

    label: str
    tensors: tuple[str, ...]
    output_sqnr_db: float | None
    gain_db: float | None
    cost_fraction_16bit: float
    chosen: bool


@dataclass(frozen=True)
class RemedyGain:
    """One measured remedy (a recipe change other than a promotion)."""

    kind: str
    description: str
    tensors: tuple[str, ...]
    output_sqnr_db: float | None
    gain_db: float | None
    recommended: bool
    error: str | None = None


@dataclass(frozen=True)
class MeasuredGains:
    """What a search measured, for the report (see the module docstring)."""

    base_output_sqnr_db: float | None
    tensors: tuple[TensorGain, ...] = ()
    sets: tuple[SetGain, ...] = ()
    remedies: tuple[RemedyGain, ...] = ()
    source: str = "qdebug search"
    #: whether the search met its goal, and why it stopped (``None``/"" when not from a search)
    reached: bool | None = None
    stop_reason: str = ""

    def per_tensor(self) -> dict[str, float]:
        """Tensor → measured gain (dB), for the tensors that have one."""
        return {t.tensor: t.measured_gain_db for t in self.tensors if t.measured_gain_db is not None}

    def __bool__(self) -> bool:
        return bool(self.tensors or self.sets or self.remedies)

    @classmethod
    def from_search_dict(cls, doc: Mapping[str, Any]) -> MeasuredGains:
        """From a search result's ``to_dict()`` (what ``qdebug search --json`` prints, with its ``remedies``)."""
        if not isinstance(doc, Mapping) or "steps" not in doc:
            raise ConfigError("not a search result (qdebug search --json): no 'steps'")
        points = _points(doc)
        base = next((p for p in points if not p["promoted"]), None)
        base_db = _num(base["output_sqnr_db"]) if base is not None else None
        sens = doc.get("sensitivity") or {}
        if base_db is None:
            base_db = _num(sens.get("base_output_sqnr_db"))

        def gain(p: Mapping[str, Any]) -> float | None:
            out = _num(p.get("output_sqnr_db"))
            return None if out is None or base_db is None else out - base_db

        tensors: dict[str, TensorGain] = {}
        # A demotion sweep (``efficient``) measures what leaving a candidate in 8 bits costs the all-16-bit model, not
        # a gain over this base: not a tensor's gain here.
        for m in sens.get("measured", []) if sens.get("mode") != "demote" else ():
            c = m["candidate"]
            for t in c["tensors"]:
                tensors[t] = TensorGain(
                    t, c["name"], len(c["tensors"]), _num(m.get("measured_gain_db")), _num(m["predicted_gain_db"])
                )
        for p in points:  # a prefix or greedy step of one tensor is that tensor measured alone
            if len(p["promoted"]) == 1 and p["promoted"][0] not in tensors:
                t = p["promoted"][0]
                tensors[t] = TensorGain(t, t, 1, gain(p), None)
        sets = tuple(
            SetGain(str(p.get("label") or f"step {p['step']}"), tuple(p["promoted"]), _num(p["output_sqnr_db"]),
                    gain(p), float(p["cost_fraction_16bit"]), bool(p["chosen"]))
            for p in points if p["promoted"]
        )  # fmt: skip
        remedies = tuple(
            RemedyGain(str(r["kind"]), str(r["description"]), tuple(r.get("tensors", ())),
                       _num(r.get("output_sqnr_db")), _num(r.get("gain_db")), bool(r.get("recommended")),
                       r.get("error"))
            for r in doc.get("remedies") or ()
        )  # fmt: skip
        reached = doc.get("reached")
        return cls(base_db, tuple(tensors.values()), sets, remedies, "qdebug search",
                   None if reached is None else bool(reached), str(doc.get("stop_reason") or ""))  # fmt: skip

    @classmethod
    def from_search(cls, result: Any, remedies: Sequence[Any] = ()) -> MeasuredGains:
        """From a :class:`~qdebug.mixed.search.SearchResult` and measured :class:`RemedyResult` objects."""
        doc = result.to_dict()
        doc["remedies"] = [r.to_dict() for r in remedies]
        return cls.from_search_dict(doc)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``schema_version``."""
        return {
            "schema_version": SCHEMA_VERSION,
            "source": self.source,
            "reached": self.reached,
            "stop_reason": self.stop_reason,
            "base_output_sqnr_db": encode_number(self.base_output_sqnr_db),
            "tensors": [
                {"tensor": t.tensor, "candidate": t.candidate, "group_size": t.group_size,
                 "measured_gain_db": encode_number(t.measured_gain_db),
                 "predicted_gain_db": encode_number(t.predicted_gain_db)}
                for t in self.tensors
            ],
            "sets": [
                {"label": s.label, "tensors": list(s.tensors), "output_sqnr_db": encode_number(s.output_sqnr_db),
                 "gain_db": encode_number(s.gain_db), "cost_fraction_16bit": s.cost_fraction_16bit,
                 "chosen": s.chosen}
                for s in self.sets
            ],
            "remedies": [
                {"kind": r.kind, "description": r.description, "tensors": list(r.tensors),
                 "output_sqnr_db": encode_number(r.output_sqnr_db), "gain_db": encode_number(r.gain_db),
                 "recommended": r.recommended, "error": r.error}
                for r in self.remedies
            ],
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MeasuredGains:
        """Inverse of :meth:`to_dict`."""
        if d.get("schema_version") != SCHEMA_VERSION:
            raise ConfigError(f"measured gains: unsupported schema_version {d.get('schema_version')!r}")
        return cls(
            _num(d["base_output_sqnr_db"]),
            tuple(TensorGain(t["tensor"], t["candidate"], int(t["group_size"]), _num(t["measured_gain_db"]),
                             _num(t["predicted_gain_db"])) for t in d["tensors"]),
            tuple(SetGain(s["label"], tuple(s["tensors"]), _num(s["output_sqnr_db"]), _num(s["gain_db"]),
                          float(s["cost_fraction_16bit"]), bool(s["chosen"])) for s in d["sets"]),
            tuple(RemedyGain(r["kind"], r["description"], tuple(r["tensors"]), _num(r["output_sqnr_db"]),
                             _num(r["gain_db"]), bool(r["recommended"]), r.get("error")) for r in d["remedies"]),
            str(d.get("source", "qdebug search")),
            d.get("reached"),
            str(d.get("stop_reason", "")),
        )  # fmt: skip

    def to_dataframe(self) -> pd.DataFrame:
        """One row per tensor: predicted and measured gain side by side."""
        import pandas as pd

        return pd.DataFrame([t.__dict__ for t in self.tensors])


def _points(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every measured point of a search (accepted steps first), each promotion set once, cheapest first."""
    seen: dict[frozenset[str], dict[str, Any]] = {}
    for p in (*doc.get("steps", ()), *doc.get("evaluated", ())):
        if str(p.get("label", "")) == "all16":
            continue  # a different recipe (every activation in 16 bits), not a promotion set of this ranking
        key = frozenset(p["promoted"])
        if key not in seen or (p.get("chosen") and not seen[key].get("chosen")):
            seen[key] = dict(p)
    return sorted(seen.values(), key=lambda p: (float(p["cost_fraction_16bit"]), len(p["promoted"])))


# ---------------------------------------------------------------------------------------------- diagnose --measure
#: A remedy is advice only when it measured more than this (dB at the worst output): the noise of a small debug set.
MIN_MEASURED_GAIN_DB = 0.1


@dataclass(frozen=True)
class DiagnosisGain:
    """One diagnosis' remedy measured: the gain it was predicted (``None``: no estimate for this kind of remedy)
    and the gain it measured at the worst output, against the same base and samples."""

    tensor: str
    diagnosis: str
    remedy: str
    text: str
    predicted_gain_db: float | None
    measured_gain_db: float | None
    output_sqnr_db: float | None
    error: str | None = None

    @property
    def helps(self) -> bool:
        """Measured better than the base by more than :data:`MIN_MEASURED_GAIN_DB`."""
        return self.measured_gain_db is not None and self.measured_gain_db > MIN_MEASURED_GAIN_DB


@dataclass(frozen=True)
class DiagnosisGains:
    """Every diagnosis' remedy measured (``qdebug diagnose --measure``), best measured gain first; remedies that
    measured no gain come after every one that did, so none of them is ever the top fix."""

    base_output_sqnr_db: float | None
    items: tuple[DiagnosisGain, ...]
    ceiling_db: float | None = None

    @property
    def median_abs_error_db(self) -> float | None:
        """Median |predicted − measured| over the remedies with both (``None``: none)."""
        errs = sorted(
            abs(g.predicted_gain_db - g.measured_gain_db)
            for g in self.items
            if g.predicted_gain_db is not None and g.measured_gain_db is not None
        )
        if not errs:
            return None
        mid = len(errs) // 2
        return errs[mid] if len(errs) % 2 else (errs[mid - 1] + errs[mid]) / 2

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``schema_version``."""
        return {
            "schema_version": SCHEMA_VERSION,
            "base_output_sqnr_db": encode_number(self.base_output_sqnr_db),
            "ceiling_db": encode_number(self.ceiling_db),
            "median_abs_error_db": encode_number(self.median_abs_error_db),
            "items": [
                {"tensor": g.tensor, "diagnosis": g.diagnosis, "remedy": g.remedy, "text": g.text,
                 "predicted_gain_db": encode_number(g.predicted_gain_db),
                 "measured_gain_db": encode_number(g.measured_gain_db),
                 "output_sqnr_db": encode_number(g.output_sqnr_db), "error": g.error, "helps": g.helps}
                for g in self.items
            ],
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DiagnosisGains:
        """Inverse of :meth:`to_dict`."""
        if d.get("schema_version") != SCHEMA_VERSION:
            raise ConfigError(f"diagnosis gains: unsupported schema_version {d.get('schema_version')!r}")
        items = tuple(
            DiagnosisGain(g["tensor"], g["diagnosis"], g["remedy"], g["text"], _num(g["predicted_gain_db"]),
                          _num(g["measured_gain_db"]), _num(g["output_sqnr_db"]), g.get("error"))
            for g in d["items"]
        )  # fmt: skip
        return cls(_num(d["base_output_sqnr_db"]), items, _num(d.get("ceiling_db")))


def rank_by_measured(items: Sequence[DiagnosisGain]) -> tuple[DiagnosisGain, ...]:
    """Best measured gain first; unmeasured (errors) last; ties in the given (diagnostic) order."""
    order = {id(g): k for k, g in enumerate(items)}
    return tuple(sorted(items, key=lambda g: (g.measured_gain_db is None, -(g.measured_gain_db or 0.0), order[id(g)])))
