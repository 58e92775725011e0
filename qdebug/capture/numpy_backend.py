"""The ``numpy`` capture backend: every paired tensor is exposed as an extra output of its model (ONNX Runtime
activation augmentation, optimizations off), fetched, and reduced by :func:`~qdebug.capture.reduction.reduce_sample`
— the reference definition itself. Robust on any model ORT can run; it moves every tensor out of ORT.

From the second sample of one input shape on, ONNX Runtime writes the outputs into the previous sample's arrays
(I/O binding) instead of allocating and copying hundreds of fresh ones: a real model exposes hundreds of MB per
sample, and fresh pages cost the kernel's zeroing and faults every time (PP-OCRv4 rec: 382 -> 326 ms per sample).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import onnx

from qdebug.capture.base import SampleSums
from qdebug.capture.reduction import ReductionPlan, reduce_sample
from qdebug.capture.session import expose_outputs, make_session, ort_errors, ort_message
from qdebug.errors import DataError, ModelError
from qdebug.graph import Pairing

__all__ = ["BIND_BYTES", "PIPELINE_BYTES", "BoundFetch", "NumpyBackend", "NumpyRun"]

#: Below this many output bytes per sample the plain run is as fast (Silero VAD's 0.4 MB: binding 300 outputs
#: costs more than allocating them).
BIND_BYTES = 4 << 20
#: Up to this many exposed bytes per sample (both models) the next sample's inference runs while this one is
#: reduced: two samples' tensors are alive at once, so larger ones (PP-OCRv4 rec: ~350 MB) are not pipelined and
#: peak memory stays one sample's tensors.
PIPELINE_BYTES = 160 << 20


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class BoundFetch:
    """Runs one session for ``names`` and returns their values, reusing the previous sample's output arrays when
    the input shapes are the same. The arrays are overwritten by the next :meth:`run`: use them before."""

    def __init__(self, sess: Any, names: Sequence[str]) -> None:
        self.sess, self.names = sess, list(names)
        self.inputs = {i.name for i in sess.get_inputs()}
        self.errors = ort_errors()
        self.key: tuple[tuple[str, tuple[int, ...], str], ...] | None = None
        self.binding: Any = None
        self.values: list[np.ndarray] = []
        self.usable = True  # False once a bound run failed where a plain one worked: stop trying

    def run(self, sample: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The values of :attr:`names` for ``sample`` (ORT's exceptions propagate from the plain run)."""
        key = tuple((k, v.shape, v.dtype.str) for k, v in sorted(sample.items()))
        if self.binding is not None and key == self.key:
            try:
                for k, v in sample.items():
                    self.binding.bind_cpu_input(k, v)
                self.sess.run_with_iobinding(self.binding)
                # a graph input exposed as an output is the sample's own array
                return [sample[n] if n in self.inputs else v for n, v in zip(self.names, self.values, strict=True)]
            except self.errors:  # e.g. a data-dependent shape changed: the plain run says what is wrong, if anything
                self.usable = False
        values = list(self.sess.run(self.names, dict(sample)))
        self._bind(values, key)
        return values

    def _bind(self, values: list[np.ndarray], key: tuple[tuple[str, tuple[int, ...], str], ...]) -> None:
        """Bind every output to the array ORT just returned (numeric, contiguous, non-empty ones only)."""
        self.binding, self.key, self.values = None, None, []
        if (
            not self.usable
            or sum(v.nbytes for v in values) < BIND_BYTES
            or not all(v.dtype.kind in "fiub" and v.flags.c_contiguous and v.size for v in values)
        ):  # small outputs (nothing to save), strings or empty tensors: keep the plain run
            return
        binding = self.sess.io_binding()
        for name, v in zip(self.names, values, strict=True):
            if name not in self.inputs:
                binding.bind_output(name, "cpu", 0, v.dtype, list(v.shape), v.ctypes.data)
        self.binding, self.key, self.values = binding, key, values


