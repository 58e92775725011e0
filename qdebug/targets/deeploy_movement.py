"""The integer forms of the ops that move int8 values without computing new ones, in the shapes Deeploy 0.2.1's
Generic parsers take (docs/deeploy.md, "Op coverage").

MaxPool, Reshape, Flatten and Transpose keep their node; Squeeze and Unsqueeze become a Reshape to the static
output shape (Deeploy maps all three to one ReshapeLayer, whose checker wants the two-input form); Slice gets its
constants normalised to what Deeploy's Slice template indexes (non-negative, clamped, consecutive axes); Pad
becomes the attribute form Deeploy's PadParser reads (``mode``, ``pads``, ``value``: the stored integer of the
real pad value). When ORT gave the output another grid than the input (a Slice before a fused Relu), the input
is first requantized to the output's grid by one RequantShift, then moved.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx

from qdebug.errors import TargetError
from qdebug.targets.deeploy_graph import Activation, GraphState, _attrs, _label
from qdebug.targets.deeploy_rq import _node
from qdebug.targets.deeploy_transformer import _uniform_requant

__all__ = ["MOVEMENT_OPS", "drop_identity_casts", "identity_casts", "integer_movement"]

#: Ops exported as data movement on the integers (a max picks one of its inputs' integers).
MOVEMENT_OPS = frozenset(
    {"MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Pad", "ReduceMax", "GlobalMaxPool"}
)


def _const(state: GraphState, node: onnx.NodeProto, i: int) -> np.ndarray | None:
    """Input ``i`` of ``node`` as a constant (None if absent); a computed one is refused, naming the node."""
    if i >= len(node.input) or not node.input[i]:
        return None
    consts = state.consts()
    if node.input[i] not in consts:
        raise TargetError(f"{_label(node)}: input {node.input[i]!r} must be a constant for Deeploy")
    return np.asarray(consts[node.input[i]])


def _shape(node: onnx.NodeProto, shapes: Mapping[str, list[int]], t: str) -> list[int]:
    if t not in shapes:
        raise TargetError(f"{_label(node)}: needs a static shape for {t!r}")
    return list(shapes[t])


def _slice_constants(node: onnx.NodeProto, state: GraphState, shape: list[int]) -> tuple[list[int], ...]:
    """(starts, ends, axes, steps) over consecutive axes, non-negative and clamped: Deeploy's Slice template loops
    from the first axis to the last one listed and types the constants uint8."""
    starts, ends = _const(state, node, 1), _const(state, node, 2)
    if starts is None or ends is None:
        raise TargetError(f"{_label(node)}: needs constant starts and ends")
    axes_in = _const(state, node, 3)
    steps_in = _const(state, node, 4)
    axes = [int(a) % len(shape) for a in (axes_in if axes_in is not None else range(len(starts)))]
    steps = [int(s) for s in (steps_in if steps_in is not None else [1] * len(axes))]
    if any(s <= 0 for s in steps):
        raise TargetError(f"{_label(node)}: a negative or zero step is not supported by Deeploy's Slice template")
    full = {a: (0, shape[a], 1) for a in range(min(axes), max(axes) + 1)}
    for a, s0, e0, st in zip(axes, starts.tolist(), ends.tolist(), steps, strict=True):
        d = shape[a]
        full[a] = (min(max(s0 + d if s0 < 0 else s0, 0), d), min(max(e0 + d if e0 < 0 else e0, 0), d), st)
    if max(shape[a] for a in full) > 255:
        raise TargetError(f"{_label(node)}: a sliced dimension over 255 (Deeploy types Slice's constants uint8)")
    ordered = sorted(full)
    return ([full[a][0] for a in ordered], [full[a][1] for a in ordered], ordered, [full[a][2] for a in ordered])


def _pad_attrs(node: onnx.NodeProto, state: GraphState, rank: int, act: Activation) -> dict[str, object]:
    """Deeploy's Pad attributes: constant mode, the same padding before and after each spatial axis of a 3-D or
    4-D tensor (its Pad1D/Pad2D templates), and the stored integer of the real pad value."""
    a = _attrs(node)
    mode = a.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    pads_c = _const(state, node, 1)
    pads = [int(p) for p in (pads_c if pads_c is not None else a.get("pads", []))]
    if mode != "constant" or _const(state, node, 3) is not None:
        raise TargetError(f"{_label(node)}: only constant padding of every axis is supported (mode {mode!r})")
    if rank not in (3, 4) or len(pads) != 2 * rank or any(pads[i] or pads[rank + i] for i in (0, 1)):
        raise TargetError(f"{_label(node)}: Deeploy pads only the spatial axes of a 3-D or 4-D tensor, got {pads}")
    if pads[2:rank] != pads[rank + 2 :] or any(p < 0 for p in pads):
        raise TargetError(f"{_label(node)}: Deeploy's Pad template pads each axis equally at both ends, got {pads}")
    value_c = _const(state, node, 2)
    real = float(value_c.reshape(-1)[0]) if value_c is not None else float(a.get("value", 0.0))
    q = int(np.clip(np.rint(real / act.scale) + act.zero_point, -128, 127))
    return {"mode": "constant", "pads": pads, "value": q - act.offset}


def _max_as_maxpool(
    state: GraphState, node: onnx.NodeProto, x: str, out: str, shapes: Mapping[str, list[int]]
) -> list[onnx.NodeProto]:
    """ReduceMax over two axes of a 4-D tensor (or GlobalMaxPool) as one MaxPool (Deeploy 0.2.1 maps MaxPool, not
    ReduceMax): a Transpose puts the reduced axes last, the MaxPool's kernel covers them, a Reshape gives the
    output's shape."""
    shape = _shape(node, shapes, node.input[0])
    a = _attrs(node)
    axes_c = _const(state, node, 1)
    axes = [2, 3] if node.op_type == "GlobalMaxPool" else list(axes_c if axes_c is not None else a.get("axes", []))
    axes = sorted(int(ax) % len(shape) for ax in axes)
    if len(shape) != 4 or len(axes) != 2 or 0 in axes or a.get("noop_with_empty_axes", 0):
        raise TargetError(
            f"{_label(node)}: only a max over two non-batch axes of a 4-D tensor is exported (as MaxPool)"
        )
    keep = [i for i in range(4) if i not in axes]
    perm = keep + axes
    name = node.name or out
    moved, pooled, shape_name = (state.unique(f"{name}_{p}") for p in ("moved", "pooled", "shape"))
    state.acts[moved] = state.acts[pooled] = state.acts[x]
    state.set_const(shape_name, np.array(_shape(node, shapes, node.output[0]), np.int64))
    kernel = [shape[axes[0]], shape[axes[1]]]
    nodes = [] if perm == [0, 1, 2, 3] else [_node("Transpose", [x], [moved], state.unique(f"{name}_move"), perm=perm)]
    pool = _node("MaxPool", [moved if nodes else x], [pooled], state.unique(f"{name}_pool"), kernel_shape=kernel,
                 strides=kernel, pads=[0, 0, 0, 0], ceil_mode=0)  # fmt: skip
    return [*nodes, pool, _node("Reshape", [pooled, shape_name], [out], name)]


