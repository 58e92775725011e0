"""The ``auto`` capture choice: it picks a backend, records why, gives the same sums whichever it picks, and
``--capture`` / ``DebugOptions(capture=...)`` override it. Real tiny models in ONNX Runtime; only the clock that
``AutoRun`` reads is scripted, so the decisions are deterministic (no timing is asserted)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest

from qdebug.capture import AUTO, CAPTURE_PATHS, CaptureTuning, capture, capture_choices
from qdebug.capture.auto import AutoRun, estimate_setup
from qdebug.capture.base import CaptureSums, SampleSums
from qdebug.data import open_data
from qdebug.debugger import DebugOptions, debug
from qdebug.model_io import input_specs
from qdebug.pairing import pair_models


def _models(tiny_float: Path, quant: Path) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    return onnx.load(str(tiny_float)), onnx.load(str(quant))


def _samples(fm: onnx.ModelProto, n: int) -> list[dict[str, np.ndarray]]:
    return list(open_data(None, input_specs(fm), num_samples=n, seed=3))


def _clock(steps: list[float]) -> Callable[[], float]:
    """A clock that advances by ``steps[i]`` between its (2i)-th and (2i+1)-th reading: one step per timed
    section, in AutoRun's order (fetch set-up, fetch samples 0-3, merged set-up, merged probe)."""
    now = 0.0
    times: Iterator[float] = iter(steps)

    def read() -> float:
        nonlocal now
        read.calls += 1  # type: ignore[attr-defined]
        if read.calls % 2 == 0:  # type: ignore[attr-defined]
            now += next(times)
        return now

    read.calls = 0  # type: ignore[attr-defined]
    return read


def _run(
    fm: onnx.ModelProto, qm: onnx.ModelProto, n: int, steps: list[float], tuning: CaptureTuning | None = None
) -> tuple[AutoRun, CaptureSums]:
    pairing = pair_models(fm, qm)
    # batch=1: the unbatched choice
    run = AutoRun(fm, qm, pairing, ["CPUExecutionProvider"], n, clock=_clock(steps), batch=1, tuning=tuning)
    n_quant = sum(1 for a in pairing.activations if a.quantized)
    sums = CaptureSums(len(pairing.activations), n_quant, len(pairing.outputs))
    for i, s in enumerate(_samples(fm, n)):
        res = run.reduce(i, s)
        assert isinstance(res, SampleSums)
        sums.add(i, res)
    return run, sums


