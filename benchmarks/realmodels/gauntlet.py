"""The real-model gauntlet: every qdebug command, through the real CLI, on every corpus model (issue 11).

Usage::

    .venv/bin/python benchmarks/realmodels/gauntlet.py                    # all cached corpus models
    .venv/bin/python benchmarks/realmodels/gauntlet.py --ci               # the CI subset
    .venv/bin/python benchmarks/realmodels/gauntlet.py --only u2netp --markdown docs/gauntlet.md --json out/g.json
    .venv/bin/python benchmarks/realmodels/gauntlet.py --set mcu --cells quantize-u8s8 debug build-deeploy-int8

For each model the commands run as a user would type them: ``qdebug`` (the console script beside this
interpreter, importing the qdebug of this repository) in a subprocess, each with its own fresh output folder under
``--workdir`` and a timeout. The cells:

==================  ==============================================================================================
quantize-u8s8       ``quantize`` with the default CPU recipe (U8 activations, S8 weights)
quantize-qnn-u16    ``quantize --target qnn --activation-type uint16`` (QNN's U16U8 recipe)
debug               ``debug`` of the U8S8 model on ``eval.npz`` (worst model-output SQNR must be above 0 dB)
suggest             ``suggest --promote-top K --overrides-out`` on the U8S8 model
requantize          ``quantize --overrides`` with the overrides ``suggest`` wrote (the fix a user applies next)
search              ``search --goal-sqnr`` with a few ``--debug-samples`` and bounded ``--max-steps``
build-qnn-uint8     ``build --target qnn --precision uint8 --no-remedies`` (divergence located, not repaired)
build-qnn-uint16    ``build --target qnn --precision uint16 --no-remedies``
build-deeploy-int8  ``build --target deeploy --precision int8`` (ok only when the generated Generic code ran
                    bit-exact on the host: ``gauntlet_deeploy.py``)
==================  ==============================================================================================

Each cell is classified: **ok** (exit 0; for ``debug`` also a worst output SQNR above 0 dB: a model that
``quantize`` writes and ``debug`` finds below 0 dB is a defect), **refused** (a documented exit code of
``qdebug.errors`` other than 1, exactly one line on stderr, no traceback), **defect** (anything else: exit 1, a
traceback, several stderr lines, a timeout, an undocumented code, a debug SQNR at or below 0 dB, or a refusal of
what an earlier qdebug command wrote: ``debug`` / ``suggest`` / ``requantize`` read only qdebug's own files and the
corpus' valid data; likewise a refusal of a "quantized model" by a command that was given none) or **blocked**
(not run because the cell it needs did not produce its file; that cell is the defect or refusal to look at). For
the microcontroller-class set (``--set mcu``) a Deeploy refusal must name an op Deeploy itself does not map.

Writes the results as JSON (``--json``, every figure and the last stderr lines of each cell) and Markdown
(``--markdown``: the command × model table and the details; ``--render JSON`` rewrites it from a saved run without
running anything). Exit 0 when no cell is a defect, 1 when one is, 2 on a bad command line or when a selected
model or its data is not cached (``make corpus`` and ``data.py``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.realmodels import gauntlet_deeploy
from benchmarks.realmodels.registry import (
    ModelEntry,
    ModelSet,
    cache_dir,
    calib_path,
    eval_path,
    is_cached,
    load_registry,
    model_path,
)
from qdebug.errors import EXIT_CODES, EXIT_INTERNAL
from qdebug.io import atomic_write_text

SCHEMA_VERSION = 1
REPO = Path(__file__).resolve().parents[2]

#: Defaults small enough for 9 models on 2 cores, large enough to exercise calibration and the debugger.
DEFAULT_CALIB_SAMPLES = 8
DEFAULT_DEBUG_SAMPLES = 2  # the QNN builds run the HTP simulator on each (~1 min per sample on an 860-node model)
DEFAULT_PROMOTE_TOP = 5
DEFAULT_GOAL_DB = 30.0
DEFAULT_MAX_STEPS = 2
DEFAULT_TIMEOUT_S = 900.0


class Status(StrEnum):
    """How one cell (command × model) ended."""

    OK = "ok"
    REFUSED = "refused"
    DEFECT = "defect"
    BLOCKED = "blocked"


class Cell(StrEnum):
    """The commands of the gauntlet, in the order they run (later cells read earlier cells' files)."""

    QUANTIZE_U8S8 = "quantize-u8s8"
    QUANTIZE_QNN_U16 = "quantize-qnn-u16"
    DEBUG = "debug"
    SUGGEST = "suggest"
    REQUANTIZE = "requantize"
    SEARCH = "search"
    BUILD_QNN_U8 = "build-qnn-uint8"
    BUILD_QNN_U16 = "build-qnn-uint16"
    BUILD_DEEPLOY_I8 = "build-deeploy-int8"


@dataclass(frozen=True)
class Settings:
    """Sample counts and bounds shared by every model of one run."""

    calib_samples: int = DEFAULT_CALIB_SAMPLES
    debug_samples: int = DEFAULT_DEBUG_SAMPLES
    promote_top: int = DEFAULT_PROMOTE_TOP
    goal_db: float = DEFAULT_GOAL_DB
    max_steps: int = DEFAULT_MAX_STEPS
    timeout_s: float = DEFAULT_TIMEOUT_S

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CellResult:
    """One command on one model: what ran, how it ended, what it measured."""

    model: str
    cell: Cell
    status: Status
    exit_code: int | None  # None: not run (blocked) or killed by the timeout
    seconds: float
    reason: str  # the one-line message of a refusal, or why the cell is a defect / blocked; "" when ok
    argv: tuple[str, ...] = ()
    figures: Mapping[str, Any] = field(default_factory=dict)
    stderr_tail: tuple[str, ...] = ()  # the last lines of stderr, kept for defects and refusals

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cell"], d["status"] = str(self.cell), str(self.status)
        d["argv"], d["stderr_tail"], d["figures"] = list(self.argv), list(self.stderr_tail), dict(self.figures)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CellResult:
        return cls(
            model=d["model"],
            cell=Cell(d["cell"]),
            status=Status(d["status"]),
            exit_code=d["exit_code"],
            seconds=float(d["seconds"]),
            reason=d["reason"],
            argv=tuple(d.get("argv", ())),
            figures=dict(d.get("figures", {})),
            stderr_tail=tuple(d.get("stderr_tail", ())),
        )


@dataclass(frozen=True)
class GauntletResult:
    """A whole run: the settings, the machine, every cell, and the wall time per model."""

    settings: Settings
    started: str
    machine: Mapping[str, Any]
    command: str
    cells: tuple[CellResult, ...]
    model_seconds: Mapping[str, float]
    schema_version: int = SCHEMA_VERSION

    @property
    def defects(self) -> list[CellResult]:
        return [c for c in self.cells if c.status is Status.DEFECT]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "settings": self.settings.to_dict(),
            "started": self.started,
            "machine": dict(self.machine),
            "command": self.command,
            "model_seconds": dict(self.model_seconds),
            "cells": [c.to_dict() for c in self.cells],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GauntletResult:
        if d.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"gauntlet result: schema_version {d.get('schema_version')} != {SCHEMA_VERSION}")
        return cls(
            settings=Settings(**d["settings"]),
            started=d["started"],
            machine=dict(d["machine"]),
            command=d["command"],
            cells=tuple(CellResult.from_dict(c) for c in d["cells"]),
            model_seconds={k: float(v) for k, v in d["model_seconds"].items()},
        )


