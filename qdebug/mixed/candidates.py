"""Promotion *candidates*: single tensors, or groups that only help when promoted together, and their
*measured* sensitivity next to the estimate.

Why groups: a decomposed LayerNorm (ReduceMean → Sub → Pow → ReduceMean → Add → Sqrt → Div, then the affine
Mul/Add) or an attention core (MatMul → [scale/mask] → Softmax → MatMul) computes one value through several
8-bit tensors; promoting one member re-quantizes its neighbours' inputs to 8 bits, so it alone cannot help
however large its estimate. Each group is one candidate.

Why measure: the estimate (:mod:`qdebug.mixed.suggest`) assumes a tensor's relative noise reaches the output
unchanged, which is wrong in both directions on real models. :func:`measure_sensitivity` promotes each of the top
candidates alone — one re-quantization from the cached calibration ranges and one debug pass each, nothing
re-calibrated — and gives predicted and measured gain side by side; rankings then use the measured gain.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import onnx

from qdebug.graph_index import GraphIndex
from qdebug.mixed.suggest import analyse, gain_from_share
from qdebug.report import DebugReport, encode_number

if TYPE_CHECKING:
    import pandas as pd

SCHEMA_VERSION = 1

#: Elementwise ops that sit between the score MatMul and the Softmax (scaling, masking).
_SCORE_OPS = frozenset({"Add", "Mul", "Div", "Sub", "Where"})
#: Ops between a Softmax and the MatMul that reads it (no arithmetic of their own).
_PASS_OPS = frozenset({"Reshape", "Cast", "Identity", "Dropout", "Transpose"})


class CandidateKind(StrEnum):
    """What a candidate is."""

    TENSOR = "tensor"
    LAYERNORM = "layernorm"
    ATTENTION = "attention"
    #: candidates next to each other in graph order, measured together (:func:`measure_demotions`)
    BLOCK = "block"


@dataclass(frozen=True)
class Candidate:
    """One promotion candidate: a tensor, or a group promoted together.

    ``estimated_output_gain_db`` follows the noise model of :mod:`qdebug.mixed.suggest`; for a group, the members'
    shares of the output noise are summed (capped at 1): the group is one source of rounding noise.
    """

    name: str
    kind: CandidateKind
    tensors: tuple[str, ...]
    estimated_output_gain_db: float
    topo_index: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        d = asdict(self)
        d["kind"] = str(self.kind)
        d["tensors"] = list(self.tensors)
        d["estimated_output_gain_db"] = encode_number(self.estimated_output_gain_db)
        return d


def _producer(ix: GraphIndex, t: str, op: str | frozenset[str]) -> onnx.NodeProto | None:
    n = ix.producer.get(t)
    ops = {op} if isinstance(op, str) else op
    return n if n is not None and n.op_type in ops else None


def _layernorm_groups(ix: GraphIndex) -> list[list[str]]:
    """Decomposed LayerNorms, found from each ``Div(x - mean, Sqrt(var + eps))``: their tensors in graph order."""
    groups = []
    for div in (n for n in ix.nodes if n.op_type == "Div" and len(n.input) == 2):
        sqrt = _producer(ix, div.input[1], "Sqrt")
        add = sqrt and _producer(ix, sqrt.input[0], "Add")
        var = add and next((p for i in add.input if (p := _producer(ix, i, "ReduceMean"))), None)
        pow_ = var and _producer(ix, var.input[0], "Pow")
        sub = pow_ and _producer(ix, pow_.input[0], "Sub")
        if sub is None or sub.output[0] != div.input[0]:
            continue
        assert sqrt is not None and add is not None and var is not None and pow_ is not None
        mean = _producer(ix, sub.input[1], "ReduceMean") if len(sub.input) > 1 else None
        nodes = [*([mean] if mean else []), sub, pow_, var, add, sqrt, div]
        tail = div
        for op in ("Mul", "Add"):  # the affine part (gamma, beta): one consumer reading a constant
            nxt = ix.sole_consumer(tail.output[0])
            if nxt is None or nxt.op_type != op or not any(i in ix.consts for i in nxt.input):
                break
            nodes.append(nxt)
            tail = nxt
        groups.append([n.output[0] for n in nodes])
    return groups


def _attention_groups(ix: GraphIndex) -> list[list[str]]:
    """Attention cores ``MatMul → [scale/mask ops] → Softmax → MatMul``: their tensors in graph order."""
    groups = []
    for sm in (n for n in ix.nodes if n.op_type == "Softmax"):
        back: list[onnx.NodeProto] = []
        t = sm.input[0]
        while (p := ix.producer.get(t)) is not None and p.op_type in _SCORE_OPS and len(back) < 4:
            back.append(p)
            # the score path is the input that is not a constant (the mask is usually an activation too: take input 0)
            t = next((i for i in p.input if i not in ix.consts), p.input[0])
        qk = ix.producer.get(t)
        if qk is None or qk.op_type != "MatMul":
            continue
        fwd: list[onnx.NodeProto] = []
        t = sm.output[0]
        av = None
        while (c := ix.sole_consumer(t)) is not None and len(fwd) < 3:
            if c.op_type == "MatMul":
                av = c
                break
            if c.op_type not in _PASS_OPS:
                break
            fwd.append(c)
            t = c.output[0]
        if av is None:
            continue
        nodes = [qk, *reversed(back), sm, *fwd, av]
        groups.append([n.output[0] for n in nodes])
    return groups


def _out_share(local: float | None, out_db: float | None) -> float:
    if local is None or out_db is None or not (math.isfinite(local) and math.isfinite(out_db)):
        return 0.0
    return float(min(1.0, 10.0 ** ((out_db - local) / 10.0)))


def candidates(model: onnx.ModelProto, report: DebugReport, *, groups: bool = True) -> tuple[Candidate, ...]:
    """Every promotion candidate of ``report`` (its quantized 8-bit activations), groups first merged, ranked by
    estimated output gain (ties: graph order). ``model`` is the float model (its graph gives the groups)."""
    by_name = {a.tensor_name: a for a in report.activations}
    promotable = {a.tensor_name for a in report.activations if a.quantized and not (a.quant_type or "").endswith("16")}
    est = {s.tensor_name: s.estimated_output_gain_db for s in analyse(report)}
    out_db = report.min_output_sqnr_db
    grouped: set[str] = set()
    cands: list[Candidate] = []
    if groups:
        ix = GraphIndex(model)
        found = [(CandidateKind.LAYERNORM, g) for g in _layernorm_groups(ix)]
        found += [(CandidateKind.ATTENTION, g) for g in _attention_groups(ix)]
        for kind, members in found:
            tensors = tuple(t for t in members if t in promotable and t not in grouped)
            if len(tensors) < 2:  # one member left: an ordinary tensor candidate
                continue
            grouped.update(tensors)
            share = sum(_out_share(by_name[t].local_sqnr_db, out_db) for t in tensors)
            topo = min(by_name[t].topo_index for t in tensors)
            cands.append(Candidate(f"{kind}@{tensors[-1]}", kind, tensors, gain_from_share(share), topo))
    for t in sorted(promotable - grouped, key=lambda t: by_name[t].topo_index):
        cands.append(Candidate(t, CandidateKind.TENSOR, (t,), est.get(t, 0.0), by_name[t].topo_index))
    cands.sort(key=lambda c: (-c.estimated_output_gain_db, c.topo_index))
    return tuple(cands)


class SweepMode(StrEnum):
    """How each candidate was measured alone: ``promote`` — promoted alone, everything else as in the base (its
    gain: over the base); ``demote`` — left in 8 bits alone, everything else in 16 bits (its gain: what demoting
    it costs the all-16-bit model). A demotion measures the candidate's own rounding noise, not masked by every
    other tensor's and not undone by an 8-bit neighbour re-quantizing what it computed."""

    PROMOTE = "promote"
    DEMOTE = "demote"


