"""What the compiled kernels (C and numba: the same functions, arguments and slots) give, as
:class:`~qdebug.capture.kernels.base.Reducer` output: their rows turned into
:class:`~qdebug.capture.base.SampleSums`, with the reference redoing what a kernel cannot count (NaN/Inf) or does not
take (other float types, mixed types, empty tensors)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from qdebug.capture.base import SampleSums
from qdebug.capture.dequant import Dequantized
from qdebug.capture.kernels.base import Samples
from qdebug.capture.kernels.reference import ReductionPlan, bounds_or_inf, clip_to, local_pre, reduce_sample
from qdebug.metrics import BatchSums, reduce_pairs, value_ranges
from qdebug.pairing import ActivationPair

__all__ = ["KernelReducer", "rows_to_sums"]


def rows_to_sums(
    kernel: Any,
    plan: ReductionPlan,
    rows: np.ndarray,
    f: Mapping[str, np.ndarray],
    q: Mapping[str, np.ndarray],
    layout: tuple[np.ndarray, list[int]] | None = None,
) -> SampleSums:
    """One sample's sums from a compiled kernel's rows (one per activation, the kernel's slots), each comparison
    whose sums are not finite, and each range that is not, replaced by the reference's (which counts NaN/Inf
    exactly); outputs by the reference. The same policy as the ``compiled`` backend's
    (:mod:`qdebug.capture.compiled`), so the two give the same bits."""
    acts = plan.pairing.activations
    if layout is None:  # a run that reduces every sample alike passes its element counts and quantized indices once
        layout = (
            np.array([f[a.tensor_name].size for a in acts], dtype=np.int64),
            [j for j, a in enumerate(acts) if a.quantized],
        )
    sizes, quant = layout
    cum, loc = _batch(rows, sizes, kernel.CUM_SIGNAL), _batch(rows[quant], sizes[quant], kernel.LOC_SIGNAL)
    lo, hi = rows[:, kernel.REF_MIN].copy(), rows[:, kernel.REF_MAX].copy()
    redo: tuple[tuple[BatchSums, list[int], Callable[[ActivationPair], np.ndarray]], ...] = (
        (cum, list(range(len(acts))), lambda a: clip_to(f[a.tensor_name], a.measured_through)),
        (loc, quant, lambda a: local_pre(a, q)),
    )
    for sums, idx, ref_of in redo:
        for pos in np.flatnonzero(~np.isfinite(sums.signal + sums.noise)).tolist():
            a = acts[idx[pos]]
            one = reduce_pairs([ref_of(a)], [clip_to(q[a.post_qdq], a.measured_through)])
            for name in _FIELDS:
                getattr(sums, name)[pos] = getattr(one, name)[0]
    odd = np.flatnonzero(~(np.isfinite(lo) & np.isfinite(hi))).tolist()  # empty, all-NaN or ±Inf
    if odd:
        lo[odd], hi[odd] = value_ranges([f[acts[j].tensor_name] for j in odd])
    outs = plan.pairing.outputs
    return SampleSums(
        cumulative=cum,
        local=loc,
        outputs=reduce_pairs([f[o.output_name] for o in outs], [q[o.quant_name] for o in outs]),
        float_min=lo,
        float_max=hi,
        elements=sizes.copy(),
    )


_FIELDS = ("signal", "noise", "count", "max_abs", "nonfinite_reference", "nonfinite_test")


def _batch(rows: np.ndarray, sizes: np.ndarray, at: int) -> BatchSums:
    """Kernel rows (signal, noise, max at ``at``) as :class:`BatchSums` with no non-finite values counted yet."""
    signal, noise, max_abs = (rows[:, at + i].copy() for i in range(3))
    zeros = np.zeros(len(sizes), dtype=np.int64)
    return BatchSums(signal, noise, sizes.copy(), max_abs, zeros, zeros.copy())


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
