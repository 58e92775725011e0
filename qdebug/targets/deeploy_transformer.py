"""Transformer ops in Deeploy's integer network: the integer forms Deeploy 0.2.1 implements, and their semantics.

:mod:`qdebug.targets.deeploy_export` calls these handlers from its ``fold_dequant_quant_to_requantshift`` pass.
Each turns one quantized float op (or, for GELU, the Div→Erf→Add→Mul→Mul chain PyTorch exports) into the
Deeploy node(s) of the same meaning, and :func:`evaluate_node` computes those nodes the way Deeploy's Generic
kernels define them (integer arithmetic, C truncation and wrap-around included), so the export's own
bit-exactness check measures what the generated code computes. docs/deeploy.md, "Transformer ops", lists every
emitted node, its attributes and its arithmetic.

Exact forms (to the int32 precision of a RequantShift multiplier): Transpose/Reshape/Concat (same scale), MatMul
of two activations, Mul/Div by a scalar constant, Add of a constant, ReduceMean (a MatMul with ones).
Approximations defined by Deeploy's kernels (I-BERT style): ``iLayerNorm``, ``iSoftmax``, ``RequantizediGELU``.

Deeploy's integer MatMul and GELU have no input zero point: :func:`zero_centre_operands` requantizes the QDQ
model's operands of those ops to zero point 0 beforehand (a change of the QDQ model, like scale snapping).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qdebug.errors import TargetError
from qdebug.graph_index import GraphIndex
from qdebug.model_io import is_dq, is_q
from qdebug.targets.deeploy_graph import Activation, GraphState
from qdebug.targets.deeploy_rq import _choose_requant, _requant_node, _rqs

__all__ = [
    "TRANSFORMER_OPS",
    "evaluate_node",
    "gelu_chains",
    "int8_operands",
    "integer_transformer_node",
    "zero_centre_operands",
]

#: Float ops this module gives an integer form (Erf/Mul/Div/Add only inside the patterns below).
TRANSFORMER_OPS = frozenset(
    {"LayerNormalization", "Softmax", "Erf", "Tanh", "Pow", "Gelu", "Mul", "Div", "Transpose", "Concat", "ReduceMean"}
)
#: Ops exported only as members of a GELU chain (:func:`gelu_chains`).
GELU_ONLY_OPS = frozenset({"Erf", "Tanh", "Pow"})
#: Shape-only ops whose Q repeats the input's quantization.
SHAPE_OPS = frozenset({"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze"})
_INT32 = 2**31
# I-BERT's second-order approximations (Kim et al., 2021), as Deeploy's kernels evaluate them.
_ERF_A, _ERF_B = 0.2888, 1.769  # erf(t) ≈ sign(t)·(−a·(min(|t|, b) − b)² + 1)
_EXP_A, _EXP_B, _EXP_C = 0.3585, 1.353, 0.344  # exp(p) ≈ a·(p + b)² + c on (−ln 2, 0]
_SOFTMAX_K = 2**22  # common scale of the iSoftmax polynomial: y·255 and Σy stay inside uint32


# --------------------------------------------------------------------------- QDQ-model preparation


def _qparam_values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def _shape_components(ix: GraphIndex) -> dict[str, str]:
    """Quantized tensor (a Q output) → the root of its group: tensors joined by shape-only ops share one
    quantization, so a change of one must move them all."""
    parent: dict[str, str] = {}

    def find(t: str) -> str:
        while parent.get(t, t) != t:
            t = parent[t]
        return t

    for node in ix.nodes:
        if node.op_type not in SHAPE_OPS or not node.input:
            continue
        dq = ix.producer.get(node.input[0])
        users = ix.consumers_of(node.output[0])
        if dq is None or not is_dq(dq) or len(users) != 1 or not is_q(users[0]):
            continue
        a, b = find(dq.input[0]), find(users[0].output[0])
        if a != b:
            parent[b] = a
    return {t: find(t) for t in parent} | {v: find(v) for v in parent.values()}


#: The finest GELU input scale RequantizediGELU can take: its ``b = −round(1.769·√2 / s)`` is an int8.
GELU_MIN_SCALE = _ERF_B * math.sqrt(2) / 128


def _needs_zero_centre(ix: GraphIndex, consts: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Q outputs that feed a MatMul of two activations or a GELU (Deeploy's kernels take no zero point), each
    with the smallest scale it may have (GELU_MIN_SCALE for a GELU input, else 0)."""
    want: dict[str, float] = {}

    def act_source(t: str) -> str | None:
        dq = ix.producer.get(t)
        if dq is not None and is_dq(dq) and dq.input[0] not in consts:
            return str(dq.input[0])
        return None

    for node in ix.nodes:
        if node.op_type == "MatMul":
            srcs = [act_source(t) for t in node.input[:2]]
            if all(srcs):
                want.update({s: want.get(s, 0.0) for s in srcs if s})
        elif node.op_type in ("Erf", "Gelu", "Tanh"):
            chain = (
                None
                if node.op_type == "Gelu"
                else (_erf_gelu if node.op_type == "Erf" else _tanh_gelu)(ix, node, consts)
            )
            x = node.input[0] if node.op_type == "Gelu" else chain[2] if chain is not None else None
            src = act_source(x) if x is not None else None
            if src:
                want[src] = GELU_MIN_SCALE
    return want


