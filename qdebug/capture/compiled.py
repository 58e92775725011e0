"""The ``compiled`` reduction: the ``fetch`` backend's run, with each sample reduced by one compiled pass per
activation instead of :func:`~qdebug.capture.kernels.reference.reduce_sample`'s several numpy passes and
allocations per tensor.

Same definition, same sums to float64 rounding (the kernel accumulates every product in float64; the numpy
reference multiplies in float32 and accumulates blocks in float64: they agree to ~1e-7 relative, tested), same
non-finite counts. It pays where the reduction dominates a sample: models that do little arithmetic per exposed
element (docs/benchmarks.md).

Two implementations of the same kernels, one chosen per process (:func:`implementation`):

* **C** (:mod:`qdebug.capture.kernels.c_kernel`), built with the machine's C compiler the first time it is needed
  (once per machine) and then loaded in a millisecond: :func:`ready` once built, and ``auto`` reduces with it from
  the first sample;
* **numba** (:mod:`qdebug.capture.kernels.numba_kernel`, the ``fast`` extra) where there is no C compiler: its
  import costs time and memory in every process, so ``auto`` switches to it only when the numpy reduction of the
  remaining samples is expected to cost more than that (:mod:`qdebug.capture.auto`).

Tensors that are not float32/float64 (float16 models) are reduced by the numpy reference.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import threading
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from qdebug._lazy import require
from qdebug.capture.base import ModelPair, OpenOptions, SampleSums
from qdebug.capture.dequant import Dequantized
from qdebug.capture.kernels import c_kernel
from qdebug.capture.kernels.reference import (
    ReductionPlan,
    bounds_or_inf,
    check_shapes,
    reduce_sample,
)
from qdebug.capture.kernels.rows import rows_to_sums
from qdebug.errors import MissingExtraError

__all__ = [
    "CachedReducer",
    "CompiledBackend",
    "CompiledReducer",
    "WarmUp",
    "available",
    "implementation",
    "kernel",
    "ready",
    "reduce_sample_compiled",
    "startup_s",
]

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
LANES_PLUS_ONE = 17  # a warm-up tensor that runs the kernel's lanes and its tail


@functools.cache
def _load() -> Any:
    """The kernels: the C library (built first if needed), else numba's module; without either a
    :class:`~qdebug.errors.MissingExtraError` naming the ``fast`` extra, and what the C build said."""
    try:
        return c_kernel.load()
    except c_kernel.BuildError as exc:
        why = str(exc)
    if importlib.util.find_spec("numba") is None:
        raise MissingExtraError("numba", "fast", f"Without a C kernel ({why}), the compiled reduction")
    require("numba")
    return importlib.import_module("qdebug.capture.kernels.numba_kernel")


def ready() -> bool:
    """Whether the C kernel is built for this machine: it then loads in milliseconds and costs no start-up."""
    return c_kernel.built() is not None


def startup_s(unbuilt: float) -> float:
    """What loading the compiled reduction costs this process: nothing once the C kernel is built, else ``unbuilt``
    (:attr:`~qdebug.capture.tuning.CaptureTuning.compiled_startup_s`: the first build, or numba's import)."""
    return 0.0 if ready() else unbuilt


def implementation() -> str:
    """Which kernels :func:`kernel` gives: ``"C"`` or ``"numba"`` (loads them)."""
    return "numba" if isinstance(_load(), ModuleType) else "C"


def kernel() -> Any:
    """The loaded kernels (after :func:`warm_up`; loads them otherwise): the C library or numba's module, called
    alike."""
    return _load()


def warm_up() -> None:
    """Load the kernels (the first time on a machine, build the C library, or compile numba's kernels) and run them
    once on the types a run uses first."""
    k = _load()
    x, row = np.zeros(LANES_PLUS_ONE, np.float32), np.zeros(k.SLOTS)
    k.activation_sums(x, x, x, -np.inf, np.inf, -np.inf, np.inf, True, row)
    for dtype in (np.uint8, np.int8):  # the integers of 8-bit post-Q/DQ tensors (qdebug.capture.dequant)
        k.dequant_sums(x, x, np.zeros(LANES_PLUS_ONE, dtype), 1.0, 0, -np.inf, np.inf, -np.inf, np.inf, row)
    x3 = np.zeros((1, 2, LANES_PLUS_ONE), np.float32)  # a batch's views (qdebug.capture.kernels.batched)
    k.batch_activation_sums(x3, x3, x3, -np.inf, np.inf, -np.inf, np.inf, True, np.zeros((2, k.SLOTS)))


class WarmUp(threading.Thread):
    """:func:`warm_up` on a background thread; :attr:`error` says why it failed (no C compiler and no numba, a
    numba that cannot load), so that the caller keeps the numpy reduction with that reason instead of a traceback
    on stderr."""

    def __init__(self) -> None:
        super().__init__(name="qdebug-kernel-warm-up", daemon=True)
        self.error: str | None = None

    def run(self) -> None:
        """Warm up, recording the failure."""
        try:
            warm_up()
        except Exception as exc:  # a build or numba's import can fail in many ways (e.g. a numpy numba does not take)
            self.error = f"{type(exc).__name__}: {exc}".splitlines()[0]


def start_warm_up() -> WarmUp | None:
    """A started :class:`WarmUp` (``None`` when no compiled reduction can be had): ``auto`` starts it with its
    sessions, so that a first build or numba's import overlaps their set-up and the first sample instead of delaying
    the second one."""
    if not available():
        return None
    thread = WarmUp()
    thread.start()
    return thread


def available() -> bool:
    """Whether a compiled reduction can be had: the C kernel built or a C compiler to build it, or numba
    importable (without building or importing anything)."""
    has_numba = importlib.util.find_spec("numba") is not None
    return c_kernel.built() is not None or c_kernel.compiler() is not None or has_numba


class CompiledReducer:
    """:func:`~qdebug.capture.kernels.reference.reduce_sample`, computed by the compiled kernel (same errors); called as
    ``reducer(plan, f, q)``. :data:`reduce_sample_compiled` is the stateless one; :meth:`cached` gives one for a
    single run that reuses its kernel call tables from sample to sample.

    An activation whose sums come out non-finite (NaN/Inf in a tensor) or whose range is not finite is redone by
    the reference, which counts the non-finite values exactly. Activations are reduced on one thread: large
    samples' reductions are bound by memory, not arithmetic.
    """

    def __call__(self, plan: ReductionPlan, f: Mapping[str, np.ndarray], q: Mapping[str, np.ndarray]) -> SampleSums:
        """One sample's sums."""
        prepared = _prepare(plan, f, q)
        if prepared is None:
            return reduce_sample(plan, f, q)  # float16 (or mixed) tensors: the reference handles every dtype
        return _finish(plan, f, q, prepared)

    def cached(self) -> CachedReducer:
        """A reducer for one whole-model run, whose tensors are mostly the same (bound) arrays every sample."""
        return CachedReducer()


class CachedReducer(CompiledReducer):
    """A :class:`CompiledReducer` that keeps each plan's last two kernel call tables (a pipelined run alternates
    two sets of bound outputs) and the arrays they point into: a sample whose tensors are mostly those arrays —
    ONNX Runtime wrote into them again — only re-points the few that are new (the sample's own inputs), instead of
    a few microseconds of Python per activation.

    It keeps those arrays alive until they are replaced, so it is for runs whose tensors stay alive anyway (a
    whole-model run's bound outputs), not for segments (each one's tensors are let go when it is reduced)."""

    #: Samples in a row with no kept table usable after which a plan's tables are no longer kept: a run's first
    #: samples fill both sets of bound outputs one plain run at a time, and a session that keeps
    #: returning new arrays (binding failed) would otherwise have two samples' tensors held alive for nothing.
    MISSES = 4

    def __init__(self) -> None:
        self._kept: dict[int, list[_Prepared]] = {}
        self._misses: dict[int, int] = {}  # samples in a row no kept table was usable, per plan

    def __call__(self, plan: ReductionPlan, f: Mapping[str, np.ndarray], q: Mapping[str, np.ndarray]) -> SampleSums:
        """One sample's sums, from a kept call table where this sample's tensors allow."""
        key = id(plan)
        kept = self._kept.setdefault(key, [])
        for prepared in kept:
            if prepared.plan is plan and prepared.reuse(f, q):
                kept.remove(prepared)  # last: a pipelined run's next sample is in the other set of bound outputs
                kept.append(prepared)
                self._misses[key] = 0
                return _finish(plan, f, q, prepared)
        misses = self._misses[key] = self._misses.get(key, 0) + 1
        if misses >= self.MISSES:
            kept.clear()
        made = _prepare(plan, f, q)
        if made is None:
            return reduce_sample(plan, f, q)
        if made.names is not None and made.table is not None and misses < self.MISSES:
            kept.insert(0, made)  # first: the oldest goes
            del kept[2:]
        return _finish(plan, f, q, made)

    def keeps(self, plan: ReductionPlan) -> int:
        """How many call tables are kept for ``plan`` (0 once its tensors have been new arrays too often)."""
        return len(self._kept.get(id(plan), []))


class _Prepared:
    """One sample's kernel call: the activations' arguments (``calls``; a
    :class:`~qdebug.capture.kernels.c_kernel.CallTable`
    too with the C kernels), their sizes, which are quantized, and where each tensor was read (``names``: the
    reference's in ``f``, the other two in the quantized model's fetched values; ``None`` when one was computed)."""

    def __init__(
        self, plan: ReductionPlan, calls: list[Call], names: tuple[list[str], list[str], list[str]] | None, specs: Any
    ) -> None:
        self.plan, self.calls, self.names, self.specs = plan, calls, names, specs
        self.sizes = np.array([c[0].size for c in calls], dtype=np.int64)
        self.quant = [j for j, a in enumerate(plan.pairing.activations) if a.quantized]
        self.table = c_kernel.CallTable(calls) if isinstance(_load(), c_kernel.CKernels) else None

    def reuse(self, f: Mapping[str, np.ndarray], q: Mapping[str, np.ndarray]) -> bool:
        """Point the table at this sample's tensors; ``False`` (nothing usable) when more than half of them are
        new arrays, one is missing, or one differs in dtype, shape or layout from the one it replaces."""
        table, names = self.table, self.names
        if table is None or names is None:
            return False
        fetched = q.fetched if isinstance(q, Dequantized) else q
        if (q.specs if isinstance(q, Dequantized) else None) is not self.specs:
            return False
        try:
            columns = ([f[n] for n in names[0]], [fetched[n] for n in names[1]], [fetched[n] for n in names[2]])
        except KeyError:
            return False
        kept = table.kept
        new = [(j, at, a) for at, col in enumerate(columns) for j, a in enumerate(col) if a is not kept[j][at]]
        if 2 * len(new) > 3 * len(kept):
            return False
        if not all(table.repoint(j, at, a) for j, at, a in new):
            self.table = None  # partly re-pointed: unusable (a new one is made)
            return False
        for o in self.plan.pairing.outputs:  # activations keep their shapes; outputs are checked every sample
            if f[o.output_name].shape != q[o.quant_name].shape:
                check_shapes(self.plan, f, q)
        return True


def _prepare(plan: ReductionPlan, f: Mapping[str, np.ndarray], q: Mapping[str, np.ndarray]) -> _Prepared | None:
    """The kernel call for one sample (``None``: tensors the kernels do not take, e.g. float16)."""
    check_shapes(plan, f, q)
    acts = plan.pairing.activations
    ints = {a.post_qdq: q.ints(a.post_qdq) for a in acts} if isinstance(q, Dequantized) else {}
    arrays = [(f[a.tensor_name], q[a.pre_qdq] if a.quantized else None, _post(q, a.post_qdq, ints)) for a in acts]
    if not all(r.dtype in _FLOATS and p.dtype == r.dtype and (x is None or x.dtype == r.dtype) for r, x, p in arrays):
        return None
    calls: list[Call] = []
    names: tuple[list[str], list[str], list[str]] = ([], [], [])
    for a, (ref, pre, post) in zip(acts, arrays, strict=True):
        bounds = (*bounds_or_inf(a.measured_through), *bounds_or_inf(a.fused_activation))
        found = ints.get(a.post_qdq)
        if found is not None and pre is not None:  # the post-Q/DQ values computed from the integers
            values, spec = found
            calls.append((ref, pre, values, spec.scale, spec.zero_point, bounds, True))
            read = (a.tensor_name, a.pre_qdq, spec.ints)
        else:  # with integers but no pre-Q/DQ tensor to compare with: the post-Q/DQ values themselves
            value = post if found is None else q[a.post_qdq]
            calls.append((ref, value if pre is None else pre, value, 1.0, 0, bounds, pre is not None))
            read = (a.tensor_name, a.post_qdq if pre is None else a.pre_qdq, a.post_qdq)
        for column, name in zip(names, read, strict=True):
            column.append(name)
    fetched = q.fetched if isinstance(q, Dequantized) else q
    readable = all(n in fetched for n in names[1] + names[2])  # else one was computed this sample: not re-read
    return _Prepared(plan, calls, names if readable else None, q.specs if isinstance(q, Dequantized) else None)


def _finish(
    plan: ReductionPlan, f: Mapping[str, np.ndarray], q: Mapping[str, np.ndarray], prepared: _Prepared
) -> SampleSums:
    """Run the prepared call and make the sums (non-finite ones redone by the reference)."""
    k = _load()
    rows = np.zeros((len(prepared.calls), k.SLOTS))
    if prepared.table is not None:
        k.run(prepared.table, rows)
    else:
        _call_kernel(k, prepared.calls, rows)
    return rows_to_sums(k, plan, rows, f, q, (prepared.sizes, prepared.quant))


#: The stateless compiled reducer (a :class:`~qdebug.capture.fetch.FetchRun` uses its
#: :meth:`~CompiledReducer.cached` one for the whole-model path).
reduce_sample_compiled = CompiledReducer()


#: One activation's kernel call: reference, pre-Q/DQ, post-Q/DQ (or its integers), scale and zero point of those
#: integers, the four clip bounds (measured-through, fused activation), and whether the local comparison is made.
Call = tuple[np.ndarray, np.ndarray, np.ndarray, float, int, tuple[float, float, float, float], bool]


def _call_kernel(k: Any, calls: Sequence[Call], rows: np.ndarray) -> None:
    """Every activation's row: one call of the C kernels for the whole sample (their per-call cost is what a
    sample of hundreds of small tensors is made of), or one numba call per activation."""
    bulk = getattr(k, "activations", None)
    if bulk is not None:
        bulk(calls, rows)
        return
    for j, (ref, pre, post, scale, zero_point, bounds, local) in enumerate(calls):
        r, x, p = ref.reshape(-1), pre.reshape(-1), post.reshape(-1)
        if p.dtype.kind in "iu":
            k.dequant_sums(r, x, p, scale, zero_point, *bounds, rows[j])
        else:
            k.activation_sums(r, x, p, *bounds, local, rows[j])


def _post(q: Mapping[str, np.ndarray], name: str, ints: Mapping[str, Any]) -> np.ndarray:
    """A post-Q/DQ tensor, or, when it is to be computed from its integers, a float32 stand-in of its shape (no
    memory: only its dtype and size are read)."""
    found = ints.get(name)
    if found is None:
        return q[name]
    return np.broadcast_to(np.float32(0), found[0].shape)


class CompiledBackend:
    """The fetch run with the compiled reduction (``--capture compiled``; the C kernel, else the ``fast`` extra)."""

    name = "compiled"

    def open(self, pair: ModelPair, options: OpenOptions) -> Any:
        """A fetch run (:func:`~qdebug.capture.compose.open_fetch_run`) that reduces with
        :func:`reduce_sample_compiled`."""
        from qdebug.capture.compose import fetch_layout, open_fetch_run

        kernel = _load()  # the missing extra is reported before any session is built
        return open_fetch_run(
            pair,
            options,
            fetch_layout(pair, options, dequant=True),
            batch=options.batch or 1,
            reducer=reduce_sample_compiled,
            batch_kernel=kernel,
            dequant_whole=True,
            name=self.name,
        )
