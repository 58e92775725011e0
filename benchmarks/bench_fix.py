"""Side by side on the real-model corpus: ORT's recipes, the field's PTQ libraries (NNCF, AMD Quark) and ``qdebug fix``.

For each cached corpus model (``benchmarks/realmodels``; ``make corpus-data``): calibration = the first 8 samples of
``calib.npz``, held-out = its 24 *other* samples (8..31). Every cell quantizes the float model once and measures
the worst output SQNR on the held-out samples (each output's signal and noise energies summed over the samples,
then the worst output; ONNX Runtime sessions with graph optimizations off, as ``qdebug.quantizer`` checks), the
share of quantized weight + activation elements held in 16 bits, and its wall time.

Cells (each in a child process of its own, stopped after ``--cell-timeout`` seconds; a failing cell is recorded):

* ``ort-default`` — ``qdebug.quantizer`` with the default ``QuantConfig()`` (what ``qdebug quantize`` writes);
* ``ort-per-channel`` — ORT, U8S8, per-channel weights, MinMax; ``ort-percentile`` / ``ort-entropy`` the same with
  Percentile / Entropy calibration (Entropy's histogram raised to ``--entropy-bins`` bins, default 512: with ORT's
  default of 128 it equals MinMax, and ORT's search over thresholds grows with the bins) — the table's "best ORT
  calibration" is the best of the three on the held-out samples (an upper bound for that choice);
* ``ort-a16w8`` / ``ort-w16a16`` — the 16-bit ceilings (uint16 activations; int8 / int16 per-channel weights);
* ``nncf-default`` / ``nncf-transformer`` (and any ``--extra-recipes``) — :func:`qdebug.ptq.run_ptq`;
* ``quark-*`` — AMD Quark's CPU recipes (``--quark-recipes``); the table shows the best one;
* ``fix`` — ``qdebug.fix.fix`` (its public API) on the same 32 samples with the last 24 held out.

Usage::

    .venv/bin/python benchmarks/bench_fix.py --models ppocrv4-rec,minilm-l3,vit-s-focus \\
        --markdown out/bench_fix.md --json out/bench_fix.json [--work /tmp/qdebug-bench-fix] [--cell-timeout 900]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: The models the fix's defaults were tuned on, and the ones held out of that tuning (issue 35).
TUNING_MODELS = ("ppocrv4-rec", "minilm-l3", "silero-vad", "ppocr-cls")
HELD_OUT_MODELS = ("yolov8n-nudenet", "vit-s-focus", "u2netp", "ppocrv4-det", "ddddocr-crnn")
CALIB_SAMPLES = 8
HELD_OUT_SAMPLES = 24
ORT_CELLS = ("ort-default", "ort-per-channel", "ort-percentile", "ort-entropy", "ort-a16w8", "ort-w16a16")
NNCF_RECIPES = ("nncf-default", "nncf-transformer")
QUARK_RECIPES = ("quark-a8w8", "quark-xint8", "quark-minmse", "quark-cle", "quark-smoothquant")
#: ``qdebug fix`` cells and their 16-bit budgets (share of weight + activation elements); the 10 % cell's best
#: 8-bit point is the fix at 0 % (its own column, ``fix-0``, derived from the same run)
FIX_CELLS = {"fix": 0.10, "fix-all": 1.0}
SCHEMA_VERSION = 2


def corpus_dir() -> Path:
    """Where the corpus is cached (``$QDEBUG_CORPUS_DIR``, else ``~/.cache/qdebug/realmodels``)."""
    return Path(os.environ.get("QDEBUG_CORPUS_DIR", Path.home() / ".cache" / "qdebug" / "realmodels"))


# --------------------------------------------------------------------------- one cell (child process)


def _samples(model: str) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
    """(calibration, held-out) samples of a corpus model: the first 8 of calib.npz, and its next 24."""
    with np.load(corpus_dir() / model / "calib.npz") as z:
        arrays = {k: z[k] for k in z.files}
    n = min(len(a) for a in arrays.values())
    if n < CALIB_SAMPLES + HELD_OUT_SAMPLES:
        raise SystemExit(f"{model}: calib.npz has {n} samples, {CALIB_SAMPLES + HELD_OUT_SAMPLES} needed")
    samples = [{k: a[i] for k, a in arrays.items()} for i in range(CALIB_SAMPLES + HELD_OUT_SAMPLES)]
    return samples[:CALIB_SAMPLES], samples[CALIB_SAMPLES:]


def _stacked(samples: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.stack([s[k] for s in samples]) for k in samples[0]}


def held_out_sqnr(float_model: Path, qdq_model: Path, held: Sequence[Mapping[str, np.ndarray]]) -> dict[str, Any]:
    """Each output's SQNR (dB) on the held-out samples, energies summed over them, and the worst output's."""
    import onnx

    from qdebug.metrics import blocked_dot, sqnr_from_energies
    from qdebug.ort import make_session

    fs: Any = make_session(onnx.load(str(float_model)), ["CPUExecutionProvider"], what=str(float_model))
    qs: Any = make_session(onnx.load(str(qdq_model)), ["CPUExecutionProvider"], what=str(qdq_model))
    names = [o.name for o in fs.get_outputs()]
    signal_e, noise_e = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0.0)
    for sample in held:
        for name, f_out, q_out in zip(names, fs.run(names, dict(sample)), qs.run(names, dict(sample)), strict=True):
            f = np.asarray(f_out, np.float64).ravel()
            d = f - np.asarray(q_out, np.float64).ravel()
            signal_e[name] += blocked_dot(f, f)
            noise_e[name] += blocked_dot(d, d)
    outputs = {n: sqnr_from_energies(signal_e[n], noise_e[n])[0] for n in names}
    finite = [v for v in outputs.values() if v is not None and math.isfinite(v)]
    return {"outputs": outputs, "worst_db": min(finite) if finite else None}


def sixteen_bit_share(qdq_model: Path, sample: Mapping[str, np.ndarray]) -> float:
    """The share of quantized elements held in 16 bits: each tensor a ``QuantizeLinear`` reads (activations sized
    by one run of the model on ``sample``; constant weights by their initializer or ``Constant`` node) and each
    integer weight a ``DequantizeLinear`` reads, counted once, 16-bit when any of its Q/DQ is."""
    import onnx
    from onnx import TensorProto

    from qdebug.graph_index import constant_values, decode_constant
    from qdebug.ort import expose_outputs, make_session

    model = onnx.load(str(qdq_model))
    consts = constant_values(model)
    zps = {i.name: i.data_type for i in model.graph.initializer}
    wide = (TensorProto.INT16, TensorProto.UINT16)
    bits16: dict[str, bool] = {}
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear":
            t16 = len(node.input) > 2 and zps.get(node.input[2]) in wide
            bits16[node.input[0]] = bits16.get(node.input[0], False) or bool(t16)
        elif node.op_type == "DequantizeLinear" and node.input[0] in consts:
            value = decode_constant(consts[node.input[0]])
            if value.dtype.kind in "iu" and value.dtype.itemsize <= 2:
                bits16[node.input[0]] = value.dtype.itemsize == 2
    acts = [t for t in bits16 if t not in consts and t not in sample]
    sess: Any = make_session(expose_outputs(model, acts), ["CPUExecutionProvider"], role="quantized")
    names = [o.name for o in sess.get_outputs()]
    sizes = {n: int(np.asarray(v).size) for n, v in zip(names, sess.run(names, dict(sample)), strict=True)}
    sizes.update({n: int(np.asarray(v).size) for n, v in sample.items()})
    for t in bits16:
        if t in consts:
            sizes[t] = int(decode_constant(consts[t]).size)
    total = sum(sizes.get(t, 0) for t in bits16)
    return sum(sizes.get(t, 0) for t, w in bits16.items() if w) / total if total else 0.0


def _ort_cell(cell: str, float_model: Path, calib: list[dict[str, np.ndarray]], out: Path, bins: int) -> str:
    """Quantize with ORT (through qdebug.quantize) as ``cell`` says; a note on what was run."""
    from qdebug.config import QuantConfig
    from qdebug.quantizer import quantize

    data = _stacked(calib)
    if cell == "ort-default":
        res = quantize(float_model, data, QuantConfig(), out)
        return f"QuantConfig() as written: {res.config.activation_type}/{res.config.weight_type}, " + (
            "per-channel" if res.config.per_channel else "per-tensor"
        )
    act, weight, method = {
        "ort-per-channel": ("uint8", "int8", "minmax"),
        "ort-percentile": ("uint8", "int8", "percentile"),
        "ort-entropy": ("uint8", "int8", "entropy"),
        "ort-a16w8": ("uint16", "int8", "minmax"),
        "ort-w16a16": ("uint16", "int16", "minmax"),
    }[cell]
    cfg = QuantConfig(activation_type=act, weight_type=weight, per_channel=True, calibration_method=method)
    cache = None
    if method == "entropy":
        cache = _entropy_cache(float_model, cfg, data, out.with_suffix(".entropy.json"), bins)
    quantize(float_model, data, cfg, out, calibration_cache=cache, check=False, per_channel_fallback=False)
    return f"{act}/{weight} per-channel {method}" + (f" ({bins} histogram bins)" if cache else "")


def _entropy_cache(float_model: Path, cfg: Any, data: Mapping[str, np.ndarray], cache: Path, bins: int) -> Path:
    """ORT's Entropy calibration with ``bins`` histogram bins (``quantize_static`` cannot pass ``num_bins``) on the
    model ORT's quantizer will see, saved as the calibration cache ``quantize`` reuses."""
    import onnx
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator, save_tensors_data

    from qdebug.data import as_ort_reader, open_data
    from qdebug.model_io import input_specs
    from qdebug.ort_view import quantizer_view

    view = quantizer_view(float_model, cfg.weight_type, [cfg.activation_type], per_channel=True)
    model_path = float_model
    if view is not None:
        model_path = cache.with_suffix(".view.onnx")
        onnx.save(view, str(model_path))
    calibrator = create_calibrator(
        model_path,
        augmented_model_path=str(cache.with_suffix(".augmented.onnx")),
        calibrate_method=CalibrationMethod.Entropy,
        extra_options={"num_bins": bins, "num_quantized_bins": 128},
    )
    source = open_data(dict(data), input_specs(onnx.load(str(float_model))))
    calibrator.collect_data(as_ort_reader(source))
    save_tensors_data(calibrator.compute_data(), cache)
    return cache


