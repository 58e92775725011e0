"""Error metrics: pure functions, a name → function registry, and the streaming reduction.

SQNR(dB) = 10·log10(Σ‖x‖² / Σ‖x−y‖²) with ``x`` the reference, turned from sums into dB by one rule,
:func:`sqnr_from_energies` (and :func:`sqnr_row`, the same rule over arrays). Degenerate cases are explicit
(:class:`SqnrStatus`) instead of numbers that look real:

* ``identical``  — no noise at all: +inf dB, shown as ``inf`` — including a reference and a test that are both
  all-zero (an all-zero weight channel reproduced exactly: nothing lost);
* ``undefined``  — an all-zero reference with noise: no signal to compare against (``None``);
* ``nonfinite``  — NaN/Inf in either tensor: the value is meaningless (``None``), the tensor is flagged.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt


class SqnrStatus(enum.StrEnum):
    """How an SQNR value came about."""

    OK = "ok"
    IDENTICAL = "identical"
    UNDEFINED = "undefined"
    NONFINITE = "nonfinite"
    NOT_QUANTIZED = "not_quantized"


def sqnr_from_energies(signal: float, noise: float, nonfinite: bool = False) -> tuple[float | None, SqnrStatus]:
    """SQNR in dB from accumulated Σx² (``signal``) and Σ(x−y)² (``noise``), with its status: the one rule
    (docs/metrics.md, "Degenerate cases") every SQNR of qdebug goes through.

    ``nonfinite`` (NaN/Inf counted in either tensor) or a non-finite sum: ``None``, NONFINITE; no noise, whatever
    the signal (an all-zero reference reproduced exactly included): +inf, IDENTICAL; no signal but noise: ``None``,
    UNDEFINED; else ``10·log10(signal / noise)``, OK.
    """
    if nonfinite or not (math.isfinite(signal) and math.isfinite(noise)):
        return None, SqnrStatus.NONFINITE
    if noise == 0.0:
        return math.inf, SqnrStatus.IDENTICAL
    if signal == 0.0:
        return None, SqnrStatus.UNDEFINED
    return 10.0 * math.log10(signal / noise), SqnrStatus.OK


def sqnr_row(
    signal: npt.NDArray[np.float64], noise: npt.NDArray[np.float64], nonfinite: npt.NDArray[np.bool_]
) -> npt.NDArray[np.float64]:
    """:func:`sqnr_from_energies` element by element over arrays (``None`` as NaN), in the same order of cases.

    Vectorised for a sample's row of pairs; numpy's SIMD ``log10`` may differ from ``math.log10`` in the last bit,
    which is why the scalar form stays for values reported one at a time (``tests/test_metrics.py`` checks both
    give the same statuses).
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        v = 10.0 * np.log10(signal / noise)
    v = np.where(noise == 0.0, np.inf, v)
    v = np.where((signal == 0.0) & (noise > 0.0), np.nan, v)
    return np.where(nonfinite | ~np.isfinite(signal + noise), np.nan, v)


#: Elements per ``np.dot`` call in :func:`blocked_dot` and :func:`reduce_pair`: OpenBLAS runs a long dot product on
#: all its threads, and waking them on a loaded machine costs more than the work; in float32 a block's rounding
#: error stays ~1e-8 relative.
_BLOCK = 8192


def blocked_dot(x: npt.NDArray[np.floating[Any]], y: npt.NDArray[np.floating[Any]]) -> float:
    """``x · y`` of two flat arrays, summed over :data:`_BLOCK`-element blocks (single-threaded BLAS calls)."""
    if x.size <= _BLOCK:
        return float(np.dot(x, y))
    return math.fsum(float(np.dot(x[i : i + _BLOCK], y[i : i + _BLOCK])) for i in range(0, x.size, _BLOCK))


def _f64(a: npt.ArrayLike) -> npt.NDArray[np.float64]:
    # Integer inputs (e.g. uint8 weights) must be widened *before* any subtraction.
    return np.asarray(a, dtype=np.float64).reshape(-1)


