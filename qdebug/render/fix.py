"""How a fix looks: the text summary the CLI prints and the one-file HTML report (no script, no network)."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from qdebug.fix.result import FixResult, Stage, Trial
from qdebug.render.fmt import fmt_db_text

_ROWS = (("base", "before"), ("best_8bit", "best 8-bit recipe"), ("fixed", "fixed"))


def _names(result: FixResult) -> dict[str, str]:
    return {"base": result.base, "best_8bit": result.best_8bit, "fixed": result.chosen}


def _row(result: FixResult, key: str) -> tuple[Trial, str, str]:
    t = result.trial(_names(result)[key])
    held = result.holdout.get(key)
    return t, fmt_db_text(t.db), fmt_db_text(None if held is None else held.worst_db, missing="-")


def summary_rows(result: FixResult) -> list[tuple[str, str, str, str, str]]:
    """(label, what it is, debug-sample dB, held-out dB, 16-bit share) for before, best 8-bit and fixed."""
    rows = []
    for key, label in _ROWS:
        t, dbg, held = _row(result, key)
        rows.append((label, t.description, dbg, held, f"{100 * t.share_16bit:.1f} %"))
    return rows


def fix_lines(result: FixResult) -> list[str]:
    """The fix as plain lines: before/after on the debug and held-out samples, ceilings, what each remedy bought,
    the goal and what caps it, the cost."""
    held_n = next(iter(result.holdout.values())).samples if result.holdout else 0
    debug_n = result.trial(result.base).measure
    debug_label = "debug" if debug_n is None else f"debug ({debug_n.samples})"
    lines = [
        f"{'':22} {debug_label:>14} {f'held-out ({held_n})':>14} {'16-bit':>8}   worst output SQNR",
        *(
            f"{label:22} {dbg:>14} {held:>14} {share:>8}   {desc}"
            for label, desc, dbg, held, share in summary_rows(result)
        ),
    ]
    tasks = [(label, result.trial(_names(result)[key]).measure, result.holdout.get(key)) for key, label in _ROWS]
    if result.metric is not None:
        lines += [f"{label:22} task {result.metric}: {_task(dbg)} (debug), {_task(held)} (held-out)"
                  for label, dbg, held in tasks]  # fmt: skip
    return lines + detail_lines(result)


def detail_lines(result: FixResult) -> list[str]:
    """The lines after the before/after table, in plain words: the ceilings, what each remedy bought, the goal and
    what caps it, the cost, the notes (the dashboard's Fix tab shows them under its own table)."""
    lines: list[str] = []
    ceil = " · ".join(f"{k} {fmt_db_text(v)}" for k, v in result.ceilings.items())
    if ceil:
        lines.append(f"ceilings (debug samples): {ceil}")
    if result.steps:
        lines.append("what each remedy bought (debug samples):")
        lines += [f"  {s.remedy}: {fmt_db_text(s.gain_db)} gain" for s in result.steps]
    if result.goal_db is not None:
        state = "reached" if result.reached else "not reached"
        lines.append(f"goal {result.goal_db:.1f} dB (worst output, debug samples): {state}")
    lines += [f"  what caps it: {c}" for c in result.caps]
    pe = result.prediction_error_db
    if pe is not None:
        lines.append(f"16-bit choices, predicted vs measured: median |error| {pe[0]:.2f} dB over {pe[1]}")
    eq = result.pass_equivalents
    lines.append(
        f"{len(result.trials)} candidates measured in {result.seconds:.0f} s"
        + (f" (≈ {eq:g} debug passes)" if eq is not None else "")
    )
    lines += [f"note: {n}" for n in result.notes]
    return lines


def _task(m: object) -> str:
    value = getattr(m, "task", None)
    return "-" if value is None else f"{value:.4g}"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _bars(result: FixResult) -> str:
    """An inline SVG bar per row of the summary (debug and held-out dB): before/after at a glance, no script."""
    vals = []
    for key, label in _ROWS:
        t = result.trial(_names(result)[key])
        held = result.holdout.get(key)
        vals.append((label, t.db, None if held is None else held.worst_db))
    finite = [v for _, a, b in vals for v in (a, b) if v is not None and math.isfinite(v)]
    top = max([*finite, 1.0])
    out, y = [], 10
    for label, a, b in vals:
        for v, colour, what in ((a, "#4c78a8", "debug"), (b, "#f58518", "held-out")):
            w = 0.0 if v is None or not v > 0 else min(1.0, v / top) * 420
            text = f"{html.escape(fmt_db_text(v))} ({what})"
            out.append(f'<rect x="170" y="{y}" width="{w:.0f}" height="12" fill="{colour}"/>'
                       f'<text x="{176 + w:.0f}" y="{y + 10}" font-size="11">{text}</text>')  # fmt: skip
            y += 14
        out.append(f'<text x="0" y="{y - 10}" font-size="12">{html.escape(label)}</text>')
        y += 8
    return f'<svg width="720" height="{y}" role="img" aria-label="worst output SQNR">{"".join(out)}</svg>'


def fix_html(result: FixResult) -> str:
    """The one-file HTML report of a fix."""
    summary = _table(("", "what", "debug dB", "held-out dB", "16-bit share"), [
        (label, desc, dbg, held, share) for label, desc, dbg, held, share in summary_rows(result)
    ])  # fmt: skip
    steps = _table(("remedy kept", "gain (debug samples)", "16-bit share"),
                   [(s.remedy, fmt_db_text(s.gain_db), f"{100 * s.share_16bit:.1f} %")
                    for s in result.steps])  # fmt: skip
    trials = _table(("stage", "candidate", "dB", "16-bit share", "s", "error"), [
        (str(t.stage), t.description, fmt_db_text(t.db), f"{100 * t.share_16bit:.1f} %", f"{t.seconds:.1f}",
         t.error or "")
        for t in result.trials
    ])  # fmt: skip
    ceilings = " · ".join(f"{k} {fmt_db_text(v)}" for k, v in result.ceilings.items())
    goal = (
        ""
        if result.goal_db is None
        else f"<p>Goal {result.goal_db:.1f} dB: {'reached' if result.reached else 'not reached'}.</p>"
    )
    caps = "".join(f"<li>{html.escape(c)}</li>" for c in result.caps)
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in result.notes)
    libs = [t for t in result.trials if t.stage is Stage.LIBRARY]
    lib_note = f", {len(libs)} from PTQ libraries" if libs else ""
    title = html.escape(result.float_model)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>qdebug fix — {title}</title>
<style>body{{font:14px system-ui,sans-serif;margin:2em;max-width:70em}}
table{{border-collapse:collapse;margin:.5em 0 1.5em}}
td,th{{border:1px solid #ccc;padding:.25em .6em;text-align:left}}th{{background:#f3f3f3}}</style></head><body>
<h1>qdebug fix</h1><p>{html.escape(result.float_model)} · target {html.escape(result.target)} ·
16-bit budget {100 * result.budget_16bit:.0f} % of elements · worst output SQNR vs the float model</p>
<h2>Before and after</h2>{_bars(result)}{summary}
<p>Ceilings on the debug samples: {html.escape(ceilings or "-")}</p>{goal}
{"<h2>What caps it</h2><ul>" + caps + "</ul>" if caps else ""}
<h2>What each remedy bought</h2>{steps}
<h2>Every candidate measured</h2><p>{len(result.trials)} candidates{lib_note},
{result.seconds:.0f} s.</p>{trials}
{"<h2>Notes</h2><ul>" + notes + "</ul>" if notes else ""}
</body></html>
"""


__all__ = ["detail_lines", "fix_html", "fix_lines", "summary_rows"]
