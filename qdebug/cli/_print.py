"""What the ``qdebug`` commands print: tables, dB values coloured by band, the build and compile reports."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any, TextIO

GREEN, YELLOW, RED, DIM, RESET = "\033[32m", "\033[33m", "\033[31m", "\033[2m", "\033[0m"


def use_color(mode: str, stream: TextIO) -> bool:
    if mode == "always":
        return True
    if mode == "never" or os.environ.get("NO_COLOR"):
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


def fmt_db(v: float | None, status: str = "ok", color: bool = False) -> str:
    """A dB value for a table: coloured > 40 green, 20–40 yellow, < 20 red; degenerate cases spelled out."""
    if v is None:
        text, c = status, RED
    elif math.isinf(v):
        text, c = "inf", GREEN
    else:
        text = f"{v:7.2f}"
        c = GREEN if v > 40 else YELLOW if v >= 20 else RED
    return f"{c}{text}{RESET}" if color else text


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]], out: TextIO) -> None:
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


def print_report(report: Any, out: TextIO, top: int = 10, color: bool = False) -> None:
    """The four tables of ``qdebug debug``, each followed by its one-line summary."""
    m = report.meta
    print(f"float: {m.float_model}\nquant: {m.quant_model}\ndata:  {m.data}", file=out)
    rows = [
        [
            o.output_name,
            fmt_db(o.cumulative_sqnr_db, o.cumulative_status, color),
            f"{o.max_abs_error:.4g}" if o.max_abs_error is not None else "-",
            "" if o.worst_sample is None else str(o.worst_sample),
        ]
        for o in report.model_outputs
    ]
    table("Model outputs (quantized vs float)", ["output", "SQNR dB", "max |err|", "worst sample"], rows, out)
    print(_summary_line("outputs", report.summary.output), file=out)

    rows = [
        [
            a.tensor_name,
            a.producer_op,
            a.quant_type or "-",
            fmt_db(a.local_sqnr_db, a.local_status, color),
            fmt_db(a.cumulative_sqnr_db, a.cumulative_status, color),
        ]
        for a in report.worst("local", top)
    ]
    table(
        f"Worst {top} local SQNR (this tensor's own rounding)",
        ["tensor", "op", "type", "local", "cumulative"],
        rows,
        out,
    )
    print(_summary_line("local", report.summary.local), file=out)

    rows = [
        [
            a.tensor_name,
            a.producer_op,
            a.quant_type or "float",
            fmt_db(a.cumulative_sqnr_db, a.cumulative_status, color),
            fmt_db(a.local_sqnr_db, a.local_status, color) if a.quantized else "-",
        ]
        for a in report.worst("cumulative", top)
    ]
    table(
        f"Worst {top} cumulative SQNR (damage so far)",
        ["tensor", "op", "type", "cumulative", "local"],
        rows,
        out,
    )
    print(_summary_line("cumulative", report.summary.cumulative), file=out)

    rows = [
        [
            w.weight_name,
            w.consumer_op,
            w.kind,
            w.quant_type,
            str(w.channels),
            fmt_db(w.weight_sqnr_db, w.weight_status, color),
        ]
        for w in report.worst("weight", top)
    ]
    table(f"Worst {top} weight SQNR", ["weight", "used by", "kind", "type", "channels", "SQNR dB"], rows, out)
    print(_summary_line("weight", report.summary.weight), file=out)
    flagged = [a.tensor_name for a in report.activations if a.flagged]
    if flagged:
        print(f"\n{len(flagged)} tensor(s) hold NaN/Inf: {', '.join(flagged[:5])}", file=out)
    for w in m.warnings:
        print(f"warning: {w}", file=out)


def _kib(n: int) -> str:
    return f"{n / 1024:.0f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"


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
            differ = sum(1 for t in acc.tensors if t.max_lsb > acc.lsb_threshold)
            first = acc.first_divergent or "none"
            print(
                f"per tensor: {len(acc.tensors)} quantized activations compared, {differ} differ by more than "
                f"{acc.lsb_threshold} LSB on the target; first: {first}",
                file=out,
            )
        print(f"target run: {acc.seconds_per_sample * 1000:.1f} ms per sample", file=out)
        for note in acc.notes:
            print(f"note: {note}", file=out)


def _print_top1(m: Any, out: TextIO) -> None:
    if m.top1 is not None:
        t1 = m.top1

        def pct(v: float | None) -> str:
            return "-" if v is None else f"{v:.2%}"

        print(
            f"top-1 on {t1.num_samples} samples: float {pct(t1.float_model)}, QDQ (CPU) {pct(t1.qdq_model)}, "
            f"compiled ({m.device}) {pct(t1.compiled_model)}",
            file=out,
        )
