"""The compile of each variant side by side, as HTML: where the graph ran (device, partitions, CPU nodes) and how its
numbers on the target compare with the float model and with the QDQ model on ONNX Runtime CPU (worst output SQNR),
for one variant or for the before and after of a step, with a sentence when the two ran on different devices."""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from qdebug.render.fmt import fmt_db_text

if TYPE_CHECKING:
    from qdebug.report import TargetAccuracy, TargetOutputAccuracy
    from qdebug.targets.recompile import RecompileResult

__all__ = ["device_sentence", "target_rows", "target_table_html", "worst_db"]

Row = tuple[str, str, list[str]]  # (css class, label, one cell per column)


def worst_db(acc: TargetAccuracy | None, pick: Callable[[TargetOutputAccuracy], float | None]) -> float | None:
    """The smallest SQNR over the outputs of ``acc`` for one comparison (``None``: no output has it)."""
    if acc is None:
        return None
    values = [v for v in (pick(o) for o in acc.outputs) if v is not None]
    return min(values) if values else None


def _accuracy_cell(r: RecompileResult, pick: Callable[[TargetOutputAccuracy], float | None]) -> str:
    if r.target_accuracy is None:
        return "not measured" if r.ok else "-"
    return fmt_db_text(worst_db(r.target_accuracy, pick))


def _fallback(r: RecompileResult) -> str:
    ops = ", ".join(f"{op}×{n}" for op, n in r.compile.fallback_by_op().items())
    return f"{r.compile.cpu_nodes}" + (f" ({ops})" if ops else "")


def _samples(r: RecompileResult) -> str:
    acc = r.target_accuracy
    return "-" if acc is None else f"{acc.num_samples} ({acc.seconds_per_sample:.3f} s each on the target)"


def _diverging(r: RecompileResult) -> str:
    """The probe's per-tensor verdict: how many quantized activations the target moved beyond their own quantization
    error, and where that starts (``-``: no probe)."""
    acc = r.target_accuracy
    if acc is None or not acc.tensors:
        return "-"
    flagged = len(acc.flagged)
    first = "" if acc.first_divergent is None else f"; first: {acc.first_divergent}"
    return f"{flagged} of {len(acc.tensors)}{first}"


def target_rows(results: Sequence[RecompileResult]) -> list[Row]:
    """The table's rows, one cell per compile: device, outcome, partitions, nodes, CPU nodes (for the CPU target,
    which has no accelerator: its nodes only), the worst output's
    SQNR of target vs float, target vs CPU-QDQ and CPU-QDQ vs float (the three comparisons of
    :class:`~qdebug.report.TargetAccuracy`), the tensors the probe flagged and the samples."""
    rs = list(results)
    if any(r.compile.accelerator for r in rs):
        where: list[Row] = [
            ("qd-t-partitions", "accelerator partitions", [str(r.compile.accelerator_partitions) for r in rs]),
            ("qd-t-nodes", "nodes on the accelerator", [str(r.compile.accelerator_nodes) for r in rs]),
            ("qd-t-cpu", "nodes on the CPU (fallback)", [_fallback(r) for r in rs]),
        ]
    else:  # the CPU target runs the whole graph: no partitions, no fallback, just its nodes
        where = [("qd-t-nodes", "nodes (all on the CPU)", [str(r.compile.accelerator_nodes) for r in rs])]
    return [
        ("qd-t-device", "device", [f"{r.compile.target} {r.compile.device}".strip() for r in rs]),
        ("qd-t-ok", "compiled", ["ok" if r.ok else "FAILED" for r in rs]),
        *where,
        ("qd-t-vs-float", "target vs float (worst output SQNR)", [
            _accuracy_cell(r, lambda o: o.target_vs_float_db) for r in rs
        ]),
        ("qd-t-vs-cpu", "target vs CPU-QDQ (worst output SQNR)", [
            _accuracy_cell(r, lambda o: o.target_vs_cpu_db) for r in rs
        ]),
        ("qd-t-cpu-vs-float", "CPU-QDQ vs float (worst output SQNR)", [
            _accuracy_cell(r, lambda o: o.cpu_vs_float_db) for r in rs
        ]),
        ("qd-t-diverge", "tensors beyond their quantization error on the target", [_diverging(r) for r in rs]),
        ("qd-t-samples", "samples compared", [_samples(r) for r in rs]),
    ]  # fmt: skip


def _same_chip(a: RecompileResult, b: RecompileResult) -> bool:
    """Both compiled for one device: the same label and the same SoC."""
    return (a.compile.device, a.soc) == (b.compile.device, b.soc)


def device_sentence(before: RecompileResult, after: RecompileResult) -> str:
    """One sentence on the devices of a before and an after compile: the same one, or which differ and why (the
    compile's own notes say why a target chose another SoC)."""
    b, a = before.compile.device, after.compile.device
    if _same_chip(before, after):
        return f"before and after were compiled for the same device: {b or before.compile.target}"
    why = [n for n in (*after.notes, *before.notes) if "soc" in n.lower()]
    reason = "; ".join(why) if why else "they were compiled with different options"
    return (
        f"before and after were compiled for different devices (before: {b}, after: {a}), so their target figures "
        f"are of two chips: {reason}"
    )


def target_table_html(results: Sequence[RecompileResult], names: Sequence[str], caption: str = "") -> str:
    """The compile table (class ``qd-target-table``), a column per compile named by ``names``, under ``caption``
    (e.g. where "the target" ran: ``qnn: onnxruntime-qnn 1.23 (HTP simulator)``), then each compile's problems and
    notes; with two compiles (before, after) the sentence on their devices (``qd-target-device``)."""
    rs = list(results)
    if not rs:
        return ""
    head = "".join(f"<th>{html.escape(n)}</th>" for n in names)
    body = "".join(
        f"<tr class='{cls}'><th>{html.escape(label)}</th>"
        + "".join(f"<td class='qd-col{i}'>{html.escape(c)}</td>" for i, c in enumerate(cells))
        + "</tr>"
        for cls, label, cells in target_rows(rs)
    )
    cap = f"<caption class='qd-target-caption'>{html.escape(caption)}</caption>" if caption else ""
    out = f"<table class='qd-target-table'>{cap}<tr><th></th>{head}</tr>{body}</table>"
    if len(rs) == 2:
        colour = "#495057" if _same_chip(rs[0], rs[1]) else "#c92a2a"
        sentence = html.escape(device_sentence(rs[0], rs[1]))
        out += f"<p class='qd-target-device' style='color:{colour}'>{sentence}</p>"
    items = [
        f"<li>{html.escape(name)}: {html.escape(text)}</li>"
        for name, r in zip(names, rs, strict=True)
        for text in (*r.problems, *r.notes)
    ]
    if items:
        out += f"<ul class='qd-target-notes'>{''.join(items)}</ul>"
    return out