def zero_centre_operands(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of the QDQ ``model`` in which every operand of a MatMul of two activations and every GELU input
    is quantized with zero point 0 (or −128, stored shifted, for a non-negative tensor); and what changed. A GELU
    input finer than :data:`GELU_MIN_SCALE` (0.0195) is coarsened to it, the finest scale RequantizediGELU takes.

    Why: Deeploy's integer MatMul multiplies the stored integers (plus a fixed 128 offset for unsigned
    buffers) and its GELU takes the sign of the stored integer, so a zero point in between cannot be folded
    (for a weight it goes into the bias; for two activations it would need row and column sums). The new
    symmetric scale covers the calibrated range: ``s' = max(|s·(−128 − zp)|, |s·(127 − zp)|) / 127``. Tensors
    joined by Reshape/Transpose share the change. The input model is not modified.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    ix = GraphIndex(out)
    consts = _qparam_values(out)
    consts.update({k: ix.value(k) for k in ix.consts})
    groups = _shape_components(ix)
    targets = _needs_zero_centre(ix, consts)
    roots: dict[str, tuple[float, int, int]] = {}
    for t, least in targets.items():
        q = ix.producer.get(t)
        if q is None or not is_q(q):
            continue
        scale = float(np.asarray(consts[q.input[1]]).reshape(-1)[0])
        zp = int(np.asarray(consts[q.input[2]]).reshape(-1)[0]) if len(q.input) > 2 else 0
        if zp in (0, -128) and scale >= least:
            continue
        # A non-negative tensor (zero point −128) is stored shifted and keeps its zero point.
        new = max(abs(scale * (-128 - zp)), abs(scale * (127 - zp))) / 127.0 if zp != -128 else scale
        roots[groups.get(t, t)] = (max(new, least), zp, -128 if zp == -128 else 0)
    changed: list[str] = []
    for root, (new_scale, zp, new_zp) in sorted(roots.items()):
        s_name, z_name = f"{root}_zero_centred_scale", f"{root}_zero_centred_zero_point"
        out.graph.initializer.extend(
            [
                numpy_helper.from_array(np.array(new_scale, np.float32), s_name),
                numpy_helper.from_array(np.array(new_zp, np.int8), z_name),
            ]
        )
        members = {t for t, r in groups.items() if r == root} | {root}
        for node in out.graph.node:
            tensor = node.output[0] if is_q(node) else node.input[0] if is_dq(node) else None
            if tensor in members:
                node.input[1] = s_name
                if len(node.input) > 2:
                    node.input[2] = z_name
                else:
                    node.input.append(z_name)
        changed.append(f"{root}: zero point {zp} → {new_zp}, scale → {new_scale:.6g}")
    return out, changed


# --------------------------------------------------------------------------- GELU pattern


def _after_qdq(ix: GraphIndex, node: onnx.NodeProto) -> onnx.NodeProto | None:
    """The one op that reads ``node``'s output through a Q → DQ pair, else None."""
    users = ix.consumers_of(node.output[0])
    if len(users) != 1 or not is_q(users[0]):
        return None
    dqs = ix.consumers_of(users[0].output[0])
    ops = [c for d in dqs if is_dq(d) for c in ix.consumers_of(d.output[0])]
    return ops[0] if len(ops) == 1 else None


def _const_value(ix: GraphIndex, t: str, consts: Mapping[str, np.ndarray]) -> float | None:
    """The real scalar behind ``t`` (a DQ of a constant, or a float constant), else None."""
    p = ix.producer.get(t)
    if p is not None and is_dq(p) and p.input[0] in consts:
        q = np.asarray(consts[p.input[0]], np.float64)
        s = float(np.asarray(consts[p.input[1]]).reshape(-1)[0])
        z = float(np.asarray(consts[p.input[2]]).reshape(-1)[0]) if len(p.input) > 2 else 0.0
        v = s * (q - z)
    elif t in consts:
        v = np.asarray(consts[t], np.float64)
    else:
        return None
    return float(v.reshape(-1)[0]) if v.size == 1 else None


def _gelu_head(ix: GraphIndex, erf: onnx.NodeProto, consts: Mapping[str, np.ndarray]) -> onnx.NodeProto | None:
    """The Div(x, √2) in front of an Erf (through Q/DQ), else None."""
    dq = ix.producer.get(erf.input[0])
    q = ix.producer.get(dq.input[0]) if dq is not None and is_dq(dq) else None
    div = ix.producer.get(q.input[0]) if q is not None and is_q(q) else None
    if div is None or div.op_type != "Div":
        return None
    c = _const_value(ix, div.input[1], consts)
    return div if c is not None and abs(c - math.sqrt(2)) < 2e-2 else None


def gelu_chains(ix: GraphIndex, consts: Mapping[str, np.ndarray]) -> dict[str, tuple[onnx.NodeProto, set[str], str]]:
    """PyTorch's GELU written out as ops with Q/DQ between them: the exact form ``Mul(Mul(x, Add(Erf(Div(x, √2)),
    1)), 0.5)`` and the tanh form (:func:`_tanh_gelu`). Head (the chain's first node in graph order) name → (the
    last Mul, names of every node of the chain, the DQ output that feeds x)."""
    out: dict[str, tuple[onnx.NodeProto, set[str], str]] = {}
    order = {n.name: i for i, n in enumerate(ix.nodes)}
    for erf in ix.nodes:
        found = _erf_gelu(ix, erf, consts) if erf.op_type == "Erf" else None
        if erf.op_type == "Tanh":
            found = _tanh_gelu(ix, erf, consts)
        if found is not None:
            half, members, x = found
            out[min(members, key=order.__getitem__)] = (half, members, x)
    return out


def _near(v: float | None, want: float, rel: float = 2e-2) -> bool:
    return v is not None and abs(v - want) <= rel * abs(want)


def _has_const(ix: GraphIndex, node: onnx.NodeProto, consts: Mapping[str, np.ndarray], want: float) -> str | None:
    """The other input of a two-input ``node`` one of whose inputs is the constant ``want``, else None."""
    vals = [_const_value(ix, t, consts) for t in node.input]
    hit = [i for i, v in enumerate(vals) if _near(v, want)]
    return str(node.input[1 - hit[0]]) if len(node.input) == 2 and hit else None


