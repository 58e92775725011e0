"""Where does ``qdebug.debugger`` spend its time? ORT variants, an instrumented run, prototypes, cProfile.

1. **ORT variants**, per sample, float and quantized model, in interleaved rounds (background load hits
   every variant alike), each against the ``DISABLE_ALL + outputs`` values qdebug captures today:

   * ``plain``: default options (``ORT_ENABLE_ALL``), no extra outputs — the benchmark's baseline;
   * ``DISABLE_ALL``: the QDQ graph evaluated as written, with and without qdebug's extra outputs;
   * ``ENABLE_BASIC`` / ``ENABLE_ALL`` with the extra outputs, and ``ENABLE_ALL`` with the session config
     entry ``session.disable_quant_qdq=1`` (no QDQ fusion, every other optimization on).

2. **Instrumented ``qdebug.debugger``**: the same call with ``InferenceSession.run``, ``capture.make_session``
   and ``capture.reduce_pair`` wrapped in timers, so the wall time splits into ORT runs, session creation,
   ``reduce_pair`` and the rest (capture-loop bookkeeping, clips, min/max, pairing, weights, report).

3. **Prototype**: one batched ``np.add.reduceat`` pass over all of a sample's tensors vs one
   ``reduce_pair`` call per tensor (a measurement for a suggested change, not qdebug code).

4. **Prototype**: both models merged into one ORT graph (``f/`` and ``q/`` prefixes) that reduces every
   pair in-graph (Sub, ReduceSumSquare, ReduceMax/Min, qdebug's clips) to one vector of sums per sample,
   timed against plain and today's capture, with the largest cumulative-SQNR gap to ``qdebug.debugger``'s report.

5. **cProfile** of one ``qdebug.debugger`` call, sorted by own time.

Usage::

    .venv/bin/python benchmarks/profile_debug.py [--model synthetic_convnet|NAME|PATH.onnx] [--samples 64]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

import qdebug
import qdebug.capture as qcapture
from qdebug.data import Sample, SyntheticData
from qdebug.metrics import reduce_pair
from qdebug.model_io import input_specs
from qdebug.ort import expose_outputs
from qdebug.pairing import pair_models

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_debug import prepare_model

PLAIN = "plain: ENABLE_ALL, no extra outputs"
TODAY = "DISABLE_ALL + outputs (qdebug today)"


def _session(
    model: onnx.ModelProto, level: ort.GraphOptimizationLevel, config: dict[str, str] | None = None
) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.log_severity_level = 3
    for k, v in (config or {}).items():
        so.add_session_config_entry(k, v)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _per_sample_s(sess: ort.InferenceSession, names: list[str] | None, samples: Sequence[Sample]) -> float:
    t = time.perf_counter()
    for s in samples:
        sess.run(names, s)
    return (time.perf_counter() - t) / len(samples)


def _max_diff(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    return max((float(np.max(np.abs(x - y))) if x.size else 0.0) for x, y in zip(a, b, strict=True))


def _captured_names(fm: onnx.ModelProto, qm: onnx.ModelProto) -> tuple[list[str], list[str]]:
    """The float and quantized tensor names ``qdebug.capture`` requests (same rule as capture())."""
    pairing = pair_models(fm, qm)
    acts, outs = pairing.activations, pairing.outputs
    f_names = list(dict.fromkeys([a.tensor_name for a in acts] + [o.output_name for o in outs]))
    q_names = list(
        dict.fromkeys(
            [a.pre_qdq for a in acts if a.quantized] + [a.post_qdq for a in acts] + [o.quant_name for o in outs]
        )
    )
    return f_names, q_names


def ort_variants(
    fm: onnx.ModelProto, qm: onnx.ModelProto, samples: Sequence[Sample], rounds: int
) -> tuple[list[str], list[tuple[list[np.ndarray], list[np.ndarray]]]]:
    """Section 1; also returns the captured (float, quant) tensors of every sample for section 3."""
    f_names, q_names = _captured_names(fm, qm)
    lv = ort.GraphOptimizationLevel
    fx, qx = expose_outputs(fm, f_names), expose_outputs(qm, q_names)
    no_fusion = {"session.disable_quant_qdq": "1"}
    # name -> (float session, quant session, with qdebug's extra outputs)
    variants: dict[str, tuple[Any, Any, bool]] = {
        PLAIN: (_session(fm, lv.ORT_ENABLE_ALL), _session(qm, lv.ORT_ENABLE_ALL), False),
        "DISABLE_ALL, no extra outputs": (
            _session(fm, lv.ORT_DISABLE_ALL),
            _session(qm, lv.ORT_DISABLE_ALL),
            False,
        ),
        TODAY: (_session(fx, lv.ORT_DISABLE_ALL), _session(qx, lv.ORT_DISABLE_ALL), True),
        "ENABLE_BASIC + outputs": (
            _session(fx, lv.ORT_ENABLE_BASIC),
            _session(qx, lv.ORT_ENABLE_BASIC),
            True,
        ),
        "ENABLE_ALL + outputs": (_session(fx, lv.ORT_ENABLE_ALL), _session(qx, lv.ORT_ENABLE_ALL), True),
        "ENABLE_ALL + outputs + disable_quant_qdq": (
            _session(fx, lv.ORT_ENABLE_ALL, no_fusion),
            _session(qx, lv.ORT_ENABLE_ALL, no_fusion),
            True,
        ),
    }
    ref_fs, ref_qs, _ = variants[TODAY]
    captured = [(ref_fs.run(f_names, s), ref_qs.run(q_names, s)) for s in samples]
    diffs: dict[str, str] = {}
    for name, (fs, qs, extra) in variants.items():
        if extra and name != TODAY:
            k = min(len(samples), 8)
            df = max(_max_diff(captured[i][0], fs.run(f_names, samples[i])) for i in range(k))
            dq = max(_max_diff(captured[i][1], qs.run(q_names, samples[i])) for i in range(k))
            diffs[name] = f"max |Δ| vs today: float {df:.2g}, quant {dq:.2g}"
    best: dict[str, tuple[float, float]] = {}
    for _ in range(rounds):
        for name, (fs, qs, extra) in variants.items():
            tf = _per_sample_s(fs, f_names if extra else None, samples)
            tq = _per_sample_s(qs, q_names if extra else None, samples)
            old = best.get(name, (np.inf, np.inf))
            best[name] = (min(old[0], tf), min(old[1], tq))
    mib = (sum(a.nbytes for a in captured[0][0]) + sum(a.nbytes for a in captured[0][1])) / 2**20
    lines = [
        f"[1] ORT per sample, best of {rounds} interleaved rounds over {len(samples)} samples "
        f"({len(f_names)} float + {len(q_names)} quantized tensors captured, {mib:.1f} MiB per sample; "
        f"ORT default threads on {os.cpu_count()} cores)",
        f"  {'variant':<42} {'float ms':>8} {'quant ms':>8} {'total ms':>8}  ÷ plain",
    ]
    base = sum(best[PLAIN])
    for name, (tf, tq) in best.items():
        note = f"  [{diffs[name]}]" if name in diffs else ""
        lines.append(
            f"  {name:<42} {tf * 1e3:8.3f} {tq * 1e3:8.3f} {(tf + tq) * 1e3:8.3f}  {(tf + tq) / base:5.2f}×{note}"
        )
    return lines, captured


@contextmanager
def _timers(acc: dict[str, float]) -> Iterator[None]:
    """Wrap ORT ``run``, ``qdebug.capture.make_session`` and ``qdebug.capture.reduce_pair`` in timers."""

    def timed(key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[key] = acc.get(key, 0.0) + time.perf_counter() - t
                acc[key + " calls"] = acc.get(key + " calls", 0) + 1

        return wrapper

    saved = [(ort.InferenceSession, "run", ort.InferenceSession.run)]
    for name in ("make_session", "reduce_pair"):
        if hasattr(qcapture, name):
            saved.append((qcapture, name, getattr(qcapture, name)))
    try:
        for owner, name, fn in saved:
            setattr(owner, name, timed({"run": "ORT run", "make_session": "sessions"}.get(name, name), fn))
        yield
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def instrumented(float_path: Path, quant_path: Path, arrays: dict[str, np.ndarray], rounds: int) -> list[str]:
    """Section 2: best-of-``rounds`` split of one ``qdebug.debugger`` call."""
    n = len(next(iter(arrays.values())))
    best: dict[str, float] | None = None
    for _ in range(rounds):
        acc: dict[str, float] = {}
        with _timers(acc):
            t = time.perf_counter()
            qdebug.debug(float_path, quant_path, arrays, qdebug.DebugOptions(num_samples=n))
            acc["total"] = time.perf_counter() - t
        if best is None or acc["total"] < best["total"]:
            best = acc
    assert best is not None
    total = best["total"]
    parts = {k: v for k, v in best.items() if not k.endswith(" calls") and k != "total"}
    rest = total - sum(parts.values())
    lines = [f"[2] qdebug.debug, N={n}, best of {rounds}: {total:.3f} s ({total / n * 1e3:.2f} ms per sample)"]
    for k, v in [*parts.items(), ("rest (loop bookkeeping, clips, min/max, pairing, weights, report)", rest)]:
        calls = best.get(k + " calls")
        per = f", {int(calls)} calls, {v / calls * 1e6:.1f} µs each" if calls else ""
        lines.append(f"  {k:<66} {v:7.3f} s  {v / total:6.1%}{per}")
    return lines


def reduce_batched(refs: Sequence[np.ndarray], tests: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    """Prototype: Σx², Σ(x−y)² (float64 accumulation) and max|x−y| of many pairs in one numpy pass each."""
    sizes = np.fromiter((r.size for r in refs), dtype=np.int64, count=len(refs))
    offsets = np.zeros(len(refs), dtype=np.int64)
    np.cumsum(sizes[:-1], out=offsets[1:])
    x = np.concatenate([np.ravel(r) for r in refs]).astype(np.float32, copy=False)
    y = np.concatenate([np.ravel(t) for t in tests]).astype(np.float32, copy=False)
    d = x - y
    signal = np.add.reduceat(np.square(x), offsets, dtype=np.float64)
    noise = np.add.reduceat(np.square(d), offsets, dtype=np.float64)
    max_abs = np.maximum.reduceat(np.abs(d), offsets)
    return signal, noise, max_abs


def prototype(
    fm: onnx.ModelProto, qm: onnx.ModelProto, captured: Sequence[tuple[list[np.ndarray], list[np.ndarray]]]
) -> list[str]:
    """Section 3: per-tensor ``reduce_pair`` vs the batched prototype on the cumulative pairs."""
    pairing = pair_models(fm, qm)
    f_names, q_names = _captured_names(fm, qm)
    fi = {nm: i for i, nm in enumerate(f_names)}
    qi = {nm: i for i, nm in enumerate(q_names)}
    pairs = [
        (
            [f[fi[a.tensor_name]] for a in pairing.activations],
            [q[qi[a.post_qdq]] for a in pairing.activations],
        )
        for f, q in captured
    ]
    small = 16384

    def loop() -> None:
        for refs, tests in pairs:
            for r, t in zip(refs, tests, strict=True):
                reduce_pair(r, t)

    def batched() -> None:
        for refs, tests in pairs:
            reduce_batched(refs, tests)

    def hybrid() -> None:
        for refs, tests in pairs:
            lo = [i for i, r in enumerate(refs) if r.size <= small]
            if lo:
                reduce_batched([refs[i] for i in lo], [tests[i] for i in lo])
            for i, r in enumerate(refs):
                if r.size > small:
                    reduce_pair(r, tests[i])

    best: dict[str, float] = {}
    for _ in range(3):
        for name, fn in (("reduce_pair per tensor", loop), ("batched reduceat", batched), ("hybrid", hybrid)):
            t = time.perf_counter()
            fn()
            best[name] = min(best.get(name, np.inf), (time.perf_counter() - t) / len(pairs))
    refs, tests = pairs[0]
    sig, noi, _ = reduce_batched(refs, tests)
    exact = [reduce_pair(r, t) for r, t in zip(refs, tests, strict=True)]
    rel = max(abs(e.noise - v) / e.noise for e, v in zip(exact, noi, strict=True) if e.noise > 0)
    rel_s = max(abs(e.signal - v) / e.signal for e, v in zip(exact, sig, strict=True) if e.signal > 0)
    n_small = sum(r.size <= small for r in refs)
    lines = [
        f"[3] cumulative-pair reduction of {len(refs)} tensors per sample ({n_small} of ≤ {small} elements), "
        f"ms per sample, best of 3 (batched vs reduce_pair: max rel. diff signal {rel_s:.1e}, noise {rel:.1e}):"
    ]
    lines += [f"  {k:<24} {v * 1e3:7.3f} ms" for k, v in best.items()]
    lines.append(f"  (hybrid: batched for tensors of ≤ {small} elements, reduce_pair for larger ones)")
    return lines


def merged_reduction_model(fm: onnx.ModelProto, qm: onnx.ModelProto, float64: bool) -> tuple[onnx.ModelProto, int]:
    """Prototype: both models in one graph (``f/``, ``q/`` prefixes) reducing every pair to sums in-graph.

    Per activation: Σref², Σ(ref−post)², max|ref−post|, min/max(ref), and for quantized tensors
    Σ(pre−post)² (with qdebug's clips), concatenated into one output vector ``sums``.
    """
    from onnx import TensorProto, helper, numpy_helper

    pairing = pair_models(fm, qm)
    f, q = onnx.compose.add_prefix(fm, "f/"), onnx.compose.add_prefix(qm, "q/")
    nodes = [*f.graph.node, *q.graph.node]
    inits = [
        *f.graph.initializer,
        *q.graph.initializer,
        numpy_helper.from_array(np.array([-1], np.int64), "m/flat"),
    ]
    parts: list[str] = []
    counter = iter(range(1 << 30))

    def op(kind: str, inputs: list[str], **attrs: Any) -> str:
        out = f"m/{kind}_{next(counter)}"
        nodes.append(helper.make_node(kind, inputs, [out], **attrs))
        return out

    def clip(x: str, act: tuple[str, float, float] | None) -> str:
        if act is None:
            return x
        lo = numpy_helper.from_array(np.array(act[1], np.float32), f"m/lo_{next(counter)}")
        hi = numpy_helper.from_array(np.array(act[2], np.float32), f"m/hi_{next(counter)}")
        inits.extend([lo, hi])
        return op("Clip", [x, lo.name, hi.name])

    def emit(kind: str, x: str, cast: bool = False) -> None:
        if cast:
            x = op("Cast", [x], to=TensorProto.DOUBLE)
        r = op(kind, [x], keepdims=1)
        r = op("Reshape", [r, "m/flat"])
        parts.append(op("Cast", [r], to=TensorProto.DOUBLE) if not cast else r)

    for a in pairing.activations:
        ref = clip("f/" + a.tensor_name, a.measured_through)
        post = clip("q/" + a.post_qdq, a.measured_through)
        d = op("Sub", [ref, post])
        emit("ReduceSumSquare", ref, float64)
        emit("ReduceSumSquare", d, float64)
        emit("ReduceMax", op("Abs", [d]))
        emit("ReduceMin", "f/" + a.tensor_name)
        emit("ReduceMax", "f/" + a.tensor_name)
        if a.quantized:
            pre = clip(clip("q/" + a.pre_qdq, a.fused_activation), a.measured_through)
            emit("ReduceSumSquare", op("Sub", [pre, post]), float64)
    nodes.append(helper.make_node("Concat", parts, ["sums"], axis=0))
    graph = helper.make_graph(
        nodes,
        "merged",
        [*f.graph.input, *q.graph.input],
        [helper.make_tensor_value_info("sums", TensorProto.DOUBLE, [len(parts)])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=list(fm.opset_import), ir_version=fm.ir_version)
    return model, len(parts)


def _runner(sess: ort.InferenceSession, feeds: Sequence[dict[str, np.ndarray]]) -> Callable[[int], Any]:
    def run(i: int) -> Any:
        return sess.run(["sums"], feeds[i])

    return run


def in_graph(fm: onnx.ModelProto, qm: onnx.ModelProto, samples: Sequence[Sample], rounds: int) -> list[str]:
    """Section 4: per-sample time of the merged in-graph-reduction prototype vs plain and today."""
    lv = ort.GraphOptimizationLevel
    no_fusion = {"session.disable_quant_qdq": "1"}
    f_names, q_names = _captured_names(fm, qm)
    plain_f, plain_q = _session(fm, lv.ORT_ENABLE_ALL), _session(qm, lv.ORT_ENABLE_ALL)
    today_f = _session(expose_outputs(fm, f_names), lv.ORT_DISABLE_ALL)
    today_q = _session(expose_outputs(qm, q_names), lv.ORT_DISABLE_ALL)
    feeds = [{**{"f/" + k: v for k, v in s.items()}, **{"q/" + k: v for k, v in s.items()}} for s in samples]
    variants: dict[str, Callable[[int], Any]] = {
        PLAIN: lambda i: (plain_f.run(None, samples[i]), plain_q.run(None, samples[i])),
        TODAY + ", ORT only": lambda i: (today_f.run(f_names, samples[i]), today_q.run(q_names, samples[i])),
    }
    n_sums = 0
    arrays = {k: np.stack([s[k] for s in samples]) for k in samples[0]}
    report = qdebug.debug(fm, qm, arrays, qdebug.DebugOptions(num_samples=len(samples)))
    reference = [a.cumulative_sqnr_db for a in report.activations]
    accuracy: dict[str, str] = {}
    for f64 in (False, True):
        model, n_sums = merged_reduction_model(fm, qm, f64)
        for level, cfg, tag in (
            (lv.ORT_DISABLE_ALL, None, "DISABLE_ALL"),
            (lv.ORT_ENABLE_ALL, no_fusion, "ENABLE_ALL, no QDQ fusion"),
        ):
            sess = _session(model, level, cfg)
            name = f"merged in-graph sums ({'float64' if f64 else 'float32'} Σ), {tag}"
            variants[name] = _runner(sess, feeds)
            accuracy[name] = _sqnr_gap(sess, feeds, fm, qm, reference)
    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, fn in variants.items():
            t = time.perf_counter()
            for i in range(len(samples)):
                fn(i)
            best[name] = min(best.get(name, np.inf), (time.perf_counter() - t) / len(samples))
    base = best[PLAIN]
    lines = [f"[4] in-graph reduction prototype ({n_sums} sums per sample), ms per sample, best of {rounds}:"]
    lines += [
        f"  {k:<62} {v * 1e3:7.3f} ms  {v / base:5.2f}× plain" + (f"  [{accuracy[k]}]" if k in accuracy else "")
        for k, v in best.items()
    ]
    return lines


def _sqnr_gap(
    sess: ort.InferenceSession,
    feeds: Sequence[dict[str, np.ndarray]],
    fm: onnx.ModelProto,
    qm: onnx.ModelProto,
    reference: Sequence[float | None],
) -> str:
    """Largest |cumulative SQNR difference| (dB) of the merged prototype vs ``qdebug.debugger``'s report."""
    pairing = pair_models(fm, qm)
    stride = [5 + (1 if a.quantized else 0) for a in pairing.activations]
    starts = np.cumsum([0, *stride[:-1]])
    total = np.sum([np.asarray(sess.run(["sums"], f)[0], dtype=np.float64) for f in feeds], axis=0)
    gaps = []
    for j, ref_db in enumerate(reference):
        sig, noise = total[starts[j]], total[starts[j] + 1]
        if ref_db is None or not np.isfinite(ref_db) or noise <= 0 or sig <= 0:
            continue
        gaps.append(abs(10 * np.log10(sig / noise) - ref_db))
    return f"max |ΔSQNR| vs qdebug report: {max(gaps):.2g} dB over {len(gaps)} tensors" if gaps else "no finite SQNR"


def profile(float_path: Path, quant_path: Path, arrays: dict[str, np.ndarray], top: int) -> str:
    """Section 5: cProfile of one ``qdebug.debugger`` call, sorted by own time."""
    n = len(next(iter(arrays.values())))
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    qdebug.debug(float_path, quant_path, arrays, qdebug.DebugOptions(num_samples=n))
    prof.disable()
    wall = time.perf_counter() - t
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return f"[5] cProfile of qdebug.debug (wall {wall:.3f} s under the profiler)\n" + buf.getvalue()


def main(argv: Sequence[str] | None = None) -> int:
    """Quantize the model (untimed) and print the five sections."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--model", default="synthetic_convnet", help="model name as in bench_debug.py, or a path")
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--top", type=int, default=15, help="cProfile rows to print")
    ap.add_argument("--no-cprofile", action="store_true", help="skip section 5")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="qdebug-prof-") as tmp:
        model = prepare_model(args.model, Path(tmp))
        if model is None:
            return 1
        fm, qm = onnx.load(str(model.float_path)), onnx.load(str(model.quant_path))
        src = SyntheticData(input_specs(fm), args.samples)
        samples = [src.sample(i) for i in range(args.samples)]
        arrays = {k: np.stack([s[k] for s in samples]) for k in samples[0]}
        print(f"model {model.name}: {model.float_nodes} float nodes, {model.quant_nodes} quantized nodes")
        lines, captured = ort_variants(fm, qm, samples, args.rounds)
        print("\n".join(lines), end="\n\n")
        print("\n".join(instrumented(model.float_path, model.quant_path, arrays, args.rounds)), end="\n\n")
        print("\n".join(prototype(fm, qm, captured)), end="\n\n")
        print("\n".join(in_graph(fm, qm, samples, args.rounds)), end="\n\n")
        if not args.no_cprofile:
            print(profile(model.float_path, model.quant_path, arrays, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
