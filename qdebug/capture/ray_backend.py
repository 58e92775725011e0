"""Distributed capture on a Ray cluster: the samples are split into shards (index ranges), each worker (a Ray
actor holding the two ONNX Runtime sessions for the life of the job) reduces its shards with any registered
backend (``auto``, ``graph``, ``numpy``: the same per-sample reduction as one process), and the driver merges the
shards' :class:`~qdebug.capture.base.CaptureSums` in shard order.

* **What travels**: the models and a :class:`~qdebug.data.RangeReader` once per worker (each worker reads only its
  own samples: ``.npz`` files reopened there, synthetic samples regenerated from the seed); per shard, its sums
  (per pair: six numbers) and its per-sample SQNR rows. Never a tensor.
* **Same numbers as one process**: every sample is reduced by the same code; the sums of a shard are added in
  sample order and the shards merged in index order, so the report equals the single-process one (counts, minima,
  maxima and per-sample rows exactly, sums up to floating-point association, ~1e-16 relative).
* **Faults**: a worker that dies loses only its shard in flight, which is queued again (first) and taken by
  another worker (the dead one is replaced); a shard is tried at most :data:`MAX_ATTEMPTS` times. A shard's result
  is merged only when it is complete, so no sample is lost or counted twice. An error *of the data or the models*
  (a :class:`~qdebug.errors.QDebugError` in a worker) is not retried: it is raised here as the same one-line error
  one process gives.
* **Progress**: one callback over all workers (samples done / total), polled from the workers while they run.
* **One sample's memory**: a worker opens its run on its first sample, as one process does, and that sample's input
  shapes decide whether the numpy run is segmented (:mod:`qdebug.capture.segmented`) — by the rule of the one core
  a worker has (:data:`WORKER_CPUS`), made on the driver and shipped with the job. The report's
  ``meta.capture.segments`` / ``segment_note`` say so as in one process.
"""

from __future__ import annotations

import contextlib
import math
import os
import uuid
from collections import Counter, deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from qdebug.capture import (
    AUTO,
    FALLBACK_BACKEND,
    CaptureResult,
    ProgressFn,
    batching_of,
    open_run,
    segmenting_of,
)
from qdebug.capture.auto import AutoRun
from qdebug.capture.base import CaptureRun, CaptureSums, Fallback, SampleSums, get_backend
from qdebug.capture.segmented import SegmentRule
from qdebug.cluster import Cluster
from qdebug.data import DataSource, RangeReader, Sample, range_reader
from qdebug.errors import ClusterError, DataError, ModelError, QDebugError
from qdebug.pairing import Pairing

__all__ = ["MAX_ATTEMPTS", "WORKER_CPUS", "CaptureWorker", "ShardResult", "capture_distributed", "plan_shards"]

#: Tries of one shard (the first included) before the job fails: a worker that dies on every try of the same
#: shard (out of memory on a huge sample, say) is not a passing fault.
MAX_ATTEMPTS = 3
#: Shards per worker: enough that a fast worker takes over a slow one's share and a lost shard is a small loss,
#: few enough that the per-shard round trip (milliseconds) stays negligible.
SHARDS_PER_WORKER = 4
#: Seconds between two progress polls of the workers.
POLL_S = 0.5
#: CPUs Ray reserves for each worker, and so the cores its run may use: Ray places as many workers on a node as it
#: has CPUs, so a worker that overlapped inference and reduction on a second thread would take its neighbour's
#: core (one core gains nothing from pipelining: docs/benchmarks.md). Its run therefore follows the one-core rule
#: (:meth:`SegmentRule.for_cores`): not pipelined, segmented above ``SEGMENT_ABOVE`` (512 MB) — not the 160 MB of
#: two cores, which exists to overlap segments, a speed reason a one-core worker does not have — whatever
#: ``os.sched_getaffinity`` says (Ray does not pin workers to cores).
WORKER_CPUS = 1


def plan_shards(samples: int, workers: int) -> list[tuple[int, int]]:
    """Contiguous index ranges ``[start, stop)`` covering ``range(samples)``, about :data:`SHARDS_PER_WORKER` per
    worker."""
    size = max(1, math.ceil(samples / (workers * SHARDS_PER_WORKER)))
    return [(s, min(s + size, samples)) for s in range(0, samples, size)]


