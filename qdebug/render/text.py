"""Text rendering for the CLI (and any plain-text report): tables, dB values coloured by band, the debug report's
tables, the build and compile reports."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from qdebug.render.bands import ANSI, ANSI_RESET, Band
from qdebug.render.fmt import fmt_db, fmt_db_text, fmt_pct, fmt_ratio, fmt_task, fmt_task_detail
from qdebug.report import SqnrKind

__all__ = [
    "GREEN",
    "RED",
    "RESET",
    "YELLOW",
    "Column",
    "TableSpec",
    "capture_line",
    "fmt_db",
    "print_build",
    "print_compile_report",
    "print_diagnostics",
    "print_fixes",
    "print_report",
    "table",
    "use_color",
    "worst_tables",
]

GREEN, YELLOW, RED, RESET = ANSI[Band.GOOD], ANSI[Band.MARGINAL], ANSI[Band.BAD], ANSI_RESET


def use_color(mode: str, stream: TextIO) -> bool:
    """``--color auto|always|never`` (auto: a terminal, unless ``NO_COLOR`` is set)."""
    if mode == "always":
        return True
    if mode == "never" or os.environ.get("NO_COLOR"):
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]], out: TextIO) -> None:
    """A titled text table, columns as wide as their widest cell (ANSI colour does not count)."""
    import re

    strip = re.compile(r"\033\[[0-9;]*m")
    widths = [len(h) for h in header]
    for r in rows:
        widths = [max(w, len(strip.sub("", c))) for w, c in zip(widths, r, strict=True)]
    print(f"\n{title}", file=out)
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for r in rows:
        print("  ".join(c + " " * (w - len(strip.sub("", c))) for c, w in zip(r, widths, strict=True)), file=out)
    if not rows:
        print("(none)", file=out)


def _summary_line(name: str, s: Any) -> str:
    if s.count == 0:
        body = "no finite values"
    else:
        body = f"count {s.count}  mean {s.mean:.2f}  std {s.std:.2f}  min {s.min:.2f}  max {s.max:.2f} dB"
    extra = []
    if s.infinite:
        extra.append(f"{s.infinite} identical (inf)")
    if s.undefined:
        extra.append(f"{s.undefined} undefined")
    return f"{name}: {body}" + (f"  [{', '.join(extra)}]" if extra else "")


@dataclass(frozen=True)
class Column:
    """One column of a results table: its header and how a row shows it."""

    header: str
    cell: Callable[[Any, bool], str]  # (row, colour?) -> text


@dataclass(frozen=True)
class TableSpec:
    """A results table of ``qdebug debug``: title, columns, and the summary printed under it."""

    title: str
    columns: tuple[Column, ...]
    summary: str  # the name of the summary line (and of the :class:`~qdebug.report.Summaries` field)

    def print(self, rows: Sequence[Any], summary: Any, out: TextIO, color: bool) -> None:
        """The table, then its one-line summary."""
        cells = [[c.cell(r, color) for c in self.columns] for r in rows]
        table(self.title, [c.header for c in self.columns], cells, out)
        print(_summary_line("outputs" if self.summary == "output" else self.summary, summary), file=out)


def _db_col(header: str, value: str, status: str, only_quantized: bool = False) -> Column:
    def cell(r: Any, color: bool) -> str:
        if only_quantized and not r.quantized:
            return "-"
        return fmt_db(getattr(r, value), getattr(r, status), color)

    return Column(header, cell)


def _col(header: str, fn: Callable[[Any], str]) -> Column:
    return Column(header, lambda r, _color: fn(r))


_OUTPUTS = TableSpec(
    "Model outputs (quantized vs float)",
    (
        _col("output", lambda o: o.output_name),
        _db_col("SQNR dB", "cumulative_sqnr_db", "cumulative_status"),
        _col("max |err|", lambda o: f"{o.max_abs_error:.4g}" if o.max_abs_error is not None else "-"),
        _col("worst sample", lambda o: "" if o.worst_sample is None else str(o.worst_sample)),
    ),
    "output",
)
_LOCAL = (
    _col("tensor", lambda a: a.tensor_name),
    _col("op", lambda a: a.producer_op),
    _col("type", lambda a: a.quant_type or "-"),
    _db_col("local", "local_sqnr_db", "local_status"),
    _db_col("cumulative", "cumulative_sqnr_db", "cumulative_status"),
)
_CUMULATIVE = (
    _col("tensor", lambda a: a.tensor_name),
    _col("op", lambda a: a.producer_op),
    _col("type", lambda a: a.quant_type or "float"),
    _db_col("cumulative", "cumulative_sqnr_db", "cumulative_status"),
    _db_col("local", "local_sqnr_db", "local_status", only_quantized=True),
)
_WEIGHT = (
    _col("weight", lambda w: w.weight_name),
    _col("used by", lambda w: w.consumer_op),
    _col("kind", lambda w: w.kind),
    _col("type", lambda w: w.quant_type),
    _col("channels", lambda w: str(w.channels)),
    _db_col("SQNR dB", "weight_sqnr_db", "weight_status"),
)


def worst_tables(top: int) -> tuple[tuple[SqnrKind, TableSpec], ...]:
    """The three worst-N tables of ``qdebug debug`` (local, cumulative, weight)."""
    return (
        (SqnrKind.LOCAL, TableSpec(f"Worst {top} local SQNR (this tensor's own rounding)", _LOCAL, "local")),
        (SqnrKind.CUMULATIVE, TableSpec(f"Worst {top} cumulative SQNR (damage so far)", _CUMULATIVE, "cumulative")),
        (SqnrKind.WEIGHT, TableSpec(f"Worst {top} weight SQNR", _WEIGHT, "weight")),
    )


def capture_line(info: Any) -> str | None:
    """How the tensors were captured (``report.meta.capture``), or ``None`` for a report that does not say."""
    if info is None:
        return None
    line = f"capture: {info.backend} backend"
    if info.requested == "auto":  # the choice was made from measured costs: say which and why
        line += f" (auto: {info.reason or 'chosen by cost'})"
    elif info.backend != info.requested:
        line += f" ({info.requested} requested; {info.reason or 'not usable here'})"
    if info.fallback_samples:
        why = "; ".join(f"{r} ({n})" for r, n in info.fallback_reasons)
        line += f"; {info.fallback_samples} sample(s) redone by {info.fallback_backend}: {why}"
    batch, batch_reason = getattr(info, "batch", 1), getattr(info, "batch_reason", None)
    if batch > 1:
        line += f"; batches of up to {batch} samples"
    if batch_reason:
        line += f"; not batched{' further' if batch > 1 else ''}: {batch_reason}"
    note = getattr(info, "segment_note", None)
    if note:  # segmented to bound memory, or why it could not be; post-Q/DQ tensors computed from integers;
        # what was computed from constants once
        line += f"; {note}" if getattr(info, "segments", 1) == 1 else f"; each sample in {note}"
    return line


def print_report(report: Any, out: TextIO, top: int = 10, color: bool = False) -> None:
    """The four tables of ``qdebug debug``, each followed by its one-line summary."""
    m = report.meta
    print(f"float: {m.float_model}\nquant: {m.quant_model}\ndata:  {m.data}", file=out)
    line = capture_line(m.capture)
    if line:
        print(line, file=out)
    _OUTPUTS.print(report.model_outputs, report.summary.output, out, color)
    if report.task is not None:
        print("\n".join([fmt_task(report.task), *(f"  {line}" for line in fmt_task_detail(report.task))]), file=out)
    for kind, spec in worst_tables(top):
        spec.print(report.worst(kind, top), getattr(report.summary, spec.summary), out, color)
    flagged = [a.tensor_name for a in report.activations if a.flagged]
    if flagged:
        print(f"\n{len(flagged)} tensor(s) hold NaN/Inf: {', '.join(flagged[:5])}", file=out)
    for w in m.warnings:
        print(f"warning: {w}", file=out)


def print_fixes(fixes: Sequence[Any], out: TextIO) -> None:
    """The compatibility fixes table of ``qdebug build``."""
    if fixes:
        rows = [[f.name, "yes" if f.changed else "no", f.detail] for f in fixes]
        table("Compatibility fixes (applied before quantizing)", ["fix", "changed", "what"], rows, out)


def _target_of(rep: Any) -> Any:
    from qdebug.errors import ConfigError
    from qdebug.targets.base import TargetBase, get_target

    try:
        return get_target(rep.target)
    except ConfigError:  # a report from a target that is not registered here: the generic description
        return TargetBase()


def print_compile_report(rep: Any, out: TextIO, folder: Any = None) -> None:
    """The compile report of ``qdebug build``: the target's own description, then CPU fallback by op type with
    the backend's reasons, the log, warnings and the error."""
    import re

    lines = _target_of(rep).describe(rep)
    print(f"\n{lines[0]}", file=out)
    for line in lines[1:]:
        print(line, file=out)
    groups: dict[tuple[str, str], int] = {}
    for f in rep.fallback:
        if not f.by_design:  # one row per op type and reason: node names would make one row per node
            key = (f.op_type, re.sub(r"node `[^`]*`", "node `…`", f.reason))
            groups[key] = groups.get(key, 0) + f.nodes
    if groups:
        rows = [[op, str(n), reason] for (op, reason), n in sorted(groups.items())]
        table("CPU fallback by op type (the backend's reason)", ["op", "nodes", "reason"], rows, out)
    if rep.log_path:  # relative to the output folder in a manifest
        print(f"  log: {rep.log_path if folder is None else os.path.join(folder, rep.log_path)}", file=out)
    for w in rep.warnings:
        print(f"  warning: {w}", file=out)
    if rep.error:
        print(f"  error: {rep.error}", file=out)


