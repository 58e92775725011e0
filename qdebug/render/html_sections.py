"""The HTML report's sections (:mod:`qdebug.render.html`): the verdict in plain words, the output table, the
diagnostics, the suggestions with their measured gains, the worst tensors, the target's build and accuracy, and where
the numbers came from — each a plain HTML ``<section>`` (readable with scripts off), its text escaped here."""

from __future__ import annotations

import html
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdebug.mixed.gains import MeasuredGains
from qdebug.render.bands import SQNR_HIGH, SQNR_LOW, Band, band_of, sqnr_color
from qdebug.render.fmt import fmt_db_delta, fmt_db_text, fmt_task
from qdebug.report import DebugReport, SqnrKind

if TYPE_CHECKING:
    from qdebug.build_manifest import BuildManifest
    from qdebug.findings import Diagnostics
    from qdebug.mixed.suggest import Suggestion


def esc(x: Any) -> str:
    """Text made safe inside HTML (quotes too, for attributes)."""
    return html.escape(str(x), quote=True)


def _db_cell(v: float | None, status: Any = None) -> str:
    """A dB table cell shaded by its band (the colour of the figures' scale)."""
    text = fmt_db_text(v, None if status is None else str(status))
    band = band_of(v)
    return f'<td class="db {band.value}" style="background:{sqnr_color(v)}22">{esc(text)}</td>'


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "") -> str:
    """An HTML table; cells in ``rows`` are already HTML (``<td>…</td>``)."""
    if not rows:
        return '<p class="none">(none)</p>'
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join(f"<tr>{''.join(r)}</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _td(x: Any) -> str:
    return f"<td>{esc(x)}</td>"


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
        f"On the target ({esc(acc.device)}) the worst output is at <b>{esc(fmt_db_text(worst))}</b> from the float "
        'model (<a href="#target">target section</a>).'
    )


def _first_fix(suggestions: Sequence[Suggestion] | None, measured: Mapping[str, float] | MeasuredGains | None) -> str:
    """One sentence naming the first promotion to try (the top suggestion) with its predicted and measured gain."""
    if not suggestions or suggestions[0].estimated_output_gain_db < 0.1:
        return ""  # nothing worth promoting (the noise is spread thin): the diagnostics say more
    s = suggestions[0]
    flat = measured.per_tensor() if isinstance(measured, MeasuredGains) else (measured or {})
    got = f", measured {fmt_db_delta(flat[s.tensor_name], 2)}" if s.tensor_name in flat else ""
    return (
        f"First fix to try: store <code>{esc(s.tensor_name)}</code> ({esc(s.producer_op)}) in 16 bits — predicted "
        f"{fmt_db_delta(s.estimated_output_gain_db, 2)} at the worst output{got} "
        '(<a href="#suggestions">suggestions</a>).'
    )