@dataclass(frozen=True)
class Failure:
    """A :class:`QDebugError` raised in a worker, carried back as data (it is not retried)."""

    kind: type[QDebugError]
    message: str
    role: str | None = None

    @classmethod
    def of(cls, exc: QDebugError) -> Failure:
        """The failure of ``exc``."""
        if isinstance(exc, ModelError):
            return cls(type(exc), exc.reason, exc.role)
        return cls(type(exc), str(exc))

    def error(self) -> QDebugError:
        """The same exception as the worker's (class, message, role)."""
        if issubclass(self.kind, ModelError):
            return self.kind(self.message, role=self.role)
        exc = self.kind.__new__(self.kind)
        Exception.__init__(exc, self.message)
        return exc


@dataclass(frozen=True)
class ShardResult:
    """What a worker returns for one shard: its sums and the backend its run settled on, or its failure."""

    sums: CaptureSums | None
    backend: str | None = None
    reason: str | None = None
    failure: Failure | None = None
    batch: tuple[int, str | None] = (1, None)  # the most samples one inference call took, why not more
    segments: tuple[int, str | None] = (1, None)  # segments each sample ran in, and why (or why not)


class CaptureWorker:
    """One worker: the two sessions (opened on its first shard) and the reader of its samples. Wrapped as a Ray
    actor by :func:`capture_distributed`; a plain object otherwise (the tests use it directly too)."""

    def __init__(self, job: Mapping[str, Any]) -> None:
        self.float_model = onnx.load_from_string(job["float_model"])
        self.quant_model = onnx.load_from_string(job["quant_model"])
        self.pairing: Pairing = job["pairing"]
        self.providers: tuple[str, ...] = tuple(job["providers"])
        self.path: str = job["path"]
        self.batch: int | None = job.get("batch")
        self.expected: int = job["expected"]
        self.reader: RangeReader = job["reader"]
        self.segment_rule: SegmentRule = job["segment_rule"]
        self.run: CaptureRun | None = None
        self.fallback: CaptureRun | None = None
        self.backend: str = self.path
        self.reason: str | None = None
        self.done = 0  # samples of the current shard reduced so far (polled for progress)
        # Every shard runs on this one thread. Ray runs an actor's calls on its own threads (two here: the progress
        # polls), a shard on either; glibc gives each thread its own heap arena, and one sample's tensors left in
        # two arenas between heap trims made ViT-S's worker peak 942 MB instead of 739 (in-process, 1-sample shards).
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="qdebug-shard")

    def pid(self) -> int:
        """The worker's process id (the fault test kills it)."""
        return os.getpid()

    def progress(self) -> int:
        """Samples of the shard in flight reduced so far."""
        return self.done

    def _pair(self) -> tuple[onnx.ModelProto, onnx.ModelProto, Pairing, Sequence[str]]:
        return self.float_model, self.quant_model, self.pairing, self.providers

    def _open(self, first: Sample | None) -> CaptureRun:
        """The requested backend's run, opened once per worker on its first sample as one process opens it
        (:func:`qdebug.capture.open_run`): that sample's input shapes decide segmenting, by the job's rule."""
        if self.run is None:
            shapes = {k: tuple(np.shape(v)) for k, v in first.items()} if first is not None else None
            self.run, self.backend, self.reason = open_run(
                self.path, *self._pair(), self.expected, self.batch, shapes, self.segment_rule
            )
            if isinstance(self.run, AutoRun):  # auto's numpy run is already open: it redoes the fallbacks too
                self.fallback = self.run.numpy
        return self.run

    def _reduce(self, run: CaptureRun, index: int, sample: Sample, sums: CaptureSums) -> SampleSums:
        res = run.reduce(index, sample)
        if isinstance(res, Fallback):
            sums.fallbacks[res.reason] += 1
            self.fallback = self.fallback or get_backend(FALLBACK_BACKEND).open(*self._pair())
            res = self.fallback.reduce(index, sample)
            assert isinstance(res, SampleSums), "the fallback backend reduces every sample or raises"
        return res

    def shard(self, start: int, stop: int) -> ShardResult:
        """Reduce samples ``[start, stop)`` into fresh sums (on the worker's shard thread)."""
        return self._thread.submit(self._shard, start, stop).result()

    def _shard(self, start: int, stop: int) -> ShardResult:
        """:meth:`shard`; samples are read ahead as far as the run's ``lookahead`` asks and announced to its
        ``prefetch`` (pipelining, batching), as one process does."""
        self.done = 0
        pairing = self.pairing
        n_quant = sum(1 for a in pairing.activations if a.quantized)
        sums = CaptureSums(len(pairing.activations), n_quant, len(pairing.outputs))
        try:
            samples: Iterator[tuple[int, Sample]] = self.reader.read(start, stop)
            ahead: deque[tuple[int, Sample]] = deque()
            first = next(samples, None)
            if first is not None:
                ahead.append(first)
            run = self._open(first[1] if first is not None else None)  # read first: its shapes size a sample
            prefetch = getattr(run, "prefetch", None)
            while ahead:
                index, sample = ahead.popleft()
                want = 1 + (getattr(run, "lookahead", 1) if prefetch is not None else 0)
                while len(ahead) < want and (item := next(samples, None)) is not None:
                    ahead.append(item)
                    if prefetch is not None:  # every sample read now comes after the current one
                        prefetch(*item)
                sums.add(index, self._reduce(run, index, sample, sums))
                self.done += 1
        except QDebugError as exc:
            return ShardResult(None, failure=Failure.of(exc))
        if isinstance(self.run, AutoRun):
            self.backend, self.reason = self.run.final().backend, self.run.final().reason
        batching = batching_of(self.run, self.backend) if self.run is not None else (1, None)
        segments = segmenting_of(self.run, self.backend) if self.run is not None else (1, None)
        return ShardResult(sums, self.backend, self.reason, batch=batching, segments=segments)

    def close(self) -> None:
        """Stop a pipelining run's thread, and the shard thread."""
        for r in (self.run, self.fallback):
            close = getattr(r, "close", None)
            if close is not None:
                close()
        self._thread.shutdown(wait=True)


