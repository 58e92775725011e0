"""What ``quantize``'s output check chooses: the weight recipes it measures and the samples it measures them on.

The default recipe (per-tensor ``uint8`` weights) is one of a few that cost the same calibration: per-channel
weights and signed symmetric ``int8`` weights reuse the calibrated activation ranges and change only the QDQ
insertion. When the caller lets it choose (:func:`qdebug.quantizer.quantize`'s ``per_channel_fallback``), the check
measures each alternative's outputs on the same check samples and keeps one only when its worst output is better by
more than :data:`CHOICE_MARGIN_DB`. This module holds the typed record of that choice (:class:`RecipeChoice`), the
alternatives a config admits (:func:`weight_steps`) and the check samples (:func:`check_samples`); the insertion and
the measurements are :mod:`qdebug.quantizer`'s.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from qdebug.config import QuantConfig
from qdebug.data import DataSource, Limited, Sample, SyntheticData, Window

#: Samples each recipe is measured on: enough to see an output that is broken, cheap next to calibration.
CHECK_SAMPLES = 4
#: An alternative is kept only when its worst output beats the recipe so far by more than this: differences of a
#: few hundredths of a dB between recipes are the noise of a handful of samples, not a better model.
CHOICE_MARGIN_DB = 0.1


def recipe_label(per_channel: bool, weight_type: str) -> str:
    """How a weight recipe is named in the record and on the command line: ``per-channel int8``."""
    return f"{'per-channel' if per_channel else 'per-tensor'} {weight_type}"


@dataclass(frozen=True)
class RecipeTrial:
    """One weight recipe the output check measured, from the same calibration ranges as the others."""

    per_channel: bool
    weight_type: str
    #: the output with the lowest SQNR and that SQNR (dB); ``None`` when no output could be measured
    worst_output: str | None
    worst_db: float | None
    output_sqnr_db: dict[str, float | None]
    #: this recipe's QDQ insertion and check run (the given recipe: its check run only, its insertion is
    #: ``QuantizeResult.qdq_seconds``)
    seconds: float

    @property
    def label(self) -> str:
        """``per-tensor uint8`` etc."""
        return recipe_label(self.per_channel, self.weight_type)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RecipeTrial:
        """Inverse of :meth:`to_dict`."""
        return cls(**{**d, "output_sqnr_db": dict(d.get("output_sqnr_db", {}))})


@dataclass(frozen=True)
class RecipeChoice:
    """The weight recipes ``quantize`` measured and the one it wrote.

    ``trials[0]`` is the recipe as given; each later trial changes one thing of the best recipe before it (per-channel
    weights, then ``int8`` weights), so the cost is one QDQ insertion and one check run per trial."""

    trials: tuple[RecipeTrial, ...]
    #: index into ``trials`` of the recipe written
    chosen: int
    #: how much better (dB, worst output) an alternative had to measure to be kept
    margin_db: float
    #: the check samples each trial ran (``QuantizeResult.checked_on`` says which)
    num_samples: int

    @property
    def written(self) -> RecipeTrial:
        """The trial whose model was written."""
        return self.trials[self.chosen]

    @property
    def switched(self) -> bool:
        """Whether the written recipe differs from the one given."""
        return self.chosen != 0

    def summary(self) -> str:
        """One line: each recipe's worst output in dB and what was written, e.g. ``per-channel uint8 weights:
        13.0 dB vs 9.4 dB per-tensor uint8 on 4 check samples → written per-channel uint8``."""
        best = self.written

        def db(t: RecipeTrial) -> str:
            return "not measured" if t.worst_db is None else f"{t.worst_db:.1f} dB"

        others = ", ".join(f"{db(t)} {t.label}" for i, t in enumerate(self.trials) if i != self.chosen)
        versus = f" vs {others}" if others else ""
        head = f"{best.label} weights: {db(best)}{versus} (worst output) on {self.num_samples} check sample(s) → "
        if self.switched:
            return head + f"written {best.label} (better by more than {self.margin_db:g} dB)"
        return head + f"kept {best.label} (no alternative better by more than {self.margin_db:g} dB)"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the :meth:`summary` line included, for readers of the JSON alone)."""
        d = asdict(self)
        d["trials"] = [t.to_dict() for t in self.trials]
        d["summary"] = self.summary()
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RecipeChoice:
        """Inverse of :meth:`to_dict`."""
        kw = {k: v for k, v in d.items() if k != "summary"}
        kw["trials"] = tuple(RecipeTrial.from_dict(t) for t in kw["trials"])
        return cls(**kw)


def weight_steps(cfg: QuantConfig) -> list[dict[str, Any]]:
    """The changes the check tries, in order, each on top of the best recipe so far: per-channel weights (unless the
    config has them), then signed symmetric ``int8`` weights when the config has the default ``uint8`` with the
    target's default symmetry. A change the target cannot run is dropped by the caller (``QuantConfig.replace``
    refuses it)."""
    steps: list[dict[str, Any]] = []
    if not cfg.per_channel:
        steps.append({"per_channel": True})
    if cfg.weight_type == QuantConfig().weight_type and cfg.weight_symmetric is None:
        steps.append({"weight_type": "int8"})
    return steps


class _Seeded:
    """Synthetic samples ``[start, stop)``: sample *i* depends only on (seed, i), so these are new samples."""

    def __init__(self, source: SyntheticData, start: int, stop: int) -> None:
        self.source, self.start, self.stop = source, start, stop
        self.description = f"synthetic samples {start + 1}-{stop} (seed {source.seed})"

    def __len__(self) -> int:
        return self.stop - self.start

    def __iter__(self) -> Iterator[Sample]:
        for i in range(self.start, self.stop):
            yield self.source.sample(i)


class _Joined:
    """Several sources one after the other."""

    def __init__(self, parts: list[DataSource]) -> None:
        self.parts = parts
        self.description = " and ".join(p.description for p in parts)

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    def __iter__(self) -> Iterator[Sample]:
        for p in self.parts:
            yield from p


def check_samples(calibration: DataSource, n: int = CHECK_SAMPLES) -> tuple[DataSource, str, int]:
    """The samples the output check runs on, their description and how many calibration did not see.

    Samples calibration did not use come first — the data's samples after the calibrated ones when a sample count
    capped it, synthetic data's next seeds — topped up with the first calibration samples: measured on calibration
    samples alone, a recipe is judged where its ranges fit best."""
    used = len(calibration)
    held: DataSource | None = None
    if isinstance(calibration, SyntheticData):
        held = _Seeded(calibration, used, used + n)
    elif isinstance(calibration, Limited) and len(calibration.source) > used:
        full = calibration.source
        held = Window(full, used, min(used + n, len(full)))
    parts: list[DataSource] = [] if held is None else [held]
    fresh = 0 if held is None else len(held)
    if fresh < n:
        parts.append(Limited(calibration, n - fresh))
    source = parts[0] if len(parts) == 1 else _Joined(parts)
    if fresh == 0:
        what = f"the first {len(source)} calibration sample(s) (the data has no others)"
    elif fresh == len(source):
        what = f"{held.description if held is not None else ''} (not calibrated on)"
    else:
        what = f"{fresh} sample(s) not calibrated on and {len(source) - fresh} calibration sample(s)"
    return source, what, fresh
