"""Output-only measurement of a candidate model: the float model's outputs computed once per sample set, each
candidate run on the same samples, the worst output's SQNR from energies summed over the samples.

A fix measures tens of candidates; a full debug pass (every tensor) for each would cost ~5-20x more than running
the model's outputs, and only the outputs decide whether a remedy helped. One debug pass of the chosen recipe
gives the per-tensor view the search ranks with.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from qdebug.data import Sample
from qdebug.metrics import energies, sqnr_from_energies
from qdebug.ort import make_session

#: Float outputs kept in memory for re-use across candidates, at most this many bytes; beyond it the float model
#: runs again with every candidate (same numbers, twice the model runs).
CACHE_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class Measure:
    """One model measured on one sample set: each float output's SQNR (energies summed over samples), the worst
    output's, the worst single sample's, and the task metric's value when one was given."""

    outputs: Mapping[str, float | None]
    worst_db: float | None
    worst_sample_db: float | None
    samples: int
    task: float | None = None
    seconds: float = 0.0

    @property
    def noise(self) -> float:
        """The worst output's noise-to-signal power (what promotions reduce; additive across regions)."""
        if self.worst_db is None:
            return math.inf
        return 10.0 ** (-self.worst_db / 10.0) if math.isfinite(self.worst_db) else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (non-finite numbers as strings)."""
        from qdebug.report import encode_number

        return {
            "outputs": {k: encode_number(v) for k, v in self.outputs.items()},
            "worst_db": encode_number(self.worst_db),
            "worst_sample_db": encode_number(self.worst_sample_db),
            "samples": self.samples,
            "task": encode_number(self.task),
            "seconds": self.seconds,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Measure:
        """Inverse of :meth:`to_dict`."""
        from qdebug.report import decode_number

        return cls(
            outputs={k: decode_number(v) for k, v in d["outputs"].items()},
            worst_db=decode_number(d["worst_db"]),
            worst_sample_db=decode_number(d["worst_sample_db"]),
            samples=int(d["samples"]),
            task=decode_number(d.get("task")),
            seconds=float(d.get("seconds", 0.0)),
        )


def _round(db: float | None) -> float | None:
    return None if db is None else round(db, 3) if math.isfinite(db) else db


@dataclass
class OutputProbe:
    """The float model's outputs on ``samples`` (cached up to :data:`CACHE_BYTES`), and :meth:`measure` of a
    candidate against them. ``metric`` is a task metric (:mod:`qdebug.task_metrics`) or ``None``; ``labels`` the
    per-sample labels it may use."""

    float_model: onnx.ModelProto
    samples: Sequence[Sample]
    metric: Any = None
    labels: Sequence[Any] | None = None
    _session: Any = field(default=None, init=False, repr=False)
    _cache: list[list[np.ndarray]] | None = field(default=None, init=False, repr=False)
    _names: list[str] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self._session = make_session(self.float_model, ["CPUExecutionProvider"], role="float")
        self._names = [o.name for o in self._session.get_outputs()]
        cache: list[list[np.ndarray]] = []
        size = 0
        for s in self.samples:
            outs = [np.asarray(o) for o in self._session.run(self._names, dict(s))]
            size += sum(o.nbytes for o in outs)
            if size > CACHE_BYTES:
                self._cache = None
                return
            cache.append(outs)
        self._cache = cache

    def _float(self, i: int, sample: Sample) -> list[np.ndarray]:
        if self._cache is not None:
            return self._cache[i]
        return [np.asarray(o) for o in self._session.run(self._names, dict(sample))]

    def measure(self, model: str | Path | onnx.ModelProto) -> Measure:
        """``model``'s outputs against the float model's on every sample."""
        import time

        t0 = time.perf_counter()
        proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
        what = None if isinstance(model, onnx.ModelProto) else str(model)
        qs: Any = make_session(proto, ["CPUExecutionProvider"], what=what)
        have = {o.name for o in qs.get_outputs()}
        names = [n for n in self._names if n in have]
        idx = [self._names.index(n) for n in names]
        signal, noise = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0.0)
        floating = set(names)
        worst_sample = math.inf
        state = self.metric.start() if self.metric is not None else None
        for i, sample in enumerate(self.samples):
            fo = self._float(i, sample)
            qo = [np.asarray(o) for o in qs.run(names, dict(sample))]
            sample_worst = math.inf
            for name, j, q in zip(names, idx, qo, strict=True):
                f = fo[j]
                if not np.issubdtype(f.dtype, np.floating) or f.shape != q.shape:
                    floating.discard(name)
                    continue
                s, n = energies(f, q)
                signal[name] += s
                noise[name] += n
                db = sqnr_from_energies(s, n)[0]
                if db is not None:
                    sample_worst = min(sample_worst, db)
            worst_sample = min(worst_sample, sample_worst)
            if state is not None:
                label = None if self.labels is None else self.labels[i]
                state = self.metric.update(
                    state, dict(zip(self._names, fo, strict=True)), dict(zip(names, qo, strict=True)), label
                )
        outputs: dict[str, float | None] = {}
        for name in names:
            outputs[name] = _round(sqnr_from_energies(signal[name], noise[name])[0]) if name in floating else None
        measured = [v for v in outputs.values() if v is not None]
        return Measure(
            outputs=outputs,
            worst_db=min(measured) if measured else None,
            worst_sample_db=_round(worst_sample) if math.isfinite(worst_sample) or worst_sample == math.inf else None,
            samples=len(self.samples),
            task=None if state is None else float(self.metric.value(state)),
            seconds=round(time.perf_counter() - t0, 3),
        )


__all__ = ["CACHE_BYTES", "Measure", "OutputProbe"]