def _tail(
    ix: GraphIndex, head: onnx.NodeProto, consts: Mapping[str, np.ndarray], x_src: str
) -> list[onnx.NodeProto] | None:
    """The shared end of both GELU forms after Erf/Tanh: ``Mul(Mul(x, Add(·, 1)), 0.5)`` (through Q/DQ)."""
    add = _after_qdq(ix, head)
    mul = _after_qdq(ix, add) if add is not None and add.op_type == "Add" else None
    half = _after_qdq(ix, mul) if mul is not None and mul.op_type == "Mul" else None
    if add is None or mul is None or half is None or half.op_type != "Mul" or _has_const(ix, add, consts, 1.0) is None:
        return None
    if x_src not in {_dq_source(ix, t) for t in mul.input} or _has_const(ix, half, consts, 0.5) is None:
        return None
    return [add, mul, half]


def _dq_source(ix: GraphIndex, t: str) -> str | None:
    """The quantized tensor (a Q output) behind the DQ output ``t``."""
    dq = ix.producer.get(t)
    return str(dq.input[0]) if dq is not None and is_dq(dq) else None


def _op_before(ix: GraphIndex, t: str) -> onnx.NodeProto | None:
    """The op whose output reaches ``t`` through one Q → DQ pair."""
    src = _dq_source(ix, t)
    q = ix.producer.get(src) if src is not None else None
    return ix.producer.get(q.input[0]) if q is not None and is_q(q) else None


def _erf_gelu(
    ix: GraphIndex, erf: onnx.NodeProto, consts: Mapping[str, np.ndarray]
) -> tuple[onnx.NodeProto, set[str], str] | None:
    div = _gelu_head(ix, erf, consts)
    x_src = _dq_source(ix, div.input[0]) if div is not None else None
    tail = _tail(ix, erf, consts, x_src) if div is not None and x_src is not None else None
    if div is None or tail is None:
        return None
    return tail[-1], {div.name, erf.name, *(n.name for n in tail)}, str(div.input[0])


def _cube_of(
    ix: GraphIndex, node: onnx.NodeProto | None, consts: Mapping[str, np.ndarray]
) -> tuple[str, set[str]] | None:
    """``x³`` as ``Pow(x, 3)``, ``Mul(x, Mul(x, x))`` or ``Mul(Mul(x, x), x)`` (Q/DQ between): (x's quantized
    source, the nodes)."""
    if node is None:
        return None
    if node.op_type == "Pow" and _near(_const_value(ix, node.input[1], consts), 3.0, 1e-6):
        src = _dq_source(ix, node.input[0])
        return (src, {node.name}) if src else None
    if node.op_type != "Mul" or len(node.input) != 2:
        return None
    for i in (0, 1):
        sq = _op_before(ix, node.input[1 - i])
        src = _dq_source(ix, node.input[i])
        if sq is not None and sq.op_type == "Mul" and src and {_dq_source(ix, t) for t in sq.input} == {src}:
            return src, {node.name, sq.name}
    return None


def _tanh_gelu(
    ix: GraphIndex, tanh: onnx.NodeProto, consts: Mapping[str, np.ndarray]
) -> tuple[onnx.NodeProto, set[str], str] | None:
    """``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`` as PyTorch's ``gelu(approximate="tanh")`` exports it
    (any operand order, ``Pow(x, 3)`` or two Muls for the cube), Q/DQ between the ops."""
    beta = _op_before(ix, tanh.input[0])
    inner = _has_const(ix, beta, consts, math.sqrt(2 / math.pi)) if beta is not None and beta.op_type == "Mul" else None
    add = _op_before(ix, inner) if inner is not None else None
    if add is None or add.op_type != "Add" or len(add.input) != 2:
        return None
    for i in (0, 1):
        x_src, kmul = _dq_source(ix, add.input[i]), _op_before(ix, add.input[1 - i])
        cubed = _has_const(ix, kmul, consts, 0.044715) if kmul is not None and kmul.op_type == "Mul" else None
        cube = _cube_of(ix, _op_before(ix, cubed), consts) if cubed is not None else None
        if x_src is None or cube is None or cube[0] != x_src:
            continue
        tail = _tail(ix, tanh, consts, x_src)
        if tail is not None and beta is not None and kmul is not None:  # (both are, once cube was found)
            members = {beta.name, add.name, kmul.name, tanh.name, *cube[1], *(n.name for n in tail)}
            return tail[-1], members, str(add.input[i])
    return None


# --------------------------------------------------------------------------- export handlers


def _channel_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """Shape of a RequantShift's uniform mul/add: a scalar. Deeploy broadcasts it to what each platform's kernel
    indexes (Generic's RequantShift: ``shape[:2]``; Siracusa's RequantizedGemm after a MatMul: the output
    channels), where any fixed-length vector fails on one of them."""
    del shape
    return ()


def _uniform_requant(
    state: GraphState,
    src: str,
    dst: str,
    m: float,
    acc_max: float,
    in_zp_term: float,
    out: Activation,
    shape: Sequence[int],
) -> onnx.NodeProto:
    """RequantShift ``dst = round(m·(acc − in_zp_term)) + zp_out`` with one multiplier for every element."""
    if m <= 0:
        raise TargetError(f"{dst!r}: a negative or zero requantization factor {m:.3g} is not supported")
    mul, k = _choose_requant(np.array([m]), acc_max + abs(in_zp_term), out.residual_zp)
    add = out.residual_zp * 2**k - int(mul[0]) * round(in_zp_term)
    rq: onnx.NodeProto = _requant_node(state, src, dst, mul, np.array(add), k, out, _channel_shape(shape))
    state.requant_errors[rq.name] = float(abs(mul[0] / 2.0**k - m) / m)
    return rq


