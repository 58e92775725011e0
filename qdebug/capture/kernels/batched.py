"""A whole batch reduced at once: every sample's :class:`~qdebug.capture.base.SampleSums` from one batched inference
call's tensors, without cutting them into per-sample arrays first.

:func:`~qdebug.capture.kernels.reference.reduce_sample` costs a few numpy calls per tensor per sample; on a model of
many small tensors those calls are the whole cost of a sample, and batching the inference alone does not remove
them. Here each activation of a batch of ``n`` samples is one ``(outer, n, inner)`` view
(:func:`~qdebug.capture.batching.batch_views`) reduced by the same few numpy calls for all ``n`` samples at once,
summing over the outer and inner axes: the per-call cost is paid once per batch.

Same definition as the reference (docs/metrics.md: the clips of ``measured_through`` and ``fused_activation``, the
float tensor's raw range), summed in float64: equal to the reference's float32-product sums to ~1e-7 relative
(tested). Large per-sample tensors, where the per-call cost does not matter, go through the reference per sample,
or through the compiled kernel when the run reduces with it (:mod:`qdebug.capture.compiled`); empty tensors,
non-float ones and any sample whose sums come out non-finite are redone by the reference, which counts NaN/Inf.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from qdebug.capture.base import SampleSums
from qdebug.capture.batching import sample_view
from qdebug.capture.dequant import Dequantized, DequantSpec
from qdebug.capture.kernels import c_kernel
from qdebug.capture.kernels.base import KernelUnavailableError, Samples, register_reducer
from qdebug.capture.kernels.reference import ReductionPlan, bounds_or_inf, check_shapes, clip_to, local_pre
from qdebug.metrics import SMALL_TENSOR, BatchSums, reduce_pairs, value_ranges
from qdebug.pairing import ActivationPair

__all__ = ["BatchTensors", "BatchedReducer", "reduce_batch"]

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
#: Default elements of one tensor reduced per numpy call (:func:`reduce_batch`'s ``chunk_elements``): a chunk of
#: samples' clipped copies and difference stay ~1 MB each.
CHUNK_ELEMENTS = 1 << 18
_FIELDS = ("signal", "noise", "count", "max_abs", "nonfinite_reference", "nonfinite_test")


class BatchTensors:
    """One model's tensors of a batch of ``n`` samples: a :func:`~qdebug.capture.batching.batch_views` view per
    name, and each tensor's shape for one sample."""

    def __init__(self, views: Mapping[str, np.ndarray], alone: Mapping[str, tuple[int, ...]], n: int) -> None:
        self.views, self.alone, self.n = views, alone, n

    def sample(self, name: str, i: int) -> np.ndarray:
        """Sample ``i``'s value of ``name``, in its one-sample shape."""
        return sample_view(self.views[name], i, self.alone[name])

    def samples(self, i: int) -> dict[str, np.ndarray]:
        """Sample ``i``'s values of every tensor, by name."""
        return {k: self.sample(k, i) for k in self.views}

    def first(self, names: Sequence[str]) -> Mapping[str, np.ndarray]:
        """Sample 0's values of ``names`` for a shape check: post-Q/DQ tensors computed from integers
        (:class:`~qdebug.capture.dequant.Dequantized` views) are not computed for it."""
        if isinstance(self.views, Dequantized):
            return Dequantized({k: self.sample(k, 0) for k in self.views.fetched}, self.views.specs)
        return {k: self.sample(k, 0) for k in names}

    def ints(self, name: str) -> tuple[np.ndarray, DequantSpec] | None:
        """The batch view of the integers a post-Q/DQ tensor is computed from, and how (``None``: it was fetched)."""
        return self.views.ints(name) if isinstance(self.views, Dequantized) else None


class _Rows:
    """Per-sample sums of ``width`` pairs, as ``(n, width)`` arrays."""

    def __init__(self, n: int, width: int) -> None:
        self.signal, self.noise, self.max_abs = np.zeros((n, width)), np.zeros((n, width)), np.zeros((n, width))
        self.count = np.zeros((n, width), dtype=np.int64)
        self.nonfinite_reference = np.zeros((n, width), dtype=np.int64)
        self.nonfinite_test = np.zeros((n, width), dtype=np.int64)

    def put(self, i: int, j: int, one: BatchSums) -> None:
        """Sample ``i``'s sums of pair ``j`` from a one-pair :class:`BatchSums`."""
        for name in _FIELDS:
            getattr(self, name)[i, j] = getattr(one, name)[0]

    def row(self, i: int) -> BatchSums:
        """Sample ``i``'s sums of every pair."""
        return BatchSums(*(getattr(self, name)[i].copy() for name in _FIELDS))