# ---------------------------------------------------------------------------------------------------------------
# Running one command


@dataclass(frozen=True)
class Run:
    """The raw outcome of one subprocess."""

    exit_code: int | None  # None when the timeout killed it
    seconds: float
    stdout: str
    stderr: str


def qdebug_argv() -> list[str]:
    """How to start the CLI as a user does: the ``qdebug`` console script installed beside this interpreter."""
    script = Path(sys.executable).with_name("qdebug")
    if script.is_file():
        return [str(script)]
    # No console script (an interpreter without qdebug installed): the same entry point the script calls.
    return [sys.executable, "-c", "import sys; from qdebug._entry import console_main; sys.exit(console_main())"]


def _child_env() -> dict[str, str]:
    """The caller's environment, with this repository first on PYTHONPATH: the qdebug under test is the one beside
    this script even when the venv's editable install points at another checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONHASHSEED", "0")
    return env


def run_cli(args: Sequence[str], timeout_s: float, cwd: Path) -> Run:
    """Run ``qdebug *args`` in ``cwd``; a timeout kills the whole process group (QNN and Deeploy use workers)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [*qdebug_argv(), *args],
        cwd=cwd,
        env=_child_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        code = None
    return Run(code, time.perf_counter() - t0, out, err)


# ---------------------------------------------------------------------------------------------------------------
# Classification


def _stderr_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.strip()]


