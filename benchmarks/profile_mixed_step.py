"""Where does one mixed-precision search step spend its time, against one debug pass of the same model?

A step (``MixedPrecisionSession.evaluate``) is: plan the promotion (ORT's fixer) → re-quantize from the cached
calibration ranges (``quantize(..., calibration_cache=...)``: ORT's ``quantize_static``) → debug the variant against
the float model → compare with the base. Issue 14 asks for ≤ 2× one debug pass. This script times, in one process
and interleaved (background load hits both sides alike), for each corpus model:

* ``debug``: one plain ``qdebug.debugger`` of the base model (the reference);
* ``promote``, ``requantize``, ``debug variant``, ``rest`` (compare, accuracy, bookkeeping) of one real step, the
  promotion being the first ``--promote`` candidates of the base's ranking, three times per round: ``cold`` with
  ``qdebug.quantizer``'s per-model memos emptied before each part (what every step cost before they existed: the
  quantizer view of the float model — opset conversion, shape inference — and the float model's ORT load check,
  redone at every promote and re-quantization) and ORT's own scans in ``quantize_static``; ``warm``, the memos kept
  (a search's steps after its first), ORT's scans; ``indexed``, the memos kept and ORT's name look-ups indexed
  (``qdebug.ort_index``, as ``qdebug.quantizer`` runs it now);

and prints each as a multiple of ``debug``, then the top of a cProfile of the first ``indexed`` re-quantization
(``--profile``).

Usage::

    .venv/bin/python benchmarks/profile_mixed_step.py --models ppocr-cls,minilm-l3 [--repeats 3] [--profile]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import importlib
import io
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_mixed_corpus import corpus_dir

#: ``cold``: the per-model memos emptied before each part (as before they existed), ORT's own scans; ``warm``: the
#: memos kept, ORT's scans; ``indexed``: the memos kept, ORT's look-ups indexed (what qdebug runs now).
MODES = ("cold", "warm", "indexed")
#: The table's words for each mode.
LABELS = {"cold": "no memos, ORT's scans", "warm": "memos, ORT's scans", "indexed": "memos, indexed look-ups"}


@contextlib.contextmanager
def _ort_scans(phases: Any, mode: str) -> Iterator[None]:
    """ORT's own scans in ``quantize_static`` (the index swapped for a no-op) unless ``mode`` is ``indexed``."""
    if mode == "indexed":
        yield
        return
    saved = phases.indexed_quantizer
    phases.indexed_quantizer = lambda: contextlib.nullcontext(False)
    try:
        yield
    finally:
        phases.indexed_quantizer = saved


def _timed(fn: Any, *a: Any, **kw: Any) -> tuple[Any, float]:
    t = time.perf_counter()
    out = fn(*a, **kw)
    return out, time.perf_counter() - t


