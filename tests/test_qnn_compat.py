"""QNN compatibility as a loop (issue 37): the rewrite catalogue (:mod:`qdebug.targets.qnn_rewrites`), each rewrite
checked against ORT's CPU; the loop (:mod:`qdebug.targets.qnn_compat`) on the real QNN compiler — it sees QNN's
rejection, rewrites, compiles again and gets one partition with no CPU node — and through ``qdebug build``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_qnn_fixes import require_qnn, run_cpu

from qdebug.build import BuildOptions, build
from qdebug.config import QuantConfig
from qdebug.targets.compile_report import CompileReport, FallbackNode
from qdebug.targets.qnn_compat import (
    AppliedRewrite,
    CompatReport,
    StopReason,
    check_rewrite,
    compat_loop,
    data_feeds,
    run_compat_loop,
    synthetic_feeds,
)
from qdebug.targets.qnn_options import QnnOptions
from qdebug.targets.qnn_rewrites import (
    CATALOGUE,
    Exactness,
    Rewrite,
    RewriteResult,
    einsum_plan,
    einsum_to_matmul,
    graph_input_constants,
)

RNG = np.random.default_rng(0)


def einsum_model(equation: str, shapes: list[list[int]], const_b: bool = False) -> onnx.ModelProto:
    """``y = Einsum(equation)(a[, b])``, ``b`` an initializer when ``const_b`` (a grouped linear layer's weight)."""
    names = ["a", "b"][: len(shapes)]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in zip(names, shapes, strict=True)]
    inits = []
    if const_b:
        inits = [numpy_helper.from_array(RNG.standard_normal(shapes[1]).astype(np.float32), "b")]
        inputs = inputs[:1]
    node = helper.make_node("Einsum", names, ["y"], name="the_einsum", equation=equation)
    graph = helper.make_graph([node], "einsum", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    graph.initializer.extend(inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def feeds_for(model: onnx.ModelProto, n: int = 2) -> list[dict[str, np.ndarray]]:
    return synthetic_feeds(model, n)


EQUATIONS = [
    ("btgi,gih->btgh", [[1, 5, 4, 8], [4, 8, 6]], True),  # DeepFilterNet's grouped linear layer
    ("btgi,gih->btgh", [[2, 5, 4, 8], [4, 8, 6]], False),
    ("bij,bjk->bik", [[3, 4, 5], [3, 5, 6]], False),
    ("bhqd,bhkd->bhqk", [[2, 3, 4, 8], [2, 3, 5, 8]], False),  # attention scores
    ("ij,jk->ik", [[4, 5], [5, 6]], True),
    ("bij,jk->bik", [[2, 4, 5], [5, 6]], True),
    ("ij,jk", [[4, 5], [5, 6]], False),  # implicit output
    ("i,j->ij", [[4], [5]], False),  # outer product: nothing contracted
    ("ij->ji", [[4, 5]], False),  # one operand, a transpose
    ("bthd->bhtd", [[2, 3, 4, 5]], False),
    ("ij->i", [[4, 5]], False),  # one-operand sums: ReduceSum
    ("bij->jb", [[2, 4, 5]], False),
    ("ij,jk->k", [[4, 5], [5, 6]], False),  # i summed within the first operand, then a product
    ("bik,bkj->b", [[2, 3, 4], [2, 4, 5]], True),
]


@pytest.mark.parametrize(("equation", "shapes", "const_b"), EQUATIONS)
def test_einsum_to_matmul_matches_einsum_on_ort_cpu(equation: str, shapes: list[list[int]], const_b: bool) -> None:
    model = einsum_model(equation, shapes, const_b)
    before = model.SerializeToString()
    result = einsum_to_matmul(model, ["the_einsum"])
    assert model.SerializeToString() == before  # never the caller's model
    assert result.model is not None and result.rewritten == ("the_einsum",) and not result.refused
    assert not any(n.op_type == "Einsum" for n in result.model.graph.node)
    assert {n.op_type for n in result.model.graph.node} <= {"MatMul", "Transpose", "Reshape", "ReduceSum"}
    onnx.checker.check_model(result.model, full_check=True)
    check, diff, ok = check_rewrite(model, result.model, feeds_for(model), Exactness.FLOAT_ROUNDING)
    assert ok, check
    assert check in (Exactness.BIT_IDENTICAL.value, Exactness.FLOAT_ROUNDING.value) and diff is not None
    # ... and what np.einsum says, independently of ORT's Einsum kernel.
    feed = feeds_for(model, 1)[0]
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    want = np.einsum(equation, *[feed[n] if n in feed else consts[n] for n in ("a", "b")[: len(shapes)]])
    np.testing.assert_allclose(run_cpu(result.model, feed)[0], want, rtol=1e-5, atol=1e-5)


def test_a_constant_operand_is_transposed_in_numpy_not_by_a_node() -> None:
    result = einsum_to_matmul(einsum_model("bij,kj->bik", [[2, 4, 5], [6, 5]], const_b=True))
    assert result.model is not None
    assert [n.op_type for n in result.model.graph.node] == ["MatMul"]  # b^T folded; a, out need no reshape


@pytest.mark.parametrize(
    ("equation", "shapes", "needle"),
    [
        ("ii->i", [[4, 4]], "repeated letter"),
        ("...ij,...jk->...ik", [[2, 4, 5], [2, 5, 6]], "ellipsis"),
        ("ij->ik", [[4, 5]], "an output letter is in no operand"),
        ("ij,jk->ikl", [[4, 5], [5, 6]], "an output letter is in no operand"),
        ("bij,bjk->bik", [[1, 4, 5], [3, 5, 6]], "broadcasting"),
    ],
)
def test_einsum_equations_that_are_no_matrix_product_are_refused(
    equation: str, shapes: list[list[int]], needle: str
) -> None:
    result = einsum_to_matmul(einsum_model(equation, shapes))
    assert result.model is None and not result.rewritten
    assert len(result.refused) == 1 and needle in result.refused[0] and equation in result.refused[0]


def test_einsum_plan_of_the_grouped_linear_layer() -> None:
    plan = einsum_plan("btgi,gih->btgh", [1, 5, 4, 8], [4, 8, 6])
    assert (plan.perm_a, plan.shape_a) == ((2, 0, 1, 3), (4, 5, 8))
    assert (plan.perm_b, plan.shape_b) == (None, (4, 8, 6))
    assert (plan.shape_out, plan.perm_out) == ((4, 1, 5, 6), (1, 2, 0, 3))


def bn_with_input_constants() -> onnx.ModelProto:
    """Conv → BatchNormalization with every parameter listed as a graph input too (an IR < 4 style export)."""
    c = 4
    params = {
        "w": RNG.standard_normal((3, c, 3, 3)).astype(np.float32) * 0.3,
        "scale": RNG.uniform(0.5, 1.5, c).astype(np.float32),
        "bias": RNG.standard_normal(c).astype(np.float32),
        "mean": RNG.standard_normal(c).astype(np.float32) * 0.1,
        "var": RNG.uniform(0.5, 1.5, c).astype(np.float32),
    }
    nodes = [
        helper.make_node("ConvTranspose", ["x", "w"], ["c"], name="up", strides=[2, 2]),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"], name="bn"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    listed = [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v.shape)) for k, v in params.items()]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "bn_inputs", [x, *listed], [y])
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in params.items())
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    return onnx.shape_inference.infer_shapes(model)


def test_graph_input_constants_become_plain_initializers_bit_identically() -> None:
    model = bn_with_input_constants()
    result = graph_input_constants(model)
    assert result.model is not None and set(result.rewritten) == {"w", "scale", "bias", "mean", "var"}
    assert [i.name for i in result.model.graph.input] == ["x"] and len(model.graph.input) == 6
    assert len(result.model.graph.initializer) == 5
    check, diff, ok = check_rewrite(model, result.model, feeds_for(model), Exactness.BIT_IDENTICAL)
    assert ok and check == Exactness.BIT_IDENTICAL.value and diff == 0.0
    assert graph_input_constants(result.model).model is None  # nothing left to do


def test_a_rewrite_that_fails_its_check_is_rolled_back() -> None:
    model = einsum_model("bij,bjk->bik", [[2, 4, 5], [2, 5, 6]])

    def wrong(m: onnx.ModelProto, names: object) -> RewriteResult:
        out = einsum_to_matmul(m).model
        assert out is not None
        scale = numpy_helper.from_array(np.array(1.01, np.float32), "k")  # a rewrite that changes the numbers
        out.graph.initializer.append(scale)
        y = out.graph.output[0].name
        for n in out.graph.node:
            n.output[:] = [f"{y}_pre" if o == y else o for o in n.output]
        out.graph.node.append(helper.make_node("Mul", [f"{y}_pre", "k"], [y]))
        return RewriteResult(out, ("the_einsum",))

    bad = Rewrite("bad", lambda f, m: f.op_type == "Einsum", wrong, Exactness.FLOAT_ROUNDING, "wrong", lambda m: True)
    probes: list[onnx.ModelProto] = []

    def probe(m: onnx.ModelProto, index: int) -> CompileReport:
        probes.append(m)
        return _report([FallbackNode("Einsum", 1, "Einsum unsupported equation", node_names=("the_einsum",))])

    out, rep = compat_loop(model, probe, catalogue=(bad,))
    assert out is model and rep.stop is StopReason.NOTHING_APPLIED and len(probes) == 1
    (tried,) = rep.rounds[0].rewrites
    assert not tried.kept and "beyond float rounding" in tried.check
    assert "rolled back" in rep.pass_report().details[-1] and not rep.pass_report().changed
    # A bit-identical promise that only holds up to rounding is refused too.
    check, _, ok = check_rewrite(
        model, einsum_to_matmul(model).model or model, feeds_for(model), Exactness.BIT_IDENTICAL
    )
    assert ok == (check == Exactness.BIT_IDENTICAL.value)


def _report(fallback: list[FallbackNode], partitions: int = 2) -> CompileReport:
    return CompileReport("qnn", True, None, 0.0, partitions, 1, sum(f.nodes for f in fallback), 0, tuple(fallback))


def test_the_loop_stops_without_probing_when_nothing_could_be_rewritten() -> None:
    model = einsum_model("ij,jk->ik", [[4, 5], [5, 6]])
    model = einsum_to_matmul(model).model
    assert model is not None and not any(rw.present(model) for rw in CATALOGUE)

    def probe(m: onnx.ModelProto, index: int) -> CompileReport:
        raise AssertionError("QNN must not be asked")

    out, rep = compat_loop(model, probe)
    assert out is model and rep.stop is StopReason.NO_CANDIDATE and rep.rounds == ()
    assert rep.pass_report().name == "qnn_compat" and not rep.pass_report().changed


def test_the_loop_is_bounded_and_its_record_round_trips() -> None:
    model = bn_with_input_constants()
    seen: list[int] = []

    def stubborn(m: onnx.ModelProto, index: int) -> CompileReport:
        seen.append(index)  # QNN keeps rejecting what no rewrite fixes: the loop must still end
        return _report([FallbackNode("BatchNormalization", 1, "dynamic mean", node_names=("bn",))])

    _, rep = compat_loop(model, stubborn, max_rounds=3)
    assert rep.stop is StopReason.NO_MATCH and seen == [1, 2]  # round 2: nothing left to rewrite
    assert rep.applied == ("graph_input_constants",)
    assert rep.pass_report().warnings == ("QNN still rejects BatchNormalization (1 unit(s), 1 node(s)): dynamic mean",)
    assert CompatReport.from_dict(rep.to_dict()) == rep
    assert isinstance(rep.rounds[0].rewrites[0], AppliedRewrite)
    again = FallbackNode.from_dict({"op_type": "X", "nodes": 1, "reason": "r", "by_design": False})
    assert again.node_names == ()


def test_a_loop_that_always_finds_something_to_rewrite_stops_at_the_round_limit() -> None:
    model = einsum_model("ij,jk->ik", [[4, 5], [5, 6]])

    def renames(m: onnx.ModelProto, names: object) -> RewriteResult:  # always "fixes" something, never enough
        out = onnx.ModelProto()
        out.CopyFrom(m)
        out.graph.node[0].name += "_again"
        return RewriteResult(out, (out.graph.node[0].name,))

    endless = Rewrite("endless", lambda f, m: True, renames, Exactness.BIT_IDENTICAL, "renames", lambda m: True)
    probes: list[int] = []

    def probe(m: onnx.ModelProto, index: int) -> CompileReport:
        probes.append(index)
        return _report([FallbackNode("Einsum", 1, "unsupported", node_names=(m.graph.node[0].name,))])

    out, rep = compat_loop(model, probe, max_rounds=3, catalogue=(endless,))
    assert rep.stop is StopReason.ROUNDS and probes == [1, 2, 3, 4]  # 3 rounds of rewrites, then one last look
    assert rep.applied == ("endless",) * 3 and out.graph.node[0].name == "the_einsum_again_again_again"
    assert rep.pass_report().warnings == ("QNN still rejects Einsum (1 unit(s), 1 node(s)): unsupported",)


def test_a_probe_that_fails_stops_the_loop_and_keeps_what_passed_its_check() -> None:
    model = bn_with_input_constants()

    def probe(m: onnx.ModelProto, index: int) -> CompileReport:
        if index == 2:
            raise RuntimeError("calibration failed: Invalid input shape\nsecond line")
        return _report([FallbackNode("BatchNormalization", 1, "dynamic mean", node_names=("bn",))])

    out, rep = compat_loop(model, probe)
    assert rep.stop is StopReason.PROBE_FAILED and rep.error == "RuntimeError: calibration failed: Invalid input shape"
    assert [i.name for i in out.graph.input] == ["x"]  # round 1's checked rewrite stays
    assert rep.pass_report().warnings[-1].startswith("the QNN probe failed in round 2: RuntimeError")
    assert CompatReport.from_dict(rep.to_dict()) == rep


def test_the_checks_use_the_builds_data_when_it_fits(tmp_path: Path) -> None:
    model = bn_with_input_constants()
    x = RNG.standard_normal((3, 1, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=x, label=np.zeros(3))
    feeds = data_feeds(model, tmp_path / "calib.npz")
    assert len(feeds) == 2 and np.array_equal(feeds[0]["x"], x[0])
    other = data_feeds(model, {"x": RNG.standard_normal((3, 1, 3, 4, 4)).astype(np.float32)})
    assert other[0]["x"].shape == (1, 3, 8, 8)  # not the model's shape: synthetic samples instead


# ------------------------------------------------------------------------------------------------ on real QNN
def grouped_linear() -> onnx.ModelProto:
    """Conv → Reshape → Einsum ``btgi,gih->btgh`` (constant weight) → Relu, as in DeepFilterNet's GRU blocks."""
    w = numpy_helper.from_array(RNG.standard_normal((4, 3, 1, 1)).astype(np.float32), "cw")
    g = numpy_helper.from_array(RNG.standard_normal((2, 8, 8)).astype(np.float32) * 0.3, "gw")
    shape = numpy_helper.from_array(np.array([1, 4, 2, 8], np.int64), "shape")
    nodes = [
        helper.make_node("Conv", ["x", "cw"], ["c"], name="conv"),
        helper.make_node("Reshape", ["c", "shape"], ["r"], name="reshape"),
        helper.make_node("Einsum", ["r", "gw"], ["e"], name="grouped", equation="btgi,gih->btgh"),
        helper.make_node("Relu", ["e"], ["y"], name="relu"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 1, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 2, 8])
    graph = helper.make_graph(nodes, "grouped_linear", [x], [y], initializer=[w, g, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def _probe_config(model: onnx.ModelProto) -> object:
    from qdebug.targets.qnn import QnnTarget

    target, cfg = QnnTarget(), QuantConfig(target="qnn")
    return lambda path, reader: target.ort_config(cfg, path, reader)


@pytest.mark.parametrize(
    ("make", "rewrite", "reason"),
    [
        (grouped_linear, "einsum_to_matmul", "Einsum unsupported equation: btgi,gih->btgh"),
        (bn_with_input_constants, "graph_input_constants", "dynamic mean"),
    ],
)
def test_the_loop_on_qnn_sees_the_rejection_rewrites_and_gets_one_partition(
    make: object, rewrite: str, reason: str
) -> None:
    require_qnn()
    model = make()  # type: ignore[operator]
    out, rep = run_compat_loop(model, QnnOptions(), _probe_config(model))  # type: ignore[arg-type]
    first, last = rep.rounds[0], rep.rounds[-1]
    assert first.cpu_nodes > 0 and any(reason in f.reason for f in first.rejected), first
    assert [r.name for r in first.rewrites if r.kept] == [rewrite]
    assert rep.stop is StopReason.CLEAN and len(rep.rounds) == 2
    assert rep.seconds is not None and rep.nodes_before == len(model.graph.node) == rep.pass_report().nodes_before
    assert (last.partitions, last.cpu_nodes, last.rejected) == (1, 0, ())
    check, _, ok = check_rewrite(model, out, synthetic_feeds(model), Exactness.FLOAT_ROUNDING)
    assert ok, check


def test_qnn_build_runs_the_loop_and_says_so_in_the_manifest(tmp_path: Path) -> None:
    require_qnn()
    path = tmp_path / "grouped.onnx"
    onnx.save(grouped_linear(), str(path))
    res = build(path, tmp_path / "out", BuildOptions("qnn", "uint8", debug_samples=2))
    m = res.manifest
    fix = next(f for f in m.fixes if f.name == "qnn_compat")
    assert fix.changed and "einsum_to_matmul" in fix.detail and "QNN takes every node" in fix.detail
    assert any("QNN rejects Einsum" in d for d in fix.details) and any("kept" in d for d in fix.details)
    assert m.compile.single_partition and m.compile.cpu_nodes == 0
    assert not any(n.op_type == "Einsum" for n in onnx.load(str(res.path("float_model"))).graph.node)
    skipped = build(path, tmp_path / "skip", BuildOptions("qnn", "uint8", debug_samples=2, skip_fixes=("qnn_compat",)))
    assert next(f for f in skipped.manifest.fixes if f.name == "qnn_compat").skipped
    assert not skipped.manifest.compile.single_partition
    assert any("the skipped qnn_compat fix" in w for w in skipped.manifest.warnings)
