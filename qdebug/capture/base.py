"""The capture backend interface: a backend opens a *run* for a model pair; the run reduces one sample at a time
to :class:`SampleSums` (or says, with a reason, that another backend must do that sample); a
:class:`CaptureSums` accumulates and merges them.

Everything a run returns is a sum, a max or a min: shards of samples (other processes, other machines) merge
exactly, in any order of their sums and in a fixed order for the per-sample rows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt
import onnx

from qdebug.capture.tuning import CaptureTuning, SegmentRule
from qdebug.errors import ConfigError
from qdebug.metrics import BatchSums, ErrorSums
from qdebug.pairing import Pairing

__all__ = [
    "BACKEND_ALIASES",
    "FALLBACK_BACKEND",
    "CaptureBackend",
    "CaptureRun",
    "CaptureSums",
    "Fallback",
    "ModelPair",
    "OpenOptions",
    "PairSums",
    "RunInfo",
    "SampleSums",
    "UnsupportedPairError",
    "backend_names",
    "canonical_backend",
    "get_backend",
    "register_backend",
]

#: The backend that redoes what another cannot (it reduces any pair ORT can run, by the reference definition).
FALLBACK_BACKEND = "fetch"

#: Former backend names still accepted (``--capture``, ``DebugOptions.capture``), so old flags keep working.
BACKEND_ALIASES = {"numpy": "fetch"}


class UnsupportedPairError(Exception):
    """A backend cannot capture this model pair at all (the reason is the message); another one must."""


@dataclass(frozen=True)
class Fallback:
    """A run could not reduce one sample exactly; the reason is counted in the report and another backend
    redoes the sample."""

    reason: str


@dataclass(frozen=True)
class SampleSums:
    """One sample's sums of every pair: cumulative (per activation), local (per quantized activation, by ordinal),
    model outputs; the float tensors' finite min/max and element counts (per activation)."""

    cumulative: BatchSums
    local: BatchSums
    outputs: BatchSums
    float_min: npt.NDArray[np.float64]
    float_max: npt.NDArray[np.float64]
    elements: npt.NDArray[np.int64]


class ModelPair(NamedTuple):
    """What a backend opens a run for: the two models, their pairing and the execution providers."""

    float_model: onnx.ModelProto
    quant_model: onnx.ModelProto
    pairing: Pairing
    providers: Sequence[str]


@dataclass(frozen=True)
class OpenOptions:
    """What every backend's ``open`` is told about the run, whether or not it uses it.

    ``samples``: how many the run is expected to reduce (``auto`` weighs its choices on it); ``input_shapes``: the
    first sample's (a fetch run segments a model too large for one sample by them and ``segment_rule``, default:
    this process's cores); ``batch``: at most that many samples per inference call (``None``: ``auto`` decides,
    the others run one per call); ``tuning``: the thresholds of every choice."""

    samples: int = 1
    input_shapes: Mapping[str, tuple[int, ...]] | None = None
    segment_rule: SegmentRule | None = None
    batch: int | None = None
    tuning: CaptureTuning = field(default_factory=CaptureTuning)


@dataclass(frozen=True)
class RunInfo:
    """How a run captured its samples, for the report's ``meta.capture``: the backend that ran and why, the most
    samples one inference call took and why batching stopped or never started (``None``: it held, or was never
    meant to), how many segments each sample ran in and how it was fetched."""

    backend: str
    reason: str | None = None
    batch: int = 1
    batch_reason: str | None = None
    segments: int = 1
    segment_note: str | None = None


class CaptureRun(Protocol):
    """A backend opened for one model pair (holds its sessions).

    The capture loop (:mod:`qdebug.capture.loop`) reads samples ahead — :attr:`lookahead` of them past the current
    one — and announces each to :meth:`prefetch`, so that a run can infer them early or together; a run that does
    neither has ``lookahead`` 0 and a ``prefetch`` that does nothing."""

    @property
    def lookahead(self) -> int:
        """How many samples past the current one the loop should read and announce (asked before each sample)."""
        ...

    def prefetch(self, index: int, sample: Mapping[str, np.ndarray]) -> None:
        """Announce sample ``index``, which comes after the one :meth:`reduce` gets next."""
        ...

    def reduce(self, index: int, sample: Mapping[str, np.ndarray]) -> SampleSums | Fallback:
        """Sample ``index``'s sums, or a :class:`Fallback`; bad data raises a one-line :class:`QDebugError`."""
        ...

    @property
    def fallback(self) -> CaptureRun | None:
        """An open run of the fallback backend this run already holds (``auto``'s fetch run), which redoes its
        :class:`Fallback` samples; ``None``: the loop opens one when it first needs it."""
        ...

    def info(self) -> RunInfo:
        """How the samples reduced so far were captured."""
        ...

    def close(self) -> None:
        """Stop the run's threads (a pending inference finishes first); the run is not used after."""
        ...


class CaptureBackend(Protocol):
    """A way of capturing and reducing the paired tensors (registered by name)."""

    @property
    def name(self) -> str:
        """The registry name (``DebugOptions.capture``, ``--capture``)."""

    def open(self, pair: ModelPair, options: OpenOptions) -> CaptureRun:
        """A run for this pair; :class:`UnsupportedPairError` when the backend cannot capture it at all."""
        ...


