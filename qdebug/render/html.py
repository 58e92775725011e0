"""The shareable one-file HTML report (``qdebug report``, ``qdebug debug --html``, ``qdebug build --html``, the
dashboard's download button).

One self-contained file, readable offline by someone who has never used qdebug: a verdict in plain words at the
top, then the output table, the diagnostics (what is wrong, the evidence, the fix to try), the suggestions, the
layer heatmap, the samples × tensors heatmap, the graph coloured by SQNR, the worst tables, the target section and
where the numbers came from. Tables are plain HTML (readable even with scripts off); figures are plotly.

**No network request when opened.** plotly.js is inlined, never fetched from a CDN: the vendored cartesian bundle
(``vendor/README.md``: the 2-D traces the report draws) or, should a figure use another trace type, the
installed plotly package's full one (the ``ui`` extra). It is stored gzip-compressed and base64-encoded together
with the figures' JSON, and unpacked in the page with the browser's ``DecompressionStream`` (Chrome 80+, Firefox
113+, Safari 16.4+), so the file stays small enough to attach to a message (sizes: docs/benchmarks.md).

**Paint first, draw when reached.** The verdict and the tables are plain HTML and paint before any script work;
plotly.js is unpacked and compiled after that first paint, and each figure is drawn only when it comes near the
screen (``IntersectionObserver``; all at once before printing, or by ``window.qdDrawAll()``). What the browser test
and ``benchmarks/bench_html_report.py`` read: ``<body data-qd-ready="<figures>">`` once plotly.js is ready
(``window.qdReadyAt``), ``data-qd-drawn="<n>"`` on the body and ``data-qd-drawn`` on each drawn figure
(``window.qdDrawnAt[id]``), ``data-qd-rendered="<figures>"`` once every figure is drawn (``"error"`` if one could
not be), and ``window.qdTimes`` (the parts, ms).

The page's sections are built in :mod:`qdebug.render.html_sections`, plotly's part (bundle, figures' payload, loader)
in :mod:`qdebug.render.html_plotly`; this module chooses the figures and assembles the page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdebug.io import atomic_write_text
from qdebug.mixed.gains import MeasuredGains
from qdebug.render.html_plotly import LOADER, cartesian_only, figures_payload, label_worst, plotly_bundle
from qdebug.render.html_sections import (
    diagnostics_section,
    esc,
    outputs_section,
    provenance_section,
    suggestions_section,
    target_section,
    verdict_section,
    worst_section,
)
from qdebug.report import DebugReport

if TYPE_CHECKING:
    from qdebug.build_manifest import BuildManifest
    from qdebug.findings import Diagnostics
    from qdebug.mixed.suggest import Suggestion

__all__ = ["HtmlOptions", "plotly_bundle", "report_html", "write_report_html"]


@dataclass(frozen=True)
class HtmlOptions:
    """What the page shows: ``top`` rows per worst table and suggestions; ``graph`` draws the model graph
    (``graph_max_nodes``: above this many tensors the graph uses the linear-time layout); ``samples_heatmap``
    the samples × tensors heatmap when the report has per-sample values; ``title`` of the page."""

    top: int = 10
    graph: bool = True
    graph_max_nodes: int = 1000
    samples_heatmap: bool = True
    title: str | None = None


def _figures(
    report: DebugReport, options: HtmlOptions, layout: Mapping[Any, tuple[float, float]] | None
) -> list[tuple[str, str, Any]]:
    """``(id, caption, figure)`` for the page."""
    from qdebug.render import figures
    from qdebug.render.layout import layered_layout

    df = report.to_dataframe()
    out: list[tuple[str, str, Any]] = []
    if df.empty:
        return out
    wdf = report.weights_dataframe()
    out.append(
        (
            "fig-layers",
            "SQNR of every tensor in the order the model computes them: red cells show where "
            "precision is lost (local: the tensor's own rounding; cumulative: everything so far; weight: its "
            "weights). Hover a cell for the tensor.",
            figures.layer_heatmap(df, wdf if not wdf.empty else None),
        )
    )
    ps = report.per_sample
    if options.samples_heatmap and ps.values.size:
        out.append(
            (
                "fig-samples",
                "Cumulative SQNR per input sample (rows) and tensor (columns): a red row is an "
                "input the quantized model handles badly.",
                figures.samples_heatmap(ps.to_dataframe()),
            )
        )
    if options.graph:
        pos = layout
        if pos is None and len(df) > options.graph_max_nodes:  # the linear-time layout: the page must stay quick
            names = [str(n) for n in df.sort_values("topo_index")["tensor_name"]]
            pos = layered_layout(names, figures.graph_edges(df), method="longest_path")
        cap = (
            "The model graph, inputs at the top, each tensor coloured by its cumulative SQNR (red < 20 dB, yellow "
            "20–40, green > 40); the worst tensors of the tables below are named. Hover a node for its numbers; "
            "drag to zoom, double click to reset."
        )
        graph = figures.graph_figure(df, "cumulative", layout=pos)
        out.append(("fig-graph", cap, label_worst(graph, report, options.top)))
    for _, _, f in out:
        f.layout.width = None  # the page's width (the figures' fixed widths are for notebook tabs)
    return out


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1400px;padding:1em 2em;
color:#212529;line-height:1.4}
h1{margin-bottom:0}.sub{color:#495057;margin-top:.2em}
section{margin:1.5em 0}.help{color:#495057;font-size:.92em}
.verdict{border-left:8px solid;padding:.5em 1em;border-radius:4px}
.verdict.good{border-color:#2b8a3e;background:#ebfbee}.verdict.marginal{border-color:#f59f00;background:#fff9db}
.verdict.bad{border-color:#c92a2a;background:#fff5f5}
table{border-collapse:collapse;font-size:.9em;margin:.5em 0}
th,td{border:1px solid #dee2e6;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f1f3f5}td.db{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
td.db.bad,td.db.unknown{color:#c92a2a;font-weight:600}td.db.marginal{color:#e67700}td.db.good{color:#2b8a3e}
td.sev.error{color:#fff;background:#c92a2a}td.sev.warning{background:#ffe066}td.sev.info{background:#e7f5ff}
code{font-size:.92em;word-break:break-all}
pre{background:#f8f9fa;padding:.8em;overflow-x:auto;font-size:.85em;white-space:pre-wrap;overflow-wrap:anywhere}
nav a{margin-right:1em}details summary{cursor:pointer;color:#1864ab;margin:.3em 0}
.fig{width:100%;min-height:420px}.caption{color:#495057;font-size:.92em}
"""


