"""Rank promotion candidates from a :class:`~qdebug.report.DebugReport` (pure and deterministic).

Noise model (see ``docs/mixed_precision.md``): at a quantized tensor with signal power S, the cumulative
noise N_cum is what it inherited plus its own rounding N_loc (independent, so powers add). In dB:
N_loc/N_cum = 10^((cum − local)/10) is the *own share* of the noise there. Promoting the tensor from
8 to 16 bits divides N_loc by 256² (step size /256), so the SQNR at the tensor rises by
``−10·log10(1 − share + share/65536)``. To estimate the effect at the model output we assume the
tensor's relative noise reaches the output unchanged (noise-to-signal preserved through the network):
its share of the output noise is 10^((out − local)/10).

That share alone saturates: a tensor whose local SQNR is below the output's gets share 1 and a predicted
"+48.2 dB" (8 bits × 6.02 dB) that no single promotion delivers, since every other tensor's and weight's rounding
still reaches the output. The estimate is calibrated (docs/mixed_precision.md, docs/diagnostics.md):

* the share is also bounded by the tensor's part of the *noise budget* — its relative local noise
  10^(−local/10) over the sum of every quantized activation's and 8-bit weight's (their noises add at the output
  under the same model) — so the shares of all tensors sum to at most 1 and the gain is ≤ −10·log10(1 − share);
* a tensor whose every consumer only moves or selects values (Reshape, Transpose, Relu, MaxPool, Concat, ...) onto
  an 8-bit grid as coarse as its own gets ~0: the consumer re-quantizes what the promotion removed;
* with a measured ceiling (``ceiling_db``: the all-16-bit-activation model's worst output), no promotion gains more
  than the headroom to it.

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
#: Ops whose output holds (a selection of) their input's values: quantized on a grid as coarse as the input's, they
#: round again what promoting the input removed.
REQUANTIZING_OPS = frozenset(
    {"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Relu", "MaxPool", "Concat", "Slice",
     "Gather", "Split", "Pad", "Resize", "DepthToSpace", "SpaceToDepth", "Expand", "Tile", "Clip"}
)  # fmt: skip


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


def gain_from_share(share: float) -> float:
    """The output gain in dB of taking a ``share`` of the output noise power from 8 to 16 bits."""
    share = min(max(share, 0.0), 1.0)
    return 0.0 - 10.0 * math.log10(1.0 - share + share / SIXTEEN_BIT_NOISE_FACTOR) + 0.0  # no "-0.00"


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def noise_budget(report: DebugReport) -> float:
    """The sum of the relative local noise powers 10^(−SQNR/10) of every quantized activation and every 8-bit weight:
    what, under the noise model, adds up to the output's noise. A tensor's share of it bounds its share of the
    output's noise (``0.0``: nothing measurable)."""
    total = 0.0
    for a in report.activations:
        if a.quantized and _finite(a.local_sqnr_db):
            total += 10.0 ** (-(a.local_sqnr_db or 0.0) / 10.0)
    for w in report.weights:
        if w.kind == "weight" and _finite(w.weight_sqnr_db) and not w.quant_type.endswith("16"):
            total += 10.0 ** (-(w.weight_sqnr_db or 0.0) / 10.0)
    return total


def requantizing_consumers(a: ActivationResult, consumers: list[ActivationResult]) -> bool:
    """Whether every consumer of ``a`` re-quantizes its values on an 8-bit grid at least as coarse as ``a``'s (a
    value-moving op, :data:`REQUANTIZING_OPS`): promoting ``a`` alone then gains ~nothing."""
    if not consumers or a.scale is None or a.scale <= 0:
        return False
    for c in consumers:
        coarse = c.scale is not None and c.scale >= 0.5 * a.scale
        eight = c.quantized and c.quant_type is not None and not c.quant_type.endswith("16")
        if not (c.producer_op in REQUANTIZING_OPS and eight and coarse):
            return False
    return True