def _act(state: GraphState, node: onnx.NodeProto, t: str) -> Activation:
    a = state.acts.get(t)
    if a is None:
        raise TargetError(f"{node.op_type} node {node.name!r}: input {t!r} is not a quantized activation")
    return a


def int8_operands(
    state: GraphState, node: onnx.NodeProto, ins: list[str], shapes: Any
) -> tuple[list[onnx.NodeProto], list[str]]:
    """PULPOpen's MatMul takes int8 × int8 only (``state.int8_matmul``): every uint8 activation operand of the
    MatMul ``node`` (a shifted tensor: a non-negative input, a Softmax output) is first re-encoded to int8 by the
    exact zero-point shift ``q = u − 128`` (``RequantShift(u, 2, −256, div 2)``); the tensor then has zero point
    −128 in int8, which the MatMul folds (a weight's column sums, :func:`_integer_matmul_acts`'s ones block).
    Returns the re-encoding nodes and the inputs to use."""
    if not state.int8_matmul or node.op_type != "MatMul":
        return [], ins
    nodes: list[onnx.NodeProto] = []
    new = list(ins)
    for i, t in enumerate(ins[:2]):
        act = state.acts.get(t)
        if act is not None and not act.signed:
            rq, new[i] = _reencode_int8(state, t)
            shapes[new[i]] = shapes[node.input[i]]
            nodes += rq
    return nodes, new


def _reencode_int8(state: GraphState, t: str) -> tuple[list[onnx.NodeProto], str]:
    """``q = u − 128``: the shifted uint8 tensor ``t`` as int8 with zero point −128 (exact: ``floor((2u − 256 +
    1) / 2)``; div 2 rather than 1 because Deeploy's fused kernels add ``2^(shift−1)``). Once per tensor: a
    second reader reuses it (no node)."""
    act = state.acts[t]
    dst = state.unique(f"{t}_int8")  # the graph is rebuilt at the end of the pass: a re-encoding made for an
    if dst in state.acts:  # earlier reader is not in it yet, but its encoding is known
        return [], dst
    state.acts[dst] = type(act)(act.scale, act.zero_point, 0)
    return [_requant_node(state, t, dst, np.array([2]), np.array(-256), 1, state.acts[dst], ())], dst


def _ones_block_matmul(
    state: GraphState, node: onnx.NodeProto, ins: list[str], acc: str, shapes: Any
) -> list[onnx.NodeProto]:
    """``Σ_k u_k·b_kj`` for an operand ``u = q + 128`` re-encoded to int8 ``q`` (PULPOpen): one MatMul over the
    contraction extended by a constant block, ``[q | 64·1 | 64·1] × [b; b; b]`` = ``Σ q·b + 128·Σ b``, exact in
    int8 × int8 (128 itself is no int8). Costs 3× the MACs of the plain MatMul; no Add of int32 tensors, which
    PULPOpen's Add → RequantShift fusion (RequantizedAdd) would need in int8."""
    a_shape = list(shapes[node.input[0]])
    rank, n = len(a_shape), a_shape[-1]
    ones, wide, bb, bbb = (state.unique(f"{acc}_{p}") for p in ("ones64", "a_wide", "b2", "b3"))
    state.set_const(ones, np.full([*a_shape[:-1], 2 * n], 64, np.int8))
    copies = [state.unique(f"{acc}_b_copy{i}") for i in (1, 2)]  # unique() sees only the graph so far
    for t in (wide, *copies, bb, bbb):
        state.acts[t] = state.acts[ins[0] if t == wide else ins[1]]
    # b is copied by identity RequantShifts (add −1, not 0: Deeploy drops a "unity" one after a Transpose) so
    # that every tensor here has one reader, once: Deeploy's TransposeSplitPass fails on Concat(t, t) of a
    # Transpose, and its RQSSplitPass shares one constant between the copies of a RequantShift read twice.
    dups = [_requant_node(state, ins[1], c, np.array([2]), np.array(-1), 1, state.acts[c], ()) for c in copies]
    return [
        helper.make_node("Concat", [ins[0], ones], [wide], name=state.unique(f"{node.name}_ones"), axis=rank - 1),
        *dups,
        helper.make_node("Concat", [ins[1], copies[0]], [bb], name=state.unique(f"{node.name}_b2"), axis=rank - 2),
        helper.make_node("Concat", [copies[1], bb], [bbb], name=state.unique(f"{node.name}_b3"), axis=rank - 2),
        helper.make_node("MatMul", [wide, bbb], [acc], name=node.name),
    ]


def _integer_matmul_acts(
    state: GraphState, node: onnx.NodeProto, ins: list[str], out: str, out_act: Activation, shapes: Any
) -> list[onnx.NodeProto]:
    pre, ins = int8_operands(state, node, ins, shapes)
    a, b = (_act(state, node, t) for t in ins[:2])
    shifted = state.int8_matmul and a.residual_zp == -128 and a.zero_point == -128 and not b.residual_zp
    for t, act in [(ins[1], b)] if shifted else [(ins[0], a), (ins[1], b)]:
        if act.residual_zp:
            raise TargetError(
                f"MatMul node {node.name!r}: operand {t!r} has zero point {act.zero_point}; Deeploy's MatMul of two "
                "activations needs zero point 0 (build/recompile zero-centre it: zero_centre_operands)"
            )
    n = shapes[node.input[0]][-1]
    acc = state.unique(f"{out}_acc")
    mm = [helper.make_node("MatMul", ins[:2], [acc], name=node.name)]
    if shifted:
        mm = _ones_block_matmul(state, node, ins, acc, shapes)
    rq = _uniform_requant(state, acc, out, a.scale * b.scale / out_act.scale, n * 255.0 * 128, 0, out_act,
                          shapes[node.output[0]])  # fmt: skip
    return [*pre, *mm, rq]


