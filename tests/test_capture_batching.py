"""Batching (``DebugOptions.batch``, ``--batch``): several samples per inference call, sums still per sample, and
a model that does not batch correctly detected on the first batch and run one sample at a time instead."""

from __future__ import annotations

from pathlib import Path

import builders
import numpy as np
import onnx
import pytest
from conftest import save
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from qdebug.capture import CaptureResult, capture
from qdebug.capture.batching import batch_axes, batch_views, mismatch, relax_batch_dim, sample_view, stack
from qdebug.cli import main
from qdebug.data import open_data
from qdebug.debugger import DebugOptions, debug
from qdebug.errors import ConfigError, DataError
from qdebug.model_io import input_specs
from qdebug.pairing import pair_models
from qdebug.quantizer import quantize


def _capture(fp: Path, qp: Path, n: int, batch: int) -> CaptureResult:
    fm, qm = onnx.load(str(fp)), onnx.load(str(qp))
    source = open_data(None, input_specs(fm), num_samples=n, seed=3)
    return capture(fm, qm, pair_models(fm, qm), source, path="fetch", batch=batch)


def _close(a: CaptureResult, b: CaptureResult, rtol: float) -> None:
    """Same pairs, counts and per-sample rows; sums equal to ``rtol``."""
    assert a.num_samples == b.num_samples and a.elements == b.elements
    for xs, ys in ((a.cumulative, b.cumulative), (a.outputs, b.outputs), (a.local, b.local)):
        for x, y in zip(xs, ys, strict=True):
            if x is None or y is None:
                assert x is y
                continue
            assert x.count == y.count
            np.testing.assert_allclose([x.signal, x.noise], [y.signal, y.noise], rtol=rtol)
    np.testing.assert_allclose(a.float_min, b.float_min, rtol=rtol)
    np.testing.assert_allclose(a.float_max, b.float_max, rtol=rtol)
    np.testing.assert_allclose(a.per_sample, b.per_sample, rtol=0, atol=1e-3 if rtol else 0)  # dB


def test_batched_sums_are_each_samples_own(tiny_float: Path, tiny_quant) -> None:  # type: ignore[no-untyped-def]
    """tiny_convnet declares batch 1: relaxed, checked on the first batch, then 10 samples in calls of up to 4;
    every per-sample row and every sum is the one-sample-at-a-time run's, to rounding (ORT's convolution sums in
    another order for a batch: ~4e-6 of a noise energy here, 1e-5 dB of SQNR)."""
    qp = tiny_quant("u8")
    alone = _capture(tiny_float, qp, 10, 1)
    batched = _capture(tiny_float, qp, 10, 4)
    assert (batched.batch, batched.batch_reason) == (4, None)
    assert (alone.batch, alone.batch_reason) == (1, None)
    _close(alone, batched, rtol=1e-4)


def _transposed_flatten(tmp_path: Path) -> tuple[Path, Path]:
    """Conv, then Transpose(1, 0, 2, 3) and Reshape([1, -1]): the batch is folded *inside* the channel axis, so
    one sample's values are not a contiguous slice of the batch — a split that looks right by shape and is not."""
    base = builders.tiny_convnet()
    conv = base.graph.node[0]
    nodes = [
        conv,
        helper.make_node("Transpose", ["c1"], ["t"], name="transpose", perm=[1, 0, 2, 3]),
        helper.make_node("Reshape", ["t", "shape"], ["y"], name="reshape"),
    ]
    shape = onnx.numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    inits = [i for i in base.graph.initializer if i.name in ("w1", "b1")] + [shape]
    model = builders._model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    fp = save(model, tmp_path / "transposed.onnx")
    qp = tmp_path / "transposed.qdq.onnx"
    quantize(fp, None, None, qp, check=False)
    return fp, qp


def test_a_batch_that_mixes_samples_is_detected_and_not_used(tmp_path: Path) -> None:
    fp, qp = _transposed_flatten(tmp_path)
    alone = _capture(fp, qp, 7, 1)
    batched = _capture(fp, qp, 7, 4)
    assert batched.batch == 1
    assert batched.batch_reason is not None and "differs in the batch" in batched.batch_reason
    _close(alone, batched, rtol=0)  # every sample ran alone: the very same sums