def classify(
    a: ActivationResult,
    by_name: dict[str, ActivationResult],
    output_sqnr_db: float | None,
    *,
    min_drop_db: float = 1.0,
    min_share: float = 0.25,
    min_output_share: float = 0.10,
    budget: float = 0.0,
    consumers: list[ActivationResult] | None = None,
    ceiling_db: float | None = None,
) -> Suggestion | None:
    """The role and estimated gains of one activation (``None`` if it cannot be promoted). ``budget``
    (:func:`noise_budget`), ``consumers`` (the activations its output feeds) and ``ceiling_db`` (a measured
    all-16-bit worst output) calibrate the output gain (module docstring); without them it is the plain model's."""
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
    gain = gain_from_share(share)
    out_share, raw_share = 0.0, 0.0
    if _finite(output_sqnr_db):
        assert output_sqnr_db is not None
        raw_share = out_share = min(1.0, 10.0 ** ((output_sqnr_db - local) / 10.0))
    if budget > 0:
        out_share = min(out_share, 10.0 ** (-local / 10.0) / budget)
    requant = requantizing_consumers(a, consumers or [])
    out_gain = 0.0 if requant else gain_from_share(out_share)
    if ceiling_db is not None and _finite(output_sqnr_db):
        assert output_sqnr_db is not None
        out_gain = min(out_gain, max(0.0, ceiling_db - output_sqnr_db))
    caveat = " (its consumers re-quantize it on as coarse a grid: ~0 at the output alone)" if requant else ""
    if (dropped and share >= min_share) or raw_share >= min_output_share:
        role = Role.ORIGINATOR
        where = "first quantized tensor" if drop is None else f"cumulative {cum:.1f} dB, {drop:.1f} dB below its inputs"
        reason = (
            f"originator: local {local:.1f} dB, {where}; own rounding is {share:.0%} of the noise here and "
            f"~{out_share:.0%} of the output's (if this tensor were 16-bit: est. {out_gain:+.2f} dB at the output; "
            f"at most {gain:+.1f} dB at this tensor, an uncalibrated ceiling){caveat}"
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


def analyse(report: DebugReport, ceiling_db: float | None = None, **thresholds: float) -> tuple[Suggestion, ...]:
    """Every promotable activation with its role, ranked (originators first, then by estimated gain).
    ``ceiling_db``: the all-16-bit-activation model's measured worst output, when known (bounds every gain)."""
    by_name = {a.tensor_name: a for a in report.activations}
    out_db = report.min_output_sqnr_db
    budget = noise_budget(report)
    consumers: dict[str, list[ActivationResult]] = {}
    for c in report.activations:
        for i in dict.fromkeys(c.inputs):
            consumers.setdefault(i, []).append(c)
    items = [
        s
        for a in report.activations
        if (
            s := classify(
                a, by_name, out_db, budget=budget, consumers=consumers.get(a.tensor_name), ceiling_db=ceiling_db,
                **thresholds,
            )
        )
        is not None
    ]  # fmt: skip
    order = {Role.ORIGINATOR.value: 0, Role.AMPLIFIER.value: 1, Role.INHERITOR.value: 2, Role.CLEAN.value: 3}
    topo = {a.tensor_name: a.topo_index for a in report.activations}
    items.sort(key=lambda s: (order[s.role], -s.estimated_output_gain_db, -s.estimated_gain_db, topo[s.tensor_name]))
    return tuple(_with_rank(s, i + 1) for i, s in enumerate(items))


def _with_rank(s: Suggestion, rank: int) -> Suggestion:
    from dataclasses import replace

    return replace(s, rank=rank)


def suggest(
    report: DebugReport, top: int | None = 10, ceiling_db: float | None = None, **thresholds: float
) -> tuple[Suggestion, ...]:
    """The ranked promotion candidates: originators, best estimated output gain first (``ceiling_db``: see
    :func:`analyse`).

    Deterministic for a given report (ties broken by topological order).
    """
    ranked = [s for s in analyse(report, ceiling_db, **thresholds) if s.role == Role.ORIGINATOR.value]
    return tuple(ranked if top is None else ranked[:top])


def suggestions_dataframe(suggestions: tuple[Suggestion, ...]) -> pd.DataFrame:
    """A table of suggestions."""
    import pandas as pd

    return pd.DataFrame([asdict(s) for s in suggestions])
