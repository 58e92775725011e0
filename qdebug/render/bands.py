"""The one definition of the SQNR bands every view uses: red below 20 dB, yellow from 20 to 40 dB, green above.

Text tables colour a value by :func:`band_of`; figures use :data:`SQNR_COLORSCALE` anchored at :data:`Z_MIN` /
:data:`Z_MAX` so the band edges sit at the same dB whatever the data's range (docs/ui.md).
"""

from __future__ import annotations

import math
from enum import StrEnum

__all__ = [
    "ANSI",
    "ANSI_RESET",
    "GREY",
    "HIGHLIGHT",
    "SQNR_COLORSCALE",
    "SQNR_HIGH",
    "SQNR_LOW",
    "Z_MAX",
    "Z_MIN",
    "Band",
    "band_of",
    "sqnr_color",
]

#: Below this an SQNR is bad (red).
SQNR_LOW = 20.0
#: Above this an SQNR is good (green); between the two it is marginal (yellow).
SQNR_HIGH = 40.0
#: The dB range the figures' colour scale spans (values outside saturate at its ends; +inf is drawn at the top).
Z_MIN = 0.0
Z_MAX = 60.0
GREY = "#b0b0b0"
HIGHLIGHT = "#1c7ed6"


class Band(StrEnum):
    """Where an SQNR value falls."""

    BAD = "bad"
    MARGINAL = "marginal"
    GOOD = "good"
    UNKNOWN = "unknown"  # undefined / non-finite: no number to judge


def band_of(v: float | None) -> Band:
    """The band of ``v`` dB (+inf is good; ``None``/NaN unknown)."""
    if v is None or math.isnan(v):
        return Band.UNKNOWN
    if v > SQNR_HIGH:
        return Band.GOOD
    return Band.MARGINAL if v >= SQNR_LOW else Band.BAD


#: ANSI colour of each band in terminal tables.
ANSI: dict[Band, str] = {
    Band.GOOD: "\033[32m",
    Band.MARGINAL: "\033[33m",
    Band.BAD: "\033[31m",
    Band.UNKNOWN: "\033[31m",
}
ANSI_RESET = "\033[0m"

# Each band is shaded from dark to light so that differences inside a band stay visible, and the band edges (hard
# steps) sit at SQNR_LOW and SQNR_HIGH given zmin=Z_MIN, zmax=Z_MAX.
_SHADES: tuple[tuple[float, float, str, str], ...] = (
    (Z_MIN, SQNR_LOW, "#a51111", "#f03e3e"),  # red
    (SQNR_LOW, SQNR_HIGH, "#f59f00", "#ffe066"),  # yellow
    (SQNR_HIGH, Z_MAX, "#8ce99a", "#2b8a3e"),  # green
)


def _frac(v: float) -> float:
    return (v - Z_MIN) / (Z_MAX - Z_MIN)


#: Plotly colour scale for ``zmin=Z_MIN, zmax=Z_MAX`` with hard steps at the band edges.
SQNR_COLORSCALE: list[list[float | str]] = [
    [_frac(x), c] for lo, hi, c0, c1 in _SHADES for x, c in ((lo, c0), (hi, c1))
]


def _hex(c: str) -> tuple[int, int, int]:
    return int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16)


def sqnr_color(v: float | None) -> str:
    """The colour of one SQNR value on the anchored scale (``None``/NaN → :data:`GREY`, ``+inf`` → top colour)."""
    if v is None or math.isnan(v):
        return GREY
    x = min(max(v, Z_MIN), Z_MAX)
    for lo, hi, c0, c1 in _SHADES:
        if x < hi or hi == Z_MAX:
            t = (x - lo) / (hi - lo)
            a, b = _hex(c0), _hex(c1)
            r, g, bl = (round(a[i] + (b[i] - a[i]) * t) for i in range(3))
            return f"#{r:02x}{g:02x}{bl:02x}"
    return GREY  # pragma: no cover - unreachable, the last band is closed
