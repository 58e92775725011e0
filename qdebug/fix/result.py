"""What a fix measured and chose: typed, JSON with ``schema_version``, tables as DataFrames."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from qdebug.config import QuantConfig
from qdebug.errors import InputFileError
from qdebug.fix.probe import Measure
from qdebug.report import decode_number, encode_number

if TYPE_CHECKING:
    import pandas as pd

SCHEMA_VERSION = 1


class Stage(StrEnum):
    """Where in the fix a trial was made."""

    BASE = "base"
    CEILING = "ceiling"
    RECIPE = "recipe"
    LIBRARY = "library"
    SIXTEEN_BIT = "sixteen_bit"


@dataclass(frozen=True)
class Trial:
    """One candidate quantized and measured on the debug samples: what it changed, its 16-bit share (of weight and
    activation elements), and the worst output SQNR it measured."""

    name: str
    stage: Stage
    description: str
    measure: Measure | None
    share_16bit: float
    seconds: float
    config: QuantConfig | None = None
    error: str | None = None
    library_recipe: str | None = None
    #: what the 16-bit search predicted this choice would measure (from each block's measured share), if it did
    predicted_db: float | None = None

    @property
    def db(self) -> float | None:
        """The worst output's SQNR on the debug samples (``None``: it failed or measured nothing)."""
        return None if self.measure is None else self.measure.worst_db

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "name": self.name,
            "stage": str(self.stage),
            "description": self.description,
            "measure": None if self.measure is None else self.measure.to_dict(),
            "share_16bit": self.share_16bit,
            "seconds": self.seconds,
            "config": None if self.config is None else self.config.to_dict(),
            "error": self.error,
            "library_recipe": self.library_recipe,
            "predicted_db": encode_number(self.predicted_db),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Trial:
        """Inverse of :meth:`to_dict`."""
        return cls(
            name=d["name"],
            stage=Stage(d["stage"]),
            description=d["description"],
            measure=None if d.get("measure") is None else Measure.from_dict(d["measure"]),
            share_16bit=float(d["share_16bit"]),
            seconds=float(d["seconds"]),
            config=None if d.get("config") is None else QuantConfig.from_dict(d["config"]),
            error=d.get("error"),
            library_recipe=d.get("library_recipe"),
            predicted_db=decode_number(d.get("predicted_db")),
        )


@dataclass(frozen=True)
class Step:
    """A remedy the fix kept, and what it bought on the debug samples."""

    remedy: str
    gain_db: float | None
    share_16bit: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"remedy": self.remedy, "gain_db": encode_number(self.gain_db), "share_16bit": self.share_16bit}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Step:
        """Inverse of :meth:`to_dict`."""
        return cls(d["remedy"], decode_number(d["gain_db"]), float(d["share_16bit"]))


