"""Run the float and the quantized model on the same samples and reduce every paired tensor to streaming sums,
one sample at a time, through a capture backend (:class:`~qdebug.capture.base.CaptureBackend`):

* ``graph`` (default, :mod:`qdebug.capture.merged`): both models merged into one ONNX Runtime graph that
  returns each sample's sums;
* ``numpy`` (:mod:`qdebug.capture.fetch`): every paired tensor fetched and reduced in numpy by the
  reference definition (:mod:`qdebug.capture.kernels.reference`);
* ``compiled`` (:mod:`qdebug.capture.compiled`): the numpy backend's fetch, reduced by one compiled (numba) pass
  per activation;
* ``auto`` (:mod:`qdebug.capture.auto`, the default of ``DebugOptions`` and ``--capture``): the fastest
  for this pair and this number of samples, chosen from costs measured on the run's first samples.

Graph optimizations are off in both, so the QDQ model is evaluated as written. A backend that cannot capture the
pair at all hands the whole run to ``numpy``; a sample it cannot reduce exactly is redone by ``numpy``; both are
recorded (:class:`CaptureResult` → the report's ``meta.capture``). Peak memory is one sample's tensors, whatever
the number of samples.
"""

from __future__ import annotations

import inspect
import itertools
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from qdebug.capture.auto import AUTO, AutoRun
from qdebug.capture.base import (
    CaptureBackend,
    CaptureRun,
    CaptureSums,
    Fallback,
    SampleSums,
    UnsupportedPairError,
    backend_names,
    get_backend,
    register_backend,
)
from qdebug.capture.compiled import CompiledBackend
from qdebug.capture.fetch import NumpyBackend, NumpyRun
from qdebug.capture.merged import GraphBackend
from qdebug.capture.segmented import SegmentRule
from qdebug.data import DataSource
from qdebug.errors import DataError
from qdebug.metrics import ErrorSums
from qdebug.pairing import Pairing

__all__ = [
    "AUTO",
    "CAPTURE_PATHS",
    "FALLBACK_BACKEND",
    "CaptureBackend",
    "CaptureResult",
    "CaptureRun",
    "CaptureSums",
    "Fallback",
    "ProgressFn",
    "SampleSums",
    "UnsupportedPairError",
    "backend_names",
    "batching_of",
    "capture",
    "capture_choices",
    "get_backend",
    "open_run",
    "register_backend",
    "segmenting_of",
]

#: The backend that redoes what another cannot (it reduces any pair ORT can run, by the reference definition).
FALLBACK_BACKEND = "numpy"

register_backend("graph", GraphBackend)  # the default (first registered)
register_backend(FALLBACK_BACKEND, NumpyBackend)
register_backend("compiled", CompiledBackend)  # numba (the ``fast`` extra) is imported only when it runs

#: The ``--capture`` choices, the default first: ``auto``, then the registered backends at import time.
CAPTURE_PATHS = (AUTO, *backend_names())


def capture_choices() -> tuple[str, ...]:
    """What ``capture`` may be: ``auto`` or a registered backend (one registered after import included)."""
    return (AUTO, *backend_names())


ProgressFn = Callable[[int, int], None]


