"""The integer reference evaluator of Deeploy's network: every exported node in exact int64 numpy.

The export checks its bit-exactness with it (:func:`evaluate_integer` against ONNX Runtime's QDQ run), the passes
that need the network's values (``tighten_requant_to_observed_range``, ``annotate_shapes``) run it, and the host
check compares Deeploy's generated code with it. The transformer ops' kernels are Deeploy's own arithmetic
(:func:`qdebug.targets.deeploy_kernels.evaluate_node`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from qdebug.errors import TargetError
from qdebug.targets.deeploy_graph import _attrs, _label
from qdebug.targets.deeploy_kernels import evaluate_node

__all__ = ["evaluate_integer", "requant_shift"]


# --------------------------------------------------------------------------- integer reference evaluator


def _conv(x: np.ndarray, w: np.ndarray, a: Mapping[str, Any]) -> np.ndarray:
    nd = w.ndim - 2
    strides = list(a.get("strides", [1] * nd))
    dil = list(a.get("dilations", [1] * nd))
    pads = list(a.get("pads", [0] * 2 * nd))
    group = int(a.get("group", 1))
    if nd == 1:
        # 1-D as 2-D with a height of 1.
        a2 = {**a, "strides": [1, *strides], "dilations": [1, *dil], "pads": [0, pads[0], 0, pads[1]]}
        return _conv(x[:, :, None, :], w[:, :, None, :], a2)[:, :, 0, :]
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    kh, kw = w.shape[2], w.shape[3]
    eh, ew = (kh - 1) * dil[0] + 1, (kw - 1) * dil[1] + 1
    win = np.lib.stride_tricks.sliding_window_view(xp, (eh, ew), axis=(2, 3))[
        :, :, :: strides[0], :: strides[1], :: dil[0], :: dil[1]
    ]
    cin_g, cout_g = w.shape[1], w.shape[0] // group
    outs = []
    for gi in range(group):
        xs = win[:, gi * cin_g : (gi + 1) * cin_g]
        ws = w[gi * cout_g : (gi + 1) * cout_g]
        outs.append(np.einsum("nchwij,ocij->nohw", xs, ws, optimize=True))
    return np.concatenate(outs, axis=1)


def _maxpool(x: np.ndarray, a: Mapping[str, Any]) -> np.ndarray:
    k = list(a["kernel_shape"])
    s = list(a.get("strides", [1] * len(k)))
    p = list(a.get("pads", [0] * 2 * len(k)))
    if len(k) != 2 or a.get("ceil_mode", 0) or any(d != 1 for d in a.get("dilations", [1, 1])):
        raise TargetError("evaluate_integer: only 2-D MaxPool without ceil_mode/dilations is implemented")
    lo = np.iinfo(np.int64).min
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[2]), (p[1], p[3])), constant_values=lo)
    win = np.lib.stride_tricks.sliding_window_view(xp, tuple(k), axis=(2, 3))[:, :, :: s[0], :: s[1]]
    return np.asarray(win.max(axis=(-2, -1)))


def requant_shift(x: np.ndarray, mul: np.ndarray, add: np.ndarray, div: int, n_levels: int, signed: bool) -> np.ndarray:
    """Deeploy's RequantShift in exact integer arithmetic: clip(floor((x·mul + add + div/2) / div), lo, hi)."""
    lo, hi = (-(n_levels // 2), n_levels // 2 - 1) if signed else (0, n_levels - 1)
    y = (x.astype(np.int64) * mul.astype(np.int64) + add.astype(np.int64) + div // 2) // div
    return np.clip(y, lo, hi)


def _tensor_attr(a: Any) -> float:
    return float(np.asarray(numpy_helper.to_array(a) if isinstance(a, TensorProto) else a).reshape(-1)[0])


def _run(model: onnx.ModelProto, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    vals: dict[str, np.ndarray] = {i.name: numpy_helper.to_array(i).astype(np.int64) for i in model.graph.initializer
                                   if i.data_type not in (TensorProto.FLOAT, TensorProto.DOUBLE)}  # fmt: skip
    for name, arr in inputs.items():
        vals[name] = np.asarray(arr).astype(np.int64)
    for node in model.graph.node:
        a = _attrs(node)
        x = [vals[t] for t in node.input if t]
        op = node.op_type
        if op == "Conv":
            y = _conv(x[0], x[1], a) + (x[2].reshape(1, -1, *[1] * (x[0].ndim - 2)) if len(x) > 2 else 0)
        elif op == "Gemm":
            w = x[1].T if a.get("transB", 0) else x[1]
            y = (x[0].T if a.get("transA", 0) else x[0]) @ w + (x[2] if len(x) > 2 else 0)
        elif op == "MatMul":
            y = x[0] @ x[1]
        elif op == "Add":
            y = x[0] + x[1]
        elif op == "Mul":
            y = x[0] * x[1]
        elif op == "MaxPool":
            y = _maxpool(x[0], a)
        elif op == "Flatten":
            ax = int(a.get("axis", 1))
            y = x[0].reshape(int(np.prod(x[0].shape[:ax])), -1)
        elif op == "Reshape":
            shape = [d if d != 0 else x[0].shape[i] for i, d in enumerate(x[1].tolist())]
            y = x[0].reshape(shape)
        elif (z := evaluate_node(node, x, a)) is not None:
            y = z
        elif op == "RequantShift":
            levels = _tensor_attr(a.get("n_levels", a.get("n_levels_out")))
            y = requant_shift(
                x[0], x[1], x[2], int(_tensor_attr(a["div"])), int(levels), bool(_tensor_attr(a["signed"]))
            )
        else:
            raise TargetError(f"evaluate_integer: {_label(node)} is not an integer op this evaluator implements")
        vals[node.output[0]] = np.asarray(y, dtype=np.int64)
    return vals


def evaluate_integer(model: onnx.ModelProto, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run an exported integer graph in numpy (int64, exact) and return its outputs by name."""
    vals = _run(model, inputs)
    return {o.name: vals[o.name] for o in model.graph.output}


def evaluate_tensors(model: onnx.ModelProto, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Like :func:`evaluate_integer`, but every tensor the graph computes (for comparing intermediates)."""
    return _run(model, inputs)