@dataclass(frozen=True)
class FixResult:
    """A fix: the trials it measured, the ceilings, the chosen point and the held-out check.

    ``chosen`` is the name of the trial whose model is the fixed model (``model_path``); ``base`` is the starting
    point (the user's QDQ model, or ORT's default recipe for the target); ``holdout`` maps ``"base"``,
    ``"best_8bit"`` and ``"fixed"`` to their measures on samples no choice saw. ``caps`` says, in sentences, what keeps
    the fix from its goal (empty when it reached it)."""

    float_model: str
    target: str
    goal_db: float | None
    budget_16bit: float
    trials: tuple[Trial, ...]
    base: str
    best_8bit: str
    chosen: str
    steps: tuple[Step, ...]
    holdout: Mapping[str, Measure]
    caps: tuple[str, ...]
    model_path: str | None
    seconds: float
    debug_pass_seconds: float | None = None
    notes: tuple[str, ...] = ()
    metric: str | None = None
    ceilings: Mapping[str, float | None] = field(default_factory=dict)
    #: the search's wall time: everything but the one debug pass and the held-out check
    search_seconds: float | None = None

    def with_model_path(self, path: str | None) -> FixResult:
        """The same result with the fixed model at ``path`` (where the caller copied it)."""
        from dataclasses import replace

        return replace(self, model_path=path)

    def trial(self, name: str) -> Trial:
        """The trial called ``name``."""
        for t in self.trials:
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def reached(self) -> bool:
        """Whether the chosen point meets the goal on the debug samples."""
        db = self.trial(self.chosen).db
        return self.goal_db is None or (db is not None and db >= self.goal_db)

    @property
    def prediction_error_db(self) -> tuple[float, int] | None:
        """(median |predicted − measured| dB, how many) over the 16-bit choices the search predicted and measured."""
        import statistics

        errors = [abs(t.predicted_db - t.db) for t in self.trials if t.predicted_db is not None and t.db is not None]
        return (round(statistics.median(errors), 2), len(errors)) if errors else None

    @property
    def pass_equivalents(self) -> float | None:
        """The search's wall time in debug passes of the best 8-bit recipe on the same samples (``None``: not timed)."""
        if not self.debug_pass_seconds or self.search_seconds is None:
            return None
        return round(self.search_seconds / self.debug_pass_seconds, 1)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``schema_version``."""
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": "qdebug-fix",
            "float_model": self.float_model,
            "target": self.target,
            "goal_db": encode_number(self.goal_db),
            "budget_16bit": self.budget_16bit,
            "trials": [t.to_dict() for t in self.trials],
            "base": self.base,
            "best_8bit": self.best_8bit,
            "chosen": self.chosen,
            "reached": self.reached,
            "steps": [s.to_dict() for s in self.steps],
            "holdout": {k: v.to_dict() for k, v in self.holdout.items()},
            "caps": list(self.caps),
            "model_path": self.model_path,
            "seconds": self.seconds,
            "debug_pass_seconds": self.debug_pass_seconds,
            "pass_equivalents": self.pass_equivalents,
            "notes": list(self.notes),
            "metric": self.metric,
            "ceilings": {k: encode_number(v) for k, v in self.ceilings.items()},
            "search_seconds": self.search_seconds,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FixResult:
        """Inverse of :meth:`to_dict`."""
        if not isinstance(d, Mapping) or d.get("kind") != "qdebug-fix":
            raise InputFileError('not a qdebug fix result (no "kind": "qdebug-fix")')
        if d.get("schema_version") != SCHEMA_VERSION:
            raise InputFileError(f"fix result schema_version {d.get('schema_version')} is not supported")
        return cls(
            float_model=d["float_model"],
            target=d["target"],
            goal_db=decode_number(d["goal_db"]),
            budget_16bit=float(d["budget_16bit"]),
            trials=tuple(Trial.from_dict(t) for t in d["trials"]),
            base=d["base"],
            best_8bit=d["best_8bit"],
            chosen=d["chosen"],
            steps=tuple(Step.from_dict(s) for s in d["steps"]),
            holdout={k: Measure.from_dict(v) for k, v in d["holdout"].items()},
            caps=tuple(d["caps"]),
            model_path=d.get("model_path"),
            seconds=float(d["seconds"]),
            debug_pass_seconds=d.get("debug_pass_seconds"),
            notes=tuple(d.get("notes", ())),
            metric=d.get("metric"),
            ceilings={k: decode_number(v) for k, v in d.get("ceilings", {}).items()},
            search_seconds=d.get("search_seconds"),
        )

    def to_json(self) -> str:
        """JSON text."""
        return json.dumps(self.to_dict(), indent=2)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per trial: stage, name, 16-bit share, worst output SQNR (debug samples), seconds."""
        import pandas as pd

        rows = [
            {
                "stage": str(t.stage),
                "name": t.name,
                "description": t.description,
                "share_16bit": t.share_16bit,
                "worst_output_db": t.db,
                "seconds": t.seconds,
                "chosen": t.name == self.chosen,
                "error": t.error,
            }
            for t in self.trials
        ]
        return pd.DataFrame(rows)


__all__ = ["SCHEMA_VERSION", "FixResult", "Stage", "Step", "Trial"]