def verdict_section(
    report: DebugReport,
    diagnostics: Diagnostics | None,
    manifest: BuildManifest | None = None,
    suggestions: Sequence[Suggestion] | None = None,
    measured: Mapping[str, float] | MeasuredGains | None = None,
) -> str:
    """The verdict in plain words: the output SQNR's band, the target, and the first fix to try."""
    worst = report.min_output_sqnr_db
    band = band_of(worst)
    label, sentence = _VERDICT[band]
    lines = [
        f"{sentence}: the worst output is at <b>{esc(fmt_db_text(worst))}</b> SQNR "
        f"(signal-to-noise: above {SQNR_HIGH:g} dB is good, {SQNR_LOW:g}–{SQNR_HIGH:g} dB marginal, below "
        f"{SQNR_LOW:g} dB bad; every 6 dB is one bit of precision)."
    ]
    if report.task is not None:  # the user's task beside the SQNR: whether the answer changed
        lines.append(f"The {esc(fmt_task(report.task))}.")
    target = _target_line(report, manifest)
    if target is not None:
        lines.append(target)
    worst_cum = report.worst(SqnrKind.CUMULATIVE, 1)
    worst_loc = report.worst(SqnrKind.LOCAL, 1)
    if worst_loc:
        a = worst_loc[0]
        lines.append(
            f"The tensor whose own rounding loses most is <code>{esc(a.tensor_name)}</code> ({esc(a.producer_op)}, "
            f"{esc(fmt_db_text(a.local_sqnr_db, str(a.local_status)))})."
        )
    if worst_cum:
        a = worst_cum[0]
        lines.append(
            f"The damage is largest at <code>{esc(a.tensor_name)}</code> ({esc(a.producer_op)}, cumulative "
            f"{esc(fmt_db_text(a.cumulative_sqnr_db, str(a.cumulative_status)))})."
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


def outputs_section(report: DebugReport) -> str:
    """The model outputs' SQNR table."""
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


def diagnostics_section(diagnostics: Diagnostics | None) -> str:
    """The diagnostics: what is wrong, the evidence and the fix to try (the first few shown, the rest folded)."""
    if diagnostics is None:
        return ""
    rows = [
        [f'<td class="sev {d.severity.value}">{esc(d.severity.value)}</td>', _td(d.kind.value.replace("_", " ")),
         f"<td><code>{esc(d.tensor)}</code><br><small>{esc(d.op)}</small></td>", _td(d.evidence),
         f"<td>{esc(d.remedy.text)}"
         + (f"<br><small>override: <code>{esc(json.dumps(d.remedy.overrides()))}</code></small>"
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
        f'<p class="help">Checks run: {esc(ran)}; {esc(stats)}.</p>'
        + _table(header, shown, "diag")
        + more
        + "</section>"
    )


def _applied(suggestions: Sequence[Suggestion], measured: Mapping[str, float] | None) -> str:
    """Promotions already applied and measured (their tensors are 16-bit now, so no longer suggested)."""
    listed = {s.tensor_name for s in suggestions}
    rows = [
        [f"<td><code>{esc(t)}</code></td>", _td(fmt_db_delta(gain, 2))]
        for t, gain in (measured or {}).items()
        if t not in listed
    ]
    if not rows:
        return ""
    return "<h3>Promotions applied and measured</h3>" + _table(["tensor", "measured gain at output"], rows)


def _gain(v: float | None) -> str:
    return fmt_db_delta(v, 2, missing="-")


def _measured_cell(name: str, measured: Mapping[str, float] | None, gains: MeasuredGains | None) -> str:
    """The suggestions' measured column: the gain, and whether it was measured alone or with its group."""
    tg = None if gains is None else next((t for t in gains.tensors if t.tensor == name), None)
    if tg is not None and tg.measured_gain_db is not None:
        alone = "alone" if tg.group_size == 1 else f"with its group of {tg.group_size} ({tg.candidate})"
        return _td(f"{fmt_db_delta(tg.measured_gain_db, 2)} ({alone})")
    if measured is not None and name in measured:
        return _td(fmt_db_delta(measured[name], 2))
    return _td("not measured")


def _search_tables(gains: MeasuredGains, top: int) -> str:
    """What a search measured: candidates alone (predicted vs measured), promotion sets, remedies."""
    parts = [
        f'<h3>Measured by {esc(gains.source)}</h3><p class="help">Gains of the worst model output over the '
        f"search's own base ({esc(fmt_db_text(gains.base_output_sqnr_db))}; its quantization and debug samples, "
        "which may differ from this report's)."
        + ("" if gains.reached is None else f" Goal {'reached' if gains.reached else '<b>not reached</b>'}"
           + (f" ({esc(gains.stop_reason)})" if gains.stop_reason else "") + ".")
        + "</p>"
    ]  # fmt: skip
    alone = [t for t in gains.tensors if t.measured_gain_db is not None]
    alone.sort(key=lambda t: -(t.measured_gain_db or 0.0))
    if alone:
        rows = [
            [f"<td><code>{esc(t.tensor)}</code></td>", _td(t.candidate if t.group_size > 1 else "alone"),
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


def suggestions_section(
    suggestions: Sequence[Suggestion] | None, measured: Mapping[str, float] | MeasuredGains | None, top: int = 10
) -> str:
    """The suggested promotions with their measured gains, and a search's measured tables when given."""
    gains: MeasuredGains | None = None
    flat: Mapping[str, float] | None = None
    if isinstance(measured, MeasuredGains):
        gains, flat = measured, measured.per_tensor()
    else:
        flat = measured
    if suggestions is None and not gains:
        return ""
    rows = [
        [_td(s.rank), f"<td><code>{esc(s.tensor_name)}</code></td>", _td(s.producer_op), _td(s.role),
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


def worst_section(report: DebugReport, top: int) -> str:
    """The worst tensors by local and by cumulative SQNR."""
    parts = ['<section id="worst"><h2>Worst tensors</h2>']
    local = [
        [f"<td><code>{esc(a.tensor_name)}</code></td>", _td(a.producer_op), _td(a.quant_type or "-"),
         _db_cell(a.local_sqnr_db, a.local_status), _db_cell(a.cumulative_sqnr_db, a.cumulative_status)]
        for a in report.worst(SqnrKind.LOCAL, top)
    ]  # fmt: skip
    parts.append("<h3>Local SQNR (each tensor's own rounding)</h3>")
    parts.append(_table(["tensor", "op", "type", "local", "cumulative"], local))
    cum = [
        [f"<td><code>{esc(a.tensor_name)}</code></td>", _td(a.producer_op), _td(a.quant_type or "float"),
         _db_cell(a.cumulative_sqnr_db, a.cumulative_status)]
        for a in report.worst(SqnrKind.CUMULATIVE, top)
    ]  # fmt: skip
    parts.append("<h3>Cumulative SQNR (the damage so far, vs the float model)</h3>")
    parts.append(_table(["tensor", "op", "type", "cumulative"], cum))
    wts = [
        [f"<td><code>{esc(w.weight_name)}</code></td>", _td(w.consumer_op), _td(w.kind), _td(w.quant_type),
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
        f'<h3>Accuracy on the target ({esc(acc.device)})</h3><p class="help">Output SQNR: the quantized model '
        "run on the CPU vs the float model, the compiled model on the target vs the float model, and target vs "
        "CPU (what the compiler and the hardware add).</p>"
        + _table(["output", "CPU-QDQ vs float", "target vs float", "target vs CPU-QDQ"], rows)
    )


def _compile_line(c: Any) -> str:
    """The compile report in one sentence."""
    if not c.ok:
        return f"<b>Compile failed</b> for {esc(c.target)}: {esc(c.error or 'see the log below')}."
    fb = ", ".join(f"{op} {n}" for op, n in sorted(c.fallback_by_op().items())) or "none"
    return (
        f"Compiled for {esc(c.device or c.target)}: {c.accelerator_nodes} node(s) on the accelerator in "
        f"{c.accelerator_partitions} partition(s), <b>{c.cpu_nodes} left on the CPU</b> (fallback by op: {esc(fb)})."
    )


def target_section(report: DebugReport, manifest: BuildManifest | None, out_dir: Any) -> str:
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
            f"where the target starts to diverge, remedies tried</summary><pre>{esc(text)}</pre></details>"
        )
    return f'<section id="target"><h2>{esc(head)}</h2>{"".join(parts)}</section>'


@dataclass(frozen=True)
class _BuildView:
    """What :func:`qdebug.render.text.print_build` reads of a build result."""

    out_dir: Path
    manifest: Any


def provenance_section(report: DebugReport) -> str:
    """Where the numbers came from: the models, data, versions, capture, time and warnings."""
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
    warns = "".join(f"<li>{esc(w)}</li>" for w in m.warnings[:50])
    more = f"<li>… and {len(m.warnings) - 50} more</li>" if len(m.warnings) > 50 else ""
    return (
        f'<section id="provenance"><h2>Where these numbers come from</h2>{body}'
        + (f"<h3>Warnings</h3><ul>{warns}{more}</ul>" if warns else "")
        + "</section>"
    )
