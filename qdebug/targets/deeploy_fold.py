"""The Deeploy export's central pass: every DQ → op → (Relu|Clip) → Q chain becomes its integer op and
RequantShift (:func:`fold_dequant_quant_to_requantshift`).

Here live the integer forms of the linear ops (Conv/Gemm/MatMul and GlobalAveragePool as a depthwise Conv: one
int32 accumulator brought back to 8 bits by one RequantShift, its constants chosen in :mod:`qdebug.targets.deeploy_rq`),
of Add (both inputs on a common fine grid) and of the pass-through ops; the transformer ops' forms are
:mod:`qdebug.targets.deeploy_transformer`'s. The arithmetic is described in :mod:`qdebug.targets.deeploy_export`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from qdebug.errors import TargetError
from qdebug.graph_index import GraphIndex
from qdebug.model_io import is_dq, is_q
from qdebug.targets import deeploy_transformer as dt
from qdebug.targets.deeploy_affine import integer_batchnorm
from qdebug.targets.deeploy_gelu import gelu_chains
from qdebug.targets.deeploy_graph import Activation, GraphState, _activation, _attrs, _label, _qparams
from qdebug.targets.deeploy_movement import MOVEMENT_OPS, integer_movement
from qdebug.targets.deeploy_rq import _INT32_LIMIT, _choose_requant, _node, _requant_node, _rqs
from qdebug.targets.deeploy_transformer import TRANSFORMER_OPS

__all__ = ["fold_dequant_quant_to_requantshift"]

_PASS_THROUGH = MOVEMENT_OPS


def _bias_fraction_bits(acc_scale: np.ndarray, bias_scale: np.ndarray) -> int:
    """j when the bias scale is the accumulator scale / 2^j (1 ≤ j ≤ 4, to float32 rounding), else 0.

    0 also covers a bias scale that merely approximates ``s_in·s_w`` (the quantizers' own): such a bias is read
    in accumulator units, as always.
    """
    ratio = np.asarray(acc_scale, np.float64).reshape(-1) / np.asarray(bias_scale, np.float64).reshape(-1)
    for j in range(1, 5):
        if np.allclose(ratio, 2.0**j, rtol=1e-5, atol=0):
            return j
    return 0


def _activation_aliases(state: GraphState, g: onnx.GraphProto, consts: Mapping[str, np.ndarray]) -> dict[str, str]:
    """Record every activation Q's parameters in ``state.acts``; map each DQ output to its integer tensor."""
    alias: dict[str, str] = {}  # DQ output → integer tensor
    for node in g.node:
        if is_q(node):
            scale, zp = _qparams(node, consts)
            if scale.size != 1:
                raise TargetError(f"activation {node.output[0]!r} is quantized per channel; unsupported")
            state.acts.setdefault(node.output[0], _activation(float(scale.reshape(())), int(zp.reshape(()))))
    for node in g.node:
        if is_dq(node) and node.input[0] in state.acts:
            alias[node.output[0]] = node.input[0]
            state.acts.setdefault(node.output[0], state.acts[node.input[0]])
    return alias


def _integer_node(
    state: GraphState,
    node: onnx.NodeProto,
    ins: list[str],
    out: str,
    out_act: Activation,
    shapes: dict[str, list[int]],
) -> list[onnx.NodeProto]:
    """The integer form of one compute node whose output is quantized to ``out``."""
    if node.op_type in _PASS_THROUGH or node.op_type in ("Relu", "Clip"):
        return integer_movement(state, node, ins, out, out_act, shapes)
    if node.op_type in TRANSFORMER_OPS or node.op_type in ("MatMul", "Add"):
        done = dt.integer_transformer_node(state, node, ins, out, out_act, shapes)
        if done is not None:
            return done
    if node.op_type == "BatchNormalization":  # a free-standing one (one after a Conv was folded before quantizing)
        return integer_batchnorm(state, node, ins, out, out_act)
    if node.op_type == "GlobalAveragePool":
        conv, w_name = _gap_as_depthwise_conv(state, node, ins[0], shapes)
        return _integer_linear(state, conv, [ins[0], w_name], out, out_act)
    if node.op_type == "Add":
        return _integer_add(state, node, ins, out, out_act, shapes)
    pre, ins = dt.int8_operands(state, node, ins, shapes)  # PULPOpen: a uint8 input of a MatMul → int8
    return [*pre, *_integer_linear(state, node, ins, out, out_act, shapes.get(node.output[0]))]


def fold_dequant_quant_to_requantshift(state: GraphState) -> int:
    """Turn every DQ → op → (Relu|Clip) → Q chain into the integer op (+ RequantShift where the scale changes).

    Conv/Gemm/MatMul accumulate in int32 and are requantized by one RequantShift; Add brings both int8 inputs to
    a common fine grid with exact integer multiplies (RequantShift with div 1, int32 output), adds, and
    requantizes; MaxPool/Reshape/Flatten run on the integers directly (their Q repeats the input's parameters).
    Relu/Clip disappear when the output Q's clipping already implements them exactly.
    """
    g = state.graph
    consts = state.consts()
    ix = state.index()
    alias = _activation_aliases(state, g, consts)
    shapes = {**state.shapes, **_static_shapes(state.model)}
    new_nodes: list[onnx.NodeProto] = []
    n = 0
    gelus = gelu_chains(ix, {**consts, **state.constants})
    inside = {m for _, members, _ in gelus.values() for m in members}
    for node in ix.nodes:
        if is_q(node) or is_dq(node) or node.op_type == "Constant" or _absorbed(node, ix):
            continue
        ins = [alias.get(t, t) for t in node.input]
        if node.name in gelus:  # the whole GELU chain becomes one node, from x to the last Mul's Q
            last, _, x = gelus[node.name]
            q_node, _ = _output_q(last, ix)
            out_act = state.acts[q_node.output[0]]
            new_nodes.extend(dt.integer_gelu_chain(state, node, alias.get(x, x), q_node.output[0], out_act))
            n += 1
            continue
        if node.name in inside:
            continue
        q_node, skipped = _output_q(node, ix)
        out_act = state.acts[q_node.output[0]]
        new_nodes.extend(_integer_node(state, node, ins, q_node.output[0], out_act, shapes))
        for s in (*skipped, *([node] if node.op_type in ("Relu", "Clip") else [])):
            _check_absorbed(s, out_act, consts)
        n += 1
    producers_left = {t for nn in new_nodes for t in nn.output}
    del g.node[:]
    g.node.extend(new_nodes)
    # Graph outputs still point at DQ outputs; strip_output_dequant maps them to the integer tensors.
    for o in g.output:
        if o.name in alias:
            state.outputs.setdefault(o.name, state.acts[alias[o.name]])
            state.output_sources[o.name] = alias[o.name]
        elif o.name not in producers_left and o.name in ix.producer:
            raise TargetError(f"graph output {o.name!r} is not quantized (no trailing QuantizeLinear/DequantizeLinear)")
    return n


def _absorbed(node: onnx.NodeProto, ix: GraphIndex) -> bool:
    """A Relu/Clip after a quantized op's own output (not a dequantized tensor): that op's chain absorbs it."""
    src = ix.producer.get(node.input[0])
    return node.op_type in ("Relu", "Clip") and not (src is not None and is_dq(src))


def _static_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    inferred = onnx.shape_inference.infer_shapes(model)
    out: dict[str, list[int]] = {}
    for vi in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output):
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if dims and all(d > 0 for d in dims):
            out[vi.name] = dims
    return out