def print_build(result: Any, out: TextIO) -> None:
    """Everything ``qdebug build`` prints after a successful build."""
    m = result.manifest
    print_fixes(m.fixes, out)
    q = m.quantization
    if q is not None:
        print(
            f"\nquantized {q.nodes_quantized}/{q.nodes_total} nodes ({q.qdq_nodes} Q/DQ) with "
            f"{m.config.activation_type} activations and {m.config.weight_type} weights; calibration "
            f"{q.calibration_seconds:.2f} s on {q.num_calibration_samples} samples, "
            f"QDQ insertion {q.qdq_seconds:.2f} s",
            file=out,
        )
    print_compile_report(m.compile, out, result.out_dir)
    for line in _target_of(m.compile).describe_manifest(m.target_details):
        print(line, file=out)
    _print_accuracy(m, out)
    _print_top1(m, out)
    for w in m.warnings:
        print(f"warning: {w}", file=out)
    files = ", ".join(dict.fromkeys(m.files.values()))
    print(f"\nwrote {result.out_dir}/: {files} ({m.timings.get('total_s', 0.0):.1f} s)", file=out)


def _print_accuracy(m: Any, out: TextIO) -> None:
    acc = m.target_accuracy
    cpu = {o.output_name: o for o in m.cpu_qdq_vs_float}
    names = list(cpu) or ([o.output_name for o in acc.outputs] if acc else [])
    if names:
        by_t = {o.output_name: o for o in acc.outputs} if acc is not None else {}
        rows = []
        for n in names:
            c = cpu.get(n)
            t = by_t.get(n)
            rows.append(
                [
                    n,
                    fmt_db(c.sqnr_db, c.status) if c else "-",
                    fmt_db(t.target_vs_float_db) if t else "-",
                    fmt_db(t.target_vs_cpu_db) if t and t.target_vs_cpu_db is not None else "-",
                ]
            )
        where = f"target: {acc.device}" if acc is not None else "no target run"
        table(
            f"Output SQNR (dB) on {m.num_debug_samples} samples ({where})",
            ["output", "CPU-QDQ vs float", "target vs float", "target vs CPU-QDQ"],
            rows,
            out,
        )
    if acc is not None:
        if acc.tensors:
            print_divergence(acc, out)
        print(f"target run: {acc.seconds_per_sample * 1000:.1f} ms per sample", file=out)
        for note in acc.notes:
            print(f"note: {note}", file=out)


