"""A pipelined run's second set of bound outputs, carved out of one buffer its worker touched during sample 0
(:mod:`qdebug.capture.arena`): the views are disjoint, aligned and of the right kind, the estimate is one sample's
real size, and the sums are those of a run without it. Real tiny models in ONNX Runtime."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

from qdebug.capture import CaptureTuning, compiled
from qdebug.capture.arena import ALIGN, carve, estimate_bytes, touched
from qdebug.capture.fetch import FetchRun
from qdebug.capture.pipelined import Pipelining
from qdebug.capture.segmented import exposed_bytes
from qdebug.data import open_data
from qdebug.model_io import input_specs
from qdebug.pairing import pair_models


def _root(a: np.ndarray) -> object:
    """The object at the bottom of ``a``'s chain of bases (the buffer a view was carved from)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a.base if a.base is not None else a


def test_carved_views_are_disjoint_aligned_and_of_the_asked_kind() -> None:
    like = [np.ones((3, 5), np.float32), np.ones(7, np.uint8), np.ones((2, 0), np.float32), np.ones(4, np.int64)]
    buffer = touched(4096)
    assert buffer.nbytes == 4096 and not buffer.any() and buffer.flags.writeable
    views = carve(buffer, like)
    assert views is not None
    for v, w in zip(views, like, strict=True):
        assert v.shape == w.shape and v.dtype == w.dtype and v.flags.c_contiguous and v.flags.writeable
        assert (v.ctypes.data % ALIGN == 0 and np.shares_memory(v, buffer)) or v.size == 0
    for k, v in enumerate(views):
        v[...] = k + 1
    assert [float(v.min()) for v in views if v.size] == [1.0, 2.0, 4.0]  # no view wrote into another
    assert carve(touched(64), like) is None  # too small: the caller makes new arrays


def test_the_estimate_is_one_samples_real_exposed_size(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    """With static shapes the estimate from shape inference is exactly what sample 0 exposes (padded), with the
    post-Q/DQ floats or, computed from their integers, those integers."""
    fm, qm = onnx.load(str(tiny_float)), onnx.load(str(tiny_quant("u8")))
    sample = next(iter(open_data(None, input_specs(fm), num_samples=1, seed=1)))
    shapes = {k: tuple(v.shape) for k, v in sample.items()}
    for dequant in (False, True):
        run = FetchRun(fm, qm, pair_models(fm, qm), ["CPUExecutionProvider"], dequant_whole=dequant)
        weight = exposed_bytes(fm, run.plan, shapes)
        assert weight is not None and bool(run.q_specs) is dequant
        f_vals = run.f_sess.run(run.plan.float_names, sample)
        q_vals = run.q_sess.run(run.q_names, sample)
        real = sum(-(-v.nbytes // ALIGN) * ALIGN for v in (*f_vals, *q_vals))
        assert estimate_bytes(run.plan, weight, run.q_specs) == real
        run.close()


@pytest.mark.parametrize("early", [True, False])
def test_the_second_set_is_carved_from_the_buffer_touched_during_sample_0(
    early: bool, tiny_float: Path, tiny_quant: Callable[[str], Path]
) -> None:
    """Sample 1 announced before sample 0 is reduced (it is inferred on the worker into the second set) or after
    (the worker makes sample 2's set while sample 0 is reduced): either way the one set of new arrays is views into
    the touched buffer, the other set is sample 0's own arrays, and the sums equal an unpipelined run's."""
    fm, qm = onnx.load(str(tiny_float)), onnx.load(str(tiny_quant("u8")))
    pairing = pair_models(fm, qm)
    samples = list(open_data(None, input_specs(fm), num_samples=6, seed=4))
    shapes = {k: tuple(v.shape) for k, v in samples[0].items()}
    rows = {}
    for pipelined in (False, True):
        options = {"reducer": compiled.reduce_sample_compiled, "dequant_whole": True, "input_shapes": shapes}
        pipeline = Pipelining(CaptureTuning()) if pipelined else None
        run = FetchRun(fm, qm, pairing, ["CPUExecutionProvider"], pipeline=pipeline, **options)
        # a run that does not pipeline needs no second set
        assert (run.pipeline is not None and run.pipeline.arena_bytes > 0) is pipelined
        got = []
        for i, s in enumerate(samples):
            if i + 1 < len(samples) and (early or i > 0):
                run.prefetch(i + 1, samples[i + 1])
            got.append(run.reduce(i, s))
            if i == 0 and not early:
                run.prefetch(1, samples[1])
        run.close()
        if pipelined:
            roots = [{id(_root(a)) for a in f.values + q.values} for f, q in run.fetches]
            carved = [r for r in roots if len(r) == 1]
            assert len(carved) == 1 and not roots[0] & roots[1]  # one set in one buffer; no array shared
            assert run.pipeline is not None and run.pipeline.arenas == []  # taken, nothing held beside the sets
        rows[pipelined] = np.array([[x.cumulative.noise, x.local.noise] for x in got])
    np.testing.assert_array_equal(rows[True], rows[False])
