"""Distributed capture on a Ray cluster: the samples are split into shards (index ranges), each worker (a Ray
actor holding the two ONNX Runtime sessions for the life of the job) reduces its shards with any registered
backend (``auto``, ``graph``, ``fetch``: the same per-sample reduction as one process) through the same sample loop
(:mod:`qdebug.capture.loop`), and the driver merges the shards' :class:`~qdebug.capture.base.CaptureSums` in shard
order.

* **What travels**: the models and a :class:`~qdebug.data.RangeReader` once per worker (each worker reads only its
  own samples: ``.npz`` files reopened there, synthetic samples regenerated from the seed); per shard, its sums
  (per pair: six numbers) and its per-sample SQNR rows. Never a tensor.
* **Same numbers as one process**: every sample is reduced by the same code; the sums of a shard are added in
  sample order and the shards merged in index order, so the report equals the single-process one (counts, minima,
  maxima and per-sample rows exactly, sums up to floating-point association, ~1e-16 relative).
* **Faults**: a worker that dies loses only its shard in flight, which is queued again (first) and taken by
  another worker (the dead one is replaced); a shard is tried at most :data:`~qdebug.cluster.MAX_ATTEMPTS` times.
  A shard's result is merged only when it is complete, so no sample is lost or counted twice. An error *of the data
  or the models* (a :class:`~qdebug.errors.QDebugError` in a worker) is not retried: it is raised here as the same
  one-line error one process gives.
* **Progress**: one callback over all workers (samples done / total), polled from the workers while they run.
* **One sample's memory**: a worker opens its run on its first sample, as one process does, and that sample's input
  shapes decide whether the fetch run is segmented (:mod:`qdebug.capture.segmented`) — by the rule of the cores a
  worker has (:attr:`~qdebug.capture.tuning.CaptureTuning.worker_cpus`: Ray places as many workers on a node as it
  has CPUs, so a worker that overlapped inference and reduction on a second thread would take its neighbour's core),
  made on the driver and shipped with the job. The report's ``meta.capture.segments`` / ``segment_note`` say so as
  in one process.
"""

from __future__ import annotations

import contextlib
import itertools
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

from qdebug.capture import AUTO, FALLBACK_BACKEND, CaptureResult, ProgressFn, canonical_backend, open_run, run_info
from qdebug.capture.base import CaptureSums, ModelPair, OpenOptions, RunInfo
from qdebug.capture.loop import SampleLoop
from qdebug.capture.tuning import CaptureTuning, SegmentRule
from qdebug.cluster import MAX_ATTEMPTS, Cluster, plan_shards
from qdebug.data import DataSource, RangeReader, Sample, range_reader
from qdebug.errors import ClusterError, DataError, ModelError, QDebugError
from qdebug.pairing import Pairing

__all__ = ["CaptureWorker", "ShardResult", "capture_distributed"]


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
    info: RunInfo | None = None  # how the worker's run captured its samples
    failure: Failure | None = None


class CaptureWorker:
    """One worker: the two sessions (opened on its first shard) and the reader of its samples. Wrapped as a Ray
    actor by :func:`capture_distributed`; a plain object otherwise (the tests use it directly too)."""

    def __init__(self, job: Mapping[str, Any]) -> None:
        pairing: Pairing = job["pairing"]
        self.pair = ModelPair(
            onnx.load_from_string(job["float_model"]),
            onnx.load_from_string(job["quant_model"]),
            pairing,
            tuple(job["providers"]),
        )
        self.path: str = job["path"]
        self.batch: int | None = job.get("batch")
        self.expected: int = job["expected"]
        self.reader: RangeReader = job["reader"]
        self.segment_rule: SegmentRule = job["segment_rule"]
        self.tuning: CaptureTuning = job["tuning"]
        self.loop: SampleLoop | None = None
        self.reason: str | None = None  # why the requested backend could not open, if it could not
        self.done = 0  # samples of the current shard reduced so far (polled for progress)
        # Every shard runs on this one thread. Ray runs an actor's calls on its own threads (two here: the progress
        # polls), a shard on either; glibc gives each thread its own heap arena, and one sample's tensors left in
        # two arenas between heap trims raised a worker's peak by a sample's tensors.
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="qdebug-shard")

    def pid(self) -> int:
        """The worker's process id (the fault test kills it)."""
        return os.getpid()

    def progress(self) -> int:
        """Samples of the shard in flight reduced so far."""
        return self.done

    def _open(self, first: Sample | None) -> SampleLoop:
        """The requested backend's run, opened once per worker on its first sample as one process opens it
        (:func:`qdebug.capture.open_run`): that sample's input shapes decide segmenting, by the job's rule."""
        if self.loop is None:
            shapes = {k: tuple(np.shape(v)) for k, v in first.items()} if first is not None else None
            options = OpenOptions(self.expected, shapes, self.segment_rule, self.batch, self.tuning)
            run, self.reason = open_run(self.path, self.pair, options)
            self.loop = SampleLoop(run, self.pair, self.tuning)
        return self.loop

    def shard(self, start: int, stop: int) -> ShardResult:
        """Reduce samples ``[start, stop)`` into fresh sums (on the worker's shard thread)."""
        return self._thread.submit(self._shard, start, stop).result()

    def _shard(self, start: int, stop: int) -> ShardResult:
        """:meth:`shard`, through the one sample loop (:class:`~qdebug.capture.loop.SampleLoop`)."""
        self.done = 0
        pairing = self.pair.pairing
        n_quant = sum(1 for a in pairing.activations if a.quantized)
        sums = CaptureSums(len(pairing.activations), n_quant, len(pairing.outputs))

        def done(_: int) -> None:
            self.done += 1

        try:
            samples: Iterator[tuple[int, Sample]] = self.reader.read(start, stop)
            first = next(samples, None)  # read before the run opens: its shapes size a sample
            loop = self._open(first[1] if first is not None else None)
            loop.reduce_all(itertools.chain([first] if first is not None else [], samples), sums, done)
        except QDebugError as exc:
            return ShardResult(None, failure=Failure.of(exc))
        return ShardResult(sums, run_info(loop.run, self.reason))

    def close(self) -> None:
        """Stop a pipelining run's thread, and the shard thread."""
        if self.loop is not None:
            self.loop.close()
        self._thread.shutdown(wait=True)