def classify(run: Run, timeout_s: float) -> tuple[Status, str]:
    """The status of one finished command and its reason (the rules in the module docstring); the 0 dB rule of
    ``debug`` needs its figures and is applied by :func:`run_cell` (:func:`_sqnr_problem`)."""
    lines = _stderr_lines(run.stderr)
    last = _trim(lines[-1]) if lines else ""
    if run.exit_code is None:
        return Status.DEFECT, f"timeout after {timeout_s:.0f} s"
    if any(ln.startswith("Traceback (most recent call last)") for ln in lines):
        return Status.DEFECT, f"exit {run.exit_code} with a traceback: {last}"
    if run.exit_code == 0:
        return Status.OK, ""
    if run.exit_code == EXIT_INTERNAL:
        return Status.DEFECT, f"exit 1 (internal error): {last}"
    if run.exit_code not in EXIT_CODES:
        return Status.DEFECT, f"exit {run.exit_code} is not a documented exit code: {last}"
    if len(lines) != 1:
        # The rule: a refusal is one line. ORT's C++ log and its quantizer's logging warnings bury it.
        return (
            Status.DEFECT,
            f"exit {run.exit_code}, one-line refusal buried under {len(lines) - 1} more stderr lines: {last}",
        )
    return Status.REFUSED, last


def _trim(line: str, limit: int = 300) -> str:
    line = line.strip()
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _sqnr_problem(figures: Mapping[str, Any]) -> str | None:
    """Why an ok ``debug`` is a defect after all: its worst model output at or below 0 dB, or not measured."""
    worst = figures.get("worst_output_sqnr_db")
    if worst is None or (isinstance(worst, float) and math.isnan(worst)):
        return "debug reported no finite model-output SQNR"
    if worst <= 0.0:
        return f"worst model-output SQNR {worst:.2f} dB ≤ 0 dB ({figures.get('worst_output')})"
    return None


# ---------------------------------------------------------------------------------------------------------------
# Figures read from each command's --json output


def _json(stdout: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(stdout)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def figures_quantize(d: Mapping[str, Any]) -> dict[str, Any]:
    """Quantized / total nodes, what was left in float."""
    return {
        "nodes_quantized": d.get("nodes_quantized"),
        "nodes_total": d.get("nodes_total"),
        "qdq_nodes": d.get("qdq_nodes"),
        "warnings": len(d.get("warnings") or []),
    }


def figures_debug(d: Mapping[str, Any]) -> dict[str, Any]:
    """The worst model output and its SQNR (the number the 0 dB rule reads), and the summary's extremes."""
    outs = [(o.get("output_name"), _num(o.get("cumulative_sqnr_db"))) for o in d.get("model_outputs") or []]
    finite = [(n, v) for n, v in outs if v is not None and math.isfinite(v)]
    worst = min(finite, key=lambda nv: nv[1]) if finite else (None, None)
    summary = d.get("summary") or {}
    return {
        "worst_output": worst[0],
        "worst_output_sqnr_db": worst[1],
        "outputs": len(outs),
        "min_cumulative_sqnr_db": (summary.get("cumulative") or {}).get("min"),
        "report_warnings": len((d.get("meta") or {}).get("warnings") or []),
    }


def figures_suggest(d: Mapping[str, Any]) -> dict[str, Any]:
    plan = d.get("plan") or {}
    return {
        "suggestions": len(d.get("suggestions") or []),
        "promoted": len(plan.get("promoted") or []),
        "converts": len(plan.get("converts") or []),
    }


def figures_search(d: Mapping[str, Any]) -> dict[str, Any]:
    """Whether the goal was reached, why it stopped, and the best output SQNR among the evaluated steps."""
    sqnrs = [_num(s.get("output_sqnr_db")) for s in d.get("steps") or []]
    finite = [v for v in sqnrs if v is not None and math.isfinite(v)]
    return {
        "reached": d.get("reached"),
        "stop_reason": d.get("stop_reason"),
        "steps": len(sqnrs),
        "first_output_sqnr_db": finite[0] if finite else None,
        "best_output_sqnr_db": max(finite) if finite else None,
        "promoted": len(d.get("promoted") or []),
        "requantizations": d.get("requantizations"),
    }


def figures_build(d: Mapping[str, Any]) -> dict[str, Any]:
    """Partitions and CPU nodes of the compiled model, the SoC it compiled for, and the QDQ model's output SQNR."""
    comp = d.get("compile") or {}
    acc = d.get("accuracy") or {}
    fig: dict[str, Any] = {
        "partitions": comp.get("accelerator_partitions"),
        "accelerator_nodes": comp.get("accelerator_nodes"),
        "cpu_nodes": comp.get("cpu_nodes"),
        "device": comp.get("device"),
        "fixes": len(d.get("fixes") or []),
        "warnings": len(d.get("warnings") or []),
    }
    if isinstance(acc, Mapping):
        qdq = [_db(o.get("sqnr_db")) for o in acc.get("cpu_qdq_vs_float") or []]
        target = (acc.get("target") or {}).get("outputs") or []
        fig["worst_qdq_output_sqnr_db"] = min((v for v in qdq if v is not None), default=None)
        worst_target = min((v for o in target if (v := _db(o.get("target_vs_float_db"))) is not None), default=None)
        fig["worst_target_output_sqnr_db"] = worst_target
    return fig


def _db(v: Any) -> float | None:
    """A dB figure of a manifest: a number, or "inf"/"nan" as JSON has no infinities (None when absent/NaN)."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


FIGURES: dict[Cell, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    Cell.QUANTIZE_U8S8: figures_quantize,
    Cell.QUANTIZE_QNN_U16: figures_quantize,
    Cell.DEBUG: figures_debug,
    Cell.SUGGEST: figures_suggest,
    Cell.REQUANTIZE: figures_quantize,
    Cell.SEARCH: figures_search,
    Cell.BUILD_QNN_U8: figures_build,
    Cell.BUILD_QNN_U16: figures_build,
    Cell.BUILD_DEEPLOY_I8: figures_build,
}


# ---------------------------------------------------------------------------------------------------------------
# The commands of one model


@dataclass(frozen=True)
class ModelFiles:
    """The inputs of one model's gauntlet and the folder its cells write into."""

    name: str
    float_model: Path
    calib: Path  # the first --calib-samples samples of calib.npz (a subset written into the work folder)
    eval: Path
    work: Path
    strict_deeploy: bool = False  # a Deeploy refusal must name an op Deeploy does not map (the MCU set)

    def out(self, cell: Cell) -> Path:
        return self.work / str(cell)


def _subset_npz(src: Path, dest: Path, n: int) -> Path:
    """The first ``n`` samples of every array of ``src`` (the corpus' files stay untouched), written atomically."""
    with np.load(src) as z:
        arrays = {k: z[k][:n] for k in z.files}
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.stem}.", suffix=".npz.part", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, dest)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return dest