def energies(reference: npt.ArrayLike, test: npt.ArrayLike) -> tuple[float, float]:
    """Σx² and Σ(x−y)² of a whole pair in float64 (:func:`blocked_dot`): the sums of every whole-tensor SQNR
    (weights, their channels, a quantizer's output check)."""
    x, y = _f64(reference), _f64(test)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf inputs give a NaN sum, not a warning
        d = x - y
        return blocked_dot(x, x), blocked_dot(d, d)


def sqnr_db(reference: npt.ArrayLike, test: npt.ArrayLike) -> float:
    """SQNR of ``test`` against ``reference`` in dB (float64); +inf if identical, NaN if undefined."""
    if np.shape(reference) != np.shape(test):  # compared before flattening: (2, 3) is not (3, 2)
        raise ValueError(f"shape mismatch: {np.shape(reference)} vs {np.shape(test)}")
    value, _ = sqnr_from_energies(*energies(reference, test))
    return math.nan if value is None else value


def channel_sqnr(
    reference: np.ndarray, test: np.ndarray, axis: int, diff: np.ndarray | None = None
) -> list[float | None]:
    """Per-channel SQNR in dB along ``axis`` (a 0-d tensor is one channel), by :func:`sqnr_from_energies` on
    float64 :func:`blocked_dot` sums: ``inf`` for a channel reproduced exactly (an all-zero one included),
    ``None`` where undefined or not finite. ``diff``: ``reference − test`` when the caller has it already."""
    ref = np.asarray(reference, np.float64)
    ax = axis % ref.ndim if ref.ndim else 0
    rows = ref.shape[ax] if ref.ndim else 1
    r = np.moveaxis(ref, ax, 0).reshape(rows, -1)
    with np.errstate(invalid="ignore", over="ignore"):
        d = ref - np.asarray(test, np.float64) if diff is None else diff
    e = np.moveaxis(d, ax, 0).reshape(rows, -1)
    return [sqnr_from_energies(blocked_dot(r[c], r[c]), blocked_dot(e[c], e[c]))[0] for c in range(rows)]


def mse(reference: npt.ArrayLike, test: npt.ArrayLike) -> float:
    """Mean squared error."""
    d = _f64(reference) - _f64(test)
    return blocked_dot(d, d) / d.size if d.size else math.nan


def max_abs_error(reference: npt.ArrayLike, test: npt.ArrayLike) -> float:
    """Largest absolute difference."""
    d = _f64(reference) - _f64(test)
    return float(np.max(np.abs(d))) if d.size else math.nan


def cosine_similarity(reference: npt.ArrayLike, test: npt.ArrayLike) -> float:
    """Cosine of the angle between the flattened tensors (NaN if either is all-zero)."""
    x, y = _f64(reference), _f64(test)
    den = math.sqrt(blocked_dot(x, x)) * math.sqrt(blocked_dot(y, y))
    return blocked_dot(x, y) / den if den else math.nan


Metric = Callable[[npt.ArrayLike, npt.ArrayLike], float]

#: Whole-tensor metrics by name, ``(reference, test) -> float``: the debug report computes every one of them for
#: every weight (weights are whole arrays; activations are streamed, see :data:`STREAMING_METRICS`). Users add
#: their own with :func:`register_metric`.
METRICS: dict[str, Metric] = {
    "sqnr_db": sqnr_db,
    "mse": mse,
    "max_abs_error": max_abs_error,
    "cosine_similarity": cosine_similarity,
}


@dataclass(frozen=True)
class TensorStats:
    """The dot products and extremes of one whole (reference, test) pair in float64, computed once: the built-in
    whole-tensor metrics read them (:data:`FROM_STATS`) instead of each converting and passing over the arrays
    again."""

    signal: float  # x·x
    noise: float  # d·d, d = x − y
    cross: float  # x·y
    test: float  # y·y
    max_abs: float  # max |d| (NaN when empty)
    count: int

    @classmethod
    def of(cls, x: npt.NDArray[np.float64], y: npt.NDArray[np.float64], d: npt.NDArray[np.float64]) -> TensorStats:
        """Stats of flat float64 ``x`` (reference), ``y`` (test) and ``d = x − y``, in the exact operations the
        metric functions use (so their values are bit-identical)."""
        return cls(
            signal=blocked_dot(x, x),
            noise=blocked_dot(d, d),
            cross=blocked_dot(x, y),
            test=blocked_dot(y, y),
            max_abs=float(np.max(np.abs(d))) if d.size else math.nan,
            count=int(d.size),
        )