def _gap_as_depthwise_conv(
    state: GraphState, node: onnx.NodeProto, x: str, shapes: Mapping[str, list[int]]
) -> tuple[onnx.NodeProto, str]:
    """GlobalAveragePool = depthwise Conv with an all-ones H×W kernel of scale 1/(H·W).

    Deeploy has no integer average pool in the op set this export targets, but it runs depthwise Convs; the
    1/(H·W) goes into the RequantShift like any weight scale.
    """
    shape = shapes.get(x)
    if shape is None or len(shape) != 4:
        raise TargetError(f"{_label(node)}: needs a static 4-D input shape, got {shape}")
    c, h, w = shape[1], shape[2], shape[3]
    w_name = state.unique(f"{node.name or node.output[0]}_ones")
    state.weights[w_name] = (np.ones((c, 1, h, w), np.int8), np.array(1.0 / (h * w)))
    conv = _node(
        "Conv", [x, w_name], [node.output[0]], node.name or node.output[0],
        group=c, kernel_shape=[h, w], pads=[0, 0, 0, 0], strides=[1, 1], dilations=[1, 1],
    )  # fmt: skip
    return conv, w_name


def _output_q(node: onnx.NodeProto, ix: GraphIndex) -> tuple[onnx.NodeProto, list[onnx.NodeProto]]:
    """The QuantizeLinear that closes ``node``'s chain, and the Relu/Clip nodes skipped on the way."""
    skipped: list[onnx.NodeProto] = []
    cur = node
    while True:
        users = ix.consumers_of(cur.output[0])
        if len(users) == 1 and users[0].op_type in ("Relu", "Clip"):
            skipped.append(users[0])
            cur = users[0]
            continue
        if len(users) == 1 and is_q(users[0]):
            return users[0], skipped
        raise TargetError(
            f"{_label(node)}: its output is not quantized by a single QuantizeLinear (consumers: "
            f"{[u.op_type for u in users]}); every op must end in an int8 tensor"
        )