def prepare(entry: ModelEntry, work: Path, settings: Settings) -> ModelFiles:
    """A fresh work folder for ``entry`` with its calibration subset."""
    folder = work.absolute() / entry.name  # absolute: every command runs with its own folder as cwd
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    calib = _subset_npz(calib_path(entry), folder / "data" / "calib.npz", settings.calib_samples)
    strict = entry.corpus_set is ModelSet.MCU
    return ModelFiles(entry.name, model_path(entry), calib, eval_path(entry), folder, strict)


def command(cell: Cell, f: ModelFiles, s: Settings) -> tuple[list[str], list[Path]]:
    """The CLI arguments of ``cell`` and the files it needs from earlier cells (missing → blocked)."""
    u8 = f.out(Cell.QUANTIZE_U8S8) / "model.qdq.onnx"
    overrides = f.out(Cell.SUGGEST) / "overrides.json"
    out = f.out(cell)
    base = ["--float-model", str(f.float_model)]
    debug_data = ["--data", str(f.eval)]
    if cell is Cell.QUANTIZE_U8S8:  # uint8 activations, signed 8-bit (symmetric) weights: ORT's x86 recipe
        u8s8 = ["--activation-type", "uint8", "--weight-type", "int8"]
        return ["quantize", *base, "--calib", str(f.calib), *u8s8, "-o", str(out / "model.qdq.onnx"), "--json"], []
    if cell is Cell.QUANTIZE_QNN_U16:
        qnn = ["--target", "qnn", "--activation-type", "uint16"]
        return ["quantize", *base, "--calib", str(f.calib), *qnn, "-o", str(out / "model.qdq.onnx"), "--json"], []
    if cell is Cell.DEBUG:
        samples = ["--max-samples", str(s.debug_samples)]
        return ["debug", *base, "-q", str(u8), *debug_data, *samples, "-o", str(out / "report.json"), "--json"], [u8]
    if cell is Cell.SUGGEST:
        promote = ["--promote-top", str(s.promote_top), "--overrides-out", str(overrides)]
        args = ["suggest", *base, "-q", str(u8), *debug_data, "--max-samples", str(s.debug_samples), *promote]
        return [*args, "--json"], [u8]
    if cell is Cell.REQUANTIZE:
        args = ["quantize", *base, "--calib", str(f.calib), "--overrides", str(overrides)]
        return [*args, "-o", str(out / "model.qdq.onnx"), "--json"], [overrides]
    if cell is Cell.SEARCH:
        goal = ["--goal-sqnr", f"{s.goal_db:g}", "--max-steps", str(s.max_steps)]
        args = ["search", *base, "--calib", str(f.calib), *debug_data, "--debug-samples", str(s.debug_samples)]
        return [*args, *goal, "-o", str(out / "overrides.json"), "--json"], []
    target, precision = {
        Cell.BUILD_QNN_U8: ("qnn", "uint8"),
        Cell.BUILD_QNN_U16: ("qnn", "uint16"),
        Cell.BUILD_DEEPLOY_I8: ("deeploy", "int8"),
    }[cell]
    args = ["build", *base, "--target", target, "--precision", precision, "--calib", str(f.calib), *debug_data]
    if target == "qnn":  # the build is checked, not repaired: each remedy is more compiles and simulator runs
        args.append("--no-remedies")
    return [*args, "--debug-samples", str(s.debug_samples), "-o", str(out / "build"), "--json"], []


