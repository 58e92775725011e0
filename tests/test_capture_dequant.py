"""Post-Q/DQ tensors computed from their integers (:mod:`qdebug.capture.dequant`): the recomputation is ONNX
Runtime's DequantizeLinear bit for bit, the guard drops what ORT does not confirm, the kernels give the sums of the
fetched tensors, and a segmented run that exposes the integers gives the same report as one that exposes floats."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from qdebug.capture import CaptureTuning, capture, compiled, dequant, segmented
from qdebug.capture.kernels.reference import ReductionPlan, reduce_sample
from qdebug.data import open_data
from qdebug.model_io import input_specs
from qdebug.ort import make_session
from qdebug.pairing import pair_models

INTS = [np.int8, np.uint8, np.int16, np.uint16]


def _ort_dequantize(x: np.ndarray, scale: np.float32, zp: np.ndarray) -> np.ndarray:
    """ONNX Runtime's DequantizeLinear of ``x`` (opset 21: 16-bit integers are allowed)."""
    elem = helper.np_dtype_to_tensor_dtype(x.dtype)
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"])],
        "dq",
        [helper.make_tensor_value_info("x", elem, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))],
        [numpy_helper.from_array(np.array(scale, np.float32), "s"), numpy_helper.from_array(zp, "z")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    sess = make_session(model, ["CPUExecutionProvider"])
    return np.asarray(sess.run(None, {"x": x})[0])  # type: ignore[attr-defined]


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from(INTS),
    scale=st.floats(min_value=2**-26, max_value=2.0**13, width=32),
    zp_frac=st.floats(min_value=0, max_value=1),
    size=st.integers(min_value=1, max_value=300),
    seed=st.integers(0, 2**16),
)
def test_numpy_dequantize_is_ort_bit_for_bit(
    dtype: type[np.integer], scale: float, zp_frac: float, size: int, seed: int
) -> None:
    info = np.iinfo(dtype)
    zp = np.array(int(info.min + zp_frac * (int(info.max) - int(info.min))), dtype)
    x = np.random.default_rng(seed).integers(info.min, int(info.max) + 1, size).astype(dtype)
    spec = dequant.DequantSpec("post", "ints", float(np.float32(scale)), int(zp), np.dtype(dtype))
    want = _ort_dequantize(x, np.float32(scale), zp)
    np.testing.assert_array_equal(dequant.dequantize(spec, x).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("dtype", INTS)
def test_the_kernel_computes_the_same_posts_and_sums(dtype: type[np.integer]) -> None:
    """``dequant_sums`` on the integers equals ``activation_sums`` on the dequantized floats exactly (same lanes,
    same values), with clips and a tail; both agree with the numpy reference."""
    k = compiled.kernel()
    info = np.iinfo(dtype)
    rng = np.random.default_rng(1)
    ints = rng.integers(info.min, int(info.max) + 1, 1000 + 7).astype(dtype)
    spec = dequant.DequantSpec("p", "i", float(np.float32(0.0123)), int(info.min) + 3, np.dtype(dtype))
    post = dequant.dequantize(spec, ints)
    ref = post + rng.standard_normal(post.size).astype(np.float32) * np.float32(0.01)
    pre = post + rng.standard_normal(post.size).astype(np.float32) * np.float32(0.003)
    for bounds in ((-np.inf, np.inf, -np.inf, np.inf), (-1.0, 6.0, 0.0, np.inf)):
        want, got = np.zeros(k.SLOTS), np.zeros(k.SLOTS)
        k.activation_sums(ref, pre, post, *bounds, True, want)
        k.dequant_sums(ref, pre, ints, spec.scale, spec.zero_point, *bounds, got)
        np.testing.assert_array_equal(got, want)
    # the fused pass against two separate ones (the earlier kernel): same sums to float64 rounding
    two = np.zeros(k.SLOTS)
    k.pair_sums(ref, post, -np.inf, np.inf, -np.inf, np.inf, two, k.CUM_SIGNAL)
    k.pair_sums(pre, post, -np.inf, np.inf, -np.inf, np.inf, two, k.LOC_SIGNAL)
    k.activation_sums(ref, pre, post, -np.inf, np.inf, -np.inf, np.inf, True, want)
    np.testing.assert_allclose(want[: k.REF_MIN], two[: k.REF_MIN], rtol=1e-12)


def test_find_specs_takes_activations_only(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    for name in ("u8", "u16_qnn", "s8_per_channel"):
        fm, qm = onnx.load(str(tiny_float)), onnx.load(str(tiny_quant(name)))
        pairing = pair_models(fm, qm)
        specs = dequant.find_specs(qm, pairing)
        quantized = {a.post_qdq for a in pairing.activations if a.quantized}
        assert specs and set(specs) <= quantized, name
        inits = {t.name for t in qm.graph.initializer}
        assert all(s.ints not in inits and s.dtype.kind in "iu" for s in specs.values())  # never a weight
        assert dequant.verified(specs, qm, ["CPUExecutionProvider"]) == specs  # this ORT confirms every one


def test_a_recomputation_ort_does_not_confirm_is_dropped(
    tiny_float: Path, tiny_quant: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    fm, qm = onnx.load(str(tiny_float)), onnx.load(str(tiny_quant("u8")))
    specs = dequant.find_specs(qm, pair_models(fm, qm))
    right = dequant.dequantize

    def one_ulp_off(spec: dequant.DequantSpec, x: np.ndarray) -> np.ndarray:
        return np.nextafter(right(spec, x), np.float32(np.inf))

    monkeypatch.setattr(dequant, "dequantize", one_ulp_off)
    assert dequant.verified(specs, qm, ["CPUExecutionProvider"]) == {}


def test_the_reference_reducer_reads_computed_posts(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    """:class:`Dequantized` without the posts gives ``reduce_sample`` (and the compiled pass) the fetched run's sums."""
    fm, qm = onnx.load(str(tiny_float)), onnx.load(str(tiny_quant("u8")))
    pairing = pair_models(fm, qm)
    plan, specs = ReductionPlan.of(pairing), dequant.find_specs(qm, pair_models(fm, qm))
    sample = dict(next(iter(open_data(None, input_specs(fm), num_samples=1, seed=0))))
    names = list(dict.fromkeys([*plan.quant_names, *(s.ints for s in specs.values())]))
    from qdebug.ort import expose_outputs

    f_sess = make_session(expose_outputs(fm, plan.float_names), ["CPUExecutionProvider"])
    q_sess = make_session(expose_outputs(qm, names), ["CPUExecutionProvider"])
    f = dict(zip(plan.float_names, f_sess.run(list(plan.float_names), sample), strict=True))  # type: ignore[attr-defined]
    q = dict(zip(names, q_sess.run(names, sample), strict=True))  # type: ignore[attr-defined]
    for s in specs.values():  # the fetched posts are what dequantize computes
        np.testing.assert_array_equal(q[s.post], dequant.dequantize(s, q[s.ints]))
    without = dequant.Dequantized({n: v for n, v in q.items() if n not in specs}, specs)
    assert set(specs) <= set(without) and len(without) == len(q)
    for reducer in (reduce_sample, compiled.reduce_sample_compiled):
        want, got = reducer(plan, f, q), reducer(plan, f, without)
        for part in ("cumulative", "local", "outputs"):
            np.testing.assert_array_equal(getattr(got, part).signal, getattr(want, part).signal)
            np.testing.assert_allclose(getattr(got, part).noise, getattr(want, part).noise, rtol=0, atol=0)


def _segmented(fm: onnx.ModelProto, qm: onnx.ModelProto, path: str) -> tuple[object, object]:
    tuning = CaptureTuning(segment_above=0, pipelined_above=0, segment_bytes=4096)
    source = open_data(None, input_specs(fm), num_samples=4, seed=3)
    return capture(fm, qm, pair_models(fm, qm), source, path=path, tuning=tuning), source


@pytest.mark.parametrize("name", ["u8", "u16_qnn", "s8_per_channel"])
def test_a_segmented_run_exposing_integers_gives_the_fetch_runs_report(
    tiny_float: Path, tiny_quant: Callable[[str], Path], name: str
) -> None:
    fm, qm = onnx.load(str(tiny_float)), onnx.load(str(tiny_quant(name)))
    fast, _ = _segmented(fm, qm, "compiled")
    ref, _ = _segmented(fm, qm, "fetch")  # floats exposed, the reference reduction
    assert "post-Q/DQ tensors computed from their integers" in (fast.segment_note or "")  # type: ignore[attr-defined]
    assert "integers" not in (ref.segment_note or "")  # type: ignore[attr-defined]
    np.testing.assert_allclose(fast.per_sample, ref.per_sample, rtol=1e-5)  # type: ignore[attr-defined]


def test_only_posts_read_in_their_own_segment_are_swapped(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    fm, qm = onnx.load(str(tiny_float)), onnx.load(str(tiny_quant("u8")))
    pairing = pair_models(fm, qm)
    plan, specs = ReductionPlan.of(pairing), dequant.find_specs(qm, pairing)
    shapes = {i.name: tuple(d if isinstance(d, int) and d > 0 else 1 for d in i.shape) for i in input_specs(fm)}
    cut = segmented.plan_segments(fm, qm, plan, shapes, above=0, budget=1, dequant=specs)
    assert cut is not None and cut.count > 2 and cut.dequant
    writes = {o for p in cut.quant_parts for o in p.outputs}
    reads_later = {i for p in cut.quant_parts for i in p.inputs}
    for post, spec in cut.dequant.items():
        assert post not in writes and spec.ints in writes
    for post in set(specs) - set(cut.dequant):  # not swapped: it crosses a cut, so it is handed over anyway
        assert post in reads_later or post in {o.name for o in qm.graph.output}


@pytest.mark.parametrize("name", ["u8", "u16_qnn", "s8_per_channel"])
def test_a_whole_run_exposing_integers_gives_the_numpy_runs_report(
    tiny_float: Path, tiny_quant: Callable[[str], Path], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not segmented, one sample per call and batched: the compiled run exposes the integers (the batch kernel
    reads them too) and gives the floats-and-numpy run's sums; model outputs stay exposed as floats."""
    from qdebug.capture.fetch import FetchRun
    from qdebug.capture.kernels import c_kernel

    fm, qm = onnx.load(str(tiny_float)), onnx.load(str(tiny_quant(name)))
    pairing = pair_models(fm, qm)
    source = open_data(None, input_specs(fm), num_samples=6, seed=4)
    ref = capture(fm, qm, pairing, source, path="fetch", batch=1)
    one = capture(fm, qm, pairing, source, path="compiled", batch=1)
    assert one.segments == 1 and "post-Q/DQ tensors computed from their integers" in (one.segment_note or "")
    np.testing.assert_allclose(one.per_sample, ref.per_sample, rtol=1e-5)
    calls: list[int] = []
    real = c_kernel.CKernels.batch_dequant_sums

    def spy(self: c_kernel.CKernels, *args: object) -> None:
        calls.append(1)
        real(self, *args)

    monkeypatch.setattr(c_kernel.CKernels, "batch_dequant_sums", spy)
    batched = capture(fm, qm, pairing, source, path="compiled", batch=3)
    assert batched.batch == 3 and calls, batched.batch_reason  # the batches' integers went to the kernel
    np.testing.assert_allclose(batched.per_sample, ref.per_sample, rtol=1e-5)
    run = FetchRun(fm, qm, pairing, ["CPUExecutionProvider"], dequant_whole=True)
    outputs = {o.quant_name for o in pairing.outputs} | {o.name for o in qm.graph.output}
    assert run.q_specs and not set(run.q_specs) & outputs and not set(run.q_specs) & set(run.q_names)
    run.close()


def test_a_tensor_shared_by_a_batch_stays_shared_when_dequantized() -> None:
    """A batch's view of integers computed from constants repeats one sample's values (a zero stride): its floats
    are computed once and repeat too, so the batch reduction still reduces it once (batch_reduce._per_sample)."""
    spec = dequant.DequantSpec("post", "q", 0.25, 3, np.dtype(np.uint8))
    one = np.arange(12, dtype=np.uint8).reshape(1, 1, 12)
    shared = np.broadcast_to(one, (2, 5, 12))  # outer 2, five samples, the same values
    got = dequant.dequantize(spec, shared)
    assert got.shape == shared.shape and got.strides[1] == 0
    np.testing.assert_array_equal(got, dequant.dequantize(spec, np.ascontiguousarray(shared)))
