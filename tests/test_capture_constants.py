"""Tensors computed from constants alone (qdebug.capture.constants): folded once, reduced once, same numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from qdebug.capture import CaptureTuning, fetch
from qdebug.capture.constants import Fold, constant_tensors, constant_values, fold
from qdebug.config import QuantConfig
from qdebug.debugger import DebugOptions, debug
from qdebug.model_io import load_model
from qdebug.ort import expose_outputs, make_session
from qdebug.quantizer import quantize
from tests import builders
from tests.conftest import save

CPU = ["CPUExecutionProvider"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``constant_branch`` and its uint8 QDQ model (ONNX Runtime's quantizer, through qdebug)."""
    folder = tmp_path_factory.mktemp("constants")
    float_path = save(builders.constant_branch(), folder / "const.onnx")
    quant_path = folder / "const.qdq.onnx"
    quantize(float_path, None, QuantConfig(num_samples=8), quant_path)
    return float_path, quant_path


def _node_outputs(model: onnx.ModelProto) -> list[str]:
    return [o for n in model.graph.node for o in n.output if o]


def _run_all(model: onnx.ModelProto, names: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    return make_session(expose_outputs(model, names), CPU).run(names, feed)  # type: ignore[attr-defined]


def test_constant_tensors_are_those_no_input_reaches() -> None:
    m = builders.constant_branch()
    const = constant_tensors(m)
    assert {"W0", "k", "wc", "wct", "b", "w_raw", "lstm_w"} <= const
    assert not {"x", "h", "hb", "hr", "seq", "y"} & const


def test_random_custom_and_subgraph_nodes_are_never_constant() -> None:
    """A generator gives a new value each call, a custom op is unknown, a subgraph may read anything."""
    shape = numpy_helper.from_array(np.array([2], np.int64), "shape")
    then = helper.make_graph(
        [helper.make_node("Identity", ["shape"], ["t"])], "then", [], [builders.value_info("t", [1])]
    )
    cond = numpy_helper.from_array(np.array(True), "cond")
    nodes = [
        helper.make_node("RandomNormal", [], ["rand"], shape=[2]),
        helper.make_node("Relu", ["rand"], ["after_rand"]),
        helper.make_node("Mystery", ["shape"], ["custom"], domain="example.custom"),
        helper.make_node("If", ["cond"], ["branch"], then_branch=then, else_branch=then),
        helper.make_node("Neg", ["shape"], ["neg"]),
    ]
    m = builders._model(nodes, [], [builders.value_info("neg", [1])], [shape, cond], domains=["example.custom"])
    const = constant_tensors(m)
    assert "neg" in const
    assert not {"rand", "after_rand", "custom", "branch"} & const


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


@pytest.mark.parametrize("which", ["float", "quant"])
def test_folded_model_computes_every_tensor_bit_for_bit(pair: tuple[Path, Path], which: str) -> None:
    """The tensors the folded model still computes are those of the model as it was, bit for bit: the folded
    values are overridable initializers, so the MatMul and the LSTM read them as they read computed tensors
    (a pre-packed constant weight would change their sums' order), and a Constant node's value stays a constant
    weight, as ONNX Runtime makes it."""
    model = load_model(pair[0] if which == "float" else pair[1])
    folded = _copy(model)
    count = fold(folded, CPU).nodes
    remaining = {o for n in folded.graph.node for o in n.output}
    names = [n for n in _node_outputs(model) if n in remaining]
    assert count > 0 and len(folded.graph.node) == len(model.graph.node) - count and names
    feed = {"x": np.random.default_rng(3).standard_normal((1, 16, 256)).astype(np.float32)}
    for name, want, got in zip(names, _run_all(model, names, feed), _run_all(folded, names, feed), strict=True):
        assert np.array_equal(want, got), name


def test_fold_keeps_graph_outputs_and_unread_weights_go(pair: tuple[Path, Path]) -> None:
    """A tensor the run exposes (a graph output) stays computed; a folded DequantizeLinear's integers go."""
    model = expose_outputs(load_model(pair[1]), ["wct"])
    ints = {n.input[0] for n in model.graph.node if n.op_type == "DequantizeLinear"} & {
        i.name for i in model.graph.initializer
    }
    assert fold(model, CPU).nodes > 0
    assert "wct" in {o for n in model.graph.node for o in n.output}
    assert ints and not ints & {i.name for i in model.graph.initializer}


def test_constant_values_are_computed_from_what_they_need(pair: tuple[Path, Path]) -> None:
    model = load_model(pair[0])
    values = constant_values(model, ["wc", "W0", "b"], CPU)
    assert values is not None and set(values) == {"wc", "W0", "b"}
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    np.testing.assert_array_equal(values["wc"], inits["W0"] * np.float32(1.5))
    np.testing.assert_array_equal(values["b"], inits["B0"] + inits["B1"])


def test_fold_of_an_old_ir_model_keeps_its_weights_constant() -> None:
    """IR < 4 lists every initializer among the inputs (constants there); the fold takes them off that list
    rather than have them become overridable, and the tensors stay the same."""
    rng = np.random.default_rng(0)
    w0, w1 = (numpy_helper.from_array(rng.standard_normal((256, 256)).astype(np.float32) / 16, n) for n in ("W0", "W1"))
    nodes = [
        builders.constant_node("k", np.array(1.5, np.float32)),
        helper.make_node("Mul", ["W1", "k"], ["wc"]),  # W1 is read by a folded node only: it goes, input included
        helper.make_node("MatMul", ["x", "wc"], ["h"]),
        helper.make_node("MatMul", ["h", "W0"], ["h2"]),
        helper.make_node("Flatten", ["h2"], ["y"], axis=0),
    ]
    inputs = [builders.value_info(n, s) for n, s in (("x", [1, 16, 256]), ("W0", [256, 256]), ("W1", [256, 256]))]
    m = builders._model(nodes, inputs, [builders.value_info("y", [1, 4096])], [w0, w1], opset=9)
    m.ir_version = 3
    folded = _copy(m)
    assert fold(folded, CPU).nodes == 2 and folded.ir_version == 4
    inputs_after = [i.name for i in folded.graph.input]
    assert inputs_after == ["x", "wc"]  # W0 stays a constant weight, W1 is gone, wc is the folded value
    feed = {"x": np.random.default_rng(1).standard_normal((1, 16, 256)).astype(np.float32)}
    names = ["h", "h2", "y"]
    for want, got in zip(_run_all(m, names, feed), _run_all(folded, names, feed), strict=True):
        assert np.array_equal(want, got)


def _unfolded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch, "fold", lambda *a: Fold(0, 0))
    monkeypatch.setattr(fetch, "constant_tensors", lambda model: frozenset())