#: Cells whose inputs are files an earlier qdebug command wrote (plus the corpus' valid data).
CHAINED = frozenset({Cell.DEBUG, Cell.SUGGEST, Cell.REQUANTIZE})


def escalate(cell: Cell, status: Status, reason: str) -> tuple[Status, str]:
    """The refusals that are defects all the same: a chained cell has nothing to refuse (its inputs are qdebug's own
    files, so a refusal means an earlier command wrote something broken, e.g. a QDQ model ORT cannot run); and a
    command given no quantized model that refuses a "quantized model" refuses one qdebug made itself."""
    if status is not Status.REFUSED:
        return status, reason
    if cell in CHAINED:
        return Status.DEFECT, f"refused what an earlier qdebug command wrote: {reason}"
    if "quantized model" in reason or ".qdq.onnx" in reason:  # the role, or the file name build gives its QDQ model
        return Status.DEFECT, f"refused a quantized model qdebug made itself: {reason}"
    return status, reason


def run_cell(cell: Cell, f: ModelFiles, s: Settings) -> CellResult:
    """Run one cell in its own fresh folder and classify it."""
    args, needs = command(cell, f, s)
    missing = [p for p in needs if not p.is_file()]
    if missing:
        why = f"needs {missing[0].relative_to(f.work)}, which an earlier cell did not write"
        return CellResult(f.name, cell, Status.BLOCKED, None, 0.0, why, tuple(args))
    out = f.out(cell)
    out.mkdir(parents=True, exist_ok=True)
    run = run_cli(args, s.timeout_s, cwd=out)
    status, reason = classify(run, s.timeout_s)
    parsed = _json(run.stdout)  # also on a refusal: search prints its steps when the goal was not reached (exit 10)
    figures = FIGURES[cell](parsed) if parsed is not None else {}
    if status is Status.OK and parsed is None:
        status, reason = Status.DEFECT, "exit 0 but --json printed no JSON object"
    if status is Status.OK and cell is Cell.DEBUG:
        problem = _sqnr_problem(figures)
        if problem:
            status, reason = Status.DEFECT, problem
    status, reason = escalate(cell, status, reason)
    if cell is Cell.BUILD_DEEPLOY_I8:
        status, reason, figures = judge_deeploy(status, reason, figures, parsed or {}, f.strict_deeploy)
    tail = tuple(_trim(ln) for ln in _stderr_lines(run.stderr)[-8:]) if status is not Status.OK else ()
    return CellResult(f.name, cell, status, run.exit_code, round(run.seconds, 2), reason, tuple(args), figures, tail)


def judge_deeploy(
    status: Status, reason: str, figures: Mapping[str, Any], manifest: Mapping[str, Any], strict: bool
) -> tuple[Status, str, dict[str, Any]]:
    """A Deeploy build's status after ``gauntlet_deeploy``'s rules: ok needs the generated code bit-exact on the
    host; under ``strict`` a refusal must name an op Deeploy itself does not map."""
    figs = dict(figures)
    if status is Status.OK:
        figs.update(gauntlet_deeploy.host_figures(manifest))
        problem = gauntlet_deeploy.host_problem(figs)
        return (Status.DEFECT, problem, figs) if problem else (status, reason, figs)
    if status is Status.REFUSED:
        figs.update(gauntlet_deeploy.refusal_figures(reason))
        problem = gauntlet_deeploy.refusal_problem(figs) if strict else None
        return (Status.DEFECT, f"{problem}: {reason}", figs) if problem else (status, reason, figs)
    return status, reason, figs


def run_model(
    entry: ModelEntry,
    work: Path,
    s: Settings,
    cells: Sequence[Cell],
    log: Callable[[str], None],
    on_cell: Callable[[list[CellResult]], None] = lambda done: None,
) -> list[CellResult]:
    """Every selected cell on one model, in order; ``on_cell`` gets the cells done so far after each."""
    files = prepare(entry, work, s)
    results: list[CellResult] = []
    for cell in cells:
        r = run_cell(cell, files, s)
        log(f"  {entry.name:16} {cell:19} {r.status:8} {r.seconds:7.1f} s  {_brief(r)}")
        results.append(r)
        on_cell(results)
    return results