def _check_absorbed(act_node: onnx.NodeProto, out: Activation, consts: Mapping[str, np.ndarray]) -> None:
    """Relu/Clip vanish only if the Q's representable range lies inside theirs."""
    lo_real = out.scale * (-128 - out.zero_point)
    hi_real = out.scale * (127 - out.zero_point)
    if act_node.op_type == "Relu":
        lo, hi = 0.0, math.inf
    else:
        a = _attrs(act_node)
        lo = (
            float(consts[act_node.input[1]])
            if len(act_node.input) > 1 and act_node.input[1]
            else a.get("min", -math.inf)
        )
        hi = (
            float(consts[act_node.input[2]])
            if len(act_node.input) > 2 and act_node.input[2]
            else a.get("max", math.inf)
        )
    if lo_real < lo - 1e-6 * abs(out.scale) or hi_real > hi + 1e-6 * abs(out.scale):
        raise TargetError(
            f"{_label(act_node)}: the following QuantizeLinear range [{lo_real:.4g}, {hi_real:.4g}] is wider than "
            f"the activation's [{lo}, {hi}], so it cannot be absorbed into RequantShift clipping"
        )


def _integer_linear(
    state: GraphState,
    node: onnx.NodeProto,
    ins: list[str],
    out: str,
    out_act: Activation,
    out_shape: Sequence[int] | None = None,
) -> list[onnx.NodeProto]:
    op = node.op_type
    x, w_name = ins[0], ins[1]
    if x not in state.acts or w_name not in state.weights:
        raise TargetError(f"{_label(node)}: expects a quantized activation and a constant int8 weight")
    in_act = state.acts[x]
    w, w_scale = state.weights[w_name]
    attrs = _attrs(node)
    if op == "Gemm" and (attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0):
        raise TargetError(f"{_label(node)}: only Gemm with transA=0, alpha=beta=1 is supported")
    out_axis = 0 if op == "Conv" or (op == "Gemm" and attrs.get("transB", 0)) else 1
    w_int = w
    channels = int(w_int.shape[out_axis])
    bias = np.zeros(channels, np.int64)
    if len(ins) > 2 and ins[2]:
        if ins[2] not in state.weights:
            raise TargetError(f"{_label(node)}: bias {node.input[2]!r} is not a quantized int32 constant")
        bias = state.weights[ins[2]][0].astype(np.int64).reshape(-1)
        frac_bits = _bias_fraction_bits(in_act.scale * np.asarray(w_scale, np.float64), state.weights[ins[2]][1])
    else:
        frac_bits = 0
    # A bias on a 2^-j finer grid than the accumulator (scale s_in·s_w/2^j, e.g. the tie-free snapping's half
    # unit): its integer part stays the Conv/Gemm bias, the fraction r/2^j goes into the RequantShift add as
    # r·mul/2^j, so mul must be a multiple of 2^j.
    frac = np.zeros(channels, np.int64)
    if frac_bits:
        frac = bias % 2**frac_bits
        bias = bias >> frac_bits  # floor
    m = np.broadcast_to(in_act.scale * np.asarray(w_scale, np.float64) / out_act.scale, (channels,))
    acc_max = _accumulator_bound(w_int, out_axis, in_act, bias)
    if np.any(frac):  # the real bias lies between the integer part and the next integer
        acc_max = np.maximum(acc_max, _accumulator_bound(w_int, out_axis, in_act, bias + 1))
    mul, k = _choose_requant(m, acc_max, out_act.residual_zp, multiple_of=2**frac_bits if np.any(frac) else 1)
    acc = state.unique(f"{node.output[0]}_acc")
    new_ins = [x, _weight_initializer(state, w_name, w_int)]
    if op in ("Conv", "Gemm"):
        b_name = state.unique(f"{node.name or acc}_bias")
        state.set_const(b_name, bias.astype(np.int32))
        new_ins.append(b_name)
    elif np.any(bias):
        raise TargetError(f"{_label(node)}: MatMul with a bias input is not expected")
    keep = {k2: v for k2, v in attrs.items() if op != "Gemm" or k2 == "transB"}
    integer = _node(op, new_ins, [acc], node.name or acc, **keep)  # a unique name: pending_zp is keyed by it
    if in_act.residual_zp != 0:
        state.pending_zp[integer.name] = in_act.residual_zp
    ch_shape = (channels, 1, 1) if op == "Conv" else (channels,)
    add = out_act.residual_zp * 2**k + frac * mul // 2**frac_bits
    if op == "MatMul" and out_shape is not None and len(out_shape) > 2:
        return _flat_requant(state, integer, acc, out, mul, add, k, out_act, out_shape, m)
    rq = _requant_node(state, acc, out, mul, add, k, out_act, ch_shape)
    state.requant_errors[rq.name] = float(np.max(np.abs(mul / 2.0**k - m) / m))
    if not np.any(frac):  # tighten_requant_to_observed_range rebuilds add from the integer bias alone
        state.requant_targets[rq.name] = (np.asarray(m, np.float64), out_act.residual_zp, acc_max)
    return [integer, rq]