def test_auto_is_the_default_and_a_choice(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    assert DebugOptions().capture == AUTO
    assert CAPTURE_PATHS[0] == AUTO and set(CAPTURE_PATHS) >= {"auto", "graph", "fetch", "compiled"}
    assert set(capture_choices()) == {*CAPTURE_PATHS, "numpy"}  # the former name is accepted, not shown
    rep = debug(tiny_float, tiny_quant("u8"), None, DebugOptions(num_samples=12))
    info = rep.meta.capture
    assert info is not None and info.requested == "auto" and info.backend in ("graph", "compiled")
    assert info.reason  # the choice is always explained


def test_a_fast_probe_keeps_the_merged_graph(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    fm, qm = _models(tiny_float, tiny_quant("u8"))
    # numpy set-up 1 ms, numpy samples 1 s, merged set-up 10 ms, merged probe 0.1 s: the merged graph wins
    run, _ = _run(fm, qm, 12, [0.001, 1.0, 1.0, 1.0, 1.0, 0.01, 0.1])
    choice = run.final()
    assert choice.backend == "graph" and "measured 100 ms/sample vs compiled 1000 ms/sample" in choice.reason
    assert run.graph is not None and run.current is run.graph


def test_numpy_is_measured_after_its_first_sample(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    fm, qm = _models(tiny_float, tiny_quant("u8"))
    # sample 0 pays first-run costs (5 s); samples 1-3 show numpy's real cost, the fastest (200 ms) counts
    run, _ = _run(fm, qm, 12, [0.001, 5.0, 0.3, 0.2, 0.25, 0.01, 0.1])
    assert run.final().backend == "graph" and "measured 100 ms/sample vs compiled 200 ms/sample" in run.final().reason


def test_a_slow_probe_goes_back_to_the_fetch_run(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    fm, qm = _models(tiny_float, tiny_quant("u8"))
    run, _ = _run(fm, qm, 12, [0.001, 1.0, 1.0, 1.0, 1.0, 0.01, 2.0])
    # the fetch-and-reduce run, reduced by the C kernel from the first sample (conftest builds it)
    choice = run.final()
    assert choice.backend == "compiled" and "merged graph measured 2000 ms/sample vs compiled" in choice.reason
    assert run.graph is None and run.current is run.fetch  # the merged session is dropped


def test_an_expensive_setup_is_not_even_tried(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    fm, qm = _models(tiny_float, tiny_quant("u8"))
    # numpy set-up 10 s, samples 1 ms: the merged graph could never pay its estimated set-up back
    run, _ = _run(fm, qm, 12, [10.0, 0.001, 0.001, 0.001, 0.001])
    assert run.final().backend == "compiled" and "set-up est." in run.final().reason
    assert run.graph is None
    # with the C kernel reducing from sample 0, nothing else needs weighing: decided on sample 0 (its time, an
    # over-estimate, in the reason), so the run pipelines from sample 1 instead of timing samples 1-3 one by one
    assert "sample 0's time" in run.final().reason and len(run.totals) == 1


def test_every_choice_gives_the_fetch_sums(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    fm, qm = _models(tiny_float, tiny_quant("u8"))
    source = open_data(None, input_specs(fm), num_samples=12, seed=3)
    ref = capture(fm, qm, pair_models(fm, qm), source, path="fetch")
    probe = [1.0, 1.0, 1.0, 1.0]  # fetch samples 0-3
    for steps in ([0.001, *probe, 0.01, 0.1], [0.001, *probe, 0.01, 2.0], [10.0, 0.001, 0.001, 0.001, 0.001]):
        _, sums = _run(fm, qm, 12, steps)
        np.testing.assert_allclose(sums.rows(), ref.per_sample, rtol=1e-6)
        assert np.array_equal(sums.elements, np.array(ref.elements))


def test_one_sample_never_opens_a_second_session(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    fm, qm = _models(tiny_float, tiny_quant("u8"))
    source = open_data(None, input_specs(fm), num_samples=1)
    cap = capture(fm, qm, pair_models(fm, qm), source, path=AUTO)
    assert (cap.requested, cap.path) == ("auto", "compiled") and "too few" in (cap.fallback_reason or "")


def test_setup_estimate_grows_faster_than_the_node_count() -> None:
    small, large = estimate_setup(1.0, [100, 100], 400), estimate_setup(1.0, [1000, 1000], 4000)
    assert small > 2.0 and large > small  # 2x the nodes of both sessions costs more than 2x their set-up
    assert estimate_setup(1.0, [], 10) == float("inf")


@pytest.mark.parametrize(
    ("flag", "name"), [("fetch", "fetch"), ("numpy", "fetch"), ("graph", "graph"), ("compiled", "compiled")]
)
def test_the_override_is_obeyed(
    flag: str, name: str, tiny_float: Path, tiny_quant: Callable[[str], Path], run_cli: Callable[..., object]
) -> None:
    """Each backend, and ``numpy``, the fetch backend's former name (old flags keep working, recorded as ``fetch``)."""
    rep = debug(tiny_float, tiny_quant("u8"), None, DebugOptions(num_samples=3, capture=flag))
    assert rep.meta.capture is not None and (rep.meta.capture.requested, rep.meta.capture.backend) == (name, name)
    res = run_cli("debug", "-f", tiny_float, "-q", tiny_quant("u8"), "--samples", "3", "--capture", flag)
    assert res.code == 0 and f"capture: {name} backend" in res.stdout + res.out  # type: ignore[attr-defined]
    assert "auto:" not in res.stdout + res.out  # type: ignore[attr-defined]


def test_the_cli_says_what_auto_chose_and_why(
    tiny_float: Path, tiny_quant: Callable[[str], Path], run_cli: Callable[..., object]
) -> None:
    res = run_cli("debug", "-f", tiny_float, "-q", tiny_quant("u8"), "--samples", "2")
    text = res.stdout + res.out  # type: ignore[attr-defined]
    assert res.code == 0 and "capture: compiled backend (auto: 2 sample(s): too few" in text  # type: ignore[attr-defined]


def test_bound_outputs_give_the_plain_runs_sums(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fetch run's I/O binding (reused output arrays) on every model size, with input shapes that change
    between samples (a dynamic batch: 2, 2, 3, 3, 2), against the same run without it (binding made a no-op)."""
    import builders
    from conftest import save

    from qdebug.capture.bound import BoundFetch
    from qdebug.config import QuantConfig
    from qdebug.quantizer import quantize

    fp = save(builders.tiny_convnet(batch="N"), tmp_path / "f.onnx")
    qp = tmp_path / "q.onnx"
    quantize(fp, None, QuantConfig(num_samples=8), qp, input_shapes={"x": [2, 1, 6, 6]})
    fm, qm = onnx.load(str(fp)), onnx.load(str(qp))
    rng = np.random.default_rng(0)
    xs = [rng.random((b, 1, 6, 6), dtype=np.float32) for b in (2, 2, 3, 3, 2)]

    class Source:
        description = "batches of 2 and 3"

        def __len__(self) -> int:
            return len(xs)

        def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
            return iter({"x": x} for x in xs)

    pairing = pair_models(fm, qm)
    with monkeypatch.context() as m:
        m.setattr(BoundFetch, "_bind", lambda self, values, key: None)  # every run plain: the reference
        plain = capture(fm, qm, pairing, Source(), path="fetch")  # type: ignore[arg-type]
    bound_runs: list[BoundFetch] = []
    real_init = BoundFetch.__init__

    def spy(self: BoundFetch, *args: object) -> None:
        real_init(self, *args)  # type: ignore[arg-type]
        bound_runs.append(self)

    monkeypatch.setattr(BoundFetch, "__init__", spy)
    bound = capture(fm, qm, pairing, Source(), path="fetch")  # type: ignore[arg-type]
    assert bound_runs and all(b.binding is not None for b in bound_runs)  # the binding was really used
    np.testing.assert_array_equal(bound.per_sample, plain.per_sample)
    assert bound.cumulative == plain.cumulative and bound.local == plain.local and bound.outputs == plain.outputs


def test_large_tensors_keep_the_fetch_run_without_building_the_graph(
    tiny_float: Path, tiny_quant: Callable[[str], Path]
) -> None:
    tuning = CaptureTuning(graph_max_mean_elements=1)  # every tiny tensor counts as "large"
    fm, qm = _models(tiny_float, tiny_quant("u8"))
    run, _ = _run(fm, qm, 12, [0.001, 1.0, 1.0, 1.0, 1.0], tuning)
    assert run.final().backend == "compiled" and "elements on average" in run.final().reason
    assert run.graph is None and len(run.totals) == 1  # decided on sample 0


def test_samples_read_ahead_before_the_choice_are_announced_once_it_is_made(
    tiny_float: Path, tiny_quant: Callable[[str], Path]
) -> None:
    """The capture loop announces each sample once, when it reads it: those read while ``auto`` was undecided are
    held and handed to the fetch run when the choice is made, so the pipeline starts at sample 1's reduction."""
    tuning = CaptureTuning(graph_max_mean_elements=1)  # the merged graph is ruled out by sample 0
    fm, qm = _models(tiny_float, tiny_quant("u8"))
    n = tuning.min_remaining + 4
    samples = _samples(fm, n)
    run = AutoRun(fm, qm, pair_models(fm, qm), ["CPUExecutionProvider"], n, batch=1, tuning=tuning)
    run.prefetch(1, samples[1])  # the loop reads two ahead of sample 0 (its lookahead while undecided is 1)
    run.prefetch(2, samples[2])
    assert run.choice is None and run.fetch._queued == []
    run.reduce(0, samples[0])
    assert run.choice is not None and "elements on average" in run.choice.reason  # decided on sample 0
    assert [i for i, _ in run.fetch._queued] == [1, 2] and run.held == []
    run.reduce(1, samples[1])
    if run.fetch.pipelining:  # two cores or more: sample 2 is inferred on the worker while sample 1 is reduced
        pending = run.fetch.pipeline.pending
        assert pending is not None and pending[0] == {2}
    pairing = pair_models(fm, qm)
    sums = CaptureSums(len(pairing.activations), sum(a.quantized for a in pairing.activations), len(pairing.outputs))
    for i in range(2, n):
        if i + 1 < n:
            run.prefetch(i + 1, samples[i + 1])
        res = run.reduce(i, samples[i])
        assert isinstance(res, SampleSums)
        sums.add(i, res)
    run.close()
    _, alone = _run(fm, qm, n, [0.001] * 5)  # never announced, the same samples: the same sums
    np.testing.assert_array_equal(sums.rows(), alone.rows()[2:])


def _reduce_the_rest(
    run: AutoRun, fm: onnx.ModelProto, qm: onnx.ModelProto, samples: list[dict[str, np.ndarray]], res: list[object]
) -> np.ndarray:
    """Reduce the samples after those in ``res``, each announced one ahead as the capture loop does; every sample's
    sums as rows."""
    for i in range(len(res), len(samples)):
        if i + 1 < len(samples):
            run.prefetch(i + 1, samples[i + 1])
        res.append(run.reduce(i, samples[i]))
    run.close()
    pairing = pair_models(fm, qm)
    sums = CaptureSums(len(pairing.activations), sum(a.quantized for a in pairing.activations), len(pairing.outputs))
    for i, r in enumerate(res):
        assert isinstance(r, SampleSums)
        sums.add(i, r)
    return sums.rows()


def test_a_run_too_short_to_weigh_is_decided_before_sample_0(
    tiny_float: Path, tiny_quant: Callable[[str], Path]
) -> None:
    """With fewer than ``min_remaining`` samples after sample 0 nothing is weighed, so ``auto`` decides before any
    sample: the samples the loop reads ahead go to the fetch run at once, and sample 1 is inferred on the worker
    while sample 0 is reduced (not after it, on the main thread). The same sums."""
    fm, qm = _models(tiny_float, tiny_quant("u8"))
    samples = _samples(fm, 5)
    run = AutoRun(fm, qm, pair_models(fm, qm), ["CPUExecutionProvider"], 5, batch=1)
    assert run.choice is not None and "too few to pay" in run.choice.reason
    run.prefetch(1, samples[1])
    assert [i for i, _ in run.fetch._queued] == [1] and run.held == []
    res = [run.reduce(0, samples[0])]
    if run.fetch.pipelining:  # two cores or more
        pending = run.fetch.pipeline.pending
        assert pending is not None and pending[0] == {1}
    rows = _reduce_the_rest(run, fm, qm, samples, res)
    _, alone = _run(fm, qm, 5, [0.001] * 5)  # never announced: the same sums
    np.testing.assert_array_equal(rows, alone.rows())


@pytest.mark.parametrize("small", [True, False])
def test_a_run_that_will_not_batch_prepares_its_next_outputs_during_sample_0(
    small: bool, tiny_float: Path, tiny_quant: Callable[[str], Path]
) -> None:
    """``auto`` decides batching once sample 0's size is known, before reducing it: 4 samples left are fewer than a
    full batch, so the run goes one sample per call and, pipelining, makes sample 2's bound outputs on the worker
    while sample 0 is reduced — when a sample's tensors are small (``prep_bytes``). The same sums as the unbatched
    run either way."""

    tuning = CaptureTuning() if small else CaptureTuning(prep_bytes=0)
    fm, qm = _models(tiny_float, tiny_quant("u8"))
    samples = _samples(fm, 5)
    run = AutoRun(fm, qm, pair_models(fm, qm), ["CPUExecutionProvider"], 5, tuning=tuning)
    assert run.batch_planned
    res = [run.reduce(0, samples[0])]
    assert run.fetch.batch_limit == 1 and "fewer than a full batch" in (run.fetch.batch_reason or "")
    if run.fetch.pipelining and small:
        prep = run.fetch.pipeline.prep
        assert prep is not None and prep[0] == 0
    else:
        pipeline = run.fetch.pipeline
        assert pipeline is None or pipeline.prep is None
    rows = _reduce_the_rest(run, fm, qm, samples, res)
    _, alone = _run(fm, qm, 5, [0.001] * 5)
    np.testing.assert_array_equal(rows, alone.rows())