def _brief(r: CellResult) -> str:
    """The key figure of an ok cell, the reason of the others."""
    f = r.figures
    if r.status is Status.REFUSED and f.get("refused_op"):
        maps = {True: "yes", False: "no", None: "unknown"}[f.get("deeploy_maps_op")]
        return f"{r.reason} [Deeploy int8 mapping of {f['refused_op']}: {maps}]"
    if r.status is not Status.OK:
        return r.reason
    if r.cell is Cell.DEBUG:
        return f"worst output {f.get('worst_output_sqnr_db', float('nan')):.1f} dB"
    if r.cell is Cell.SEARCH:
        best = f.get("best_output_sqnr_db")
        return f"best {best:.1f} dB, {f.get('stop_reason')}" if best is not None else str(f.get("stop_reason"))
    if r.cell in (Cell.BUILD_QNN_U8, Cell.BUILD_QNN_U16, Cell.BUILD_DEEPLOY_I8):
        text = f"partitions {f.get('partitions')}, cpu nodes {f.get('cpu_nodes')}, {f.get('device') or ''}".rstrip(", ")
        target = f.get("worst_target_output_sqnr_db")
        text += f", worst output on the target {target:.1f} dB" if target is not None else ""
        if f.get("host_bit_exact"):
            text += f", Generic code bit-exact on the host ({f.get('host_samples')} samples)"
        eq, lsb = f.get("export_equal_fraction"), f.get("export_max_lsb")
        if isinstance(eq, float) and eq < 1.0:  # the export's own check (its target: ≥ 99.9 %, ≤ 1 LSB)
            text += f"; integer network vs CPU QDQ {eq:.2%} equal, max {lsb} LSB"
        return text
    if r.cell is Cell.SUGGEST:
        return f"promoted {f.get('promoted')}"
    return f"{f.get('nodes_quantized')}/{f.get('nodes_total')} nodes quantized"


# ---------------------------------------------------------------------------------------------------------------
# The whole run and its reports


def machine() -> dict[str, Any]:
    """What the timings were measured on."""
    import onnxruntime

    return {
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__,
    }


def run_gauntlet(
    entries: Iterable[ModelEntry],
    work: Path,
    settings: Settings,
    cells: Sequence[Cell] = tuple(Cell),
    command_line: str = "",
    log: Callable[[str], None] = print,
    on_model: Callable[[GauntletResult], None] | None = None,
) -> GauntletResult:
    """Run ``cells`` on every model of ``entries`` (which must be cached with their data); ``on_model`` gets the
    result so far after each cell (the CLI saves it, so a long run interrupted keeps what it measured)."""
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    host = machine()
    all_cells: list[CellResult] = []
    seconds: dict[str, float] = {}
    result = GauntletResult(settings, started, host, command_line, (), {})
    for entry in entries:
        t0 = time.perf_counter()

        def progress(done: list[CellResult], name: str = entry.name, t0: float = t0) -> None:
            # Saved after every cell: a model that takes an hour on a loaded machine keeps what it measured.
            if on_model is not None:
                partial = {**seconds, name: round(time.perf_counter() - t0, 1)}
                on_model(GauntletResult(settings, started, host, command_line, (*all_cells, *done), partial))

        all_cells.extend(run_model(entry, work, settings, cells, log, progress))
        seconds[entry.name] = round(time.perf_counter() - t0, 1)
        result = GauntletResult(settings, started, host, command_line, tuple(all_cells), dict(seconds))
    return result


def merge(results: Sequence[GauntletResult]) -> GauntletResult:
    """Runs of disjoint model sets (e.g. run in parallel) as one result. Their settings must be the same but for the
    timeout (the CI test's is shorter); the merged result states the shortest."""
    first = results[0]
    if any(replace(r.settings, timeout_s=0.0) != replace(first.settings, timeout_s=0.0) for r in results):
        raise ValueError("cannot merge gauntlet runs made with different settings")
    settings = replace(first.settings, timeout_s=min(r.settings.timeout_s for r in results))
    seconds: dict[str, float] = {}
    for r in results:
        if set(r.model_seconds) & set(seconds):
            raise ValueError(f"model(s) in two runs: {sorted(set(r.model_seconds) & set(seconds))}")
        seconds.update(r.model_seconds)
    cells = tuple(c for r in results for c in r.cells)
    command = " ; ".join(dict.fromkeys(r.command for r in results))
    started = " … ".join(dict.fromkeys(r.started for r in results))
    return GauntletResult(settings, started, first.machine, command, cells, seconds)