class _Pool:
    """The job's actors: started, replaced when one dies (at most once per shard try), killed at the end."""

    def __init__(self, cluster: Cluster, job_ref: Any) -> None:
        self.ray = cluster.ray
        self.actor_class = self.ray.remote(num_cpus=WORKER_CPUS, max_concurrency=2, max_restarts=0)(CaptureWorker)
        self.job_ref = job_ref
        self.prefix = f"qdebug-capture-{uuid.uuid4().hex[:8]}"  # named: `ray list actors` says whose they are
        self.all: list[Any] = []
        self.idle: deque[Any] = deque()
        for _ in range(cluster.workers):
            self.add()

    def add(self) -> None:
        actor = self.actor_class.options(name=f"{self.prefix}-{len(self.all)}").remote(self.job_ref)
        self.all.append(actor)
        self.idle.append(actor)

    def replace(self, dead: Any) -> None:
        self.ray.kill(dead, no_restart=True)
        self.add()

    def shutdown(self) -> None:
        for actor in self.all:
            self.ray.kill(actor, no_restart=True)


def _job(
    float_model: onnx.ModelProto,
    quant_model: onnx.ModelProto,
    pairing: Pairing,
    providers: Sequence[str],
    path: str,
    expected: int,
    reader: RangeReader,
    batch: int | None = None,
) -> dict[str, Any]:
    return {
        "float_model": float_model.SerializeToString(),
        "quant_model": quant_model.SerializeToString(),
        "pairing": pairing,
        "providers": tuple(providers),
        "path": path,
        "expected": expected,
        "reader": reader,
        "batch": batch,
        # the driver's rule (its constants as they are now), for the one core a worker has
        "segment_rule": SegmentRule.for_cores(WORKER_CPUS),
    }


class _Scheduler:
    """Hands shards to idle workers, collects results, retries the shards of workers that died."""

    def __init__(self, pool: _Pool, shards: list[tuple[int, int]], progress: ProgressFn | None, total: int) -> None:
        self.pool, self.ray, self.shards = pool, pool.ray, shards
        self.queue: deque[int] = deque(range(len(shards)))
        self.attempts: Counter[int] = Counter()
        self.inflight: dict[Any, tuple[Any, int]] = {}
        self.results: dict[int, ShardResult] = {}
        self.progress, self.total, self.reported = progress, total, -1
        self.retried = 0

    def run(self) -> dict[int, ShardResult]:
        while self.queue or self.inflight:
            while self.queue and self.pool.idle:
                actor, s = self.pool.idle.popleft(), self.queue.popleft()
                self.attempts[s] += 1
                self.inflight[actor.shard.remote(*self.shards[s])] = (actor, s)
            ready, _ = self.ray.wait(list(self.inflight), num_returns=1, timeout=POLL_S)
            for ref in ready:
                self._collect(ref)
            self._report()
        return self.results

    def _collect(self, ref: Any) -> None:
        actor, s = self.inflight.pop(ref)
        try:
            res: ShardResult = self.ray.get(ref)
        except self.ray.exceptions.RayError as exc:  # the worker died (killed, out of memory, its node lost)
            if self.attempts[s] >= MAX_ATTEMPTS:
                start, stop = self.shards[s]
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise ClusterError(f"samples {start}-{stop - 1} failed {MAX_ATTEMPTS} times; last: {first}") from exc
            self.retried += 1
            self.queue.appendleft(s)  # first in line, for another worker
            self.pool.replace(actor)
            return
        if res.failure is not None:
            raise res.failure.error()
        self.results[s] = res
        self.pool.idle.append(actor)

    def _report(self) -> None:
        if self.progress is None:
            return
        done = sum(self.shards[s][1] - self.shards[s][0] for s in self.results)
        polls = [actor.progress.remote() for actor, _ in self.inflight.values()]
        # a worker that just died or is still starting is counted by the next poll
        with contextlib.suppress(self.ray.exceptions.RayError):
            done += sum(self.ray.get(polls, timeout=POLL_S))
        if done != self.reported:
            self.reported = done
            self.progress(done, self.total)


