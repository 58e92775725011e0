"""Where one sample's numpy capture spends its CPU, against the floor's, in **thread CPU time** (issue 12).

Wall time on a machine shared with other work says more about the other work than about qdebug; the CPU time of
the thread that does the work (``time.thread_time``) barely moves with load. Per corpus model, each on the same
samples, best of ``--repeats`` passes:

* ``floor``: the float and the QDQ session (optimizations off), model outputs only — what exact QDQ needs;
* ``exposed``: the same two runs with every tensor the reduction needs as an extra output (the numpy backend's
  inference; fresh output arrays, as when pipelined);
* ``bound``: the same with ONNX Runtime writing into the previous sample's arrays (I/O binding, as when not pipelined);
* ``reduce``: :func:`qdebug.capture.kernels.reference.reduce_sample` on already fetched tensors;
* ``compiled``: :func:`qdebug.capture.compiled.reduce_sample_compiled` on the same tensors (numba; its one-off
  compile or cache load happens in the warm-up pass, outside the timing);
* ``bound+cached``: ``bound`` followed by the compiled reduction of those bound arrays with its call tables kept
  from sample to sample (:meth:`~qdebug.capture.compiled.CompiledReducer.cached`, what a whole-model run does):
  the whole sequential sample, to compare with ``bound`` + ``compiled``.

Pipelined, the next sample's inference (``exposed``, on a worker thread) overlaps this one's ``reduce``, so the
per-sample cost is about ``max(exposed, reduce)``: when ``reduce`` alone is more than 1.5× ``floor``, no scheduling
of numpy reductions meets the issue's per-sample goal on that model.

Usage::

    .venv/bin/python benchmarks/profile_reduce.py --work /tmp/qdebug-bench [--models silero-vad ppocr-cls]

``--work`` holds the quantized models ``bench_realmodels.py`` writes (``<model>.qdq.onnx``; quantized here if missing).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def _best_ms(
    fn: Callable[[Mapping[str, np.ndarray]], Any], samples: list[dict[str, np.ndarray]], repeats: int
) -> float:
    """Best per-sample thread CPU time of ``fn`` over ``repeats`` passes (after one warm-up pass), in ms."""
    for s in samples:
        fn(s)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time()
        for s in samples:
            fn(s)
        best = min(best, (time.thread_time() - t0) / len(samples))
    return best * 1e3


def _session(model: Any) -> Any:
    """Optimizations off (exact QDQ), and one intra-op thread: ``thread_time`` counts the calling thread only, so
    work on ORT's own pool would not be counted."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def profile(model: str, work: Path, n: int, repeats: int) -> dict[str, float]:
    """The per-sample CPU times of one corpus model (ms)."""
    import onnx
    from bench_realmodels import prepare

    from qdebug.capture.bound import BoundFetch
    from qdebug.capture.compiled import reduce_sample_compiled
    from qdebug.capture.kernels.reference import ReductionPlan, reduce_sample
    from qdebug.data import open_data
    from qdebug.model_io import input_specs
    from qdebug.ort import expose_outputs
    from qdebug.pairing import pair_models

    fp, qp, big = prepare(model, work, n)
    fm, qm = onnx.load(str(fp)), onnx.load(str(qp))
    plan = ReductionPlan.of(pair_models(fm, qm))
    samples = [dict(s) for s in open_data(str(big), input_specs(fm), num_samples=n)]
    fs, qs = _session(fm), _session(qm)
    fe, qe = _session(expose_outputs(fm, plan.float_names)), _session(expose_outputs(qm, plan.quant_names))
    fb, qb = BoundFetch(fe, plan.float_names), BoundFetch(qe, plan.quant_names)
    fb.usable = qb.usable = True
    fn_, qn_ = list(plan.float_names), list(plan.quant_names)
    vals = [(dict(zip(fn_, fe.run(fn_, s), strict=True)), dict(zip(qn_, qe.run(qn_, s), strict=True))) for s in samples]
    it, it2 = iter(vals * (repeats + 1)), iter(vals * (repeats + 1))
    cached = reduce_sample_compiled.cached()

    def bound_cached(s: Mapping[str, np.ndarray]) -> None:
        f, q = fb.run(s), qb.run(s)
        cached(plan, dict(zip(fn_, f, strict=True)), dict(zip(qn_, q, strict=True)))

    return {
        "floor": _best_ms(lambda s: (fs.run(None, s), qs.run(None, s)), samples, repeats),
        "exposed": _best_ms(lambda s: (fe.run(fn_, s), qe.run(qn_, s)), samples, repeats),
        "bound": _best_ms(lambda s: (fb.run(s), qb.run(s)), samples, repeats),
        "reduce": _best_ms(lambda _s: reduce_sample(plan, *next(it)), samples, repeats),
        "compiled": _best_ms(lambda _s: reduce_sample_compiled(plan, *next(it2)), samples, repeats),
        "bound+cached": _best_ms(bound_cached, samples, repeats),
        "elements": float(sum(v.size for v in vals[0][0].values()) + sum(v.size for v in vals[0][1].values())),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["silero-vad", "ppocr-cls", "yolov8n-nudenet"])
    ap.add_argument("--work", type=Path, default=Path("/tmp/qdebug-bench"))
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f}; per-sample thread CPU ms (ratio to floor)")
    print("| model | elements/sample | floor | exposed | bound | reduce | compiled | bound+cached |")
    print("|---|---|---|---|---|---|---|---|")
    for m in a.models:
        r = profile(m, a.work, a.samples, a.repeats)
        keys = ("exposed", "bound", "reduce", "compiled", "bound+cached")
        cells = [f"{r[k]:.2f} ({r[k] / r['floor']:.2f}×)" for k in keys]
        print(f"| {m} | {int(r['elements']):,} | {r['floor']:.2f} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