def _short(text: str, limit: int = 70) -> str:
    """A table-sized message: qdebug's prefix dropped, cut at ``limit`` characters, pipes escaped."""
    for prefix in ("qdebug: error: ", "qdebug: FAIL: ", "qdebug: "):
        text = text.removeprefix(prefix)
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return text.replace("|", "\\|")


def _cell_text(r: CellResult) -> str:
    """One table cell: ok, refused (exit N: why), blocked, or DEFECT (what kind)."""
    if r.status is Status.OK:
        return "ok"
    if r.status is Status.REFUSED and r.figures.get("refused_op"):  # a Deeploy refusal: the op and Deeploy's verdict
        maps = {True: "yes", False: "no", None: "?"}[r.figures.get("deeploy_maps_op")]
        return f"refused (exit {r.exit_code}: {r.figures['refused_op']}; Deeploy int8 mapping: {maps})"
    if r.status is Status.REFUSED:
        return f"refused (exit {r.exit_code}: {_short(r.reason)})"
    if r.status is Status.BLOCKED:
        return "blocked"
    if r.exit_code is None:
        return "**DEFECT** (timeout)"
    head, _, message = r.reason.partition(": ")
    if "stderr lines" in head:  # a refusal buried in log lines: say both, the message is the useful part
        noise = head.split("under ")[-1].split(" more")[0]
        return f"**DEFECT** (exit {r.exit_code} + {noise} log lines: {_short(message, 50)})"
    if head.startswith("refused"):  # a refusal escalated to a defect: say so, then the refusal's own message
        return f"**DEFECT** ({head}: exit {r.exit_code}, {_short(message, 50)})"
    return f"**DEFECT** ({_short(r.reason, 60)})"


def markdown(result: GauntletResult) -> str:
    """The command × model table, the wall times, then one detail line per cell that is not plainly ok."""
    models = list(result.model_seconds)
    by = {(c.model, c.cell): c for c in result.cells}
    cells = [c for c in Cell if any(r.cell is c for r in result.cells)]
    lines = [
        "# Real-model gauntlet",
        "",
        f"Produced by `{result.command}` on {result.started}; machine: {result.machine.get('cores')} cores, "
        f"{result.machine.get('platform')}, Python {result.machine.get('python')}, "
        f"onnxruntime {result.machine.get('onnxruntime')}. Settings: "
        + ", ".join(f"{k} {v}" for k, v in result.settings.to_dict().items())
        + ". Rules and cells: `benchmarks/realmodels/gauntlet.py`.",
        "",
        "| command | " + " | ".join(models) + " |",
        "|---|" + "---|" * len(models),
    ]
    for c in cells:
        row = [_cell_text(by[(m, c)]) if (m, c) in by else "not run" for m in models]
        lines.append(f"| {c} | " + " | ".join(row) + " |")
    lines.append("| wall time s | " + " | ".join(f"{result.model_seconds[m]:.0f}" for m in models) + " |")
    counts = {s: sum(r.status is s for r in result.cells) for s in Status}
    lines += [
        "",
        ", ".join(f"{n} {s}" for s, n in counts.items()) + f"; {sum(result.model_seconds.values()):.0f} s in all.",
        "",
    ]
    lines += [
        "## Every cell",
        "",
        "| model | command | status | exit | s | figures / reason |",
        "|---|---|---|---|---|---|",
    ]
    for r in result.cells:
        text = _brief(r).replace("|", "\\|")
        lines.append(f"| {r.model} | {r.cell} | {r.status} | {r.exit_code} | {r.seconds:.1f} | {text} |")
    lines += _defect_details(result)
    return "\n".join(lines) + "\n"


def _defect_details(result: GauntletResult) -> list[str]:
    """The command line and the last stderr lines of every defect (what a developer needs to reproduce it)."""
    if not result.defects:
        return []
    out = ["", "## Defects", ""]
    for r in result.defects:
        out += [f"### {r.model} · {r.cell}", "", f"`qdebug {' '.join(r.argv)}`", "", "```"]
        out += [*r.stderr_tail, "```", ""]
    return out


