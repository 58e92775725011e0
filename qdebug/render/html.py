"""The shareable one-file HTML report (``qdebug report``, ``qdebug debug --html``, ``qdebug build --html``, the
dashboard's download button).

One self-contained file, readable offline by someone who has never used qdebug: a verdict in plain words at the
top, then the output table, the diagnostics (what is wrong, the evidence, the fix to try), the suggestions, the
layer heatmap, the samples × tensors heatmap, the graph coloured by SQNR, the worst tables, the target section and
where the numbers came from. Tables are plain HTML (readable even with scripts off); figures are plotly.

**No network request when opened.** plotly.js is inlined, never fetched from a CDN: the vendored cartesian bundle
(``vendor/README.md``: 1.4 MB, the 2-D traces the report draws) or, should a figure use another trace type, the
installed plotly package's full one (4.8 MB; the ``ui`` extra). It is stored gzip-compressed and base64-encoded
(~0.63 or ~1.9 MB) together with the figures' JSON, and unpacked in the page with the browser's
``DecompressionStream`` (Chrome 80+, Firefox 113+, Safari 16.4+): the whole file stays around 1 MB on ViT-S.

**Paint first, draw when reached.** The verdict and the tables are plain HTML and paint before any script work;
plotly.js is unpacked and compiled after that first paint, and each figure is drawn only when it comes near the
screen (``IntersectionObserver``; all at once before printing, or by ``window.qdDrawAll()``). What the browser test
and ``benchmarks/bench_html_report.py`` read: ``<body data-qd-ready="<figures>">`` once plotly.js is ready
(``window.qdReadyAt``), ``data-qd-drawn="<n>"`` on the body and ``data-qd-drawn`` on each drawn figure
(``window.qdDrawnAt[id]``), ``data-qd-rendered="<figures>"`` once every figure is drawn (``"error"`` if one could
not be), and ``window.qdTimes`` (the parts, ms).
"""

from __future__ import annotations

import base64
import functools
import gzip
import html
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdebug._lazy import LazyModule
from qdebug.io import atomic_write_text
from qdebug.mixed.gains import MeasuredGains
from qdebug.render.bands import SQNR_HIGH, SQNR_LOW, Band, band_of, sqnr_color
from qdebug.render.fmt import fmt_db_text, fmt_task
from qdebug.report import DebugReport, SqnrKind

if TYPE_CHECKING:
    from qdebug.build_manifest import BuildManifest
    from qdebug.findings import Diagnostics
    from qdebug.mixed.suggest import Suggestion

__all__ = ["HtmlOptions", "plotly_bundle", "report_html", "write_report_html"]

_plotly_offline = LazyModule("plotly.offline")
_plotly_io = LazyModule("plotly.io")


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


#: plotly.js with the 2-D traces only (``vendor/README.md``): 1.4 MB instead of 4.8 MB, compiled ~2.3x faster.
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