def _const_real(state: GraphState, t: str) -> np.ndarray | None:
    if t in state.constants:
        return state.constants[t]
    if t in state.weights:
        q, s = state.weights[t]
        return np.asarray(q, np.float64) * np.asarray(s, np.float64)
    for init in state.graph.initializer:  # a float constant the quantizer left unquantized (a LayerNorm bias)
        if init.name == t:
            return np.asarray(numpy_helper.to_array(init), np.float64)
    return None


def _integer_scale_by_const(
    state: GraphState, node: onnx.NodeProto, ins: list[str], out: str, out_act: Activation, shapes: Any
) -> list[onnx.NodeProto]:
    """Mul/Div by a scalar constant: one RequantShift with ``M = s_x·c / s_out``."""
    xi = 0 if ins[0] in state.acts else 1
    c = _const_real(state, ins[1 - xi])
    if c is None or c.size != 1 or (node.op_type == "Div" and xi != 0):
        raise TargetError(
            f"{node.op_type} node {node.name!r}: only an activation times/over a scalar constant is supported"
        )
    c_val = float(c.reshape(-1)[0])
    c_val = 1.0 / c_val if node.op_type == "Div" else c_val
    x = state.acts[ins[xi]]
    m = x.scale * c_val / out_act.scale
    return [_uniform_requant(state, ins[xi], out, m, 256.0, x.residual_zp, out_act, shapes[node.output[0]])]


def _integer_add_const(
    state: GraphState, node: onnx.NodeProto, ins: list[str], out: str, out_act: Activation, shapes: Any
) -> list[onnx.NodeProto]:
    """Add of a constant (a bias, a position embedding): one RequantShift whose ``add`` carries the constant per
    element. Deeploy's RequantShift indexes its constants by ``i / prod(shape[2:])``, so the tensor is viewed as
    ``[1, N]`` around it (two Reshapes, free in Deeploy)."""
    xi = 0 if ins[0] in state.acts else 1
    c = _const_real(state, ins[1 - xi])
    x = state.acts[ins[xi]]
    shape = list(shapes[node.output[0]])
    size = int(np.prod(shape))
    cb = np.broadcast_to(np.asarray(c, np.float64), shape).reshape(-1) / out_act.scale
    m = x.scale / out_act.scale
    acc_max = 256.0 + abs(x.residual_zp) + float(np.abs(cb).max()) / m
    mul, k = _choose_requant(np.array([m]), acc_max, out_act.residual_zp)
    mul_i = int(mul[0])
    add = np.rint(cb * 2.0**k).astype(np.int64) + out_act.residual_zp * 2**k - mul_i * x.residual_zp
    flat_in, flat_out = state.unique(f"{out}_flat_in"), state.unique(f"{out}_flat")
    s_flat, s_back = state.unique(f"{out}_shape_flat"), state.unique(f"{out}_shape")
    state.set_const(s_flat, np.array([1, size], np.int64))
    state.set_const(s_back, np.array(shape, np.int64))
    state.acts[flat_in] = x
    state.acts[flat_out] = out_act
    mul_name, add_name = state.unique(f"{out}_rq_mul"), state.unique(f"{out}_rq_add")
    # 1-D constants: Deeploy's RequantShift layer reshapes mul/add to [batch, channels] + shape[1:], so a [1, N]
    # constant on a [1, N] input would become [1, N, N] (2.4 GB of copies for MiniLM's N = 12,288)
    state.set_const(mul_name, np.full((size,), mul_i, np.int32))
    state.set_const(add_name, add.reshape(size).astype(np.int32))
    rq = _rqs(flat_in, mul_name, add_name, flat_out, state.unique(f"{out}_RequantShift"), 2**k, 256, out_act.signed)
    state.requant_errors[rq.name] = float(abs(mul_i / 2.0**k - m) / m)
    return [
        helper.make_node("Reshape", [ins[xi], s_flat], [flat_in], name=state.unique(f"{node.name}_flatten")),
        rq,
        helper.make_node("Reshape", [flat_out, s_back], [out], name=node.name),
    ]


def _integer_layernorm(
    state: GraphState, node: onnx.NodeProto, ins: list[str], out: str, out_act: Activation, shapes: Any
) -> list[onnx.NodeProto]:
    """LayerNormalization → Deeploy ``iLayerNorm(x, weight, bias)`` (int32 weight/bias, attributes D = 2^L and
    n_levels): ``y = wrap8((((x − mean)·w) / std + b) >> L)`` with integer mean/std (see :func:`_ilayernorm`)."""
    x = _act(state, node, ins[0])
    a = {at.name: helper.get_attribute_value(at) for at in node.attribute}
    rank = len(shapes[node.input[0]])
    if int(a.get("axis", -1)) not in (-1, rank - 1):
        raise TargetError(f"LayerNormalization node {node.name!r}: only the last axis is supported")
    if not out_act.signed:
        raise TargetError(f"LayerNormalization node {node.name!r}: its output must be int8 (zero point ≠ −128)")
    d = shapes[node.input[0]][-1]
    gamma = _const_real(state, ins[1])
    beta = _const_real(state, ins[2]) if len(ins) > 2 and ins[2] else np.zeros(d)
    if gamma is None or beta is None:
        raise TargetError(f"LayerNormalization node {node.name!r}: scale and bias must be constants")
    g = np.broadcast_to(gamma.reshape(-1), (d,)) / out_act.scale
    b = np.broadcast_to(beta.reshape(-1), (d,)) / out_act.scale + out_act.residual_zp
    big = max(float(np.abs(g).max()) * 256, float(np.abs(b).max()) + 1)
    shift = max(1, min(24, math.floor(math.log2((_INT32 - 1) / big))))
    if state.layernorm == "iRMSNorm":
        return _layernorm_as_rmsnorm(state, node, ins[0], out, out_act, g, beta, shapes)
    w_name, b_name = state.unique(f"{out}_ln_weight"), state.unique(f"{out}_ln_bias")
    state.set_const(w_name, np.rint(g * 2.0**shift).astype(np.int32))
    # + 2^(L-1): the kernel's ">> L" floors; this makes it round half up.
    state.set_const(b_name, (np.rint(b * 2.0**shift) + 2 ** (shift - 1)).astype(np.int32))
    ln = helper.make_node("iLayerNorm", [ins[0], w_name, b_name], [out], name=node.name)
    _tensor_attrs(ln, D=2.0**shift, n_levels=256.0)
    del x
    return [ln]


