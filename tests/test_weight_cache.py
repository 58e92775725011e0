"""Weight results reused between debug passes (:class:`qdebug.debugger.WeightCache`): a weight whose float model,
integers, scale, zero point and DequantizeLinear are unchanged keeps its result; anything else is measured again,
and the results always equal a pass without the cache. Real tiny models in ONNX Runtime."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from qdebug.debugger import WeightCache, debug
from qdebug.graph_index import GraphIndex
from qdebug.model_io import load_model
from qdebug.pairing import pair_models
from qdebug.report import DebugReport


def _weights(report: DebugReport) -> list[dict[str, object]]:
    return [dataclasses.asdict(w) for w in report.weights]


def _changed_weight(quant: Path, out: Path) -> str:
    """``quant`` with one weight's integers changed (one value moved by one step), saved to ``out``; its name."""
    qm = load_model(quant)
    fm_pairing = pair_models(load_model(quant.parent / "tiny.onnx"), qm)
    w = next(p for p in fm_pairing.weights if p.kind == "weight")
    qi = GraphIndex(qm)
    name = qi.qdq_nodes[w.dq_node].input[0]
    init = next(t for t in qm.graph.initializer if t.name == name)
    ints = numpy_helper.to_array(init).copy()
    flat = ints.reshape(-1)
    flat[0] = flat[0] + 1 if flat[0] < np.iinfo(ints.dtype).max else flat[0] - 1
    init.CopyFrom(numpy_helper.from_array(ints, name))
    onnx.save(qm, str(out))
    return w.weight_name


def test_an_unchanged_model_reuses_every_weight(tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    cache = WeightCache()
    plain = debug(tiny_float, tiny_quant("u8"))
    first = debug(tiny_float, tiny_quant("u8"), weight_cache=cache)
    n = len(first.weights)
    assert n > 0 and (cache.hits, cache.misses) == (0, n)
    second = debug(tiny_float, tiny_quant("u8"), weight_cache=cache)
    assert (cache.hits, cache.misses) == (n, n)
    assert _weights(second) == _weights(first) == _weights(plain)


def test_a_changed_weight_is_measured_again(
    tmp_path: Path, tiny_float: Path, tiny_quant: Callable[[str], Path]
) -> None:
    cache = WeightCache()
    debug(tiny_float, tiny_quant("u8"), weight_cache=cache)
    variant = tmp_path / "variant.qdq.onnx"
    changed = _changed_weight(tiny_quant("u8"), variant)
    hits = cache.hits
    got = debug(tiny_float, variant, weight_cache=cache)
    assert cache.misses == len(got.weights) + 1 and cache.hits == hits + len(got.weights) - 1
    assert _weights(got) == _weights(debug(tiny_float, variant))  # the same as measured without the cache
    before = {w.weight_name: w for w in debug(tiny_float, tiny_quant("u8")).weights}
    after = {w.weight_name: w for w in got.weights}
    assert after[changed] != before[changed]


def test_another_float_model_or_metric_set_is_another_key(
    tmp_path: Path, tiny_float: Path, tiny_quant: Callable[[str], Path]
) -> None:
    from qdebug.debugger import DebugOptions

    cache = WeightCache()
    debug(tiny_float, tiny_quant("u8"), weight_cache=cache)
    fm = load_model(tiny_float)
    fm.doc_string = "another file, the same graph"
    other = tmp_path / "other.onnx"
    onnx.save(fm, str(other))
    misses = cache.misses
    debug(other, tiny_quant("u8"), weight_cache=cache)  # another float file: nothing is assumed about it
    n = cache.misses - misses
    assert n > 0 and cache.hits == 0
    debug(tiny_float, tiny_quant("u8"), None, DebugOptions(metrics=("sqnr_db",)), weight_cache=cache)
    assert cache.hits == 0 and cache.misses == misses + 2 * n


def test_the_cache_is_bounded(tmp_path: Path, tiny_float: Path, tiny_quant: Callable[[str], Path]) -> None:
    cache = WeightCache(passes=2)
    n = len(debug(tiny_float, tiny_quant("u8"), weight_cache=cache).weights)
    for name in ("u16_qnn", "s8_per_channel", "u8"):
        debug(tiny_float, tiny_quant(name), weight_cache=cache)
    assert len(cache._results) <= 2 * n


def _in_graph_q(quant: Path, out: Path, factor: float = 1.0) -> str:
    """``quant`` with one weight quantized in-graph — DequantizeLinear(QuantizeLinear(float constant)) instead of
    DequantizeLinear(integers) — the float constant being the dequantized integers times ``factor``; its name."""
    qm = load_model(quant)
    pairing = pair_models(load_model(quant.parent / "tiny.onnx"), qm)
    w = next(p for p in pairing.weights if p.kind == "weight")
    qi = GraphIndex(qm)
    dq = qi.qdq_nodes[w.dq_node]
    ints_name, scale, zp = dq.input[0], dq.input[1], dq.input[2]
    init = next(t for t in qm.graph.initializer if t.name == ints_name)
    ints = numpy_helper.to_array(init)
    zp_v = numpy_helper.to_array(next(t for t in qm.graph.initializer if t.name == zp))
    s_v = numpy_helper.to_array(next(t for t in qm.graph.initializer if t.name == scale))
    values = ((ints.astype(np.float32) - zp_v.astype(np.float32)) * s_v * factor).astype(np.float32)
    qm.graph.initializer.remove(init)
    qm.graph.initializer.append(numpy_helper.from_array(values, ints_name + "_float"))
    q = onnx.helper.make_node("QuantizeLinear", [ints_name + "_float", scale, zp], [ints_name], name=ints_name + "_Q")
    qm.graph.node.insert(0, q)
    onnx.save(qm, str(out))
    return w.weight_name


def test_a_weight_quantized_in_graph_is_keyed_by_its_float_constant(
    tmp_path: Path, tiny_float: Path, tiny_quant: Callable[[str], Path]
) -> None:
    """DequantizeLinear(QuantizeLinear(float constant)): the digest covers the QuantizeLinear and its constant, so a
    changed float constant is measured again, and every result equals a pass without the cache."""
    same, scaled = tmp_path / "same.qdq.onnx", tmp_path / "scaled.qdq.onnx"
    name = _in_graph_q(tiny_quant("u8"), same)
    _in_graph_q(tiny_quant("u8"), scaled, factor=1.7)
    cache = WeightCache()
    first = debug(tiny_float, same, weight_cache=cache)
    assert name in {w.weight_name for w in first.weights}
    n, misses = len(first.weights), cache.misses
    second = debug(tiny_float, scaled, weight_cache=cache)
    assert cache.misses == misses + 1 and cache.hits == n - 1  # only the in-graph weight changed
    assert _weights(second) == _weights(debug(tiny_float, scaled))
    assert _weights(first) == _weights(debug(tiny_float, same))