@dataclass(frozen=True)
class CaptureResult:
    """Streaming reductions of every paired tensor over all samples, and how they were captured."""

    cumulative: tuple[ErrorSums, ...]  # per activation, float vs quant (post-QDQ)
    local: tuple[ErrorSums | None, ...]  # per activation, pre- vs post-QDQ (None if not quantized)
    outputs: tuple[ErrorSums, ...]
    float_min: tuple[float | None, ...]
    float_max: tuple[float | None, ...]
    elements: tuple[int, ...]
    per_sample: np.ndarray  # samples × activations, cumulative SQNR dB
    per_sample_outputs: np.ndarray  # samples × outputs
    num_samples: int
    requested: str = "graph"  # the backend asked for (or "auto")
    path: str = "numpy"  # the backend that ran
    fallback_samples: int = 0  # samples redone by the fallback backend
    fallback_reason: str | None = None  # why auto chose `path`, or why the requested backend could not run at all
    fallback_reasons: tuple[tuple[str, int], ...] = ()  # (reason, samples) of the per-sample fallbacks
    batch: int = 1  # the most samples one inference call took
    batch_reason: str | None = None  # why batching stopped or never started (None: it held, or was not asked for)
    segments: int = 1  # consecutive parts each sample ran in (qdebug.capture.segmented)
    segment_note: str | None = None  # why it was segmented (or could not be); post-Q/DQ tensors from integers

    @classmethod
    def of(
        cls,
        sums: CaptureSums,
        pairing: Pairing,
        requested: str,
        used: str,
        reason: str | None,
        batch: tuple[int, str | None] = (1, None),
        segmenting: tuple[int, str | None] = (1, None),
    ) -> CaptureResult:
        """The frozen result of accumulated sums."""
        n = sums.samples
        ordinal = iter(range(sums.n_quant))
        return cls(
            cumulative=tuple(sums.cumulative.sums(j, n) for j in range(sums.n_acts)),
            local=tuple(sums.local.sums(next(ordinal), n) if a.quantized else None for a in pairing.activations),
            outputs=tuple(sums.outputs.sums(j, n) for j in range(sums.n_outs)),
            float_min=tuple(float(v) if np.isfinite(v) else None for v in sums.float_min),
            float_max=tuple(float(v) if np.isfinite(v) else None for v in sums.float_max),
            elements=tuple(int(e) for e in sums.elements),
            per_sample=sums.rows(),
            per_sample_outputs=sums.rows(outputs=True),
            num_samples=n,
            requested=requested,
            path=used,
            fallback_samples=sum(sums.fallbacks.values()),
            fallback_reason=reason,
            fallback_reasons=tuple(sorted(sums.fallbacks.items())),
            batch=batch[0],
            batch_reason=batch[1],
            segments=segmenting[0],
            segment_note=segmenting[1],
        )


def open_run(
    name: str,
    float_model: onnx.ModelProto,
    quant_model: onnx.ModelProto,
    pairing: Pairing,
    providers: Sequence[str],
    samples: int,
    batch: int | None = None,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    segment_rule: SegmentRule | None = None,
) -> tuple[CaptureRun, str, str | None]:
    """The requested backend's run (``auto``: an :class:`AutoRun`), or the fallback backend's with the reason the
    requested one cannot run. ``batch``: at most that many samples per inference call for the fetching backends
    (numpy, compiled, and ``auto``'s numpy run); ``None``: ``auto`` decides (:data:`AUTO_BATCH`), the others
    run one sample per call.

    The first sample's ``input_shapes`` let a fetching backend segment a model too large for one sample
    (:mod:`qdebug.capture.segmented`), by ``segment_rule`` (default: this process's cores; a Ray worker passes
    its own, :mod:`qdebug.capture.ray_backend`)."""
    pair = (float_model, quant_model, pairing, providers)
    if name == AUTO:
        run = AutoRun(*pair, samples, input_shapes=input_shapes, segment_rule=segment_rule, batch=batch)
        return run, AUTO, None
    hints = {"input_shapes": input_shapes, "segment_rule": segment_rule, "batch": batch or 1}
    try:
        return _open_backend(get_backend(name), pair, hints), name, None
    except UnsupportedPairError as exc:
        if name == FALLBACK_BACKEND:
            raise
        return _open_backend(get_backend(FALLBACK_BACKEND), pair, hints), FALLBACK_BACKEND, str(exc)


def _open_backend(
    backend: CaptureBackend,
    pair: tuple[onnx.ModelProto, onnx.ModelProto, Pairing, Sequence[str]],
    hints: Mapping[str, Any],
) -> CaptureRun:
    """``backend.open`` with those of ``hints`` its ``open`` accepts (a registered backend may take none)."""
    accepted = inspect.signature(backend.open).parameters
    return backend.open(*pair, **{k: v for k, v in hints.items() if k in accepted})


def batching_of(run: CaptureRun, used: str) -> tuple[int, str | None]:
    """The most samples one inference call took, and why batching stopped or never started, for a run that
    finished on backend ``used``: the fetching run's (numpy or compiled, also inside ``auto``)."""
    fetched = run.numpy if isinstance(run, AutoRun) else run if isinstance(run, NumpyRun) else None
    if fetched is None or used == "graph":
        return 1, None
    size, why = fetched.batching()
    if isinstance(run, AutoRun) and not run.batch_asked and not run.batch_planned:
        return size, None  # auto never meant to batch this model (no batch axis, segmented): nothing to explain
    return size, why


