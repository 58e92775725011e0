"""A measured quantized variant (:class:`Evaluation`) and its 16-bit cost: what the session produces and the
search compares, below both so that neither imports the other."""

from __future__ import annotations

from dataclasses import dataclass

from qdebug.config import QuantConfig
from qdebug.mixed.compare import Comparison
from qdebug.quantizer import QuantizeResult
from qdebug.report import DebugReport

__all__ = ["Evaluation", "sixteen_bit_cost"]


@dataclass(frozen=True)
class Evaluation:
    """A quantized variant measured: its quantization, its debug report, and the comparison to the base."""

    name: str
    config: QuantConfig
    quantization: QuantizeResult
    report: DebugReport
    comparison: Comparison | None
    accuracy: float | None
    seconds: float

    @property
    def output_sqnr_db(self) -> float | None:
        """The worst model output's SQNR."""
        return self.report.min_output_sqnr_db


def sixteen_bit_cost(report: DebugReport) -> tuple[float, int]:
    """(fraction of quantized activation elements held in 16 bits, number of 16-bit activation tensors)."""
    quant = [a for a in report.activations if a.quantized and a.quant_type]
    total = sum(a.elements for a in quant)
    wide = [a for a in quant if a.quant_type is not None and a.quant_type.endswith("16")]
    return (sum(a.elements for a in wide) / total if total else 0.0), len(wide)