def _fix_cell(
    float_model: Path, calib: list[Any], held: list[Any], work: Path, budget: float
) -> tuple[Path, str, dict[str, Any]]:
    """``qdebug fix`` through its public API, on the same samples with the held-out ones last (seen by no stage),
    with a 16-bit budget; also its best 8-bit point (the fix at 0 %) as measured on the held-out samples."""
    from qdebug.fix import FixOptions, fix

    data = _stacked([*calib, *held])
    result = fix(float_model, data, FixOptions(holdout_samples=len(held), budget_16bit=budget), workdir=work / "fix")
    if result.model_path is None:
        raise RuntimeError("fix wrote no model: " + "; ".join(result.caps or result.notes))
    best8 = result.holdout.get("best_8bit")
    extra = {
        "fix0_db": None if best8 is None else best8.worst_db, "fix0_recipe": result.trial(result.best_8bit).description,
        "chosen": result.trial(result.chosen).description, "fix_share_16bit": result.trial(result.chosen).share_16bit,
        "pass_equivalents": result.pass_equivalents, "goal_db": result.goal_db, "reached": result.reached,
        "caps": list(result.caps), "ceilings": dict(result.ceilings),
    }  # fmt: skip
    return Path(result.model_path), f"chosen: {result.chosen}", extra