def _clipped(x: np.ndarray, *bounds: tuple[str, float, float] | None) -> np.ndarray:
    """``x`` clipped to each of ``bounds`` in turn (``x`` itself when there are none)."""
    out = x
    for b in bounds:
        if b is not None:
            out = np.clip(out, b[1], b[2], out=None if out is x else out)
    return out


def _vector_sums(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per sample (axis 1 of two ``(outer, n, inner)`` arrays of one float dtype): Σa², Σ(a−b)², max|a−b|.

    In the tensors' own dtype, as the reference's float32 block dot products are: a sample's small tensor (at most
    :data:`~qdebug.metrics.SMALL_TENSOR` elements, the reference's block size is 8k) is one such sum; the result
    is float64."""
    with np.errstate(invalid="ignore", over="ignore"):
        d = a - b
        signal = np.einsum("oni,oni->n", a, a).astype(np.float64)
        noise = np.einsum("oni,oni->n", d, d).astype(np.float64)
        max_abs = np.maximum(d.max(axis=(0, 2)), -d.min(axis=(0, 2))).astype(np.float64)
    return signal, noise, max_abs


def _vectorised(
    a: ActivationPair, f: BatchTensors, q: BatchTensors, j: int, jl: int | None, out: _Out, chunk_elements: int
) -> None:
    """Activation ``j`` (local ordinal ``jl``) for every sample by a few numpy calls on the batch's views, over
    chunks of samples of at most ``chunk_elements`` elements (the temporary copies stay small); samples whose
    sums or range come out non-finite are redone by the reference."""
    ref = f.views[a.tensor_name]
    per = max(1, chunk_elements // max(1, ref.shape[0] * ref.shape[2]))
    for start in range(0, f.n, per):
        _chunk(a, f, q, j, jl, out, slice(start, min(f.n, start + per)))


def _chunk(a: ActivationPair, f: BatchTensors, q: BatchTensors, j: int, jl: int | None, out: _Out, at: slice) -> None:
    """:func:`_vectorised` for the samples ``at``."""
    ref, post = f.views[a.tensor_name][:, at], q.views[a.post_qdq][:, at]
    m = a.measured_through
    post_c = _clipped(post, m)
    todo = [(out.cum, j, _clipped(ref, m), _cum_ref)]
    if jl is not None:
        todo.append((out.loc, jl, _clipped(q.views[a.pre_qdq][:, at], a.fused_activation, m), _loc_ref))
    for rows, col, x, redo in todo:
        _put(a, f, q, (rows, col, at, redo), _vector_sums(x, post_c), x.shape[0] * x.shape[2])
    with np.errstate(invalid="ignore"):
        _put_range(a, f, out, j, at, ref.min(axis=(0, 2)), ref.max(axis=(0, 2)))


_Target = tuple[_Rows, int, slice, Callable[[ActivationPair, BatchTensors, BatchTensors, int], BatchSums]]


def _put(
    a: ActivationPair, f: BatchTensors, q: BatchTensors, target: _Target, sums: tuple[np.ndarray, ...], size: int
) -> None:
    """Samples ``at``'s (signal, noise, max) of one pair into ``rows[:, col]``; a sample whose sums are not finite
    is redone by ``redo`` (the reference, which counts NaN/Inf)."""
    rows, col, at, redo = target
    signal, noise, max_abs = sums
    rows.signal[at, col], rows.noise[at, col], rows.max_abs[at, col] = signal, noise, max_abs
    rows.count[at, col] = size
    for i in (at.start + np.flatnonzero(~np.isfinite(signal + noise))).tolist():
        rows.put(i, col, redo(a, f, q, i))


def _put_range(
    a: ActivationPair, f: BatchTensors, out: _Out, j: int, at: slice, lo: np.ndarray, hi: np.ndarray
) -> None:
    """Samples ``at``'s float range of activation ``j``; one that is not finite (NaN/Inf, empty) is the reference's."""
    out.lo[at, j], out.hi[at, j] = lo, hi
    bad = ~(np.isfinite(out.lo[at, j]) & np.isfinite(out.hi[at, j]))
    for i in (at.start + np.flatnonzero(bad)).tolist():
        v_lo, v_hi = value_ranges([f.sample(a.tensor_name, i)])
        out.lo[i, j], out.hi[i, j] = v_lo[0], v_hi[0]


def _cum_ref(a: ActivationPair, f: BatchTensors, q: BatchTensors, i: int) -> BatchSums:
    """The reference's cumulative sums of activation ``a`` for sample ``i``."""
    post = clip_to(q.sample(a.post_qdq, i), a.measured_through)
    return reduce_pairs([clip_to(f.sample(a.tensor_name, i), a.measured_through)], [post])


def _loc_ref(a: ActivationPair, f: BatchTensors, q: BatchTensors, i: int) -> BatchSums:
    """The reference's local sums of activation ``a`` for sample ``i``."""
    pre = local_pre(a, {a.pre_qdq: q.sample(a.pre_qdq, i)})
    return reduce_pairs([pre], [clip_to(q.sample(a.post_qdq, i), a.measured_through)])


class _Out:
    """The batch's per-sample rows: cumulative, local, outputs, and the float tensors' ranges."""

    def __init__(self, plan: ReductionPlan, n: int) -> None:
        acts = plan.pairing.activations
        self.cum = _Rows(n, len(acts))
        self.loc = _Rows(n, sum(1 for a in acts if a.quantized))
        self.lo, self.hi = np.full((n, len(acts)), np.nan), np.full((n, len(acts)), np.nan)


def _per_sample(
    a: ActivationPair, f: BatchTensors, q: BatchTensors, j: int, jl: int | None, out: _Out, kernel: Any
) -> None:
    """Activation ``j`` sample by sample: by the compiled ``kernel`` (float tensors) or the reference. A tensor the
    batch does not change (computed from constants: every sample's view is the same memory) is reduced once."""
    views = [f.views[a.tensor_name], q.views[a.post_qdq]] + ([q.views[a.pre_qdq]] if a.quantized else [])
    shared = all(v.strides[1] == 0 for v in views)
    for i in range(1 if shared else f.n):
        _one_sample(a, f, q, i, j, jl, out, kernel)
    if shared:
        for rows, col in ((out.cum, j), (out.loc, jl)):
            if col is not None:
                for name in _FIELDS:
                    getattr(rows, name)[1:, col] = getattr(rows, name)[0, col]
        out.lo[1:, j], out.hi[1:, j] = out.lo[0, j], out.hi[0, j]


def _one_sample(
    a: ActivationPair, f: BatchTensors, q: BatchTensors, i: int, j: int, jl: int | None, out: _Out, kernel: Any
) -> None:
    """Activation ``j`` of sample ``i``: by the compiled ``kernel`` (float tensors) or the reference."""
    ref = f.sample(a.tensor_name, i)
    if kernel is not None and ref.dtype in _FLOATS and ref.size:
        row = _kernel_row(a, f, q, i, kernel)
        if np.isfinite(row[[0, 1, 3, 4, 6, 7]]).all():
            out.cum.signal[i, j], out.cum.noise[i, j], out.cum.max_abs[i, j] = row[0:3]
            out.cum.count[i, j] = ref.size
            if jl is not None:
                out.loc.signal[i, jl], out.loc.noise[i, jl], out.loc.max_abs[i, jl] = row[3:6]
                out.loc.count[i, jl] = ref.size
            out.lo[i, j], out.hi[i, j] = row[6], row[7]
            return
    out.cum.put(i, j, _cum_ref(a, f, q, i))
    if jl is not None:
        out.loc.put(i, jl, _loc_ref(a, f, q, i))
    lo, hi = value_ranges([ref])
    out.lo[i, j], out.hi[i, j] = lo[0], hi[0]


def _kernel_row(a: ActivationPair, f: BatchTensors, q: BatchTensors, i: int, kernel: Any) -> np.ndarray:
    """The compiled kernel's row of activation ``a`` for sample ``i`` (its slots are those of ``_kernels``)."""
    ref, post = f.sample(a.tensor_name, i).reshape(-1), q.sample(a.post_qdq, i).reshape(-1)
    pre = q.sample(a.pre_qdq, i).reshape(-1) if a.quantized else post
    if pre.dtype != ref.dtype or post.dtype != ref.dtype:
        return np.full(kernel.SLOTS, np.nan)
    (mlo, mhi), (plo, phi) = bounds_or_inf(a.measured_through), bounds_or_inf(a.fused_activation)
    row = np.zeros(kernel.SLOTS)
    kernel.activation_sums(ref, pre, post, mlo, mhi, plo, phi, a.quantized, row)
    return row


def _vectorisable(a: ActivationPair, f: BatchTensors, q: BatchTensors) -> bool:
    """Whether activation ``a``'s three tensors are small non-empty float views of one layout. A large tensor is
    reduced faster sample by sample (the reference's float32 pass, or the kernel), where the per-call cost no longer
    matters and float64 copies of a whole batch cost more than the float32 pass."""
    ref = f.views[a.tensor_name]
    others = [q.views[a.post_qdq]] + ([q.views[a.pre_qdq]] if a.quantized else [])
    size = ref.shape[0] * ref.shape[2]
    return (
        0 < size <= SMALL_TENSOR
        and ref.dtype in _FLOATS
        and all(o.shape == ref.shape and o.dtype in _FLOATS for o in others)
    )


def _compiled(
    a: ActivationPair, f: BatchTensors, q: BatchTensors, j: int, jl: int | None, out: _Out, kernel: Any
) -> bool:
    """Activation ``j`` for every sample by one call of the compiled batch kernel, when its three views are
    C-contiguous arrays of one float dtype and one shape (else ``False``: another path reduces it); samples whose
    sums or range come out non-finite are redone by the reference."""
    ref, found = f.views[a.tensor_name], q.ints(a.post_qdq) if a.quantized else None
    if found is not None and not hasattr(kernel, "batch_dequant_sums"):  # numba's kernels: the computed floats
        found = None
    post = found[0] if found is not None else q.views[a.post_qdq]
    pre = q.views[a.pre_qdq] if a.quantized else post
    if ref.dtype not in _FLOATS or ref.size == 0:
        return False
    if any(v.shape != ref.shape or not v.flags.c_contiguous for v in (ref, pre, post)) or pre.dtype != ref.dtype:
        return False
    if found is None and post.dtype != ref.dtype:
        return False
    (mlo, mhi), (plo, phi) = bounds_or_inf(a.measured_through), bounds_or_inf(a.fused_activation)
    rows = np.zeros((f.n, kernel.SLOTS))
    if found is not None:
        spec = found[1]
        kernel.batch_dequant_sums(ref, pre, post, spec.scale, spec.zero_point, mlo, mhi, plo, phi, rows)
    else:
        kernel.batch_activation_sums(ref, pre, post, mlo, mhi, plo, phi, a.quantized, rows)
    size, every = ref.shape[0] * ref.shape[2], slice(0, f.n)
    done = [(out.cum, j, kernel.CUM_SIGNAL, _cum_ref)] + (
        [(out.loc, jl, kernel.LOC_SIGNAL, _loc_ref)] if jl is not None else []
    )
    for target, col, at, redo in done:
        _put(a, f, q, (target, col, every, redo), (rows[:, at], rows[:, at + 1], rows[:, at + 2]), size)
    _put_range(a, f, out, j, every, rows[:, kernel.REF_MIN], rows[:, kernel.REF_MAX])
    return True


def reduce_batch(
    plan: ReductionPlan, f: BatchTensors, q: BatchTensors, kernel: Any = None, *, chunk_elements: int = CHUNK_ELEMENTS
) -> list[SampleSums]:
    """Every sample's sums of one batch (:class:`BatchTensors` of the float and the quantized model), equal to
    :func:`~qdebug.capture.kernels.reference.reduce_sample` on each sample to float64 rounding; ``kernel``: the
    compiled kernel module for large tensors (``None``: the reference); ``chunk_elements``: elements of one tensor
    reduced per numpy call on small tensors (the size of their temporary copies; the sums depend on it only in
    their float32 rounding).
    Shapes that differ between the models are the reference's :class:`~qdebug.errors.ModelError`."""
    check_shapes(plan, {k: f.sample(k, 0) for k in plan.float_names}, q.first(plan.quant_names))
    acts, outs = plan.pairing.activations, plan.pairing.outputs
    out = _Out(plan, f.n)
    ordinal = 0
    for j, a in enumerate(acts):
        jl = ordinal if a.quantized else None
        ordinal += a.quantized
        if kernel is not None and _compiled(a, f, q, j, jl, out, kernel):
            continue
        if _vectorisable(a, f, q):
            _vectorised(a, f, q, j, jl, out, chunk_elements)
        else:
            _per_sample(a, f, q, j, jl, out, kernel)
    elements = np.array([int(np.prod(f.alone[a.tensor_name], dtype=np.int64)) for a in acts], dtype=np.int64)
    result = []
    for i in range(f.n):
        o_refs = [f.sample(o.output_name, i) for o in outs]
        o_tests = [q.sample(o.quant_name, i) for o in outs]
        result.append(
            SampleSums(
                cumulative=out.cum.row(i),
                local=out.loc.row(i),
                outputs=reduce_pairs(o_refs, o_tests),
                float_min=out.lo[i].copy(),
                float_max=out.hi[i].copy(),
                elements=elements.copy(),
            )
        )
    return result


def _stack(
    samples: Sequence[Mapping[str, np.ndarray]], names: Sequence[str]
) -> tuple[dict[str, np.ndarray], dict[str, tuple[int, ...]]]:
    """The samples' tensors ``names`` as one batch: each an ``(outer, n, inner)`` array whose ``[:, i, :]`` is sample
    ``i`` (``outer``: the first axis of a tensor of two or more, as a batch axis at 1 would give), and its shape for
    one sample."""
    views: dict[str, np.ndarray] = {}
    alone: dict[str, tuple[int, ...]] = {}
    for name in names:
        one = [np.asarray(s[name]) for s in samples]
        outer = one[0].shape[0] if one[0].ndim >= 2 else 1
        views[name] = np.ascontiguousarray(np.stack([x.reshape(outer, -1) for x in one], axis=1))
        alone[name] = tuple(one[0].shape)
    return views, alone


class BatchedReducer:
    """:func:`reduce_batch` on samples stacked into one batch (the :class:`~qdebug.capture.kernels.base.Reducer`
    face); ``kernel``: the compiled kernel module, loaded by ``load`` (``None``: numpy only)."""

    def __init__(
        self, name: str = "batched", load: Callable[[], Any] | None = None, *, chunk_elements: int = CHUNK_ELEMENTS
    ) -> None:
        self.name, self.chunk_elements = name, chunk_elements
        self.kernel = None if load is None else load()

    def reduce(self, plan: ReductionPlan, samples: Samples) -> list[SampleSums]:
        """See :class:`~qdebug.capture.kernels.base.Reducer`."""
        n = len(samples)
        f_views, f_alone = _stack([f for f, _ in samples], plan.float_names)
        q0 = samples[0][1]
        if isinstance(q0, Dequantized):  # the integers are what a batched run fetches
            fetched = list(q0.fetched)
            q_views, q_alone = _stack([q.fetched for _, q in samples], fetched)  # type: ignore[attr-defined]
            q_views_map: Mapping[str, np.ndarray] = Dequantized(q_views, q0.specs)
            for post, spec in q0.specs.items():
                q_alone[post] = q_alone[spec.ints]
        else:
            q_views_map, q_alone = _stack([q for _, q in samples], plan.quant_names)
        f, q = BatchTensors(f_views, f_alone, n), BatchTensors(q_views_map, q_alone, n)
        return reduce_batch(plan, f, q, self.kernel, chunk_elements=self.chunk_elements)


def _numba() -> Any:
    try:
        return importlib.import_module("qdebug.capture.kernels.numba_kernel")
    except ImportError as exc:  # numba is the optional ``fast`` extra
        raise KernelUnavailableError(f"numba-batched: {exc} (pip install 'qdebug[fast]')") from exc


def _c() -> Any:
    try:
        return c_kernel.load()
    except c_kernel.BuildError as exc:
        raise KernelUnavailableError(f"c-batched: {exc}") from exc


register_reducer("batched", BatchedReducer)
register_reducer("c-batched", lambda: BatchedReducer("c-batched", _c))
register_reducer("numba-batched", lambda: BatchedReducer("numba-batched", _numba))
