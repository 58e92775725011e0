"""A batch reduced at once (:func:`qdebug.capture.kernels.batched.reduce_batch`) gives every sample the sums the
reference definition gives it alone — small tensors (one numpy pass for the whole batch), large ones, the batch on
axis 0 or inside (a recurrent state ``[2, n, 128]``), tensors the batch does not change (shared), NaN/Inf,
float32 overflow, empty and float64 tensors, clips of fused and measured-through activations — with the numpy
path (any chunk size) and with each compiled batch kernel, C and numba (both part of ``make test``'s install: these
fail, not skip, without them); and ``auto`` batches a model whose inputs have a batch axis, to the unbatched
report's values."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from capture_helpers import Bounds, assert_same_sums, loaded_warm_up, plan_of
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from qdebug.capture import compiled
from qdebug.capture.batching import batch_views
from qdebug.capture.kernels import c_kernel
from qdebug.capture.kernels.batched import CHUNK_ELEMENTS, BatchTensors, reduce_batch
from qdebug.capture.kernels.reference import ReductionPlan, reduce_sample
from qdebug.capture.tuning import CaptureTuning
from qdebug.debugger import DebugOptions, debug
from qdebug.metrics import SMALL_TENSOR

RELU: Bounds = ("Relu", 0.0, float("inf"))
CLIP6: Bounds = ("Clip", 0.0, 6.0)


def _batch(per_sample: list[dict[str, np.ndarray]], axes: dict[str, int | None]) -> tuple[BatchTensors, list[str]]:
    """The samples' tensors as one batched run would return them: concatenated on each tensor's batch axis, or
    (axis ``None``) one array the batch does not change."""
    names = list(per_sample[0])
    n = len(per_sample)
    values = [
        per_sample[0][k] if axes[k] is None else np.concatenate([s[k] for s in per_sample], axis=axes[k]) for k in names
    ]
    alone = tuple(tuple(per_sample[0][k].shape) for k in names)
    views = batch_views(values, names, alone, n)
    assert not isinstance(views, str), views
    return BatchTensors(dict(zip(names, views, strict=True)), dict(zip(names, alone, strict=True)), n), names


def _check(
    plan: ReductionPlan, samples: list[tuple[dict, dict]], axes: dict[str, int | None], kernel: object,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> None:  # fmt: skip
    """Every sample's batch sums equal the reference's on that sample alone."""
    fb, _ = _batch([f for f, _ in samples], axes)
    qb, _ = _batch([q for _, q in samples], axes)
    got = reduce_batch(plan, fb, qb, kernel, chunk_elements=chunk_elements)
    for i, (f, q) in enumerate(samples):
        want = reduce_sample(plan, f, q)
        for kind in ("cumulative", "local", "outputs"):
            assert_same_sums(getattr(want, kind), getattr(got[i], kind), rtol=1e-5)
        np.testing.assert_array_equal(want.float_min, got[i].float_min)
        np.testing.assert_array_equal(want.float_max, got[i].float_max)
        np.testing.assert_array_equal(want.elements, got[i].elements)


def _triple(rng: np.random.Generator, shape: tuple[int, ...], dtype: type = np.float32) -> tuple[np.ndarray, ...]:
    r = (rng.standard_normal(shape) * 3).astype(dtype)
    return r, (r + 0.01).astype(dtype), (np.round(r * 8) / 8).astype(dtype)


SPECS: list[tuple[bool, Bounds, Bounds]] = [
    (True, None, None),  # t0 small, batch axis 0
    (True, RELU, None),  # t1 small, fused Relu
    (True, None, CLIP6),  # t2 small, measured through Clip(0, 6)
    (False, None, None),  # t3 small, not quantized
    (True, None, None),  # t4 large (above SMALL_TENSOR per sample)
    (True, CLIP6, RELU),  # t5 recurrent state, batch on axis 1
    (True, None, None),  # t6 shared by every sample (computed from constants)
    (True, None, None),  # t7 with NaN in sample 1 and Inf in sample 2
    (True, None, None),  # t8 float32 squares overflow in sample 0
    (True, None, None),  # t9 empty
    (True, None, None),  # t10 float64
]


def _samples(n: int, seed: int = 0) -> tuple[list[tuple[dict, dict]], dict[str, int | None]]:
    rng = np.random.default_rng(seed)
    shapes = [(1, 40), (1, 3, 7), (1, 300), (1, 17), (1, SMALL_TENSOR + 5), (2, 1, 128), (4, 9), (1, 33), (1, 20)]
    shared = _triple(rng, (4, 9))
    samples = []
    for i in range(n):
        tr = [_triple(rng, s) for s in shapes] + [_triple(rng, (1, 0)), _triple(rng, (1, 12), np.float64)]
        tr[6] = shared
        if i == 1:
            tr[7][0][0, 3], tr[7][2][0, 5] = np.nan, np.nan
        if i == 2 % n:
            tr[7][0][0, 1], tr[7][1][0, 2] = np.inf, -np.inf
        if i == 0:
            tr[8] = tuple(np.where(np.arange(20) == 4, np.float32(3e20), t) for t in tr[8])
        f = {f"t{j}": r for j, (r, _, _) in enumerate(tr)} | {"out": tr[0][0]}
        q = {f"t{j}_pre": p for j, (_, p, _) in enumerate(tr)} | {f"t{j}_post": x for j, (_, _, x) in enumerate(tr)}
        samples.append((f, q | {"out_q": tr[0][2]}))
    axes: dict[str, int | None] = {}
    for j in range(len(SPECS)):
        for name in (f"t{j}", f"t{j}_pre", f"t{j}_post"):
            axes[name] = None if j == 6 else 1 if j == 5 else 0
    axes["out"] = axes["out_q"] = 0
    return samples, axes


def _kernel(which: str) -> Any:
    """The batch kernel ``which`` names (``numpy``: none)."""
    if which == "numpy":
        return None
    return c_kernel.load() if which == "c" else importlib.import_module("qdebug.capture.kernels.numba_kernel")


@pytest.mark.parametrize("which", ["numpy", "c", "numba"])
def test_every_case_gives_each_sample_the_reference_sums(which: str) -> None:
    samples, axes = _samples(4)
    _check(plan_of(SPECS), samples, axes, _kernel(which))


@pytest.mark.parametrize("chunk_elements", [1, 100, 1 << 12])
def test_any_chunk_size_gives_the_reference_sums(chunk_elements: int) -> None:
    """The chunk of samples one numpy call reduces bounds the temporary copies, not what is summed."""
    samples, axes = _samples(4)
    _check(plan_of(SPECS), samples, axes, None, chunk_elements)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 5),
    size=st.integers(1, 3 * SMALL_TENSOR // 2),
    seed=st.integers(0, 2**16),
    which=st.sampled_from(["numpy", "c", "numba"]),
)
def test_fuzzed_batches_match_the_reference(n: int, size: int, seed: int, which: str) -> None:
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n):
        r, p, x = _triple(rng, (1, size))
        samples.append(({"t0": r, "out": r}, {"t0_pre": p, "t0_post": x, "out_q": x}))
    axes: dict[str, int | None] = dict.fromkeys(["t0", "out", "t0_pre", "t0_post", "out_q"], 0)
    _check(plan_of([(True, RELU, None)]), samples, axes, _kernel(which))


def _batchable_pair(tmp_path: Path) -> tuple[Path, Path]:
    """A float model ``y = relu(x·W)`` with a free batch axis and its QDQ form (hand-written, int8)."""
    w = helper.make_tensor("W", TensorProto.FLOAT, [16, 8], np.linspace(-1, 1, 128, dtype=np.float32).tolist())
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])
    f_nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    fm = helper.make_model(helper.make_graph(f_nodes, "f", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 17)])
    s = helper.make_tensor("s", TensorProto.FLOAT, [], [0.05])
    z = helper.make_tensor("z", TensorProto.INT8, [], [0])
    q_nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["x_dq"]),
        helper.make_node("MatMul", ["x_dq", "W"], ["m"]),
        helper.make_node("QuantizeLinear", ["m", "s", "z"], ["mq"]),
        helper.make_node("DequantizeLinear", ["mq", "s", "z"], ["m_dq"]),
        helper.make_node("Relu", ["m_dq"], ["y"]),
    ]
    qm = helper.make_model(
        helper.make_graph(q_nodes, "q", [x], [y], [w, s, z]), opset_imports=[helper.make_opsetid("", 17)]
    )
    fm.ir_version = qm.ir_version = 9  # what the installed ONNX Runtime reads
    paths = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(fm, paths[0])
    onnx.save(qm, paths[1])
    return paths


def test_auto_batches_a_batchable_model_to_the_unbatched_values(tmp_path: Path) -> None:
    fp, qp = _batchable_pair(tmp_path)
    rng = np.random.default_rng(1)
    data = tmp_path / "d.npz"
    np.savez(data, x=rng.standard_normal((40, 1, 16)).astype(np.float32))
    one = debug(fp, qp, data, DebugOptions(batch=1))
    auto = debug(fp, qp, data, DebugOptions())
    cap = auto.meta.capture
    assert cap is not None and cap.backend == "compiled" and cap.batch > 1, cap  # the C kernel reduces the batches
    assert "batches of up to" in str(cap.reason)
    assert one.meta.capture is not None and one.meta.capture.batch == 1
    for a, b in zip(one.activations, auto.activations, strict=True):
        assert a.cumulative_sqnr_db == pytest.approx(b.cumulative_sqnr_db, abs=1e-5)
        if a.local_sqnr_db is not None:
            assert a.local_sqnr_db == pytest.approx(b.local_sqnr_db, abs=1e-5)
    np.testing.assert_allclose(one.per_sample.values, auto.per_sample.values, atol=1e-5)


def test_auto_weighs_the_compiled_kernel_on_batches_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batched ``auto`` run still switches to the compiled reduction when it pays (forced here: no start-up
    cost), and its batches are then reduced by the batch kernel, to the same values."""
    monkeypatch.setattr(compiled, "start_warm_up", loaded_warm_up)  # numba loaded by the next sample
    fp, qp = _batchable_pair(tmp_path)
    rng = np.random.default_rng(2)
    data = tmp_path / "d.npz"
    np.savez(data, x=rng.standard_normal((64, 1, 16)).astype(np.float32))
    one = debug(fp, qp, data, DebugOptions(batch=1, capture="numpy"))
    auto = debug(fp, qp, data, DebugOptions(tuning=CaptureTuning(compiled_startup_s=-1.0)))
    cap = auto.meta.capture
    assert cap is not None and cap.batch > 1 and cap.backend == "compiled", cap
    np.testing.assert_allclose(one.per_sample.values, auto.per_sample.values, atol=1e-5)


