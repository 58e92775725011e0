"""The exact-QDQ floor with one intra-op thread vs ONNX Runtime's default (one per core, spinning): which one the
floor of ``bench_realmodels.py`` is, and how much the choice moves the ratios (issue 12).

Per corpus model: the float and the QDQ session, optimizations off, model outputs only, every sample through
both after two warm-up samples; wall and process CPU time per sample.

Usage::

    .venv/bin/python benchmarks/bench_floor_threads.py --models yolov8n-nudenet ppocrv4-rec ppocrv4-det \\
        vit-s-focus ppocr-cls --samples 16 --work /tmp/qdebug-bench
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def floor(model: str, n: int, work: Path, threads: int | None) -> tuple[float, float]:
    """(wall, CPU) seconds per sample of the floor with ``threads`` intra-op threads (``None``: ORT's default)."""
    import onnx
    import onnxruntime as ort
    from bench_realmodels import prepare

    from qdebug.data import open_data
    from qdebug.model_io import input_specs

    fp, qp, folder = prepare(model, work, n)
    samples = [dict(s) for s in open_data(str(folder), input_specs(onnx.load(str(fp))), num_samples=n)]
    sessions = []
    for path in (fp, qp):
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.log_severity_level = 3
        if threads is not None:
            so.intra_op_num_threads = threads
        sessions.append(ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]))
    for s in samples[:2]:
        for sess in sessions:
            sess.run(None, s)
    t0, c0 = time.perf_counter(), time.process_time()
    for s in samples:
        for sess in sessions:
            sess.run(None, s)
    return (time.perf_counter() - t0) / n, (time.process_time() - c0) / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["yolov8n-nudenet", "ppocrv4-rec", "ppocrv4-det"])
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--work", type=Path, default=Path("/tmp/qdebug-bench"))
    a = ap.parse_args(argv)
    print(f"Machine: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}")
    print(
        "| model | default threads: wall / CPU ms per sample | one thread: wall / CPU ms per sample | default ÷ one |"
    )
    print("|---|---|---|---|")
    for m in a.models:
        dw, dc = floor(m, a.samples, a.work, None)
        ow, oc = floor(m, a.samples, a.work, 1)
        print(
            f"| {m} | {dw * 1e3:.1f} / {dc * 1e3:.1f} | {ow * 1e3:.1f} / {oc * 1e3:.1f} | {dw / ow:.2f} |", flush=True
        )
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
