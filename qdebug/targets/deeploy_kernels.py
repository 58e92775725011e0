"""Deeploy's Generic kernels of the transformer ops, in numpy: what the generated C code computes.

:func:`evaluate_node` computes the nodes :mod:`qdebug.targets.deeploy_transformer` emits (``iLayerNorm``,
``iRMSNorm``, ``iSoftmax``, ``RequantizediGELU``, Transpose, Concat, Slice, Pad) the way Deeploy 0.2.1's Generic kernels
define them (integer arithmetic, C truncation and wrap-around included), so the integer evaluator
(:mod:`qdebug.targets.deeploy_evaluate`) and the export's bit-exactness check measure what the generated code
computes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

__all__ = ["evaluate_node"]


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


def _moved(op: str, x: list[np.ndarray], a: Mapping[str, Any]) -> np.ndarray:
    """Slice in the export's normalised form (non-negative, clamped starts/ends, positive steps: the generated
    code's loops); Pad in the attribute form Deeploy's PadParser reads (``value`` on the stored integers)."""
    if op == "Slice":
        index = [slice(None)] * x[0].ndim
        for s, e, ax, st in zip(*(v.tolist() for v in x[1:5]), strict=True):
            index[ax] = slice(s, e, st)
        return x[0][tuple(index)]
    p, r = list(a["pads"]), x[0].ndim
    return np.pad(x[0], [(p[i], p[r + i]) for i in range(r)], constant_values=int(a["value"]))


def _attr_int(a: Any) -> int:
    return int(np.asarray(numpy_helper.to_array(a) if isinstance(a, onnx.TensorProto) else a).reshape(-1)[0])


def evaluate_node(node: onnx.NodeProto, x: list[np.ndarray], a: Mapping[str, Any]) -> np.ndarray | None:
    """One node of this module's integer forms, on int64 stored values; None if it is not one of them."""
    op = node.op_type
    if op == "Transpose":
        return np.transpose(x[0], a.get("perm"))
    if op == "Concat":
        return np.concatenate(x, axis=int(a["axis"]))
    if op in ("Slice", "Pad"):
        return _moved(op, x, a)
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
