"""Segmented capture (:mod:`qdebug.capture.segmented`): a model whose one sample would expose too many bytes at
once runs segment by segment, and every sum is **bit-identical** to the whole-model run — same kernels (graph
optimizations off), same arrays, same reduction. The thresholds are lowered here so that small real models are
cut into several segments (the corpus's ViT-S and u2netp are cut at the defaults: docs/benchmarks.md)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import builders
import numpy as np
import onnx
import pytest
from conftest import save
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qdebug.capture import CaptureResult, CaptureTuning, capture, segmented
from qdebug.capture.kernels.reference import ReductionPlan
from qdebug.capture.tuning import SegmentRule
from qdebug.config import QuantConfig
from qdebug.data import open_data
from qdebug.model_io import input_specs
from qdebug.pairing import pair_models
from qdebug.quantizer import quantize
from qdebug.render.text import capture_line

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def transformer_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The bundled digits transformer (residual adds and attention: tensors that cross every cut) and its QDQ."""
    root = tmp_path_factory.mktemp("segmented")
    q = root / "t.qdq.onnx"
    quantize(REPO / "sample_models" / "digits_transformer.onnx", None, QuantConfig(num_samples=4), q)
    return onnx.load(str(REPO / "sample_models" / "digits_transformer.onnx")), onnx.load(str(q))


def _segmenting(budget: int | None, tuning: CaptureTuning | None = None) -> CaptureTuning:
    """``tuning`` with segmenting forced at ``budget`` exposed bytes per segment (``None``: never segmented)."""
    above = 0 if budget is not None else 1 << 62
    return dataclasses.replace(
        tuning or CaptureTuning(), segment_above=above, pipelined_above=above, segment_bytes=budget or 1
    )


def _run(
    fm: onnx.ModelProto,
    qm: onnx.ModelProto,
    budget: int | None,
    path: str = "fetch",
    tuning: CaptureTuning | None = None,
) -> CaptureResult:
    """``capture`` with segmenting forced at ``budget`` exposed bytes per segment (``None``: never segmented)."""
    source = open_data(None, input_specs(fm), num_samples=5, seed=3)
    return capture(fm, qm, pair_models(fm, qm), source, path=path, tuning=_segmenting(budget, tuning))


def _assert_identical(a: CaptureResult, b: CaptureResult) -> None:
    assert a.cumulative == b.cumulative and a.local == b.local and a.outputs == b.outputs
    assert a.float_min == b.float_min and a.float_max == b.float_max and a.elements == b.elements
    np.testing.assert_array_equal(a.per_sample, b.per_sample)
    np.testing.assert_array_equal(a.per_sample_outputs, b.per_sample_outputs)


@pytest.mark.parametrize("name", ["u8", "u16_qnn", "s8_per_channel"])
def test_segments_give_the_whole_runs_sums(tiny_float: Path, tiny_quant: Callable[[str], Path], name: str) -> None:
    fm, qm = onnx.load(str(tiny_float)), onnx.load(str(tiny_quant(name)))
    whole = _run(fm, qm, None)
    cut = _run(fm, qm, 2048)
    assert whole.segments == 1 and "segments" not in (whole.segment_note or "")  # it may say what was folded
    assert cut.segments >= 3 and "segments: one sample's tensors would take" in (cut.segment_note or "")
    _assert_identical(cut, whole)


@pytest.mark.parametrize("cores", [1, 2])
def test_the_transformer_cut_everywhere_gives_the_same_sums(
    transformer_pair: tuple[onnx.ModelProto, onnx.ModelProto], cores: int
) -> None:
    """One byte per segment: every float node is its own segment, so residuals and attention inputs cross many cuts
    and every weight's DequantizeLinear must follow its consumer. With two cores the next segment is inferred on a
    worker thread while this one is reduced; with one, in turn."""
    fm, qm = transformer_pair
    whole = _run(fm, qm, None, tuning=CaptureTuning(cores=cores))
    cut = _run(fm, qm, 1, tuning=CaptureTuning(cores=cores))
    assert cut.segments > 50
    _assert_identical(cut, whole)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(budget=st.integers(min_value=1, max_value=400_000))
