"""What the compiled kernels (C and numba: the same functions, arguments and slots) give, as
:class:`~qdebug.capture.kernels.base.Reducer` output: their rows turned into
:class:`~qdebug.capture.base.SampleSums`, with the reference redoing what a kernel cannot count (NaN/Inf) or does not
take (other float types, mixed types, empty tensors)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from qdebug.capture.base import SampleSums
from qdebug.capture.dequant import Dequantized
from qdebug.capture.kernels.base import Samples
from qdebug.capture.kernels.reference import ReductionPlan, bounds_or_inf, clip_to, local_pre, reduce_sample
from qdebug.metrics import BatchSums, reduce_pairs, value_ranges
from qdebug.pairing import ActivationPair

__all__ = ["KernelReducer", "rows_to_sums"]


def _slots(kernel: Any) -> tuple[int, int, int, int]:
    return kernel.CUM_SIGNAL, kernel.LOC_SIGNAL, kernel.REF_MIN, kernel.SLOTS


def rows_to_sums(
    kernel: Any, plan: ReductionPlan, rows: np.ndarray, f: Mapping[str, np.ndarray], q: Mapping[str, np.ndarray]
) -> SampleSums:
    """One sample's sums from a compiled kernel's rows (one per activation, the kernel's slots); an activation
    whose sums or range are not finite is the reference's, which counts NaN/Inf exactly; outputs by the
    reference."""
    cum_at, loc_at, min_at, _ = _slots(kernel)
    acts = plan.pairing.activations
    sizes = np.array([f[a.tensor_name].size for a in acts], dtype=np.int64)
    quant = [j for j, a in enumerate(acts) if a.quantized]
    cum, loc = _batch(rows[:, cum_at : cum_at + 3], sizes), _batch(rows[quant, loc_at : loc_at + 3], sizes[quant])
    lo, hi = rows[:, min_at].copy(), rows[:, min_at + 1].copy()
    ordinal = {j: k for k, j in enumerate(quant)}
    for j, a in enumerate(acts):
        checked = [rows[j, cum_at : cum_at + 2], rows[j, min_at : min_at + 2]]
        checked += [rows[j, loc_at : loc_at + 2]] if a.quantized else []
        if all(np.isfinite(c).all() for c in checked):
            continue
        post = clip_to(q[a.post_qdq], a.measured_through)
        _put(cum, j, reduce_pairs([clip_to(f[a.tensor_name], a.measured_through)], [post]))
        if a.quantized:
            _put(loc, ordinal[j], reduce_pairs([local_pre(a, q)], [post]))
        lo[j], hi[j] = _finite_range(f[a.tensor_name])
    outs = plan.pairing.outputs
    return SampleSums(
        cumulative=cum,
        local=loc,
        outputs=reduce_pairs([f[o.output_name] for o in outs], [q[o.quant_name] for o in outs]),
        float_min=lo,
        float_max=hi,
        elements=sizes,
    )


def _batch(sums: np.ndarray, sizes: np.ndarray) -> BatchSums:
    zeros = np.zeros(len(sizes), dtype=np.int64)
    return BatchSums(sums[:, 0].copy(), sums[:, 1].copy(), sizes.copy(), sums[:, 2].copy(), zeros, zeros.copy())


def _put(into: BatchSums, k: int, one: BatchSums) -> None:
    for name in ("signal", "noise", "count", "max_abs", "nonfinite_reference", "nonfinite_test"):
        getattr(into, name)[k] = getattr(one, name)[0]


def _finite_range(x: np.ndarray) -> tuple[float, float]:
    lo, hi = value_ranges([x])
    return float(lo[0]), float(hi[0])


class KernelReducer:
    """A compiled kernel (C or numba: the same functions and slots) called once per activation and sample —
    ``dequant_sums`` on a post-Q/DQ tensor given as integers, else ``activation_sums`` — with what it does not take
    (other float types, mixed types, empty tensors) and what it cannot count (NaN/Inf) reduced by the reference."""

    _FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

    def __init__(self, name: str, kernel: Any) -> None:
        self.name, self.kernel = name, kernel

    def reduce(self, plan: ReductionPlan, samples: Samples) -> list[SampleSums]:
        """See :class:`Reducer`."""
        return [self._one(plan, f, q) for f, q in samples]

    def _one(self, plan: ReductionPlan, f: Mapping[str, np.ndarray], q: Mapping[str, np.ndarray]) -> SampleSums:
        k = self.kernel
        acts = plan.pairing.activations
        if not all(self._takes(a, f, q) for a in acts):
            return reduce_sample(plan, f, q)
        rows = np.zeros((len(acts), k.SLOTS))
        for j, a in enumerate(acts):
            ref = f[a.tensor_name].reshape(-1)
            (mlo, mhi), (plo, phi) = bounds_or_inf(a.measured_through), bounds_or_inf(a.fused_activation)
            found = q.ints(a.post_qdq) if a.quantized and isinstance(q, Dequantized) else None
            if found is not None:
                ints, spec = found
                pre = q[a.pre_qdq].reshape(-1)
                k.dequant_sums(ref, pre, ints.reshape(-1), spec.scale, spec.zero_point, mlo, mhi, plo, phi, rows[j])
            else:
                post = q[a.post_qdq].reshape(-1)
                pre = q[a.pre_qdq].reshape(-1) if a.quantized else post
                k.activation_sums(ref, pre, post, mlo, mhi, plo, phi, a.quantized, rows[j])
        return rows_to_sums(k, plan, rows, f, q)

    def _takes(self, a: ActivationPair, f: Mapping[str, np.ndarray], q: Mapping[str, np.ndarray]) -> bool:
        """Whether the kernel takes activation ``a``'s tensors: non-empty, of one float type (or integers for the
        post-Q/DQ tensor) and one size."""
        ref = f[a.tensor_name]
        if ref.dtype not in self._FLOATS or ref.size == 0:
            return False
        found = q.ints(a.post_qdq) if a.quantized and isinstance(q, Dequantized) else None
        post = found[0] if found is not None else q[a.post_qdq]
        pre = q[a.pre_qdq] if a.quantized else ref
        if pre.dtype != ref.dtype or not ref.size == pre.size == post.size:
            return False
        return found is not None or post.dtype == ref.dtype