# ---------------------------------------------------------------------------------------------------------------
# Command line


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    reg = load_registry()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--only", nargs="+", metavar="NAME", choices=reg.names(), default=[], help="these models only")
    p.add_argument("--ci", action="store_true", help="the CI subset only")
    p.add_argument("--set", choices=[str(s) for s in ModelSet], help="this set of models (default: main)")
    p.add_argument("--cells", nargs="+", choices=[str(c) for c in Cell], default=[], help="these commands only")
    p.add_argument("--workdir", type=Path, default=REPO / "out" / "gauntlet", help="output folders (replaced)")
    p.add_argument("--markdown", type=Path, metavar="PATH", help="write the table and details here")
    p.add_argument("--json", type=Path, metavar="PATH", help="write every result here")
    p.add_argument("--calib-samples", type=int, default=DEFAULT_CALIB_SAMPLES, metavar="N")
    p.add_argument("--debug-samples", type=int, default=DEFAULT_DEBUG_SAMPLES, metavar="N")
    p.add_argument("--promote-top", type=int, default=DEFAULT_PROMOTE_TOP, metavar="K")
    p.add_argument("--goal-sqnr", type=float, default=DEFAULT_GOAL_DB, metavar="DB")
    p.add_argument("--max-steps", type=int, default=DEFAULT_MAX_STEPS, metavar="N")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S", help="per command")
    p.add_argument(
        "--render", type=Path, nargs="+", metavar="JSON", help="run nothing: --markdown/--json from saved runs (merged)"
    )
    args = p.parse_args(argv)
    if min(args.calib_samples, args.debug_samples, args.promote_top, args.max_steps) < 1 or args.timeout <= 0:
        p.error("sample counts, --promote-top, --max-steps and --timeout must be positive")
    return args


#: Machine paths → placeholders, so that docs/ holds no path of this machine (the corpus cache, the work folders,
#: temp folders, the installed packages in tracebacks, the repository itself).
_PORTABLE = (
    (re.compile(r"[^\s'\"(]*/(?:realmodels|\.corpus)/"), "$CORPUS/"),
    (re.compile(r"[^\s'\"(]*/gauntlet[^/\s'\"]*/(?=[a-z0-9-]+/)"), "$WORK/"),
    (re.compile(r"/tmp/[^\s/'\"]+/"), "$TMP/"),
    (re.compile(r"[^\s'\"(]*/site-packages/"), "$SITE_PACKAGES/"),
)


def _portable_text(text: str) -> str:
    for pattern, placeholder in _PORTABLE:
        text = pattern.sub(placeholder, text)
    return text.replace(str(REPO), ".").replace(str(Path.home()), "~")


def portable(result: GauntletResult) -> GauntletResult:
    """``result`` with machine paths replaced by placeholders (for what is written into docs/)."""
    cells = tuple(
        replace(
            c,
            argv=tuple(_portable_text(a) for a in c.argv),
            reason=_portable_text(c.reason),
            stderr_tail=tuple(_portable_text(t) for t in c.stderr_tail),
        )
        for c in result.cells
    )
    return replace(result, cells=cells, command=_portable_text(result.command))


def _render(args: argparse.Namespace) -> int:
    """``--render``: the Markdown of saved runs (merged; e.g. after changing the layout), and their defect status."""
    result = merge([GauntletResult.from_dict(json.loads(p.read_text(encoding="utf-8"))) for p in args.render])
    # Saved runs are judged by today's rules (the refusals that are defects may have been added since).
    cells = []
    for c in result.cells:
        status, reason = escalate(c.cell, c.status, c.reason)
        cells.append(c if status is c.status else replace(c, status=status, reason=reason))
    result = portable(replace(result, cells=tuple(cells)))
    if args.json:
        atomic_write_text(args.json, json.dumps(result.to_dict(), indent=1) + "\n")
    if args.markdown:
        atomic_write_text(args.markdown, markdown(result))
    else:
        print(markdown(result), end="")
    return 1 if result.defects else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.render:
        return _render(args)
    entries = load_registry().select(args.only, args.ci, ModelSet(args.set) if args.set else None)
    missing = [e.name for e in entries if not (is_cached(e) and calib_path(e).is_file() and eval_path(e).is_file())]
    if missing:
        print(f"gauntlet: not cached in {cache_dir()}: {', '.join(missing)} (fetch.py, then data.py)", file=sys.stderr)
        return 2
    settings = Settings(
        args.calib_samples, args.debug_samples, args.promote_top, args.goal_sqnr, args.max_steps, args.timeout
    )
    cells = [Cell(c) for c in args.cells] or list(Cell)
    shown = " ".join(sys.argv[1:] if argv is None else argv)

    def save(result: GauntletResult) -> None:
        result = portable(result)
        if args.json:
            atomic_write_text(args.json, json.dumps(result.to_dict(), indent=1) + "\n")
        if args.markdown:
            atomic_write_text(args.markdown, markdown(result))

    result = run_gauntlet(entries, args.workdir, settings, cells, f"gauntlet.py {shown}".strip(), on_model=save)
    defects = result.defects
    print(f"gauntlet: {len(result.cells)} cells, {len(defects)} defect(s), {sum(result.model_seconds.values()):.0f} s")
    return 1 if defects else 0


if __name__ == "__main__":
    sys.exit(main())