def run_cell(model: str, cell: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Quantize ``model`` as ``cell`` says and measure it on the held-out samples; a JSON-ready record."""
    float_model = corpus_dir() / model / f"{model}.onnx"
    calib, held = _samples(model)
    out = work / f"{cell}.qdq.onnx"
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    extra: dict[str, Any] = {}
    if cell.startswith("ort-"):
        note = _ort_cell(cell, float_model, calib, out, args.entropy_bins)
    elif cell in FIX_CELLS:
        out, note, extra = _fix_cell(float_model, calib, held, work / cell, FIX_CELLS[cell])
    else:
        from qdebug.ptq import run_ptq

        run = run_ptq(cell, float_model, calib, out, timeout_s=max(args.cell_timeout - 60, 30))
        note = f"{run.library} {run.library_version}; " + "; ".join(run.notes)
    seconds = time.perf_counter() - t0
    measured = held_out_sqnr(float_model, out, held)
    return {
        "model": model, "cell": cell, "ok": True, "worst_db": measured["worst_db"], "outputs": measured["outputs"],
        "share_16bit": sixteen_bit_share(out, calib[0]), "seconds": seconds, "note": note, **extra,
    }  # fmt: skip


# --------------------------------------------------------------------------- the harness (parent process)


def _cell_in_child(model: str, cell: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Run one cell in a child process of its own (its own process group, so a timeout stops the PTQ worker it
    started too); the cell's record, or a failed one saying why."""
    record_path = work / model / f"{cell}.json"
    record_path.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--cell", model, cell, "--work", str(work),
           "--cell-timeout", str(args.cell_timeout), "--entropy-bins", str(args.entropy_bins)]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=args.cell_timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"model": model, "cell": cell, "ok": False, "error": f"timed out after {args.cell_timeout:g} s",
                "seconds": time.perf_counter() - t0}  # fmt: skip
    if record_path.is_file():
        record: dict[str, Any] = json.loads(record_path.read_text())
        return record
    last = [ln for ln in log.strip().splitlines() if ln.strip()][-1:] or ["no output"]
    return {"model": model, "cell": cell, "ok": False, "error": last[0][:300], "seconds": time.perf_counter() - t0}


