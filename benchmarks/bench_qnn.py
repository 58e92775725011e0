"""What compiling for QNN costs: compile seconds, HTP-simulator seconds per sample, and the overhead of
``qdebug build`` over doing the same by hand with the raw onnxruntime-qnn calls.

For each model (the two digits sample models and the ≥ 50 MFLOP synthetic conv net, uint8 by default):

1. **qdebug** — ``qdebug.build.build(model, out, BuildOptions("qnn", precision))``: the QNN fixes, calibration +
   QDQ insertion, the compile (a worker process), ``debug`` on the debug samples, ``htp_accuracy`` (the compiled
   model, the float model and the CPU-QDQ model on every debug sample, plus a second compile and run of the
   per-tensor probe), the manifest. Its own phase timings come from the manifest.
2. **raw** — what a user writes without qdebug, on the *same fixed float model* build produced (so both compile the
   same graph): ``quantize_static`` with ``get_qnn_qdq_config`` on the same calibration data, one in-process
   ``InferenceSession`` with the QNN provider and ``ep.context_enable`` (the compile), and a plain loop running the
   EPContext model on the HTP simulator over the same debug samples (no comparison with anything).

The overhead is qdebug's wall time over the raw wall time; the tables also split qdebug's time by phase, so the
extra work (debug, CPU/float reference runs, the probe) is visible. Each model runs in this process, raw first;
``--repeats`` keeps the best of several rounds. This is a measurement report, not a test.

Usage::

    .venv/bin/python benchmarks/bench_qnn.py [--models a,b] [--precision uint8] [--debug-samples 16]
                                            [--repeats 1] [--no-probe] [--markdown PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SAMPLE_MODELS = REPO / "sample_models"
ALL_MODELS = ("digits_cnn", "digits_transformer", "synthetic_convnet")
SYNTHETIC_SAMPLES = 16  # calibration samples of the synthetic net (it has no data set)
QNN_EP = "QNNExecutionProvider"
PHASES = ("fixes_s", "quantize_s", "compile_s", "debug_s", "simulator_s")  # build()'s own timings (manifest)


@dataclass
class Row:
    """One model's measurements (seconds)."""

    model: str
    mflop: float | None
    samples: int
    raw_quantize: float
    raw_compile: float
    raw_load: float
    raw_sim_per_sample: float
    raw_total: float
    q_total: float
    q_phases: dict[str, float]
    q_compile_in_worker: float
    q_sim_per_sample: float
    partitions: int
    cpu_nodes: int
    notes: list[str]