def test_the_report_and_the_cli_say_how_samples_were_batched(tiny_float: Path, tiny_quant, capsys) -> None:  # type: ignore[no-untyped-def]
    qp = tiny_quant("u8")
    rep = debug(tiny_float, qp, None, DebugOptions(num_samples=6, batch=8))
    # auto: the fetching run batches, reduced by the C kernel (conftest builds it)
    assert rep.meta.capture is not None and rep.meta.capture.backend == "compiled" and rep.meta.capture.batch > 1
    assert rep.meta.capture.reason is not None and "batch" in rep.meta.capture.reason
    assert main(["debug", "-f", str(tiny_float), "-q", str(qp), "--samples", "6", "--batch", "8"]) == 0
    assert f"batches of up to {rep.meta.capture.batch} samples" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("options", "message"),
    [({"batch": 0}, "batch must be a positive integer"), ({"batch": 4, "capture": "graph"}, "graph does not batch")],
)
def test_bad_batch_options_are_one_clear_error(options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        DebugOptions(**options)


def test_a_bad_sample_is_the_same_one_line_error_when_batching(tiny_float: Path, tiny_quant, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Sample 5 has another shape: it cannot join a batch, runs alone and fails as it does without batching."""
    spec = input_specs(onnx.load(str(tiny_float)))[0]
    folder = tmp_path / "data"
    folder.mkdir()
    np.savez(folder / "a.npz", **{spec.name: np.random.default_rng(0).random((5, *spec.shape)).astype(np.float32)})
    np.savez(folder / "b.npz", **{spec.name: np.zeros((1, 1, 2, 2), np.float32)})
    errors = []
    for batch in (1, 4):
        with pytest.raises(DataError) as info:
            debug(tiny_float, tiny_quant("u8"), folder, DebugOptions(capture="fetch", batch=batch))
        errors.append(str(info.value))
    assert errors[0] == errors[1] and "b.npz" in errors[0]


def test_batch_axes_stack_and_split_follow_the_declared_shapes() -> None:
    """A recurrent state ``[2, 1, 128]`` stacks on axis 1, an image batch on axis 0; a tensor splits on the one
    axis that grew, a batch-independent one is shared, anything else is named."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 576])
    st = helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, 1, 128])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x, st], [y]))
    assert batch_axes(model) == {"x": 0, "state": 1}
    relaxed = relax_batch_dim(model)
    dims = [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in relaxed.graph.input]
    assert dims == [["qdebug_batch", 576], [2, "qdebug_batch", 128]]
    samples = [{"x": np.full((1, 576), i, np.float32), "state": np.full((2, 1, 128), i, np.float32)} for i in range(3)]
    stacked = stack(samples, batch_axes(model))
    assert stacked is not None and stacked["x"].shape == (3, 576) and stacked["state"].shape == (2, 3, 128)
    alone = ((2, 1, 128), (4,))
    views = batch_views([stacked["state"], np.ones(4)], ["state", "const"], alone, 3)
    assert not isinstance(views, str)
    per = [[sample_view(v, i, one) for v, one in zip(views, alone, strict=True)] for i in range(3)]
    assert all(np.array_equal(per[i][0], samples[i]["state"]) for i in range(3)) and np.shares_memory(
        per[2][1], per[0][1]
    )
    bad = batch_views([np.ones((1, 5))], ["t"], ((1, 2),), 3)
    assert isinstance(bad, str) and "'t'" in bad and "does not split" in bad
    assert mismatch([np.ones(3)], [np.ones(3)], ["t"]) is None
    assert "differs" in str(mismatch([np.array([1.0, 2.0])], [np.array([2.0, 1.0])], ["t"]))


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 3000),
    st.sampled_from([np.float32, np.float64]),
    st.sampled_from([0.0, 1e-5, 1e-4, 7e-4, 1e-3, 1.5e-3, 1e-1]),
    st.sampled_from([None, np.nan, np.inf, -np.inf, 3e20]),
    st.integers(0, 2**31 - 1),
)
def test_the_quick_batch_check_decides_as_the_exact_one(
    n: int, dtype: type, noise: float, odd: float | None, seed: int
) -> None:
    """``mismatch``'s three-pass check of finite tensors gives the float64 check's answer, tolerance edges,
    non-finite values and float32 overflow included."""
    from qdebug.capture import batching

    rng = np.random.default_rng(seed)
    alone = rng.standard_normal(n).astype(dtype)
    batched = (alone + rng.standard_normal(n) * noise * np.abs(alone).mean()).astype(dtype)
    if odd is not None:
        k = int(rng.integers(n))
        alone[k] = odd
        batched[k] = odd if rng.random() < 0.5 else batched[k]
    got = mismatch([batched], [alone], ["t"])
    quick = batching._close
    try:
        batching._close = lambda a, b: False  # type: ignore[assignment]
        want = mismatch([batched], [alone], ["t"])
    finally:
        batching._close = quick
    assert (got is None) == (want is None)