def _sqnr_of(s: TensorStats) -> float:
    value, _ = sqnr_from_energies(s.signal, s.noise)
    return math.nan if value is None else value


def _cosine_of(s: TensorStats) -> float:
    den = math.sqrt(s.signal) * math.sqrt(s.test)
    return s.cross / den if den else math.nan


#: The built-in :data:`METRICS` computed from :class:`TensorStats` (the same values, bit for bit, as calling them on
#: the arrays: ``tests/test_metrics.py``). A metric without an entry here — any user's — is called on the arrays.
FROM_STATS: dict[Metric, Callable[[TensorStats], float]] = {
    sqnr_db: _sqnr_of,
    mse: lambda s: s.noise / s.count if s.count else math.nan,
    max_abs_error: lambda s: s.max_abs,
    cosine_similarity: _cosine_of,
}


def register_metric(name: str, fn: Metric) -> None:
    """Add a whole-tensor metric to :data:`METRICS`; re-registering a name is an error."""
    if name in METRICS or name in STREAMING_METRICS:
        raise ValueError(f"metric {name!r} is already registered")
    METRICS[name] = fn


@dataclass(frozen=True)
class ErrorSums:
    """Streaming sums of one (reference, test) tensor pair over samples: mergeable, O(1) memory."""

    signal: float = 0.0
    noise: float = 0.0
    count: int = 0
    max_abs: float = 0.0
    nonfinite_reference: int = 0
    nonfinite_test: int = 0
    samples: int = 0

    def merge(self, other: ErrorSums) -> ErrorSums:
        """Combine two partial reductions (associative, order-independent)."""
        return ErrorSums(
            signal=self.signal + other.signal,
            noise=self.noise + other.noise,
            count=self.count + other.count,
            max_abs=max(self.max_abs, other.max_abs),
            nonfinite_reference=self.nonfinite_reference + other.nonfinite_reference,
            nonfinite_test=self.nonfinite_test + other.nonfinite_test,
            samples=self.samples + other.samples,
        )

    @property
    def sqnr(self) -> tuple[float | None, SqnrStatus]:
        """SQNR in dB over everything reduced so far, with its status."""
        return sqnr_from_energies(self.signal, self.noise, bool(self.nonfinite_reference or self.nonfinite_test))

    @property
    def mse(self) -> float | None:
        """Mean squared error over all elements seen."""
        return self.noise / self.count if self.count else None


StreamingMetric = Callable[["ErrorSums"], float | None]


def _rmse(s: ErrorSums) -> float | None:
    m = s.mse
    return None if m is None else math.sqrt(m)


#: Metrics computed from the mergeable sums of a tensor pair over all samples (bounded memory): the debug report
#: computes every one of them for every activation and model output. Users add their own with
#: :func:`register_streaming_metric` (a function of :class:`ErrorSums`).
STREAMING_METRICS: dict[str, StreamingMetric] = {
    "sqnr_db": lambda s: s.sqnr[0],
    "mse": lambda s: s.mse,
    "rmse": _rmse,
    "max_abs_error": lambda s: None if s.nonfinite_reference or s.nonfinite_test else s.max_abs,
}


def register_streaming_metric(name: str, fn: StreamingMetric) -> None:
    """Add a streaming metric to :data:`STREAMING_METRICS`; re-registering a name is an error."""
    if name in STREAMING_METRICS or name in METRICS:
        raise ValueError(f"metric {name!r} is already registered")
    STREAMING_METRICS[name] = fn


