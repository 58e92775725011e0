"""Numba kernels of the ``compiled`` reduction (imported only through :mod:`qdebug.capture.compiled`, which names
the ``fast`` extra when numba is missing).

One call reads an activation's three tensors (float reference, pre-Q/DQ, post-Q/DQ) **once** and returns every
sum :func:`qdebug.capture.kernels.reference.reduce_sample` computes for it in 6-8 numpy passes. Sums are accumulated in
float64 over :data:`LANES` independent lanes: the lanes break the loop-carried dependency of one running sum, which
a single accumulator cannot hide.
``fastmath`` allows re-association (needed to vectorise the lanes) but not ``nnan``/``ninf``: NaN and Inf keep
IEEE semantics, so non-finite values are counted, never optimised away.
"""

from __future__ import annotations

import sys

import numba
import numpy as np
from numba import types
from numba.extending import overload

from qdebug.capture.kernels.base import register_reducer
from qdebug.capture.kernels.rows import KernelReducer

#: Independent partial sums per quantity: enough to hide the float64 add latency behind vector registers.
LANES = 16

_FAST = {"reassoc", "nsz", "arcp", "contract"}

#: Slots of a row of :func:`activation_sums`'s output.
CUM_SIGNAL, CUM_NOISE, CUM_MAX = 0, 1, 2
LOC_SIGNAL, LOC_NOISE, LOC_MAX = 3, 4, 5
REF_MIN, REF_MAX = 6, 7
SLOTS = 8


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def pair_sums(x, y, xlo, xhi, lo, hi, out, at):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """``out[at:at+3]`` = Σa², Σ(a−b)², max|a−b|, where ``a`` is ``x`` clipped to ``[xlo, xhi]`` then ``[lo, hi]``
    and ``b`` is ``y`` clipped to ``[lo, hi]`` (±inf bounds: no clip).

    A non-finite value makes a sum non-finite (``min``/``max`` keep NaN as numba follows Python's order rules);
    the caller then redoes the pair in numpy, which counts them. Written with the builtins ``min``/``max`` and
    one-dimensional lane arrays: a conditional-expression clip or a 2-D accumulator kept LLVM from vectorising
    the loop."""
    s, n, m = np.zeros(LANES), np.zeros(LANES), np.zeros(LANES)
    size = x.size
    full = size - size % LANES
    for start in range(0, full, LANES):
        for lane in range(LANES):
            a = min(max(min(max(np.float64(x[start + lane]), xlo), xhi), lo), hi)
            b = min(max(np.float64(y[start + lane]), lo), hi)
            d = a - b
            s[lane] += a * a
            n[lane] += d * d
            ad = abs(d)
            m[lane] = ad if ad > m[lane] else m[lane]
    for i in range(full, size):  # the tail, into lane 0
        a = min(max(min(max(np.float64(x[i]), xlo), xhi), lo), hi)
        b = min(max(np.float64(y[i]), lo), hi)
        d = a - b
        s[0] += a * a
        n[0] += d * d
        m[0] = abs(d) if abs(d) > m[0] else m[0]
    out[at], out[at + 1], out[at + 2] = s.sum(), n.sum(), m.max()


@numba.njit(cache=True, nogil=True)
def value_range(x, out, at):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """``out[at]``, ``out[at+1]`` = min and max of ``x`` ignoring NaN (±Inf included: the caller redoes those)."""
    lo, hi = np.full(LANES, np.inf, dtype=x.dtype), np.full(LANES, -np.inf, dtype=x.dtype)
    size = x.size
    full = size - size % LANES
    for start in range(0, full, LANES):
        for lane in range(LANES):
            v = x[start + lane]
            lo[lane] = v if v < lo[lane] else lo[lane]
            hi[lane] = v if v > hi[lane] else hi[lane]
    for i in range(full, size):
        v = x[i]
        lo[0] = v if v < lo[0] else lo[0]
        hi[0] = v if v > hi[0] else hi[0]
    out[at], out[at + 1] = lo.min(), hi.max()


def _post_value(v: object, scale: float, zero_point: int) -> float:  # pragma: no cover - see the overload
    """A post-Q/DQ element as float64: a float as it is, an integer dequantized (compiled: :func:`_post_value_impl`)."""
    raise NotImplementedError("compiled code only")


@overload(_post_value, inline="always")
def _post_value_impl(v, scale, zero_point):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """``float32(int32(q) - zero_point) * scale`` as ORT's DequantizeLinear computes it, for an integer element (the
    float64 product of two float32 values is exact, and rounding it to float32 once gives the float32 product; the
    conversions keep the rounding from being contracted into another operation); a float element as it is. Chosen
    by type when compiled, and inlined, so the loops still vectorise."""
    if isinstance(v, types.Integer):
        return lambda v, scale, zero_point: np.float64(np.float32(np.float64(np.int32(v) - zero_point) * scale))
    return lambda v, scale, zero_point: np.float64(v)


