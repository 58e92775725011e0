"""Load every cached corpus model in ONNX Runtime (CPU) and run one realistic sample through it.

Usage::

    .venv/bin/python benchmarks/realmodels/smoke.py                       # every model in the registry
    .venv/bin/python benchmarks/realmodels/smoke.py --ci --markdown out/smoke.md

Per model: the cached file is measured with ``onnx`` (node count, opset, IR version must match registry.json), an
``InferenceSession`` is created (load s), one sample from ``data.make_samples`` (seed 0) is run once to warm up
and then three times (run ms: the median of the three), and every float output must be finite. Outputs whose
actual shape contradicts the shape the model declares are noted (ORT's own warning about it is silenced).

Prints a table (model, size MB, nodes, opset, inputs, load s, run ms, ok, note). A model that is not cached is a
``missing`` row. Exit 0 when every selected model is cached and ok, 1 otherwise.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.realmodels.data import make_samples
from benchmarks.realmodels.registry import (
    ModelEntry,
    ModelSet,
    cache_dir,
    is_cached,
    load_registry,
    measure,
    model_path,
)


@dataclass(frozen=True)
class SmokeRow:
    """One model's smoke result."""

    name: str
    size_mb: float
    nodes: int
    opset: int
    inputs: str
    load_s: float | None
    run_ms: float | None
    ok: str  # "ok", "missing" or a short reason
    note: str = ""


def _inputs_text(entry: ModelEntry) -> str:
    return ", ".join(f"{s.name}:{s.dtype}{list(s.concrete)}" for s in entry.inputs)


def _shape_notes(sess: Any, outs: Sequence[np.ndarray]) -> list[str]:
    """Outputs whose actual shape contradicts a static dimension the model declares."""
    notes = []
    for meta, arr in zip(sess.get_outputs(), outs, strict=True):
        declared = list(meta.shape)
        static_clash = len(declared) != arr.ndim or any(
            isinstance(d, int) and d != a for d, a in zip(declared, arr.shape, strict=False)
        )
        if static_clash:
            shown = ", ".join(str(d) if isinstance(d, int) else "?" for d in declared)
            notes.append(f"output {meta.name} declared [{shown}], is {list(arr.shape)}")
    return notes


def smoke_one(entry: ModelEntry) -> SmokeRow:
    """Measure, load and run one cached model."""
    base = {"name": entry.name, "size_mb": entry.size_mb, "inputs": _inputs_text(entry)}
    if not is_cached(entry):
        return SmokeRow(**base, nodes=entry.nodes, opset=entry.opset, load_s=None, run_ms=None, ok="missing")
    import onnxruntime as ort

    path = model_path(entry)
    facts = measure(path)
    row = {**base, "nodes": facts.nodes, "opset": facts.opset}
    drift = [
        f"{k} {got} (registry {want})"
        for k, got, want in (
            ("nodes", facts.nodes, entry.nodes),
            ("opset", facts.opset, entry.opset),
            ("ir", facts.ir_version, entry.ir_version),
        )
        if got != want
    ]
    so = ort.SessionOptions()
    so.log_severity_level = 3  # the table reports shape clashes itself, without ORT's coloured log lines
    t0 = time.perf_counter()
    try:
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # any ORT refusal is this model's result, not a crash of the table
        return SmokeRow(**row, load_s=None, run_ms=None, ok=f"load failed: {str(exc).splitlines()[0][:80]}")
    load_s = time.perf_counter() - t0
    feed = {k: v[0] for k, v in make_samples(entry, 1, seed=0).items()}
    try:
        outs = sess.run(None, feed)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            sess.run(None, feed)
            times.append(time.perf_counter() - t0)
    except Exception as exc:  # as above: a failed run is a row, the other models still run
        return SmokeRow(**row, load_s=load_s, run_ms=None, ok=f"run failed: {str(exc).splitlines()[0][:80]}")
    metas = sess.get_outputs()
    nonfinite = [m.name for m, o in zip(metas, outs, strict=True) if o.dtype.kind == "f" and not np.isfinite(o).all()]
    ok = "ok" if not drift and not nonfinite else "; ".join(drift + [f"non-finite {n}" for n in nonfinite])
    note = "; ".join(_shape_notes(sess, outs))
    return SmokeRow(**row, load_s=load_s, run_ms=statistics.median(times) * 1e3, ok=ok, note=note)


def _fmt(v: float | None, spec: str) -> str:
    return "—" if v is None else format(v, spec)


HEADER = ("model", "size MB", "nodes", "opset", "inputs", "load s", "run ms", "ok", "note")


def _cells(r: SmokeRow) -> tuple[str, ...]:
    return (
        r.name,
        f"{r.size_mb:.1f}",
        str(r.nodes),
        str(r.opset),
        r.inputs,
        _fmt(r.load_s, ".2f"),
        _fmt(r.run_ms, ".1f"),
        r.ok,
        r.note,
    )


def text_table(rows: Sequence[SmokeRow]) -> str:
    cells = [HEADER, *(_cells(r) for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells)


def markdown_table(rows: Sequence[SmokeRow]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "|".join("---" for _ in HEADER) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in _cells(r)) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    reg = load_registry()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--only", nargs="+", metavar="NAME", choices=reg.names(), default=[], help="these models only")
    p.add_argument("--ci", action="store_true", help="the CI subset only")
    p.add_argument("--set", choices=[str(s) for s in ModelSet], help="this set of models (default: main)")
    p.add_argument("--markdown", type=Path, metavar="PATH", help="also write the table as Markdown")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    rows = [smoke_one(e) for e in reg.select(args.only, args.ci, ModelSet(args.set) if args.set else None)]
    wall = time.perf_counter() - t0
    print(text_table(rows))
    good = sum(r.ok == "ok" for r in rows)
    total_mb = sum(r.size_mb for r in rows)
    print(f"smoke: {good} of {len(rows)} ok, {total_mb:.1f} MB, {wall:.1f} s, cache {cache_dir()}")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown_table(rows) + "\n", encoding="utf-8")
    return 0 if good == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
