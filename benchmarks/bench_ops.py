"""The long operations other than ``debug`` on the real-model corpus, each against its floor (issue 12, item 4).

Per corpus model, in this process, in this order (``--repeats`` keeps the best of each):

``quantize`` vs **calibration floor**
    ``qdebug.quantize(float, calib.npz)`` as ``qdebug quantize`` runs it (calibration, QDQ insertion, the output
    check), and with ``check=False``, against what any calibration needs at least: one float inference per
    calibration sample (a session with graph optimizations off, created and run on every sample).
``debug`` vs **exact-QDQ floor**
    ``qdebug.debug(float, qdq, eval.npz)`` (default options) against one float and one QDQ inference per sample
    (both sessions created from the paths, optimizations off) — the floor of ``benchmarks/bench_realmodels.py``.
one ``search`` step vs one **debug pass**
    ``MixedPrecisionSession.evaluate(promote([top suggestion]))``: promote with ORT's fixer, re-quantize from the
    cached calibration ranges (no re-calibration), debug, compare. Goal ≤ 2× one debug pass.
``build --device qnn`` vs **raw onnxruntime-qnn** (``--qnn``)
    ``qdebug.build`` (QNN fixes, calibration, QDQ, compile in a worker, debug, HTP-simulator check; no per-tensor
    probe) against the calls a user writes by hand on the same fixed float model (``quantize_static`` with
    ``get_qnn_qdq_config``, one compile session, a plain loop on the simulator) — ``benchmarks/bench_qnn.py``'s
    ``raw_path``.

Calibration uses the corpus's ``calib.npz`` (``--calib`` samples), debug and the simulator its ``eval.npz``
(``--eval`` samples). Ratios are within one model's run, so the shared machine's load mostly cancels.

Usage::

    .venv/bin/python benchmarks/bench_ops.py [--models a b] [--calib 32] [--eval 16] [--qnn] [--repeats 1]
        [--work /tmp/qdebug-ops] [--markdown docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
DEFAULT_MODELS = ("yolov8n-nudenet", "ppocrv4-rec", "silero-vad", "ddddocr-crnn", "minilm-l3")
BEGIN, END = "<!-- bench_ops:begin -->", "<!-- bench_ops:end -->"


def _npz_head(src: Path, n: int, out: Path) -> Path:
    """The first ``n`` samples of ``src`` in ``out``."""
    with np.load(src) as z:
        np.savez(out, **{k: z[k][:n] for k in z.files})
    return out


def _best(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """(best wall seconds, last result) of ``repeats`` calls."""
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return min(times), result


def _floor(paths: Sequence[Path], data: Path) -> float:
    """Sessions (optimizations off) created from ``paths``, every sample of ``data`` through each."""
    from qdebug.model_io import load_model
    from qdebug.ort import make_session

    sessions = [make_session(load_model(p), ["CPUExecutionProvider"]) for p in paths]
    with np.load(data) as z:
        arrays = {k: z[k] for k in z.files}
    for i in range(len(next(iter(arrays.values())))):
        for s in sessions:
            s.run(None, {k: v[i] for k, v in arrays.items()})  # type: ignore[attr-defined]
    return 0.0


def measure_cpu(model: str, n_calib: int, n_eval: int, repeats: int, work: Path) -> dict[str, Any]:
    """quantize / debug / one search step against their floors, for one corpus model."""
    from realmodels import registry

    from qdebug.config import QuantConfig
    from qdebug.debugger import debug
    from qdebug.mixed.session import MixedPrecisionSession
    from qdebug.quantizer import quantize

    src = registry.cache_dir() / model
    fp = src / f"{model}.onnx"
    if not fp.exists():
        raise SystemExit(f"{fp}: not cached; run benchmarks/realmodels/fetch.py --only {model}")
    w = work / model
    shutil.rmtree(w, ignore_errors=True)
    w.mkdir(parents=True)
    calib = _npz_head(src / "calib.npz", n_calib, w / "calib.npz")
    ev = _npz_head(src / "eval.npz", n_eval, w / "eval.npz")
    qp = w / "q.onnx"
    row: dict[str, Any] = {"model": model, "calib": n_calib, "eval": n_eval}
    row["calib_floor"], _ = _best(lambda: _floor([fp], calib), repeats)
    row["quantize"], q = _best(lambda: quantize(fp, calib, None, qp), repeats)
    row["quantize_nocheck"], _ = _best(lambda: quantize(fp, calib, None, w / "q_nocheck.onnx", check=False), repeats)
    row["output_db"] = q.output_sqnr_db
    row["debug_floor"], _ = _best(lambda: _floor([fp, qp], ev), repeats)
    row["debug"], rep = _best(lambda: debug(fp, qp, ev), repeats)
    row["capture"] = rep.meta.capture.backend if rep.meta.capture else "?"
    session = MixedPrecisionSession(fp, calib, QuantConfig(), debug_data=ev, workdir=w / "mixed")
    try:
        session.base  # noqa: B018 - the base quantize + debug, untimed (a search pays it once)
        top = session.suggest(1)
        if top:
            plan = session.promote([top[0].tensor_name])
            row["step"], step = _best(lambda: session.evaluate(plan), repeats)
            row["step_db"] = (session.base.output_sqnr_db, step.output_sqnr_db)
    finally:
        session.close()
    return row


def measure_qnn(model: str, n_calib: int, n_eval: int, work: Path) -> dict[str, Any]:
    """``qdebug.build`` for QNN (no probe) against the raw onnxruntime-qnn path, for one corpus model."""
    from bench_qnn import raw_path

    from qdebug.build import BuildOptions, build

    w = work / model
    calib, ev = w / "calib.npz", w / "eval.npz"
    out = w / "build"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    opts = BuildOptions("qnn", "uint8", debug_samples=n_eval, probe_tensors=False)
    from realmodels import registry

    result = build(registry.cache_dir() / model / f"{model}.onnx", out, opts, data=calib, eval_data=None)
    q_total = time.perf_counter() - t0
    m = result.manifest
    raw_dir = w / "raw"
    shutil.rmtree(raw_dir, ignore_errors=True)
    raw_dir.mkdir()
    with np.load(ev) as z:
        debug_arrays = {k: z[k] for k in z.files}
    raw = raw_path(result.path("float_model"), calib, debug_arrays, "uint8", raw_dir)
    acc = m.target_accuracy
    return {
        "qnn_build": q_total,
        "qnn_raw": raw["total"],
        "qnn_compile": (raw["compile"], m.compile.compile_seconds),
        "qnn_sim": (raw["sim_per_sample"], acc.seconds_per_sample if acc is not None else float("nan")),
        "qnn_partitions": m.compile.accelerator_partitions,
    }


def _r(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}×" if a and b else "–"


def render(rows: Sequence[dict[str, Any]], command: str) -> list[str]:
    """Markdown: machine, then one table for the CPU operations and one for QNN builds."""
    import onnxruntime

    lines = [
        BEGIN,
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}, onnxruntime "
        f"{onnxruntime.__version__}; load average at the end {os.getloadavg()[0]:.1f} (compare ratios).",
        "",
        "| model | calib / eval samples | calibration floor s | quantize s (÷ floor) | quantize without the output "
        "check s (÷ floor) | debug floor s | debug s (÷ floor) | one search step s (÷ debug) | step: output dB "
        "before → after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        step = r.get("step")
        db = r.get("step_db")
        lines.append(
            f"| {r['model']} | {r['calib']} / {r['eval']} | {r['calib_floor']:.2f} | {r['quantize']:.2f} "
            f"({_r(r['quantize'], r['calib_floor'])}) | {r['quantize_nocheck']:.2f} "
            f"({_r(r['quantize_nocheck'], r['calib_floor'])}) | {r['debug_floor']:.2f} | {r['debug']:.2f} "
            f"({_r(r['debug'], r['debug_floor'])}) | "
            + (f"{step:.2f} ({_r(step, r['debug'])})" if step else "–")
            + " | "
            + (f"{db[0]:.2f} → {db[1]:.2f}" if db and None not in db else "–")
            + " |"
        )
    qnn = [r for r in rows if "qnn_build" in r]
    if qnn:
        lines += [
            "",
            "| model | qdebug build s | raw onnxruntime-qnn s | build ÷ raw | compile s (raw / qdebug worker) "
            "| simulator s/sample (raw / qdebug) | HTP partitions |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in qnn:
            c, s = r["qnn_compile"], r["qnn_sim"]
            lines.append(
                f"| {r['model']} | {r['qnn_build']:.1f} | {r['qnn_raw']:.1f} | {_r(r['qnn_build'], r['qnn_raw'])} | "
                f"{c[0]:.1f} / {c[1]:.1f} | {s[0]:.2f} / {s[1]:.2f} | {r['qnn_partitions']} |"
            )
    return [*lines, "", END]


def main(argv: Sequence[str] | None = None) -> int:
    """Measure every model, print the tables, optionally write them into a Markdown file."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    p.add_argument("--calib", type=int, default=32)
    p.add_argument("--eval", type=int, default=16)
    p.add_argument("--qnn", nargs="*", help="also build for QNN (all --models, or the ones named)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--work", type=Path, default=Path("/tmp/qdebug-ops"))
    p.add_argument("--markdown", type=Path)
    args = p.parse_args(argv)
    rows = []
    for model in args.models:
        row = measure_cpu(model, args.calib, args.eval, args.repeats, args.work)
        if args.qnn is not None and (not args.qnn or model in args.qnn):
            row.update(measure_qnn(model, args.calib, args.eval, args.work))
        rows.append(row)
        print(row, flush=True)
    section = render(rows, "benchmarks/bench_ops.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    print("\n".join(section))
    if args.markdown:
        from bench_realmodels import replace_section

        replace_section(args.markdown, "\n".join(section), BEGIN, END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