def profile_model(name: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One model: base, then ``repeats`` rounds of (one debug pass, one step split in its parts)."""
    from qdebug.config import QuantConfig
    from qdebug.debugger import DebugOptions, debug
    from qdebug.mixed.candidates import candidates
    from qdebug.mixed.session import MixedPrecisionSession

    folder = corpus_dir() / name
    cfg = QuantConfig(num_samples=args.calib_samples, weight_type="int8")
    qz = importlib.import_module("qdebug.quantizer")  # the module: the package exports its function by that name
    views = importlib.import_module("qdebug.ort_view")
    phases = importlib.import_module("qdebug.ort_phases")

    kept: tuple[dict[Any, Any], set[str]] = ({}, set())

    def forget() -> None:
        views._VIEWS.clear()
        qz._LOADABLE.clear()

    def restore() -> None:  # the memos as a search's later steps find them
        views._VIEWS.clear()
        views._VIEWS.update(kept[0])
        qz._LOADABLE.clear()
        qz._LOADABLE.update(kept[1])

    rows = {m: {k: [] for k in ("debug", "promote", "requantize", "debug variant", "rest")} for m in MODES}
    with MixedPrecisionSession(
        folder / f"{name}.onnx", folder / "calib.npz", cfg, debug_data=folder / "eval.npz",
        debug_options=DebugOptions(num_samples=args.debug_samples), workdir=work / name,
    ) as s:  # fmt: skip
        base = s.base
        cands = candidates(s.float_proto, base.report)
        tensors = [t for c in cands[: args.promote] for t in c.tensors]
        s.requantize(s.promote(tensors).config, name="warmup")  # one step first: the memos a search's later steps see
        kept = (dict(views._VIEWS), set(qz._LOADABLE))
        prof = None
        for r in range(args.repeats):
            for mode in MODES:
                row = rows[mode]
                restore()
                _, t_dbg = _timed(debug, s.float_path, base.quantization.model_path, s.debug_data, s.debug_options)
                row["debug"].append(t_dbg)
                if mode == "cold":
                    forget()
                plan, t_prom = _timed(s.promote, tensors)
                if mode == "cold":
                    forget()
                t0 = time.perf_counter()
                if args.profile and r == 0 and mode == "indexed":
                    prof = cProfile.Profile()
                    prof.enable()
                with _ort_scans(phases, mode):
                    q = s.requantize(plan.config, name=f"p{r}{mode}")
                if prof is not None and r == 0 and mode == "indexed":
                    prof.disable()
                t_q = time.perf_counter() - t0
                report, t_vd = _timed(s._debug, q.model_path, f"p{r}")
                _, t_rest = _timed(s._evaluation, plan.config, f"p{r}", q, report, time.perf_counter())
                row["promote"].append(t_prom)
                row["requantize"].append(t_q)
                row["debug variant"].append(t_vd)
                row["rest"].append(t_rest)
        float_side = [_float_side(s) for _ in range(args.repeats)]
    out: dict[str, Any] = {"model": name, "float_side_s": statistics.median(float_side)}
    for mode in MODES:
        med = {k: statistics.median(v) for k, v in rows[mode].items()}
        step = med["promote"] + med["requantize"] + med["debug variant"] + med["rest"]
        out[mode] = {"median_s": med, "step_s": step, "step_over_debug": step / med["debug"]}
    if prof is not None:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(args.profile_top)
        out["profile"] = buf.getvalue()
    return out


def _float_side(s: Any) -> float:
    """Seconds of the float model's part of a debug pass, alone: its session with every paired tensor exposed, and
    the debug samples run through it (what a step could reuse, the float model never changing)."""
    from qdebug.model_io import load_model
    from qdebug.ort import expose_outputs, make_session
    from qdebug.pairing import pair_models

    pairing = pair_models(s.float_proto, load_model(s.base.quantization.model_path, "QDQ model"))
    names = list(dict.fromkeys([*(a.tensor_name for a in pairing.activations),
                                *(o.output_name for o in pairing.outputs)]))  # fmt: skip
    data = list(s.target_data())
    t = time.perf_counter()
    sess: Any = make_session(expose_outputs(s.float_proto, names), ["CPUExecutionProvider"])
    for sample in data:
        sess.run(names, {i.name: sample[i.name] for i in sess.get_inputs()})
    return time.perf_counter() - t


def render(results: Sequence[dict[str, Any]], args: argparse.Namespace) -> str:
    """A Markdown table: each part's median seconds and its multiple of one debug pass."""
    load = " / ".join(f"{v:.2f}" for v in os.getloadavg())
    parts = ("promote", "requantize", "debug variant", "rest")
    lines = [
        f"`benchmarks/profile_mixed_step.py --models {','.join(r['model'] for r in results)} --calib-samples "
        f"{args.calib_samples} --debug-samples {args.debug_samples} --promote {args.promote} --repeats "
        f"{args.repeats}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores shared "
        f"(load average {load} at the end); medians of {args.repeats} rounds, each part ÷ one debug pass:",
        "",
        "| model | variant | one debug pass s | " + " | ".join(parts) + " | step s | step ÷ debug pass |",
        "|---|---|---|" + "---|" * len(parts) + "---|---|",
    ]
    for r in results:
        for mode in MODES:
            m = r[mode]["median_s"]
            d = m["debug"]
            cells = " | ".join(f"{m[p]:.2f} s ({m[p] / d:.2f}×)" for p in parts)
            step, ratio = r[mode]["step_s"], r[mode]["step_over_debug"]
            lines.append(f"| {r['model']} | {LABELS[mode]} | {d:.2f} | {cells} | {step:.2f} | **{ratio:.2f}×** |")
    lines.append("")
    for r in results:
        d = r["indexed"]["median_s"]["debug"]
        lines.append(
            f"- {r['model']}: the float model's side alone (session with every paired tensor exposed + the debug "
            f"samples run through it) {r['float_side_s']:.2f} s = {r['float_side_s'] / d:.2f}× one debug pass"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--models", default="ppocr-cls,minilm-l3")
    p.add_argument("--calib-samples", type=int, default=8)
    p.add_argument("--debug-samples", type=int, default=8)
    p.add_argument("--promote", type=int, default=8, help="candidates promoted in the profiled step")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--profile", action="store_true", help="print a cProfile of the first indexed re-quantization")
    p.add_argument("--profile-top", type=int, default=30)
    args = p.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="qdebug-profile-step-") as tmp:
        for m in [x.strip() for x in args.models.split(",") if x.strip()]:
            results.append(profile_model(m, Path(tmp), args))
            if "profile" in results[-1]:
                print(f"--- {m}: cProfile of one re-quantization (cumulative)\n{results[-1]['profile']}")
    print(render(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