def _cartesian_only(figs: Sequence[tuple[str, str, Any]]) -> bool:
    """Whether every trace of ``figs`` is drawn by the cartesian bundle."""
    return all((t.type or "scatter") in CARTESIAN_TRACES for _, _, f in figs for t in f.data)


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _db_cell(v: float | None, status: Any = None) -> str:
    """A dB table cell shaded by its band (the colour of the figures' scale)."""
    text = fmt_db_text(v, None if status is None else str(status))
    band = band_of(v)
    return f'<td class="db {band.value}" style="background:{sqnr_color(v)}22">{_e(text)}</td>'


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "") -> str:
    """An HTML table; cells in ``rows`` are already HTML (``<td>…</td>``)."""
    if not rows:
        return '<p class="none">(none)</p>'
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join(f"<tr>{''.join(r)}</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _td(x: Any) -> str:
    return f"<td>{_e(x)}</td>"


# ---------------------------------------------------------------------------------------------- sections
_VERDICT = {
    Band.GOOD: ("good", "The quantized model's outputs match the float model closely"),
    Band.MARGINAL: ("marginal", "The quantized model's outputs differ noticeably from the float model"),
    Band.BAD: ("bad", "The quantized model's outputs differ strongly from the float model"),
    Band.UNKNOWN: ("bad", "Some model outputs could not be compared (NaN/Inf or undefined)"),
}


def _target_line(report: DebugReport, manifest: BuildManifest | None) -> str | None:
    """One sentence on the compiled model's accuracy, when a target was run."""
    acc = report.target_accuracy or (manifest.target_accuracy if manifest is not None else None)
    if acc is None or not acc.outputs:
        return None
    vals = [o.target_vs_float_db for o in acc.outputs]
    worst = None if any(v is None for v in vals) else min(v for v in vals if v is not None)
    return (
        f"On the target ({_e(acc.device)}) the worst output is at <b>{_e(fmt_db_text(worst))}</b> from the float "
        'model (<a href="#target">target section</a>).'
    )


def _first_fix(suggestions: Sequence[Suggestion] | None, measured: Mapping[str, float] | MeasuredGains | None) -> str:
    """One sentence naming the first promotion to try (the top suggestion) with its predicted and measured gain."""
    if not suggestions or suggestions[0].estimated_output_gain_db < 0.1:
        return ""  # nothing worth promoting (the noise is spread thin): the diagnostics say more
    s = suggestions[0]
    flat = measured.per_tensor() if isinstance(measured, MeasuredGains) else (measured or {})
    got = f", measured {flat[s.tensor_name]:+.2f} dB" if s.tensor_name in flat else ""
    return (
        f"First fix to try: store <code>{_e(s.tensor_name)}</code> ({_e(s.producer_op)}) in 16 bits — predicted "
        f'{s.estimated_output_gain_db:+.2f} dB at the worst output{got} (<a href="#suggestions">suggestions</a>).'
    )


def _verdict(
    report: DebugReport,
    diagnostics: Diagnostics | None,
    manifest: BuildManifest | None = None,
    suggestions: Sequence[Suggestion] | None = None,
    measured: Mapping[str, float] | MeasuredGains | None = None,
) -> str:
    worst = report.min_output_sqnr_db
    band = band_of(worst)
    label, sentence = _VERDICT[band]
    lines = [
        f"{sentence}: the worst output is at <b>{_e(fmt_db_text(worst))}</b> SQNR "
        f"(signal-to-noise: above {SQNR_HIGH:g} dB is good, {SQNR_LOW:g}–{SQNR_HIGH:g} dB marginal, below "
        f"{SQNR_LOW:g} dB bad; every 6 dB is one bit of precision)."
    ]
    if report.task is not None:  # the user's task beside the SQNR: whether the answer changed
        lines.append(f"The {_e(fmt_task(report.task))}.")
    target = _target_line(report, manifest)
    if target is not None:
        lines.append(target)
    worst_cum = report.worst(SqnrKind.CUMULATIVE, 1)
    worst_loc = report.worst(SqnrKind.LOCAL, 1)
    if worst_loc:
        a = worst_loc[0]
        lines.append(
            f"The tensor whose own rounding loses most is <code>{_e(a.tensor_name)}</code> ({_e(a.producer_op)}, "
            f"{_e(fmt_db_text(a.local_sqnr_db, str(a.local_status)))})."
        )
    if worst_cum:
        a = worst_cum[0]
        lines.append(
            f"The damage is largest at <code>{_e(a.tensor_name)}</code> ({_e(a.producer_op)}, cumulative "
            f"{_e(fmt_db_text(a.cumulative_sqnr_db, str(a.cumulative_status)))})."
        )
    first = _first_fix(suggestions, measured) if band != Band.GOOD else ""
    if first:
        lines.append(first)
    if diagnostics is not None:
        n = {s: sum(1 for d in diagnostics.items if d.severity.value == s) for s in ("error", "warning", "info")}
        lines.append(
            f'<a href="#diagnostics">Diagnostics</a>: {n["error"]} error(s), {n["warning"]} warning(s), '
            f"{n['info']} note(s) — each with the fix to try."
        )
    return (
        f'<section id="verdict" class="verdict {label}"><h2>Verdict: {label}</h2><p>'
        + "</p><p>".join(lines)
        + ("</p></section>")
    )


def _outputs(report: DebugReport) -> str:
    rows = [
        [_td(o.output_name), _db_cell(o.cumulative_sqnr_db, o.cumulative_status),
         _td("-" if o.max_abs_error is None else f"{o.max_abs_error:.4g}"),
         _td("" if o.worst_sample is None else o.worst_sample)]
        for o in report.model_outputs
    ]  # fmt: skip
    return (
        '<section id="outputs"><h2>Model outputs</h2><p class="help">How far each output of the quantized model is '
        "from the float model's, over all samples.</p>"
        + _table(["output", "SQNR", "max |error|", "worst sample"], rows)
        + "</section>"
    )


#: Diagnostics listed before a "… more" fold: ViT-S has 64, and the figures should not sit 5000 px down the page.
DIAGNOSTICS_SHOWN = 15


def _diagnostics(diagnostics: Diagnostics | None) -> str:
    if diagnostics is None:
        return ""
    rows = [
        [f'<td class="sev {d.severity.value}">{_e(d.severity.value)}</td>', _td(d.kind.value.replace("_", " ")),
         f"<td><code>{_e(d.tensor)}</code><br><small>{_e(d.op)}</small></td>", _td(d.evidence),
         f"<td>{_e(d.remedy.text)}"
         + (f"<br><small>override: <code>{_e(json.dumps(d.remedy.overrides()))}</code></small>"
            if d.remedy.overrides() else "") + "</td>"]
        for d in diagnostics.items
    ]  # fmt: skip
    ran = ", ".join(k.value.replace("_", " ") for k in diagnostics.checks)
    stats = (
        f"per-tensor statistics over {diagnostics.stats_samples} sample(s)"
        if diagnostics.stats_samples
        else "no per-tensor statistics (outlier and saturation checks not run)"
    )
    header = ["severity", "problem", "tensor", "evidence", "fix to try"]
    shown, rest = rows[:DIAGNOSTICS_SHOWN], rows[DIAGNOSTICS_SHOWN:]
    more = (
        f"<details><summary>{len(rest)} more diagnostic(s)</summary>{_table(header, rest, 'diag')}</details>"
        if rest
        else ""
    )
    return (
        '<section id="diagnostics"><h2>Diagnostics: why, and the fix to try</h2>'
        f'<p class="help">Checks run: {_e(ran)}; {_e(stats)}.</p>' + _table(header, shown, "diag") + more + "</section>"
    )


def _applied(suggestions: Sequence[Suggestion], measured: Mapping[str, float] | None) -> str:
    """Promotions already applied and measured (their tensors are 16-bit now, so no longer suggested)."""
    listed = {s.tensor_name for s in suggestions}
    rows = [
        [f"<td><code>{_e(t)}</code></td>", _td(f"{gain:+.2f} dB")]
        for t, gain in (measured or {}).items()
        if t not in listed
    ]
    if not rows:
        return ""
    return "<h3>Promotions applied and measured</h3>" + _table(["tensor", "measured gain at output"], rows)


def _gain(v: float | None) -> str:
    return "-" if v is None else f"{v:+.2f} dB"


def _measured_cell(name: str, measured: Mapping[str, float] | None, gains: MeasuredGains | None) -> str:
    """The suggestions' measured column: the gain, and whether it was measured alone or with its group."""
    tg = None if gains is None else next((t for t in gains.tensors if t.tensor == name), None)
    if tg is not None and tg.measured_gain_db is not None:
        alone = "alone" if tg.group_size == 1 else f"with its group of {tg.group_size} ({tg.candidate})"
        return _td(f"{tg.measured_gain_db:+.2f} dB ({alone})")
    if measured is not None and name in measured:
        return _td(f"{measured[name]:+.2f} dB")
    return _td("not measured")


def _search_tables(gains: MeasuredGains, top: int) -> str:
    """What a search measured: candidates alone (predicted vs measured), promotion sets, remedies."""
    parts = [
        f'<h3>Measured by {_e(gains.source)}</h3><p class="help">Gains of the worst model output over the '
        f"search's own base ({_e(fmt_db_text(gains.base_output_sqnr_db))}; its quantization and debug samples, "
        "which may differ from this report's)."
        + ("" if gains.reached is None else f" Goal {'reached' if gains.reached else '<b>not reached</b>'}"
           + (f" ({_e(gains.stop_reason)})" if gains.stop_reason else "") + ".")
        + "</p>"
    ]  # fmt: skip
    alone = [t for t in gains.tensors if t.measured_gain_db is not None]
    alone.sort(key=lambda t: -(t.measured_gain_db or 0.0))
    if alone:
        rows = [
            [f"<td><code>{_e(t.tensor)}</code></td>", _td(t.candidate if t.group_size > 1 else "alone"),
             _td("-" if t.predicted_gain_db is None else f"{t.predicted_gain_db:.2f} dB"),
             _td(_gain(t.measured_gain_db))]
            for t in alone[: 3 * top]
        ]  # fmt: skip
        parts.append("<h4>Promoted alone: predicted and measured gain at the output</h4>")
        parts.append(_table(["tensor", "promoted", "predicted", "measured"], rows))
    if gains.sets:
        rows = [
            [_td(s.label + (" (chosen)" if s.chosen else "")), _td(len(s.tensors)),
             _td(f"{100 * s.cost_fraction_16bit:.1f} %"), _db_cell(s.output_sqnr_db), _td(_gain(s.gain_db))]
            for s in gains.sets[: 3 * top]
        ]  # fmt: skip
        parts.append("<h4>Promotion sets measured (cheapest first)</h4>")
        parts.append(_table(["set", "tensors in 16 bits", "16-bit share of activations", "worst output",
                             "measured gain"], rows))  # fmt: skip
    if gains.remedies:
        rows = [
            [_td(r.kind.replace("_", " ")), _td(r.description), _db_cell(r.output_sqnr_db), _td(_gain(r.gain_db)),
             _td("yes" if r.recommended else ("error: " + r.error if r.error else "no"))]
            for r in gains.remedies
        ]  # fmt: skip
        parts.append("<h4>Remedies measured</h4>")
        parts.append(_table(["remedy", "what", "worst output", "measured gain", "recommended"], rows))
    return "".join(parts)


def _suggestions(
    suggestions: Sequence[Suggestion] | None, measured: Mapping[str, float] | MeasuredGains | None, top: int = 10
) -> str:
    gains: MeasuredGains | None = None
    flat: Mapping[str, float] | None = None
    if isinstance(measured, MeasuredGains):
        gains, flat = measured, measured.per_tensor()
    else:
        flat = measured
    if suggestions is None and not gains:
        return ""
    rows = [
        [_td(s.rank), f"<td><code>{_e(s.tensor_name)}</code></td>", _td(s.producer_op), _td(s.role),
         _td(f"{s.estimated_gain_db:.1f} dB"), _td(f"{s.estimated_output_gain_db:.2f} dB"),
         _measured_cell(s.tensor_name, flat, gains), _td(s.reason)]
        for s in suggestions or ()
    ]  # fmt: skip
    header = ["rank", "tensor", "op", "role", "predicted gain here", "predicted gain at output", "measured at output"]
    return (
        '<section id="suggestions"><h2>Suggestions: tensors to promote to 16 bits</h2><p class="help">Predicted '
        "gains are estimated from the tensor's share of the noise; measured gains come from re-quantizing with the "
        "promotion and measuring again (the app's Promote button, qdebug search). A promotion of several tensors "
        "is measured once, its gain shown for each of them.</p>"
        + _table([*header, "why"], rows)
        + (_applied(suggestions or (), flat) if gains is None else _search_tables(gains, top))
        + "</section>"
    )


def _worst_tables(report: DebugReport, top: int) -> str:
    parts = ['<section id="worst"><h2>Worst tensors</h2>']
    local = [
        [f"<td><code>{_e(a.tensor_name)}</code></td>", _td(a.producer_op), _td(a.quant_type or "-"),
         _db_cell(a.local_sqnr_db, a.local_status), _db_cell(a.cumulative_sqnr_db, a.cumulative_status)]
        for a in report.worst(SqnrKind.LOCAL, top)
    ]  # fmt: skip
    parts.append("<h3>Local SQNR (each tensor's own rounding)</h3>")
    parts.append(_table(["tensor", "op", "type", "local", "cumulative"], local))
    cum = [
        [f"<td><code>{_e(a.tensor_name)}</code></td>", _td(a.producer_op), _td(a.quant_type or "float"),
         _db_cell(a.cumulative_sqnr_db, a.cumulative_status)]
        for a in report.worst(SqnrKind.CUMULATIVE, top)
    ]  # fmt: skip
    parts.append("<h3>Cumulative SQNR (the damage so far, vs the float model)</h3>")
    parts.append(_table(["tensor", "op", "type", "cumulative"], cum))
    wts = [
        [f"<td><code>{_e(w.weight_name)}</code></td>", _td(w.consumer_op), _td(w.kind), _td(w.quant_type),
         _td(w.channels), _db_cell(w.weight_sqnr_db, w.weight_status)]
        for w in report.worst(SqnrKind.WEIGHT, top)
    ]  # fmt: skip
    parts.append("<h3>Weight SQNR</h3>")
    parts.append(_table(["weight", "used by", "kind", "type", "channels", "SQNR"], wts))
    return "".join(parts) + "</section>"


def _text_of(fn: Any, *args: Any) -> str:
    buf = io.StringIO()
    fn(*args, buf)
    return buf.getvalue()


def _accuracy_table(acc: Any) -> str:
    rows = [
        [_td(o.output_name), _db_cell(o.cpu_vs_float_db), _db_cell(o.target_vs_float_db),
         _db_cell(o.target_vs_cpu_db)]
        for o in acc.outputs
    ]  # fmt: skip
    return (
        f'<h3>Accuracy on the target ({_e(acc.device)})</h3><p class="help">Output SQNR: the quantized model '
        "run on the CPU vs the float model, the compiled model on the target vs the float model, and target vs "
        "CPU (what the compiler and the hardware add).</p>"
        + _table(["output", "CPU-QDQ vs float", "target vs float", "target vs CPU-QDQ"], rows)
    )


def _compile_line(c: Any) -> str:
    """The compile report in one sentence."""
    if not c.ok:
        return f"<b>Compile failed</b> for {_e(c.target)}: {_e(c.error or 'see the log below')}."
    fb = ", ".join(f"{op} {n}" for op, n in sorted(c.fallback_by_op().items())) or "none"
    return (
        f"Compiled for {_e(c.device or c.target)}: {c.accelerator_nodes} node(s) on the accelerator in "
        f"{c.accelerator_partitions} partition(s), <b>{c.cpu_nodes} left on the CPU</b> (fallback by op: {_e(fb)})."
    )


def _target(report: DebugReport, manifest: BuildManifest | None, out_dir: Any) -> str:
    """The target section: the build's compile report, fallback, accuracy on the target and located divergence —
    a summary and a table, then the CLI's own text (so both say the same) — or a report's target accuracy alone."""
    from qdebug.render.text import print_build, print_divergence

    acc = report.target_accuracy or (manifest.target_accuracy if manifest is not None else None)
    if manifest is not None:
        text = _text_of(print_build, _BuildView(Path(str(out_dir or ".")), manifest))
        head = f"Target: {manifest.device} ({manifest.precision})"
        parts = [f"<p>{_compile_line(manifest.compile)}</p>"]
    elif acc is not None:
        text = _text_of(print_divergence, acc) if acc.tensors else ""
        head = f"Target: {acc.target} on {acc.device}"
        parts = []
    else:
        return ""
    if acc is not None and acc.outputs:
        parts.append(_accuracy_table(acc))
    if text.strip():
        parts.append(
            "<details open><summary>The full account (as the command line prints it): fixes, quantization, compile, "
            f"where the target starts to diverge, remedies tried</summary><pre>{_e(text)}</pre></details>"
        )
    return f'<section id="target"><h2>{_e(head)}</h2>{"".join(parts)}</section>'


@dataclass(frozen=True)
class _BuildView:
    """What :func:`qdebug.render.text.print_build` reads of a build result."""

    out_dir: Path
    manifest: Any


def _meta(report: DebugReport) -> str:
    from qdebug.render.text import capture_line

    m = report.meta
    rows = [
        ["float model", f"{m.float_model} (sha256 {m.float_sha256[:12]}…)"],
        ["quantized model", f"{m.quant_model} (sha256 {m.quant_sha256[:12]}…)"],
        ["data", f"{m.data} ({m.num_samples} samples)"],
        ["versions", f"qdebug {m.qdebug_version}, onnxruntime {m.onnxruntime_version}"],
        ["capture", capture_line(m.capture) or "-"],
        ["time", f"{m.seconds:.1f} s"],
    ]
    body = _table(["", ""], [[_td(a), _td(b)] for a, b in rows], "meta")
    warns = "".join(f"<li>{_e(w)}</li>" for w in m.warnings[:50])
    more = f"<li>… and {len(m.warnings) - 50} more</li>" if len(m.warnings) > 50 else ""
    return (
        f'<section id="provenance"><h2>Where these numbers come from</h2>{body}'
        + (f"<h3>Warnings</h3><ul>{warns}{more}</ul>" if warns else "")
        + "</section>"
    )


# ---------------------------------------------------------------------------------------------- figures
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
        out.append(("fig-graph", cap, _label_worst(graph, report, options.top)))
    for _, _, f in out:
        f.layout.width = None  # the page's width (the figures' fixed widths are for notebook tabs)
    return out


def _label_worst(fig: Any, report: DebugReport, top: int) -> Any:
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
            x=at[n][0], y=at[n][1], text=_e(_short_name(n)), showarrow=False, xanchor="left", xshift=9,
            font={"size": 11, "color": "#c92a2a"}, bgcolor="rgba(255,255,255,0.85)", hovertext=_e(n),
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


def _thin_ticks(fig: Any, max_ticks: int = MAX_TICKS) -> Any:
    """``fig`` with every array axis reduced to at most ``max_ticks`` evenly spaced labels."""
    for name in ("xaxis", "yaxis"):
        ax = getattr(fig.layout, name, None)
        if ax is None or ax.tickvals is None or len(ax.tickvals) <= max_ticks:
            continue
        step = -(-len(ax.tickvals) // max_ticks)
        texts = ax.ticktext if ax.ticktext is not None else ax.tickvals
        fig.update_layout({name: {"tickvals": list(ax.tickvals)[::step], "ticktext": list(texts)[::step]}})
    return fig


def _payload(figs: list[tuple[str, str, Any]]) -> str:
    """The figures' JSON, gzip + base64 (their hover texts compress ~10x)."""
    data = "[" + ",".join(
        f'{{"id":{json.dumps(i)},"fig":{_plotly_io.to_json(_thin_ticks(f), validate=False)}}}' for i, _, f in figs
    )
    data += "]"
    return base64.b64encode(gzip.compress(data.encode("utf-8"), compresslevel=6, mtime=0)).decode("ascii")


_LOADER = """
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
      // the time of every figure (~1 s on ViT-S here), most of them far below the fold.
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
        f'<section id="{i}-section"><p class="caption">{_e(cap)}</p><div id="{i}" class="fig">'
        '<p class="help wait">Drawn when it comes into view…</p></div></section>'
        for i, cap, _ in figs
    )
    sections = "".join(
        [
            _verdict(report, diagnostics, manifest, suggestions, measured_gains),
            _outputs(report),
            _diagnostics(diagnostics),
            _suggestions(suggestions, measured_gains, opts.top),
            '<section id="figures"><h2>Figures</h2><p id="qd-js-status" class="help">Loading the figure library…</p>',
            fig_html,
            "</section>",
            _worst_tables(report, opts.top),
            _target(report, manifest, out_dir),
            _meta(report),
        ]
    )
    nav = "".join(f'<a href="#{s}">{label}</a>' for s, label in _NAV if f'<section id="{s}"' in sections)
    body = (
        f"<h1>{_e(title)}</h1>"
        f'<p class="sub">{_e(report.meta.float_model)} → {_e(report.meta.quant_model)}, '
        f"{report.meta.num_samples} samples</p><nav>{nav}</nav>{sections}"
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>{body}"
        f'<script type="application/octet-stream" id="qd-plotly">{plotly_bundle(_cartesian_only(figs))}</script>'
        f'<script type="application/octet-stream" id="qd-figures">{_payload(figs)}</script>'
        f"<script>{_LOADER}</script></body></html>"
    )


def write_report_html(path: str | Path, report: DebugReport, **kwargs: Any) -> Path:
    """:func:`report_html` written atomically to ``path``."""
    return atomic_write_text(path, report_html(report, **kwargs))