class NumpyRun:
    """Two sessions whose outputs include every tensor of the :class:`ReductionPlan`.

    **Pipelined** (``pipeline``; default: with two or more cores): once the first sample has shown that two
    samples' tensors fit in :data:`PIPELINE_BYTES`, the capture loop's :meth:`prefetch` starts the next sample's
    inference on a worker thread while this thread reduces the current one — ONNX Runtime and numpy each keep a
    core busy instead of taking turns. The sessions' idle threads then sleep instead of spinning, so the reduction
    is not slowed by ORT's busy-waiting. The sums are those of the sequential run (same arrays, same order).
    """

    def __init__(
        self,
        float_model: onnx.ModelProto,
        quant_model: onnx.ModelProto,
        pairing: Pairing,
        providers: Sequence[str],
        pipeline: bool | None = None,
    ) -> None:
        self.plan = ReductionPlan.of(pairing)
        self.pipeline_allowed = usable_cores() >= 2 if pipeline is None else pipeline
        spin = not self.pipeline_allowed
        f_model = expose_outputs(float_model, self.plan.float_names)
        self.f_sess: Any = make_session(f_model, providers, role="float model", spin=spin)
        q_model = expose_outputs(quant_model, self.plan.quant_names)
        self.q_sess: Any = make_session(q_model, providers, role="quantized model", spin=spin)
        self.f_fetch = BoundFetch(self.f_sess, self.plan.float_names)
        self.q_fetch = BoundFetch(self.q_sess, self.plan.quant_names)
        self.sample_bytes: int | None = None  # exposed bytes of one sample, both models (after the first)
        self._pool: ThreadPoolExecutor | None = None
        self._queued: tuple[int, Mapping[str, np.ndarray]] | None = None
        self._pending: tuple[int, Future[tuple[list[np.ndarray], list[np.ndarray]]]] | None = None

    @property
    def pipelining(self) -> bool:
        """Whether the next sample's inference may run while this one is reduced."""
        return self.pipeline_allowed and self.sample_bytes is not None and self.sample_bytes <= PIPELINE_BYTES

    def prefetch(self, index: int, sample: Mapping[str, np.ndarray]) -> None:
        """Announce the sample after the one :meth:`reduce` gets next: when pipelining, its inference starts on the
        worker thread as soon as the current sample's values are in."""
        self._queued = (index, sample)

    def _start_queued(self, current: int) -> None:
        queued, self._queued = self._queued, None
        if queued is None or queued[0] == current or not self.pipelining:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="qdebug-infer")
        self._pending = (queued[0], self._pool.submit(self._infer, *queued))

    def close(self) -> None:
        """Stop the worker thread (a pending inference finishes first)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _infer(self, index: int, sample: Mapping[str, np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Both models' values for the sample (fresh arrays when pipelining: the reduction still reads the
        previous ones).

        A sample the float model cannot run is a :class:`DataError`; a sample the float model runs but the quantized
        model cannot (e.g. a zero point whose shape differs from its scale's, an axis out of range: ORT checks
        those at run time only) is the quantized model's fault, a :class:`ModelError` with that role.
        """
        fresh = self.pipelining
        try:
            f_vals = list(self.f_sess.run(self.plan.float_names, dict(sample))) if fresh else self.f_fetch.run(sample)
        except Exception as exc:  # ORT's own error types carry no common public base
            raise DataError(f"sample {index}: the float model cannot run on it: {ort_message(exc)}") from exc
        try:
            q_vals = list(self.q_sess.run(self.plan.quant_names, dict(sample))) if fresh else self.q_fetch.run(sample)
        except Exception as exc:
            raise ModelError(
                f"ONNX Runtime cannot run it on sample {index}, which the float model runs on: {ort_message(exc)}",
                role="quantized model",
            ) from exc
        return f_vals, q_vals

    def reduce(self, index: int, sample: Mapping[str, np.ndarray]) -> SampleSums:
        """Run both models on the sample (or take the prefetched values) and reduce."""
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == index:
            f_vals, q_vals = pending[1].result()  # its DataError / ModelError is raised here
        else:
            f_vals, q_vals = self._infer(index, sample)
        if self.sample_bytes is None:
            self.sample_bytes = sum(v.nbytes for v in f_vals) + sum(v.nbytes for v in q_vals)
        self._start_queued(index)
        f = dict(zip(self.plan.float_names, f_vals, strict=True))
        q = dict(zip(self.plan.quant_names, q_vals, strict=True))
        return reduce_sample(self.plan, f, q)


class NumpyBackend:
    """Fetch every paired tensor and reduce it in numpy."""

    name = "numpy"

    def open(
        self, float_model: onnx.ModelProto, quant_model: onnx.ModelProto, pairing: Pairing, providers: Sequence[str]
    ) -> NumpyRun:
        """Two augmented sessions (a model ORT cannot load is a :class:`~qdebug.errors.ModelError`)."""
        return NumpyRun(float_model, quant_model, pairing, providers)
