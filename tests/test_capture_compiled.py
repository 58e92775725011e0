"""The ``compiled`` reduction (numba, the ``fast`` extra): the same sums as the reference definition on every case
the reference handles — clips, fused activations, NaN/Inf, empty tensors, float32 overflow, float16, sizes that
are not a multiple of the kernel's lanes — chosen by ``auto`` when it pays, named as a missing extra when it would
pay but numba is absent, and obeyed as ``--capture compiled``. numba is part of ``make test``'s install: these
tests fail, not skip, without it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from capture_helpers import Bounds, assert_same_sums, capture_run, plan_of
from hypothesis import given, settings
from hypothesis import strategies as st

from qdebug.capture import CaptureTuning, capture, compiled
from qdebug.capture.auto import AutoRun
from qdebug.capture.base import SampleSums
from qdebug.capture.kernels import c_kernel
from qdebug.capture.kernels.reference import ReductionPlan, reduce_sample
from qdebug.data import open_data
from qdebug.metrics import BatchSums
from qdebug.model_io import input_specs
from qdebug.pairing import pair_models


def _compare(plan: ReductionPlan, f: dict[str, np.ndarray], q: dict[str, np.ndarray]) -> SampleSums:
    want, got = reduce_sample(plan, f, q), compiled.reduce_sample_compiled(plan, f, q)
    assert_same_sums(want.cumulative, got.cumulative)
    assert_same_sums(want.local, got.local)
    assert_same_sums(want.outputs, got.outputs)
    np.testing.assert_array_equal(want.float_min, got.float_min)
    np.testing.assert_array_equal(want.float_max, got.float_max)
    np.testing.assert_array_equal(want.elements, got.elements)
    return got


def _tensors(arrays: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[dict, dict]:
    f = {f"t{i}": r for i, (r, _, _) in enumerate(arrays)} | {"out": arrays[0][0]}
    q = {f"t{i}_pre": p for i, (_, p, _) in enumerate(arrays)}
    q |= {f"t{i}_post": x for i, (_, _, x) in enumerate(arrays)} | {"out_q": arrays[0][2]}
    return f, q


def test_special_values_and_shapes_give_the_reference_sums() -> None:
    rng = np.random.default_rng(0)

    def triple(n: int, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        r = (rng.standard_normal(n) * scale).astype(np.float32)
        return r, r + np.float32(0.01 * scale), np.round(r * 8) / np.float32(8)

    nan, inf = triple(40), triple(33)
    nan[0][3], nan[2][7] = np.nan, np.nan
    inf[0][5], inf[1][1] = np.inf, -np.inf
    big = tuple(a.astype(np.float32) * np.float32(1e25) for a in triple(50))  # float32 squares overflow
    specs: list[tuple[bool, Bounds, Bounds]] = [
        (True, None, None),
        (True, ("Relu", 0.0, np.inf), None),  # fused Relu: the local reference is the clipped pre-Q/DQ tensor
        (True, None, ("Clip", -0.5, 0.5)),  # measured through a Clip
        (True, ("Relu", 0.0, np.inf), ("Clip", 0.0, 6.0)),
        (False, None, None),  # not quantized: cumulative only
        (True, None, None),  # NaN
        (True, None, ("Relu", 0.0, np.inf)),  # ±Inf, the -Inf clipped away
        (True, None, None),  # empty
        (True, None, None),  # overflow
        (True, None, None),  # 1 element (tail only)
    ]
    arrays = [triple(1000), triple(17), triple(64), triple(300, 5.0), triple(8), nan, inf]
    arrays += [tuple(np.zeros(0, np.float32) for _ in range(3)), big, triple(1)]  # type: ignore[list-item]
    got = _compare(plan_of(specs), *_tensors(arrays))  # type: ignore[arg-type]
    assert got.cumulative.nonfinite_reference[5] == 1 and got.local.nonfinite_test[4] == 1  # act 4 is not quantized
    assert np.isfinite(got.cumulative.signal[8])  # redone in float64 like the reference


def test_float16_tensors_are_reduced_by_the_reference() -> None:
    r = np.linspace(-1, 1, 24, dtype=np.float16)
    f, q = _tensors([(r, r, r + np.float16(0.01))])
    _compare(plan_of([(True, None, None)]), f, q)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 70), min_size=1, max_size=6),
    st.integers(0, 2**31 - 1),
    st.sampled_from([None, ("Relu", 0.0, np.inf), ("Clip", -1.0, 1.0)]),
    st.floats(0.0, 0.2),
)
def test_random_tensors_give_the_reference_sums(sizes: list[int], seed: int, mt: Bounds, holes: float) -> None:
    rng = np.random.default_rng(seed)
    arrays = []
    for n in sizes:
        r = rng.standard_normal(n).astype(np.float32)
        p = (r + rng.standard_normal(n).astype(np.float32) * np.float32(0.05)).astype(np.float32)
        x = np.round(p * 16) / np.float32(16)
        for a in (r, p, x):  # sprinkle NaN / ±Inf
            a[rng.random(n) < holes / 3] = rng.choice([np.nan, np.inf, -np.inf])
        arrays.append((r, p, x))
    _compare(plan_of([(True, None, mt) for _ in sizes]), *_tensors(arrays))


def test_the_compiled_backend_matches_the_numpy_one(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    fm, qm = onnx.load(str(tiny_float)), onnx.load(str(tiny_quant("u8")))
    source = open_data(None, input_specs(fm), num_samples=5, seed=2)
    ref = capture(fm, qm, pair_models(fm, qm), source, path="fetch")
    got = capture(fm, qm, pair_models(fm, qm), source, path="compiled")
    assert got.path == "compiled" and got.fallback_samples == 0
    np.testing.assert_allclose(got.per_sample, ref.per_sample, rtol=1e-5)
    assert [s.count for s in got.cumulative] == [s.count for s in ref.cumulative]


def _auto(
    fm: onnx.ModelProto, qm: onnx.ModelProto, n: int, tuning: CaptureTuning | None = None, wait: bool = True
) -> AutoRun:
    """An auto run over ``n`` samples; ``wait``: let numba's background load finish as soon as it starts (after
    sample 3, the last fetch sample ``auto`` weighs it on), so that the switch happens at sample 4 and the test is
    deterministic."""
    run = AutoRun(fm, qm, pair_models(fm, qm), ["CPUExecutionProvider"], n, batch=1, tuning=tuning)
    for i, s in enumerate(open_data(None, input_specs(fm), num_samples=n, seed=3)):
        assert isinstance(run.reduce(i, s), SampleSums)
        if wait and run.warm_up is not None:
            run.warm_up.join()
    run.close()
    return run


def test_auto_switches_when_the_reduction_would_cost_more_than_the_start_up(
    tiny_float: Path, tiny_quant: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    fm, qm = onnx.load(str(tiny_float)), onnx.load(str(tiny_quant("u8")))
    monkeypatch.setattr(compiled, "ready", lambda: False)  # as before the first build, or with numba
    run = _auto(fm, qm, 6, CaptureTuning(compiled_startup_s=-1.0))  # any run pays it back
    assert run.final().backend == "compiled" and "the compiled pass saves est." in run.final().reason
    assert f"from sample 4, once the {compiled.implementation()} kernel had loaded" in run.final().reason
    assert run.fetch.reducer is compiled.reduce_sample_compiled and run.graph is None
    run = _auto(fm, qm, 6, CaptureTuning(compiled_startup_s=1e9))  # never pays: the fetch choice, no word of numba
    assert run.final().backend == "fetch" and "qdebug[fast]" not in run.final().reason


def test_without_numba_auto_says_what_it_would_save(
    tiny_float: Path, tiny_quant: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    fm, qm = onnx.load(str(tiny_float)), onnx.load(str(tiny_quant("u8")))
    monkeypatch.setattr(compiled, "ready", lambda: False)
    monkeypatch.setattr(compiled, "available", lambda: False)
    run = _auto(fm, qm, 6, CaptureTuning(compiled_startup_s=-1.0))
    assert run.final().backend == "fetch" and "pip install 'qdebug[fast]'" in run.final().reason


def test_numba_is_imported_only_when_the_compiled_reduction_runs() -> None:
    code = "import sys, qdebug.debugger, qdebug.capture; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_numba_that_cannot_load_keeps_the_fetch_run_with_the_reason(
    tiny_float: Path, tiny_quant: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> None:
        raise ImportError("Numba needs NumPy 2.3 or less\nsecond line")

    fm, qm = onnx.load(str(tiny_float)), onnx.load(str(tiny_quant("u8")))
    monkeypatch.setattr(compiled, "ready", lambda: False)
    monkeypatch.setattr(compiled, "warm_up", broken)  # runs on the background thread once samples 1-3 say it pays
    run = _auto(fm, qm, 6, CaptureTuning(compiled_startup_s=-1.0))
    assert run.final().backend == "fetch" and run.fetch.reducer is not compiled.reduce_sample_compiled
    assert "could not load (ImportError: Numba needs NumPy 2.3 or less)" in run.final().reason


def test_the_fetch_run_reduces_until_numba_has_loaded(
    tiny_float: Path, tiny_quant: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = threading.Event()
    monkeypatch.setattr(compiled, "ready", lambda: False)
    monkeypatch.setattr(compiled, "warm_up", loaded.wait)  # the kernel "loads" only when the test says so
    fm, qm = onnx.load(str(tiny_float)), onnx.load(str(tiny_quant("u8")))
    tuning = CaptureTuning(compiled_startup_s=-1.0)
    run = AutoRun(fm, qm, pair_models(fm, qm), ["CPUExecutionProvider"], 6, batch=1, tuning=tuning)
    for i, s in enumerate(open_data(None, input_specs(fm), num_samples=6, seed=3)):
        assert isinstance(run.reduce(i, s), SampleSums)
    assert run.fetch.reducer is not compiled.reduce_sample_compiled  # never waited for numba
    choice = run.final()
    assert choice.backend == "fetch" and "the data ran out before the compiled kernel had loaded" in choice.reason
    loaded.set()
    run.close()


def test_a_pipelined_run_weighs_the_reduction_above_the_inference_and_the_cores_it_frees() -> None:
    from qdebug.capture.auto import _saving_per_sample

    saving = CaptureTuning().compiled_saving
    alone = saving * 0.010
    assert _saving_per_sample(0.010, 0.004, False, saving) == pytest.approx(alone)
    # fetch-bound after the switch: the part above the inference, averaged with the reduction's own saving
    both = (saving * 0.0058 + 0.0058 - 0.0035) / 2
    assert _saving_per_sample(0.0058, 0.0035, True, saving) == pytest.approx(both)
    # inference-bound already: only the freed cores count, half the reduction's own saving
    assert _saving_per_sample(0.003, 0.010, True, saving) == pytest.approx(saving * 0.003 / 2)
    assert _saving_per_sample(0.010, 0.001, True, saving) == pytest.approx(alone)


def test_without_numba_the_compiled_backend_names_the_extra(
    tiny_float: Path, tiny_quant: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from qdebug.errors import MissingExtraError

    monkeypatch.setitem(sys.modules, "numba", None)  # `import numba` now raises ImportError
    monkeypatch.setenv("CC", "/nonexistent/cc")  # and no C compiler to build the C kernel with
    monkeypatch.setattr(c_kernel, "built", lambda: None)
    monkeypatch.setattr(c_kernel, "load", c_kernel.load.__wrapped__)
    monkeypatch.setattr(compiled, "_load", compiled._load.__wrapped__)  # not the cached kernel module
    fm, qm = onnx.load(str(tiny_float)), onnx.load(str(tiny_quant("u8")))
    with pytest.raises(MissingExtraError, match=r"no C compiler found.*pip install 'qdebug\[fast\]'"):
        capture(fm, qm, pair_models(fm, qm), open_data(None, input_specs(fm), num_samples=2), path="compiled")


def _same(a: SampleSums, b: SampleSums) -> None:
    """Bit-identical sums."""
    for name in ("cumulative", "local", "outputs"):
        for field in dataclasses.fields(BatchSums):
            x, y = getattr(getattr(a, name), field.name), getattr(getattr(b, name), field.name)
            np.testing.assert_array_equal(x, y, err_msg=f"{name}.{field.name}")
    for name in ("float_min", "float_max", "elements"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def test_a_run_reuses_its_call_tables_and_gives_the_stateless_sums() -> None:
    """A whole-model run's tensors are the same bound arrays every sample, rewritten by ONNX Runtime: the cached
    reducer re-points only the new ones (here a fresh input array) and gives exactly the stateless reducer's sums;
    an array of another dtype makes a new table; arrays that are all new sample after sample stop the caching."""
    rng = np.random.default_rng(5)
    plan = plan_of([(True, None, None), (True, ("Clip", -1.0, 1.0), None), (False, None, ("Relu", 0.0, np.inf))])
    arrays = [tuple(rng.standard_normal(n).astype(np.float32) for _ in range(3)) for n in (40, 33, 100)]
    f, q = _tensors(arrays)  # type: ignore[arg-type]
    reducer = compiled.reduce_sample_compiled.cached()
    assert isinstance(compiled._load(), c_kernel.CKernels)
    _same(reducer(plan, f, q), compiled.reduce_sample_compiled(plan, f, q))
    table = reducer._kept[id(plan)][0].table
    for step in range(3):
        for a in list(f.values()) + list(q.values()):
            a[...] = rng.standard_normal(a.shape).astype(a.dtype)  # ORT writing into the bound arrays
        f["t0"] = rng.standard_normal(40).astype(np.float32)  # the sample's own input: a new array
        _same(reducer(plan, f, q), compiled.reduce_sample_compiled(plan, f, q))
        assert reducer._kept[id(plan)][0].table is table, step
    f["t1"] = f["t1"].astype(np.float64)
    q["t1_pre"], q["t1_post"] = q["t1_pre"].astype(np.float64), q["t1_post"].astype(np.float64)
    for k in range(reducer.MISSES):  # every tensor a new array (float64 for t1: a new table), then not kept
        assert reducer.keeps(plan) == min(k + 1, 2)  # the last two samples' tables, until then
        f = {k: v.copy() for k, v in f.items()}
        q = {k: v.copy() for k, v in q.items()}
        _same(reducer(plan, f, q), compiled.reduce_sample_compiled(plan, f, q))
    assert reducer.keeps(plan) == 0


def test_call_tables_repoint_only_to_arrays_of_the_same_kind() -> None:
    a = np.zeros(8, np.float32)
    table = c_kernel.CallTable([(a, a, a, 1.0, 0, (-np.inf, np.inf, -np.inf, np.inf), True)])
    assert table.repoint(0, 1, np.ones(8, np.float32)) and table.kept[0][1][0] == 1
    assert not table.repoint(0, 1, np.ones(8, np.float64))  # dtype
    assert not table.repoint(0, 1, np.ones(9, np.float32))  # shape
    assert not table.repoint(0, 1, np.ones(16, np.float32)[::2])  # layout
    assert table.kept[0][1][0] == 1


def test_a_pipelined_compiled_run_on_bound_outputs_equals_the_sequential_one(
    tiny_float: Path, tiny_quant: Callable[[str], Path]
) -> None:
    """With outputs bound (two sets, by sample parity, when pipelined) and call tables reused, the sums are
    bit-identical to the sequential run's (one core: not pipelined; two: pipelined)."""
    from qdebug.capture.fetch import FetchRun

    fm, qm = onnx.load(str(tiny_float)), onnx.load(str(tiny_quant("u8")))
    source = open_data(None, input_specs(fm), num_samples=9, seed=2)
    runs = {}
    for pipelined in (False, True):
        made, runs[pipelined] = capture_run("compiled", fm, qm, source, CaptureTuning(cores=2 if pipelined else 1))
        assert isinstance(made, FetchRun)
        run = made
        assert run.pipelining is pipelined and run.fetches[0][0].binding is not None
        assert (run.fetches[1][0].binding is not None) is pipelined  # the second set only when pipelined
        assert run._whole_reducer.keeps(run.plan) == (2 if pipelined else 1)  # type: ignore[attr-defined]
        first, second = (set(map(id, f.values)) for f, _ in run.fetches)
        assert not pipelined or not first & second  # the two sets never share an array
    a, b = runs[False], runs[True]
    assert a.cumulative == b.cumulative and a.local == b.local and a.outputs == b.outputs
    np.testing.assert_array_equal(a.per_sample, b.per_sample)