def test_any_budget_gives_the_same_sums(transformer_pair: tuple[onnx.ModelProto, onnx.ModelProto], budget: int) -> None:
    fm, qm = transformer_pair
    whole = _run(fm, qm, None)
    cut = _run(fm, qm, budget)
    _assert_identical(cut, whole)


def test_the_compiled_reduction_runs_segmented_too(transformer_pair: tuple[onnx.ModelProto, onnx.ModelProto]) -> None:
    fm, qm = transformer_pair
    whole = _run(fm, qm, None, path="compiled")
    cut = _run(fm, qm, 4096, path="compiled")
    assert cut.path == "compiled" and cut.segments > 3
    _assert_identical(cut, whole)


def test_auto_segments_its_fetch_run_and_the_report_says_so(
    transformer_pair: tuple[onnx.ModelProto, onnx.ModelProto],
) -> None:
    from qdebug.debugger import capture_info

    fm, qm = transformer_pair
    cut = _run(fm, qm, 8192, path="auto")
    assert cut.path in ("fetch", "compiled") and cut.segments > 3
    info = capture_info(cut)
    assert info.segments == cut.segments
    assert f"each sample in {cut.segments} segments" in (capture_line(info) or "")
    back = type(info).from_dict(json.loads(json.dumps(info.to_dict())))
    assert back == info
    assert type(info).from_dict({"requested": "numpy", "backend": "numpy"}).segments == 1  # older reports


