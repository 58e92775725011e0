"""Scale-out on Ray (issue 16): ``qdebug debug`` on a corpus model in one process vs 1 and 2 Ray workers, and an
extrapolation to 10^5 samples on a 16-node cluster.

All three runs happen in this one process, one after the other, on the same data (the corpus model's realistic
eval inputs, ``--samples`` of them, as a folder of ``.npz`` files of 8 samples that the workers open themselves),
with ``--capture`` (default ``numpy``, the backend that wins on the corpus's large tensors). The local Ray cluster
(127.0.0.1, no dashboard) is started once before the timed runs: its start-up is reported separately, the actors'
start-up (loading both sessions) is inside the timed runs. The machine is shared, so what counts are the **ratios
of runs measured in the same invocation**; each timed run is repeated ``--rounds`` times and the fastest kept.

Usage::

    .venv/bin/python benchmarks/bench_ray.py [--model minilm-l3] [--samples 256] [--workers 1 2] [--rounds 1]
        [--work /tmp/qdebug-bench] [--markdown docs/benchmarks-ray-latest.md]
"""

from __future__ import annotations

import argparse
import os
import pickle
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

#: The extrapolation's cluster: 16 nodes of this many workers (one per core).
NODES = 16
CORES_PER_NODE = (2, 8, 32)
TARGET_SAMPLES = 100_000


def _timed(fp: Path, qp: Path, data: Path, capture: str, cluster: Any) -> tuple[float, Any]:
    from qdebug.debugger import DebugOptions, debug

    t0 = time.perf_counter()
    report = debug(fp, qp, data, DebugOptions(capture=capture, cluster=cluster))
    return time.perf_counter() - t0, report


def worker_alone(fp: Path, qp: Path, data: Path, capture: str, size: int) -> tuple[float, int, int]:
    """Seconds for one :class:`CaptureWorker` (what each Ray actor runs) to open its sessions and reduce every
    sample in this process, without Ray; and the bytes of a shard's result as it travels back (pickled: sums and
    per-sample rows only) of 1 and of ``size`` samples."""
    from qdebug.capture.ray_backend import CaptureWorker, _job
    from qdebug.cluster import plan_shards
    from qdebug.data import open_data, range_reader
    from qdebug.model_io import input_specs, load_model
    from qdebug.pairing import pair_models

    fm, qm = load_model(fp, "float model"), load_model(qp, "quantized model")
    source = open_data(data, input_specs(fm))
    n = len(source)
    job = _job(fm, qm, pair_models(fm, qm), ("CPUExecutionProvider",), capture, n, range_reader(source))
    t0 = time.perf_counter()
    worker = CaptureWorker(job)
    try:
        for a, b in plan_shards(n, max(1, n // size // 4)):  # the shards one actor would get
            worker.shard(a, b)
        seconds = time.perf_counter() - t0
        return seconds, len(pickle.dumps(worker.shard(0, 1))), len(pickle.dumps(worker.shard(0, min(size, n))))
    finally:
        worker.close()


def start_ray(ray: Any, cpus: int) -> float:
    """Start the local cluster (127.0.0.1, no dashboard); its start-up seconds."""
    t0 = time.perf_counter()
    ray.init(
        address="local",
        num_cpus=cpus,
        include_dashboard=False,
        object_store_memory=96 << 20,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )
    return time.perf_counter() - t0


def extrapolation(per_worker: float, efficiency: float, fixed: float, per_sample: float) -> list[str]:
    """Markdown rows: 10^5 samples on 16 nodes, from the measured per-worker rate, the 2-worker efficiency and the
    bytes a shard sends back (a fixed part and a per-sample part); shards as ``plan_shards`` makes them."""
    from qdebug.cluster import plan_shards

    rows = [
        "| nodes × workers | workers | samples/s (est.) | time for 10⁵ samples | shards | bytes back (total) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for cores in CORES_PER_NODE:
        w = NODES * cores
        rate = per_worker * w * efficiency
        shards = len(plan_shards(TARGET_SAMPLES, w))
        total = shards * fixed + TARGET_SAMPLES * per_sample
        rows.append(
            f"| {NODES} × {cores} | {w} | {rate:,.0f} | {TARGET_SAMPLES / rate / 60:,.1f} min | {shards:,} | "
            f"{total / 1e6:,.1f} MB |"
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:  # long: one linear script, measure then print
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="minilm-l3")
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--capture", default="fetch")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--work", default="/tmp/qdebug-bench")
    p.add_argument("--markdown")
    args = p.parse_args(argv)

    import bench_realmodels as br
    import ray

    from qdebug.cluster import SHARDS_PER_WORKER, ClusterSpec

    fp, qp, big = br.prepare(args.model, Path(args.work), args.samples)
    data = br.split(big, args.samples, Path(args.work) / f"ray-{args.model}-{args.samples}")
    n = args.samples
    one = min(_timed(fp, qp, data, args.capture, None)[0] for _ in range(args.rounds))
    per_shard = -(-n // (max(args.workers) * SHARDS_PER_WORKER))
    alone, bytes_1, nbytes = worker_alone(fp, qp, data, args.capture, per_shard)
    per_sample_bytes = (nbytes - bytes_1) / max(1, per_shard - 1)
    fixed_bytes = bytes_1 - per_sample_bytes
    runs: dict[int, float] = {}
    start: float | str
    try:
        start = start_ray(ray, max(args.workers))
    except Exception as exc:  # Ray's start-up timeout is a plain Exception
        start = f"Ray did not start ({str(exc).splitlines()[0]})"
    if isinstance(start, float):
        try:
            for w in args.workers:
                runs[w] = min(_timed(fp, qp, data, args.capture, ClusterSpec(workers=w))[0] for _ in range(args.rounds))
        finally:
            ray.shutdown()
    lines = [
        f"Model `{args.model}`, N={n} samples, capture `{args.capture}`, {platform.machine()} "
        f"{os.cpu_count()} cores (shared with other sessions: compare the ratios). Ray cluster start-up "
        f"(not in the timings): {start if isinstance(start, str) else f'{start:.1f} s'}.",
        "",
        "| run | seconds | samples/s | speedup vs one process |",
        "|---|---:|---:|---:|",
        f"| one process (`debug()`) | {one:.1f} | {n / one:.1f} | 1.00 |",
        f"| one worker's code in this process, no Ray (sessions + {n} samples) | {alone:.1f} | {n / alone:.1f} | "
        f"{one / alone:.2f} |",
    ]
    lines += [f"| {w} Ray worker(s) | {t:.1f} | {n / t:.1f} | {one / t:.2f} |" for w, t in runs.items()]
    w1 = runs.get(1, alone)
    eff = (w1 / runs[2] / 2) if 2 in runs else 1.0
    lines += [
        "",
        f"One shard of {per_shard} samples sends back {nbytes:,} bytes, one of 1 sample {bytes_1:,} bytes (pickled "
        f"sums and per-sample SQNR rows; no tensor): {fixed_bytes:,.0f} bytes per shard + {per_sample_bytes:,.0f} "
        f"per sample. Efficiency used below (2 workers' speedup over 1 worker, / 2): {eff:.2f}"
        + ("" if 2 in runs else " (assumed: no 2-worker run)")
        + ".",
        "",
        *extrapolation(n / w1, eff, fixed_bytes, per_sample_bytes),
    ]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        cmd = "benchmarks/bench_ray.py " + " ".join(sys.argv[1:] if argv is None else argv)
        Path(args.markdown).write_text(f"<!-- {cmd} -->\n{text}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