def _flat_requant(
    state: GraphState,
    integer: onnx.NodeProto,
    acc: str,
    out: str,
    mul: np.ndarray,
    add: np.ndarray,
    k: int,
    out_act: Activation,
    out_shape: Sequence[int],
    m: np.ndarray,
) -> list[onnx.NodeProto]:
    """The RequantShift of a MatMul whose output has more than two dimensions, on a ``[1, N]`` view.

    Deeploy broadcasts a RequantShift's mul/add to the input's first two dimensions and indexes them by
    ``i / prod(shape[2:])``; the output channels of a MatMul are its *last* dimension, so the constants are
    tiled over the flattened tensor (Reshapes are free in Deeploy)."""
    size, ch = int(np.prod(out_shape)), int(out_shape[-1])
    flat_in, flat_out = state.unique(f"{acc}_flat"), state.unique(f"{out}_flat")
    s_flat, s_back = state.unique(f"{out}_shape_flat"), state.unique(f"{out}_shape")
    state.set_const(s_flat, np.array([1, size], np.int64))
    state.set_const(s_back, np.array(list(out_shape), np.int64))
    tile = size // ch
    mul_t = np.tile(np.broadcast_to(np.asarray(mul).reshape(-1), (ch,)), tile)
    add_t = np.tile(np.broadcast_to(np.asarray(add).reshape(-1), (ch,)), tile)
    # (size,), not (1, size): Deeploy's RequantShift layer would broadcast a [1, N] constant to [1, N, N]
    rq = _requant_node(state, flat_in, flat_out, mul_t, add_t, k, out_act, (size,))
    state.acts[flat_out] = out_act
    state.requant_errors[rq.name] = float(np.max(np.abs(mul / 2.0**k - m) / m))
    return [
        integer,
        _node("Reshape", [acc, s_flat], [flat_in], state.unique(f"{integer.name}_flatten")),
        rq,
        _node("Reshape", [flat_out, s_back], [out], state.unique(f"{integer.name}_unflatten")),
    ]


def _accumulator_bound(w: np.ndarray, out_axis: int, x: Activation, bias: np.ndarray) -> np.ndarray:
    """Per output channel, the largest |value| Deeploy's int32 RequantShift sees, over every possible input.

    Both ``acc·mul`` (the raw accumulator) and ``acc·mul + add`` (with the bias and zero-point correction
    that ``add`` carries) must fit; the range is exact: positive weights meet the input's maximum, negative
    ones its minimum.
    """
    wc = np.moveaxis(w.astype(np.int64), out_axis, 0).reshape(w.shape[out_axis], -1)
    pos, neg = np.clip(wc, 0, None).sum(axis=1), np.clip(wc, None, 0).sum(axis=1)
    lo, hi = (-128, 127) if x.signed else (0, 255)
    raw_lo, raw_hi = pos * lo + neg * hi, pos * hi + neg * lo
    shift = bias - x.residual_zp * wc.sum(axis=1)
    bounds = np.abs(np.stack([raw_lo, raw_hi, raw_lo + shift, raw_hi + shift]))
    return np.asarray(bounds.max(axis=0), np.float64)


def _weight_initializer(state: GraphState, dq_out: str, w: np.ndarray) -> str:
    name = state.unique(f"{dq_out}_int8") if dq_out.endswith("_Output") else dq_out
    state.set_const(name, w.astype(np.int8))
    return name


