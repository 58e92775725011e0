"""Where a compiled model's numbers start to diverge from the CPU-QDQ model's, at any bit width.

An absolute rule ("more than 1 LSB from ORT CPU") is blind at 16 bits: the grid is so fine that every tensor
differs by a few LSB, so the first tensor is always named. The unit here is each tensor's own quantization
error instead. For a tensor with dequantized values ``f`` (float model), ``c`` (CPU-QDQ) and ``t`` (target)::

    ratio = (Σ(t − f)² − Σ(c − f)²) / max(Σ(c − f)², Σ scale²/12)

is how much error vs float the target adds, in units of the error quantization already has there (cumulative,
as in the debug report's cumulative SQNR). It is measured against float, not as ``Σ(t − c)²``: where the target is
*closer* to float than ORT CPU (the HTP's 8-bit Sigmoid on a detector), ``t − c`` is as large as the quantization
error and would look like a divergence; here it is negative. The floor ``scale²/12`` per element (the rounding noise
of the tensor's own grid) keeps a tensor that the CPU-QDQ model happens to reproduce exactly from turning a 1-LSB
difference into an infinite ratio. A tensor is *flagged* when ``ratio > threshold`` (:data:`EXCESS_NOISE_THRESHOLD`,
1.0: the target adds more error than quantization itself); the target's SQNR vs float there is the CPU-QDQ's minus
``10·log10(1 + ratio)`` dB (exactly, without the floor), so ``ratio > 1`` ⇔ at least 3 dB lost on the target.

Errors propagate, so once a tensor diverges its consumers usually do too. A *start* is a flagged tensor none of
whose nearest compared ancestors is flagged; the number of starts says whether there is one region or several.
A start whose compared consumers are all unflagged is *isolated* (its error goes nowhere; on the detector it was
a probe artefact); the first start in topological order that is not isolated is where the divergence begins.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import onnx

__all__ = [
    "EXCESS_NOISE_THRESHOLD",
    "Divergence",
    "Upstream",
    "excess_ratio",
    "locate",
    "sqnr_drop_db",
    "upstream_compared",
]

#: Flag a tensor when the target's extra error energy exceeds this many times the tensor's own quantization
#: error energy (≈ 3 dB lost vs float, for independent errors).
EXCESS_NOISE_THRESHOLD = 1.0


def excess_ratio(target_noise: float, cpu_noise: float | None, floor: float) -> float:
    """``(target_noise − cpu_noise) / max(cpu_noise, floor)``, both error energies vs float; ``cpu_noise``
    ``None`` (unknown) counts as 0 with the floor as the unit. Negative when the target is closer to float."""
    cpu = cpu_noise or 0.0
    unit = max(cpu, floor)
    extra = target_noise - cpu
    if unit <= 0.0:
        return math.inf if extra > 0.0 else 0.0
    return extra / unit


def sqnr_drop_db(ratio: float) -> float:
    """The SQNR vs float lost on the target when its extra error is ``ratio`` times the quantization error:
    ``10·log10(1 + ratio)`` (negative: gained)."""
    if math.isinf(ratio):
        return math.inf
    return -math.inf if ratio <= -1.0 else 10.0 * math.log10(1.0 + ratio)


@dataclass(frozen=True)
class Upstream:
    """How one compared tensor is computed from the nearest compared tensors before it."""

    sources: frozenset[str]  # the nearest compared tensors it is computed from
    nodes: tuple[tuple[str, str], ...]  # (op type, node name) of the nodes in between, graph order


def upstream_compared(model: onnx.ModelProto, names: Sequence[str]) -> dict[str, Upstream]:
    """For each tensor in ``names``, the nearest tensors of ``names`` it is computed from, and the nodes between.

    Walks producers upward through tensors that were not compared (unquantized ones, those a probe had to leave
    out, a Relu's input the quantizer fused away), so a gap in the comparison does not cut a divergent region in
    two, and the nodes walked are the ops that may have computed the divergence.
    """
    # By graph position, not the proto object: protobuf hands out a new Python wrapper on every access.
    nodes_of = list(model.graph.node)
    producer = {o: k for k, n in enumerate(nodes_of) for o in n.output}
    wanted = set(names)

    def walk(tensor: str) -> Upstream:
        # Iterative, not recursive: an uncompared stretch of a real model can be hundreds of nodes deep.
        found: set[str] = set()
        walked: set[int] = set()
        stack, seen = [tensor], {tensor}
        while stack:
            k = producer.get(stack.pop())
            if k is None:
                continue
            walked.add(k)
            for i in nodes_of[k].input:
                if not i or i in seen:
                    continue
                seen.add(i)
                if i in wanted:
                    found.add(i)
                else:
                    stack.append(i)
        return Upstream(frozenset(found), tuple((nodes_of[k].op_type, nodes_of[k].name) for k in sorted(walked)))

    return {n: walk(n) for n in names}


@dataclass(frozen=True)
class Divergence:
    """The flagged tensors' starts (topological order), which of them are isolated, the op types computing the
    flagged tensors, and the nodes computing the first start from its compared inputs."""

    starts: tuple[str, ...]
    op_types: tuple[tuple[str, int], ...]  # (op type, nodes of it computing flagged tensors), most first
    first_nodes: tuple[tuple[str, str], ...] = ()  # (op type, node name), graph order
    isolated: tuple[str, ...] = ()  # starts none of whose compared consumers is flagged

    @property
    def first(self) -> str | None:
        """Where the divergence begins: the first start that propagates (else the first start), ``None`` when
        nothing is flagged."""
        spreading = [s for s in self.starts if s not in self.isolated] or list(self.starts)
        return spreading[0] if spreading else None


def locate(
    order: Sequence[str],
    flagged: Sequence[str],
    upstream: Mapping[str, Upstream],
    top: int = 5,
) -> Divergence:
    """The starts among ``flagged`` (in the topological ``order``) and the ``top`` op types computing the flagged
    tensors (every node between a flagged tensor and its compared inputs counts, so a BatchNormalization whose
    output the comparison could not see still shows).

    A start is *isolated* when it has compared consumers and none of them is flagged: its error does not reach
    the rest of the model. On the detector at uint16 the one such start was an artefact of the probe (its value
    as an extra graph output was off; compiled alone, cut at that tensor, it was within its quantization error),
    so the first start that propagates is named first.
    """
    bad = set(flagged)
    none = Upstream(frozenset(), ())
    starts = tuple(n for n in order if n in bad and not (upstream.get(n, none).sources & bad))
    consumers: dict[str, set[str]] = {}
    for n in order:
        for src in upstream.get(n, none).sources:
            consumers.setdefault(src, set()).add(n)
    isolated = tuple(s for s in starts if consumers.get(s) and not (consumers[s] & bad))
    ops = Counter(op for n in order if n in bad for op, _ in upstream.get(n, none).nodes)
    result = Divergence(starts, tuple(ops.most_common(top)), (), isolated)
    first = result.first
    return replace(result, first_nodes=upstream.get(first, none).nodes if first is not None else ())
