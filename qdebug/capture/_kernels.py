"""Numba kernels of the ``compiled`` reduction (imported only through :mod:`qdebug.capture.compiled`, which names
the ``fast`` extra when numba is missing).

One call reads an activation's three tensors (float reference, pre-Q/DQ, post-Q/DQ) **once** and returns every
sum :func:`qdebug.capture.reduction.reduce_sample` computes for it in 6-8 numpy passes. Sums are accumulated in
float64 over :data:`LANES` independent lanes: the lanes break the loop-carried dependency of one running sum
(4 cycles per add), which is what let the first, single-accumulator version reach only a third of this speed.
``fastmath`` allows re-association (needed to vectorise the lanes) but not ``nnan``/``ninf``: NaN and Inf keep
IEEE semantics, so non-finite values are counted, never optimised away.
"""

from __future__ import annotations

import numba
import numpy as np

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
    the loop (3.5x slower on 1 M elements)."""
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


@numba.njit(cache=True, nogil=True)
def activation_sums(ref, pre, post, mlo, mhi, plo, phi, local, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Fill ``out`` (a float64 row of :data:`SLOTS`) for one activation's flat tensors: cumulative (``ref`` vs
    ``post``, both clipped to ``[mlo, mhi]``), local when ``local`` (``pre`` clipped to ``[plo, phi]`` then
    ``[mlo, mhi]`` vs the clipped ``post``), and the raw ``ref``'s min/max."""
    pair_sums(ref, post, -np.inf, np.inf, mlo, mhi, out, CUM_SIGNAL)
    if local:
        pair_sums(pre, post, plo, phi, mlo, mhi, out, LOC_SIGNAL)
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