def _layernorm_as_rmsnorm(
    state: GraphState,
    node: onnx.NodeProto,
    x_name: str,
    out: str,
    out_act: Activation,
    g: np.ndarray,
    beta: np.ndarray,
    shapes: Any,
) -> list[onnx.NodeProto]:
    """LayerNorm for platforms with ``iRMSNorm`` but no ``iLayerNorm`` (Siracusa): ``MatMul`` with the int8
    centring matrix ``D·I − 1`` (= D·(x − mean), exact) → ``RequantShift`` by 1/D (x − mean rounded to int8,
    clipped) → ``iRMSNorm`` with ``w = round(γ/s_out·2^L)`` → the bias β (and the zero point) added by the
    Add-of-a-constant RequantShift."""
    shape = list(shapes[node.input[0]])
    d = shape[-1]
    if d > 128:
        raise TargetError(f"LayerNormalization node {node.name!r}: the centring matrix needs D ≤ 128 (got {d})")
    x = _act(state, node, x_name)
    pre: list[onnx.NodeProto] = []
    if state.int8_matmul and not x.signed:  # the centring MatMul cancels the zero point −128 of q = u − 128
        pre, x_name = _reencode_int8(state, x_name)
        x = state.acts[x_name]
    centre, acc, xc, normed = (state.unique(f"{out}_{p}") for p in ("centre", "centred_acc", "centred", "normed"))
    state.set_const(centre, (d * np.eye(d) - 1).astype(np.int8))
    xc_act = type(x)(x.scale, 0, 0)
    state.acts[xc] = xc_act
    rq = _uniform_requant(state, acc, xc, 1.0 / d, 2.0 * d * 255, 0.0, xc_act, shape)
    mid = type(out_act)(out_act.scale, 0, 0)
    state.acts[normed] = mid
    shift = max(1, min(16, math.floor(math.log2((2**24 - 1) / max(float(np.abs(g).max()), 1e-9)))))
    w_name = state.unique(f"{out}_rms_weight")
    state.set_const(w_name, np.rint(g * 2.0**shift).astype(np.int32))
    rms = helper.make_node("iRMSNorm", [xc, w_name], [normed], name=node.name, D=float(2**shift), n_levels=256)
    bias_name = state.unique(f"{out}_ln_beta")
    state.constants[bias_name] = np.broadcast_to(np.asarray(beta, np.float64).reshape(-1), (d,)).copy()
    add = helper.make_node("Add", [normed, bias_name], [out], name=state.unique(f"{node.name}_beta"))
    shapes = {**shapes, add.output[0]: shape}
    return [
        *pre,
        helper.make_node("MatMul", [x_name, centre], [acc], name=state.unique(f"{node.name}_centre")),
        rq,
        rms,
        *_integer_add_const(state, add, [normed, bias_name], out, out_act, shapes),
    ]


def _tensor_attrs(node: onnx.NodeProto, **values: float) -> None:
    for key, val in values.items():
        node.attribute.append(helper.make_attribute(key, numpy_helper.from_array(np.array([val], np.float32), key)))


def _integer_softmax(
    state: GraphState, node: onnx.NodeProto, ins: list[str], out: str, out_act: Activation, shapes: Any
) -> list[onnx.NodeProto]:
    """Softmax → Deeploy ``iSoftmax`` (I-BERT's exp polynomial; attributes coeffA/B/C, log2, n_levels):
    output ``floor(255·y_i / Σy)`` on the 1/255 grid, stored as uint8 (see :func:`_isoftmax`)."""
    x = _act(state, node, ins[0])
    rank = len(shapes[node.input[0]])
    axis = int({at.name: helper.get_attribute_value(at) for at in node.attribute}.get("axis", -1))
    if axis not in (-1, rank - 1):
        raise TargetError(f"Softmax node {node.name!r}: only the last axis is supported")
    if out_act.zero_point != -128 or abs(out_act.scale * 255 - 1) > 1e-5:
        raise TargetError(
            f"Softmax node {node.name!r}: Deeploy's iSoftmax writes the 1/255 grid with zero point −128; the output "
            f"is quantized with scale {out_act.scale:.6g}, zero point {out_act.zero_point}"
        )
    if shapes[node.input[0]][-1] * _SOFTMAX_K >= 2**32:
        raise TargetError(f"Softmax node {node.name!r}: rows longer than {2**32 // _SOFTMAX_K} overflow iSoftmax's sum")
    s = x.scale
    sm = helper.make_node("iSoftmax", [ins[0]], [out], name=node.name)
    coeff_b = round(_EXP_B / s)
    coeff_a = max(1, round(_EXP_A * s * s * _SOFTMAX_K))
    if coeff_a * coeff_b * coeff_b >= _INT32:
        raise TargetError(
            f"Softmax node {node.name!r}: input scale {s:.3g} is too fine for iSoftmax's int32 polynomial"
        )
    _tensor_attrs(sm, coeffA=coeff_a, coeffB=coeff_b, coeffC=round(_EXP_C * _SOFTMAX_K),
                  log2=max(1, round(math.log(2) / s)), n_levels=256.0)  # fmt: skip
    return [sm]


