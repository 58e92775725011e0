"""Zero-centring the QDQ model's operands that Deeploy's kernels read without a zero point (before the export).

Deeploy's integer MatMul of two activations and its GELU take no input zero point: :func:`zero_centre_operands`
requantizes those operands of the QDQ model to zero point 0 beforehand (a change of the QDQ model, like scale
snapping; ``build``/``recompile`` for Deeploy run it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from qdebug.graph_index import GraphIndex
from qdebug.model_io import is_dq, is_q
from qdebug.targets.deeploy_gelu import _erf_gelu, _tanh_gelu
from qdebug.targets.deeploy_transformer import _ERF_B

__all__ = ["GELU_MIN_SCALE", "SHAPE_OPS", "zero_centre_operands"]

#: Shape-only ops whose Q repeats the input's quantization.
SHAPE_OPS = frozenset({"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze"})


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
