"""Wall time and peak memory of ``qdebug.debugger`` vs plain inference vs ONNX Runtime's own recipe.

For each model and each number of samples N the script runs three methods, each in a **fresh child
process** so that the peak RSS is that run's alone:

``plain``
    the baseline: an ``onnxruntime.InferenceSession`` with default options for the float and for the
    quantized model, both run on the same N samples (no extra outputs);
``ort_recipe``
    ``onnxruntime.quantization.qdq_loss_debug`` used the documented way: both models augmented with
    ``modify_model_output_intermediate_tensors``, ``collect_activations`` for each,
    ``create_activation_matching`` + ``compute_activation_error``, ``create_weight_matching`` +
    ``compute_weight_error``;
``qdebug``
    ``qdebug.debug(float, quant, data, DebugOptions(num_samples=N))``.

All three see the same seeded synthetic samples (``qdebug.data.SyntheticData``, seed 0), materialised
identically in every child. The float model is quantized once per model with ``qdebug.quantizer``
(uint8/uint8, MinMax) before anything is timed.

Peak RSS is the child's own high-water mark (``VmHWM`` of ``/proc/self/status``, which starts afresh at
``exec``; ``ru_maxrss`` is recorded too but it inherits the parent's RSS on Linux). The baseline column is
the child's RSS right after its imports, the ONNX model loads and the samples. Nothing is subtracted.

Each cell runs ``--repeats`` times (default 5) in interleaved rounds (plain, recipe, qdebug, plain, ...),
each a fresh process; the table shows the best wall time (background load only ever adds time) and the
largest peak RSS.

This is a measurement report, not a test: it prints PASS/MISS against the targets, it never fails on them.

Usage::

    .venv/bin/python benchmarks/bench_debug.py [--samples 8,64,256] [--models a,b] [--quick]
                                               [--markdown PATH] [--json PATH] [--timeout S]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SAMPLE_MODELS = REPO / "sample_models"
METHODS = ("plain", "ort_recipe", "qdebug")
ALL_MODELS = ("digits_cnn", "digits_transformer", "synthetic_convnet")
QUICK_MODELS = ("digits_cnn", "digits_transformer")
DEFAULT_SAMPLES = (8, 64, 256)
QUICK_SAMPLES = (8, 64)
DATA_SEED = 0
CALIB_SAMPLES = 32
RSS_TARGET = 1.2  # qdebug peak RSS at the largest N vs the smallest N
WALL_TARGET = 1.5  # qdebug wall time vs plain inference
MIB = 1024 * 1024


# --------------------------------------------------------------------------------------------- child side


def _vm_hwm_bytes() -> int | None:
    """This process's peak resident set (``VmHWM``), reset at ``exec``; ``None`` off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _ru_maxrss_bytes() -> int:
    """``getrusage(RUSAGE_SELF).ru_maxrss`` in bytes (Linux reports KiB)."""
    import resource

    scale = 1 if sys.platform == "darwin" else 1024
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale


def _materialise(float_model: Any, n: int, seed: int) -> dict[str, Any]:
    """The first ``n`` seeded synthetic samples of the model's inputs, stacked as ``(n, *shape)`` arrays."""
    import numpy as np

    from qdebug.data import SyntheticData
    from qdebug.model_io import input_specs

    source = SyntheticData(input_specs(float_model), n, seed=seed)
    samples = [source.sample(i) for i in range(n)]
    return {name: np.stack([s[name] for s in samples]) for name in samples[0]}