def _integer_gelu(
    state: GraphState, node: onnx.NodeProto, x_name: str, out: str, out_act: Activation
) -> list[onnx.NodeProto]:
    """GELU → Deeploy ``RequantizediGELU(x, mul, add, shift)`` with attributes ``b`` (int8) and ``one`` (int16):
    I-BERT's erf polynomial, then one requantization (see :func:`_rqgelu`)."""
    x = _act(state, node, x_name)
    if x.residual_zp or not out_act.signed:
        raise TargetError(
            f"GELU at {node.name!r}: Deeploy's RequantizediGELU needs an input with zero point 0 and an int8 output "
            f"(input zero point {x.zero_point}, output zero point {out_act.zero_point})"
        )
    s = x.scale
    b = -round(_ERF_B * math.sqrt(2) / s)
    one = round(2.0 / (_ERF_A * s * s))
    if b < -128 or one > 32767:
        raise TargetError(
            f"GELU at {node.name!r}: input scale {s:.4g} is too fine for RequantizediGELU's int8 b / int16 one "
            "(needs a scale ≥ 0.0196)"
        )
    m = s * (_ERF_A * s * s / 2) / out_act.scale
    hi = 128 * 2 * one  # |x|·(one + L) / 2 with |L| ≤ one
    mul, k = _choose_requant(np.array([m]), float(hi), out_act.residual_zp)
    names = [state.unique(f"{out}_gelu_{p}") for p in ("mul", "add", "shift")]
    for n_, v in zip(names, (int(mul[0]), out_act.residual_zp * 2**k, k), strict=True):
        state.set_const(n_, np.array([v], np.int32))
    g = helper.make_node("RequantizediGELU", [x_name, *names], [out], name=node.name, b=int(b), one=int(one))
    state.requant_errors[g.name] = float(abs(mul[0] / 2.0**k - m) / m)
    return [g]


def _integer_reduce_mean(
    state: GraphState, node: onnx.NodeProto, ins: list[str], out: str, out_act: Activation, shapes: Any
) -> list[onnx.NodeProto]:
    """ReduceMean over one axis = Transpose (axis last) → MatMul with int8 ones → Reshape → RequantShift with
    ``M = s_x / (n·s_out)``: exact, like the GlobalAveragePool."""
    x = _act(state, node, ins[0])
    a = {at.name: helper.get_attribute_value(at) for at in node.attribute}
    shape = list(shapes[node.input[0]])
    axes = list(a.get("axes", []))
    if len(axes) != 1:
        raise TargetError(f"ReduceMean node {node.name!r}: only one axis (as an attribute) is supported")
    ax = axes[0] % len(shape)
    perm = [i for i in range(len(shape)) if i != ax] + [ax]
    n = shape[ax]
    t_name, ones, acc, acc_r = (state.unique(f"{out}_{p}") for p in ("moved", "ones", "sum", "sum_r"))
    s_name = state.unique(f"{out}_shape")
    state.acts[t_name] = x
    state.set_const(ones, np.ones((n, 1), np.int8))
    out_shape = list(shapes[node.output[0]])
    state.set_const(s_name, np.array(out_shape, np.int64))
    rq = _uniform_requant(state, acc_r, out, x.scale / (n * out_act.scale), n * 255.0, n * x.residual_zp, out_act,
                          out_shape)  # fmt: skip
    return [
        helper.make_node("Transpose", [ins[0]], [t_name], name=state.unique(f"{node.name}_move_axis"), perm=perm),
        helper.make_node("MatMul", [t_name, ones], [acc], name=state.unique(f"{node.name}_sum")),
        helper.make_node("Reshape", [acc, s_name], [acc_r], name=node.name),
        rq,
    ]


def _integer_concat(
    state: GraphState, node: onnx.NodeProto, ins: list[str], out: str, out_act: Activation, shapes: Any
) -> list[onnx.NodeProto]:
    """Concat on the integers; an input quantized differently from the output is first requantized to the
    output's grid (one RequantShift, ``M = s_in / s_out``)."""
    nodes: list[onnx.NodeProto] = []
    moved: list[str] = []
    done: dict[str, str] = {}  # an input listed twice is requantized once
    for t, orig in zip(ins, node.input, strict=True):
        a = _act(state, node, t)
        if (a.scale, a.zero_point, a.offset) == (out_act.scale, out_act.zero_point, out_act.offset) or t in done:
            moved.append(done.get(t, t))
            continue
        dst = done[t] = state.unique(f"{t}_to_{out}_grid")
        state.acts[dst] = out_act
        nodes.append(_uniform_requant(state, t, dst, a.scale / out_act.scale, 256.0, a.residual_zp, out_act,
                                      shapes[orig]))  # fmt: skip
        moved.append(dst)
    attrs = {at.name: helper.get_attribute_value(at) for at in node.attribute}
    return [*nodes, helper.make_node("Concat", moved, [out], name=node.name, **attrs)]