def test_auto_reduces_a_segmented_run_with_the_compiled_pass_at_any_n(
    transformer_pair: tuple[onnx.ModelProto, onnx.ModelProto], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Segmented samples are large: ``auto`` reduces with the compiled pass from the start (not only when many
    samples are left), so the reduction — and the process's memory — does not depend on N; the sums are the fetch
    run's."""
    from capture_helpers import loaded_warm_up

    from qdebug.capture import compiled

    monkeypatch.setattr(compiled, "start_warm_up", loaded_warm_up)  # numba loaded by the next sample
    fm, qm = transformer_pair
    cut = _run(fm, qm, 8192, path="auto")  # 5 samples: the fetch run alone would keep such a short run
    assert cut.path == "compiled" and cut.segments > 3, cut.fallback_reason
    why = str(cut.fallback_reason)
    assert "segments: the one-pass kernel" in why and "from the first sample" in why
    ref = _run(fm, qm, 8192, path="fetch")
    np.testing.assert_allclose(cut.per_sample, ref.per_sample, rtol=1e-5)


def test_small_samples_are_not_segmented_at_the_defaults(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    fm, qm = onnx.load(str(tiny_float)), onnx.load(str(tiny_quant("u8")))
    cap = capture(fm, qm, pair_models(fm, qm), open_data(None, input_specs(fm), num_samples=2, seed=0), path="fetch")
    assert cap.segments == 1 and "segments" not in (cap.segment_note or "")


def test_a_segment_that_cannot_load_goes_back_to_the_whole_model(
    tiny_float: Path, tiny_quant: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An op ORT refuses once cut out (here: made unknown in segment 1) only costs the memory bound, with the
    reason; the sums are the whole run's."""
    fm, qm = onnx.load(str(tiny_float)), onnx.load(str(tiny_quant("u8")))
    whole = _run(fm, qm, None)
    real = segmented._part_model

    def broken(model: onnx.ModelProto, part: object, types: object, j: int) -> onnx.ModelProto:
        out = real(model, part, types, j)  # type: ignore[arg-type]
        if j == 1:
            out.graph.node[0].op_type = "NoSuchOp"
        return out

    monkeypatch.setattr(segmented, "_part_model", broken)
    cap = _run(fm, qm, 2048)
    assert cap.segments == 1 and (cap.segment_note or "").startswith("not segmented: a segment could not be loaded")
    _assert_identical(cap, whole)


def _dynamic(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its inputs' and outputs' last dimension made symbolic (inferred shapes dropped)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.value_info[:]
    for v in [*out.graph.input, *out.graph.output]:
        v.type.tensor_type.shape.dim[-1].dim_param = "n"
    return out


def test_later_samples_of_other_shapes_run_through_the_same_segments(tmp_path: Path) -> None:
    """Segments are cut at the first sample's shapes; a longer sample runs through them unchanged (the cut's inputs
    carry no shape)."""
    from qdebug.data import NpzFolderData

    f = save(builders.elementwise_chain(ops=8, elements=64), tmp_path / "c.onnx")
    q = tmp_path / "c.qdq.onnx"
    quantize(f, None, QuantConfig(num_samples=2), q)
    fm, qm = _dynamic(onnx.load(str(f))), _dynamic(onnx.load(str(q)))
    rng = np.random.default_rng(0)
    (tmp_path / "data").mkdir()
    for i, n in enumerate((64, 200, 64)):
        np.savez(tmp_path / "data" / f"{i}.npz", x=rng.standard_normal((2, 1, n)).astype(np.float32))
    results = []
    for above in (1 << 62, 0):
        tuning = CaptureTuning(segment_above=above, pipelined_above=above, segment_bytes=512)
        source = NpzFolderData(tmp_path / "data", input_specs(fm))
        results.append(capture(fm, qm, pair_models(fm, qm), source, path="fetch", tuning=tuning))
    assert results[0].segments == 1 and results[1].segments >= 3
    _assert_identical(results[1], results[0])


def test_control_flow_is_not_segmented(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    fm, qm = onnx.load(str(tiny_float)), onnx.load(str(tiny_quant("u8")))
    plan = ReductionPlan.of(pair_models(fm, qm))
    branch = onnx.helper.make_graph(
        [onnx.helper.make_node("Constant", [], ["c"], value_float=1.0)],
        "b",
        [],
        [onnx.helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, [])],
    )
    with_if = onnx.ModelProto()
    with_if.CopyFrom(fm)
    with_if.graph.initializer.append(onnx.numpy_helper.from_array(np.array(True), "cond"))
    with_if.graph.node.append(onnx.helper.make_node("If", ["cond"], ["r"], then_branch=branch, else_branch=branch))
    shapes = {i.name: (1, *[d.dim_value or 1 for d in i.type.tensor_type.shape.dim[1:]]) for i in fm.graph.input}
    assert segmented.plan_segments(fm, qm, plan, shapes, above=0, budget=1) is not None
    assert segmented.plan_segments(with_if, qm, plan, shapes, above=0, budget=1) is None


def _child_peak(model: Path, quant: Path, segment: bool) -> dict[str, float]:
    code = f"""
import json, onnx
from qdebug.capture import CaptureTuning, capture
from qdebug.data import open_data
from qdebug.pairing import input_specs, pair_models
above = {(64 << 20) if segment else (1 << 62)}
tuning = CaptureTuning(segment_above=above, pipelined_above=above, segment_bytes=64 << 20)
fm, qm = onnx.load({str(model)!r}), onnx.load({str(quant)!r})
source = open_data(None, input_specs(fm), num_samples=3, seed=0)
cap = capture(fm, qm, pair_models(fm, qm), source, path="fetch", tuning=tuning)
hwm = [int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
print(json.dumps({{"peak": hwm, "segments": cap.segments, "cum": [s.noise for s in cap.cumulative]}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_segmenting_bounds_the_peak(tmp_path: Path) -> None:
    """A chain of 48 elementwise ops on 4 MB tensors exposes ~580 MB per sample; cut into ~64 MB segments (two alive
    at once: the next is inferred while one is reduced) the process's peak (VmHWM, ORT's own buffers included) drops
    by well over 200 MB (measured: 848 -> 533-541 MB).

    Not by the whole ~450 MB: every segment session keeps some freed output memory in glibc's heap (its dynamic
    mmap threshold moves 4 MB blocks onto the heap, where they fragment), so many small segments keep more;
    fixing the threshold (``mallopt``) removes that but made ViT-S 30 % slower per sample, for 5 % less memory."""
    f = save(builders.elementwise_chain(ops=48, elements=1 << 20), tmp_path / "chain.onnx")
    q = tmp_path / "chain.qdq.onnx"
    quantize(f, None, QuantConfig(num_samples=2), q)
    whole, cut = _child_peak(f, q, False), _child_peak(f, q, True)
    assert whole["segments"] == 1 and cut["segments"] >= 6
    assert cut["cum"] == whole["cum"]
    assert cut["peak"] < whole["peak"] - 200, (cut["peak"], whole["peak"])


def test_two_cores_segment_what_the_whole_run_cannot_pipeline() -> None:
    """On two or more cores the threshold is the whole run's own pipelining limit: a sample too large to overlap
    with the next is overlapped segment by segment (faster and smaller on PP-OCRv4 rec/det and YOLOv8n,
    docs/benchmarks.md); on one core only memory decides."""
    t = CaptureTuning()
    assert t.threshold(True) == t.pipelined_above == t.pipeline_bytes == SegmentRule.for_cores(2).above
    assert t.threshold(False) == t.segment_above > t.pipeline_bytes
    assert SegmentRule.for_cores(1).above == t.segment_above


def test_auto_times_fewer_intra_op_threads_on_a_long_segmented_run(
    transformer_pair: tuple[onnx.ModelProto, onnx.ModelProto], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread trial (qdebug/capture/threads.py) on a real segmented run: the segment sessions are made again with
    one thread, timed, kept or given back — the report says which, with the numbers — and the sums do not change."""
    from capture_helpers import loaded_warm_up

    from qdebug.capture import compiled

    monkeypatch.setattr(compiled, "start_warm_up", loaded_warm_up)
    # two cores, pipelined, whatever runs the test; a trial of one sample each, on a short run
    tuning = CaptureTuning(trial_min_remaining=3, trial_samples=1, cores=2)
    made: list[int | None] = []
    plain = segmented.make_session

    def counting(*args: object, **kwargs: object) -> object:
        made.append(kwargs.get("threads"))  # type: ignore[arg-type]
        return plain(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(segmented, "make_session", counting)
    fm, qm = transformer_pair
    cut = _run(fm, qm, 8192, path="auto", tuning=tuning)
    reason = str(cut.fallback_reason)
    assert cut.path == "compiled" and cut.segments > 3, reason
    assert "segment inference on 1 intra-op thread" in reason or "default threads kept: 1 thread(s) measured" in reason
    assert 1 in made  # the sessions were made again with one thread
    ref = _run(fm, qm, 8192, path="fetch", tuning=tuning)
    np.testing.assert_allclose(cut.per_sample, ref.per_sample, rtol=1e-5)


def test_sizes_onnx_cannot_infer_come_from_one_run_of_a_small_model(
    tiny_float: Path, tiny_quant: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where ONNX's shape inference leaves sizes unknown, a small float model is run once on zeros of the sample's
    shapes (no sympy import: ORT's symbolic inference is not called), a large one goes through the symbolic
    inference; both give the sizes ONNX's inference gives where it can."""
    fm, qm = onnx.load(str(tiny_float)), onnx.load(str(tiny_quant("u8")))
    plan = ReductionPlan.of(pair_models(fm, qm))
    shapes = {i.name: tuple(d.dim_value or 1 for d in i.type.tensor_type.shape.dim) for i in fm.graph.input}
    want = segmented.exposed_bytes(fm, plan, shapes)
    assert want is not None
    real_symbolic = segmented._symbolic
    monkeypatch.setattr(segmented, "_onnx_inferred", lambda m: None)  # as if ONNX's inference knew nothing

    def no_symbolic(model: onnx.ModelProto) -> None:
        raise AssertionError("the symbolic inference ran for a small model")

    monkeypatch.setattr(segmented, "_symbolic", no_symbolic)
    assert segmented.exposed_bytes(fm, plan, shapes) == want
    monkeypatch.setattr(segmented, "_symbolic", real_symbolic)
    assert segmented.exposed_bytes(fm, plan, shapes, probe_bytes=0) == want  # every model is large: symbolic
