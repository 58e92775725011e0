"""The divergence rule and its localisation on small graphs (pure functions; the real HTP cases are in
tests/test_qnn.py)."""

from __future__ import annotations

import math
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from qdebug.data import SyntheticData
from qdebug.errors import ConfigError
from qdebug.targets.divergence import EXCESS_NOISE_THRESHOLD, excess_ratio, locate, sqnr_drop_db, upstream_compared
from qdebug.targets.qnn_accuracy import htp_accuracy
from qdebug.targets.qnn_bisect import prefix_model


def chain() -> onnx.ModelProto:
    """x → Conv c → BatchNormalization b → Relu r → Add a(r, c) → Mul m; Mul k(c) is a side branch ending there."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("BatchNormalization", ["c", "g", "b0", "m0", "v0"], ["b"], name="bn"),
        helper.make_node("Relu", ["b"], ["r"], name="relu"),
        helper.make_node("Add", ["r", "c"], ["a"], name="add"),
        helper.make_node("Mul", ["a", "a"], ["m"], name="mul"),
        helper.make_node("Mul", ["c", "c"], ["k"], name="side"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in ("m", "k")]
    return helper.make_model(helper.make_graph(nodes, "g", [x], outs))


def test_the_ratio_is_extra_error_vs_float_in_units_of_the_quantization_error() -> None:
    assert EXCESS_NOISE_THRESHOLD == 1.0
    assert excess_ratio(2.0, 1.0, 0.1) == 1.0  # twice the error vs float: as much again as quantization's
    assert sqnr_drop_db(1.0) == pytest.approx(10 * math.log10(2))  # ratio 1 ⇔ ~3 dB lost vs float
    assert excess_ratio(0.5, 1.0, 0.1) == -0.5  # closer to float than ORT CPU: never flagged
    assert excess_ratio(0.3, 0.0, 0.1) == pytest.approx(3.0)  # CPU exact: the grid's rounding noise is the unit
    assert excess_ratio(0.3, None, 0.1) == pytest.approx(3.0)
    assert excess_ratio(1.0, 0.0, 0.0) == math.inf and excess_ratio(0.0, 0.0, 0.0) == 0.0
    assert sqnr_drop_db(-1.0) == -math.inf and sqnr_drop_db(math.inf) == math.inf


def test_upstream_walks_through_uncompared_tensors() -> None:
    up = upstream_compared(chain(), ["x", "c", "r", "a", "m", "k"])  # b (the BN output) is not compared
    assert up["r"].sources == {"c"}
    assert up["r"].nodes == (("BatchNormalization", "bn"), ("Relu", "relu"))
    assert up["a"].sources == {"r", "c"} and up["a"].nodes == (("Add", "add"),)
    assert up["c"].sources == {"x"} and up["x"].sources == frozenset()


def test_starts_isolated_starts_and_op_types() -> None:
    order = ["x", "c", "r", "a", "m", "k"]
    up = upstream_compared(chain(), order)
    # One region from r on: r starts it; the BN that computes it (not compared itself) is named.
    d = locate(order, ["r", "a", "m"], up)
    assert d.starts == ("r",) and d.first == "r" and d.isolated == ()
    assert d.first_nodes == (("BatchNormalization", "bn"), ("Relu", "relu"))
    assert dict(d.op_types) == {"BatchNormalization": 1, "Relu": 1, "Add": 1, "Mul": 1}
    # c flagged but none of its consumers: isolated (its error goes nowhere), so the next start is named.
    d = locate(order, ["c", "m"], up)
    assert d.starts == ("c", "m") and d.isolated == ("c",) and d.first == "m"
    # Only isolated starts: the first one is still named. A flagged model output (no consumer) is not isolated.
    assert locate(order, ["c"], up).first == "c"
    assert locate(order, ["k"], up).isolated == ()
    assert locate(order, [], up).first is None


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, True, "1"])
def test_a_bad_excess_threshold_is_a_config_error(bad: object, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="excess_threshold must be a positive number"):
        htp_accuracy("f.onnx", "q.onnx", "c.onnx", SyntheticData([], 1), out_dir=tmp_path, excess_threshold=bad)  # type: ignore[arg-type]


def test_prefix_model_keeps_what_the_cut_tensor_depends_on() -> None:
    cut = prefix_model(chain(), "r")
    assert [n.name for n in cut.graph.node] == ["conv", "bn", "relu"]
    assert [o.name for o in cut.graph.output] == ["r"] and [i.name for i in cut.graph.input] == ["x"]
