"""One family of formatters for numbers in every view: dB (degenerate statuses spelled out), percentages, sizes."""

from __future__ import annotations

import math

from qdebug.render.bands import ANSI, ANSI_RESET, band_of
from qdebug.task_score import TaskScore

__all__ = ["fmt_bytes", "fmt_db", "fmt_db_delta", "fmt_db_text", "fmt_pct", "fmt_task", "fmt_task_detail"]


def fmt_db(v: float | None, status: str = "ok", color: bool = False) -> str:
    """A dB value for a text table (7 wide), its band's colour on request; ``None`` shows the status instead."""
    if v is None:
        text = str(status)
    elif math.isinf(v):
        text = "inf"
    else:
        text = f"{v:7.2f}"
    return f"{ANSI[band_of(v)]}{text}{ANSI_RESET}" if color else text


def fmt_ratio(v: float | None) -> str:
    """A ratio with 3 significant digits (``-`` when unknown)."""
    return "-" if v is None else f"{v:.3g}"


def fmt_db_text(v: float | None, status: str | None = None, missing: str = "n/a") -> str:
    """A dB value in prose and hovers: ``"12.34 dB"``, ``"identical (inf)"``, or the status / ``missing``."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return str(status) if status else missing
    if math.isinf(v):
        return "identical (inf)" if v > 0 else "-inf"
    return f"{v:.2f} dB"


def fmt_db_delta(v: float | None, digits: int = 1, missing: str = "n/a") -> str:
    """A change in dB with its sign: ``"+1.4 dB"``, ``"-0.3 dB"``; a change that rounds to zero is ``"+0.0 dB"``
    (never ``"-0.0 dB"``, which reads as a loss), ``None`` or NaN is ``missing``."""
    if v is None or math.isnan(v):
        return missing
    if math.isinf(v):
        return "+inf dB" if v > 0 else "-inf dB"
    if round(v, digits) == 0:
        v = 0.0  # -0.04 rounds to -0.0, which prints with a minus sign
    return f"{v:+.{digits}f} dB"


def fmt_pct(v: float | None, digits: int = 2, missing: str = "-") -> str:
    """A fraction as a percentage (``None``: ``missing``)."""
    return missing if v is None else f"{v:.{digits}%}"


def fmt_bytes(n: int) -> str:
    """A size in KiB or MiB."""
    return f"{n / 1024:.0f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"


def fmt_task(score: TaskScore) -> str:
    """A task score in one line: ``"task metric top1: 0.9844 (higher is better; 64 samples)"``."""
    value = "undefined" if score.value is None else f"{score.value:.4f}"
    better = "higher" if score.higher_is_better else "lower"
    return f"task metric {score.metric}: {value} ({better} is better; {score.samples} samples)"


def fmt_task_detail(score: TaskScore) -> list[str]:
    """A task score's per-output figures, one line per output (``[]`` when it has none)."""
    lines = []
    for output, figures in score.per_output.items():
        parts = [f"{k.replace('_', ' ')} {v:.4g}" for k, v in figures.items()]
        lines.append(f"{output}: {', '.join(parts)}")
    return lines