def _cells(args: argparse.Namespace) -> list[str]:
    cells = list(ORT_CELLS) + list(NNCF_RECIPES) + [r for r in args.extra_recipes.split(",") if r]
    cells += [r for r in args.quark_recipes.split(",") if r]
    return cells + (["fix"] if args.fix else []) + (["fix-all"] if args.fix_unlimited else [])


def _best(rows: Sequence[Mapping[str, Any]], names: Sequence[str]) -> Mapping[str, Any] | None:
    ok = [r for r in rows if r["cell"] in names and r.get("ok") and r.get("worst_db") is not None]
    return max(ok, key=lambda r: r["worst_db"]) if ok else None


#: Table columns: (header, the cells it shows the best of).
COLUMNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ORT default", ("ort-default",)),
    ("ORT per-channel", ("ort-per-channel",)),
    ("best ORT calibration (per-channel)", ("ort-per-channel", "ort-percentile", "ort-entropy")),
    ("ORT A16W8", ("ort-a16w8",)),
    ("ORT W16A16", ("ort-w16a16",)),
    ("NNCF default", ("nncf-default",)),
    ("NNCF transformer", ("nncf-transformer",)),
    ("Quark best CPU recipe", QUARK_RECIPES),
    ("qdebug fix, 0 % 16-bit", ("fix-0",)),
    ("qdebug fix, ≤ 10 % 16-bit", ("fix",)),
    ("qdebug fix, no limit", ("fix-all",)),
)


def _cell_text(best: Mapping[str, Any] | None, rows: Sequence[Mapping[str, Any]], names: Sequence[str]) -> str:
    if best is None:
        failed = [r for r in rows if r["cell"] in names]
        return "failed" if failed else "—"
    which = f" ({best['cell']})" if len(names) > 1 else ""
    share = f", 16-bit {100 * best['share_16bit']:.0f} %" if best.get("share_16bit") else ""
    return f"{best['worst_db']:.1f}{which}{share}, {best['seconds']:.0f} s"


