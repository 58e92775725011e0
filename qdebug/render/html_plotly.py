"""plotly in the HTML report (:mod:`qdebug.render.html`): plotly.js inlined compressed (the vendored cartesian bundle
when every trace is 2-D, else the installed package's full one), the graph figure's worst tensors named, axes thinned
to a few labels, the figures' JSON compressed, and the loader script that unpacks them and draws each figure when it
comes into view."""

from __future__ import annotations

import base64
import functools
import gzip
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qdebug._lazy import LazyModule
from qdebug.render.html_sections import esc
from qdebug.report import DebugReport, SqnrKind

_plotly_offline = LazyModule("plotly.offline")
_plotly_io = LazyModule("plotly.io")


#: plotly.js with the 2-D traces only (``vendor/README.md``): smaller and faster to compile than the full bundle.
CARTESIAN_BUNDLE = Path(__file__).with_name("vendor") / "plotly-cartesian.min.js.gz"


#: The trace types the cartesian bundle registers; a figure with any other type gets the full bundle.
CARTESIAN_TRACES = frozenset(
    {"bar", "box", "contour", "heatmap", "histogram", "histogram2d", "histogram2dcontour", "image", "pie", "scatter",
     "scatterternary", "violin"}
)  # fmt: skip


@functools.lru_cache(maxsize=2)
def plotly_bundle(cartesian: bool = False) -> str:
    """plotly.js gzip-compressed and base64-encoded (computed once per process): the installed plotly package's
    full bundle, or with ``cartesian`` the vendored 2-D bundle (the full one if that file is missing)."""
    if cartesian and CARTESIAN_BUNDLE.is_file():
        return base64.b64encode(CARTESIAN_BUNDLE.read_bytes()).decode("ascii")
    js = _plotly_offline.get_plotlyjs().encode("utf-8")
    return base64.b64encode(gzip.compress(js, compresslevel=9, mtime=0)).decode("ascii")


def cartesian_only(figs: Sequence[tuple[str, str, Any]]) -> bool:
    """Whether every trace of ``figs`` is drawn by the cartesian bundle."""
    return all((t.type or "scatter") in CARTESIAN_TRACES for _, _, f in figs for t in f.data)