def _choice(results: Mapping[int, ShardResult], workers: int, retried: int) -> tuple[str, str | None]:
    """The backend that ran (the most common among the workers) and why, with the distribution of the job."""
    backends = Counter(r.backend for r in results.values() if r.backend)
    used = backends.most_common(1)[0][0] if backends else FALLBACK_BACKEND
    reasons = list(dict.fromkeys(r.reason for r in results.values() if r.reason))
    parts = [f"{len(results)} shard(s) on {workers} Ray worker(s)"]
    if len(backends) > 1:
        parts.append(", ".join(f"{b} on {n} shard(s)" for b, n in sorted(backends.items())))
    if retried:
        parts.append(f"{retried} shard(s) retried after a worker died")
    if reasons:
        parts.append(reasons[0])
    return used, "; ".join(parts)


def _segmenting(results: Mapping[int, ShardResult]) -> tuple[int, str | None]:
    """The most segments a worker ran each sample in, and why; each worker decides on its own first sample, so they
    differ only if those samples' shapes did (then: on how many shards)."""
    segs = [results[s].segments for s in sorted(results)]
    count = max((c for c, _ in segs), default=1)
    note = next((why for c, why in segs if c == count and why), None)
    others = sum(1 for c, _ in segs if c != count)
    if note is not None and others:
        note += f" (on {len(segs) - others} of {len(segs)} shards)"
    return count, note


def capture_distributed(
    float_model: onnx.ModelProto,
    quant_model: onnx.ModelProto,
    pairing: Pairing,
    data: DataSource,
    cluster: Cluster,
    providers: Sequence[str] = ("CPUExecutionProvider",),
    progress: ProgressFn | None = None,
    path: str = AUTO,
    batch: int | None = None,
) -> CaptureResult:
    """:func:`qdebug.capture.capture` on ``cluster``'s workers (see the module doc); the same result."""
    n_total = len(data)
    reader = range_reader(data)
    shards = plan_shards(n_total, cluster.workers)
    expected = math.ceil(n_total / cluster.workers)
    job_ref = cluster.ray.put(_job(float_model, quant_model, pairing, providers, path, expected, reader, batch))
    pool = _Pool(cluster, job_ref)
    scheduler = _Scheduler(pool, shards, progress, n_total)
    try:
        results = scheduler.run()
    except DataError as exc:  # a worker sees one sample: name where it came from, as one process does
        raise DataError(f"{data.description}: {exc}") from exc
    finally:
        pool.shutdown()  # Ctrl-C included: the job's actors never outlive it
    n_quant = sum(1 for a in pairing.activations if a.quantized)
    total = CaptureSums(len(pairing.activations), n_quant, len(pairing.outputs))
    for s in sorted(results):  # a fixed order: the report does not depend on which worker finished first
        sums = results[s].sums
        assert sums is not None
        total.merge(sums)
    if total.samples != n_total:  # every shard merged exactly once: anything else is a bug, never a silent loss
        raise ClusterError(f"{total.samples} of {n_total} samples came back from the workers")
    used, reason = _choice(results, cluster.workers, scheduler.retried)
    sizes = [r.batch for r in results.values()]
    batching = (max(b for b, _ in sizes), next((why for _, why in sizes if why), None))
    return CaptureResult.of(total, pairing, path, used, reason, batching, _segmenting(results))