def markdown(doc: Mapping[str, Any]) -> str:
    """The table: one row per model, each cell "worst held-out dB (recipe), 16-bit share, seconds"."""
    lines = [
        "| model | set | " + " | ".join(h for h, _ in COLUMNS) + " |",
        "|---|---|" + "---|" * len(COLUMNS),
    ]
    for model in doc["models"]:
        rows = [r for r in doc["cells"] if r["model"] == model]
        kind = "tuning" if model in TUNING_MODELS else "held out"
        texts = [_cell_text(_best(rows, names), rows, names) for _, names in COLUMNS]
        lines.append(f"| {model} | {kind} | " + " | ".join(texts) + " |")
    failed = [r for r in doc["cells"] if not r.get("ok")]
    if failed:
        lines += ["", "Failed cells:", ""] + [f"- {r['model']} / {r['cell']}: {r['error']}" for r in failed]
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(TUNING_MODELS + HELD_OUT_MODELS), help="comma-separated")
    p.add_argument("--work", type=Path, default=Path("/tmp/qdebug-bench-fix"))
    p.add_argument("--markdown", type=Path)
    p.add_argument("--json", type=Path)
    p.add_argument("--cell-timeout", type=float, default=900.0, help="seconds per cell (child process stopped)")
    p.add_argument("--entropy-bins", type=int, default=512)
    p.add_argument("--quark-recipes", default=",".join(QUARK_RECIPES), help="comma-separated ('' for none)")
    p.add_argument("--extra-recipes", default="", help="more qdebug.ptq recipes, comma-separated")
    p.add_argument("--no-fix", dest="fix", action="store_false", help="leave out the qdebug fix column")
    p.add_argument("--fix-unlimited", action="store_true", help="also run qdebug fix with no 16-bit limit")
    p.add_argument("--cell", nargs=2, metavar=("MODEL", "CELL"), help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run every cell of every model (or, with ``--cell``, one cell in this process) and write the results."""
    args = _parser().parse_args(argv)
    if args.cell:
        model, cell = args.cell
        record = run_cell(model, cell, args.work / model, args)
        (args.work / model / f"{cell}.json").write_text(json.dumps(record, indent=1))
        return 0
    from qdebug.io import atomic_write_text

    models = [m for m in args.models.split(",") if m]
    cells: list[dict[str, Any]] = []
    for model in models:
        for cell in _cells(args):
            record = _cell_in_child(model, cell, args.work, args)
            cells.append(record)
            if cell == "fix" and record.get("ok"):  # the same run's best 8-bit point, measured on the held-out set
                cells.append({**record, "cell": "fix-0", "worst_db": record.get("fix0_db"), "share_16bit": 0.0})
            shown = f"{record['worst_db']:.2f} dB" if record.get("ok") and record["worst_db"] is not None else "-"
            print(f"{model:16} {cell:18} {shown:>10}  {record['seconds']:6.1f} s  {record.get('error', '')}",
                  flush=True)  # fmt: skip
    doc = {
        "schema_version": SCHEMA_VERSION,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "calibration_samples": CALIB_SAMPLES, "held_out_samples": HELD_OUT_SAMPLES,
        "tuning_models": list(TUNING_MODELS), "held_out_models": list(HELD_OUT_MODELS),
        "models": models, "cells": cells,
    }  # fmt: skip
    table = markdown(doc)
    print(table)
    if args.json:
        atomic_write_text(args.json, json.dumps(doc, indent=1) + "\n")
    if args.markdown:
        head = (f"Command: `{doc['command']}` · machine: {doc['machine']} · calibration {CALIB_SAMPLES} samples, "
                f"held-out {HELD_OUT_SAMPLES} other samples · tuning models: {', '.join(TUNING_MODELS)}; held out "
                f"of tuning: {', '.join(HELD_OUT_MODELS)}\n\n")  # fmt: skip
        atomic_write_text(args.markdown, head + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
