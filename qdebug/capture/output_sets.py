"""The two sets of bound outputs a pipelined fetch run alternates between (:class:`OutputSets`, a part of
:class:`~qdebug.capture.fetch.FetchRun`): sample ``i + 1`` is inferred into one set while sample ``i`` is reduced
from the other, so the sample being reduced and the one being inferred never share an array. Each set is bound
before its first run — to the arrays of the last plain run once that sample is reduced, else to new arrays carved
from a buffer the worker populated during sample 0 (:mod:`qdebug.capture.arena`) — so no sample pays for a plain
run, a re-binding or new pages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from qdebug.capture.arena import carve
from qdebug.capture.batching import InputKey, input_key
from qdebug.capture.bound import BoundFetch
from qdebug.capture.pipelined import Pipelining
from qdebug.capture.tuning import CaptureTuning

__all__ = ["OutputSets"]

Plain = tuple[int, InputKey, list[np.ndarray], list[np.ndarray]]


class OutputSets:
    """How a fetch run's sets of bound outputs (:attr:`fetches`, by sample parity) are made and first bound; the run
    owns the state below, its :class:`~qdebug.capture.pipelined.Pipelining` the worker thread and what runs on it."""

    tuning: CaptureTuning
    #: two sets (float, quantized session) of bound outputs
    fetches: tuple[tuple[BoundFetch, BoundFetch], ...]
    #: the last plain (fresh) single-sample inference's index, input key and values: what a set of bound outputs
    #: that has not run yet is bound to (:meth:`_prime`)
    _plain: Plain | None
    _adopted: bool  # whether a set of bound outputs has taken the arrays of :attr:`_plain`
    _reduced: int  # the last sample whose reduction has ended (one sample per call)
    #: the worker, the set being made on it (:meth:`_prepare_set`) and the buffer it touched during sample 0
    #: (``None``: the run does not pipeline)
    pipeline: Pipelining | None
    sample_bytes: int | None

    @property
    def fresh(self) -> bool:
        """Whether each inference returns new arrays (no set of bound outputs is used)."""
        raise NotImplementedError

    @property
    def pipelining(self) -> bool:
        """Whether the next sample is inferred while this one is reduced."""
        raise NotImplementedError

    def _prepare_set(self, index: int) -> None:
        """Sample ``index`` ran plain and the run pipelines one sample per call from here: make the arrays of the
        set of bound outputs that sample ``index`` + 2 will use, and bind them, on the worker thread while this
        thread reduces sample ``index`` — the core is idle then, and their page faults and bindings would otherwise
        be sample 1's. Sample ``index`` + 1 takes sample ``index``'s own arrays once it is reduced (:meth:`_prime`)."""
        plain, pipe = self._plain, self.pipeline
        if self.fresh or not self.pipelining or plain is None or plain[0] != index:
            return
        if pipe is None or pipe.prep is not None:
            return
        if pipe.pending is not None:  # sample index + 1 is on the worker: index + 2 takes sample index's arrays
            return
        if (self.sample_bytes or 0) > self.tuning.prep_bytes:
            return
        which = index % 2
        if any(f.binding is not None for f in self.fetches[which]):
            return
        pipe.prep = (which, pipe.worker().submit(self._fill_set, self.fetches[which], plain))

    def _fill_set(self, fetches: tuple[BoundFetch, BoundFetch], plain: tuple[int, InputKey, Any, Any]) -> None:
        """New arrays of the plain run's shapes, bound: views of the buffer populated during sample 0 when there is
        one, else new ones touched here (zeroed: ``copyto`` lets go of the GIL)."""
        _, key, f_vals, q_vals = plain
        f_new, q_new, was_touched = self._new_set(f_vals, q_vals)
        for fetch, arrays in zip(fetches, (f_new, q_new), strict=True):
            if not was_touched:
                for a in arrays:
                    np.copyto(a, 0)
            fetch.adopt(arrays, key)

    def _new_set(
        self, f_vals: Sequence[np.ndarray], q_vals: Sequence[np.ndarray]
    ) -> tuple[list[np.ndarray], list[np.ndarray], bool]:
        """New arrays like a sample's values for a set of bound outputs, and whether they are touched already: views
        into the buffer the worker touched during sample 0 (:mod:`qdebug.capture.arena`) the first time, if they fit,
        else ``empty_like``. Called on either thread: ``pop()`` hands the buffer to one set only."""
        buffer = self.pipeline.take_arena() if self.pipeline is not None else None
        carved = carve(buffer, [*f_vals, *q_vals]) if buffer is not None else None
        if carved is None:
            return [np.empty_like(v) for v in f_vals], [np.empty_like(v) for v in q_vals], False
        return carved[: len(f_vals)], carved[len(f_vals) :], True

    def _prime(self, fetches: tuple[BoundFetch, BoundFetch], index: int, sample: Mapping[str, np.ndarray]) -> None:
        """A set of bound outputs about to run for the first time: bound at once — its first run is then a bound
        one, a plain run and a re-binding saved — to
        the arrays of the last plain run when that sample has been reduced (the compiled pass's call table of that
        sample then still fits; on the worker thread, a reduction that ends meanwhile is not seen: new arrays), else
        to new arrays of their shapes; with no plain run (one sample per call from the start: the other set bound
        itself on sample 0), to views of the touched buffer (:meth:`_new_set`) shaped like the other set's."""
        key = input_key(sample)
        if all(f.binding is not None for f in fetches):
            self._drop_spares()
            return
        plain = self._plain
        if plain is not None and plain[1] == key:
            done, _, f_vals, q_vals = plain
            if self._adopted or self._reduced < done:
                f_vals, q_vals, _ = self._new_set(f_vals, q_vals)
            else:
                self._adopted = True
        elif plain is None and self.pipeline and self.pipeline.arenas and (like := self._bound_like(key)) is not None:
            f_vals, q_vals, fits = self._new_set(*like)
            if not fits:  # did not fit: its first run is a plain one, which binds it
                return
        else:
            return
        for fetch, values in zip(fetches, (f_vals, q_vals), strict=True):
            fetch.adopt(values, key)
        self._drop_spares()

    def _bind_plain_early(self, current: int) -> None:
        """Bind the set sample ``current`` + 2 will use to sample ``current``'s own arrays (its plain run's) now,
        while the worker infers sample ``current`` + 1: binding only records where the arrays are, and the worker
        writes into them only once sample ``current`` is reduced — sample ``current`` + 2 is submitted after. Done
        later, these bindings would fall between the worker's first two samples."""
        plain, fetches = self._plain, self.fetches[current % 2]
        if self.fresh or plain is None or plain[0] != current or self._adopted:
            return
        if any(f.binding is not None for f in fetches):
            return
        _, key, f_vals, q_vals = plain
        for fetch, values in zip(fetches, (f_vals, q_vals), strict=True):
            fetch.adopt(values, key)
        self._adopted = True
        self._drop_spares()

    def _bound_like(self, key: InputKey) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
        """The arrays of a set of bound outputs bound for samples of input shapes ``key``, if one is."""
        for f, q in self.fetches:
            if f.binding is not None and q.binding is not None and f.key == key and q.key == key:
                return f.values, q.values
        return None

    def _drop_spares(self) -> None:
        """Once every set of bound outputs is bound: sample 0's plain arrays and an unused buffer are not kept for
        nothing."""
        if self._all_bound():
            self._plain = None
            if self.pipeline is not None:
                self.pipeline.arenas.clear()

    def _all_bound(self) -> bool:
        """Whether every set of bound outputs the run uses (both when pipelining, else the first) is bound."""
        sets = self.fetches if self.pipelining else self.fetches[:1]
        return all(f.binding is not None for pair in sets for f in pair)
