"""``qdebug fix``: measured remedies — the 8-bit recipe, the field's PTQ libraries, a bounded 16-bit share — that
make a quantized model good again, checked on held-out samples (:func:`fix`)."""

from qdebug.fix.engine import fix
from qdebug.fix.result import FixResult, Stage, Step, Trial
from qdebug.fix.state import FixOptions

__all__ = ["FixOptions", "FixResult", "Stage", "Step", "Trial", "fix"]