def print_divergence(acc: Any, out: TextIO) -> None:
    """Where the target's numbers start to diverge (docs/qnn.md: the excess-noise rule; old reports: LSB)."""
    n_lsb = sum(1 for t in acc.tensors if t.max_lsb > acc.lsb_threshold)
    lsb = f"{n_lsb} differ by more than {acc.lsb_threshold} LSB"
    if acc.divergence_rule == "lsb":
        print(
            f"per tensor: {len(acc.tensors)} quantized activations compared, {lsb} on the target; "
            f"first: {acc.first_divergent or 'none'}",
            file=out,
        )
        return
    flagged = acc.flagged
    print(
        f"per tensor: {len(acc.tensors)} quantized activations compared; {len(flagged)} flagged (the target adds "
        f"more than {acc.excess_threshold:g}x the tensor's own quantization error vs float); {lsb} (information)",
        file=out,
    )
    if acc.first_divergent is None:
        print("divergence: none (the target stays within the quantization error everywhere)", file=out)
        return
    t = next(x for x in acc.tensors if x.tensor_name == acc.first_divergent)
    print(
        f"divergence starts at {t.tensor_name} ({t.op_type or '?'}): vs float CPU-QDQ "
        f"{fmt_db_text(t.cpu_vs_float_db)}, target {fmt_db_text(t.target_vs_float_db)}; the target adds "
        f"{fmt_ratio(t.excess_noise_ratio)}x the quantization error; max {t.max_lsb} LSB; "
        f"{len(acc.divergence_starts)} start(s)"
        + (f", {len(acc.isolated_starts)} isolated (not propagated)" if acc.isolated_starts else ""),
        file=out,
    )
    if acc.first_divergent_nodes:
        chain = " -> ".join(f"{op} {name}" for op, name in acc.first_divergent_nodes)
        print(f"  computed by: {chain}", file=out)
    for name in acc.isolated_starts:
        print(f"  isolated start (its consumers are within their quantization error): {name}", file=out)
    ops = ", ".join(f"{op} {n}" for op, n in acc.divergence_ops)
    print(f"nodes computing flagged tensors, by op: {ops}", file=out)


