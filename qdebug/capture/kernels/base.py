"""The face every reduction kernel shows: a :class:`Reducer` turns the fetched tensors of some samples into each
sample's :class:`~qdebug.capture.base.SampleSums`, by the definition of
:func:`~qdebug.capture.kernels.reference.reduce_sample` (docs/metrics.md), registered by name.

The capture's runs call the kernels through their own entry points (``reference.reduce_sample``,
``batched.reduce_batch``, ``c_kernel.load()``, the numba functions, ``ingraph.build``); a :class:`Reducer` is the one
way to call *any* of them on the same input, which is how ``tests/test_reducer.py`` checks every kernel against the
reference on the same cases. A new kernel is one module that registers its reducer (:func:`register_reducer`) and
its line in :data:`KERNEL_MODULES`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np

from qdebug.capture.base import SampleSums
from qdebug.capture.kernels.reference import ReductionPlan, reduce_sample

__all__ = [
    "KERNEL_MODULES",
    "KernelUnavailableError",
    "Reducer",
    "ReferenceReducer",
    "Samples",
    "get_reducer",
    "reducer_names",
    "register_reducer",
]

#: One sample's fetched tensors by name: the float model's, and the quantized model's (a
#: :class:`~qdebug.capture.dequant.Dequantized` when post-Q/DQ tensors are given as their integers).
Samples = Sequence[tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]]]


class KernelUnavailableError(RuntimeError):
    """A kernel cannot run on this machine (no C compiler, numba missing); the message says why."""


class Reducer(Protocol):
    """One reduction kernel, called on whole samples."""

    name: str

    def reduce(self, plan: ReductionPlan, samples: Samples) -> list[SampleSums]:
        """Each sample's sums of every pair of ``plan`` (the samples have the same shapes: a batch), equal to
        :func:`~qdebug.capture.kernels.reference.reduce_sample` on each to float64 rounding — non-finite counts,
        statuses and errors included (a kernel that cannot count NaN/Inf hands those pairs to the reference)."""
        ...


#: Reducer factories by name; a factory raises :class:`KernelUnavailableError` when its kernel cannot run here.
_REDUCERS: dict[str, Callable[[], Reducer]] = {}


def register_reducer(name: str, factory: Callable[[], Reducer]) -> None:
    """Register a kernel's reducer factory under ``name`` (a name registered twice is an error)."""
    if name in _REDUCERS:
        raise ValueError(f"reducer {name!r} is already registered")
    _REDUCERS[name] = factory


#: The built-in reducers by name, and the module of :mod:`qdebug.capture.kernels` that registers each, imported on
#: first look-up (numba's import alone costs a process seconds and memory, so nothing is imported before a reducer
#: is asked for). A new kernel is one module that calls :func:`register_reducer`, and its line here.
KERNEL_MODULES = {
    "reference": "base",
    "batched": "batched",
    "c-batched": "batched",
    "numba-batched": "batched",
    "c": "c_kernel",
    "numba": "numba_kernel",
    "ingraph": "ingraph",
}


def reducer_names() -> tuple[str, ...]:
    """Every reducer's name: the built-in kernels' and any registered since."""
    return tuple(dict.fromkeys([*KERNEL_MODULES, *_REDUCERS]))


def get_reducer(name: str) -> Reducer:
    """The reducer registered as ``name`` (its module imported first); :class:`KernelUnavailableError` when its kernel
    cannot run on this machine, :class:`KeyError` for an unknown name."""
    if name not in _REDUCERS and name in KERNEL_MODULES:
        try:
            importlib.import_module(f"qdebug.capture.kernels.{KERNEL_MODULES[name]}")
        except ImportError as exc:  # numba is the optional ``fast`` extra
            raise KernelUnavailableError(f"{name}: {exc} (pip install 'qdebug[fast]')") from exc
    if name not in _REDUCERS:
        raise KeyError(f"no reducer {name!r}; registered: {', '.join(reducer_names())}")
    return _REDUCERS[name]()


class ReferenceReducer:
    """The definition itself: :func:`~qdebug.capture.kernels.reference.reduce_sample` on each sample."""

    name = "reference"

    def reduce(self, plan: ReductionPlan, samples: Samples) -> list[SampleSums]:
        """See :class:`Reducer`."""
        return [reduce_sample(plan, f, q) for f, q in samples]


register_reducer("reference", ReferenceReducer)