class _Pool:
    """The job's actors: started, replaced when one dies (at most once per shard try), killed at the end."""

    def __init__(self, cluster: Cluster, job_ref: Any, job_tuning: CaptureTuning) -> None:
        self.ray = cluster.ray
        cpus = job_tuning.worker_cpus
        self.actor_class = self.ray.remote(num_cpus=cpus, max_concurrency=2, max_restarts=0)(CaptureWorker)
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
    tuning: CaptureTuning | None = None,
) -> dict[str, Any]:
    tuning = tuning or CaptureTuning()
    return {
        "float_model": float_model.SerializeToString(),
        "quant_model": quant_model.SerializeToString(),
        "pairing": pairing,
        "providers": tuple(providers),
        "path": path,
        "expected": expected,
        "reader": reader,
        "batch": batch,
        # the driver's rule, for the cores a worker has
        "segment_rule": SegmentRule.for_cores(tuning.worker_cpus, tuning),
        "tuning": tuning,
    }


class _Scheduler:
    """Hands shards to idle workers, collects results, retries the shards of workers that died."""

    def __init__(
        self, pool: _Pool, shards: list[tuple[int, int]], progress: ProgressFn | None, total: int, poll_s: float
    ) -> None:
        self.pool, self.ray, self.shards, self.poll_s = pool, pool.ray, shards, poll_s
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
            ready, _ = self.ray.wait(list(self.inflight), num_returns=1, timeout=self.poll_s)
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
            done += sum(self.ray.get(polls, timeout=self.poll_s))
        if done != self.reported:
            self.reported = done
            self.progress(done, self.total)


def _choice(results: Mapping[int, ShardResult], workers: int, retried: int) -> tuple[str, str | None]:
    """The backend that ran (the most common among the workers) and why, with the distribution of the job."""
    infos = [r.info for r in results.values() if r.info is not None]
    backends = Counter(i.backend for i in infos if i.backend)
    used = backends.most_common(1)[0][0] if backends else FALLBACK_BACKEND
    reasons = list(dict.fromkeys(i.reason for i in infos if i.reason))
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
    segs = [(i.segments, i.segment_note) for s in sorted(results) if (i := results[s].info) is not None]
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
    tuning: CaptureTuning | None = None,
) -> CaptureResult:
    """:func:`qdebug.capture.capture` on ``cluster``'s workers (see the module doc); the same result."""
    tuning = tuning or CaptureTuning()
    n_total = len(data)
    reader = range_reader(data)
    shards = plan_shards(n_total, cluster.workers, tuning.shards_per_worker)
    expected = math.ceil(n_total / cluster.workers)
    job = _job(float_model, quant_model, pairing, providers, path, expected, reader, batch, tuning)
    pool = _Pool(cluster, cluster.ray.put(job), tuning)
    scheduler = _Scheduler(pool, shards, progress, n_total, tuning.poll_s)
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
    sizes = [(i.batch, i.batch_reason) for r in results.values() if (i := r.info) is not None]
    batch_used = max((b for b, _ in sizes), default=1)
    why = next((why for _, why in sizes if why), None)
    segments, note = _segmenting(results)
    info = RunInfo(used, reason, batch_used, why, segments, note)
    return CaptureResult.of(total, pairing, canonical_backend(path), info)
