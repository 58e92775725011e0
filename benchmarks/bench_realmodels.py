"""``qdebug debug`` on the real-model corpus against the exact-QDQ floor (issue 12).

For each corpus model and number of samples N, each method runs in a **fresh child process**:

``floor``
    what exact QDQ semantics need and nothing more: one ``InferenceSession`` for the float and one for the QDQ
    model, **graph optimizations off** (so the QDQ model runs as written, like qdebug's sessions), both run on
    every sample, no extra outputs;
``numpy`` / ``compiled`` / ``graph`` / ``auto``
    ``qdebug.debug(float, quant, data, DebugOptions(capture=...))``; ``auto`` also reports what it chose and why;
``batch8``
    ``DebugOptions(capture="fetch", batch=8)``: up to 8 samples per inference call, with the batch that ran and
    why batching stopped, if it did;
``whole``
    ``numpy`` with segmenting off (:mod:`qdebug.capture.segmented`): every tensor of a sample exposed at once, as
    before segmenting existed — what segmenting changes, measured in the same run.

**Per-sample cost** is the steady state: the time from the end of sample 0 to the end of sample N-1, divided by
N-1 (qdebug's progress callback; the floor's own loop), so set-up and first-run allocations are excluded, and
``auto``'s probe sample is included. **End-to-end** is the whole call: for qdebug ``debug()`` from the model
paths to the report (loading, pairing, weights, capture), for the floor both sessions' creation from the paths
plus every sample. **Peak RSS** is the child's ``VmHWM`` (reset at ``exec``). Ratios are against the floor of
the same model and N, measured in the same run, so the shared machine's load mostly cancels.

The samples are the corpus's realistic synthetic inputs (``benchmarks/realmodels/data.py``, seed 0), generated
once into ``--work`` and split into ``.npz`` files of 8 samples (a folder source: one file in memory at a time,
so the inputs do not make the peak grow with N). Models are quantized once with ``qdebug quantize`` defaults on
the corpus's ``calib.npz`` (not timed).

Usage::

    .venv/bin/python benchmarks/bench_realmodels.py [--models a b] [--samples 8 64]
        [--methods floor numpy compiled graph auto batch8] [--work /tmp/qdebug-bench] [--markdown out/realmodels.md]
        [--json out.json] [--timeout 600]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODELS = ("yolov8n-nudenet", "ppocrv4-rec", "silero-vad", "ddddocr-crnn", "minilm-l3")
METHODS = ("floor", "numpy", "compiled", "graph", "auto", "batch8", "whole")
CHUNK = 8  # samples per .npz file of the folder source
BEGIN, END = "<!-- bench_realmodels:begin -->", "<!-- bench_realmodels:end -->"


def _hwm_mb() -> float:
    """This process's peak resident set (``VmHWM``) in MB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _floor(float_path: str, quant_path: str, data: Any) -> tuple[float, list[float]]:
    """Both sessions, optimizations off, every sample through both; (set-up s, end time of every sample)."""
    from qdebug.model_io import load_model
    from qdebug.ort import make_session

    t0 = time.perf_counter()
    fs = make_session(load_model(float_path, "float model"), ["CPUExecutionProvider"])
    qs = make_session(load_model(quant_path, "quantized model"), ["CPUExecutionProvider"])
    setup = time.perf_counter() - t0
    ends = []
    for sample in data:
        fs.run(None, sample)  # type: ignore[attr-defined]
        qs.run(None, sample)  # type: ignore[attr-defined]
        ends.append(time.perf_counter())
    return setup, ends


def child_main(spec: dict[str, Any]) -> dict[str, Any]:
    """One measurement in this (fresh) process."""
    from qdebug.data import NpzFolderData
    from qdebug.debugger import DebugOptions, debug
    from qdebug.model_io import input_specs, load_model

    fp, qp, folder, method = spec["float"], spec["quant"], spec["data"], spec["method"]
    out: dict[str, Any] = {"method": method, "n": spec["n"]}
    if method == "floor":
        data = NpzFolderData(folder, input_specs(load_model(fp, "float model")))
        t0 = time.perf_counter()
        setup, ends = _floor(fp, qp, data)
        out["setup_s"] = setup
    else:
        ends = []
        t0 = time.perf_counter()
        if method in ("batch8", "whole"):
            from qdebug.capture import CaptureTuning

            # whole: the fetch run never segmented, what segmenting changes in the same run
            never = CaptureTuning(segment_above=1 << 62, pipelined_above=1 << 62) if method == "whole" else None
            opts = DebugOptions(capture="fetch", batch=8 if method == "batch8" else 1, tuning=never)
        else:
            opts = DebugOptions(capture=method)
        rep = debug(fp, qp, folder, opts, progress=lambda i, n: ends.append(time.perf_counter()))
        cap = rep.meta.capture
        out["backend"] = cap.backend if cap else None
        out["reason"] = cap.reason if cap else None
        out["fallback_samples"] = cap.fallback_samples if cap else 0
        out["batch"], out["batch_reason"] = (cap.batch, cap.batch_reason) if cap else (1, None)
        out["segments"] = cap.segments if cap else 1
    out["wall_s"] = time.perf_counter() - t0
    out["per_sample_s"] = (ends[-1] - ends[0]) / (len(ends) - 1) if len(ends) > 1 else float("nan")
    out["peak_rss_mb"] = _hwm_mb()
    return out