def integer_movement(
    state: GraphState,
    node: onnx.NodeProto,
    ins: list[str],
    out: str,
    out_act: Activation,
    shapes: Mapping[str, list[int]],
) -> list[onnx.NodeProto]:
    """The integer form of a data-movement node whose output is quantized to ``out`` (``out_act``), or of a
    Relu/Clip that reads a quantized tensor itself (one RequantShift to the output's grid, whose clipping is the
    activation: the caller checks that it is)."""
    src = state.acts.get(ins[0])
    if src is None:
        raise TargetError(f"{_label(node)}: its input {ins[0]!r} is not a quantized activation")
    if node.op_type == "MaxPool" and src.signed and any(_attrs(node).get("pads", [])):
        raise TargetError(
            f"{_label(node)}: Deeploy pads a MaxPool's input with the stored 0 (its ExtractPaddingFromPoolPass), a "
            f"real {-src.scale * src.zero_point:.3g} on this signed grid, not −∞; only a non-negative (stored "
            "unsigned) input, e.g. a ReLU's, pools exactly"
        )
    if node.op_type in ("Relu", "Clip"):  # not after a quantized op's accumulator: the output Q's clipping does it
        state.acts[out] = out_act
        shape = _shape(node, shapes, node.input[0])
        return [_uniform_requant(state, ins[0], out, src.scale / out_act.scale, 256.0, src.residual_zp, out_act, shape)]
    pre: list[onnx.NodeProto] = []
    x = ins[0]
    if (src.scale, src.zero_point) != (out_act.scale, out_act.zero_point):
        if node.op_type == "MaxPool":  # a max commutes with a monotone requantization, but the export keeps one grid
            raise TargetError(f"{_label(node)}: its output is requantized to another scale; not supported")
        x = state.unique(f"{ins[0]}_to_{out}_grid")
        state.acts[x] = out_act
        shape = _shape(node, shapes, node.input[0])
        pre = [_uniform_requant(state, ins[0], x, src.scale / out_act.scale, 256.0, src.residual_zp, out_act, shape)]
        src = out_act
    state.acts[out] = src  # keep the input's storage (shifted or not)
    name = node.name or out
    op = node.op_type
    if op in ("Squeeze", "Unsqueeze"):
        shape_name = state.unique(f"{name}_shape")
        state.set_const(shape_name, np.array(_shape(node, shapes, node.output[0]), np.int64))
        return [*pre, _node("Reshape", [x, shape_name], [out], name)]
    if op == "Slice":
        consts = _slice_constants(node, state, _shape(node, shapes, node.input[0]))
        names = [state.unique(f"{name}_{k}") for k in ("starts", "ends", "axes", "steps")]
        for k, v in zip(names, consts, strict=True):
            state.set_const(k, np.array(v, np.int64))
        return [*pre, _node("Slice", [x, *names], [out], name)]
    if op in ("ReduceMax", "GlobalMaxPool"):
        return [*pre, *_max_as_maxpool(state, node, x, out, shapes)]
    if op == "Pad":
        attrs = _pad_attrs(node, state, len(_shape(node, shapes, node.input[0])), src)
        return [*pre, _node("Pad", [x], [out], name, **attrs)]
    return [*pre, _node(op, [x, *ins[1:]], [out], name, **_attrs(node))]