def _numbers(report: Any) -> dict[str, Any]:
    d = report.to_dict()
    d.pop("meta")
    return d


@pytest.mark.parametrize("capture", ["fetch", "compiled"])
def test_report_is_the_same_with_constants_reduced_once(
    pair: tuple[Path, Path], capture: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Activations of constants alone are reduced once and given to every sample: the report is the one of a run
    that fetches and reduces them every sample (with the reference reduction, bit for bit)."""
    runs: list[fetch.FetchRun] = []
    init = fetch.FetchRun.__init__

    def spy(self: fetch.FetchRun, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        runs.append(self)

    monkeypatch.setattr(fetch.FetchRun, "__init__", spy)
    opts = DebugOptions(num_samples=6, capture=capture)
    once = debug(*pair, None, opts)
    run = runs[-1]
    assert run.constants is not None and run.constants.count >= 2
    assert run.folded_nodes > 0 and run.segment_note and "reduced once" in run.segment_note
    assert len(run.plan.pairing.activations) + run.constants.count == len(once.activations)
    _unfolded(monkeypatch)
    every = debug(*pair, None, opts)
    assert runs[-1].constants is None
    if capture == "fetch":
        assert _numbers(once) == _numbers(every)
    else:  # the constants are reduced by the numpy reference, the rest by the compiled kernel in both runs
        for a, b in zip(once.activations, every.activations, strict=True):
            assert a.tensor_name == b.tensor_name
            assert a.cumulative_sqnr_db == pytest.approx(b.cumulative_sqnr_db, rel=1e-6)
    constant = [a for a in once.activations if a.tensor_name in ("wc", "wct", "b")]
    assert constant and all(np.isfinite(a.cumulative_sqnr_db) for a in constant)


def test_batched_run_completes_every_sample(pair: tuple[Path, Path]) -> None:
    """A batched run's samples get the constants' sums too (the batch reduces the other activations only)."""
    unbatched = debug(*pair, None, DebugOptions(num_samples=8, capture="fetch"))
    batched = debug(*pair, None, DebugOptions(num_samples=8, capture="fetch", batch=4))
    assert batched.meta.capture is not None and batched.meta.capture.batch == 4
    for a, b in zip(unbatched.activations, batched.activations, strict=True):
        assert a.cumulative_sqnr_db == pytest.approx(b.cumulative_sqnr_db, rel=1e-5)
    np.testing.assert_allclose(unbatched.per_sample.values, batched.per_sample.values, rtol=1e-5)


def test_a_large_fold_is_not_made(pair: tuple[Path, Path]) -> None:
    """Folding costs its values' bytes once and saves computing them every call: above ``fold_max_bytes`` (here 0)
    the models run as they are, the report says so, and the numbers are the same."""
    folded = debug(*pair, None, DebugOptions(num_samples=4, capture="fetch"))
    note = folded.meta.capture.segment_note if folded.meta.capture else None
    assert note and "nodes of constants alone run once" in note and "not folded" not in note
    kept = debug(*pair, None, DebugOptions(num_samples=4, capture="fetch", tuning=CaptureTuning(fold_max_bytes=0)))
    note = kept.meta.capture.segment_note if kept.meta.capture else None
    assert note and "not folded: est. 1 MB (> 0 MB)" in note and "run once" not in note
    assert _numbers(folded) == _numbers(kept)


def test_fold_above_the_bound_changes_nothing(pair: tuple[Path, Path]) -> None:
    model = load_model(pair[1])
    copy = _copy(model)
    done = fold(copy, CPU, max_bytes=1024)
    assert done.nodes == 0 and done.estimated_bytes > 1024 and copy == model
    assert fold(copy, CPU, max_bytes=done.estimated_bytes).nodes > 0