def prepare(model: str, work: Path, max_n: int) -> tuple[Path, Path, Path]:
    """(float model, quantized model, folder holding the corpus eval data for ``max_n`` samples)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from realmodels import registry

    src = registry.cache_dir() / model
    fp = src / f"{model}.onnx"
    if not fp.exists():
        raise SystemExit(f"{fp}: not cached; run benchmarks/realmodels/fetch.py --only {model}")
    work.mkdir(parents=True, exist_ok=True)
    qp = work / f"{model}.qdq.onnx"
    if not qp.exists():
        cmd = [sys.executable, "-m", "qdebug.cli", "quantize", "-f", str(fp), "--calib", str(src / "calib.npz")]
        subprocess.run([*cmd, "-o", str(qp)], check=True, capture_output=True, env=_env())
    data_root = work / "corpus"
    big = data_root / model / "eval.npz"
    if not big.exists() or _samples_in(big) < max_n:
        (data_root / model).mkdir(parents=True, exist_ok=True)
        link = data_root / model / f"{model}.onnx"
        if not link.exists():
            link.symlink_to(fp)
        gen = [sys.executable, str(REPO / "benchmarks/realmodels/data.py"), "--only", model, "--calib-samples", "2"]
        env = {**_env(), "QDEBUG_CORPUS_DIR": str(data_root)}
        subprocess.run([*gen, "--eval-samples", str(max_n)], check=True, capture_output=True, env=env)
    return fp, qp, big


def _samples_in(npz: Path) -> int:
    import numpy as np

    with np.load(npz) as z:
        return int(z[z.files[0]].shape[0])


def split(big: Path, n: int, folder: Path) -> Path:
    """The first ``n`` samples of ``big`` as ``.npz`` files of :data:`CHUNK` samples in ``folder``."""
    import numpy as np

    if folder.exists() and len(list(folder.glob("*.npz"))) == -(-n // CHUNK):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    with np.load(big) as z:
        arrays = {k: z[k][:n] for k in z.files}
    for i in range(0, n, CHUNK):
        np.savez(folder / f"part_{i // CHUNK:04d}.npz", **{k: a[i : i + CHUNK] for k, a in arrays.items()})
    return folder


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def run_child(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One fresh process; an error or a timeout is a result."""
    cmd = [sys.executable, __file__, "--child", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env(), check=False)
    except subprocess.TimeoutExpired:
        return {"method": spec["method"], "n": spec["n"], "error": f"timeout after {timeout:.0f} s"}
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"method": spec["method"], "n": spec["n"], "error": tail[:200]}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def best(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One method's rounds as one result: the best times (load only ever adds time), the largest peak RSS, and
    every backend ``auto`` chose (it measures, so a loaded round may choose differently)."""
    ok = [r for r in rounds if "error" not in r]
    if not ok:
        return dict(rounds[-1])
    out = dict(min(ok, key=lambda r: r["per_sample_s"] if math.isfinite(r["per_sample_s"]) else r["wall_s"]))
    out["wall_s"] = min(r["wall_s"] for r in ok)
    out["peak_rss_mb"] = max(r["peak_rss_mb"] for r in ok)
    out["rounds"] = len(ok)
    backends = sorted({r.get("backend") or "" for r in ok} - {""})
    if len(backends) > 1:
        out["backend"] = "/".join(backends)
    return out


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}×" if a and b and math.isfinite(a) and math.isfinite(b) else "–"


def table(results: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown rows: model × N, the floor, each method's per-sample and end-to-end ratio and peak RSS."""
    head = (
        "| model | N | floor s/sample | floor e2e s | method | per-sample ÷ floor | end-to-end ÷ floor "
        "| peak RSS MB | backend (auto's reason) |"
    )
    rows = [head, "|" + "---|" * 9]
    for r in results:
        floors = {x["n"]: x for x in r["runs"] if x["method"] == "floor" and "error" not in x}
        for x in r["runs"]:
            floor = floors.get(x["n"])
            fps, fwall = (floor["per_sample_s"], floor["wall_s"]) if floor else (None, None)
            lead = f"| {r['model']} | {x['n']} | " + (f"{fps:.4f} | {fwall:.2f} |" if fps and fwall else "– | – |")
            if "error" in x:
                rows.append(f"{lead} {x['method']} | error: {x['error']} | | | |")
                continue
            why = x.get("backend") or ""
            if x["method"] == "auto" and x.get("reason"):
                why += f" ({x['reason']})"
            if x["method"] == "batch8":
                why += f", batch {x.get('batch', 1)}" + (f" ({x['batch_reason']})" if x.get("batch_reason") else "")
            if x.get("segments", 1) > 1:
                why += f", {x['segments']} segments"
            ps, e2e = _ratio(x["per_sample_s"], fps), _ratio(x["wall_s"], fwall)
            rows.append(f"{lead} {x['method']} | {ps} | {e2e} | {x['peak_rss_mb']:.0f} | {why} |")
    return rows


def _cell(results: Sequence[dict[str, Any]], model: str, n: int, method: str) -> dict[str, Any] | None:
    for r in results:
        if r["model"] == model:
            for x in r["runs"]:
                if x["n"] == n and x["method"] == method and "error" not in x:
                    return dict(x)
    return None


def checks(results: Sequence[dict[str, Any]]) -> list[str]:
    """Issue 12's goals per model, for ``auto`` (the default): measurements, never assertions."""
    lines = []
    for model in dict.fromkeys(r["model"] for r in results):
        ns = sorted({x["n"] for r in results if r["model"] == model for x in r["runs"]})
        floor = {n: _cell(results, model, n, "floor") for n in ns}
        auto = {n: _cell(results, model, n, "auto") for n in ns}
        per = [f"N={n}: {_ratio(a['per_sample_s'], f['per_sample_s'])}" for n in ns
               if (a := auto[n]) and (f := floor[n])]  # fmt: skip
        e2e = [f"N={n}: {_ratio(a['wall_s'], f['wall_s'])}" for n in ns if (a := auto[n]) and (f := floor[n])]
        peak = max((a["peak_rss_mb"] for a in auto.values() if a), default=float("nan"))
        grow = (
            f"{auto[ns[-1]]['peak_rss_mb'] / auto[ns[0]]['peak_rss_mb']:.2f}× (N={ns[-1]} / N={ns[0]})"  # type: ignore[index]
            if len(ns) > 1 and auto[ns[0]] and auto[ns[-1]]
            else "–"
        )
        faster = []
        for n in ns:
            singles = [c for m in ("numpy", "graph") if (c := _cell(results, model, n, m))]
            if auto[n] and singles:
                best_wall = min(c["wall_s"] for c in singles)
                faster.append(f"N={n}: {_ratio(auto[n]['wall_s'], best_wall)}")  # type: ignore[index]
        lines.append(
            f"- **{model}** (auto): per-sample ÷ floor {', '.join(per)} (goal ≤ 1.5×); end-to-end ÷ floor "
            f"{', '.join(e2e)} (goal ≤ 2× at N=64); peak RSS ≤ {peak:.0f} MB (goal ≤ 1024), growth {grow} "
            f"(goal ≤ 1.1×); end-to-end ÷ the faster single backend {', '.join(faster) or '–'} (goal ≤ 1×)"
        )
    return lines


def write_markdown(path: Path, rows: list[str], command: str) -> None:
    """Replace the section between the markers in ``path`` (append it if absent), atomically."""
    import onnxruntime

    env = (
        f"Machine: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}, "
        f"onnxruntime {onnxruntime.__version__}; shared with other developers' test runs (compare ratios). "
        f"Load average at the end: {os.getloadavg()[0]:.1f}."
    )
    replace_section(path, "\n".join([BEGIN, "", f"Command: `{command}`", "", env, "", *rows, "", END]), BEGIN, END)


def replace_section(path: Path, section: str, begin: str, end: str) -> None:
    """Put ``section`` (which starts with ``begin`` and ends with ``end``) in place of the text between those
    markers in ``path``, or append it; atomically (benchmark scripts share this)."""
    text = path.read_text() if path.exists() else ""
    if begin in text and end in text:
        text = text[: text.index(begin)] + section + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def main(argv: Sequence[str] | None = None) -> int:
    """Run every model × N × method, print the table, optionally write it into a Markdown file and JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    p.add_argument("--samples", nargs="+", type=int, default=[8, 64, 256])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--work", type=Path, default=Path("/tmp/qdebug-bench"))
    p.add_argument("--markdown", type=Path)
    p.add_argument("--json", type=Path)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--repeats", type=int, default=2, help="interleaved rounds; the best time of each is kept")
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child_main(json.loads(args.child))))
        return 0
    results = []
    for model in args.models:
        fp, qp, big = prepare(model, args.work, max(args.samples))
        runs = []
        for n in args.samples:
            folder = split(big, n, args.work / "data" / model / f"n{n}")
            rounds: dict[str, list[dict[str, Any]]] = {m: [] for m in args.methods}
            for _ in range(args.repeats):  # interleaved: a burst of background load hits every method alike
                for method in args.methods:
                    spec = {"float": str(fp), "quant": str(qp), "data": str(folder), "method": method, "n": n}
                    rounds[method].append(run_child(spec, args.timeout))
                    print(model, n, json.dumps(rounds[method][-1]), flush=True)
            runs += [best(rounds[m]) for m in args.methods]
        results.append({"model": model, "runs": runs})
    rows = table(results)
    print("\n".join(rows))
    command = "benchmarks/bench_realmodels.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.markdown:
        write_markdown(args.markdown, rows, command)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
