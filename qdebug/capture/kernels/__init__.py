"""Reduction kernels: every way of turning paired tensors into the sums of docs/metrics.md — the reference
definition (:mod:`.reference`), batched numpy (:mod:`.batched`), C (:mod:`.c_kernel`), numba (:mod:`.numba_kernel`)
and in-graph ONNX (:mod:`.ingraph`) — each behind one :class:`~.base.Reducer` face, registered by name
(:func:`~.base.get_reducer`)."""
