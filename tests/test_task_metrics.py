"""Task metrics (qdebug/task_metrics.py, qdebug/task_measure.py): each built-in on real tiny models run by ONNX
Runtime, exact merges, the module:function loader and its one-line errors, the debug report's field and the CLI."""

from __future__ import annotations

import itertools
import json
import pickle
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import CliResult, assert_one_line_error, save
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from qdebug.config import QuantConfig
from qdebug.debugger import DebugOptions, debug
from qdebug.errors import EXIT_DATA, EXIT_USAGE, ConfigError, DataError
from qdebug.quantizer import quantize
from qdebug.report import DebugReport
from qdebug.task_measure import measure_task
from qdebug.task_metrics import TASK_METRICS, load_metric, pick_metric
from qdebug.task_score import TaskMetric, TaskScore, merge_states

REPO = Path(__file__).resolve().parent.parent
CNN = REPO / "sample_models" / "digits_cnn.onnx"
CALIB = REPO / "sample_models" / "digits_calib.npz"
EVAL = REPO / "sample_models" / "digits_eval.npz"


# ------------------------------------------------------------------------------------------------ tiny models
def _model(nodes: list, x: onnx.ValueInfoProto, y: onnx.ValueInfoProto, inits: list) -> onnx.ModelProto:
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits), opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def embedder(seed: int = 0) -> onnx.ModelProto:
    """x [1, 8] → MatMul → Tanh → LpNormalization: a unit-length [1, 6] embedding."""
    w = numpy_helper.from_array(np.random.default_rng(seed).standard_normal((8, 6)).astype(np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Tanh", ["h"], ["t"], name="tanh"),
        helper.make_node("LpNormalization", ["t"], ["embedding"], name="norm", axis=-1, p=2),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [1, 6])
    return _model(nodes, x, y, [w])


def ctc_head(seed: int = 0) -> onnx.ModelProto:
    """x [1, 12, 8] → MatMul → logits [1, 12, 5] (a per-position classifier: an OCR/CTC head)."""
    w = numpy_helper.from_array(np.random.default_rng(seed).standard_normal((8, 5)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"], name="mm")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 12, 8])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 12, 5])
    return _model(nodes, x, y, [w])


def clipped(qdq: Path, out: Path, factor: float = 0.1) -> Path:
    """A deliberately broken quantization: every activation's scale (its QuantizeLinear's, shared with its
    DequantizeLinear) times ``factor``, so that activations clip at a tenth of their range."""
    m = onnx.load(str(qdq))
    scales = {n.input[1] for n in m.graph.node if n.op_type == "QuantizeLinear"}
    for init in m.graph.initializer:
        if init.name in scales:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(factor), init.name))
    return save(m, out)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The digits CNN quantized (uint8) and broken (:func:`clipped`), the embedder and the CTC head with their QDQ
    models and data."""
    d = tmp_path_factory.mktemp("task")
    out = {"cnn": CNN}
    quantize(CNN, CALIB, QuantConfig(), d / "cnn.qdq.onnx")
    out["cnn_q"] = d / "cnn.qdq.onnx"
    out["cnn_bad"] = clipped(out["cnn_q"], d / "cnn.bad.onnx")
    rng = np.random.default_rng(1)
    for name, model, shape in (("emb", embedder(), (32, 8)), ("ctc", ctc_head(), (32, 1, 12, 8))):
        out[name] = save(model, d / f"{name}.onnx")
        np.savez(d / f"{name}.npz", x=rng.standard_normal(shape).astype(np.float32))
        out[f"{name}_data"] = d / f"{name}.npz"
        quantize(out[name], out[f"{name}_data"], QuantConfig(), d / f"{name}.qdq.onnx")
        out[f"{name}_q"] = d / f"{name}.qdq.onnx"
    return out


# ------------------------------------------------------------------------------------------------ built-ins
@pytest.mark.parametrize("metric", ["top1", "cosine", "sequence", "top1_accuracy"])
def test_identical_models_agree_fully(models: dict[str, Path], metric: str) -> None:
    score = measure_task(CNN, CNN, EVAL, metric, num_samples=40)
    assert score.value == pytest.approx(1.0) and score.samples == 40
    assert score.metric == metric and score.higher_is_better


def test_top1_of_a_good_and_a_broken_quantization(models: dict[str, Path]) -> None:
    good = measure_task(CNN, models["cnn_q"], EVAL, "top1", num_samples=200)
    bad = measure_task(CNN, models["cnn_bad"], EVAL, "top1", num_samples=200)
    assert 0.95 <= good.value <= 1.0  # type: ignore[operator]
    assert bad.value is not None and bad.value < good.value - 0.05, (good.value, bad.value)
    assert good.per_output["logits"]["rows"] == 200


def test_top1_accuracy_reads_the_labels_and_reports_the_drop(models: dict[str, Path]) -> None:
    score = measure_task(CNN, models["cnn_bad"], EVAL, "top1_accuracy", num_samples=200)
    detail = score.per_output["logits"]
    assert detail["float_accuracy"] > 0.95 and detail["accuracy"] == score.value
    assert detail["drop"] == pytest.approx(detail["float_accuracy"] - detail["accuracy"])
    with pytest.raises(DataError, match="no label array 'label'"):
        measure_task(CNN, models["cnn_q"], CALIB, "top1_accuracy")
    with pytest.raises(DataError, match=r"one \.npz file"):
        measure_task(CNN, models["cnn_q"], None, "top1_accuracy")


def test_cosine_on_an_embedder(models: dict[str, Path]) -> None:
    assert measure_task(models["emb"], models["emb"], models["emb_data"], "cosine").value == pytest.approx(1.0)
    score = measure_task(models["emb"], models["emb_q"], models["emb_data"], "cosine")
    detail = score.per_output["embedding"]
    assert 0.98 < score.value < 1.0  # type: ignore[operator]
    assert detail["worst"] <= detail["mean"] == score.value and detail["rows"] == 32


def test_sequence_on_a_ctc_head(models: dict[str, Path]) -> None:
    assert measure_task(models["ctc"], models["ctc"], models["ctc_data"], "sequence").value == 1.0
    score = measure_task(models["ctc"], models["ctc_q"], models["ctc_data"], "sequence")
    detail = score.per_output["logits"]
    assert 0.8 < detail["position_agreement"] <= 1.0 and detail["positions"] == 32 * 12
    assert detail["sequences"] == 32 and detail["sequence_agreement"] <= detail["position_agreement"]


def test_sequence_layouts() -> None:
    """[T, 1, C] is one time-major sequence; [N, T, C] N sequences; one wrong position spoils its sequence only."""
    f = np.zeros((6, 1, 3), np.float32)
    f[:, 0, 1] = 1
    q = f.copy()
    q[2, 0, 2] = 5
    s = TASK_METRICS["sequence"]
    state = s.update(s.start(), {"o": f}, {"o": q})
    assert s.detail(state)["o"] == {"position_agreement": 5 / 6, "sequence_agreement": 0.0, "positions": 6,
                                    "sequences": 1}  # fmt: skip
    fb, qb = np.transpose(f, (1, 0, 2)).repeat(2, axis=0), np.transpose(q, (1, 0, 2)).repeat(2, axis=0)
    qb[1] = fb[1]
    state = s.update(s.start(), {"o": fb}, {"o": qb})
    assert s.detail(state)["o"]["sequences"] == 2 and s.detail(state)["o"]["sequence_agreement"] == 0.5


def test_nonfinite_rows_disagree() -> None:
    f = np.eye(4, dtype=np.float32)
    q = f.copy()
    q[1, 0] = np.nan
    for name in ("top1", "cosine"):
        m = TASK_METRICS[name]
        state = m.update(m.start(), {"o": f}, {"o": q})
        assert m.value(state) == pytest.approx(0.75) and m.detail(state)["o"]["nonfinite_rows"] == 1


def test_auto_picks_from_the_float_model_and_says_why(models: dict[str, Path]) -> None:
    for path, want in ((CNN, "top1"), (models["emb"], "cosine"), (models["ctc"], "sequence")):
        metric, why = pick_metric(onnx.load(str(path)))
        assert metric is not None and metric.name == want, why
    scalar = _model([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0)],
                    helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
                    helper.make_tensor_value_info("s", TensorProto.FLOAT, []), [])  # fmt: skip
    metric, why = pick_metric(scalar)
    assert metric is None and "'s'" in why
    with pytest.raises(ConfigError, match=r"task metric auto: .*'s'"):
        load_metric("auto", scalar)


def test_a_metric_limited_to_an_output(models: dict[str, Path]) -> None:
    assert load_metric("top1@logits").outputs == ("logits",)
    assert measure_task(CNN, models["cnn_q"], EVAL, "top1@logits", num_samples=5).metric == "top1@logits"
    with pytest.raises(ConfigError, match=r"no model output \['nope'\]"):
        measure_task(CNN, models["cnn_q"], EVAL, "top1@nope", num_samples=5)


def test_a_metric_that_fits_no_output_says_what_there_is() -> None:
    m = TASK_METRICS["top1"]
    with pytest.raises(ConfigError, match=r"class scores .*o \[3\] int64"):
        m.update(m.start(), {"o": np.arange(3)}, {"o": np.arange(3)})


# ------------------------------------------------------------------------------------------------ merging, memory
def _samples(seed: int, n: int) -> list[tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        f = rng.standard_normal((2, 4, 5))
        q = f + rng.standard_normal(f.shape) * 0.7
        out.append(({"a": f, "b": f[:, 0]}, {"a": q, "b": q[:, 0]}, rng.integers(0, 5, 2)))
    return out


def _fold(m: TaskMetric, samples: list) -> dict[str, float]:
    state = m.start()
    for f, q, label in samples:
        state = m.update(state, f, q, label)
    return state


@settings(max_examples=30, deadline=None)
@given(
    name=st.sampled_from(["top1", "cosine", "sequence", "top1_accuracy@b"]),
    seed=st.integers(0, 2**16),
    cuts=st.lists(st.integers(0, 12), max_size=4),
)
def test_merging_shards_equals_one_pass(name: str, seed: int, cuts: list[int]) -> None:
    m = load_metric(name)
    samples = _samples(seed, 12)
    whole = _fold(m, samples)
    bounds = [0, *sorted(cuts), 12]
    merged = m.start()
    for lo, hi in itertools.pairwise(bounds):
        merged = m.merge(merged, _fold(m, samples[lo:hi]))
    assert merged.keys() == whole.keys()
    for k in whole:
        assert merged[k] == pytest.approx(whole[k], rel=1e-12, abs=1e-12), k
    assert m.value(merged) == pytest.approx(m.value(whole))


def test_the_state_does_not_grow_with_the_samples() -> None:
    for name in ("top1", "cosine", "sequence"):
        m = TASK_METRICS[name]
        few, many = _fold(m, _samples(0, 3)), _fold(m, _samples(0, 60))
        assert few.keys() == many.keys() and len(pickle.dumps(few)) == len(pickle.dumps(many))


def test_update_returns_a_new_state() -> None:
    m = TASK_METRICS["top1"]
    start = m.start()
    f, q, _ = _samples(0, 1)[0]
    after = m.update(start, f, q)
    assert start == {"samples": 0.0} and after["samples"] == 1
    assert merge_states({"min:w": 1.0, "n": 1}, {"min:w": 0.5, "n": 2}) == {"min:w": 0.5, "n": 3}


# ------------------------------------------------------------------------------------------------ the user's own
@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A module of metrics written in a folder on ``sys.path`` (a unique name per test)."""
    name = f"user_metrics_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent('''
        import numpy as np
        from qdebug.task_metrics import TASK_METRICS

        def agree(float_outputs, quant_outputs):
            """Same argmax of every output."""
            return float(all(np.argmax(float_outputs[k]) == np.argmax(quant_outputs[k]) for k in float_outputs))

        def err(float_outputs, quant_outputs, label):
            return float(np.abs(float_outputs["logits"] - quant_outputs["logits"]).max())
        err.higher_is_better = False

        def labelled(float_outputs, quant_outputs, label):
            return float(int(np.argmax(quant_outputs["logits"])) == int(label))

        def nan(float_outputs, quant_outputs):
            return float("nan")

        def text(float_outputs, quant_outputs):
            return "good"

        def boom(float_outputs, quant_outputs):
            raise KeyError("no such output")

        def one(float_outputs):
            return 1.0

        METRIC = TASK_METRICS["cosine"]
        NOT_A_FUNCTION = 3
    '''))  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_a_user_function_is_averaged(models: dict[str, Path], user_module: str) -> None:
    mine = measure_task(CNN, models["cnn_bad"], EVAL, f"{user_module}:agree", num_samples=100)
    builtin = measure_task(CNN, models["cnn_bad"], EVAL, "top1", num_samples=100)
    assert mine.value == pytest.approx(builtin.value) and mine.samples == 100
    assert mine.description == "Same argmax of every output." and mine.per_output == {}
    err = measure_task(CNN, models["cnn_q"], EVAL, f"{user_module}:err", num_samples=10)
    assert not err.higher_is_better and 0 < err.value < 1  # type: ignore[operator]
    acc = measure_task(CNN, models["cnn_q"], EVAL, f"{user_module}:labelled", num_samples=100)
    assert acc.value == pytest.approx(measure_task(CNN, models["cnn_q"], EVAL, "top1_accuracy", num_samples=100).value)
    assert load_metric(f"{user_module}:METRIC") is TASK_METRICS["cosine"]


def test_a_python_callable(models: dict[str, Path]) -> None:
    def margin(f: dict, q: dict) -> float:
        return float(np.max(q["logits"]) - np.max(f["logits"]))

    score = measure_task(CNN, models["cnn_q"], EVAL, margin, num_samples=10)
    assert score.metric.endswith("margin") and score.samples == 10 and score.value is not None


@pytest.mark.parametrize(
    ("attr", "message"),
    [
        ("nan", "returned nan on sample 0; it must be finite"),
        ("text", "returned str on sample 0, not a number"),
        ("boom", "raised KeyError on sample 0"),
    ],
)
def test_a_user_function_that_misbehaves(models: dict[str, Path], user_module: str, attr: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"task metric {user_module}:{attr}: {message}"):
        measure_task(CNN, models["cnn_q"], EVAL, f"{user_module}:{attr}", num_samples=3)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_qd:fn", "no module named 'no_such_module_qd'"),
        ("{m}:missing", "module {m} has no 'missing'"),
        ("{m}:one", r"takes \(float_outputs\); it must take \(float_outputs, quant_outputs\)"),
        ("{m}:NOT_A_FUNCTION", "is a int, not a function"),
        (":fn", "write module:function"),
        ("top5", "unknown task metric 'top5'; built-in: top1, cosine, sequence, top1_accuracy"),
    ],
)
def test_load_errors_name_the_spec(user_module: str, spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.format(m=user_module)) as info:
        load_metric(spec.format(m=user_module))
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------------------------------------ results
def test_the_score_round_trips_and_meets_goals(models: dict[str, Path]) -> None:
    score = measure_task(CNN, models["cnn_bad"], EVAL, "top1_accuracy", num_samples=50)
    back = TaskScore.from_dict(json.loads(json.dumps(score.to_dict())))
    assert back == score
    assert score.to_dataframe().loc[0, "output"] == "logits"
    assert score.meets(score.value) and not score.meets(score.value + 0.01)  # type: ignore[operator]
    lower = TaskScore("err", 0.2, 5, higher_is_better=False)
    assert lower.meets(0.3) and not lower.meets(0.1)
    with pytest.raises(Exception, match="schema_version"):
        TaskScore.from_dict({**score.to_dict(), "schema_version": 99})


def test_debug_carries_the_task_score(models: dict[str, Path], tmp_path: Path) -> None:
    report = debug(CNN, models["cnn_q"], EVAL, DebugOptions(num_samples=20), metric="top1_accuracy")
    assert report.task is not None and report.task.samples == 20 and report.task.metric == "top1_accuracy"
    again = DebugReport.load(report.save(tmp_path / "r.json"))
    assert again.task == report.task
    old = report.to_dict()
    old.pop("task")
    old["schema_version"] = 3
    assert DebugReport.from_dict(old).task is None  # a report from before task metrics
    assert debug(CNN, models["cnn_q"], None, DebugOptions(num_samples=2)).task is None
    with pytest.raises(ConfigError, match="given twice"):
        debug(CNN, models["cnn_q"], None, DebugOptions(task_metric="top1"), metric="cosine")
    with pytest.raises(ConfigError, match="unknown task metric"):
        DebugOptions(task_metric="top5")


def test_debug_auto_picks_or_warns(tmp_path: Path, tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    from builders import conv_clip

    report = debug(tiny_float, tiny_quant("u8"), None, DebugOptions(num_samples=2, task_metric="auto"))
    assert report.task is not None and report.task.metric == "top1"  # its [1, 3] output: class scores
    f = save(conv_clip(), tmp_path / "f.onnx")
    q = quantize(f, None, QuantConfig(), tmp_path / "q.onnx").model_path
    report = debug(f, q, None, DebugOptions(num_samples=2, task_metric="auto"))
    assert report.task is None
    assert any(w.startswith("task metric auto: none fits (output 'y' has [1, 2, 6, 6]") for w in report.meta.warnings)


def test_cli_debug_metric_json(models: dict[str, Path], run_cli: Callable[..., CliResult]) -> None:
    r = run_cli("debug", "-f", CNN, "-q", models["cnn_q"], "-d", EVAL, "--max-samples", "16", "--metric", "top1",
                "--json")  # fmt: skip
    assert r.code == 0, r.stderr
    task = json.loads(r.out)["task"]
    assert task["metric"] == "top1" and task["samples"] == 16 and task["value"] == pytest.approx(1.0, abs=0.1)
    r = run_cli("debug", "-f", CNN, "-q", models["cnn_q"], "-d", EVAL, "--max-samples", "16", "--metric",
                "top1_accuracy", "--top", "1")  # fmt: skip
    assert r.code == 0 and "task metric top1_accuracy: " in r.out and "float accuracy" in r.out


def test_cli_debug_metric_errors(models: dict[str, Path], run_cli: Callable[..., CliResult]) -> None:
    r = run_cli("debug", "-f", CNN, "-q", models["cnn_q"], "--metric", "nope_qd:fn")
    assert_one_line_error(r, EXIT_USAGE, "task metric nope_qd:fn: no module named 'nope_qd'")
    r = run_cli("debug", "-f", CNN, "-q", models["cnn_q"], "--label-key", "y")
    assert_one_line_error(r, EXIT_USAGE, "--label-key has no effect without --metric")
    r = run_cli("debug", "-f", CNN, "-q", models["cnn_q"], "-d", CALIB, "--metric", "top1_accuracy")
    assert_one_line_error(r, EXIT_DATA, "no label array 'label'")
    r = run_cli("debug", "-f", CNN, "-q", models["cnn_q"], "--metric", "top1_accuracy")
    assert_one_line_error(r, EXIT_USAGE, "--metric top1_accuracy scores labels: give --data")


# ------------------------------------------------------------------------------------------------ search
def test_cli_search_task_goal_and_holdout(tmp_path: Path, run_cli: Callable[..., CliResult]) -> None:
    r = run_cli("search", "-f", CNN, "--calib", CALIB, "--debug-samples", "16", "--metric", "top1", "--goal-task",
                "0.99", "--holdout-samples", "8", "-o", tmp_path / "o.json", "--json")  # fmt: skip
    assert r.code == 0, r.stderr
    result = json.loads(r.out)
    assert result["goal"]["task_value"] == 0.99
    assert all(p["task_value"] is not None for p in result["steps"])
    final = result["steps"][result["chosen_step"]]
    assert final["task_value"] >= 0.99 and result["reached"]
    held = result["holdout"]["points"][0]
    assert held["search_task"] == final["task_value"] and held["holdout_task"] is not None
    assert "task " in result["holdout"]["note"]


def test_a_task_goal_needs_a_metric(run_cli: Callable[..., CliResult], tmp_path: Path) -> None:
    from qdebug.mixed.search import SearchGoal, search
    from qdebug.mixed.session import MixedPrecisionSession

    r = run_cli("search", "-f", CNN, "--calib", CALIB, "--goal-task", "0.99", "-o", tmp_path / "o.json")
    assert_one_line_error(r, EXIT_USAGE, "--goal-task needs a task metric (--metric)")
    with MixedPrecisionSession(CNN, CALIB) as session, pytest.raises(ConfigError, match="needs a task metric"):
        search(session, SearchGoal(task_value=0.99))
    with pytest.raises(ConfigError, match="task_value must be a finite number"):
        SearchGoal(task_value=float("nan"))


# ------------------------------------------------------------------------------------------------ widgets
def test_the_debugger_shows_a_task_score_beside_the_sqnr(tmp_path: Path) -> None:
    from widgets.app import DebuggerApp
    from widgets.session import QuantDebugger

    def agree(f: dict, q: dict) -> float:
        return float(np.argmax(f["logits"]) == np.argmax(q["logits"]))

    d = QuantDebugger(CNN, data=CALIB, config=QuantConfig(num_samples=16), workdir=tmp_path / "w", metric=agree,
                      debug_options=DebugOptions(num_samples=8))  # fmt: skip
    try:
        task = d.summary()["task"]
        assert task is not None and task.samples == 8 and task.metric.endswith("agree")
        assert "task metric " in DebuggerApp._notes_html(d.report)
    finally:
        d.close()