_NAV = (
    ("verdict", "verdict"), ("outputs", "outputs"), ("diagnostics", "diagnostics"), ("suggestions", "suggestions"),
    ("figures", "figures"), ("worst", "worst tensors"), ("target", "target"), ("provenance", "provenance"),
)  # fmt: skip


def report_html(
    report: DebugReport,
    *,
    diagnostics: Diagnostics | None = None,
    suggestions: Sequence[Suggestion] | None = None,
    measured_gains: Mapping[str, float] | MeasuredGains | None = None,
    manifest: BuildManifest | None = None,
    out_dir: str | Path | None = None,
    layout: Mapping[Any, tuple[float, float]] | None = None,
    options: HtmlOptions | None = None,
) -> str:
    """The one-file HTML report of ``report`` (see the module docstring).

    ``diagnostics`` (:func:`qdebug.diagnose.diagnose`) and ``suggestions`` (:func:`qdebug.mixed.suggest.suggest`)
    add their sections; ``measured_gains`` (tensor → measured output gain in dB, or a search's
    :class:`~qdebug.mixed.gains.MeasuredGains`: also its candidates measured alone, promotion sets and remedies)
    fills the suggestions' measured column; ``manifest`` (a build's, with its ``out_dir``) adds the target
    section; ``layout`` are precomputed graph positions. plotly (the ``ui`` extra) is loaded here.
    """
    opts = options or HtmlOptions()
    figs = _figures(report, opts, layout)
    title = opts.title or f"qdebug report — {Path(report.meta.quant_model).name}"
    fig_html = "".join(
        f'<section id="{i}-section"><p class="caption">{esc(cap)}</p><div id="{i}" class="fig">'
        '<p class="help wait">Drawn when it comes into view…</p></div></section>'
        for i, cap, _ in figs
    )
    sections = "".join(
        [
            verdict_section(report, diagnostics, manifest, suggestions, measured_gains),
            outputs_section(report),
            diagnostics_section(diagnostics),
            suggestions_section(suggestions, measured_gains, opts.top),
            '<section id="figures"><h2>Figures</h2><p id="qd-js-status" class="help">Loading the figure library…</p>',
            fig_html,
            "</section>",
            worst_section(report, opts.top),
            target_section(report, manifest, out_dir),
            provenance_section(report),
        ]
    )
    nav = "".join(f'<a href="#{s}">{label}</a>' for s, label in _NAV if f'<section id="{s}"' in sections)
    body = (
        f"<h1>{esc(title)}</h1>"
        f'<p class="sub">{esc(report.meta.float_model)} → {esc(report.meta.quant_model)}, '
        f"{report.meta.num_samples} samples</p><nav>{nav}</nav>{sections}"
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>{body}"
        f'<script type="application/octet-stream" id="qd-plotly">{plotly_bundle(cartesian_only(figs))}</script>'
        f'<script type="application/octet-stream" id="qd-figures">{figures_payload(figs)}</script>'
        f"<script>{LOADER}</script></body></html>"
    )


def write_report_html(path: str | Path, report: DebugReport, **kwargs: Any) -> Path:
    """:func:`report_html` written atomically to ``path``."""
    return atomic_write_text(path, report_html(report, **kwargs))