def test_auto_does_not_batch_when_only_two_samples_fit(tmp_path: Path) -> None:
    """Two samples per call measured slower than one on ppocr-cls: ``auto`` needs room for three; asked for, two."""
    from qdebug.capture import fetch

    fp, qp = _batchable_pair(tmp_path)
    data = tmp_path / "d.npz"
    np.savez(data, x=np.random.default_rng(3).standard_normal((12, 1, 16)).astype(np.float32))
    from qdebug.pairing import pair_models

    fm, qm = onnx.load(str(fp)), onnx.load(str(qp))
    probe = fetch.FetchRun(fm, qm, pair_models(fm, qm), ["CPUExecutionProvider"])
    probe.reduce(0, {"x": np.ones((1, 16), np.float32)})
    assert probe.sample_bytes is not None
    tuning = CaptureTuning(batch_bytes=2 * probe.sample_bytes + 1)  # room for two
    auto = debug(fp, qp, data, DebugOptions(tuning=tuning)).meta.capture
    asked = debug(fp, qp, data, DebugOptions(batch=4, tuning=tuning)).meta.capture
    assert auto is not None and auto.batch == 1 and "batches of up to" not in str(auto.reason)
    assert asked is not None and asked.batch == 2


def test_auto_does_not_batch_fewer_samples_than_a_full_batch(tmp_path: Path) -> None:
    """A run whose samples after the first would make one partial batch runs them one per call (that batch's first
    call at new shapes and its check against a sample alone would not be repaid), and the report says why;
    ``--batch`` is still obeyed."""
    fp, qp = _batchable_pair(tmp_path)
    data = tmp_path / "d.npz"
    np.savez(data, x=np.random.default_rng(2).standard_normal((12, 1, 16)).astype(np.float32))
    auto = debug(fp, qp, data, DebugOptions()).meta.capture
    assert auto is not None and auto.batch == 1 and "batches of up to" not in str(auto.reason)
    why = "11 sample(s) after the first, fewer than a full batch"
    assert auto.batch_reason is not None and why in auto.batch_reason
    asked = debug(fp, qp, data, DebugOptions(batch=4)).meta.capture
    assert asked is not None and asked.batch == 4