def label_worst(fig: Any, report: DebugReport, top: int) -> Any:
    """``fig`` (a graph figure too big for all its labels) with the worst local and cumulative tensors named, and
    tall enough for its layers: 662 tensors squeezed into the default 450 px are a smear."""
    nodes = next((t for t in fig.data if t.name == "tensors"), None)
    if nodes is None or nodes.text is not None:
        return fig  # every node already named
    at = {str(n): (x, y) for n, x, y in zip(nodes.customdata, nodes.x, nodes.y, strict=True)}
    worst = [a.tensor_name for k in (SqnrKind.LOCAL, SqnrKind.CUMULATIVE) for a in report.worst(k, max(3, top // 2))]
    names = [n for n in dict.fromkeys(worst) if n in at]
    for n in names:  # annotations, not a text trace: a white box keeps a name legible over edges and nodes
        fig.add_annotation(
            x=at[n][0], y=at[n][1], text=esc(_short_name(n)), showarrow=False, xanchor="left", xshift=9,
            font={"size": 11, "color": "#c92a2a"}, bgcolor="rgba(255,255,255,0.85)", hovertext=esc(n),
        )  # fmt: skip
    layers = len({round(float(y), 6) for y in nodes.y})
    fig.update_layout(height=int(min(1600, max(450, 60 + 22 * layers))))
    lo, hi = min(nodes.x), max(nodes.x)
    span = (hi - lo) or 1.0
    fig.update_xaxes(range=[lo - 0.03 * span, hi + 0.25 * span])  # room for the labels right of the last column
    return fig


def _short_name(name: str, chars: int = 32) -> str:
    """The end of a long tensor name (its most specific part), e.g. ``…/cv2/conv/Conv_output_0``."""
    return name if len(name) <= chars else "…" + name[-(chars - 1) :]


#: Most tick labels an axis keeps: plotly lays out every label of an array axis (hundreds of tensor names stalled
#: Chromium for minutes on ViT-S); the hover still names every cell.
MAX_TICKS = 40


def thin_ticks(fig: Any, max_ticks: int = MAX_TICKS) -> Any:
    """``fig`` with every array axis reduced to at most ``max_ticks`` evenly spaced labels."""
    for name in ("xaxis", "yaxis"):
        ax = getattr(fig.layout, name, None)
        if ax is None or ax.tickvals is None or len(ax.tickvals) <= max_ticks:
            continue
        step = -(-len(ax.tickvals) // max_ticks)
        texts = ax.ticktext if ax.ticktext is not None else ax.tickvals
        fig.update_layout({name: {"tickvals": list(ax.tickvals)[::step], "ticktext": list(texts)[::step]}})
    return fig


def figures_payload(figs: list[tuple[str, str, Any]]) -> str:
    """The figures' JSON, gzip + base64 (their hover texts compress ~10x)."""
    data = "[" + ",".join(
        f'{{"id":{json.dumps(i)},"fig":{_plotly_io.to_json(thin_ticks(f), validate=False)}}}' for i, _, f in figs
    )
    data += "]"
    return base64.b64encode(gzip.compress(data.encode("utf-8"), compresslevel=6, mtime=0)).decode("ascii")


LOADER = """
(function () {
  const t0 = performance.now();
  const times = window.qdTimes = {};
  const drawnAt = window.qdDrawnAt = {};
  const body = document.body;
  const status = document.getElementById("qd-js-status");
  function bytesOf(id) {
    const b64 = document.getElementById(id).textContent.trim();
    if (Uint8Array.fromBase64) return Uint8Array.fromBase64(b64);  // native: ~10x faster than the loop below
    const bin = atob(b64);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return bytes;
  }
  async function gunzip(id) {
    const stream = new Blob([bytesOf(id)]).stream().pipeThrough(new DecompressionStream("gzip"));
    return await new Response(stream).text();
  }
  // Resolves once the browser has painted what is already parsed: the verdict and the tables show before
  // plotly.js (seconds of main-thread work on a slow machine) is compiled.
  const painted = () => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));
  function loadScript(js) {
    // A blob: script (never the network) lets the browser compile the 4.8 MB off the main thread.
    const url = URL.createObjectURL(new Blob([js], {type: "text/javascript"}));
    return new Promise((resolve, reject) => {
      const s = document.createElement("script");
      s.onload = () => { URL.revokeObjectURL(url); resolve(); };
      s.onerror = () => reject(new Error("plotly.js did not load"));
      s.src = url;
      document.head.appendChild(s);
    });
  }
  let figs = {}, total = 0, drawn = 0, queue = Promise.resolve();
  function draw(id) {  // one figure at a time, in the order they are reached
    const f = figs[id];
    if (!f) return queue;
    delete figs[id];
    queue = queue.then(async () => {
      const t = performance.now();
      const div = document.getElementById(id);
      div.textContent = "";
      try {
        await Plotly.newPlot(div, f.data, f.layout, {responsive: true, displaylogo: false});
      } catch (err) {
        div.textContent = "This figure could not be drawn: " + err.message;
        body.dataset.qdRendered = "error";
        throw err;
      }
      times[id] = performance.now() - t;
      drawnAt[id] = performance.now();  // since navigation start
      div.dataset.qdDrawn = "1";
      body.dataset.qdDrawn = String(++drawn);
      if (drawn === total) {
        window.qdDoneAt = performance.now();
        body.dataset.qdRendered = String(total);
      }
    });
    return queue;
  }
  // Everything at once (printing, or a script that wants the whole page): window.qdDrawAll().
  window.qdDrawAll = () => { for (const id of Object.keys(figs)) draw(id); return queue; };
  (async function () {
    try {
      if (typeof DecompressionStream === "undefined") throw new Error("this browser cannot unpack the figures "
        + "(needs DecompressionStream: Chrome 80+, Firefox 113+, Safari 16.4+); the tables are complete");
      await painted();
      times.first_paint = performance.now() - t0;
      let t = performance.now();
      const js = await gunzip("qd-plotly");
      times.unpack_plotly = performance.now() - t;
      t = performance.now();
      await loadScript(js);
      times.eval_plotly = performance.now() - t;
      t = performance.now();
      const list = JSON.parse(await gunzip("qd-figures"));
      times.unpack_figures = performance.now() - t;
      for (const f of list) figs[f.id] = f.fig;
      total = list.length;
      window.qdReadyAt = performance.now();
      status.remove();
      body.dataset.qdReady = String(total);
      if (!total) body.dataset.qdRendered = "0";
      // A figure is drawn when it comes near the screen: drawing all of them up front would delay the page by
      // the time of every figure, most of them far below the fold.
      const seen = new IntersectionObserver((entries) => {
        for (const e of entries) if (e.isIntersecting) { seen.unobserve(e.target); draw(e.target.id); }
      }, {rootMargin: "400px 0px"});
      for (const f of list) seen.observe(document.getElementById(f.id));
      window.addEventListener("beforeprint", window.qdDrawAll);
    } catch (err) {
      status.textContent = "Figures could not be drawn: " + err.message;
      body.dataset.qdRendered = "error";
      throw err;
    }
  })();
})();
"""
