"""The views on real models: screenshots for docs/ui.md and the graph timings of the live debugger, on corpus
models (``~/.cache/qdebug/realmodels``, see benchmarks/realmodels/README.md).

Per model: the float model is quantized (uint8 activations, int8 weights, its ``calib.npz``; cached in
``--work``), the first ``--samples`` samples of ``eval.npz`` are the debug data; then ``DebuggerApp`` on that
pair is served by Voila (127.0.0.1) and driven in Debian's chromium (non-local requests aborted):

* **debugger shown**: page requested → the graph's nodes drawn (debug of the pair + every view, in the kernel);
* **expand all**: click → every tensor of the model drawn (layout + figure in the kernel, transfer, plotly);
* **collapse all**: click → the grouped view drawn again;

and screenshots: the grouped graph, the worst tensor found by name (its group expanded), the inspector of that
tensor (grid statistics, histogram), its weights per channel, and the heatmap grouped by scope.

Usage::

    .venv/bin/python benchmarks/ui_views.py [--models yolov8n-nudenet ppocrv4-rec] [--samples 4] [--repeats 1]
        [--images docs/images] [--work DIR] [--markdown PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from bench_ui import CHROMIUM, CHROMIUM_ARGS, LOCAL, voila  # noqa: E402

CORPUS = Path(os.environ.get("QDEBUG_CORPUS_DIR", Path.home() / ".cache" / "qdebug" / "realmodels"))
NODES = ".qd-graph .scatterlayer .trace:nth-of-type(3) .points path"
TIMEOUT_MS = 600_000


def prepare(model: str, samples: int, work: Path) -> tuple[Path, Path, Path]:
    """(float model, quantized model, debug data) of one corpus model; the quantized model is cached in ``work``."""
    import qdebug
    from qdebug.config import QuantConfig

    src = CORPUS / model
    f = src / f"{model}.onnx"
    if not f.is_file():
        raise SystemExit(f"{f} missing: fetch the corpus first (benchmarks/realmodels/README.md)")
    q = work / f"{model}.qdq.onnx"
    if not q.is_file():
        cfg = QuantConfig(activation_type="uint8", weight_type="int8")
        qdebug.quantize(f, src / "calib.npz", cfg, q)
    data = work / f"{model}.eval{samples}.npz"
    if not data.is_file():
        with np.load(src / "eval.npz") as d:
            np.savez(data, **{k: d[k][:samples] for k in d.files})
    return f, q, data


def notebook(path: Path, f: Path, q: Path, data: Path, workdir: Path) -> Path:
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
        "from widgets.app import DebuggerApp\nfrom widgets.session import QuantDebugger\n"
        f"dbg = QuantDebugger({str(f)!r}, {str(q)!r}, {str(data)!r}, workdir={str(workdir)!r})\n"
        "app = DebuggerApp(dbg)\napp"
    )
    nb = {
        "cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": code}],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb), encoding="utf-8")
    return path


def _count_at_least(page: Any, n: int) -> None:
    page.wait_for_function(f"document.querySelectorAll({NODES!r}).length >= {n}", timeout=TIMEOUT_MS, polling=50)


def drive(page: Any, port: int, model: str, images: Path | None) -> dict[str, float]:
    """One round on a served debugger: timings (s) and, with ``images``, the screenshots."""
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    page.goto(f"http://127.0.0.1:{port}/", wait_until="commit", timeout=TIMEOUT_MS)
    page.locator(".qd-table").first.wait_for(timeout=TIMEOUT_MS)
    page.locator(".lm-TabBar-tab", has_text="Graph").first.click()  # as a user does: the tab opens at full width
    page.locator(NODES).first.wait_for(timeout=TIMEOUT_MS)
    out["debugger shown (debug + views)"] = time.perf_counter() - t0
    groups = page.locator(NODES).count()
    out["groups"] = groups
    note = page.locator(".qd-graph-note").inner_text()
    tensors = int(re.search(r"(\d+) tensors in", note).group(1))  # type: ignore[union-attr]
    out["tensors"] = tensors
    if images is not None:
        page.locator(".qd-graph").screenshot(path=str(images / f"ui_graph_{model}.png"))
    t0 = time.perf_counter()
    page.locator(".qd-graph-expand-all").click()
    _count_at_least(page, tensors)
    out["expand all → every tensor drawn"] = time.perf_counter() - t0
    if images is not None:
        page.locator(".qd-graph").screenshot(path=str(images / f"ui_graph_all_{model}.png"))
    t0 = time.perf_counter()
    page.locator(".qd-graph-collapse-all").click()
    page.wait_for_function(f"document.querySelectorAll({NODES!r}).length === {groups}", timeout=TIMEOUT_MS, polling=50)
    print(f"{model}: timings done", file=sys.stderr, flush=True)
    out["collapse all → groups drawn"] = time.perf_counter() - t0
    if images is not None:
        for step in (_shot_worst, _shot_inspector, _shot_heatmap):
            try:  # one failed screenshot must not cost the others (nor the timings above)
                step(page, images, model)
            except Exception as exc:
                print(f"{model}: {step.__name__} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    return out


SHOT_MS = 240_000


def _shot_worst(page: Any, images: Path, model: str) -> None:
    """Find the worst tensor by name (the graph's note names it): its group expands, the inspector shows it."""
    worst = page.locator(".qd-graph-note b").first.inner_text()
    box = page.locator(".qd-graph-search input")
    box.fill(worst)
    box.press("Enter")
    page.locator(".qd-inspector").filter(has_text=worst).first.wait_for(timeout=SHOT_MS)
    page.locator(NODES).first.wait_for(timeout=SHOT_MS)
    page.locator(".qd-graph").screenshot(path=str(images / f"ui_graph_worst_{model}.png"))


def _shot_inspector(page: Any, images: Path, model: str) -> None:
    panel = page.locator(".qd-inspector-panel")
    panel.locator(".qd-histogram .bars").first.wait_for(state="attached", timeout=SHOT_MS)
    panel.screenshot(path=str(images / f"ui_inspector_{model}.png"))
    panel.locator(".lm-TabBar-tab", has_text="weights per channel").first.click()
    panel.locator(".qd-channels .bars, i").first.wait_for(state="attached", timeout=SHOT_MS)
    panel.screenshot(path=str(images / f"ui_weights_{model}.png"))


def _shot_heatmap(page: Any, images: Path, model: str) -> None:
    page.locator(".lm-TabBar-tab", has_text="Heatmap").first.click()
    page.locator(".qd-heatmap-groups input").check()
    page.locator(".qd-heatmap .xtick").first.wait_for(timeout=SHOT_MS)
    page.locator(".qd-heatmap").first.screenshot(path=str(images / f"ui_heatmap_{model}.png"))


def run_model(model: str, args: argparse.Namespace, work: Path) -> list[dict[str, float]]:
    from playwright.sync_api import sync_playwright

    f, q, data = prepare(model, args.samples, work)
    rounds = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            for r in range(args.repeats):
                rw = work / f"{model}-round{r}"
                rw.mkdir(parents=True, exist_ok=True)
                nb = notebook(rw / f"views_{model.replace('-', '_')}.ipynb", f, q, data, rw / "dbg")
                with voila(nb, rw) as (port, _):
                    ctx = browser.new_context(viewport={"width": 1500, "height": 2600})
                    ctx.route(
                        re.compile(r".*"), lambda rt: rt.continue_() if LOCAL.match(rt.request.url) else rt.abort()
                    )
                    page = ctx.new_page()
                    shots = args.images if (r == 0 and args.images is not None) else None
                    rounds.append(drive(page, port, model, shots))
                    ctx.close()
        finally:
            browser.close()
    return rounds


def render(results: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> str:
    lines = [
        f"`benchmarks/ui_views.py --samples {args.samples} --repeats {args.repeats}` — seconds, best / median of "
        f"{args.repeats} round(s); {os.cpu_count()} cores, load average at the end {os.getloadavg()[0]:.1f}",
        "",
        "| model | tensors | groups | debugger shown (debug + views) | expand all → every tensor drawn "
        "| collapse all → groups drawn |",
        "|---|---|---|---|---|---|",
    ]
    keys = ("debugger shown (debug + views)", "expand all → every tensor drawn", "collapse all → groups drawn")
    for model, rounds in results.items():
        cells = []
        for k in keys:
            vals = [r[k] for r in rounds]
            cells.append(f"{min(vals):.2f} / {statistics.median(vals):.2f}")
        lines.append(
            f"| {model} | {int(rounds[0]['tensors'])} | {int(rounds[0]['groups'])} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["yolov8n-nudenet", "ppocrv4-rec"])
    ap.add_argument("--samples", type=int, default=4, help="debug samples (first N of eval.npz)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--images", type=Path, help="write the screenshots here (e.g. docs/images)")
    ap.add_argument("--work", type=Path, help="keep quantized models here between runs (default: a temp dir)")
    ap.add_argument("--markdown", type=Path, help="also write the table here (atomically)")
    args = ap.parse_args(argv)
    if args.images is not None:
        args.images.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="qdebug-ui-views-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        results = {m: run_model(m, args, work) for m in args.models}
    table = render(results, args)
    print(table)
    if args.markdown is not None:
        from qdebug.io import atomic_write_text

        atomic_write_text(args.markdown, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
