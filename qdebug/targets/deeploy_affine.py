"""A free-standing BatchNormalization as one per-channel RequantShift (Deeploy 0.2.1 maps BatchNormalization on
Generic with float kernels only).

A BatchNormalization after a Conv is folded into it before quantizing (the ``batchnorm_folding`` fix); one after
a MaxPool (Keras' Conv → Relu → MaxPool → BatchNorm order) has nothing to fold into. Per channel it is the affine
map ``y = a·x + c`` (``a = γ/√(σ² + ε)``, ``c = β − μ·a``, with γ and β as the QDQ model dequantizes them), so its
integer form is a RequantShift with a per-channel ``mul`` (negative where γ is) and ``add``:
``y_q = round((x − zp_in)·s_in·a/s_out + c/s_out) + zp_out``, the shift the largest whose int32 arithmetic cannot
overflow.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import onnx

from qdebug.errors import TargetError
from qdebug.targets.deeploy_graph import Activation, GraphState, _attrs, _label
from qdebug.targets.deeploy_rq import _INT32_LIMIT, _requant_node

__all__ = ["integer_batchnorm"]

_MAX_SHIFT = 30


def _real(state: GraphState, node: onnx.NodeProto, i: int, consts: Mapping[str, np.ndarray]) -> np.ndarray:
    """Input ``i`` of the BatchNormalization as real values: a dequantized constant or a float initializer."""
    name = node.input[i]
    if name in state.constants:
        return np.asarray(state.constants[name], np.float64).reshape(-1)
    if name in consts:
        return np.asarray(consts[name], np.float64).reshape(-1)
    raise TargetError(f"{_label(node)}: input {name!r} must be a constant")


def integer_batchnorm(
    state: GraphState, node: onnx.NodeProto, ins: list[str], out: str, out_act: Activation
) -> list[onnx.NodeProto]:
    """The per-channel RequantShift of a BatchNormalization (inference mode) whose output is quantized to ``out``."""
    src = state.acts.get(ins[0])
    if src is None:
        raise TargetError(f"{_label(node)}: its input {ins[0]!r} is not a quantized activation")
    consts = state.consts()
    gamma, beta, mean, var = (_real(state, node, i, consts) for i in range(1, 5))
    a = gamma / np.sqrt(var + float(_attrs(node).get("epsilon", 1e-5)))
    m = src.scale * a / out_act.scale  # per channel, in output LSBs per stored input step
    offset = (beta - mean * a) / out_act.scale - src.residual_zp * m
    worst = 255.0 * np.abs(m) + np.abs(offset) + abs(out_act.residual_zp) + 1
    k = min(_MAX_SHIFT, math.floor(math.log2((_INT32_LIMIT - 1) / float(worst.max()))))
    if k < 0:
        raise TargetError(f"{_label(node)}: its per-channel factor cannot be represented in an int32 RequantShift")
    mul = np.rint(m * 2.0**k).astype(np.int64)
    add = np.rint(offset * 2.0**k).astype(np.int64) + out_act.residual_zp * 2**k
    rq = _requant_node(state, ins[0], out, mul, add, k, out_act, (len(mul), 1, 1))
    nz = m != 0
    state.requant_errors[rq.name] = float(np.max(np.abs(mul[nz] / 2.0**k - m[nz]) / np.abs(m[nz]), initial=0.0))
    return [rq]
