"""What a task metric is and what it gives: :class:`TaskMetric`, a *mergeable per-sample accumulator* over a small
:data:`State` of sums, counts and extremes (:func:`merge_states` joins two shards' states exactly), and
:class:`TaskScore`, its score over some samples. The built-ins and the loading of a spec are :mod:`qdebug.task_metrics`.

A low floor: numpy and :mod:`qdebug.errors` only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from qdebug.errors import ConfigError, DataError, InputFileError

if TYPE_CHECKING:
    import pandas as pd


#: A metric's accumulator state: named sums, counts and extremes (see :func:`merge_states` for how keys merge).
State = dict[str, float]
#: State keys starting with these merge by min / max; every other key is a sum.
MIN_PREFIX, MAX_PREFIX = "min:", "max:"
#: Separates a quantity from the output it belongs to in a state key (``"rows|logits"``).
SEP = "|"
#: Every state counts the samples it saw under this key.
SAMPLES = "samples"
TASK_SCHEMA_VERSION = 1

UpdateFn = Callable[[State, Mapping[str, np.ndarray], Mapping[str, np.ndarray], "np.ndarray | None"], None]


def merge_states(a: Mapping[str, float], b: Mapping[str, float]) -> State:
    """Two states of one metric joined exactly: a ``min:`` key keeps the smaller, a ``max:`` key the larger, every
    other key is summed. A new state; neither input is changed."""
    out = dict(a)
    for key, v in b.items():
        if key not in out:
            out[key] = v
        elif key.startswith(MIN_PREFIX):
            out[key] = min(out[key], v)
        elif key.startswith(MAX_PREFIX):
            out[key] = max(out[key], v)
        else:
            out[key] = out[key] + v
    return out


@dataclass(frozen=True)
class TaskMetric:
    """A task metric: a name, what it measures, which way is better, and a mergeable per-sample accumulator.

    ``update_fn(state, float_outputs, quant_outputs, label)`` adds one sample to ``state`` in place (the public
    :meth:`update` hands it a copy); ``value_fn(state)`` is the score; ``detail_fn(state)`` the per-output figures
    (``{}`` when there are none). ``outputs`` limits a built-in to those model outputs (``None``: every output it
    applies to); ``needs_labels``: :meth:`update` refuses a sample without a label.
    """

    name: str
    description: str
    higher_is_better: bool
    update_fn: UpdateFn = field(repr=False, compare=False)
    value_fn: Callable[[Mapping[str, float]], float] = field(repr=False, compare=False)
    detail_fn: Callable[[Mapping[str, float]], dict[str, dict[str, float]]] | None = field(
        default=None, repr=False, compare=False
    )
    needs_labels: bool = False
    outputs: tuple[str, ...] | None = None

    def start(self) -> State:
        """An empty state (no sample yet)."""
        return {SAMPLES: 0.0}

    def update(
        self,
        state: Mapping[str, float],
        float_outputs: Mapping[str, np.ndarray],
        quant_outputs: Mapping[str, np.ndarray],
        label: np.ndarray | None = None,
    ) -> State:
        """``state`` with one more sample: that sample's outputs by name (float and quantized model) and its label
        (``None``: unlabelled). A new state; ``state`` is not changed."""
        if self.needs_labels and label is None:
            raise DataError(f"task metric {self.name}: needs a label per sample (a labelled .npz: --label-key)")
        out = dict(state)
        out[SAMPLES] = out.get(SAMPLES, 0.0) + 1
        self.update_fn(out, _chosen(self, float_outputs), _chosen(self, quant_outputs), label)
        return out

    def merge(self, a: Mapping[str, float], b: Mapping[str, float]) -> State:
        """Two states (e.g. two shards of the samples) joined: the state of all their samples."""
        return merge_states(a, b)

    def value(self, state: Mapping[str, float]) -> float:
        """The score of the samples in ``state`` (NaN before any sample)."""
        if not state.get(SAMPLES):
            return math.nan
        return float(self.value_fn(state))

    def detail(self, state: Mapping[str, float]) -> dict[str, dict[str, float]]:
        """Per-output figures (output name → quantity → number); ``{}`` when the metric has none."""
        return {} if self.detail_fn is None or not state.get(SAMPLES) else self.detail_fn(state)

    def score(self, state: Mapping[str, float]) -> TaskScore:
        """The :class:`TaskScore` of ``state``."""
        v = self.value(state)
        return TaskScore(
            metric=self.name,
            value=v if math.isfinite(v) else None,
            samples=int(state.get(SAMPLES, 0)),
            higher_is_better=self.higher_is_better,
            per_output=self.detail(state),
            description=self.description,
        )

    def on(self, outputs: tuple[str, ...] | list[str]) -> TaskMetric:
        """This metric limited to the model outputs ``outputs`` (the name says so: ``top1@logits``)."""
        names = tuple(outputs)
        if not names:
            raise ConfigError(f"task metric {self.name}: name at least one output after '@'")
        base = self.name.split("@", 1)[0]
        return replace(self, name=f"{base}@{','.join(names)}", outputs=names)


def _chosen(metric: TaskMetric, outputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
    """The outputs a metric limited to some (``metric.outputs``) reads; a name the model lacks is an error."""
    if metric.outputs is None:
        return outputs
    missing = [n for n in metric.outputs if n not in outputs]
    if missing:
        raise ConfigError(f"task metric {metric.name}: no model output {missing}; the outputs are {sorted(outputs)}")
    return {n: outputs[n] for n in metric.outputs}


# ------------------------------------------------------------------------------------------------ the result
def _num(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


@dataclass(frozen=True)
class TaskScore:
    """A task metric's score over some samples: ``value`` (``None``: undefined), how many ``samples``, which way is
    better, and per-output figures where the metric has them (``per_output``: output → quantity → number)."""

    metric: str
    value: float | None
    samples: int
    higher_is_better: bool = True
    per_output: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    description: str = ""

    def meets(self, goal: float) -> bool:
        """Whether the score reaches ``goal`` (at least it, or at most it when lower is better)."""
        if self.value is None:
            return False
        return self.value >= goal - 1e-12 if self.higher_is_better else self.value <= goal + 1e-12

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (with ``schema_version``; undefined numbers as ``null``)."""
        return {
            "schema_version": TASK_SCHEMA_VERSION,
            "metric": self.metric,
            "value": _num(self.value),
            "samples": self.samples,
            "higher_is_better": self.higher_is_better,
            "per_output": {o: {k: _num(v) for k, v in q.items()} for o, q in self.per_output.items()},
            "description": self.description,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TaskScore:
        """Inverse of :meth:`to_dict`; refuses another schema version."""
        if d.get("schema_version") != TASK_SCHEMA_VERSION:
            raise InputFileError(f"task score schema_version {d.get('schema_version')!r} is not supported "
                                 f"(need {TASK_SCHEMA_VERSION})")  # fmt: skip
        per = {o: {k: (math.nan if v is None else float(v)) for k, v in q.items()} for o, q in d["per_output"].items()}
        return cls(
            metric=str(d["metric"]),
            value=None if d["value"] is None else float(d["value"]),
            samples=int(d["samples"]),
            higher_is_better=bool(d["higher_is_better"]),
            per_output=per,
            description=str(d.get("description", "")),
        )

    def to_dataframe(self) -> pd.DataFrame:
        """One row per output (its figures as columns); one row of the value when the metric has no per-output
        figures."""
        import pandas as pd

        if not self.per_output:
            return pd.DataFrame([{"output": None, "value": self.value}])
        return pd.DataFrame([{"output": o, **q} for o, q in self.per_output.items()])