def segmenting_of(run: CaptureRun, used: str) -> tuple[int, str | None]:
    """How many segments each sample ran in, and why (or why not), for a run that finished on backend ``used``:
    the fetching run's (numpy or compiled, also inside ``auto``); the merged graph never segments."""
    fetched = run.numpy if isinstance(run, AutoRun) else run if isinstance(run, NumpyRun) else None
    return (fetched.segment_count, fetched.segment_note) if fetched is not None and used != "graph" else (1, None)


def capture(
    float_model: onnx.ModelProto,
    quant_model: onnx.ModelProto,
    pairing: Pairing,
    data: DataSource,
    providers: Sequence[str] = ("CPUExecutionProvider",),
    progress: ProgressFn | None = None,
    path: str = "graph",
    batch: int | None = None,
) -> CaptureResult:
    """Run both models sample by sample through the backend ``path`` (or ``"auto"``) and reduce every paired
    tensor to sums; ``batch`` > 1 lets the numpy backend run that many samples per inference call
    (:mod:`qdebug.capture.batching`; the sums stay per sample).

    A sample the backend cannot reduce exactly (NaN/Inf, shapes that differ, an ORT error) is redone by the
    ``numpy`` backend, which raises the precise one-line error if the sample itself is bad.
    """
    n_total = len(data)
    n_quant = sum(1 for a in pairing.activations if a.quantized)
    sums = CaptureSums(len(pairing.activations), n_quant, len(pairing.outputs))
    samples = iter(data)
    first = next(samples, None)  # read before the backend opens: its input shapes size one sample's tensors
    shapes = {k: tuple(np.shape(v)) for k, v in first.items()} if first is not None else None
    run, used, reason = open_run(path, float_model, quant_model, pairing, providers, n_total, batch, shapes)
    # auto's numpy run is already open: it redoes the merged graph's fallbacks too
    fallback: CaptureRun | None = run.numpy if isinstance(run, AutoRun) else None
    prefetch = getattr(run, "prefetch", None)  # a run that can start the next sample early (NumpyRun, AutoRun)
    try:
        source = itertools.chain([first] if first is not None else [], samples)
        pair = (float_model, quant_model, pairing, providers)
        _loop(run, fallback, prefetch, source, data, n_total, sums, progress, pair)
    finally:
        for r in (run, fallback):  # AutoRun.close stops its numpy run (which is also auto's fallback)
            close = getattr(r, "close", None)
            if close is not None:
                close()
    if sums.samples == 0:
        raise DataError(f"{data.description}: no samples")
    if isinstance(run, AutoRun):
        used, reason = run.final().backend, run.final().reason
    return CaptureResult.of(sums, pairing, path, used, reason, batching_of(run, used), segmenting_of(run, used))


def _loop(
    run: CaptureRun,
    fallback: CaptureRun | None,
    prefetch: Callable[[int, Mapping[str, np.ndarray]], None] | None,
    samples: Iterator[Mapping[str, np.ndarray]],
    data: DataSource,
    n_total: int,
    sums: CaptureSums,
    progress: ProgressFn | None,
    pair: tuple[onnx.ModelProto, onnx.ModelProto, Pairing, Sequence[str]],
) -> None:
    """Reduce every sample into ``sums``. Samples are read ahead of the current one — as many as the run's
    ``lookahead`` asks for (1 by default) — and announced to ``prefetch``, so that a pipelining or batching run
    can infer them early or together."""
    ahead: deque[tuple[int, Mapping[str, np.ndarray]]] = deque()
    read = 0  # samples read from the source so far

    def top_up(current: int) -> None:
        nonlocal read
        want = 1 + (getattr(run, "lookahead", 1) if prefetch is not None else 0)
        while len(ahead) < want and read < n_total:  # a source that yields more than it announced stops at n_total
            sample = next(samples, None)
            if sample is None:
                read = n_total
                break
            ahead.append((read, sample))
            if prefetch is not None and read > current:
                prefetch(read, sample)
            read += 1

    top_up(0)
    while ahead:
        i, sample = ahead.popleft()
        top_up(i)
        try:
            res = run.reduce(i, sample)
            if isinstance(res, Fallback):
                sums.fallbacks[res.reason] += 1
                fallback = fallback or get_backend(FALLBACK_BACKEND).open(*pair)
                res = fallback.reduce(i, sample)
                assert isinstance(res, SampleSums), "the fallback backend reduces every sample or raises"
        except DataError as exc:  # a backend sees one sample: name where it came from
            raise DataError(f"{data.description}: {exc}") from exc
        sums.add(i, res)
        if progress is not None:
            progress(i + 1, n_total)
