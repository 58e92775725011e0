"""Run the float and the quantized model on the same samples and reduce every paired tensor to streaming sums,
one sample at a time, through a capture backend (:class:`~qdebug.capture.base.CaptureBackend`):

* ``auto`` (:mod:`qdebug.capture.auto`, the default of :func:`capture`, ``DebugOptions`` and ``--capture``): the
  fastest for this pair and this number of samples, chosen from costs measured on the run's first samples;
* ``graph`` (:mod:`qdebug.capture.merged`): both models merged into one ONNX Runtime graph that returns each
  sample's sums;
* ``fetch`` (:mod:`qdebug.capture.compose`; formerly ``numpy``, still accepted): every paired tensor fetched and
  reduced by the reference definition (:mod:`qdebug.capture.kernels.reference`), pipelined, batched or segmented
  as the pair and the machine allow;
* ``compiled`` (:mod:`qdebug.capture.compiled`): the fetch run, reduced by one compiled pass per activation.

Graph optimizations are off in both, so the QDQ model is evaluated as written. A backend that cannot capture the
pair at all hands the whole run to ``fetch``; a sample it cannot reduce exactly is redone by ``fetch``; both are
recorded (:class:`CaptureResult` → the report's ``meta.capture``). Peak memory is one sample's tensors, whatever
the number of samples. Every threshold is a field of :class:`~qdebug.capture.tuning.CaptureTuning`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import onnx

from qdebug.capture.auto import AUTO, AutoBackend
from qdebug.capture.base import (
    BACKEND_ALIASES,
    FALLBACK_BACKEND,
    CaptureBackend,
    CaptureRun,
    CaptureSums,
    Fallback,
    ModelPair,
    OpenOptions,
    RunInfo,
    SampleSums,
    UnsupportedPairError,
    backend_names,
    canonical_backend,
    get_backend,
    register_backend,
)
from qdebug.capture.compiled import CompiledBackend
from qdebug.capture.compose import FetchBackend
from qdebug.capture.loop import SampleLoop
from qdebug.capture.merged import GraphBackend
from qdebug.capture.tuning import CaptureTuning
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
    "CaptureTuning",
    "Fallback",
    "ModelPair",
    "OpenOptions",
    "ProgressFn",
    "RunInfo",
    "SampleSums",
    "UnsupportedPairError",
    "backend_names",
    "canonical_backend",
    "capture",
    "capture_choices",
    "get_backend",
    "open_run",
    "register_backend",
    "run_info",
]

register_backend("graph", GraphBackend)
register_backend(FALLBACK_BACKEND, FetchBackend)
register_backend("compiled", CompiledBackend)  # numba (the ``fast`` extra) is imported only when it runs

#: The ``--capture`` choices shown, the default first: ``auto`` and the registered backends at import time (a former
#: name in :data:`~qdebug.capture.base.BACKEND_ALIASES` is accepted too, not shown).
CAPTURE_PATHS = (AUTO, *backend_names())


def capture_choices() -> tuple[str, ...]:
    """What ``capture`` may be: ``auto``, a registered backend (one registered after import included) or a former
    name of one (:data:`~qdebug.capture.base.BACKEND_ALIASES`)."""
    return (AUTO, *backend_names(), *BACKEND_ALIASES)


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
    requested: str = AUTO  # the backend asked for (or "auto")
    path: str = FALLBACK_BACKEND  # the backend that ran
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
        info: RunInfo,
    ) -> CaptureResult:
        """The frozen result of accumulated sums, captured as ``info`` says."""
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
            path=info.backend,
            fallback_samples=sum(sums.fallbacks.values()),
            fallback_reason=info.reason,
            fallback_reasons=tuple(sorted(sums.fallbacks.items())),
            batch=info.batch,
            batch_reason=info.batch_reason,
            segments=info.segments,
            segment_note=info.segment_note,
        )


def open_run(name: str, pair: ModelPair, options: OpenOptions) -> tuple[CaptureRun, str | None]:
    """The requested backend's run (``auto``: :class:`~qdebug.capture.auto.AutoBackend`'s), or the fallback
    backend's with the reason the requested one cannot capture the pair at all."""
    name = canonical_backend(name)
    backend: CaptureBackend = AutoBackend() if name == AUTO else get_backend(name)
    try:
        return backend.open(pair, options), None
    except UnsupportedPairError as exc:
        if name == FALLBACK_BACKEND:
            raise
        return get_backend(FALLBACK_BACKEND).open(pair, options), str(exc)


def run_info(run: CaptureRun, reason: str | None) -> RunInfo:
    """The run's :class:`RunInfo`, with the reason it was opened instead of the requested backend, if it was."""
    info = run.info()
    return info if reason is None else replace(info, reason=reason)


def capture(
    float_model: onnx.ModelProto,
    quant_model: onnx.ModelProto,
    pairing: Pairing,
    data: DataSource,
    providers: Sequence[str] = ("CPUExecutionProvider",),
    progress: ProgressFn | None = None,
    path: str = AUTO,
    batch: int | None = None,
    tuning: CaptureTuning | None = None,
) -> CaptureResult:
    """Run both models sample by sample through the backend ``path`` (``auto`` by default) and reduce every paired
    tensor to sums; ``batch`` > 1 lets a fetch run take that many samples per inference call
    (:mod:`qdebug.capture.batching`; the sums stay per sample); ``tuning``: the thresholds of every choice.

    A sample the backend cannot reduce exactly (NaN/Inf, shapes that differ, an ORT error) is redone by the
    ``fetch`` backend, which raises the precise one-line error if the sample itself is bad.
    """
    tuning = tuning or CaptureTuning()
    n_total = len(data)
    n_quant = sum(1 for a in pairing.activations if a.quantized)
    sums = CaptureSums(len(pairing.activations), n_quant, len(pairing.outputs))
    samples = iter(data)
    first = next(samples, None)  # read before the backend opens: its input shapes size one sample's tensors
    shapes = {k: tuple(np.shape(v)) for k, v in first.items()} if first is not None else None
    pair = ModelPair(float_model, quant_model, pairing, tuple(providers))
    options = OpenOptions(samples=n_total, input_shapes=shapes, batch=batch, tuning=tuning)
    run, reason = open_run(path, pair, options)
    loop = SampleLoop(run, pair, tuning)
    # a source that yields more than it announced stops at n_total
    source = itertools.islice(enumerate(itertools.chain([first] if first is not None else [], samples)), n_total)
    done = (lambda i: progress(i + 1, n_total)) if progress is not None else None
    try:
        loop.reduce_all(source, sums, done, where=data.description)
    finally:
        loop.close()
    if sums.samples == 0:
        raise DataError(f"{data.description}: no samples")
    return CaptureResult.of(sums, pairing, canonical_backend(path), run_info(run, reason))
