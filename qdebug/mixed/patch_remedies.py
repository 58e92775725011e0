"""A diagnostic's remedy as a patch of a QDQ model the user gave, every other byte kept (as :mod:`qdebug.mixed.patch`
does for a promotion): what the diagnostics offer (:class:`~qdebug.findings.RemedyKind`) measured on *that* model,
not on a re-quantization of the float model.

* ``per_channel``: the weight is quantized again from the float model's weight, one scale per output channel
  (ONNX Runtime's rule: symmetric weights ``scale = 2·max|w| / (qmax − qmin)`` with the type's symmetric zero point,
  else the channel's range widened to hold 0), its ``DequantizeLinear`` given the new integers, scales, zero points
  and axis. Its bias keeps its own (per-tensor) grid: the float bias it dequantizes to is unchanged.
* ``float_fallback``: the named nodes run in float — their constant inputs are the float model's weights again
  and their outputs lose their Q/DQ pair (what ORT's ``nodes_to_exclude`` does); their activation inputs still come
  through the producers' pairs.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qdebug.errors import ConfigError
from qdebug.model_io import is_dq, is_q
from qdebug.pairing import pair_models

#: Output-channel axis of a weight by its consumer's op (MatMul: the last).
OUT_AXIS = {"Conv": 0, "ConvTranspose": 1, "Gemm": 0, "MatMul": -1}
_BOUNDS = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127),
           np.dtype(np.uint16): (0, 65535), np.dtype(np.int16): (-32768, 32767)}  # fmt: skip


@dataclass(frozen=True)
class RemedyPatch:
    """A patched model and one line per change (empty :attr:`changes`: the model is the given one)."""

    model: onnx.ModelProto
    changes: tuple[str, ...]

    def describe(self) -> str:
        """What changed, one line each."""
        if not self.changes:
            return "nothing changed: the model is yours, byte for byte"
        return "\n".join([f"{len(self.changes)} change(s) in your model; everything else is unchanged:",
                          *(f"  {c}" for c in self.changes)])  # fmt: skip


def _per_channel(w: np.ndarray, axis: int, dtype: np.dtype, symmetric: bool) -> tuple[np.ndarray, ...]:
    """``w`` quantized to ``dtype`` with one scale per slice along ``axis``: (integers, scales, zero points)."""
    lo, hi = _BOUNDS[dtype]
    moved = np.moveaxis(w.astype(np.float64), axis, 0).reshape(w.shape[axis], -1)
    if symmetric:
        absmax = np.abs(moved).max(axis=1)
        scale = np.where(absmax > 0, 2 * absmax / (hi - lo), 1.0)
        zp = np.full(scale.shape, 0 if lo < 0 else (hi + 1) // 2)
    else:
        rmin, rmax = np.minimum(moved.min(axis=1), 0.0), np.maximum(moved.max(axis=1), 0.0)
        scale = np.where(rmax > rmin, (rmax - rmin) / (hi - lo), 1.0)
        zp = np.clip(np.round(lo - rmin / scale), lo, hi)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.round(w / scale.reshape(shape)) + zp.reshape(shape), lo, hi).astype(dtype)
    return q, scale.astype(np.float32), zp.astype(dtype)


def per_channel_weights(quant: onnx.ModelProto, float_model: onnx.ModelProto, weights: Sequence[str]) -> RemedyPatch:
    """``quant`` with each float weight in ``weights`` quantized per output channel (module docstring); a weight
    that is per-channel already is left as it is. An unknown weight is a :class:`ConfigError` naming it."""
    pairs = {p.weight_name: p for p in pair_models(float_model, quant).weights if p.kind == "weight"}
    floats = {i.name: i for i in float_model.graph.initializer}
    out = copy.deepcopy(quant)
    inits = {i.name: i for i in out.graph.initializer}
    nodes = {n.name: n for n in out.graph.node if n.name}
    changes = []
    for name in dict.fromkeys(weights):
        pair = pairs.get(name)
        if pair is None or name not in floats or pair.dq_node not in nodes:
            raise ConfigError(f"cannot quantize {name!r} per channel: it is not a quantized weight of the model")
        dq = nodes[pair.dq_node]
        old_scale = numpy_helper.to_array(inits[dq.input[1]])
        if old_scale.size > 1:
            continue
        old_q = numpy_helper.to_array(inits[dq.input[0]])
        old_zp = numpy_helper.to_array(inits[dq.input[2]]) if len(dq.input) > 2 else np.zeros((), old_q.dtype)
        lo, hi = _BOUNDS[old_q.dtype]
        symmetric = int(old_zp.reshape(-1)[0]) == (0 if lo < 0 else (hi + 1) // 2)
        w = numpy_helper.to_array(floats[name])
        axis = channel_axis(float_model, name)
        q, scale, zp = _per_channel(w, axis, old_q.dtype, symmetric)
        base = f"{name}_per_channel"
        out.graph.initializer.extend([numpy_helper.from_array(q, f"{base}_quantized"),
                                      numpy_helper.from_array(scale, f"{base}_scale"),
                                      numpy_helper.from_array(zp, f"{base}_zero_point")])  # fmt: skip
        del dq.input[:]
        dq.input.extend([f"{base}_quantized", f"{base}_scale", f"{base}_zero_point"])
        for a in [a for a in dq.attribute if a.name == "axis"]:
            dq.attribute.remove(a)
        dq.attribute.append(helper.make_attribute("axis", axis))
        changes.append(f"{name}: per-tensor (scale {float(old_scale.reshape(-1)[0]):.4g}) → per channel on axis "
                       f"{axis} ({scale.size} scales, {float(scale.min()):.4g}–{float(scale.max()):.4g})")  # fmt: skip
    _drop_unused(out)
    return RemedyPatch(out if changes else quant, tuple(changes))


def channel_axis(float_model: onnx.ModelProto, weight: str) -> int:
    """The output-channel axis of ``weight`` by the op that reads it (:data:`OUT_AXIS`; a Gemm without ``transB``:
    1), as a non-negative axis."""
    ndim = len(next(i.dims for i in float_model.graph.initializer if i.name == weight))
    node = next((n for n in float_model.graph.node if weight in n.input), None)
    op = "" if node is None else node.op_type
    axis = OUT_AXIS.get(op, 0)
    if op == "Gemm" and node is not None and not any(a.name == "transB" and a.i for a in node.attribute):
        axis = 1
    return axis % max(ndim, 1)


def keep_in_float(quant: onnx.ModelProto, float_model: onnx.ModelProto, nodes: Sequence[str]) -> RemedyPatch:
    """``quant`` with ``nodes`` running in float (module docstring). An unknown node is a :class:`ConfigError`."""
    out = copy.deepcopy(quant)
    by_name = {n.name: n for n in out.graph.node if n.name}
    floats = {i.name: i for i in float_model.graph.initializer}
    pairs = {p.dq_node: p for p in pair_models(float_model, quant).weights}
    producer = {o: n for n in out.graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in out.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    changes = []
    for name in dict.fromkeys(nodes):
        node = by_name.get(name)
        if node is None:
            raise ConfigError(f"cannot keep {name!r} in float: the quantized model has no node of that name")
        for k, i in enumerate(node.input):  # constant inputs: the float model's values again
            dq = producer.get(i)
            pair = pairs.get(dq.name) if dq is not None and is_dq(dq) else None
            if pair is not None and pair.weight_name in floats:
                fname = pair.weight_name if pair.weight_name not in producer else f"{pair.weight_name}_float"
                if fname not in {x.name for x in out.graph.initializer}:  # ORT may name a bias's DQ output as it
                    init = copy.deepcopy(floats[pair.weight_name])
                    init.name = fname
                    out.graph.initializer.append(init)
                node.input[k] = fname
        outputs = {v.name for v in out.graph.output}
        for k, o in enumerate(list(node.output)):  # its outputs: their Q/DQ pair goes, consumers read the float value
            for q in [c for c in consumers.get(o, []) if is_q(c)]:
                for dq in [c for c in consumers.get(q.output[0], []) if is_dq(c)]:
                    if dq.output[0] in outputs:  # a graph output keeps its name: the node writes it directly
                        _rename_output(node, k, dq.output[0], consumers.get(o, []))
                        out.graph.node.remove(dq)
                        continue
                    for c in consumers.get(dq.output[0], []):
                        c.input[:] = [o if x == dq.output[0] else x for x in c.input]
        changes.append(f"{name} ({node.op_type}): runs in float (float weights, no Q/DQ on its output)")
    _drop_unused(out)
    return RemedyPatch(out if changes else quant, tuple(changes))


def _rename_output(node: onnx.NodeProto, k: int, name: str, readers: list[onnx.NodeProto]) -> None:
    """``node``'s output ``k`` renamed ``name`` (a graph output whose Q/DQ pair went), its readers following."""
    old = node.output[k]
    for c in readers:
        c.input[:] = [name if x == old else x for x in c.input]
    node.output[k] = name


def _drop_unused(model: onnx.ModelProto) -> None:
    """Remove nodes whose outputs nobody reads (the Q/DQ pairs a patch bypassed) and initializers nothing reads."""
    g = model.graph
    while True:
        used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
        dead = [n for n in g.node if (is_q(n) or is_dq(n)) and not any(o in used for o in n.output)]
        if not dead:
            break
        for n in dead:
            g.node.remove(n)
    used = {i for n in g.node for i in n.input}
    for init in [i for i in g.initializer if i.name not in used]:
        g.initializer.remove(init)


__all__ = ["OUT_AXIS", "RemedyPatch", "channel_axis", "keep_in_float", "per_channel_weights"]
