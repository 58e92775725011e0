"""One protocol for graph rewrites: QAT canonicalisation, target compatibility fixes and the Deeploy export.

A *pass* takes a model and returns a new model and a :class:`PassReport` (the input is never modified). The same
report type describes every rewrite qdebug makes, so the CLI, the build manifest and the UI show them the same way.
:func:`run_passes` runs a sequence of passes in order, with an optional progress line per pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import onnx

__all__ = ["Pass", "PassReport", "run_passes"]


@dataclass(frozen=True)
class PassReport:
    """What one pass did to a model.

    ``changed`` says whether the model (or, for a config-only rule, the quantization config) changed; ``detail``
    is the one-line human explanation; ``rewrites`` counts the patterns rewritten; ``details`` and ``warnings``
    list the individual rewrites and anything the user should look at. ``skipped`` marks a pass the user turned
    off (it is still listed, so a report always names every pass of its pipeline).
    """

    name: str
    changed: bool = False
    detail: str = ""
    nodes_before: int | None = None
    nodes_after: int | None = None
    rewrites: int = 0
    details: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    seconds: float | None = None
    skipped: bool = False

    @property
    def summary(self) -> str:
        """One line, e.g. ``fold_decomposed_quant: 7 rewrite(s), nodes 40 → 26``."""
        if self.skipped:
            return f"{self.name}: skipped"
        nodes = ""
        if self.nodes_before is not None and self.nodes_after is not None:
            nodes = f", nodes {self.nodes_before} → {self.nodes_after}"
        what = self.detail or f"{self.rewrites} rewrite(s)"
        return f"{self.name}: {what}{nodes}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (every field; tuples as lists)."""
        return {
            "name": self.name,
            "changed": self.changed,
            "detail": self.detail,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "rewrites": self.rewrites,
            "details": list(self.details),
            "warnings": list(self.warnings),
            "seconds": self.seconds,
            "skipped": self.skipped,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PassReport:
        """Inverse of :meth:`to_dict`; also reads the older ``{name, changed, detail}`` fix entries."""
        return cls(
            name=str(d["name"]),
            changed=bool(d.get("changed", False)),
            detail=str(d.get("detail", "")),
            nodes_before=d.get("nodes_before"),
            nodes_after=d.get("nodes_after"),
            rewrites=int(d.get("rewrites", 0)),
            details=tuple(d.get("details", ())),
            warnings=tuple(d.get("warnings", ())),
            seconds=d.get("seconds"),
            skipped=bool(d.get("skipped", False)),
        )


#: A graph rewrite: ``model -> (new model, report)``; the input model is left as it was.
Pass = Callable[[onnx.ModelProto], tuple[onnx.ModelProto, PassReport]]


def _summary_line(report: PassReport) -> str:
    return report.summary


def run_passes(
    model: onnx.ModelProto,
    passes: Sequence[Pass],
    *,
    progress: Callable[[str], None] | None = None,
    line: Callable[[PassReport], str] = _summary_line,
) -> tuple[onnx.ModelProto, tuple[PassReport, ...]]:
    """Run ``passes`` in order; returns the final model and one report per pass (timed, node counts filled in
    where the pass left them out). With ``progress``, each pass is announced as ``[k/n] `` + ``line(report)``
    (default: :attr:`PassReport.summary`).

    Every rewrite pipeline runs through this: QAT canonicalisation, the QNN/Deeploy compatibility fixes
    (:func:`qdebug.targets.model_fixes.apply_qnn_fixes`) and the Deeploy export, whose passes share one mutable
    graph state and are adapted to this signature (:func:`qdebug.targets.deeploy_export.export`)."""
    reports: list[PassReport] = []
    current = model
    for i, p in enumerate(passes, 1):
        before = len(current.graph.node)
        t0 = time.perf_counter()
        current, rep = p(current)
        after = len(current.graph.node)
        rep = PassReport(
            **{
                **rep.to_dict(),
                "details": rep.details,
                "warnings": rep.warnings,
                "nodes_before": before if rep.nodes_before is None else rep.nodes_before,
                "nodes_after": after if rep.nodes_after is None else rep.nodes_after,
                "seconds": round(time.perf_counter() - t0, 4) if rep.seconds is None else rep.seconds,
            }
        )
        reports.append(rep)
        if progress is not None:
            progress(f"[{i}/{len(passes)}] {line(rep)}")
    return current, tuple(reports)