class PairSums:
    """Mutable sums of ``n`` pairs over samples (the accumulator behind :class:`ErrorSums`; mergeable)."""

    def __init__(self, n: int) -> None:
        self.signal = np.zeros(n)
        self.noise = np.zeros(n)
        self.count = np.zeros(n, dtype=np.int64)
        self.max_abs = np.zeros(n)
        self.nf_ref = np.zeros(n, dtype=np.int64)
        self.nf_test = np.zeros(n, dtype=np.int64)

    def add(self, b: BatchSums) -> None:
        """Add one sample's sums (index = pair)."""
        self.signal += b.signal
        self.noise += b.noise
        self.count += b.count
        self.max_abs = np.maximum(self.max_abs, b.max_abs)
        self.nf_ref += b.nonfinite_reference
        self.nf_test += b.nonfinite_test

    def merge(self, other: PairSums) -> None:
        """Add another accumulator's sums (another shard of samples)."""
        self.add(BatchSums(other.signal, other.noise, other.count, other.max_abs, other.nf_ref, other.nf_test))

    def sums(self, j: int, samples: int) -> ErrorSums:
        """Pair ``j``'s :class:`ErrorSums`."""
        return ErrorSums(
            signal=float(self.signal[j]),
            noise=float(self.noise[j]),
            count=int(self.count[j]),
            max_abs=float(self.max_abs[j]),
            nonfinite_reference=int(self.nf_ref[j]),
            nonfinite_test=int(self.nf_test[j]),
            samples=samples,
        )


@dataclass
class CaptureSums:
    """Everything a capture accumulates over samples; :meth:`merge` joins two shards exactly."""

    n_acts: int
    n_quant: int
    n_outs: int
    cumulative: PairSums = field(init=False)
    local: PairSums = field(init=False)
    outputs: PairSums = field(init=False)
    per_sample: dict[int, npt.NDArray[np.float64]] = field(default_factory=dict)
    per_sample_outputs: dict[int, npt.NDArray[np.float64]] = field(default_factory=dict)
    fallbacks: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.cumulative, self.local, self.outputs = PairSums(self.n_acts), PairSums(self.n_quant), PairSums(self.n_outs)
        self.float_min = np.full(self.n_acts, np.inf)
        self.float_max = np.full(self.n_acts, -np.inf)
        self.elements = np.zeros(self.n_acts, dtype=np.int64)

    @property
    def samples(self) -> int:
        """Samples reduced so far."""
        return len(self.per_sample)

    def add(self, index: int, s: SampleSums) -> None:
        """Add sample ``index``."""
        self.cumulative.add(s.cumulative)
        self.local.add(s.local)
        self.outputs.add(s.outputs)
        self.float_min = np.fmin(self.float_min, s.float_min)
        self.float_max = np.fmax(self.float_max, s.float_max)
        self.elements[:] = s.elements
        self.per_sample[index] = s.cumulative.sqnr_db()
        self.per_sample_outputs[index] = s.outputs.sqnr_db()

    def merge(self, other: CaptureSums) -> CaptureSums:
        """Join another shard's sums into this one (sample indices must not overlap); returns ``self``."""
        overlap = self.per_sample.keys() & other.per_sample.keys()
        if overlap:
            raise ValueError(f"shards overlap in samples {sorted(overlap)[:5]}")
        for mine, theirs in ((self.cumulative, other.cumulative), (self.local, other.local)):
            mine.merge(theirs)
        self.outputs.merge(other.outputs)
        self.float_min = np.fmin(self.float_min, other.float_min)
        self.float_max = np.fmax(self.float_max, other.float_max)
        if other.samples:
            self.elements[:] = other.elements
        self.per_sample.update(other.per_sample)
        self.per_sample_outputs.update(other.per_sample_outputs)
        self.fallbacks.update(other.fallbacks)
        return self

    def rows(self, outputs: bool = False) -> npt.NDArray[np.float64]:
        """The per-sample SQNR matrix (samples in index order × pairs)."""
        rows = self.per_sample_outputs if outputs else self.per_sample
        width = self.n_outs if outputs else self.n_acts
        if not rows:
            return np.zeros((0, width))
        return np.stack([rows[i] for i in sorted(rows)])


_BACKENDS: dict[str, Callable[[], CaptureBackend]] = {}


def register_backend(name: str, factory: Callable[[], CaptureBackend]) -> None:
    """Register a capture backend (``--capture`` offers them after ``auto``, the default, in this order)."""
    _BACKENDS[name] = factory


def backend_names() -> tuple[str, ...]:
    """Registered backend names, in registration order."""
    return tuple(_BACKENDS)


def canonical_backend(name: str) -> str:
    """``name``, or the backend a former name (:data:`BACKEND_ALIASES`) now is."""
    return BACKEND_ALIASES.get(name, name)


def get_backend(name: str) -> CaptureBackend:
    """The backend registered as ``name`` (or a former name of it)."""
    name = canonical_backend(name)
    if name not in _BACKENDS:
        raise ConfigError(f"capture must be one of {', '.join(_BACKENDS)}, got {name!r}")
    return _BACKENDS[name]()
