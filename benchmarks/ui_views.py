"""The views on real models, live in Debian's chromium: the dashboard's timings and the screenshots of docs/ui.md,
on corpus models (``~/.cache/qdebug/realmodels``, see benchmarks/realmodels/README.md). Every page is served as
``qdebug dashboard`` serves it (:func:`qdebug.cli.dashboard.voila_command`: qdebug's template, 127.0.0.1) and
every request to another host is aborted.

**Dashboard** (``notebooks/dashboard.ipynb``, a fresh server per round), as a user works with it:

* **page ready**: page requested → the form's Run button visible;
* **Run**: the corpus model as a file on the server, data: an ``.npz`` of the first ``--samples`` (default 8) samples
  of its ``eval.npz`` (quantized with them, then debugged on them), target cpu → the debugger shown;
* **graph tab**: click the Graph tab → its groups drawn (the figure was built during Run);
* **expand all**: click "expand all" → every tensor of the model drawn; then **collapse all**;
* **promote round trip**: tick the first suggestion, click Promote → the status says promoted (re-quantized with
  the cached calibration, re-debugged, recompiled for cpu, before/after shown).

**Debugger** (a one-cell notebook, :func:`widgets.notebook.debugger_notebook`, on the float model and its QDQ model
quantized with ``calib.npz``, uint8 activations / int8 weights, cached in ``--work``): with ``--images``, the
screenshots — the grouped graph, the worst tensor found by name (its group expanded), the inspector of a tensor
(``--inspect MODEL=TENSOR``, default the worst) and its weights per channel, the heatmap grouped by scope.

Usage::

    .venv/bin/python benchmarks/ui_views.py [--models yolov8n-nudenet ppocrv4-rec] [--samples 8] [--repeats 1]
        [--skip-dashboard] [--images docs/images] [--inspect ppocrv4-rec=p2o.ReduceMean.19] [--work DIR]
        [--markdown PATH]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
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

from bench_ui import CHROMIUM, CHROMIUM_ARGS, DASHBOARD, LOCAL, voila  # noqa: E402

from widgets.notebook import debugger_notebook  # noqa: E402

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


def _full_width(page: Any, sel: str) -> None:
    """Wait until the figure under ``sel`` is drawn as wide as its container (widgets/resize.py resizes it after
    each draw), so a screenshot shows the figure as the user sees it."""
    js = f"""() => {{ const el = document.querySelector({sel!r}); const svg = el && el.querySelector('.main-svg');
        return !!svg && Math.abs(+svg.getAttribute('width') - el.parentElement.clientWidth) <= 2; }}"""
    page.wait_for_function(js, timeout=SHOT_MS, polling=100)


def _count_at_least(page: Any, n: int) -> None:
    page.wait_for_function(f"document.querySelectorAll({NODES!r}).length >= {n}", timeout=TIMEOUT_MS, polling=50)


def _graph_rounds(page: Any, out: dict[str, float]) -> int:
    """Graph tab open: expand all, collapse all (timed); returns the number of groups."""
    groups = page.locator(NODES).count()
    out["groups"] = groups
    note = page.locator(".qd-graph-note").inner_text()
    out["tensors"] = tensors = int(re.search(r"(\d+) tensors in", note).group(1))  # type: ignore[union-attr]
    t0 = time.perf_counter()
    page.locator(".qd-graph-expand-all").click()
    _count_at_least(page, tensors)
    out["expand all"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    page.locator(".qd-graph-collapse-all").click()
    page.wait_for_function(f"document.querySelectorAll({NODES!r}).length === {groups}", timeout=TIMEOUT_MS, polling=50)
    out["collapse all"] = time.perf_counter() - t0
    return groups


def drive_dashboard(page: Any, port: int, model: Path, data: Path, shots: Path | None = None) -> dict[str, float]:
    """One dashboard round (module docstring): page ready, Run, expand/collapse all, promote round trip (s); with
    ``shots``, the app after Run and after the promotion is photographed there (after each timing is taken)."""
    from playwright.sync_api import expect

    out: dict[str, float] = {}
    t0 = time.perf_counter()
    page.goto(f"http://127.0.0.1:{port}/", wait_until="commit", timeout=TIMEOUT_MS)
    expect(page.locator(".qd-dash-run")).to_be_visible(timeout=TIMEOUT_MS)
    out["page ready"] = time.perf_counter() - t0
    page.locator(".qd-dash-source button", has_text="file on the server").click()
    box = page.locator(".qd-dash-model-path input")
    box.fill(str(model))
    box.press("Enter")
    page.locator(".qd-dash-data-choice select").select_option(label="file on the server (.npz)")
    dbox = page.locator(".qd-dash-data input")
    dbox.fill(str(data))
    dbox.press("Enter")
    t0 = time.perf_counter()
    page.locator(".qd-dash-run").click()
    page.locator(".qd-dash-ok, .qd-dash-error").first.wait_for(timeout=TIMEOUT_MS)
    if page.locator(".qd-dash-error").count():
        raise RuntimeError(f"Run failed: {page.locator('.qd-dash-error').first.inner_text()}")
    app = page.locator(".qd-app")
    expect(app.locator(".qd-promote")).to_be_visible(timeout=TIMEOUT_MS)
    out["Run"] = time.perf_counter() - t0
    if shots is not None:
        app.screenshot(path=str(shots / f"dashboard_table_{model.stem}.png"))
    t0 = time.perf_counter()
    app.get_by_role("tab", name="Graph").click()
    page.locator(NODES).first.wait_for(timeout=TIMEOUT_MS)
    out["graph tab"] = time.perf_counter() - t0
    _graph_rounds(page, out)
    boxes = app.locator(".qd-suggestion input[type=checkbox]")
    if boxes.count() == 0:
        boxes = app.locator(".qd-row-check input[type=checkbox]")
    boxes.first.check()
    page.evaluate(_STATUS_LOG)
    t0 = time.perf_counter()
    app.locator(".qd-promote").click()
    status = app.locator(".qd-status")
    expect(status).to_contain_text(re.compile("promoted|promotion failed"), timeout=TIMEOUT_MS)
    if "promotion failed" in (status.text_content() or ""):
        raise RuntimeError(f"promotion failed: {status.text_content()}")
    out["promote round trip"] = time.perf_counter() - t0
    _print_timeline("promote", page.evaluate("() => window.__qdStatus"))
    if shots is not None:
        app.get_by_role("tab", name="Before/after").click()
        page.wait_for_timeout(1500)  # the comparison figure's resize after its tab opens
        app.screenshot(path=str(shots / f"dashboard_after_promote_{model.stem}.png"))
    return out


#: Records every text the status line shows, with the page's clock (ms), into ``window.__qdStatus``: where a round
#: trip's time goes as the user sees it (the kernel's steps, then the views redrawn after the last one).
_STATUS_LOG = """() => {
  const el = document.querySelector('.qd-app .qd-status');
  const log = window.__qdStatus = [[performance.now(), el.textContent]];
  new MutationObserver(() => log.push([performance.now(), el.textContent]))
    .observe(el, { childList: true, subtree: true, characterData: true });
}"""


def _print_timeline(what: str, log: list[tuple[float, str]]) -> None:
    """One line per status change: seconds since the click, and the status text (counted steps collapsed)."""
    t0, last = log[0][0], ""
    for t, text in log[1:]:
        step = re.sub(r"\d+/\d+.*", "k/N", text.strip())
        if step != last:
            print(f"  {what} +{(t - t0) / 1000:6.2f}s  {text.strip()[:110]}", file=sys.stderr, flush=True)
        last = step


def drive_debugger(page: Any, port: int, model: str, images: Path, inspect: str | None) -> None:
    """The screenshots, on the debugger notebook (Graph tab open)."""
    page.goto(f"http://127.0.0.1:{port}/", wait_until="commit", timeout=TIMEOUT_MS)
    page.locator(NODES).first.wait_for(timeout=TIMEOUT_MS)
    _full_width(page, ".qd-graph")
    page.locator(".qd-graph").screenshot(path=str(images / f"ui_graph_{model}.png"))
    print(f"{model}: graph shown", file=sys.stderr, flush=True)
    for step in (_shot_worst, _shot_inspector, _shot_heatmap):
        try:  # one failed screenshot must not cost the others
            step(page, images, model, inspect)
        except Exception as exc:
            print(f"{model}: {step.__name__} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


SHOT_MS = 240_000
#: The screenshots' viewport height (px): taller than the page, so nothing is scrolled. Voila's page scrolls inside
#: its own container, and chromium draws nothing of an element below the viewport (a 2200 px graph came out cut
#: at 1400 px, the rest white).
SHOT_HEIGHT = 4000


def _shot_worst(page: Any, images: Path, model: str, inspect: str | None) -> None:
    """Find the worst tensor by name (the graph's note names it): its group expands, the inspector shows it."""
    worst = page.locator(".qd-graph-note b").first.inner_text()
    box = page.locator(".qd-graph-search input")
    box.fill(worst)
    box.press("Enter")
    page.locator(".qd-inspector").filter(has_text=worst).first.wait_for(timeout=SHOT_MS)
    page.locator(NODES).first.wait_for(timeout=SHOT_MS)
    _full_width(page, ".qd-graph")
    page.locator(".qd-graph").screenshot(path=str(images / f"ui_graph_worst_{model}.png"))


def _shot_inspector(page: Any, images: Path, model: str, inspect: str | None) -> None:
    if inspect:  # a chosen tensor (e.g. one whose values saturate the grid), selected by the search box
        box = page.locator(".qd-graph-search input")
        box.fill(inspect)
        box.press("Enter")
        page.locator(".qd-inspector").filter(has_text=inspect).first.wait_for(timeout=SHOT_MS)
    panel = page.locator(".qd-inspector-panel")
    panel.locator(".qd-histogram .bars").first.wait_for(state="attached", timeout=SHOT_MS)
    panel.screenshot(path=str(images / f"ui_inspector_{model}.png"))
    panel.locator(".lm-TabBar-tab", has_text="weights per channel").first.click()
    panel.locator(".qd-channels .bars, i").first.wait_for(state="attached", timeout=SHOT_MS)
    panel.screenshot(path=str(images / f"ui_weights_{model}.png"))


def _shot_heatmap(page: Any, images: Path, model: str, inspect: str | None) -> None:
    page.locator(".lm-TabBar-tab", has_text="Heatmap").first.click()
    page.locator(".qd-heatmap-groups input").check()
    page.locator(".qd-heatmap .xtick").first.wait_for(timeout=SHOT_MS)
    _full_width(page, ".qd-heatmap")
    page.locator(".qd-heatmap").first.screenshot(path=str(images / f"ui_heatmap_{model}.png"))


def _context(browser: Any, height: int) -> Any:
    ctx = browser.new_context(viewport={"width": 1500, "height": height})
    ctx.route(re.compile(r".*"), lambda rt: rt.continue_() if LOCAL.match(rt.request.url) else rt.abort())
    return ctx


def run_model(model: str, args: argparse.Namespace, work: Path) -> list[dict[str, float]]:
    """The dashboard rounds (timings) and, with ``--images``, one debugger round (screenshots) of one model."""
    from playwright.sync_api import sync_playwright

    f, q, data = prepare(model, args.samples, work)
    root = work / f"{model}-root"  # the dashboard's file root: the model and the data (copies: paths are confined)
    root.mkdir(parents=True, exist_ok=True)
    for src in (f, data):
        if not (root / src.name).is_file():
            shutil.copy2(src, root / src.name)
    rounds = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            for r in range(0 if args.skip_dashboard else args.repeats):
                with voila(DASHBOARD, work / f"{model}-dash{r}", root=root) as (port, _):
                    ctx = _context(browser, 1600)
                    shots = args.images if args.images is not None and r == 0 else None
                    rounds.append(drive_dashboard(ctx.new_page(), port, root / f.name, root / data.name, shots))
                    ctx.close()
                print(f"{model}: dashboard round {r}: {rounds[-1]}", file=sys.stderr, flush=True)
            if args.images is not None:
                rw = work / f"{model}-shots"
                rw.mkdir(parents=True, exist_ok=True)
                nb = rw / f"views_{model.replace('-', '_')}.ipynb"
                debugger_notebook(nb, f, q, data, rw / "dbg", tab="Graph", import_root=ROOT)
                with voila(nb, rw) as (port, _):
                    ctx = _context(browser, SHOT_HEIGHT)
                    drive_debugger(ctx.new_page(), port, model, args.images, args.inspect.get(model))
                    ctx.close()
        finally:
            browser.close()
    return rounds


KEYS = ("page ready", "Run", "graph tab", "expand all", "collapse all", "promote round trip")


def render(results: dict[str, list[dict[str, float]]], args: argparse.Namespace, load: tuple[float, ...]) -> str:
    lines = [
        f"`benchmarks/ui_views.py --samples {args.samples} --repeats {args.repeats}` — the dashboard in Debian's "
        f"chromium, seconds, best / median of {args.repeats} round(s); {os.cpu_count()} cores {platform.machine()}, "
        f"load average {load[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end",
        "",
        "| model | tensors | groups | " + " | ".join(KEYS) + " |",
        "|---|---|---|" + "---|" * len(KEYS),
    ]
    for model, rounds in results.items():
        if not rounds:
            continue
        cells = []
        for k in KEYS:
            vals = [r[k] for r in rounds]
            cells.append(f"{min(vals):.2f} / {statistics.median(vals):.2f}")
        lines.append(
            f"| {model} | {int(rounds[0]['tensors'])} | {int(rounds[0]['groups'])} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["yolov8n-nudenet", "ppocrv4-rec"])
    ap.add_argument("--samples", type=int, default=8, help="samples of the Run (first N of eval.npz)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--skip-dashboard", action="store_true", help="screenshots only")
    ap.add_argument("--images", type=Path, help="write the screenshots here (e.g. docs/images)")
    ap.add_argument("--inspect", action="append", default=[], metavar="MODEL=TENSOR",
                    help="the tensor whose inspector is photographed (default: the worst)")  # fmt: skip
    ap.add_argument("--work", type=Path, help="keep quantized models here between runs (default: a temp dir)")
    ap.add_argument("--markdown", type=Path, help="also write the table here (atomically)")
    args = ap.parse_args(argv)
    args.inspect = dict(x.split("=", 1) for x in args.inspect)
    if args.images is not None:
        args.images.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="qdebug-ui-views-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        results = {m: run_model(m, args, work) for m in args.models}
    table = render(results, args, load)
    print(table)
    if args.markdown is not None:
        from qdebug.io import atomic_write_text

        atomic_write_text(args.markdown, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
