"""Scale-out on Ray (docs/scale.md), with a real local Ray cluster on 127.0.0.1 (two workers), started once for
this module as qdebug starts one: the distributed capture gives the single-process report, survives a killed worker
without losing or double-counting a sample, reports a sample's data error as one process does, and tidies up on
Ctrl-C. (Its listeners, signals and leftovers: tests/test_ray_security.py, tests/test_ray_signals.py.)

Ray is an optional extra: without it these tests skip locally and FAIL under ``CI=true`` (``make test`` installs
it through the dev extras)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from conftest import SAMPLE_MODELS, assert_one_line_error, save

from qdebug.capture import CaptureResult, CaptureTuning, capture
from qdebug.cluster import Cluster, ClusterSpec, connect
from qdebug.config import QuantConfig
from qdebug.data import open_data, range_reader
from qdebug.debugger import DebugOptions, debug
from qdebug.errors import EXIT_DATA, ClusterError, ConfigError, MissingExtraError
from qdebug.metrics import ErrorSums
from qdebug.model_io import input_specs, load_model
from qdebug.pairing import pair_models
from qdebug.quantizer import quantize

# Ray's own modules warn about their deprecated internals at import and start-up, and its process handles warn when
# collected after a shutdown: not ours to fix.
pytestmark = pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::ResourceWarning"
)


_START_FAILED: list[str] = []


@pytest.fixture(scope="module")
def ray_module() -> Iterator[Any]:
    """One local Ray cluster for the module, started as qdebug starts one (:func:`qdebug.cluster.connect`: on
    127.0.0.1 only, two CPUs, no dashboard, a small object store); to the tests, a Ray already running in this process,
    which qdebug uses and leaves running."""
    try:
        import ray
    except ImportError:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("ray is not installed; make test installs it (the dev extras include qdebug[ray])")
        pytest.skip("ray is not installed (pip install 'qdebug[ray]')")
    if _START_FAILED:  # pytest runs a failed module fixture again for every test: fail at once instead
        pytest.fail(f"the module's Ray cluster did not start: {_START_FAILED[0]}")
    with contextlib.ExitStack() as stack:
        for attempt in (1, 2):  # Ray's agents get 15 s to start: on a loaded machine a second try may be needed
            try:  # two workers even on a one-core machine
                stack.enter_context(connect(ClusterSpec(workers=2, allow_oversubscribe=True)))
                break
            except ClusterError as exc:
                if attempt == 2:
                    _START_FAILED.append(str(exc))
                    raise
        yield ray


@pytest.fixture(scope="module")
def cluster(ray_module: Any) -> Cluster:
    """The module's cluster as qdebug sees it: two workers, not started by qdebug."""
    return Cluster(ray_module, workers=2, started=False)


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The bundled digits CNN (a real trained model), its 8-bit QDQ model, and 64 evaluation samples in an .npz."""
    d = tmp_path_factory.mktemp("ray")
    f = SAMPLE_MODELS / "digits_cnn.onnx"
    q = d / "digits_cnn.qdq.onnx"
    quantize(f, SAMPLE_MODELS / "digits_calib.npz", QuantConfig(), q)
    data = d / "eval64.npz"
    np.savez(data, input=np.load(SAMPLE_MODELS / "digits_eval.npz")["input"][:64])
    return f, q, data


def no_workers_left(ray: Any) -> bool:
    """True once no qdebug worker is alive (a kill reaches Ray's control store asynchronously: bounded wait)."""
    import time

    for _ in range(100):
        if not [n for n in ray.util.list_named_actors() if n.startswith("qdebug-")]:
            return True
        time.sleep(0.1)
    return False


def _rel(a: float, b: float) -> float:
    return 0.0 if a == b else abs(a - b) / max(abs(a), abs(b))


def _same_sums(a: ErrorSums, b: ErrorSums) -> None:
    assert (a.count, a.samples, a.nonfinite_reference, a.nonfinite_test) == (
        b.count,
        b.samples,
        b.nonfinite_reference,
        b.nonfinite_test,
    )
    assert a.max_abs == b.max_abs
    assert _rel(a.signal, b.signal) <= 1e-12 and _rel(a.noise, b.noise) <= 1e-12, (a, b)


def assert_same_capture(one: CaptureResult, many: CaptureResult) -> None:
    """Counts, minima, maxima and per-sample rows identical; sums within 1e-12 relative."""
    assert many.num_samples == one.num_samples
    assert (many.float_min, many.float_max, many.elements) == (one.float_min, one.float_max, one.elements)
    for a, b in zip((*one.cumulative, *one.outputs), (*many.cumulative, *many.outputs), strict=True):
        _same_sums(a, b)
    assert [x is None for x in one.local] == [x is None for x in many.local]
    for a, b in zip(one.local, many.local, strict=True):
        if a is not None and b is not None:
            _same_sums(a, b)
    np.testing.assert_array_equal(many.per_sample, one.per_sample)
    np.testing.assert_array_equal(many.per_sample_outputs, one.per_sample_outputs)


def _captures(f: Path, q: Path, data: Path, cluster: Cluster, progress: Any = None) -> tuple[CaptureResult, ...]:
    from qdebug.capture.ray_backend import capture_distributed

    fm, qm = load_model(f, "float model"), load_model(q, "quantized model")
    pairing = pair_models(fm, qm)
    source = open_data(data, input_specs(fm))
    one = capture(fm, qm, pairing, source, path="fetch")
    many = capture_distributed(fm, qm, pairing, source, cluster, progress=progress, path="fetch")
    return one, many


def test_distributed_capture_equals_one_process(digits: tuple[Path, Path, Path], cluster: Cluster) -> None:
    seen: list[tuple[int, int]] = []
    one, many = _captures(*digits, cluster, progress=lambda done, total: seen.append((done, total)))
    assert_same_capture(one, many)
    assert many.path == "fetch" and "on 2 Ray worker(s)" in (many.fallback_reason or "")
    assert seen and seen[-1] == (64, 64) and all(t == 64 and 0 <= d <= 64 for d, t in seen)


def test_debug_report_on_workers_equals_one_process(digits: tuple[Path, Path, Path], ray_module: Any) -> None:
    """Through ``debug()`` (``DebugOptions.cluster``), synthetic data regenerated on the workers from the seed."""
    f, q, _ = digits
    one = debug(f, q, None, DebugOptions(num_samples=12, capture="fetch"))
    many = debug(f, q, None, DebugOptions(num_samples=12, capture="fetch", cluster=ClusterSpec(workers=2)))
    assert ray_module.is_initialized()  # a Ray qdebug did not start is left running
    assert [a.tensor_name for a in many.activations] == [a.tensor_name for a in one.activations]
    for a, b in zip(one.activations, many.activations, strict=True):
        assert (a.elements, a.float_min, a.float_max, a.worst_sample) == (
            b.elements,
            b.float_min,
            b.float_max,
            b.worst_sample,
        )
        for x, y in ((a.cumulative_sqnr_db, b.cumulative_sqnr_db), (a.local_sqnr_db, b.local_sqnr_db)):
            assert (x is None) == (y is None) and (x is None or math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-9))
    np.testing.assert_array_equal(many.per_sample.values, one.per_sample.values)