def _per_sample(arrays: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """One ``{input: array}`` dict per sample (views into the stacked arrays)."""
    n = len(next(iter(arrays.values())))
    for i in range(n):
        yield {k: v[i] for k, v in arrays.items()}


def _run_plain(float_path: str, quant_path: str, arrays: dict[str, Any], phases: dict[str, float]) -> dict[str, Any]:
    """Default-option sessions for both models, each run on every sample; nothing else."""
    import onnxruntime as ort

    t = time.perf_counter()
    f_sess = ort.InferenceSession(float_path, providers=["CPUExecutionProvider"])
    q_sess = ort.InferenceSession(quant_path, providers=["CPUExecutionProvider"])
    phases["sessions"] = time.perf_counter() - t
    t = time.perf_counter()
    runs = 0
    for sample in _per_sample(arrays):
        f_sess.run(None, sample)
        q_sess.run(None, sample)
        runs += 1
    phases["inference"] = time.perf_counter() - t
    return {"samples_run": runs}


def _run_ort_recipe(
    float_path: str, quant_path: str, arrays: dict[str, Any], phases: dict[str, float]
) -> dict[str, Any]:
    """ONNX Runtime's ``qdq_loss_debug`` recipe, step by step as its module docs and examples show."""
    from onnxruntime.quantization import CalibrationDataReader
    from onnxruntime.quantization.qdq_loss_debug import (
        collect_activations,
        compute_activation_error,
        compute_weight_error,
        create_activation_matching,
        create_weight_matching,
        modify_model_output_intermediate_tensors,
    )

    class ArrayReader(CalibrationDataReader):  # type: ignore[misc]
        """``CalibrationDataReader`` over the stacked sample arrays."""

        def __init__(self, data: dict[str, Any]) -> None:
            self.data = data
            self._it: Iterator[dict[str, Any]] = _per_sample(data)

        def get_next(self) -> dict[str, Any] | None:
            return next(self._it, None)

        def rewind(self) -> None:
            self._it = _per_sample(self.data)

    def step(name: str) -> contextlib.AbstractContextManager[None]:
        @contextlib.contextmanager
        def timed() -> Iterator[None]:
            t = time.perf_counter()
            try:
                yield
            finally:
                phases[name] = time.perf_counter() - t

        return timed()

    with tempfile.TemporaryDirectory(prefix="bench-recipe-") as tmp:
        aug_float = str(Path(tmp) / "float.save_tensors.onnx")
        aug_quant = str(Path(tmp) / "quant.save_tensors.onnx")
        with step("augment"):
            modify_model_output_intermediate_tensors(float_path, aug_float)
            modify_model_output_intermediate_tensors(quant_path, aug_quant)
        reader = ArrayReader(arrays)
        with step("collect_float"):
            float_acts = collect_activations(aug_float, reader)
        reader.rewind()
        with step("collect_quant"):
            quant_acts = collect_activations(aug_quant, reader)
        with step("activation_error"):
            act_match = create_activation_matching(quant_acts, float_acts)
            act_err = compute_activation_error(act_match)
        with step("weight_error"):
            weight_match = create_weight_matching(float_path, quant_path)
            weight_err = compute_weight_error(weight_match)
    return {
        "activations": len(act_err),
        "activations_with_float": sum(1 for e in act_err.values() if "xmodel_err" in e),
        "weights": len(weight_err),
    }


def _run_qdebug(float_path: str, quant_path: str, arrays: dict[str, Any], phases: dict[str, float]) -> dict[str, Any]:
    """``qdebug.debugger`` on the same samples (an in-memory mapping of the stacked arrays)."""
    import qdebug

    n = len(next(iter(arrays.values())))
    t = time.perf_counter()
    report = qdebug.debug(float_path, quant_path, arrays, qdebug.DebugOptions(num_samples=n))
    phases["debug"] = time.perf_counter() - t
    return {
        "activations": len(report.activations),
        "weights": len(report.weights),
        "outputs": len(report.model_outputs),
        "num_samples": report.meta.num_samples,
    }


RUNNERS = {"plain": _run_plain, "ort_recipe": _run_ort_recipe, "qdebug": _run_qdebug}


def child_main(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one (model, N, method) measurement in this fresh process and return its numbers."""
    t_proc = time.perf_counter()
    # The same imports for every method, so the baselines are comparable.
    import numpy  # noqa: F401
    import onnx
    import onnxruntime
    import onnxruntime.quantization.qdq_loss_debug  # noqa: F401
    import psutil

    import qdebug  # noqa: F401

    fm = onnx.load(spec["float"])
    onnx.load(spec["quant"])  # validates the file; the methods load it themselves, from the path
    arrays = _materialise(fm, int(spec["n"]), int(spec["seed"]))
    del fm
    result: dict[str, Any] = {
        "baseline_rss": psutil.Process().memory_info().rss,
        "baseline_hwm": _vm_hwm_bytes(),
        "startup_s": time.perf_counter() - t_proc,
        "load1": os.getloadavg()[0],
    }
    phases: dict[str, float] = {}
    cpu = psutil.Process().cpu_times()
    result["cpu_before_s"] = cpu.user + cpu.system
    t0 = time.perf_counter()
    try:
        result["details"] = RUNNERS[spec["method"]](spec["float"], spec["quant"], arrays, phases)
        result["error"] = None
    except Exception as exc:  # a method failing on a model is a result, not a crash of the benchmark
        text = " ".join(f"{type(exc).__name__}: {exc}".split())
        step = list(phases)[-1] if phases else None  # a failing step still records its time
        result["error"] = text[:300] + (f" (in step {step})" if step else "")
    result["wall_s"] = time.perf_counter() - t0
    cpu = psutil.Process().cpu_times()
    result["cpu_s"] = cpu.user + cpu.system - result["cpu_before_s"]
    result["phases"] = phases
    result["peak_hwm"] = _vm_hwm_bytes()
    result["ru_maxrss"] = _ru_maxrss_bytes()
    result["final_rss"] = psutil.Process().memory_info().rss
    return result


# -------------------------------------------------------------------------------------------- parent side


@dataclass
class Model:
    """A float model and its quantized counterpart, ready to benchmark."""

    name: str
    float_path: Path
    quant_path: Path
    calibration: str
    float_nodes: int = 0
    quant_nodes: int = 0


@dataclass
class Run:
    """One measured (model, N, method) cell."""

    model: str
    n: int
    method: str
    wall_s: float | None = None
    peak_mb: float | None = None
    baseline_mb: float | None = None
    ru_maxrss_mb: float | None = None
    error: str | None = None
    phases: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    walls: list[float] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)


def _load_convnet_builder() -> Any:
    """``build_synthetic_convnet`` from ``sample_models/synthetic_convnet.py`` (imported by file path)."""
    path = SAMPLE_MODELS / "synthetic_convnet.py"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (yet)")
    spec = importlib.util.spec_from_file_location("_bench_synthetic_convnet", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_synthetic_convnet


def prepare_model(name: str, work: Path) -> Model | None:
    """Locate or build the float model and quantize it once (untimed); ``None`` (with a note) if absent."""
    import onnx

    from qdebug import QuantConfig, quantize
    from qdebug.data import NpzData
    from qdebug.model_io import input_specs

    cfg = QuantConfig(
        activation_type="uint8",
        weight_type="uint8",
        calibration_method="minmax",
        num_samples=CALIB_SAMPLES,
        seed=DATA_SEED,
    )
    data: Any = None
    if name == "synthetic_convnet":
        try:
            build = _load_convnet_builder()
        except Exception as exc:
            print(f"note: skipping {name}: {exc}")
            return None
        float_path = work / f"{name}.onnx"
        onnx.save_model(build(0), str(float_path))
        calibration = f"{CALIB_SAMPLES} synthetic samples (seed {DATA_SEED})"
    else:
        float_path = Path(name) if name.endswith(".onnx") else SAMPLE_MODELS / f"{name}.onnx"
        name = float_path.stem
        if not float_path.is_file():
            print(f"note: skipping {name}: {float_path} not found")
            return None
        calib = SAMPLE_MODELS / "digits_calib.npz"
        if name.startswith("digits_") and calib.is_file():
            data = NpzData(calib, input_specs(onnx.load(str(float_path))), ())
            calibration = f"{calib.name} ({len(data)} samples)"
        else:
            calibration = f"{CALIB_SAMPLES} synthetic samples (seed {DATA_SEED})"
    quant_path = work / f"{name}.qdq.onnx"
    quantize(float_path, data, cfg, quant_path)
    fm, qm = onnx.load(str(float_path)), onnx.load(str(quant_path))
    return Model(name, float_path, quant_path, calibration, len(fm.graph.node), len(qm.graph.node))


def run_child(model: Model, n: int, method: str, work: Path, timeout: float) -> dict[str, Any]:
    """One measurement in a fresh interpreter; a timeout or crash comes back as ``{"error": ...}``."""
    out = work / f"result-{model.name}-{n}-{method}.json"
    spec = {
        "float": str(model.float_path),
        "quant": str(model.quant_path),
        "n": n,
        "seed": DATA_SEED,
        "method": method,
        "out": str(out),
    }
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    if proc.returncode != 0 or not out.is_file():
        tail = " ".join((proc.stderr or "").strip().splitlines()[-3:])
        return {"error": f"child exited with {proc.returncode}: {tail[:300]}"}
    result: dict[str, Any] = json.loads(out.read_text())
    result["process_s"] = time.perf_counter() - t
    return result


def aggregate(model: str, n: int, method: str, results: Sequence[dict[str, Any]]) -> Run:
    """Fold the fresh-process runs of one cell: best wall time, largest peak RSS, first error."""
    run = Run(model, n, method)
    for r in results:
        run.phases, run.details = r.get("phases", {}), r.get("details", {})
        if r.get("load1") is not None:
            run.loads.append(r["load1"])
        if r.get("wall_s") is not None:
            run.walls.append(r["wall_s"])
        if r.get("error"):
            run.error = r["error"]
            break
    ok = [r for r in results if not r.get("error")]
    partial = [r for r in results if r.get("peak_hwm") is not None or r.get("ru_maxrss") is not None]
    if run.walls:
        run.wall_s = min(run.walls)  # the least disturbed round: background load only ever adds time
    if partial:
        run.peak_mb = max(r["peak_hwm"] if r.get("peak_hwm") is not None else r["ru_maxrss"] for r in partial) / MIB
        run.baseline_mb = statistics.median(r["baseline_rss"] for r in partial) / MIB
        run.ru_maxrss_mb = max(r["ru_maxrss"] for r in partial) / MIB
    if run.error is None and not ok:
        run.error = "no result"
    return run


def measure_cell(model: Model, n: int, methods: Sequence[str], work: Path, timeout: float, repeats: int) -> list[Run]:
    """All methods for one (model, N), in ``repeats`` interleaved rounds (background load hits all alike).

    A method that fails is not run again in later rounds.
    """
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    for _ in range(repeats):
        for method in methods:
            if any(r.get("error") for r in results[method]):
                continue
            results[method].append(run_child(model, n, method, work, timeout))
    return [aggregate(model.name, n, m, results[m]) for m in methods]


# ------------------------------------------------------------------------------------------------ report


def _fmt(v: float | None, spec: str) -> str:
    return "—" if v is None else format(v, spec)


def table_rows(runs: Sequence[Run]) -> list[list[str]]:
    """Table cells: model, N, method, wall, peak RSS, baseline RSS, wall ÷ plain, RSS ÷ smallest N."""
    by_key = {(r.model, r.n, r.method): r for r in runs}
    smallest = {(r.model, r.method): min(x.n for x in runs if x.model == r.model) for r in runs}
    rows = []
    for r in runs:
        if r.error:
            rows.append([r.model, str(r.n), r.method, f"error: {r.error}", "", "", "", ""])
            continue
        plain = by_key.get((r.model, r.n, "plain"))
        first = by_key.get((r.model, smallest[(r.model, r.method)], r.method))
        wall_ratio = r.wall_s / plain.wall_s if plain and plain.wall_s and r.wall_s is not None else None
        rss_ratio = r.peak_mb / first.peak_mb if first and first.peak_mb and r.peak_mb is not None else None
        rows.append(
            [
                r.model,
                str(r.n),
                r.method,
                _fmt(r.wall_s, ".3f"),
                _fmt(r.peak_mb, ".1f"),
                _fmt(r.baseline_mb, ".1f"),
                _fmt(wall_ratio, ".2f") + "×" if wall_ratio is not None else "—",
                _fmt(rss_ratio, ".2f") + "×" if rss_ratio is not None else "—",
            ]
        )
    return rows


HEADER = ["model", "N", "method", "wall s", "peak RSS MB", "baseline RSS MB", "wall ÷ plain", "RSS ÷ N=min"]


def checks(runs: Sequence[Run]) -> list[str]:
    """PASS/MISS lines for the two targets, per model."""
    lines = []
    for model in dict.fromkeys(r.model for r in runs):
        q = sorted((r for r in runs if r.model == model and r.method == "qdebug"), key=lambda r: r.n)
        p = {r.n: r for r in runs if r.model == model and r.method == "plain"}
        if not q:
            continue
        lo, hi = q[0], q[-1]
        if lo.peak_mb and hi.peak_mb and lo is not hi:
            ratio = hi.peak_mb / lo.peak_mb
            verdict = "PASS" if ratio <= RSS_TARGET else "MISS"
            lines.append(
                f"{model}: qdebug peak RSS N={hi.n} vs N={lo.n}: {hi.peak_mb:.1f} / {lo.peak_mb:.1f} MB = "
                f"{ratio:.2f}× (target ≤ {RSS_TARGET}×) {verdict}"
            )
        else:
            lines.append(f"{model}: qdebug RSS check: not measurable (error or a single N)")
        base = p.get(hi.n)
        if hi.wall_s is not None and base is not None and base.wall_s:
            ratio = hi.wall_s / base.wall_s
            verdict = "PASS" if ratio <= WALL_TARGET else "MISS"
            per_n = []
            for r in q:
                plain_s = p[r.n].wall_s if r.n in p else None
                if r.wall_s is not None and plain_s:
                    per_n.append(f"N={r.n}: {r.wall_s / plain_s:.2f}×")
            all_n = ", ".join(per_n)
            lines.append(
                f"{model}: qdebug wall vs plain at N={hi.n}: {hi.wall_s:.3f} / {base.wall_s:.3f} s = "
                f"{ratio:.2f}× (target ≤ {WALL_TARGET}×) {verdict}  [{all_n}]"
            )
        else:
            lines.append(f"{model}: qdebug wall check: not measurable (error)")
    return lines


def render_text(rows: list[list[str]]) -> str:
    """A fixed-width table for the terminal."""
    ok = [r for r in rows if not r[3].startswith("error:")]
    widths = [max(len(HEADER[i]), *(len(r[i]) for r in ok)) for i in range(len(HEADER))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*HEADER), fmt.format(*("-" * w for w in widths))]
    for r in rows:
        if r[3].startswith("error:"):
            lines.append("  ".join([r[0].ljust(widths[0]), r[1].ljust(widths[1]), r[2].ljust(widths[2]), r[3]]))
        else:
            lines.append(fmt.format(*r))
    return "\n".join(lines)


def _notes(runs: Sequence[Run]) -> list[str]:
    """What each method compared, and how far a failing method got before its error."""
    out = []
    for model in dict.fromkeys(r.model for r in runs):
        mine = [r for r in runs if r.model == model]
        for method in ("ort_recipe", "qdebug"):
            done = [r for r in mine if r.method == method and r.details]
            if done:
                d = done[-1].details
                what = ", ".join(f"{v} {k}" for k, v in d.items() if k not in ("num_samples", "samples_run"))
                out.append(f"`{model}` {method} compared: {what}")
        for r in mine:
            if r.error and r.wall_s is not None and r.peak_mb is not None:
                steps = ", ".join(f"{k} {v:.3f} s" for k, v in r.phases.items())
                out.append(
                    f"`{model}` N={r.n} {r.method} failed after {r.wall_s:.3f} s (peak RSS {r.peak_mb:.1f} MB; "
                    f"steps: {steps}): {r.error}"
                )
    return out


def render_markdown(
    rows: list[list[str]],
    check_lines: list[str],
    env: dict[str, str],
    models: list[Model],
    runs: Sequence[Run],
) -> str:
    """The Markdown report: environment, models, table, target checks."""
    out = ["## Results: `debug()` vs plain inference vs ORT's qdq_loss_debug recipe", ""]
    out += [f"- {k}: {v}" for k, v in env.items()]
    out += [""]
    out += [
        f"- model `{m.name}`: {m.float_nodes} float nodes, {m.quant_nodes} nodes once quantized, "
        f"calibration: {m.calibration}"
        for m in models
    ]
    out += [
        "",
        "Wall s: best of the interleaved fresh-process rounds; peak RSS: largest VmHWM of the child; "
        "baseline: child RSS after imports + model loads + samples; wall ÷ plain: vs `plain` at the same N; "
        "RSS ÷ N=min: peak vs the same method at the smallest N.",
    ]
    out += ["", "| " + " | ".join(HEADER) + " |", "|" + "|".join("---" for _ in HEADER) + "|"]
    for r in rows:
        cells = [c.replace("|", "\\|") for c in r]
        out.append("| " + " | ".join(cells) + " |")
    notes = _notes(runs)
    if notes:
        out += ["", "Notes:", ""] + [f"- {line}" for line in notes]
    out += ["", "Target checks (measurements, not assertions):", ""]
    out += [f"- {line}" for line in check_lines]
    return "\n".join(out) + "\n"


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file in the same folder and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _source_state() -> str:
    """The git commit of the checkout, and whether ``qdebug/`` differs from it (with a content hash)."""
    import hashlib

    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "qdebug"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    digest = hashlib.sha256()
    for f in sorted((REPO / "qdebug").rglob("*.py")):
        digest.update(f.read_bytes())
    state = f"uncommitted changes in qdebug/ (content sha256 {digest.hexdigest()[:12]})" if dirty else "clean"
    return f"commit {head}, {state}"


def _load_range(runs: Sequence[Run]) -> str:
    loads = [v for r in runs for v in r.loads]
    return f"{min(loads):.2f} – {max(loads):.2f}" if loads else "n/a"


def environment(runs: Sequence[Run] = ()) -> dict[str, str]:
    """Machine and library versions for the report header."""
    from importlib.metadata import version

    import psutil

    return {
        "machine": f"{os.cpu_count()} logical cores, {psutil.virtual_memory().total / 2**30:.1f} GiB RAM, "
        f"{platform.system()} {platform.machine()}",
        "versions": f"Python {platform.python_version()}, onnxruntime {version('onnxruntime')}, "
        f"onnx {version('onnx')}, numpy {version('numpy')}, qdebug {version('qdebug')}",
        "qdebug source": _source_state(),
        "load average (1/5/15 min) at report time": " / ".join(f"{v:.2f}" for v in os.getloadavg()),
        "1-min load average seen by the runs": _load_range(runs),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "command": "benchmarks/bench_debug.py " + " ".join(sys.argv[1:]),
        "rounds per cell": str(max((len(r.walls) for r in runs), default=0)),
    }


def _ints(text: str) -> tuple[int, ...]:
    values = tuple(int(v) for v in text.split(",") if v.strip())
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers like 8,64,256, got {text!r}")
    return values


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--samples", type=_ints, default=None, help="comma-separated N values (default 8,64,256)")
    ap.add_argument(
        "--models",
        default=None,
        help=f"comma-separated model names ({', '.join(ALL_MODELS)}) or .onnx paths (default: all three)",
    )
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of " + ",".join(METHODS))
    ap.add_argument("--quick", action="store_true", help="N=8,64 on the two small digits models only")
    ap.add_argument("--markdown", type=Path, default=None, help="also write the table as Markdown here")
    ap.add_argument("--json", type=Path, default=None, help="also write every raw measurement as JSON here")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per child run (default 120)")
    ap.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="interleaved fresh-process rounds per cell; the best wall time is reported (default 5)",
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark grid and print / write the report."""
    args = parse_args(argv)
    if args.child is not None:
        spec = json.loads(args.child)
        Path(spec["out"]).write_text(json.dumps(child_main(spec)))
        return 0
    samples = args.samples or (QUICK_SAMPLES if args.quick else DEFAULT_SAMPLES)
    default_models = QUICK_MODELS if args.quick else ALL_MODELS
    names = [m for m in args.models.split(",") if m] if args.models else list(default_models)
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        print(f"unknown method(s) {unknown}; choose from {list(METHODS)}", file=sys.stderr)
        return 2
    if "plain" not in methods:
        methods.insert(0, "plain")  # every ratio is against it
    t_all = time.perf_counter()
    runs: list[Run] = []
    models: list[Model] = []
    with tempfile.TemporaryDirectory(prefix="qdebug-bench-") as tmp:
        work = Path(tmp)
        for name in names:
            print(f"== {name}: quantizing (not timed) ...", flush=True)
            model = prepare_model(name, work)
            if model is None:
                continue
            models.append(model)
            for n in samples:
                for run in measure_cell(model, n, methods, work, args.timeout, max(1, args.repeats)):
                    runs.append(run)
                    shown = f"error: {run.error}" if run.error else f"{run.wall_s:.3f} s, peak {run.peak_mb:.1f} MB"
                    print(f"   N={n:<4} {run.method:<11} {shown}", flush=True)
    if not runs:
        print("nothing was measured (no model found)")
        return 1
    rows = table_rows(runs)
    check_lines = checks(runs)
    print()
    print(render_text(rows))
    print()
    for line in check_lines:
        print(line)
    print(f"\ntotal {time.perf_counter() - t_all:.0f} s")
    if args.markdown:
        atomic_write(args.markdown, render_markdown(rows, check_lines, environment(runs), models, runs))
        print(f"wrote {args.markdown}")
    if args.json:
        payload = {
            "environment": environment(runs),
            "runs": [r.__dict__ for r in runs],
            "checks": check_lines,
        }
        atomic_write(args.json, json.dumps(payload, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
