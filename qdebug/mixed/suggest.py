"""Rank promotion candidates from a :class:`~qdebug.report.DebugReport` (pure and deterministic).

Noise model (see ``docs/mixed_precision.md``): at a quantized tensor with signal power S, the cumulative
noise N_cum is what it inherited plus its own rounding N_loc (independent, so powers add). In dB:
N_loc/N_cum = 10^((cum − local)/10) is the *own share* of the noise there. Promoting the tensor from
8 to 16 bits divides N_loc by 256² (step size /256), so the SQNR at the tensor rises by
``−10·log10(1 − share + share/65536)``. To estimate the effect at the model output we assume the
tensor's relative noise reaches the output unchanged (noise-to-signal preserved through the network):
its share of the output noise is 10^((out − local)/10), capped at 1.

Roles:

* **originator** — the tensor's own rounding matters: either the cumulative SQNR drops here
  (≥ ``min_drop_db`` below the worst input) with an own share ≥ ``min_share``, or its local noise alone is
  ≥ ``min_output_share`` of the output noise (deep nets lose their SQNR a little at many tensors);
* **amplifier** — the cumulative SQNR drops here but the own rounding is small: the op magnifies
  inherited noise (LayerNorm, Softmax, division …); promoting its *inputs* helps more;
* **inheritor** — no drop here and a high local SQNR (relative to the output's): the damage comes from
  upstream;
* **clean** — none of the above.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from qdebug.report import ActivationResult, DebugReport

if TYPE_CHECKING:
    import pandas as pd

SIXTEEN_BIT_NOISE_FACTOR = 65536.0  # (2**16 / 2**8)**2: noise power ratio of an 8-bit vs a 16-bit step


class Role(StrEnum):
    """Why a tensor is (or is not) a promotion candidate."""

    ORIGINATOR = "originator"
    AMPLIFIER = "amplifier"
    INHERITOR = "inheritor"
    CLEAN = "clean"


@dataclass(frozen=True)
class Suggestion:
    """One ranked candidate with the numbers behind it."""

    rank: int
    tensor_name: str
    producer_op: str
    role: Role
    local_sqnr_db: float | None
    cumulative_sqnr_db: float | None
    input_sqnr_db: float | None
    drop_db: float | None
    own_share: float | None
    estimated_gain_db: float
    estimated_output_gain_db: float
    reason: str
    quant_type: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (+inf as the string ``"inf"``)."""
        from qdebug.report import encode_number

        d = {k: encode_number(v) if isinstance(v, float) else v for k, v in asdict(self).items()}
        d["role"] = str(self.role)
        return d


def _gain(share: float) -> float:
    share = min(max(share, 0.0), 1.0)
    return -10.0 * math.log10(1.0 - share + share / SIXTEEN_BIT_NOISE_FACTOR)


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def classify(
    a: ActivationResult,
    by_name: dict[str, ActivationResult],
    output_sqnr_db: float | None,
    *,
    min_drop_db: float = 1.0,
    min_share: float = 0.25,
    min_output_share: float = 0.10,
) -> Suggestion | None:
    """The role and estimated gains of one activation (``None`` if it cannot be promoted)."""
    if not a.quantized or a.quant_type is None or a.quant_type.endswith("16"):
        return None
    local, cum = a.local_sqnr_db, a.cumulative_sqnr_db
    ins = [by_name[i].cumulative_sqnr_db for i in a.inputs if i in by_name]
    fin_ins = [v for v in ins if v is not None]
    input_db = min(fin_ins) if fin_ins else math.inf
    if not (_finite(local) and _finite(cum)):
        # +inf local (pure data movement) or undefined: nothing to gain by promoting this tensor.
        return None
    assert local is not None and cum is not None
    share = min(1.0, 10.0 ** ((cum - local) / 10.0))
    drop = input_db - cum if math.isfinite(input_db) else None
    dropped = drop is None or drop >= min_drop_db
    gain = _gain(share)
    out_share = 0.0
    if _finite(output_sqnr_db):
        assert output_sqnr_db is not None
        out_share = min(1.0, 10.0 ** ((output_sqnr_db - local) / 10.0))
    out_gain = _gain(out_share)
    if (dropped and share >= min_share) or out_share >= min_output_share:
        role = Role.ORIGINATOR
        where = "first quantized tensor" if drop is None else f"cumulative {cum:.1f} dB, {drop:.1f} dB below its inputs"
        reason = (
            f"originator: local {local:.1f} dB, {where}; own rounding is {share:.0%} of the noise here and "
            f"~{out_share:.0%} of the output's (16-bit: ~{gain:.1f} dB here, ~{out_gain:.2f} dB at the output)"
        )
    elif dropped:
        role = Role.AMPLIFIER
        reason = (
            f"amplifier: cumulative drops {drop:.1f} dB here but its own rounding is only {share:.0%} of the "
            f"noise (local {local:.1f} dB): {a.producer_op} magnifies inherited noise; promote its inputs"
        )
    elif cum < local - 6.0:
        role = Role.INHERITOR
        worst_in = min((i for i in a.inputs if i in by_name), key=lambda i: by_name[i].cumulative_sqnr_db or 0.0)
        reason = f"inheritor: local {local:.1f} dB is fine; cumulative {cum:.1f} dB is inherited from {worst_in!r}"
    else:
        role = Role.CLEAN
        reason = f"clean: local {local:.1f} dB, cumulative {cum:.1f} dB, no drop here"
    return Suggestion(
        rank=0,
        tensor_name=a.tensor_name,
        producer_op=a.producer_op,
        role=role,
        local_sqnr_db=local,
        cumulative_sqnr_db=cum,
        input_sqnr_db=input_db if math.isfinite(input_db) else None,
        drop_db=drop,
        own_share=share,
        estimated_gain_db=gain,
        estimated_output_gain_db=out_gain,
        reason=reason,
        quant_type=a.quant_type,
    )


def analyse(report: DebugReport, **thresholds: float) -> tuple[Suggestion, ...]:
    """Every promotable activation with its role, ranked (originators first, then by estimated gain)."""
    by_name = {a.tensor_name: a for a in report.activations}
    out_db = report.min_output_sqnr_db
    items = [s for a in report.activations if (s := classify(a, by_name, out_db, **thresholds)) is not None]
    order = {Role.ORIGINATOR.value: 0, Role.AMPLIFIER.value: 1, Role.INHERITOR.value: 2, Role.CLEAN.value: 3}
    topo = {a.tensor_name: a.topo_index for a in report.activations}
    items.sort(key=lambda s: (order[s.role], -s.estimated_output_gain_db, -s.estimated_gain_db, topo[s.tensor_name]))
    return tuple(_with_rank(s, i + 1) for i, s in enumerate(items))


def _with_rank(s: Suggestion, rank: int) -> Suggestion:
    from dataclasses import replace

    return replace(s, rank=rank)


def suggest(report: DebugReport, top: int | None = 10, **thresholds: float) -> tuple[Suggestion, ...]:
    """The ranked promotion candidates: originators, best estimated output gain first.

    Deterministic for a given report (ties broken by topological order).
    """
    ranked = [s for s in analyse(report, **thresholds) if s.role == Role.ORIGINATOR.value]
    return tuple(ranked if top is None else ranked[:top])


def suggestions_dataframe(suggestions: tuple[Suggestion, ...]) -> pd.DataFrame:
    """A table of suggestions."""
    import pandas as pd

    return pd.DataFrame([asdict(s) for s in suggestions])