@numba.njit(inline="always", fastmath=_FAST)
def _both(a, b, p, lane, cs, cn, cm, ls, ln, lm):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """One element of both comparisons into ``lane``: cumulative (``a`` vs ``b``) and local (``p`` vs ``b``), all
    float64 and already clipped. Inlined into :func:`_both_pass`'s loops at the IR level, so they still vectorise."""
    d = a - b
    e = p - b
    cs[lane] += a * a
    cn[lane] += d * d
    ad = abs(d)
    cm[lane] = ad if ad > cm[lane] else cm[lane]
    ls[lane] += p * p
    ln[lane] += e * e
    ae = abs(e)
    lm[lane] = ae if ae > lm[lane] else lm[lane]


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _both_pass(ref, pre, post, scale, zero_point, mlo, mhi, plo, phi, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    """The cumulative and local sums of a quantized activation in one pass over its three tensors (``out`` slots
    :data:`CUM_SIGNAL` .. :data:`LOC_MAX`); ``post`` holds floats, or integers dequantized with ``scale`` and
    ``zero_point`` (:func:`_post_value`)."""
    cs, cn, cm = np.zeros(LANES), np.zeros(LANES), np.zeros(LANES)
    ls, ln, lm = np.zeros(LANES), np.zeros(LANES), np.zeros(LANES)
    size = ref.size
    full = size - size % LANES
    for start in range(0, full, LANES):
        for lane in range(LANES):
            b = min(max(_post_value(post[start + lane], scale, zero_point), mlo), mhi)
            a = min(max(np.float64(ref[start + lane]), mlo), mhi)
            p = min(max(min(max(np.float64(pre[start + lane]), plo), phi), mlo), mhi)
            _both(a, b, p, lane, cs, cn, cm, ls, ln, lm)
    for i in range(full, size):  # the tail, into lane 0
        b = min(max(_post_value(post[i], scale, zero_point), mlo), mhi)
        a = min(max(np.float64(ref[i]), mlo), mhi)
        p = min(max(min(max(np.float64(pre[i]), plo), phi), mlo), mhi)
        _both(a, b, p, 0, cs, cn, cm, ls, ln, lm)
    out[CUM_SIGNAL], out[CUM_NOISE], out[CUM_MAX] = cs.sum(), cn.sum(), cm.max()
    out[LOC_SIGNAL], out[LOC_NOISE], out[LOC_MAX] = ls.sum(), ln.sum(), lm.max()


@numba.njit(cache=True, nogil=True)
def both_sums(ref, pre, post, mlo, mhi, plo, phi, out):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """:func:`_both_pass` over a float ``post``: read once instead of twice, as two :func:`pair_sums` would."""
    _both_pass(ref, pre, post, 1.0, np.int32(0), mlo, mhi, plo, phi, out)


@numba.njit(cache=True, nogil=True)
def dequant_sums(ref, pre, ints, scale, zero_point, mlo, mhi, plo, phi, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    """:func:`both_sums` with the post-Q/DQ tensor computed from its integers (:mod:`qdebug.capture.dequant`), and
    ``ref``'s min/max."""
    _both_pass(ref, pre, ints, np.float64(np.float32(scale)), np.int32(zero_point), mlo, mhi, plo, phi, out)
    value_range(ref, out, REF_MIN)


@numba.njit(cache=True, nogil=True)
def activation_sums(ref, pre, post, mlo, mhi, plo, phi, local, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Fill ``out`` (a float64 row of :data:`SLOTS`) for one activation's flat tensors: cumulative (``ref`` vs
    ``post``, both clipped to ``[mlo, mhi]``), local when ``local`` (``pre`` clipped to ``[plo, phi]`` then
    ``[mlo, mhi]`` vs the clipped ``post``), and the raw ``ref``'s min/max."""
    if local:
        both_sums(ref, pre, post, mlo, mhi, plo, phi, out)
    else:
        pair_sums(ref, post, -np.inf, np.inf, mlo, mhi, out, CUM_SIGNAL)
    value_range(ref, out, REF_MIN)


@numba.njit(cache=True, nogil=True)
def batch_activation_sums(ref, pre, post, mlo, mhi, plo, phi, local, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    """:func:`activation_sums` for every sample of a batch at once: ``ref``, ``pre``, ``post`` are C-contiguous
    ``(outer, n, inner)`` arrays whose ``[:, i, :]`` is sample ``i``; ``out`` is ``(n, SLOTS)``. One call per
    activation and batch instead of one per sample: on a model of many small tensors the per-call cost is what a
    sample's reduction is made of."""
    outer, n = ref.shape[0], ref.shape[1]
    row = np.zeros(SLOTS)
    for i in range(n):
        acc = out[i]
        acc[:] = 0.0
        acc[REF_MIN], acc[REF_MAX] = np.inf, -np.inf
        for o in range(outer):
            activation_sums(ref[o, i], pre[o, i], post[o, i], mlo, mhi, plo, phi, local, row)
            for at in (CUM_SIGNAL, LOC_SIGNAL):
                acc[at] += row[at]
                acc[at + 1] += row[at + 1]
                acc[at + 2] = max(acc[at + 2], row[at + 2])
            acc[REF_MIN] = min(acc[REF_MIN], row[REF_MIN])
            acc[REF_MAX] = max(acc[REF_MAX], row[REF_MAX])


register_reducer("numba", lambda: KernelReducer("numba", sys.modules[__name__]))
