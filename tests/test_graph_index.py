"""The one graph index and the one pass runner, on tiny real models."""

from __future__ import annotations

import builders
import numpy as np
import onnx

from qdebug.graph_index import GraphIndex
from qdebug.passes import PassReport, run_passes


def test_graph_index_maps_producers_consumers_and_constants() -> None:
    m = builders.tiny_convnet()
    m.graph.node.insert(0, builders.constant_node("k", np.ones(1, np.float32)))
    idx = GraphIndex(m)
    assert idx.inputs == tuple(i.name for i in m.graph.input if i.name not in {t.name for t in m.graph.initializer})
    assert idx.outputs == tuple(o.name for o in m.graph.output)
    for n in m.graph.node:
        for o in n.output:
            assert idx.producer[o] == n
        for i in n.input:
            assert n in idx.consumers_of(i)
    assert "k" in idx.consts and all(t.name in idx.consts for t in m.graph.initializer)
    assert idx.value("k").tolist() == [1.0]
    acts = idx.activations()
    assert "k" not in acts and acts[: len(idx.inputs)] == list(idx.inputs)
    out = idx.outputs[0]
    assert idx.sole_consumer(out) is None  # a graph output is never "solely consumed"
    assert idx.consumers_of("no such tensor") == []
    positions = [idx.position[n.output[0]] for n in idx.nodes if n.output]
    assert positions == sorted(positions)


def test_run_passes_in_order_with_reports_and_the_input_untouched() -> None:
    m = builders.tiny_convnet()
    before = m.SerializeToString()

    def drop_last(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassReport]:
        out = onnx.ModelProto()
        out.CopyFrom(model)
        del out.graph.node[-1]
        return out, PassReport("drop_last", changed=True, detail="removed one node")

    def rename(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassReport]:
        out = onnx.ModelProto()
        out.CopyFrom(model)
        out.graph.name = "renamed"
        return out, PassReport("rename", changed=True)

    said: list[str] = []
    final, reports = run_passes(m, [drop_last, rename], progress=said.append)
    assert m.SerializeToString() == before
    assert [r.name for r in reports] == ["drop_last", "rename"] and final.graph.name == "renamed"
    assert reports[0].nodes_before == len(m.graph.node) and reports[0].nodes_after == len(m.graph.node) - 1
    assert reports[1].nodes_before == reports[1].nodes_after == len(final.graph.node)
    assert all(r.seconds is not None for r in reports)
    assert said[0].startswith("[1/2] drop_last: removed one node, nodes")
    assert PassReport.from_dict(reports[0].to_dict()) == reports[0]
    assert PassReport.from_dict({"name": "old", "changed": True, "detail": "v1 fix entry"}).detail == "v1 fix entry"


def test_weights_pair_without_node_names(tmp_path) -> None:
    """A model exported with unnamed nodes (ORT's quantizer keeps them unnamed): every weight still pairs, through
    the graph structure, with the same values as the named model."""
    from conftest import save

    from qdebug.config import QuantConfig
    from qdebug.debugger import DebugOptions, debug
    from qdebug.quantizer import quantize

    got = {}
    for unnamed in (False, True):
        m = builders.tiny_convnet()
        if unnamed:
            for n in m.graph.node:
                n.name = ""
        f = save(m, tmp_path / f"m{unnamed}.onnx")
        q = tmp_path / f"m{unnamed}.qdq.onnx"
        quantize(f, None, QuantConfig(num_samples=4, per_channel=True, weight_type="int8"), q)
        rep = debug(f, q, None, DebugOptions(num_samples=2))
        got[unnamed] = {w.weight_name: w.weight_sqnr_db for w in rep.weights}
        assert not [w for w in rep.meta.warnings if "no float counterpart" in w]
    assert got[True] == got[False] and len(got[True]) == 6


def test_set_input_redirects_in_place_and_keeps_the_consumers_right() -> None:
    m = builders.tiny_convnet()
    idx = GraphIndex(m)
    conv2 = idx.producer["c2"]
    assert [n.name for n in idx.consumers_of("w2")] == ["conv2"]
    idx.set_input(conv2, 1, "w2_copy")
    assert idx.consumers_of("w2") == [] and [n.name for n in idx.consumers_of("w2_copy")] == ["conv2"]
    assert next(n for n in m.graph.node if n.name == "conv2").input[1] == "w2_copy"  # the graph's own node
    idx.set_input(conv2, 1, "w2_copy")  # the same name again: nothing is listed twice
    assert len(idx.consumers_of("w2_copy")) == 1


def test_distinct_consumers_lists_a_node_reading_a_tensor_twice_once() -> None:
    m = builders.tiny_convnet()
    m.graph.node.append(onnx.helper.make_node("Add", ["y", "y"], ["y2"], name="double"))
    idx = GraphIndex(m)
    assert [n.name for n in idx.consumers_of("y")] == ["double", "double"]
    assert [n.name for n in idx.distinct_consumers("y")] == ["double"]