def integer_transformer_node(
    state: GraphState, node: onnx.NodeProto, ins: list[str], out: str, out_act: Activation, shapes: Any
) -> list[onnx.NodeProto] | None:
    """The integer form of one transformer op (None: not one of these)."""
    op = node.op_type
    if op == "MatMul" and all(t in state.acts for t in ins[:2]):
        return _integer_matmul_acts(state, node, ins, out, out_act, shapes)
    if op in ("Mul", "Div"):
        if all(t in state.acts for t in ins[:2]):
            raise TargetError(f"{op} node {node.name!r}: {op} of two activations is supported only inside a GELU")
        return _integer_scale_by_const(state, node, ins, out, out_act, shapes)
    if op == "Add" and any(t not in state.acts for t in ins[:2]):
        return _integer_add_const(state, node, ins, out, out_act, shapes)
    handlers = {"LayerNormalization": _integer_layernorm, "Softmax": _integer_softmax,
                "ReduceMean": _integer_reduce_mean, "Concat": _integer_concat}  # fmt: skip
    if op in handlers:
        return handlers[op](state, node, ins, out, out_act, shapes)
    if op == "Gelu":
        return _integer_gelu(state, node, ins[0], out, out_act)
    if op in ("Erf", "Tanh", "Pow"):
        raise TargetError(f"{op} node {node.name!r}: an {op} outside PyTorch's GELU patterns has no integer form")
    return None


def integer_gelu_chain(
    state: GraphState, head: onnx.NodeProto, x_name: str, out: str, out_act: Activation
) -> list[onnx.NodeProto]:
    """The integer form of a matched GELU chain (:func:`gelu_chains`), from its Div's input to its last Q."""
    return _integer_gelu(state, head, x_name, out, out_act)


# --------------------------------------------------------------------------- Deeploy's kernels, in numpy


def _c_div(a: np.ndarray, b: np.ndarray | int) -> np.ndarray:
    """C integer division (truncation toward zero)."""
    q = np.abs(a) // np.abs(b)
    return np.asarray(np.where((np.sign(a) * np.sign(b)) < 0, -q, q))


def _ilayernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray, log2d: int) -> np.ndarray:
    """Deeploy's Generic ``Layernorm_s8_s8`` on the stored integers of each last-axis row."""
    d = x.shape[-1]
    mean = _c_div(x.sum(axis=-1, keepdims=True), d)
    diff = x - mean
    var = (diff * diff).sum(axis=-1, keepdims=True) // d + 1
    std = np.vectorize(math.isqrt)(var).astype(np.int64)
    y = (_c_div(diff * w.reshape(-1), std) + b.reshape(-1)) >> log2d
    return np.asarray(((y + 128) % 256) - 128)  # the kernel's (int8) cast wraps


def _irmsnorm(x: np.ndarray, w: np.ndarray, log2d: int) -> np.ndarray:
    """Deeploy's Generic ``iRMSnorm_s8_s8``: ``clip((trunc(x·w / std)) >> L)``, ``std = floor(√(Σx²/D + 1))``."""
    d = x.shape[-1]
    std = np.vectorize(math.isqrt)((x * x).sum(axis=-1, keepdims=True) // d + 1).astype(np.int64)
    return np.asarray(np.clip(_c_div(x * w.reshape(-1), std) >> log2d, -128, 127))


def _isoftmax(x: np.ndarray, a: int, b: int, c: int, log2: int, n_levels: int) -> np.ndarray:
    """Deeploy's Generic ``Softmax_s8_s8`` on the last axis; returns the unsigned value ``out + n/2``."""
    xt = x - x.max(axis=-1, keepdims=True)
    z = np.clip((_c_div(-xt, log2) + 128) % 256 - 128, 0, 31)  # the kernel casts to int8 before clamping
    p = xt + z * log2
    y = ((a * (p + b) ** 2 + c) >> z) & 0xFFFFFFFF
    total = y.sum(axis=-1, keepdims=True) & 0xFFFFFFFF
    return np.asarray(((y * (n_levels - 1)) & 0xFFFFFFFF) // total)


def _rqgelu(x: np.ndarray, b: int, one: int, mul: int, add: int, shift: int) -> np.ndarray:
    """Deeploy's Generic ``RQGELU_s8_s8``: I-BERT erf, ``y = x·((one + L) >> 1)``, then round(y·mul/2^shift)."""
    sign = np.sign(x)
    q = np.minimum(np.abs(x), -b)
    big_l = sign * (one - (q + b) ** 2)
    y = x * ((one + big_l) >> 1)
    r = (y * mul + add + (1 << (shift - 1))) >> shift
    return np.asarray(np.clip(r, -128, 127))


def _attr_int(a: Any) -> int:
    return int(np.asarray(numpy_helper.to_array(a) if isinstance(a, onnx.TensorProto) else a).reshape(-1)[0])


def evaluate_node(node: onnx.NodeProto, x: list[np.ndarray], a: Mapping[str, Any]) -> np.ndarray | None:
    """One node of this module's integer forms, on int64 stored values; None if it is not one of them."""
    op = node.op_type
    if op == "Transpose":
        return np.transpose(x[0], a.get("perm"))
    if op == "Concat":
        return np.concatenate(x, axis=int(a["axis"]))
    if op == "iLayerNorm":
        return _ilayernorm(x[0], x[1], x[2], int(math.log2(_attr_int(a["D"]))))
    if op == "iRMSNorm":
        return _irmsnorm(x[0], x[1], int(math.log2(float(a["D"]))))
    if op == "iSoftmax":
        ks = ("coeffA", "coeffB", "coeffC", "log2", "n_levels")
        return _isoftmax(x[0], *(_attr_int(a[k]) for k in ks))
    if op == "RequantizediGELU":
        return _rqgelu(x[0], int(a["b"]), int(a["one"]), int(x[1][0]), int(x[2][0]), int(x[3][0]))
    return None
