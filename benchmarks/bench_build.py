"""What ``qdebug build --target qnn`` costs over its floor, on real models (issue 37, deliverable 5).

For each model of the real-model corpus (``~/.cache/qdebug/realmodels/<name>/``, benchmarks/realmodels/README.md) or
of ``~/.cache/qdebug/unseen/<name>/`` (a model nobody tuned qdebug on), three fresh processes, one after the other:

1. **floor** — the least any QNN build does, each step timed on its own in the same process: the QNN
   compatibility fixes, quantization on ``calib.npz`` (the config ``build`` resolves for the precision), the compile
   (the target's own, in its worker), and the compiled model run on the HTP simulator over the evaluation samples
   (``eval.npz``: the samples ``build`` checks on). Nothing is compared with anything.
2. **build** — ``qdebug build --target qnn --precision P --calib calib.npz --data eval.npz --debug-samples N``
   as a user types it (the console script, default options: no remedies).
3. **build --remedies** — the same with ``--remedies`` (auto bisection when the probe cannot be trusted, then every
   remedy trial: a compile and a simulator run each).

Each row gives the wall seconds of each process (imports included in all three), the floor's steps, the build's own
phase timings (its manifest), and build / floor. Every process runs alone (the machine is shared: the load average
is recorded). This is a measurement report, not a test.

Usage::

    .venv/bin/python benchmarks/bench_build.py [--models ppocr-cls,yolov8n-nudenet,ddddocr-crnn,magika]
        [--precision uint8] [--samples 16] [--no-remedies-run] [--json PATH] [--markdown PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("QDEBUG_CORPUS_DIR", Path.home() / ".cache/qdebug/realmodels"))
UNSEEN = Path.home() / ".cache/qdebug/unseen"
DEFAULT_MODELS = ("ppocr-cls", "yolov8n-nudenet", "ddddocr-crnn", "magika")
QDEBUG = REPO / ".venv/bin/qdebug"


def model_dir(name: str) -> Path:
    """The folder holding ``<name>.onnx``, ``calib.npz`` and ``eval.npz`` (corpus first, then unseen)."""
    for root in (CORPUS, UNSEEN):
        if (root / name / f"{name}.onnx").is_file():
            return root / name
    raise SystemExit(f"{name}: not cached in {CORPUS} or {UNSEEN}")


def floor(name: str, precision: str, samples: int) -> dict[str, Any]:
    """The floor's steps in this process (run as ``--floor NAME``): seconds per step."""
    t_all = time.perf_counter()
    from qdebug.build_inputs import resolve_config
    from qdebug.data import open_data
    from qdebug.io import atomic_save_model
    from qdebug.model_io import input_specs, load_model
    from qdebug.quantizer import quantize
    from qdebug.targets.base import BuildOptions, CompileJob, ShapeSource, get_target
    from qdebug.targets.qnn_session import run_compiled

    d = model_dir(name)
    steps: dict[str, float] = {"imports_s": time.perf_counter() - t_all}
    opts = BuildOptions("qnn", precision, debug_samples=samples)
    target = get_target("qnn")
    with tempfile.TemporaryDirectory(prefix="bench-build-floor-") as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        model = load_model(d / f"{name}.onnx")
        cfg = resolve_config("qnn", precision)
        prepared = target.prepare(model, cfg, opts, ShapeSource(None, d / "calib.npz"))
        fixed = work / f"{name}.float.onnx"
        atomic_save_model(prepared.model, fixed)
        steps["fixes_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        assert prepared.config is not None
        specs = input_specs(prepared.model)
        calib = open_data(d / "calib.npz", specs, num_samples=prepared.config.num_samples)
        qdq = Path(quantize(fixed, calib, prepared.config, work / f"{name}.qdq.onnx", check=False).model_path)
        steps["quantize_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        compiled = target.compile(CompileJob(model=qdq, out_dir=work, options=opts, stem=name))
        steps["compile_s"] = time.perf_counter() - t0
        if not compiled.report.ok or compiled.report.compiled_model is None:
            raise SystemExit(f"{name}: the floor's compile failed: {compiled.report.error}")
        t0 = time.perf_counter()
        source = open_data(d / "eval.npz", specs, num_samples=samples, seed=1)
        n = sum(1 for _ in run_compiled(compiled.report.compiled_model, source))
        steps["simulate_s"] = time.perf_counter() - t0
    steps["samples"] = n
    steps["wall_s"] = time.perf_counter() - t_all
    return steps


def _timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return time.perf_counter() - t0, res


def _build(name: str, precision: str, samples: int, out: Path, extra: list[str]) -> dict[str, Any]:
    """``qdebug build`` in its own process: wall seconds, its manifest's timings, what it skipped."""
    d = model_dir(name)
    cmd = [str(QDEBUG), "build", "-f", str(d / f"{name}.onnx"), "--target", "qnn", "--precision", precision,
           "--calib", str(d / "calib.npz"), "--data", str(d / "eval.npz"), "--debug-samples", str(samples),
           "-o", str(out), *extra]  # fmt: skip
    wall, res = _timed(cmd)
    if res.returncode != 0:
        return {"wall_s": wall, "error": res.stderr.strip().splitlines()[-1:], "command": " ".join(cmd[1:])}
    m = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    diag = m.get("qnn_divergence") or {}
    remedies = diag.get("remedies") or {}
    return {
        "wall_s": wall,
        "timings": m["timings"],
        "skipped": m.get("skipped", []),
        "bisected": diag.get("bisection") is not None,
        "trials": len(remedies.get("trials", [])),
        "samples": m["accuracy"]["num_debug_samples"],
        "command": "qdebug " + " ".join(cmd[1:]),
    }


def run(name: str, precision: str, samples: int, remedies: bool) -> dict[str, Any]:
    """Floor, build and build --remedies of one model, each in a fresh process."""
    wall, res = _timed([sys.executable, __file__, "--floor", name, "--precision", precision, "--samples", str(samples)])
    if res.returncode != 0:
        raise SystemExit(f"{name}: floor failed: {res.stderr.strip()[-2000:]}")
    row: dict[str, Any] = {"model": name, "precision": precision, "floor": json.loads(res.stdout.splitlines()[-1])}
    row["floor"]["process_s"] = wall
    with tempfile.TemporaryDirectory(prefix="bench-build-") as tmp:
        row["build"] = _build(name, precision, samples, Path(tmp) / "b", [])
        print(json.dumps({"partial": True, **row}), file=sys.stderr, flush=True)  # the --remedies run may be long
        if remedies:
            row["remedies"] = _build(name, precision, samples, Path(tmp) / "r", ["--remedies"])
    row["load"] = os.getloadavg()
    for key in ("build", "remedies"):
        if key in row and "error" not in row[key]:
            row[key]["ratio"] = row[key]["wall_s"] / row["floor"]["process_s"]
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table of docs/benchmarks.md's "build time" section."""
    head = (
        "| model | samples | floor s (fixes + quantize + compile + simulate) | build s | build / floor | "
        "build phases (s) | --remedies s | / floor | what --remedies ran |\n|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        f, b, x = r["floor"], r["build"], r.get("remedies")
        steps = f"{f['process_s']:.1f} ({f['fixes_s']:.1f} + {f['quantize_s']:.1f} + {f['compile_s']:.1f} + " \
                f"{f['simulate_s']:.1f})"  # fmt: skip
        if "error" in b:
            lines.append(f"| {r['model']} | {f['samples']} | {steps} | failed: {b['error']} | | | | | |")
            continue
        t = b["timings"]
        phases = ", ".join(f"{k.removesuffix('_s')} {v:.1f}" for k, v in t.items() if k != "total_s")
        rem = "| | |"
        if x is not None and "error" not in x:
            what = f"{'bisection + ' if x['bisected'] else ''}{x['trials']} trial(s)"
            rem = f"{x['wall_s']:.1f} | {x['ratio']:.2f}× | {what} |"
        elif x is not None:
            rem = f"failed: {x['error']} | | |"
        lines.append(
            f"| {r['model']} | {b['samples']} | {steps} | {b['wall_s']:.1f} | **{b['ratio']:.2f}×** | {phases} | {rem}"
        )
    return head + "\n".join(lines) + "\n"


def main() -> None:
    """Parse the options; ``--floor NAME`` is the floor's own process."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(DEFAULT_MODELS))
    p.add_argument("--precision", default="uint8")
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--no-remedies-run", action="store_true", help="skip the build --remedies run")
    p.add_argument("--floor", help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path, help="append one JSON line per model here")
    p.add_argument("--markdown", type=Path)
    a = p.parse_args()
    if a.floor:
        print(json.dumps(floor(a.floor, a.precision, a.samples)))
        return
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.platform()}")
    rows = []
    for name in a.models.split(","):
        row = run(name, a.precision, a.samples, not a.no_remedies_run)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if a.json:
            with a.json.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(row) + "\n")
    table = markdown(rows)
    print(table)
    if a.markdown:
        a.markdown.write_text(table, encoding="utf-8")


if __name__ == "__main__":
    main()