def reduce_pair(reference: np.ndarray, test: np.ndarray) -> ErrorSums:
    """Reduce one sample's tensor pair to :class:`ErrorSums` (the only per-sample work on tensors).

    This is the engine's hot loop, so it stays in float32 where that is harmless: ``x − y`` once, then
    float32 dot products over 8k-element blocks accumulated in float64. Against a float64 computation
    the sums agree to ~1e-8 relative (≈ 1e-7 dB), far below the 0.01 dB the engine promises, at half
    the cost of float64 blocks. Finite inputs whose float32 squares overflow are redone in float64.
    NaN/Inf are counted and reported as a status, never as a numpy ``RuntimeWarning``.
    """
    if np.shape(reference) != np.shape(test):
        raise ValueError(f"shape mismatch: {np.shape(reference)} vs {np.shape(test)}")
    x = np.ascontiguousarray(reference, dtype=np.float32).reshape(-1)
    y = np.ascontiguousarray(test, dtype=np.float32).reshape(-1)
    if x.size == 0:
        return ErrorSums(samples=1)
    with np.errstate(invalid="ignore", over="ignore"):
        signal, noise, max_abs = _one_pass(x, y)
    nf_x = nf_y = 0
    if not (math.isfinite(signal) and math.isfinite(noise)):
        nf_x = int(x.size - np.count_nonzero(np.isfinite(x)))
        nf_y = int(y.size - np.count_nonzero(np.isfinite(y)))
        if nf_x == 0 and nf_y == 0:  # finite inputs whose square (or difference) overflowed float32
            x64 = x.astype(np.float64)
            d64 = x64 - y.astype(np.float64)
            signal, noise = blocked_dot(x64, x64), blocked_dot(d64, d64)
            max_abs = float(np.max(np.abs(d64)))
        else:
            max_abs = 0.0
    return ErrorSums(
        signal=signal,
        noise=noise,
        count=int(x.size),
        max_abs=max_abs,
        nonfinite_reference=nf_x,
        nonfinite_test=nf_y,
        samples=1,
    )


#: Elements per chunk of :func:`_one_pass`: a chunk of the reference, the test and their difference (384 KB)
#: stays in the L2 cache while it is summed.
_CHUNK = 4 * _BLOCK


def _one_pass(x: npt.NDArray[np.float32], y: npt.NDArray[np.float32]) -> tuple[float, float, float]:
    """Σx², Σ(x−y)² and max|x−y| of two flat float32 arrays in one pass over :data:`_CHUNK`-element chunks.

    The same float32 dot products over the same :data:`_BLOCK`-element blocks, added in the same order, as
    three whole-array passes would (identical sums), but a large tensor is read from memory once instead of six
    times. NaN in ``x − y`` only comes from non-finite inputs, whose ``max_abs`` the caller discards.
    """
    d = np.empty(min(x.size, _CHUNK), dtype=np.float32)
    signal = noise = 0.0
    hi, lo = -math.inf, math.inf
    for start in range(0, x.size, _CHUNK):
        xc = x[start : start + _CHUNK]
        dc = d[: xc.size]
        np.subtract(xc, y[start : start + _CHUNK], out=dc)
        for b in range(0, xc.size, _BLOCK):
            xb, db = xc[b : b + _BLOCK], dc[b : b + _BLOCK]
            signal += float(np.dot(xb, xb))
            noise += float(np.dot(db, db))
        hi, lo = max(hi, float(dc.max())), min(lo, float(dc.min()))
    return signal, noise, max(hi, -lo)


@dataclass(frozen=True)
class BatchSums:
    """:class:`ErrorSums` of many tensor pairs of one sample, as parallel arrays (index = pair)."""

    signal: npt.NDArray[np.float64]
    noise: npt.NDArray[np.float64]
    count: npt.NDArray[np.int64]
    max_abs: npt.NDArray[np.float64]
    nonfinite_reference: npt.NDArray[np.int64]
    nonfinite_test: npt.NDArray[np.int64]

    def sqnr_db(self) -> npt.NDArray[np.float64]:
        """Per-pair SQNR of this sample (:func:`sqnr_row`): +inf if identical, NaN if undefined or non-finite."""
        return sqnr_row(self.signal, self.noise, (self.nonfinite_reference > 0) | (self.nonfinite_test > 0))


#: Tensors up to this many elements are reduced together in one vectorised pass: for small tensors the
#: fixed cost of a per-tensor call dominates; for large ones the per-tensor float32 path is faster.
SMALL_TENSOR = 16384


def _segments(arrays: list[np.ndarray]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.intp]]:
    flat = np.concatenate([np.ravel(a) for a in arrays]).astype(np.float64, copy=False)
    sizes = np.fromiter((a.size for a in arrays), dtype=np.intp, count=len(arrays))
    offsets = np.zeros(len(arrays), dtype=np.intp)
    np.cumsum(sizes[:-1], out=offsets[1:])
    return flat, offsets


