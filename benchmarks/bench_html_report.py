"""What the one-file HTML report costs: its size, the time to write it, and the time Chromium takes to draw it.

Input: a debug report JSON (``qdebug debug -o``), optionally with both models and data for the full diagnostics
(``--float-model/--quant-model/--data``). Timed in this process: the diagnostics (statistics pass included) and
:func:`qdebug.render.html.report_html`. Then the file is opened ``--repeats`` times from disk (``file://``) in
Debian's chromium (Playwright, a fresh context per round, every request that is not ``file:``/``data:``/``blob:``
aborted and counted). The page paints its verdict and tables first and draws each figure when it comes into view
(:mod:`qdebug.render.html`), so "rendered" means: the content is visible *and* the first figure is drawn, for a
reader who scrolls to the figures at once. Read in the page, in ms since navigation start: the first contentful
paint, ``window.qdReadyAt`` (plotly.js unpacked and compiled), ``window.qdDrawnAt[first figure]`` after scrolling
it into view right after load (**rendered**), and every figure drawn, each scrolled to in turn; ``window.qdTimes``
has the parts. The same is measured on a **floor** page — plotly.js inline in a plain script tag and one empty
plot, what any self-contained plotly page pays — and the report's time is given as a ratio to it, so a loaded
machine shows in both. ``--baseline OLD.html`` (a report written by qdebug before figures were drawn lazily, e.g.
from a checkout of an earlier commit) is measured in the same interleaved rounds: the before/after ratio.

Targets (issue 17): < 5 MB, renders in Chromium < 3 s, on the largest corpus model (vit-s-focus). This is a
measurement, not a test: it never fails on timing.

Usage::

    M=~/.cache/qdebug/realmodels/vit-s-focus
    .venv/bin/qdebug quantize -f $M/vit-s-focus.onnx --calib $M/calib.npz -o /tmp/vit-q.onnx --no-output-check
    .venv/bin/qdebug debug -f $M/vit-s-focus.onnx -q /tmp/vit-q.onnx -d $M/eval.npz --max-samples 8 -o /tmp/vit.json
    .venv/bin/python benchmarks/bench_html_report.py /tmp/vit.json -f $M/vit-s-focus.onnx -q /tmp/vit-q.onnx \\
        -d $M/eval.npz [--stats-samples 8] [--repeats 3] [-o /tmp/vit.html]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
OFFLINE = re.compile(r"^(file|data|blob):")


def floor_page(path: Path) -> Path:
    """The floor: plotly.js inline in a plain ``<script>`` (as plotly's own ``include_plotlyjs=True`` writes it)
    and one empty plot — what any self-contained plotly page pays before drawing anything."""
    from qdebug.render.html_plotly import _plotly_offline

    js = _plotly_offline.get_plotlyjs()
    path.write_text(
        f"<!DOCTYPE html><html><body><div id='a'></div><script>{js}</script><script>"
        "Plotly.newPlot('a', [], {}).then(() => { window.qdRenderMs = performance.now(); "
        "window.qdDoneAt = performance.now(); window.qdTimes = {}; document.body.dataset.qdRendered = '0'; });"
        "</script></body></html>",
        encoding="utf-8",
    )
    return path


def _drawn(page, fig: str) -> float:  # type: ignore[no-untyped-def]
    """Scroll ``fig`` into view as a reader would, wait until it is drawn; ms since navigation start."""
    page.evaluate(f"document.getElementById({fig!r}).scrollIntoView()")
    page.wait_for_selector(f"#{fig}[data-qd-drawn]", timeout=120_000, state="attached")
    return float(page.evaluate(f"window.qdDrawnAt[{fig!r}]"))


def browser_times(path: Path, repeats: int, floor: bool = False) -> list[dict[str, float]]:
    """Per round, ms since navigation start: ``paint`` (first contentful paint: the verdict and tables),
    ``ready`` (plotly.js compiled), ``first`` (the first figure drawn, the reader scrolling to it at once: the
    page has *rendered*), ``all`` (every figure drawn, scrolled to in turn); ``wall`` (s, goto → first) and
    ``blocked`` requests. The floor page has one empty plot: ``first`` = ``all`` = its plot drawn."""
    from playwright.sync_api import sync_playwright

    out = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        for _ in range(repeats):
            ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
            blocked: list[str] = []

            def route(r, blocked=blocked):  # type: ignore[no-untyped-def]
                if OFFLINE.match(r.request.url):
                    r.continue_()
                else:
                    blocked.append(r.request.url)
                    r.abort()

            ctx.route(re.compile(".*"), route)
            page = ctx.new_page()
            t0 = time.perf_counter()
            page.goto(path.as_uri())
            figs = [] if floor else page.eval_on_selector_all(".fig", "els => els.map(e => e.id)")
            r: dict[str, float] = {}
            if floor:
                page.wait_for_selector("body[data-qd-rendered]", timeout=120_000, state="attached")
                r["first"] = r["all"] = r["ready"] = float(page.evaluate("window.qdDoneAt"))
            else:
                r["first"] = _drawn(page, figs[0])
                r["all"] = max([r["first"], *(_drawn(page, f) for f in figs[1:])])
                r["ready"] = float(page.evaluate("window.qdReadyAt"))
            r["wall"] = time.perf_counter() - t0
            if page.evaluate("document.body.dataset.qdRendered") == "error":
                raise SystemExit(f"the page failed to draw: {page.inner_text('#figures')[:300]}")
            r["paint"] = float(
                page.evaluate("performance.getEntriesByName('first-contentful-paint')[0]?.startTime ?? NaN")
            )
            r["blocked"] = len(blocked)
            parts = page.evaluate("window.qdTimes")
            if parts:
                print("  round:", ", ".join(f"{k} {v / 1000:.2f} s" for k, v in parts.items()), flush=True)
            out.append(r)
            ctx.close()
        browser.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report")
    ap.add_argument("--float-model", "-f")
    ap.add_argument("--quant-model", "-q")
    ap.add_argument("--data", "-d")
    ap.add_argument("--stats-samples", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--output", "-o", help="keep the HTML here (default: a temp file, removed)")
    ap.add_argument(
        "--baseline",
        metavar="HTML",
        help="a report written by an earlier qdebug that draws every figure at load (sets data-qd-rendered and "
        "qdDoneAt when done): measured in the same rounds, as its last figure drawn",
    )
    a = ap.parse_args()

    from qdebug.diagnose import diagnose, diagnose_models
    from qdebug.mixed.suggest import suggest
    from qdebug.render.html import plotly_bundle, report_html
    from qdebug.report import DebugReport

    report = DebugReport.load(a.report)
    t = time.perf_counter()
    if a.float_model and a.quant_model:
        diags = diagnose_models(report, a.float_model, a.quant_model, a.data, max_samples=a.stats_samples)
    else:
        diags = diagnose(report)
    t_diag = time.perf_counter() - t
    plotly_bundle(), plotly_bundle(True)  # compressing plotly.js happens once per process: timed apart
    t = time.perf_counter()
    page = report_html(report, diagnostics=diags, suggestions=suggest(report))
    t_html = time.perf_counter() - t
    tmp = None
    if a.output:
        path = Path(a.output)
    else:
        fd, name = tempfile.mkstemp(suffix=".html")
        os.close(fd)
        path = tmp = Path(name)
    path.write_text(page, encoding="utf-8")
    size = path.stat().st_size
    fd, name = tempfile.mkstemp(suffix=".html")
    os.close(fd)
    floor_path = floor_page(Path(name))
    rounds: list[dict[str, float]] = []
    floor: list[dict[str, float]] = []
    base: list[dict[str, float]] = []
    try:  # interleaved, one round of each at a time: a load change on a shared machine hits all of them alike
        for _ in range(a.repeats):
            rounds += browser_times(path, 1)
            floor += browser_times(floor_path, 1, floor=True)
            if a.baseline:
                base += browser_times(Path(a.baseline).resolve(), 1, floor=True)
    finally:
        floor_path.unlink()
        if tmp is not None:
            tmp.unlink()

    def med(rs: list[dict[str, float]], k: str) -> float:
        return statistics.median(r[k] for r in rs) / (1 if k == "wall" else 1000)

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.python_implementation()} "
          f"{platform.python_version()}; chromium {CHROMIUM}")  # fmt: skip
    print(f"report: {a.report}: {len(report.activations)} tensors, {report.per_sample.values.shape[0]} samples")
    print(f"diagnostics: {len(diags)} found in {t_diag:.1f} s ({diags.stats_samples} statistics samples)")
    print(f"HTML written in {t_html:.2f} s (plus plotly.js compression once per process)")
    print(f"size: {size / 1e6:.2f} MB  ({size / 5e6:.2f} x the 5 MB goal)")
    print(f"chromium, medians of {a.repeats} (s since navigation start):")
    print(f"  verdict and tables painted (first contentful paint): {med(rounds, 'paint'):.2f}")
    print(f"  plotly.js ready: {med(rounds, 'ready'):.2f}")
    first, floor_s = med(rounds, "first"), med(floor, "first")
    print(
        f"  RENDERED (first figure drawn, scrolled to at once): {first:.2f}  ({first / 3:.2f} x the 3 s goal); "
        f"best {min(r['first'] for r in rounds) / 1000:.2f}"
    )
    print(f"  every figure drawn (each scrolled to in turn): {med(rounds, 'all'):.2f}")
    print(f"  wall, goto -> first figure drawn (as Python sees it): {med(rounds, 'wall'):.2f}")
    print(
        f"floor (plotly.js inline + one empty plot): {floor_s:.2f} s; rendered / floor: {first / floor_s:.2f} x, "
        f"every figure / floor: {med(rounds, 'all') / floor_s:.2f} x"
    )
    if base:
        b, every = med(base, "first"), med(rounds, "all")
        print(f"baseline {a.baseline}: every figure drawn at load {b:.2f} s = {b / floor_s:.2f} x the floor; "
              f"rendered now / then: {first / b:.2f} x, every figure now / then: {every / b:.2f} x")  # fmt: skip
    print(f"load average: {os.getloadavg()[0]:.1f} (1 min) on {os.cpu_count()} cores")
    print(f"requests blocked (would have left the machine): {sum(int(r['blocked']) for r in rounds)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