def test_a_killed_worker_loses_and_doubles_no_sample(digits: tuple[Path, Path, Path], cluster: Cluster) -> None:
    """A worker killed while the job runs: its shard is done again by another worker; every sample counted once."""
    ray = cluster.ray
    killed: list[str] = []
    before = set(ray.util.list_named_actors())

    def kill_one(done: int, total: int) -> None:
        if not killed and done < total:
            name = sorted(n for n in ray.util.list_named_actors() if n.startswith("qdebug-") and n not in before)[0]
            ray.kill(ray.get_actor(name), no_restart=True)
            killed.append(name)

    one, many = _captures(*digits, cluster, progress=kill_one)
    assert killed, "the job ended before a worker could be killed"
    assert_same_capture(one, many)
    assert "retried after a worker died" in (many.fallback_reason or "")


def test_a_sample_the_model_cannot_run_is_the_same_error_on_workers(
    tmp_path: Path, run_cli: Any, ray_module: Any
) -> None:
    """The data error of one process (exit code, one line naming the data and the sample) from a worker."""
    from onnx import TensorProto, helper

    shape = onnx.numpy_helper.from_array(np.array([1, 36], np.int64), "shape")
    w = onnx.numpy_helper.from_array(np.full((36, 2), 0.1, np.float32), "w")
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["flat"]), helper.make_node("MatMul", ["flat", "w"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        [shape, w],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    f = save(m, tmp_path / "f.onnx")
    q = tmp_path / "q.onnx"
    quantize(f, None, QuantConfig(num_samples=2), q)
    argv = ("debug", "-f", f, "-q", q, "--samples", "4", "--input-shape", "x:2,1,6,6")
    alone = run_cli(*argv)
    spread = run_cli(*argv, "--workers", "2")
    assert_one_line_error(alone, EXIT_DATA, "synthetic uniform", "sample 0", "float model cannot run")
    assert_one_line_error(spread, EXIT_DATA, "synthetic uniform", "float model cannot run")
    # the first sample that fails on the workers may be another one than in one process: same line otherwise
    assert spread.stderr.split("sample ")[0] == alone.stderr.split("sample ")[0]
    assert no_workers_left(ray_module)  # the job's workers are gone


def test_ctrl_c_stops_the_job_and_leaves_a_cluster_it_did_not_start(
    digits: tuple[Path, Path, Path], cluster: Cluster
) -> None:
    ray = cluster.ray

    def interrupt(done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _captures(*digits, cluster, progress=interrupt)
    assert no_workers_left(ray)  # every worker of the job was stopped
    assert ray.is_initialized()  # the cluster itself is not qdebug's: still there


@pytest.fixture(scope="module")
def transformer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The bundled digits transformer (residuals and attention: tensors that cross every cut) and its QDQ model."""
    q = tmp_path_factory.mktemp("ray-transformer") / "t.qdq.onnx"
    quantize(SAMPLE_MODELS / "digits_transformer.onnx", None, QuantConfig(num_samples=4), q)
    return SAMPLE_MODELS / "digits_transformer.onnx", q


def _force_segments(two_cores: int, one_core: int, budget: int) -> CaptureTuning:
    """The thresholds of ``tests/test_capture_segmented.py`` (one sample's bytes above which a run on two or more
    cores / on one core is segmented, bytes per segment), given to the driver: the job carries them to the workers;
    two cores: the local run pipelines, on any machine."""
    return CaptureTuning(pipelined_above=two_cores, segment_above=one_core, segment_bytes=budget, cores=2)


def _eight_samples(model: str, f: Path, tmp_path: Path) -> Any:
    """8 samples: 2 workers then get 8 shards of one sample each, whose merge adds the samples in the same order as
    one process — so every sum must be bit-identical, not only within floating-point association."""
    if model == "digits_cnn":
        np.savez(tmp_path / "eval8.npz", input=np.load(SAMPLE_MODELS / "digits_eval.npz")["input"][:8])
        return open_data(tmp_path / "eval8.npz", input_specs(load_model(f, "float model")))
    return open_data(None, input_specs(load_model(f, "float model")), num_samples=8, seed=3)


def assert_identical(one: CaptureResult, many: CaptureResult) -> None:
    """Every field of the two results' sums, ranges and per-sample rows equal, bit for bit."""
    assert many.num_samples == one.num_samples
    assert many.cumulative == one.cumulative and many.local == one.local and many.outputs == one.outputs
    assert (many.float_min, many.float_max, many.elements) == (one.float_min, one.float_max, one.elements)
    np.testing.assert_array_equal(many.per_sample, one.per_sample)
    np.testing.assert_array_equal(many.per_sample_outputs, one.per_sample_outputs)


@pytest.mark.parametrize("model", ["digits_cnn", "digits_transformer"])
def test_workers_segment_as_one_process_does_with_the_same_sums(
    model: str,
    digits: tuple[Path, Path, Path],
    transformer: tuple[Path, Path],
    cluster: Cluster,
    tmp_path: Path,
) -> None:
    """Segmenting forced (every threshold 0, small segments): the workers cut each sample as one process does,
    say so in the same fields, and every sum equals the single process's, and the unsegmented run's, bit for bit."""
    from qdebug.capture.ray_backend import capture_distributed
    from qdebug.debugger import capture_info
    from qdebug.render.text import capture_line

    f, q = digits[:2] if model == "digits_cnn" else transformer
    fm, qm = load_model(f, "float model"), load_model(q, "quantized model")
    pairing, source = pair_models(fm, qm), _eight_samples(model, f, tmp_path)
    whole = capture(fm, qm, pairing, source, path="fetch")
    tuning = _force_segments(0, 0, 4096)
    one = capture(fm, qm, pairing, source, path="fetch", tuning=tuning)
    many = capture_distributed(fm, qm, pairing, source, cluster, path="fetch", tuning=tuning)
    assert whole.segments == 1 and one.segments > 3
    assert (many.segments, many.segment_note) == (one.segments, one.segment_note)
    assert "segments: one sample's tensors would take" in (many.segment_note or "")
    assert f"each sample in {many.segments} segments" in (capture_line(capture_info(many)) or "")
    assert many.path == "fetch" and "8 shard(s) on 2 Ray worker(s)" in (many.fallback_reason or "")
    assert_identical(one, many)
    assert_identical(whole, many)


def test_a_worker_follows_the_one_core_rule(digits: tuple[Path, Path, Path], cluster: Cluster, tmp_path: Path) -> None:
    """A worker has one core (``worker_cpus``) whatever the machine's: segmented above the one-core threshold, not
    the pipelined one. Here the two-core threshold is 0 and the one-core one out of reach: one process segments,
    the workers do not — and their sums are the same."""
    from qdebug.capture.ray_backend import _job, capture_distributed
    from qdebug.capture.tuning import SegmentRule

    f, q, _ = digits
    fm, qm = load_model(f, "float model"), load_model(q, "quantized model")
    pairing, source = pair_models(fm, qm), _eight_samples("digits_cnn", f, tmp_path)
    tuning = _force_segments(0, 1 << 62, 4096)
    job = _job(fm, qm, pairing, ("CPUExecutionProvider",), "fetch", 4, range_reader(source), None, tuning)
    assert tuning.worker_cpus == 1 and job["segment_rule"] == SegmentRule(False, 1 << 62, 4096)
    one = capture(fm, qm, pairing, source, path="fetch", tuning=tuning)
    many = capture_distributed(fm, qm, pairing, source, cluster, path="fetch", tuning=tuning)
    assert one.segments > 3 and "(more than 0 MB)" in (one.segment_note or "")
    assert many.segments == 1 and "segments" not in (many.segment_note or "")  # it may say what was folded
    assert_identical(one, many)
    tuning = dataclasses.replace(tuning, segment_above=0)  # and above the one-core threshold, they do
    cut = capture_distributed(fm, qm, pairing, source, cluster, path="fetch", tuning=tuning)
    assert cut.segments == one.segments
    assert_identical(one, cut)


def test_a_worker_runs_every_shard_on_one_thread(
    digits: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray calls an actor's methods from its own threads; the worker reduces every shard on one thread of its own
    (glibc's heap arenas are per thread: a sample's tensors freed in two of them made ViT-S's worker peak ~20 %
    higher, docs/benchmarks.md). The worker's code in this process, called from two threads in turn, without Ray."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from qdebug.capture.fetch import FetchRun
    from qdebug.capture.ray_backend import CaptureWorker, _job

    f, q, data = digits
    fm, qm = load_model(f, "float model"), load_model(q, "quantized model")
    source = open_data(data, input_specs(fm))
    job = _job(fm, qm, pair_models(fm, qm), ("CPUExecutionProvider",), "fetch", 8, range_reader(source))
    threads: set[int] = set()
    real = FetchRun.reduce

    def spy(self: FetchRun, index: int, sample: Any) -> Any:
        threads.add(threading.get_ident())
        return real(self, index, sample)

    monkeypatch.setattr(FetchRun, "reduce", spy)
    worker, callers = CaptureWorker(job), [ThreadPoolExecutor(1), ThreadPoolExecutor(1)]
    try:
        results = [callers[k % 2].submit(worker.shard, 2 * k, 2 * k + 2).result() for k in range(4)]
    finally:
        worker.close()
        for c in callers:
            c.shutdown()
    assert [r.sums.samples if r.sums else None for r in results] == [2, 2, 2, 2]
    assert len(threads) == 1 and threading.get_ident() not in threads


def test_a_task_counts_the_cpus_ray_reserved_for_it(ray_module: Any) -> None:
    """A search's debug tasks (``num_cpus=1``) follow the one-core rule: usable_cores() there is Ray's reservation,
    not the node's cores; the driver still sees its own."""
    from qdebug.capture.fetch import usable_cores

    def cores_in_a_task() -> int:  # local: pickled by value (the test module is not importable on a worker)
        from qdebug.capture.fetch import usable_cores

        return usable_cores()

    one = ray_module.remote(num_cpus=1)(cores_in_a_task)
    two = ray_module.remote(num_cpus=2)(cores_in_a_task)
    assert ray_module.get(one.remote()) == 1
    assert ray_module.get(two.remote()) == min(2, len(os.sched_getaffinity(0)))
    assert usable_cores() == len(os.sched_getaffinity(0))


def test_without_ray_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` sees when it is not installed
    with pytest.raises(MissingExtraError, match=r"qdebug\[ray\]"), connect(ClusterSpec(workers=2)):
        pass


def test_cluster_spec_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ConfigError, match="RAY_ADDRESS"):
        ClusterSpec(address="auto")
    with pytest.raises(ConfigError, match="positive"):
        ClusterSpec(workers=0)


def test_minmax_calibration_on_workers_gives_ort_ranges(tmp_path: Path, ray_module: Any) -> None:
    """MinMax statistics sharded over the workers merge into the ranges of one process; Entropy stays here."""
    import json

    f, calib = SAMPLE_MODELS / "digits_cnn.onnx", SAMPLE_MODELS / "digits_calib.npz"
    cfg = QuantConfig(num_samples=40)
    one = quantize(f, calib, cfg, tmp_path / "one.qdq.onnx", check=False)
    many = quantize(f, calib, cfg, tmp_path / "many.qdq.onnx", check=False, cluster=ClusterSpec(workers=2))
    ranges = [json.loads(Path(r.calibration_cache).read_text()) for r in (one, many)]
    assert ranges[0] == ranges[1] and ranges[0]
    assert Path(one.model_path).read_bytes() == Path(many.model_path).read_bytes()
    entropy = QuantConfig(num_samples=8, calibration_method="entropy")
    e = quantize(f, calib, entropy, tmp_path / "e.qdq.onnx", check=False, cluster=ClusterSpec(workers=2))
    assert any("calibration ran in one process" in w and "Entropy" in w for w in e.warnings), e.warnings


def test_greedy_search_on_workers_takes_the_sequential_steps(
    digits: tuple[Path, Path, Path], tmp_path: Path, ray_module: Any
) -> None:
    from qdebug.mixed.search import SearchGoal
    from qdebug.mixed.session import MixedPrecisionSession

    f, _, data = digits
    goal = SearchGoal(output_sqnr_db=90.0, max_steps=1, candidates_per_step=2, strategy="greedy")
    results = []
    for k, cluster in enumerate((None, ClusterSpec(workers=2))):
        opts = DebugOptions(num_samples=8, capture="fetch", cluster=cluster)
        calib = SAMPLE_MODELS / "digits_calib.npz"
        with MixedPrecisionSession(f, calib, debug_data=data, debug_options=opts, workdir=tmp_path / str(k)) as s:
            results.append(s.search(goal))
    seq, par = results
    assert [(p.promoted, p.output_sqnr_db) for p in par.evaluated] == [
        (p.promoted, p.output_sqnr_db) for p in seq.evaluated
    ]
    assert [p.promoted for p in par.steps] == [p.promoted for p in seq.steps] and len(seq.evaluated) == 2


def test_a_process_that_imported_ray_without_starting_it_does_not_start_it() -> None:
    """Sizing a capture's threads looks at Ray's reservation only inside a started Ray: asking an unstarted one
    (``ray.get_runtime_context()``) started a local Ray instance as a side effect of ``debug()`` in any process that
    had imported Ray — a notebook, a benchmark that starts its own Ray afterwards and then failed."""
    import subprocess
    import sys

    if os.environ.get("CI", "").lower() != "true":  # under CI a missing Ray fails below instead
        pytest.importorskip("ray")
    code = "import ray\nfrom qdebug.capture.fetch import usable_cores\nusable_cores()\nprint(ray.is_initialized())\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stderr[-2000:]