def reduce_pairs(references: list[np.ndarray], tests: list[np.ndarray]) -> BatchSums:
    """:func:`reduce_pair` for many pairs of one sample at once (same sums, vectorised for small tensors).

    Small non-empty tensors are concatenated and reduced with ``np.*.reduceat`` in float64; large, empty
    or non-finite ones go through :func:`reduce_pair`.
    """
    n = len(references)
    if len(tests) != n:
        raise ValueError(f"{n} references but {len(tests)} tests")
    signal, noise, max_abs = np.zeros(n), np.zeros(n), np.zeros(n)
    count = np.zeros(n, dtype=np.int64)
    nf_ref, nf_test = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)

    def one(k: int) -> None:
        s = reduce_pair(references[k], tests[k])
        signal[k], noise[k], count[k], max_abs[k] = s.signal, s.noise, s.count, s.max_abs
        nf_ref[k], nf_test[k] = s.nonfinite_reference, s.nonfinite_test

    small: list[int] = []
    for k in range(n):
        r, t = references[k], tests[k]
        if np.shape(r) != np.shape(t):
            raise ValueError(f"shape mismatch: {np.shape(r)} vs {np.shape(t)}")
        if 0 < np.size(r) <= SMALL_TENSOR:
            small.append(k)
        else:
            one(k)
    if small:
        x, offsets = _segments([references[k] for k in small])
        y, _ = _segments([tests[k] for k in small])
        with np.errstate(invalid="ignore", over="ignore"):
            d = x - y
            sig = np.add.reduceat(x * x, offsets)
            noi = np.add.reduceat(d * d, offsets)
            mx = np.maximum.reduceat(np.abs(d), offsets)
        idx = np.asarray(small)
        signal[idx], noise[idx], max_abs[idx] = sig, noi, mx
        count[idx] = [np.size(references[k]) for k in small]
        for pos in np.flatnonzero(~np.isfinite(sig + noi)):
            one(small[pos])  # counts the NaN/Inf exactly
    return BatchSums(signal, noise, count, max_abs, nf_ref, nf_test)


def value_ranges(arrays: list[np.ndarray]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per-array (min, max) over finite values; NaN for empty or all-non-finite arrays."""
    n = len(arrays)
    lo, hi = np.full(n, np.nan), np.full(n, np.nan)
    small = [k for k in range(n) if 0 < arrays[k].size <= SMALL_TENSOR]
    for k in range(n):
        a = arrays[k]
        if a.size > SMALL_TENSOR:
            lo[k], hi[k] = float(a.min()), float(a.max())
    if small:
        flat, offsets = _segments([arrays[k] for k in small])
        lo[small] = np.minimum.reduceat(flat, offsets)
        hi[small] = np.maximum.reduceat(flat, offsets)
    ok = np.isfinite(lo) & np.isfinite(hi)
    for k in np.flatnonzero(~ok).tolist():
        a = np.asarray(arrays[k], dtype=np.float64)
        fin = a[np.isfinite(a)]
        lo[k], hi[k] = (float(fin.min()), float(fin.max())) if fin.size else (np.nan, np.nan)
    return lo, hi


@dataclass(frozen=True)
class Summary:
    """Count, mean, std, min and max of the finite SQNR values of one kind."""

    count: int
    mean: float | None
    std: float | None
    min: float | None
    max: float | None
    infinite: int = 0
    undefined: int = 0

    @classmethod
    def of(cls, values: list[float | None]) -> Summary:
        """Summarise values; +inf and None are counted apart, not averaged in."""
        finite = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
        infinite = sum(1 for v in values if v is not None and math.isinf(v))
        undefined = sum(1 for v in values if v is None)
        if finite.size == 0:
            return cls(count=0, mean=None, std=None, min=None, max=None, infinite=infinite, undefined=undefined)
        return cls(
            count=int(finite.size),
            mean=float(finite.mean()),
            std=float(finite.std()),
            min=float(finite.min()),
            max=float(finite.max()),
            infinite=infinite,
            undefined=undefined,
        )