def _print_top1(m: Any, out: TextIO) -> None:
    if m.top1 is not None:
        t1 = m.top1

        print(
            f"top-1 on {t1.num_samples} samples: float {fmt_pct(t1.float_model)}, QDQ (CPU) {fmt_pct(t1.qdq_model)}, "
            f"compiled ({m.device}) {fmt_pct(t1.compiled_model)}",
            file=out,
        )


def print_diagnostics(diagnostics: Any, out: TextIO, top: int | None = None, color: bool = False) -> None:
    """The diagnostics of ``qdebug diagnose`` (and ``debug --diagnose``), one block each: severity, problem,
    tensor (op), then the evidence and the fix to try; then which checks ran."""
    sev = {"error": RED, "warning": YELLOW, "info": ""}
    items = diagnostics.items if top is None else diagnostics.items[:top]
    print(f"\nDiagnostics (why, and the fix to try): {len(diagnostics.items)}", file=out)
    for d in items:
        level = d.severity.value
        shown = f"{sev[level]}{level}{RESET}" if color and sev[level] else level
        print(f"{shown}: {d.kind.value.replace('_', ' ')} at {d.tensor} ({d.op})", file=out)
        print(f"    evidence: {d.evidence}", file=out)
        print(f"    fix:      {d.remedy.text}", file=out)
    if not diagnostics.items:
        print("(none)", file=out)
    if top is not None and len(diagnostics.items) > top:
        print(f"... and {len(diagnostics.items) - top} more (--top, --json)", file=out)
    stats = (
        f"per-tensor statistics over {diagnostics.stats_samples} sample(s)"
        if diagnostics.stats_samples
        else "no per-tensor statistics"
    )
    print(f"checks: {', '.join(k.value for k in diagnostics.checks)}; {stats}", file=out)
