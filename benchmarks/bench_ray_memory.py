"""Peak memory of Ray capture workers on a corpus model (issue 12): the same capture in one process and on
``--workers`` local Ray workers, the workers' peak RSS, and the two results compared field by field.

The local run is :func:`qdebug.capture.capture` in this process (its peak: this process's ``VmHWM`` after it, before
Ray starts); the distributed one is :func:`qdebug.capture.ray_backend.capture_distributed` on a local cluster
(127.0.0.1, no dashboard, ``--workers`` CPUs). While it runs, a thread polls ``/proc`` every 0.1 s for the actors'
processes (their title is ``ray::CaptureWorker...``) and keeps each one's ``VmHWM`` — a high-water mark, so a poll
only has to see the process once before it exits; growth after the last poll (< 0.1 s) is missed. A worker's peak
includes its Python, Ray's core worker and both ONNX Runtime sessions (or segments).

Equality: with N ≤ 4 × workers samples every shard holds one sample, and the driver's merge then adds the samples in
the same order as one process: every field must be **bit-identical** (sums included). With more samples per shard
the sums may differ by floating-point association (~1e-16 relative); the other fields must still be identical.

Usage (the quantized model and data folders are those ``bench_realmodels.py --work W`` prepared)::

    nice -n 19 .venv/bin/python benchmarks/bench_ray_memory.py --model vit-s-focus --work /tmp/bpipe --n 8 \\
        [--workers 2] [--capture numpy]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def _status_mb(pid: int | str, key: str) -> float | None:
    """``key`` (``VmHWM``, ``VmRSS``) of process ``pid`` in MB; ``None`` once it has exited."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class WorkerPeaks(threading.Thread):
    """Polls the Ray actor processes of :class:`CaptureWorker` and keeps each one's peak RSS, and the split of the
    largest RSS a poll saw into private memory (``RssAnon``) and mapped files and shared memory (``RssFile``,
    ``RssShmem``: libraries, and Ray's object store, whose pages every worker that reads an object maps)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peaks: dict[int, float] = {}
        self.split: dict[int, tuple[float, float, float, float]] = {}  # pid -> (VmRSS, anon, file, shmem) at max
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            for pid in (p for p in os.listdir("/proc") if p.isdigit()):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as fh:
                        title = fh.read(200)
                except OSError:
                    continue
                if title.startswith(b"ray::CaptureWorker"):
                    hwm = _status_mb(pid, "VmHWM")
                    if hwm is not None:
                        self.peaks[int(pid)] = max(hwm, self.peaks.get(int(pid), 0.0))
                    keys = ("VmRSS", "RssAnon", "RssFile", "RssShmem")
                    now = tuple(_status_mb(pid, k) or 0.0 for k in keys)
                    if now[0] > self.split.get(int(pid), (0.0,))[0]:
                        self.split[int(pid)] = (now[0], now[1], now[2], now[3])


def differences(one: Any, many: Any) -> tuple[int, int, float]:
    """(sums that differ at all, other fields that differ, the largest relative difference among the sums) of two
    ``CaptureResult``."""
    sums, diffs, worst = 0, 0, 0.0
    for name in ("cumulative", "local", "outputs"):
        for a, b in zip(getattr(one, name), getattr(many, name), strict=True):
            if a is None or b is None:
                diffs += (a is None) != (b is None)
                continue
            for f in ("signal", "noise", "count", "max_abs", "nonfinite_reference", "nonfinite_test", "samples"):
                x, y = getattr(a, f), getattr(b, f)
                if x != y and f in ("signal", "noise"):
                    sums += 1
                    worst = max(worst, abs(x - y) / max(abs(x), abs(y)))
                elif x != y:
                    diffs += 1
    for name in ("float_min", "float_max", "elements", "num_samples"):
        diffs += getattr(one, name) != getattr(many, name)
    for name in ("per_sample", "per_sample_outputs"):
        diffs += not np.array_equal(getattr(one, name), getattr(many, name), equal_nan=True)
    return sums, diffs, worst


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--model", default="vit-s-focus")
    p.add_argument("--work", type=Path, default=Path("/tmp/qdebug-bench"))
    p.add_argument("--n", type=int, default=8, help="the data folder n<N> bench_realmodels.py wrote")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--capture", default="fetch")
    args = p.parse_args(argv)

    import bench_ray
    import ray
    from realmodels import registry

    import qdebug
    from qdebug.capture import capture
    from qdebug.capture.ray_backend import capture_distributed
    from qdebug.cluster import Cluster
    from qdebug.data import open_data
    from qdebug.model_io import input_specs, load_model
    from qdebug.pairing import pair_models

    fp = registry.cache_dir() / args.model / f"{args.model}.onnx"
    fm, qm = load_model(fp, "float model"), load_model(args.work / f"{args.model}.qdq.onnx", "quantized model")
    pairing = pair_models(fm, qm)
    source = open_data(args.work / "data" / args.model / f"n{args.n}", input_specs(fm))
    t0 = time.perf_counter()
    one = capture(fm, qm, pairing, source, path=args.capture)
    local_s, local_mb = time.perf_counter() - t0, _status_mb("self", "VmHWM")
    start = bench_ray.start_ray(ray, args.workers)
    peaks = WorkerPeaks()
    peaks.start()
    try:
        t0 = time.perf_counter()
        cluster = Cluster(ray, workers=args.workers, started=False)
        many = capture_distributed(fm, qm, pairing, source, cluster, path=args.capture)
        ray_s = time.perf_counter() - t0
    finally:
        time.sleep(0.3)
        peaks.stop.set()
        peaks.join()
        ray.shutdown()
    sums, diffs, worst = differences(one, many)
    print(f"qdebug {qdebug.__file__}; model {args.model}, N={args.n}, capture {args.capture}, {args.workers} workers")
    print(f"load average at the end: {os.getloadavg()}; Ray start-up {start:.1f} s")
    print(f"local:  {local_s:.1f} s, process peak {local_mb:.0f} MB, segments {one.segments}: {one.segment_note}")
    workers = ", ".join(f"{mb:.0f}" for _, mb in sorted(peaks.peaks.items()))
    print(f"ray:    {ray_s:.1f} s, worker peaks [{workers}] MB, segments {many.segments}: {many.segment_note}")
    for pid, (rss, anon, file, shm) in sorted(peaks.split.items()):
        parts = f"{anon:.0f} private + {file:.0f} files + {shm:.0f} shared"
        print(f"  worker {pid}: largest RSS polled {rss:.0f} MB = {parts}")
    print(f"ray reason: {many.fallback_reason}")
    print(f"sums (signal, noise) that differ: {sums}, largest relative difference {worst:.3g}; other fields: {diffs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
