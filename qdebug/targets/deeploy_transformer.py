"""Transformer ops in Deeploy's integer network: the integer forms Deeploy 0.2.1 implements, and their semantics.

:mod:`qdebug.targets.deeploy_fold` calls these handlers from the export's ``fold_dequant_quant_to_requantshift``
pass. Each turns one quantized float op (or, for GELU, the Div→Erf→Add→Mul→Mul chain PyTorch exports, found by
:mod:`qdebug.targets.deeploy_gelu`) into the Deeploy node(s) of the same meaning, and
:func:`qdebug.targets.deeploy_kernels.evaluate_node` computes those nodes the way Deeploy's Generic kernels define
them (integer arithmetic, C truncation and wrap-around included), so the export's own bit-exactness check measures
what the generated code computes. docs/deeploy.md, "Transformer ops", lists every
emitted node, its attributes and its arithmetic.

Exact forms (to the int32 precision of a RequantShift multiplier): Transpose/Reshape/Concat (same scale), MatMul
of two activations, Mul/Div by a scalar constant, Add of a constant, ReduceMean (a MatMul with ones).
Approximations defined by Deeploy's kernels (I-BERT style): ``iLayerNorm``, ``iSoftmax``, ``RequantizediGELU``.

Deeploy's integer MatMul and GELU have no input zero point:
:func:`qdebug.targets.deeploy_zero_centre.zero_centre_operands` requantizes the QDQ model's operands of those ops to
zero point 0 beforehand (a change of the QDQ model, like scale snapping).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qdebug.errors import TargetError
from qdebug.targets.deeploy_graph import Activation, GraphState
from qdebug.targets.deeploy_rq import _choose_requant, _requant_node, _rqs

__all__ = [
    "TRANSFORMER_OPS",
    "int8_operands",
    "integer_transformer_node",
]

#: Float ops this module gives an integer form (Erf/Mul/Div/Add only inside the patterns below).
TRANSFORMER_OPS = frozenset(
    {"LayerNormalization", "Softmax", "Erf", "Tanh", "Pow", "Gelu", "Mul", "Div", "Transpose", "Concat", "ReduceMean"}
)
#: Ops exported only as members of a GELU chain (:func:`qdebug.targets.deeploy_gelu.gelu_chains`).
GELU_ONLY_OPS = frozenset({"Erf", "Tanh", "Pow"})
_INT32 = 2**31
# I-BERT's second-order approximations (Kim et al., 2021), as Deeploy's kernels evaluate them.
_ERF_A, _ERF_B = 0.2888, 1.769  # erf(t) ≈ sign(t)·(−a·(min(|t|, b) − b)² + 1)
_EXP_A, _EXP_B, _EXP_C = 0.3585, 1.353, 0.344  # exp(p) ≈ a·(p + b)² + c on (−ln 2, 0]
_SOFTMAX_K = 2**22  # common scale of the iSoftmax polynomial: y·255 and Σy stay inside uint32


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
    if c is None or (node.op_type == "Div" and xi != 0) or (c.size != 1 and np.any(c == 0)):
        raise TargetError(f"{node.op_type} node {node.name!r}: only an activation times/over a constant is supported")
    if c.size != 1:
        return _integer_scale_by_vector(state, node, ins[xi], 1.0 / c if node.op_type == "Div" else c, out, out_act,
                                        shapes[node.output[0]])  # fmt: skip
    c_val = float(c.reshape(-1)[0])
    c_val = 1.0 / c_val if node.op_type == "Div" else c_val
    x = state.acts[ins[xi]]
    m = x.scale * c_val / out_act.scale
    return [_uniform_requant(state, ins[xi], out, m, 256.0, x.residual_zp, out_act, shapes[node.output[0]])]


def _integer_scale_by_vector(
    state: GraphState, node: onnx.NodeProto, x_name: str, c: np.ndarray, out: str, out_act: Activation, shape: Any
) -> list[onnx.NodeProto]:
    """Mul by a broadcast constant (a decomposed BatchNorm's scale): one RequantShift with a ``mul`` per element
    (negative where the constant is), on the ``[1, N]`` view of :func:`_integer_add_const`."""
    x = state.acts[x_name]
    shape = list(shape)
    m = np.broadcast_to(np.asarray(c, np.float64), shape).reshape(-1) * x.scale / out_act.scale
    worst = float(np.abs(m).max()) * (256.0 + abs(x.residual_zp)) + abs(out_act.residual_zp) + 1
    k = min(30, int(np.floor(np.log2((_INT32 - 1) / worst))))
    if k < 0:
        raise TargetError(f"{node.op_type} node {node.name!r}: its factor cannot be represented in int32")
    mul = np.rint(m * 2.0**k).astype(np.int64)
    add = out_act.residual_zp * 2**k - mul * x.residual_zp
    nodes = _flat_requant(state, x_name, out, out_act, shape, mul, add, k, node.name or out)
    state.requant_errors[nodes[1].name] = float(np.max(np.abs(mul / 2.0**k - m) / np.abs(m)))
    return nodes


def _flat_requant(
    state: GraphState,
    x_name: str,
    out: str,
    out_act: Activation,
    shape: list[int],
    mul: np.ndarray,
    add: np.ndarray,
    k: int,
    name: str,
) -> list[onnx.NodeProto]:
    """Reshape to ``[1, N]`` → RequantShift with per-element int32 ``mul``/``add`` (1-D, see
    :func:`_integer_add_const`) and shift ``2^k`` → Reshape back to ``shape``; ``name`` names the nodes."""
    size = int(np.prod(shape))
    flat_in, flat_out = state.unique(f"{out}_flat_in"), state.unique(f"{out}_flat")
    s_flat, s_back = state.unique(f"{out}_shape_flat"), state.unique(f"{out}_shape")
    state.set_const(s_flat, np.array([1, size], np.int64))
    state.set_const(s_back, np.array(shape, np.int64))
    state.acts[flat_in] = state.acts[x_name]
    state.acts[flat_out] = out_act
    mul_name, add_name = state.unique(f"{out}_rq_mul"), state.unique(f"{out}_rq_add")
    state.set_const(mul_name, mul.reshape(size).astype(np.int32))
    state.set_const(add_name, add.reshape(size).astype(np.int32))
    rq = _rqs(flat_in, mul_name, add_name, flat_out, state.unique(f"{out}_RequantShift"), 2**k, 256, out_act.signed)
    return [
        helper.make_node("Reshape", [x_name, s_flat], [flat_in], name=state.unique(f"{name}_flatten")),
        rq,
        helper.make_node("Reshape", [flat_out, s_back], [out], name=name),
    ]


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
    # 1-D constants: Deeploy's RequantShift layer reshapes mul/add to [batch, channels] + shape[1:], so a [1, N]
    # constant on a [1, N] input would become [1, N, N], quadratic in the sequence length
    nodes = _flat_requant(state, ins[xi], out, out_act, shape, np.full((size,), mul_i, np.int64), add, k, node.name)
    state.requant_errors[nodes[1].name] = float(abs(mul_i / 2.0**k - m) / m)
    return nodes


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
    output's grid (one RequantShift, ``M = s_in / s_out``); more than two inputs become a chain of two-input
    Concats (Deeploy's template takes two)."""
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
    # Deeploy's Concat template takes two inputs: a longer Concat becomes a chain of them, each part read through
    # a Reshape (free in Deeploy), since the template declares a C variable per input and output name.
    part_shape = list(shapes[node.input[0]])
    axis = int(attrs["axis"]) % len(part_shape)
    for orig in node.input[1:-1]:
        part, view, shape_name = (state.unique(f"{out}_{p}") for p in ("part", "part_view", "part_shape"))
        part_shape[axis] += shapes[orig][axis]
        state.acts[part] = state.acts[view] = out_act
        state.set_const(shape_name, np.array(part_shape, np.int64))
        base = node.name or out
        nodes += [
            helper.make_node("Concat", moved[:2], [part], name=state.unique(f"{base}_part"), **attrs),
            helper.make_node("Reshape", [part, shape_name], [view], name=state.unique(f"{base}_view")),
        ]
        moved = [view, *moved[2:]]
    return [*nodes, helper.make_node("Concat", moved, [out], name=node.name or out, **attrs)]


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
    """The integer form of a matched GELU chain (:func:`~qdebug.targets.deeploy_gelu.gelu_chains`), from its Div's
    input to its last Q."""
    return _integer_gelu(state, head, x_name, out, out_act)