def _integer_add(
    state: GraphState,
    node: onnx.NodeProto,
    ins: list[str],
    out: str,
    out_act: Activation,
    shapes: Mapping[str, list[int]] | None = None,
) -> list[onnx.NodeProto]:
    acts = [state.acts.get(t) for t in ins[:2]]
    if len(ins) != 2 or acts[0] is None or acts[1] is None:
        raise TargetError(f"{_label(node)}: Add needs two quantized activations (a constant operand is unsupported)")
    ratios = np.array([a.scale / out_act.scale for a in acts if a is not None])
    # Both terms are scaled exactly (div=1) to a grid 2^k finer than the output; the sum of two int8·mul
    # products plus the output's add must stay inside int32.
    k = 30
    while k > 0 and (ratios.max() * 2.0**k * 256 * 2 + (abs(out_act.residual_zp) + 1) * 2.0**k >= _INT32_LIMIT):
        k -= 1
    muls = np.rint(ratios * 2.0**k).astype(np.int64)
    if muls.min() < 1:
        raise TargetError(f"{_label(node)}: input/output scale ratio {float(ratios.min()):.3g} is too small")
    err = float(np.max(np.abs(muls / 2.0**k - ratios) / ratios))
    nodes: list[onnx.NodeProto] = []
    scaled: list[str] = []
    known = shapes or {}
    for i, (t0, a, mul) in enumerate(zip(ins, acts, muls, strict=True)):
        assert a is not None
        t = _broadcast(state, t0, known.get(node.input[i]), known.get(node.output[0]), nodes, f"{t0}_to_{out}")
        dst = state.unique(f"{t}_to_{out}_grid")
        mn, an = state.unique(f"{dst}_mul"), state.unique(f"{dst}_add")
        state.set_const(mn, np.array(mul, np.int32))
        state.set_const(an, np.array(-mul * a.residual_zp, np.int32))
        nodes.append(_rqs(t, mn, an, dst, state.unique(f"{dst}_RequantShift"), 1, 2**32, True))
        scaled.append(dst)
    acc = state.unique(f"{node.output[0]}_acc")
    nodes.append(_node("Add", scaled, [acc], node.name))
    one = np.ones((), np.int64)
    nodes.append(_requant_node(state, acc, out, one, np.array(out_act.residual_zp * 2**k), k, out_act, ()))
    state.requant_errors[nodes[-1].name] = err
    return nodes


def _broadcast(
    state: GraphState,
    t: str,
    shape: list[int] | None,
    want: list[int] | None,
    nodes: list[onnx.NodeProto],
    tag: str,
) -> str:
    """``t`` expanded to the Add's output shape by Concats of itself (exact), when ONNX broadcasting would do it:
    Deeploy 0.2.1's Generic Add (and Mul) make both operands the same shape, so a broadcast operand (MiniLM's
    ``[1, 1, 1, S]`` attention-mask bias on ``[1, H, S, S]`` scores) gets the small buffer and the Add writes
    past it. Each Concat reads a tensor and an identity RequantShift copy of it, never one tensor twice."""
    if shape is None or want is None or list(shape) == list(want) or len(shape) != len(want):
        return t
    act = state.acts[t]
    cur, cur_shape = t, list(shape)
    for axis in range(len(want)):
        if cur_shape[axis] == want[axis]:
            continue
        cur = _repeat(state, cur, (tag, axis), int(want[axis]), act, nodes)
        cur_shape[axis] = int(want[axis])
    return cur


def _repeat(
    state: GraphState, t: str, where: tuple[str, int], n: int, act: Activation, nodes: list[onnx.NodeProto]
) -> str:
    """``t`` (size 1 on ``axis``) repeated ``n`` times along it: doubling, plus one more copy for an odd count.

    Every Concat reads two identity-RequantShift copies (floor((2x − 1 + 1) / 2) = x; add −1: Deeploy drops a
    "unity" RequantShift): Deeploy's Generic Concat declares ``char* <input>_tf`` in the function's scope, so a
    Concat reading another Concat's output redeclares it, and a Concat reading one tensor twice fails its
    TransposeSplitPass. ``where``: (a name unique to this Add operand, the axis)."""
    tag, axis = where

    def copy(src: str) -> str:
        # unique() sees only the graph so far, not these new nodes: the node count keeps the names apart
        name = state.unique(f"{tag}_bcopy{axis}_{len(nodes)}")
        state.acts[name] = act
        nodes.append(_requant_node(state, src, name, np.array([2]), np.array(-1), 1, act, ()))
        return name

    def cat(a: str, b: str) -> str:
        name = state.unique(f"{tag}_bcast{axis}_{len(nodes)}")
        state.acts[name] = act
        nodes.append(_node("Concat", [a, b], [name], state.unique(f"{name}_Concat"), axis=axis))
        return name

    if n == 1:
        return t
    half = _repeat(state, t, where, n // 2, act, nodes)
    cur = cat(copy(half), copy(half))
    return cat(copy(cur), copy(t)) if n % 2 else cur
