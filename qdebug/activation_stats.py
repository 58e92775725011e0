""":class:`TensorStats` — a fixed-bin histogram of ``log2 |x|`` per float activation plus clip / flush-to-zero counts
against the tensor's quantization grid — and :func:`collect_stats`, which gathers them one sample at a time over the
float model. Every field is a count, a sum or a max, so statistics of sample sets merge exactly and memory stays a
few hundred numbers per tensor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from qdebug.data import DataSource, open_data
from qdebug.model_io import input_specs
from qdebug.ort import expose_outputs, make_session
from qdebug.report import ActivationResult, DebugReport

#: Integer range of each quantization type.
QRANGE = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767)}


#: |x| histogram: the top 10 bits of a float32's magnitude, i.e. its 8-bit exponent and 2 mantissa bits — 4 linear
#: bins per octave over the whole float32 range (bins 0-3: zero and subnormals), read straight from the bits.
BINS_PER_OCTAVE = 4
N_BINS = 256 * BINS_PER_OCTAVE
_SHIFT = 23 - 2  # float32: 23 mantissa bits, keep 2


@dataclass
class TensorStats:
    """Mergeable per-tensor statistics of the float model's values (a few hundred numbers per tensor, whatever
    the number of samples): counts, a fixed-bin ``|x|`` histogram (4 bins per octave, :data:`N_BINS`), and
    against the tensor's grid (when it has one) the values clipped below / above it and those it flushes to zero."""

    count: int = 0
    negative: int = 0
    abs_max: float = 0.0
    hist: np.ndarray = field(default_factory=lambda: np.zeros(N_BINS, dtype=np.int64))
    clipped_low: int = 0
    clipped_high: int = 0
    flushed: int = 0

    def update(self, x: np.ndarray, grid: tuple[float, float, float] | None) -> None:
        """Add one sample's values; ``grid`` is ``(lowest, highest, step)`` of the tensor's quantization."""
        v = np.ascontiguousarray(x, dtype=np.float32).ravel()
        if not np.isfinite(v).all():
            v = v[np.isfinite(v)]
        a = np.abs(v)
        # The histogram bin of |x| is its float32 bit pattern shifted (exponent and 2 mantissa bits): no log.
        self.hist += np.bincount(a.view(np.int32) >> _SHIFT, minlength=N_BINS)[:N_BINS]
        self.count += v.size
        self.negative += int(np.count_nonzero(v < 0))
        if a.size:
            self.abs_max = max(self.abs_max, float(a.max()))
        if grid is not None:
            lo, hi, step = grid
            # A grid reaching past float32 (a −FLT_MAX mask's) clips no finite value; compared as float32 it would
            # overflow.
            self.clipped_low += int(np.count_nonzero(v < max(lo - step / 2, -_FLT_MAX)))
            self.clipped_high += int(np.count_nonzero(v > min(hi + step / 2, _FLT_MAX)))
            self.flushed += int(np.count_nonzero(a < step / 2))

    @property
    def zeros(self) -> int:
        """Values that are 0 (or float32 subnormals)."""
        return int(self.hist[:BINS_PER_OCTAVE].sum())

    @property
    def nonzero_flushed(self) -> int:
        """Nonzero values the grid rounds to 0."""
        return max(0, self.flushed - self.zeros)

    def merge(self, other: TensorStats) -> TensorStats:
        """The statistics of both sample sets (exact: every field is a count, a sum or a max)."""
        return TensorStats(
            self.count + other.count, self.negative + other.negative,
            max(self.abs_max, other.abs_max), self.hist + other.hist, self.clipped_low + other.clipped_low,
            self.clipped_high + other.clipped_high, self.flushed + other.flushed,
        )  # fmt: skip

    def abs_percentile(self, q: float) -> float:
        """The ``q``-th percentile (0–100) of ``|x|``, to a quarter octave (the upper edge of its bin)."""
        if self.count == 0:
            return 0.0
        k = int(np.searchsorted(np.cumsum(self.hist), q / 100.0 * self.count))
        if k < BINS_PER_OCTAVE:  # zero (or subnormal)
            return 0.0
        octave, j = divmod(k, BINS_PER_OCTAVE)
        upper = 2.0 ** (octave - 127) * (1 + (j + 1) / BINS_PER_OCTAVE)  # bin k: [2^o (1 + j/4), 2^o (1 + (j+1)/4))
        return float(min(upper, self.abs_max))


_FLT_MAX = float(np.finfo(np.float32).max)


def quant_grid(a: ActivationResult) -> tuple[float, float, float] | None:
    """``(lowest, highest, step)`` of a quantized activation's grid (``None``: not quantized, or no usable scale)."""
    if not a.quantized or a.scale is None or a.zero_point is None or a.quant_type not in QRANGE:
        return None
    if not (math.isfinite(a.scale) and a.scale > 0):
        return None
    qmin, qmax = QRANGE[a.quant_type]
    return (qmin - a.zero_point) * a.scale, (qmax - a.zero_point) * a.scale, a.scale


def collect_stats(
    float_model: onnx.ModelProto,
    report: DebugReport,
    data: Any = None,
    *,
    max_samples: int = 8,
    providers: Sequence[str] = ("CPUExecutionProvider",),
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    synthetic: Mapping[str, Any] | None = None,
) -> tuple[dict[str, TensorStats], int]:
    """:class:`TensorStats` of every activation of ``report`` over the first ``max_samples`` samples of ``data``
    (a data spec as :func:`qdebug.debugger` takes; ``None``: synthetic), one sample in memory at a time.

    ``synthetic`` passes ``seed`` / ``distribution`` / ``ignore`` to :func:`qdebug.data.open_data` (the same samples
    as the debug run). Returns ``({tensor: stats}, samples seen)``.
    """
    acts = [a for a in report.activations]
    names = [a.tensor_name for a in acts]
    sess: Any = make_session(expose_outputs(float_model, names), providers, role="float model")
    fetched = {o.name for o in sess.get_outputs()}
    acts = [a for a in acts if a.tensor_name in fetched]
    grids = {a.tensor_name: quant_grid(a) for a in acts}
    stats = {a.tensor_name: TensorStats() for a in acts}
    source: DataSource = open_data(
        data, input_specs(float_model), num_samples=max_samples, input_shapes=input_shapes, **(synthetic or {})
    )
    seen = 0
    wanted = list(stats)
    for sample in source:
        if seen >= max_samples:
            break
        feed = {k: v for k, v in sample.items() if k in {i.name for i in sess.get_inputs()}}
        for name, value in zip(wanted, sess.run(wanted, feed), strict=True):
            stats[name].update(value, grids[name])
        seen += 1
    return stats, seen