def test_sample_0s_arrays_are_bound_only_once_it_is_reduced(
    tiny_float: Path, tiny_quant: Callable[[str], Path]
) -> None:
    """As in ``auto``: sample 0 runs plain (batching still possible), then batching is decided off before it is
    reduced. Sample 0's arrays are written again only once it is reduced: when sample 1 was announced early (it is
    inferred on the worker while sample 0 is reduced, into new arrays) sample 2's set is bound to them at once but
    run only after; when not (``auto`` announces samples once it has decided), the worker makes sample 2's set while
    sample 0 is reduced and sample 1's takes sample 0's arrays. Always the same sums as a run that never batched,
    sample by sample, and the two sets never share an array."""
    from qdebug.capture.batch_run import Batching
    from qdebug.capture.fetch import FetchRun
    from qdebug.capture.pipelined import Pipelining

    fm, qm = onnx.load(str(tiny_float)), onnx.load(str(tiny_quant("u8")))
    pairing = pair_models(fm, qm)
    samples = list(open_data(None, input_specs(fm), num_samples=7, seed=4))
    kernel = compiled.kernel()
    rows = {}
    for pipelined, batch, early in ((False, 1, True), (False, 8, True), (True, 8, True), (True, 8, False)):
        options = {"reducer": compiled.reduce_sample_compiled, "batch_kernel": kernel, "dequant_whole": True}
        pipeline = Pipelining(CaptureTuning()) if pipelined else None
        batching = Batching(batch, fm, CaptureTuning()) if batch > 1 else None
        run = FetchRun(fm, qm, pairing, ["CPUExecutionProvider"], pipeline=pipeline, batching=batching, **options)

        def no_batching(run: FetchRun = run) -> None:
            run.stop_batching()

        got = []
        for i, s in enumerate(samples):
            if i + 1 < len(samples) and (early or i > 0):
                run.prefetch(i + 1, samples[i + 1])
            got.append(run.reduce(i, s, no_batching if i == 0 else None))
            if i == 0 and not early:
                prep = run.pipeline.prep if run.pipeline is not None else None
                assert prep is not None and prep[0] == 0  # sample 2's set, made while sample 0 is reduced
                run.prefetch(1, samples[1])
            if i == 0 and early and pipelined:  # sample 2's set bound to sample 0's arrays while sample 1 is inferred
                assert run._adopted and run.fetches[0][0].binding is not None
        run.close()
        assert run._adopted is (batch > 1) and run._plain is None
        first, second = (set(map(id, f.values)) for f, _ in run.fetches)
        assert first and (second or not pipelined) and not first & second
        rows[pipelined, batch, early] = np.array([[x.cumulative.noise, x.local.noise] for x in got])
    for case in ((False, 8, True), (True, 8, True), (True, 8, False)):
        np.testing.assert_array_equal(rows[case], rows[False, 1, True])