def _load_convnet_module() -> Any:
    """``sample_models/synthetic_convnet.py`` imported by file path."""
    path = SAMPLE_MODELS / "synthetic_convnet.py"
    spec = importlib.util.spec_from_file_location("_bench_qnn_synthetic_convnet", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _subject(name: str, work: Path, n_debug: int) -> tuple[Path, Any, Any, float | None]:
    """(float model path, calibration data, debug data, MFLOP) of one model."""
    import onnx

    if name == "synthetic_convnet":
        mod = _load_convnet_module()
        path = work / "synthetic_convnet.onnx"
        onnx.save_model(mod.build_synthetic_convnet(0), str(path))
        rng = np.random.default_rng(0)
        calib = {mod.INPUT_NAME: rng.uniform(-1, 1, (SYNTHETIC_SAMPLES, *mod.INPUT_SHAPE)).astype(np.float32)}
        debug = {mod.INPUT_NAME: rng.uniform(-1, 1, (n_debug, *mod.INPUT_SHAPE)).astype(np.float32)}
        return path, calib, debug, mod.SYNTHETIC_FLOPS / 1e6
    path = SAMPLE_MODELS / f"{name}.onnx"
    with np.load(SAMPLE_MODELS / "digits_eval.npz") as z:
        debug = {"input": z["input"][:n_debug]}
    return path, SAMPLE_MODELS / "digits_calib.npz", debug, None


def _qnn_devices(ort: Any) -> list[Any]:
    devices = [d for d in ort.get_ep_devices() if d.ep_name == QNN_EP]
    if not devices:
        import onnxruntime_qnn

        ort.register_execution_provider_library(QNN_EP, onnxruntime_qnn.get_library_path())
        devices = [d for d in ort.get_ep_devices() if d.ep_name == QNN_EP]
    return devices


class _Reader:
    """A minimal CalibrationDataReader over arrays of shape (N, *input shape)."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays
        self.i = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        n = len(next(iter(self.arrays.values())))
        if self.i >= n:
            return None
        self.i += 1
        return {k: v[self.i - 1] for k, v in self.arrays.items()}

    def rewind(self) -> None:
        self.i = 0


def _arrays(data: Any) -> dict[str, np.ndarray]:
    """Samples as (N, *input shape) arrays (the digits .npz files store (N, 1, 1, 8, 8))."""
    if isinstance(data, dict):
        return data
    with np.load(data) as z:
        return {k: z[k] for k in z.files if k != "label"}


def raw_path(
    fixed_float: Path, calib: Any, debug: dict[str, np.ndarray], precision: str, work: Path
) -> dict[str, float]:
    """quantize_static + an in-process compile session + a plain run loop: the by-hand baseline."""
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    class Reader(_Reader, CalibrationDataReader):  # type: ignore[misc]
        pass

    act, wgt = {"uint8": ("QUInt8", "QUInt8"), "uint16": ("QUInt16", "QUInt8"), "int8": ("QUInt8", "QInt8")}[precision]
    qdq = work / "raw.qdq.onnx"
    ctx = work / "raw.qnn_ctx.onnx"
    t0 = time.perf_counter()
    cfg = get_qnn_qdq_config(
        str(fixed_float), Reader(_arrays(calib)), activation_type=QuantType[act], weight_type=QuantType[wgt]
    )
    quantize(str(fixed_float), str(qdq), cfg)
    t1 = time.perf_counter()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_file_path", str(ctx))
    so.add_session_config_entry("ep.context_embed_mode", "1")
    so.add_provider_for_devices(_qnn_devices(ort), {"backend_type": "htp"})
    ort.InferenceSession(str(qdq), so)
    t2 = time.perf_counter()
    run_so = ort.SessionOptions()
    run_so.log_severity_level = 3
    run_so.add_provider_for_devices(_qnn_devices(ort), {"backend_type": "htp"})
    sess = ort.InferenceSession(str(ctx), run_so)
    if QNN_EP not in sess.get_providers():
        raise RuntimeError(f"the raw run session is not on QNN: {sess.get_providers()}")
    n = len(next(iter(debug.values())))
    t3 = time.perf_counter()
    for i in range(n):
        sess.run(None, {k: v[i] for k, v in debug.items()})
    t4 = time.perf_counter()
    return {
        "quantize": t1 - t0,
        "compile": t2 - t1,
        "load": t3 - t2,
        "sim_per_sample": (t4 - t3) / n,
        "total": t4 - t0,
    }


def measure(name: str, precision: str, n_debug: int, probe: bool, work: Path) -> Row:
    """One model: qdebug build, then the raw path on build's fixed float model."""
    from qdebug.build import BuildOptions, build

    path, calib, debug, mflop = _subject(name, work, n_debug)
    out = work / f"{name}.build"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    result = build(
        path,
        out,
        BuildOptions("qnn", precision, debug_samples=n_debug, probe_tensors=probe),
        data=calib,
        eval_data=None,
    )
    q_total = time.perf_counter() - t0
    m = result.manifest
    raw_dir = work / f"{name}.raw"
    shutil.rmtree(raw_dir, ignore_errors=True)
    raw_dir.mkdir()
    raw = raw_path(result.path("float_model"), calib, debug, precision, raw_dir)
    acc = m.target_accuracy
    notes = [f"{name}: {f.name}: {f.detail}" for f in m.fixes if f.changed]
    if acc is not None:
        notes += [f"{name}: {n}" for n in acc.notes]
    return Row(
        model=name,
        mflop=mflop,
        samples=n_debug,
        raw_quantize=raw["quantize"],
        raw_compile=raw["compile"],
        raw_load=raw["load"],
        raw_sim_per_sample=raw["sim_per_sample"],
        raw_total=raw["total"],
        q_total=q_total,
        q_phases=dict(m.timings),
        q_compile_in_worker=m.compile.compile_seconds,
        q_sim_per_sample=acc.seconds_per_sample if acc is not None else float("nan"),
        partitions=m.compile.accelerator_partitions,
        cpu_nodes=m.compile.cpu_nodes,
        notes=notes,
    )


def best(rows: Sequence[Row]) -> Row:
    """The round with the smallest qdebug wall time (background load only ever adds time)."""
    return min(rows, key=lambda r: r.q_total)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def render(rows: Sequence[Row], precision: str, repeats: int, probe: bool) -> str:
    """The Markdown report."""
    import onnxruntime as ort

    try:
        from importlib.metadata import version

        qnn_version = version("onnxruntime-qnn")
    except Exception:  # the report still renders
        qnn_version = "?"
    env = (
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, onnxruntime "
        f"{ort.__version__}, onnxruntime-qnn {qnn_version}; precision {precision}; best of {repeats}; "
        f"per-tensor probe {'on' if probe else 'off'}"
    )
    out = ["# QNN build benchmark", "", env, "", "## Compile and HTP simulator", ""]
    out += _table(
        ["model", "MFLOP", "partitions", "CPU nodes", "compile s (raw, in-process)", "compile s (qdebug worker)",
         "compile s (qdebug wall)", "sim ms/sample (raw)", "sim ms/sample (qdebug)"],
        [
            [
                r.model,
                "-" if r.mflop is None else f"{r.mflop:.1f}",
                str(r.partitions),
                str(r.cpu_nodes),
                f"{r.raw_compile:.2f}",
                f"{r.q_compile_in_worker:.2f}",
                f"{r.q_phases.get('compile_s', float('nan')):.2f}",
                f"{r.raw_sim_per_sample * 1e3:.1f}",
                f"{r.q_sim_per_sample * 1e3:.1f}",
            ]
            for r in rows
        ],
    )  # fmt: skip
    out += ["", "## `qdebug build` vs the raw calls", ""]
    phase_rows = []
    for r in rows:
        phases = [r.q_phases.get(k, 0.0) for k in PHASES]
        raw_parts = (
            f"{r.raw_quantize:.2f} + {r.raw_compile:.2f} + {r.raw_load:.2f} + {r.raw_sim_per_sample * r.samples:.2f}"
        )
        phase_rows.append(
            [
                r.model,
                str(r.samples),
                f"{r.raw_total:.2f} ({raw_parts})",
                f"{r.q_total:.2f}",
                f"{r.q_total / r.raw_total:.1f}×",
                *(f"{v:.2f}" for v in phases),
                f"{r.q_total - sum(phases):.2f}",
            ]
        )
    out += _table(
        ["model", "debug samples", "raw s (quantize + compile + load + run)", "qdebug s", "overhead",
         "fixes", "quantize", "compile", "debug", "simulator check", "other"],
        phase_rows,
    )  # fmt: skip
    out += [
        "",
        "The raw path quantizes build's *fixed* float model (same graph), compiles in-process and only runs the "
        "compiled model. qdebug's extra time is what it measures: the compile runs in a worker process (for the log "
        "and isolation), `debug` runs the float and CPU-QDQ models, and the simulator check runs float, CPU-QDQ and "
        "HTP on every debug sample and compiles and runs a second, probe model for the per-tensor comparison.",
    ]
    notes = [n for r in rows for n in r.notes]
    if notes:
        out += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print (and optionally write) the Markdown report."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(ALL_MODELS), help=f"comma-separated subset of {ALL_MODELS}")
    parser.add_argument("--precision", default="uint8", choices=["uint8", "uint16", "int8"])
    parser.add_argument("--debug-samples", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--no-probe", action="store_true", help="build without the per-tensor probe")
    parser.add_argument("--markdown", type=Path, help="also write the report here (atomically)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from qdebug.targets.qnn_options import qnn_available

    ok, why = qnn_available()
    if not ok:
        print(f"bench_qnn: onnxruntime-qnn is not usable: {why}", file=sys.stderr)
        return 2
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(models) - set(ALL_MODELS))
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {ALL_MODELS}")
    rows: list[Row] = []
    say: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="qdebug-bench-qnn-") as tmp:
        work = Path(tmp)
        # Untimed warm-up: the first build in a process imports ORT's quantization tools and loads the QNN libraries.
        from qdebug.build import BuildOptions, build

        warm, calib, _, _ = _subject("digits_cnn", work, 2)
        build(warm, work / "warmup", BuildOptions("qnn", args.precision, debug_samples=2), data=calib)
        for name in models:
            rounds = []
            for r in range(args.repeats):
                say(f"bench_qnn: {name} round {r + 1}/{args.repeats}")
                rounds.append(measure(name, args.precision, args.debug_samples, not args.no_probe, work / f"r{r}"))
            rows.append(best(rounds))
    report = render(rows, args.precision, args.repeats, not args.no_probe)
    print(report)
    if args.markdown is not None:
        from qdebug.io import atomic_write_text

        atomic_write_text(args.markdown, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
