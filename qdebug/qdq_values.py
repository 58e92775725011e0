"""Quantized values in numpy: DequantizeLinear and QuantizeLinear exactly as ONNX computes them, the values a weight
DequantizeLinear produces from its constant, and the Q/DQ parameters (scale, zero point) that cannot be right.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx

from qdebug.graph_index import GraphIndex, decode_constant
from qdebug.model_io import is_dq, is_q

_INT_TYPE_NAMES = {
    np.dtype(np.uint8): "uint8", np.dtype(np.int8): "int8", np.dtype(np.uint16): "uint16",
    np.dtype(np.int16): "int16", np.dtype(np.int32): "int32", np.dtype(np.uint32): "uint32",
}  # fmt: skip


def int_attr(node: onnx.NodeProto, name: str, default: int) -> int:
    """The node's integer attribute ``name``, else ``default``."""
    for a in node.attribute:
        if a.name == name:
            return int(a.i)
    return default


def dequantize(
    q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, axis: int = 1, block_size: int = 0
) -> np.ndarray:
    """DequantizeLinear in float64: (q − zp)·scale, widened *before* the subtraction.

    Handles per-tensor, per-axis and blocked parameters and 0-d tensors (which numpy would
    otherwise return as scalars that break ``len()``).
    """
    qf = np.asarray(q).astype(np.float64)
    s = np.asarray(scale).astype(np.float64)
    z = np.zeros_like(s) if zero_point is None else np.asarray(zero_point).astype(np.float64)
    # A non-finite scale (e.g. a calibrated range of ±inf) gives NaN/Inf values, which the caller
    # reports as a status; it must not surface as a numpy RuntimeWarning (an error under -W error).
    with np.errstate(invalid="ignore", over="ignore"):
        if s.size == 1:  # per-tensor, whatever the rank of the stored scale
            return np.asarray((qf - z.reshape(())) * s.reshape(()), dtype=np.float64)
        ax = axis if axis >= 0 else axis + qf.ndim
        if block_size > 0:
            s = np.repeat(s, block_size, axis=ax).take(range(qf.shape[ax]), axis=ax)
            z = np.repeat(z, block_size, axis=ax).take(range(qf.shape[ax]), axis=ax)
            return (qf - z) * s
        shape = [1] * qf.ndim
        shape[ax] = s.size
        return (qf - z.reshape(shape)) * s.reshape(shape)


def quant_type_name(dtype: np.dtype[Any]) -> str:
    """``uint8``/``int16``/… for an integer numpy dtype."""
    return _INT_TYPE_NAMES.get(np.dtype(dtype), str(np.dtype(dtype)))


def dequantized_weight(dq: onnx.NodeProto, quant_index: GraphIndex) -> np.ndarray:
    """The float64 values a weight DequantizeLinear computes from its constant."""
    q_in = dq.input[0]
    if q_in in quant_index.consts:
        q_val = quant_index.value(q_in)
    else:  # Q applied in-graph to a float constant: quantize it here exactly as QuantizeLinear does
        qnode = quant_index.producer[q_in]
        q_val = quantize_array(
            quant_index.value(qnode.input[0]),
            quant_index.value(qnode.input[1]),
            quant_index.value(qnode.input[2]) if len(qnode.input) > 2 and qnode.input[2] else None,
            int_attr(qnode, "axis", 1),
        )
    scale = quant_index.value(dq.input[1])
    zp = quant_index.value(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
    return dequantize(q_val, scale, zp, int_attr(dq, "axis", 1), int_attr(dq, "block_size", 0))


def quantize_array(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, axis: int = 1) -> np.ndarray:
    """QuantizeLinear in numpy (round half to even, saturate), for in-graph weight quantization."""
    xf = np.asarray(x, dtype=np.float64)
    s = np.asarray(scale, dtype=np.float64)
    z = np.zeros((), dtype=np.uint8) if zero_point is None else np.asarray(zero_point)
    info = np.iinfo(z.dtype)
    if s.size > 1 and xf.ndim:
        shape = [1] * xf.ndim
        shape[axis if axis >= 0 else axis + xf.ndim] = s.size
        s = s.reshape(shape)
        zf = z.astype(np.float64).reshape(shape)
    else:
        s = s.reshape(())
        zf = z.astype(np.float64).reshape(())
    return np.clip(np.rint(xf / s) + zf, info.min, info.max).astype(z.dtype)


def _qparam_problem(node: onnx.NodeProto, consts: Mapping[str, onnx.TensorProto | onnx.NodeProto]) -> str | None:
    """What cannot be right about one Q/DQ node's constant scale / zero point (``None``: nothing)."""
    if len(node.input) < 2 or node.input[1] not in consts:
        return None
    scale = np.asarray(decode_constant(consts[node.input[1]]), dtype=np.float64)
    bad = [f"{v:g}" for v in scale.reshape(-1) if not (np.isfinite(v) and v > 0)]
    if bad:
        more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
        return f"scale {', '.join(bad[:3])}{more}: a scale must be finite and positive"
    if len(node.input) > 2 and node.input[2] in consts:
        zp = np.asarray(decode_constant(consts[node.input[2]]))
        if zp.size not in (1, scale.size):
            return f"zero point has {zp.size} values for {scale.size} scale(s)"
    return None


def qdq_parameter_issues(model: onnx.ModelProto) -> list[tuple[str, str, str]]:
    """``(tensor, problem, node op)`` for each tensor whose Q/DQ parameters cannot be right (scale 0, negative,
    NaN or inf; a zero point that does not match its scale), named by the float tensor the Q/DQ pair quantizes."""
    index = GraphIndex(model)
    seen: dict[str, tuple[str, str, str]] = {}
    for node in index.nodes:
        if (is_q(node) or is_dq(node)) and (problem := _qparam_problem(node, index.consts)) is not None:
            # Named by the float tensor the Q/DQ pair quantizes (a weight DQ: its constant).
            q = node if is_q(node) else index.producer.get(node.input[0])
            tensor = q.input[0] if q is not None and is_q(q) else node.input[0]
            where = f"{problem} ({node.op_type} {node.name or node.output[0]!r})"
            seen.setdefault(tensor, (tensor, where, node.op_type))
    return list(seen.values())


def qdq_parameter_problems(model: onnx.ModelProto) -> list[str]:
    """One warning per tensor whose Q/DQ parameters cannot be right (scale 0, negative, NaN or inf; a zero point
    that does not match its scale), naming the tensor. Such a model still runs; its numbers are meaningless."""
    return [f"{tensor}: {problem}" for tensor, problem, _ in qdq_parameter_issues(model)]
