"""A set of bound output arrays carved out of one buffer whose pages were touched ahead of time, on the idle core.

A pipelined run infers into two sets of bound outputs (:mod:`qdebug.capture.output_sets`); sample 0's plain run
gives the first, the second is new memory. Touching new memory is what costs, not using it, and that cost would fall
in the first timed samples. The run knows one sample's exposed bytes before it runs any sample, from shape
inference (:func:`estimate_bytes`), so its worker touches one buffer of that size while sample 0 is inferred on the
main thread (the other core is idle then), and the second set's arrays are views into it (:func:`carve`), already
touched.
"""

from __future__ import annotations

import mmap
from collections.abc import Mapping, Sequence

import numpy as np

from qdebug.capture.dequant import DequantSpec
from qdebug.capture.kernels.reference import ReductionPlan
from qdebug.capture.segmented import tensor_elements

__all__ = ["ALIGN", "carve", "estimate_bytes", "touched"]

#: Each array starts on a multiple of this many bytes (a cache line; what ORT's own allocator aligns to).
ALIGN = 64


def _padded(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def estimate_bytes(plan: ReductionPlan, weight: Mapping[str, int], q_specs: Mapping[str, DequantSpec]) -> int | None:
    """One sample's exposed bytes, both models, each array padded to :data:`ALIGN`, estimated from shape inference
    (:func:`~qdebug.capture.segmented.exposed_bytes`'s ``weight``): the float tensors, the quantized model's
    pre-Q/DQ values, and its post-Q/DQ values or, where the run computes them (``q_specs``), their integers.
    ``None`` when a tensor of the plan has no estimate. Exact when every shape is static; ``weight`` counts a tensor
    without a static size at the mean size, which only leaves the end of the buffer unused."""
    elements = tensor_elements(weight, plan)
    f_bytes: dict[str, float] = {}
    q_bytes: dict[str, float] = {}  # keyed apart: a pre-Q/DQ tensor may have its float tensor's name
    for a in plan.pairing.activations:
        e = elements.get(a.tensor_name)
        if e is None:
            return None
        f_bytes[a.tensor_name] = 4 * e
        if a.quantized:
            q_bytes[a.pre_qdq] = 4 * e
        spec = q_specs.get(a.post_qdq)
        if spec is not None:
            q_bytes[spec.ints] = e * spec.dtype.itemsize
        else:
            q_bytes[a.post_qdq] = 4 * e
    for o in plan.pairing.outputs:
        e = elements.get(o.output_name)
        if e is None:
            return None
        f_bytes[o.output_name] = q_bytes[o.quant_name] = 4 * e
    return sum(_padded(int(b)) for b in (*f_bytes.values(), *q_bytes.values()))


def touched(nbytes: int) -> np.ndarray:
    """A new zeroed buffer of ``nbytes`` whose pages are all in memory already.

    On Linux the kernel maps them in one call (``MAP_POPULATE``; CPython lets go of the GIL around it), which takes
    the same time every time, where touching an ``np.empty`` buffer varies with whether the kernel finds huge pages
    for it. Elsewhere: an ``np.empty`` buffer, touched by ``copyto``."""
    flags = getattr(mmap, "MAP_POPULATE", 0)
    if flags and nbytes > 0:
        mapped = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | flags)
        return np.frombuffer(mapped, np.uint8)  # the array keeps the mapping alive; unmapped when the last view goes
    buffer = np.empty(nbytes, np.uint8)
    np.copyto(buffer, 0)
    return buffer


def carve(buffer: np.ndarray, like: Sequence[np.ndarray]) -> list[np.ndarray] | None:
    """Arrays of ``like``'s shapes and types, contiguous views into ``buffer`` one after the other (each aligned to
    :data:`ALIGN`); ``None`` when they do not fit (the estimate was short: the caller makes new arrays)."""
    if sum(_padded(v.nbytes) for v in like) > buffer.nbytes:
        return None
    out, offset = [], 0
    for v in like:
        out.append(buffer[offset : offset + v.nbytes].view(v.dtype).reshape(v.shape))
        offset += _padded(v.nbytes)
    return out
