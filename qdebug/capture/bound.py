"""What a fetch run (:mod:`qdebug.capture.fetch`) holds a sample's tensors in: :class:`BoundFetch`, one session's
outputs written into the previous sample's arrays (I/O binding) instead of fresh ones — fresh pages cost the
kernel's zeroing and faults on every sample, and arrays that stay the same let the compiled pass keep its call
tables — and :class:`Batch`, one batched inference call's tensors until its samples are reduced.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from qdebug.capture.base import SampleSums
from qdebug.capture.batching import InputKey, Shapes, input_key
from qdebug.capture.dequant import Dequantized, DequantSpec
from qdebug.capture.kernels.batched import BatchTensors
from qdebug.capture.kernels.reference import ReductionPlan
from qdebug.ort import ort_errors

__all__ = ["Batch", "BoundFetch", "Ready", "Reducer", "Values", "batch_tensors"]


class BoundFetch:
    """Runs one session for ``names`` and returns their values, reusing the previous sample's output arrays when
    the input shapes are the same. The arrays are overwritten by the next :meth:`run`: use them before."""

    def __init__(self, sess: Any, names: Sequence[str]) -> None:
        self.sess, self.names = sess, list(names)
        self.inputs = {i.name for i in sess.get_inputs()}
        self.errors = ort_errors()
        self.key: tuple[tuple[str, tuple[int, ...], str], ...] | None = None
        self.binding: Any = None
        self.values: list[np.ndarray] = []
        self.usable = True  # False once a bound run failed where a plain one worked: stop trying

    def run(self, sample: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The values of :attr:`names` for ``sample`` (ORT's exceptions propagate from the plain run)."""
        key = input_key(sample)
        if self.binding is not None and key == self.key:
            try:
                for k, v in sample.items():
                    self.binding.bind_cpu_input(k, v)
                self.sess.run_with_iobinding(self.binding)
                # a graph input exposed as an output is the sample's own array
                return [sample[n] if n in self.inputs else v for n, v in zip(self.names, self.values, strict=True)]
            except self.errors:  # e.g. a data-dependent shape changed: the plain run says what is wrong, if anything
                self.usable = False
        values = list(self.sess.run(self.names, dict(sample)))
        self._bind(values, key)
        return values

    def adopt(self, values: Sequence[np.ndarray], key: InputKey) -> None:
        """Bind to ``values`` — arrays of :attr:`names` for samples of input shapes ``key`` (:func:`input_key`) that
        nobody needs any more — so that the next run of such a sample is already a bound one (no plain run first)."""
        if self.binding is None and self.usable:
            self._bind(list(values), key)

    def _bind(self, values: list[np.ndarray], key: tuple[tuple[str, tuple[int, ...], str], ...]) -> None:
        """Bind every output to the array ORT just returned (numeric, contiguous, non-empty ones only)."""
        self.binding, self.key, self.values = None, None, []
        if not self.usable or not all(v.dtype.kind in "fiub" and v.flags.c_contiguous and v.size for v in values):
            return  # strings or empty tensors: keep the plain run
        binding = self.sess.io_binding()
        for name, v in zip(self.names, values, strict=True):
            if name not in self.inputs:
                binding.bind_output(name, "cpu", 0, v.dtype, list(v.shape), v.ctypes.data)
        self.binding, self.key, self.values = binding, key, values


Values = tuple[list[np.ndarray], list[np.ndarray]]  # one sample's float and quantized tensors, in plan order
Reducer = Callable[[ReductionPlan, Mapping[str, np.ndarray], Mapping[str, np.ndarray]], SampleSums]


class Batch:
    """One batched inference call's tensors (:class:`~qdebug.capture.kernels.batched.BatchTensors` of both models) until
    the first of its samples is reduced; then every sample's sums (the batch is reduced at once, and its tensors are
    let go: they would otherwise stay alive beside the next batch until its last sample is taken)."""

    def __init__(self, indices: Sequence[int], f: BatchTensors, q: BatchTensors) -> None:
        self.indices = list(indices)
        self.tensors: tuple[BatchTensors, BatchTensors] | None = (f, q)
        self.sums: list[SampleSums] | None = None

    def values(self, k: int, names: tuple[Sequence[str], Sequence[str]]) -> Values:
        """Its ``k``-th sample's tensors of ``names`` (the float and the quantized model's exposed names, in fetch
        order; views, before the batch is reduced)."""
        assert self.tensors is not None
        f, q = self.tensors
        return [f.sample(n, k) for n in names[0]], [q.sample(n, k) for n in names[1]]


Ready = Values | tuple[Batch, int]  # a sample's tensors, or its place in a batch


def batch_tensors(
    names: Sequence[str],
    views: Sequence[np.ndarray],
    shapes: Shapes,
    n: int,
    specs: Mapping[str, DequantSpec] | None = None,
) -> BatchTensors:
    """A model's batch views and one-sample shapes, by name; with ``specs``, the post-Q/DQ tensors they compute
    from exposed integers too (on first access; the compiled batch kernel reads the integers)."""
    by_name: Mapping[str, np.ndarray] = dict(zip(names, views, strict=True))
    alone = dict(zip(names, shapes, strict=True))
    if specs:
        by_name = Dequantized(by_name, specs)
        alone |= {post: alone[spec.ints] for post, spec in specs.items() if spec.ints in alone}
    return BatchTensors(by_name, alone, n)
