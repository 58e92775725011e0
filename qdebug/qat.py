"""Canonicalise QAT / fake-quant exports into plain default-domain QDQ.

QAT toolchains export quantization in many spellings: decomposed "QCDQ" arithmetic
(Div → Round → Clip → Mul), ``com.microsoft`` Q/DQ, OpenVINO ``FakeQuantize`` with stored ranges,
in-graph weight quantization, no-op re-quantizations and training leftovers. qdebug's pairing (and
the compile targets) walk QuantizeLinear → DequantizeLinear, so :func:`canonicalize` rewrites each
spelling into that form with a list of small named passes, each ``(model) -> (model, PassReport)``.
Every pass keeps the model runnable and numerically equivalent (up to float rounding); see docs/qat.md.

The passes and the rewriter they share are :mod:`qdebug.qat_passes`; this module orders them (:data:`PASSES`), runs
them (:func:`canonicalize`) and re-exports them in its ``__all__``, the QAT API docs/qat.md describes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from qdebug.errors import ConfigError, ModelError
from qdebug.io import atomic_save_model, refuse_overwrite_input
from qdebug.model_io import load_model
from qdebug.passes import Pass, PassReport, run_passes
from qdebug.qat_passes import (
    eliminate_redundant_dq_q,
    fakequant_from_minmax,
    fold_decomposed_dequant,
    fold_decomposed_quant,
    fold_weight_fakequant,
    normalize_qdq_domain,
    prune_training_leftovers,
)

__all__ = [
    "PASSES",
    "CanonicalizeResult",
    "PassReport",
    "canonicalize",
    "eliminate_redundant_dq_q",
    "fakequant_from_minmax",
    "fold_decomposed_dequant",
    "fold_decomposed_quant",
    "fold_weight_fakequant",
    "normalize_qdq_domain",
    "prune_training_leftovers",
]

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class CanonicalizeResult:
    """The canonical model (and where it was written, if anywhere), per-pass reports and warnings."""

    model: onnx.ModelProto
    path: Path | None
    reports: tuple[PassReport, ...]
    warnings: tuple[str, ...] = field(default_factory=tuple)

    @property
    def nodes_before(self) -> int:
        """Node count of the input model."""
        first = self.reports[0].nodes_before if self.reports else None
        return len(self.model.graph.node) if first is None else first

    @property
    def nodes_after(self) -> int:
        """Node count of the canonical model."""
        return len(self.model.graph.node)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (without the model itself)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "path": str(self.path) if self.path else None,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "reports": [r.to_dict() for r in self.reports],
            "warnings": list(self.warnings),
        }


#: The passes :func:`canonicalize` runs, in order. Decomposed quant/dequant first (they create the Q/DQ
#: the later passes look at), weight folding after the domain is normalized, pruning last.
PASSES: tuple[tuple[str, Pass], ...] = (
    ("fold_decomposed_quant", fold_decomposed_quant),
    ("fold_decomposed_dequant", fold_decomposed_dequant),
    ("fakequant_from_minmax", fakequant_from_minmax),
    ("normalize_qdq_domain", normalize_qdq_domain),
    ("fold_weight_fakequant", fold_weight_fakequant),
    ("eliminate_redundant_dq_q", eliminate_redundant_dq_q),
    ("prune_training_leftovers", prune_training_leftovers),
)
_BY_NAME = dict(PASSES)


def canonicalize(
    model_or_path: str | Path | onnx.ModelProto,
    *,
    passes: Sequence[str | Pass] | None = None,
    disable: Sequence[str] = (),
    output: str | Path | None = None,
) -> CanonicalizeResult:
    """Run the canonicalisation passes (default: all of :data:`PASSES`, in order) on a QAT export.

    ``passes`` picks names from :data:`PASSES` or custom callables; ``disable`` removes names. The
    input is never modified; ``output`` is written atomically. The result is checked with
    ``onnx.checker`` (a :class:`ModelError` otherwise).
    """
    unknown = [d for d in disable if d not in _BY_NAME]
    chosen: list[Pass] = []
    for p in passes if passes is not None else [name for name, _ in PASSES]:
        if isinstance(p, str):
            if p not in _BY_NAME:
                unknown.append(p)
                continue
            if p not in disable:
                chosen.append(_BY_NAME[p])
        else:
            chosen.append(p)
    if unknown:
        raise ConfigError(f"unknown pass name(s) {unknown}; known: {[n for n, _ in PASSES]}")
    if isinstance(model_or_path, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(model_or_path)
    else:
        model = load_model(model_or_path, "QAT model")
        if output is not None:
            refuse_overwrite_input(output, model_or_path)
    model, reports = run_passes(model, chosen)
    warnings = [w for r in reports for w in r.warnings]
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise ModelError(f"the canonicalised model fails the ONNX checker: {exc}") from exc
    leftover = sorted({n.op_type for n in model.graph.node if n.domain not in ("", "ai.onnx")})
    if leftover:
        warnings.append(f"custom-domain ops remain: {leftover}")
    path = atomic_save_model(model, output) if output is not None else None
    return CanonicalizeResult(model=model, path=path, reports=tuple(reports), warnings=tuple(warnings))
