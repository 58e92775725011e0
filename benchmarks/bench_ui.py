"""What the UI costs: the graph overlay of a ~900-node model in Python and in a real browser (Debian's chromium).

(a) **graph overlay** — a real model whose graph view has ~900 nodes: a residual MLP built with ``onnx.helper``
    (per block MatMul → Add(bias) → Tanh → Add(residual); Tanh keeps 225 residual blocks finite; every
    node's output is a captured tensor), quantized with ``qdebug.quantizer`` (uint8/uint8, MinMax, 32 synthetic
    samples) and debugged with ``qdebug.debugger`` on 4 synthetic samples (both untimed). Then, timed:

    * ``layered_layout`` (grandalf's Sugiyama) on the report's tensors and edges, and ``graph_figure`` with
      that layout, in this process;
    * **browser render**: the figure written with ``fig.to_html(include_plotlyjs=True, full_html=True)`` to a
      temp file, served by ``http.server`` on 127.0.0.1 (free port, a thread), opened by Playwright in Debian's
      chromium (never Playwright's own download) in a fresh context per round, every non-local request
      aborted. The time is measured **in the page**: a ``MutationObserver`` installed before the page's own
      scripts records ``performance.now()`` (milliseconds since navigation start) when the marker trace has
      one ``path`` per tensor (``.js-plotly-plot .scatterlayer .trace .points path``). The wall time seen by
      Python from ``page.goto`` to that selector is reported too.

    Each is repeated ``--repeats`` times (default 3); best and median are shown. Target (issue): ≤ 3 s to
    show the graph of a ~900-node model.

(b) **Voila dashboard** (``notebooks/dashboard.ipynb``, a fresh Voila server per round, measured only when the
    notebook exists; otherwise reported as not measured — nothing is estimated): Voila listening, **dashboard
    ready** (port listening → ``.qd-dash-run`` visible), Run on the default sample model → the debugger shown,
    and the **promote round trip** (tick the first suggestion, click ``.qd-promote`` → status "promoted").

This is a measurement report, not a test: it never fails on timing.

Usage::

    .venv/bin/python benchmarks/bench_ui.py [--nodes 900] [--repeats 3] [--markdown PATH]
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LOCAL = re.compile(r"^https?://(127\.0\.0\.1|localhost)(:\d+)?/")
TARGET_MS = 3000.0
DASHBOARD = ROOT / "notebooks" / "dashboard.ipynb"
WIDTH = 8


def residual_mlp(nodes: int, seed: int = 0) -> onnx.ModelProto:
    """A float residual MLP with ``nodes`` nodes (rounded down to a multiple of 4), input ``x`` [1, WIDTH]."""
    rng = np.random.default_rng(seed)
    blocks = max(1, nodes // 4)
    graph_nodes, inits = [], []
    h = "x"
    for i in range(blocks):
        w = numpy_helper.from_array((rng.standard_normal((WIDTH, WIDTH)) * 0.3).astype(np.float32), f"w{i}")
        b = numpy_helper.from_array((rng.standard_normal(WIDTH) * 0.05).astype(np.float32), f"b{i}")
        inits += [w, b]
        graph_nodes += [
            helper.make_node("MatMul", [h, f"w{i}"], [f"mm{i}"], name=f"matmul{i}"),
            helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"lin{i}"], name=f"bias{i}"),
            helper.make_node("Tanh", [f"lin{i}"], [f"act{i}"], name=f"tanh{i}"),
            helper.make_node("Add", [f"act{i}", h], [f"res{i}"], name=f"residual{i}"),
        ]
        h = f"res{i}"
    graph = helper.make_graph(
        graph_nodes,
        "residual_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDTH])],
        [helper.make_tensor_value_info(h, TensorProto.FLOAT, [1, WIDTH])],
        inits,
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def report_dataframe(nodes: int, work: Path) -> tuple[Any, float]:
    """Quantize and debug the residual MLP; returns (the report's DataFrame, seconds spent, untimed setup)."""
    import qdebug
    from qdebug.config import QuantConfig

    t0 = time.perf_counter()
    float_path = work / "residual_mlp.onnx"
    onnx.save(residual_mlp(nodes), float_path)
    q = qdebug.quantize(float_path, None, QuantConfig(), work / "residual_mlp.qdq.onnx")
    report = qdebug.debug(float_path, q.model_path, None, qdebug.DebugOptions(num_samples=4))
    return report.to_dataframe(), time.perf_counter() - t0


@dataclass
class Timings:
    name: str
    unit: str = "ms"
    values: list[float] = field(default_factory=list)

    @property
    def best(self) -> float:
        return min(self.values)

    @property
    def median(self) -> float:
        return statistics.median(self.values)


def bench_python(df: Any, repeats: int) -> tuple[list[Timings], dict[str, Any], int, int]:
    """The graph view as the dashboard builds it (qdebug.render.graph_view): grouping + the collapsed view's layout
    + its figure (what opens), and the fully expanded view's layout + figure ("expand all")."""
    from qdebug.render import graph_view as gv
    from qdebug.render.figures import graph_edges

    d = df.sort_values("topo_index", kind="stable")
    names = [str(n) for n in d["tensor_name"]]
    edges = graph_edges(d)
    rows = {str(r["tensor_name"]): r for r in d.to_dict("records")}
    ops = {n: str(r["producer_op"]) for n, r in rows.items()}
    from qdebug.render.figures import graph_figure
    from qdebug.render.layout import layered_layout

    old_t = Timings("before issue 15: every tensor, straight edges (layered_layout + graph_figure)")
    group_t = Timings("grouping (group_tensors)")
    coll_t, full_t = (
        Timings("collapsed view: layout + figure"),
        Timings("expanded view (every tensor): layout + figure"),
    )
    figs: dict[str, Any] = {}
    for _ in range(repeats):
        t = time.perf_counter()
        graph_figure(df, metric="cumulative", layout=layered_layout(names, edges))
        old_t.values.append((time.perf_counter() - t) * 1e3)
        t0 = time.perf_counter()
        grouping = gv.group_tensors(names, edges, ops)
        t1 = time.perf_counter()
        view = gv.graph_view(names, edges, grouping, set())
        figs["collapsed"] = (gv.graph_view_figure(view, rows), len(view.nodes))
        t2 = time.perf_counter()
        full = gv.graph_view(names, edges, grouping, {g.key for g in grouping.groups})
        figs["expanded"] = (gv.graph_view_figure(full, rows), len(full.nodes))
        t3 = time.perf_counter()
        group_t.values.append((t1 - t0) * 1e3)
        coll_t.values.append((t2 - t1) * 1e3)
        full_t.values.append((t3 - t2) * 1e3)
    return [old_t, group_t, coll_t, full_t], figs, len(names), len(edges)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def serve_dir(directory: Path) -> Iterator[int]:
    """Serve ``directory`` on 127.0.0.1 (free port) from a thread; yields the port."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


# Installed before the page's own scripts: records when the marker trace has one <path> per tensor.
_OBSERVER = """
(() => {
  const want = %d;
  const check = () => {
    if (window.__qdRendered !== undefined) return true;
    const n = document.querySelectorAll('.js-plotly-plot .scatterlayer .trace .points path').length;
    if (n >= want) { window.__qdRendered = performance.now(); return true; }
    return false;
  };
  const obs = new MutationObserver(() => { if (check()) obs.disconnect(); });
  obs.observe(document, {childList: true, subtree: true});
})();
"""


def _local_only(route: Any) -> None:
    """Playwright route handler: let 127.0.0.1/localhost through, abort everything else."""
    if LOCAL.match(route.request.url):
        route.continue_()
    else:
        route.abort()


def bench_browser(fig: Any, n_nodes: int, repeats: int, work: Path) -> tuple[list[Timings], str, int]:
    """Render the figure in chromium ``repeats`` times (fresh context each); returns timings, note, HTML bytes."""
    if not Path(CHROMIUM).exists():
        return [], f"browser: not measured ({CHROMIUM} missing; `make browser` installs it)", 0
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return [], "browser: not measured (playwright missing: pip install 'qdebug[dev]')", 0
    page_dir = work / "page"
    page_dir.mkdir(parents=True)
    html_path = page_dir / "graph.html"
    html_path.write_text(fig.to_html(include_plotlyjs=True, full_html=True), encoding="utf-8")
    size = html_path.stat().st_size
    in_page, wall = (
        Timings("browser render (in page, since navigation start)"),
        Timings("browser render (goto → markers, Python)"),
    )
    errors: list[str] = []
    with serve_dir(page_dir) as port, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            for _ in range(repeats):
                context = browser.new_context(viewport={"width": 1400, "height": 900})
                page = context.new_page()
                page.route(
                    re.compile(r".*"),
                    lambda route: route.continue_() if LOCAL.match(route.request.url) else route.abort(),
                )
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.add_init_script(_OBSERVER % n_nodes)
                t0 = time.perf_counter()
                page.goto(f"http://127.0.0.1:{port}/graph.html", wait_until="commit")
                page.wait_for_function("window.__qdRendered !== undefined", timeout=60_000)
                t1 = time.perf_counter()
                wall.values.append((t1 - t0) * 1e3)
                in_page.values.append(float(page.evaluate("window.__qdRendered")))
                context.close()
        finally:
            browser.close()
    version = subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    note = f"browser: {version}; page {size / 1e6:.1f} MB (plotly.js inlined)"
    if errors:
        note += f"; page errors: {errors[:3]}"
    return [in_page, wall], note, size


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def voila(notebook: Path, work: Path, root: Path | None = None) -> Iterator[tuple[int, float]]:
    """Serve a copy of ``notebook`` on 127.0.0.1 (free port) exactly as ``qdebug dashboard`` serves it
    (:func:`qdebug.cli.dashboard.voila_command`: qdebug's template without CDN links, the upload websocket size,
    kernel culling), this checkout's code first (``qdebug_widgets`` next to the notebook is this ``widgets/``);
    yields (port, seconds until listening). ``root``: the dashboard's file root (default: the notebook's folder).

    Its own process group, its own Jupyter runtime/config dirs; stopped with SIGTERM (kernels shut down), SIGKILL
    after 15 s.
    """
    from qdebug.cli.dashboard import voila_command, voila_env

    nbdir = work / "notebooks"
    nbdir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(notebook, nbdir / notebook.name)
    link = nbdir / "qdebug_widgets"
    if not link.exists():
        link.symlink_to(ROOT / "widgets", target_is_directory=True)
    port = _free_port()
    env = voila_env(root or nbdir, base={
        **os.environ,
        "JUPYTER_RUNTIME_DIR": str(work / "runtime"),
        "JUPYTER_CONFIG_DIR": str(work / "config"),
        "JUPYTER_PLATFORM_DIRS": "1",
        "QDEBUG_DASHBOARD_WORKDIR": str(work / "dashboard-work"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    })  # fmt: skip
    cmd = voila_command(nbdir / notebook.name, port)
    log = (work / "voila.log").open("wb")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=nbdir, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    try:
        deadline = t0 + 90
        while not _port_open(port):
            if proc.poll() is not None or time.perf_counter() > deadline:
                raise RuntimeError(f"voila did not listen on {port}: {(work / 'voila.log').read_text()[-2000:]}")
            time.sleep(0.05)  # polling the port
        yield port, time.perf_counter() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=15)
        log.close()


def bench_dashboard(repeats: int, work: Path) -> tuple[list[Timings], list[str]]:
    """Voila dashboard (``notebooks/dashboard.ipynb``): measured only when it exists; nothing is estimated.

    Per round, a fresh Voila server and browser context:
    * **voila listening**: process start → port accepts connections;
    * **dashboard ready**: port listening → ``page.goto`` → ``.qd-dash-run`` visible (the kernel ran the
      notebook and the widgets rendered);
    * **run → debugger shown**: click Run with the form's defaults (the first bundled sample) → ``.qd-app``
      shows its tensor table and promote button;
    * **promote round trip**: tick the first suggestion (else the first table row) → click ``.qd-promote`` →
      ``.qd-status`` says "promoted" (plan, re-quantize, re-debug, recompile, before/after shown).
    """
    if not DASHBOARD.exists():
        return [], ["dashboard: not measured (notebooks/dashboard.ipynb missing)"]
    if not Path(CHROMIUM).exists():
        return [], [f"dashboard: not measured ({CHROMIUM} missing)"]
    from playwright.sync_api import expect, sync_playwright

    listen, ready = Timings("voila listening (process start → port)"), Timings("dashboard ready (port → .qd-dash-run)")
    run, promote = Timings("run → debugger shown (sample model)"), Timings("promote round trip (click → status)")
    notes: list[str] = []
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            for i in range(repeats):
                with voila(DASHBOARD, work / f"voila{i}") as (port, listen_s):
                    listen.values.append(listen_s * 1e3)
                    context = browser.new_context(viewport={"width": 1600, "height": 1200})
                    context.set_default_timeout(180_000)
                    page = context.new_page()
                    page.route(re.compile(r".*"), _local_only)
                    page.on("pageerror", lambda e: errors.append(str(e)))
                    t0 = time.perf_counter()
                    page.goto(f"http://127.0.0.1:{port}/")
                    expect(page.locator(".qd-dash-run")).to_be_visible(timeout=180_000)
                    ready.values.append((time.perf_counter() - t0) * 1e3)
                    t0 = time.perf_counter()
                    page.locator(".qd-dash-run").click()
                    expect(page.locator(".qd-app .qd-table")).to_be_visible(timeout=180_000)
                    expect(page.locator(".qd-app .qd-promote")).to_be_visible(timeout=180_000)
                    run.values.append((time.perf_counter() - t0) * 1e3)
                    boxes = page.locator(".qd-suggestion input[type=checkbox]")
                    if boxes.count() == 0:
                        boxes = page.locator(".qd-row-check input[type=checkbox]")
                    if boxes.count() == 0:
                        notes.append("promote round trip: not measured (nothing to tick in the dashboard)")
                    else:
                        boxes.first.check()
                        t0 = time.perf_counter()
                        page.locator(".qd-promote").click()
                        status = page.locator(".qd-app .qd-status")
                        expect(status).to_contain_text(re.compile("promoted|promotion failed"), timeout=180_000)
                        text = status.text_content() or ""
                        if "promotion failed" in text:
                            notes.append(f"promote round trip failed: {text[:200]}")
                        else:
                            promote.values.append((time.perf_counter() - t0) * 1e3)
                    context.close()
        finally:
            browser.close()
    if errors:
        notes.append(f"dashboard page errors: {sorted(set(errors))[:3]}")
    return [t for t in (listen, ready, run, promote) if t.values], notes


def render(rows: list[Timings], notes: list[str], meta: dict[str, Any], repeats: int) -> str:
    lines = [
        "# UI benchmark (bench_ui.py)",
        "",
        f"Model: residual MLP, {meta['graph_nodes']} ONNX nodes → {meta['tensors']} activation tensors, "
        f"{meta['edges']} edges in the graph view (quantized uint8/uint8 and debugged on 4 samples, "
        f"{meta['setup_s']:.1f} s untimed setup). {repeats} rounds; best and median.",
        "",
        "| measurement | best ms | median ms | all ms |",
        "|---|---|---|---|",
    ]
    for t in rows:
        vals = ", ".join(f"{v:.0f}" for v in t.values)
        lines.append(f"| {t.name} | {t.best:.0f} | {t.median:.0f} | {vals} |")
    lines.append("")
    render_rows = [t for t in rows if t.name.startswith("browser render (in page")]
    py_rows = [t for t in rows if t.name.startswith("layout + figure")]
    if render_rows and py_rows:
        total = py_rows[0].median + render_rows[0].median
        verdict = "PASS" if total <= TARGET_MS else "MISS"
        lines.append(
            f"Target ≤ {TARGET_MS / 1e3:.0f} s for a ~900-node graph (Python layout + figure + browser render, "
            f"medians): {total:.0f} ms — {verdict}."
        )
        lines.append("")
    for n in notes:
        lines.append(f"- {n}")
    lines.append(
        f"- machine: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}, "
        f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=900, help="ONNX nodes of the residual MLP (default 900)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per measurement (default 3)")
    parser.add_argument("--no-browser", action="store_true", help="skip the chromium render")
    parser.add_argument("--no-dashboard", action="store_true", help="skip the Voila dashboard measurements")
    parser.add_argument("--markdown", type=Path, help="also write the report here (atomically)")
    args = parser.parse_args(argv)

    import plotly

    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="qdebug-bench-ui-") as tmp:
        work = Path(tmp)
        df, setup_s = report_dataframe(args.nodes, work)
        rows, figs, n_tensors, n_edges = bench_python(df, args.repeats)
        notes.append(
            f"plotly {plotly.__version__}; layout: grandalf Sugiyama (qdebug.render.layout), grouping and view: "
            f"qdebug.render.graph_view; collapsed view: {figs['collapsed'][1]} nodes"
        )
        if args.no_browser:
            notes.append("browser: not measured (--no-browser)")
        else:
            for which, (fig, n) in figs.items():
                brows, note, _ = bench_browser(fig, n, args.repeats, work / which)
                for r in brows:
                    r.name = f"{which} view ({n} nodes): {r.name}"
                rows += brows
                notes.append(note)
        if args.no_dashboard:
            notes.append("dashboard: not measured (--no-dashboard)")
        else:
            drows, dnotes = bench_dashboard(args.repeats, work)
            rows += drows
            notes += dnotes
    meta = {"graph_nodes": 4 * max(1, args.nodes // 4), "tensors": n_tensors, "edges": n_edges, "setup_s": setup_s}
    report = render(rows, [n for n in notes if n], meta, args.repeats)
    print(report)
    if args.markdown is not None:
        from qdebug.io import atomic_write_text

        atomic_write_text(args.markdown, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