class Ranking(StrEnum):
    """How measured candidates are ranked: by measured gain, or by output noise power removed per 16-bit element
    (cost-effectiveness: a small tensor that carries the gain before a big one that carries a little more)."""

    GAIN = "gain"
    EFFICIENCY = "efficiency"


def noise_power(db: float | None) -> float | None:
    """Output noise power relative to the signal, from an SQNR in dB."""
    return None if db is None or not math.isfinite(db) else 10.0 ** (-db / 10.0)


@dataclass(frozen=True)
class Measured:
    """A candidate measured alone: predicted vs measured gain of the worst model output, and what it cost.

    ``cost_fraction_16bit``: share of activation elements in 16 bits when the candidate alone is promoted (promote
    sweep), or the candidate's own share (demote sweep; the measured model had everything else in 16 bits)."""

    candidate: Candidate
    output_sqnr_db: float | None
    measured_gain_db: float | None
    cost_fraction_16bit: float
    accuracy: float | None
    seconds: float
    error: str | None = None

    @property
    def predicted_gain_db(self) -> float:
        """The estimate the candidate was ranked by before it was measured."""
        return self.candidate.estimated_output_gain_db


@dataclass(frozen=True)
class Sensitivity:
    """The measured sensitivity of the top candidates, and the estimate's track record on them."""

    #: the reference every candidate was measured against: the base (promote sweep) or all-16-bit (demote sweep)
    base_output_sqnr_db: float | None
    measured: tuple[Measured, ...]
    unmeasured: tuple[Candidate, ...]
    evaluations: int
    seconds: float
    mode: SweepMode = SweepMode.PROMOTE

    def noise_moved(self, m: Measured) -> float:
        """Output noise power (relative to the signal) the candidate carries: what promoting it alone removed from
        the base, or what demoting it alone added to the all-16-bit model. 0 when unknown or negative."""
        ref = noise_power(self.base_output_sqnr_db)
        own = noise_power(m.output_sqnr_db)
        if ref is None or own is None:
            return 0.0
        return max(0.0, own - ref if self.mode == SweepMode.DEMOTE else ref - own)

    def efficiency(self, m: Measured) -> float:
        """:meth:`noise_moved` per share of activation elements the candidate puts in 16 bits."""
        return self.noise_moved(m) / max(m.cost_fraction_16bit, 1e-12)

    def ranking(self, by: Ranking | str = Ranking.GAIN) -> tuple[Candidate, ...]:
        """Measured candidates best first (by measured gain, or by :meth:`efficiency`; candidates that gained
        nothing after, by gain), then the unmeasured ones by estimate."""
        ok = [m for m in self.measured if m.measured_gain_db is not None]
        if Ranking(by) == Ranking.EFFICIENCY:
            ok.sort(key=lambda m: (-self.efficiency(m), -(m.measured_gain_db or 0.0), m.candidate.topo_index))
        else:
            ok.sort(key=lambda m: (-(m.measured_gain_db or 0.0), m.cost_fraction_16bit, m.candidate.topo_index))
        return (*(m.candidate for m in ok), *self.unmeasured)

    def estimate_error_db(self) -> float | None:
        """Median |predicted − measured| gain over the measured candidates (how far to trust the estimates)."""
        errs = sorted(
            abs(m.predicted_gain_db - m.measured_gain_db) for m in self.measured if m.measured_gain_db is not None
        )
        return None if not errs else errs[len(errs) // 2]

    def rank_agreement(self) -> float | None:
        """Spearman rank correlation of predicted vs measured gain over the measured candidates (1: same order)."""
        pairs = [(m.predicted_gain_db, m.measured_gain_db) for m in self.measured if m.measured_gain_db is not None]
        n = len(pairs)
        if n < 3:
            return None
        rp = _ranks([p for p, _ in pairs])
        rm = _ranks([m for _, m in pairs])
        d2 = sum((a - b) ** 2 for a, b in zip(rp, rm, strict=True))
        return 1.0 - 6.0 * d2 / (n * (n * n - 1))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``schema_version``."""

        def m(x: Measured) -> dict[str, Any]:
            d = {k: encode_number(v) if isinstance(v, float) else v for k, v in asdict(x).items() if k != "candidate"}
            return {"candidate": x.candidate.to_dict(), "predicted_gain_db": encode_number(x.predicted_gain_db), **d}

        return {
            "schema_version": SCHEMA_VERSION,
            "mode": str(self.mode),
            "base_output_sqnr_db": encode_number(self.base_output_sqnr_db),
            "measured": [m(x) for x in self.measured],
            "unmeasured": [c.to_dict() for c in self.unmeasured],
            "evaluations": self.evaluations,
            "seconds": self.seconds,
            "estimate_error_db": encode_number(self.estimate_error_db()),
            "rank_agreement": encode_number(self.rank_agreement()),
        }

    def to_dataframe(self) -> pd.DataFrame:
        """One row per measured candidate: predicted and measured gain side by side."""
        import pandas as pd

        return pd.DataFrame(
            [
                {
                    "candidate": x.candidate.name,
                    "kind": str(x.candidate.kind),
                    "tensors": len(x.candidate.tensors),
                    "predicted_gain_db": x.predicted_gain_db,
                    "measured_gain_db": x.measured_gain_db,
                    "output_sqnr_db": x.output_sqnr_db,
                    "cost_fraction_16bit": x.cost_fraction_16bit,
                    "efficiency": self.efficiency(x),
                }
                for x in self.measured
            ]
        )


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):  # average ranks for ties
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0
        i = j + 1
    return ranks


def measure_sensitivity(
    session: Any, cands: Sequence[Candidate], top: int, to: str = "uint16"
) -> tuple[Sensitivity, list[tuple[Measured, Any]]]:
    """Promote each of the ``top`` best-estimated candidates alone and measure it (calibration reused).

    ``session`` is a :class:`~qdebug.mixed.search_base.SearchSession` (typed ``Any``: the search module sits above this
    one).

    Returns the :class:`Sensitivity` and, for the search, each measurement with its evaluation. A candidate the
    fixer or the quantizer refuses is kept with its ``error`` (and no gain), never silently dropped."""
    from qdebug.errors import ConfigError
    from qdebug.mixed.evaluation import sixteen_bit_cost

    t0 = time.perf_counter()
    base = session.base
    base_db = base.output_sqnr_db
    start = session.requantizations
    out: list[tuple[Measured, Any]] = []
    for i, c in enumerate(cands[:top]):
        t1 = time.perf_counter()
        try:
            ev = session.evaluate(session.promote(c.tensors, to), name=f"single{i}")
        except ConfigError as exc:
            out.append((Measured(c, None, None, 0.0, None, round(time.perf_counter() - t1, 3), str(exc)), None))
            continue
        db = ev.output_sqnr_db
        gain = None if db is None or base_db is None else db - base_db
        frac, _ = sixteen_bit_cost(ev.report)
        out.append((Measured(c, db, gain, frac, ev.accuracy, ev.seconds), ev))
    sens = Sensitivity(
        base_output_sqnr_db=base_db,
        measured=tuple(m for m, _ in out),
        unmeasured=tuple(cands[top:]),
        evaluations=session.requantizations - start,
        seconds=round(time.perf_counter() - t0, 3),
    )
    return sens, out


def measure_demotions(
    session: Any, cands: Sequence[Candidate], budget: int, ceiling: Any, to: str = "uint16", *, resolve: float = 0.0
) -> tuple[Sensitivity, list[tuple[Measured, Any]]]:
    """Find where the all-16-bit model's lost accuracy sits by *demoting*: a block of candidates (contiguous in
    graph order) is left in the base activation type, everything else in ``to`` (the ``ceiling`` evaluation's
    recipe), and measured (calibration reused). Blocks are split in halves, the noisiest first, each half measured,
    until single candidates, at most ``budget`` evaluations, or every block left adds at most ``resolve`` (output
    noise power relative to the signal) — a block that adds nothing worth finding stays whole. The leaves are the
    :class:`Sensitivity` (:attr:`SweepMode.DEMOTE`); a leaf's gain is what its demotion costs the ceiling, its cost
    what promoting it alone would put in 16 bits (ORT's fixer's region included).

    With the noise in k of N candidates that is ~2·k·log2(N/k) evaluations instead of N."""
    import heapq

    from qdebug.errors import ConfigError
    from qdebug.mixed.promote import promote

    t0 = time.perf_counter()
    ref_db = ceiling.output_sqnr_db
    ref = noise_power(ref_db)
    base = session.base
    low = base.config.activation_type
    by_name = {a.tensor_name: a for a in base.report.activations}
    total = sum(a.elements for a in by_name.values() if a.quantized and a.quant_type) or 1
    start = session.requantizations

    def measure(block: tuple[Candidate, ...]) -> tuple[Measured, Any]:
        c = _merged(block)
        share = sum(by_name[t].elements for t in c.tensors if t in by_name) / total
        t1 = time.perf_counter()
        try:
            ev = session.evaluate(promote(session.float_proto, c.tensors, low, config=ceiling.config), name="demote")
        except ConfigError as exc:
            return Measured(c, None, None, share, None, round(time.perf_counter() - t1, 3), str(exc)), None
        db = ev.output_sqnr_db
        gain = None if db is None or ref_db is None else ref_db - db
        return Measured(c, db, gain, share, ev.accuracy, ev.seconds), ev

    def noise(m: Measured) -> float:
        own = noise_power(m.output_sqnr_db)
        return math.inf if own is None or ref is None or m.error else max(0.0, own - ref)

    order = tuple(sorted(cands, key=lambda c: c.topo_index))
    root = Measured(_merged(order), base.output_sqnr_db, None, 1.0, base.accuracy, 0.0)
    root = replace(
        root, measured_gain_db=None if ref_db is None or root.output_sqnr_db is None else ref_db - root.output_sqnr_db
    )
    heap: list[tuple[float, int, tuple[Candidate, ...], tuple[Measured, Any]]] = [
        (-noise(root), 0, order, (root, base))
    ]
    leaves: list[tuple[Measured, Any]] = []
    tie = 1
    while heap:
        neg, _, block, m = heapq.heappop(heap)
        used = session.requantizations - start
        if len(block) == 1 or -neg <= resolve or used + 2 > budget:
            leaves.append(m)
            continue
        half = len(block) // 2
        for part in (block[:half], block[half:]):
            pm = measure(part)
            heapq.heappush(heap, (-noise(pm[0]), tie, part, pm))
            tie += 1
    leaves = [(_region_cost(session, m, by_name, total, to) if 0 < noise(m) < math.inf else m, ev) for m, ev in leaves]
    sens = Sensitivity(
        base_output_sqnr_db=ref_db,
        measured=tuple(m for m, _ in leaves),
        unmeasured=(),
        evaluations=session.requantizations - start,
        seconds=round(time.perf_counter() - t0, 3),
        mode=SweepMode.DEMOTE,
    )
    return sens, leaves


def _region_cost(session: Any, m: Measured, by_name: dict[str, Any], total: int, to: str) -> Measured:
    """``m`` with its cost set to what promoting it alone puts in 16 bits, the region ORT's fixer adds included (no
    evaluation: the fixer only). On MiniLM a LayerNorm output's region also takes the Q/K/V MatMul outputs it feeds:
    5× its own elements; ranking by the bare tensor would under-price it."""
    from qdebug.errors import ConfigError

    try:
        promoted = session.promote(m.candidate.tensors, to).promoted
    except ConfigError:
        return m
    share = sum(by_name[t].elements for t in {*promoted, *m.candidate.tensors} if t in by_name) / total
    return replace(m, cost_fraction_16bit=max(share, m.cost_fraction_16bit))


def _merged(block: Sequence[Candidate]) -> Candidate:
    """One candidate for a block of candidates (itself when there is one)."""
    if len(block) == 1:
        return block[0]
    tensors = tuple(dict.fromkeys(t for c in block for t in c.tensors))
    est = gain_from_share(sum(1.0 - 10.0 ** (-c.estimated_output_gain_db / 10.0) for c in block))
    return Candidate(f"block {block[0].name} … {block[-1].name} ({len(block)})", CandidateKind.BLOCK, tensors, est,
                     min(c.topo_index for c in block))  # fmt: skip


def with_measured_estimates(cands: Sequence[Candidate], sens: Sensitivity) -> tuple[Candidate, ...]:
    """``cands`` with each measured candidate's estimate replaced by its measured gain (for display and ranking)."""
    measured = {m.candidate.name: m.measured_gain_db for m in sens.measured if m.measured_gain_db is not None}
    return tuple(replace(c, estimated_output_gain_db=measured.get(c.name, c.estimated_output_gain_db)) for c in cands)


__all__ = [
    "Candidate",
    "CandidateKind",
    "Measured",
    "Ranking",
    "Sensitivity",
    "SweepMode",
    "candidates",
    "measure_demotions",
    "measure_sensitivity",
    "noise_power",
    "with_measured_estimates",
]