def identity_casts(model: onnx.ModelProto) -> set[str]:
    """Outputs of the Cast nodes that cast a tensor to its own type (a float cache input cast to float): they
    change nothing, and Deeploy 0.2.1 has no Generic mapping for Cast."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in (*inferred.graph.value_info, *inferred.graph.input)}
    types |= {i.name: i.data_type for i in model.graph.initializer}
    return {
        n.output[0]
        for n in model.graph.node
        if n.op_type == "Cast" and types.get(n.input[0]) == int(_attrs(n).get("to", -1))
    }


def drop_identity_casts(state: GraphState) -> int:
    """Remove every Cast of a tensor to its own type (:func:`identity_casts`): its readers read its input."""
    dropped = identity_casts(state.model)
    cast_of = {n.output[0]: n.input[0] for n in state.graph.node if n.op_type == "Cast" and n.output[0] in dropped}
    outputs = {o.name for o in state.graph.output}
    cast_of = {out: src for out, src in cast_of.items() if out not in outputs}  # a graph output keeps its producer
    keep = [n for n in state.graph.node if not (n.op_type == "Cast" and n.output[0] in cast_of)]
    for n in keep:
        for i, t in enumerate(n.input):
            if t in cast_of:
                n.input[i] = cast_of[t]
    del state.graph.node[:]
    state.graph.node.extend(keep)
    return len(cast_of)
