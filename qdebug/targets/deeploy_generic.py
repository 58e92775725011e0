"""The exported integer network in the form Deeploy's *Generic* platform computes correctly.

The export scales both terms of a quantized Add exactly onto a common finer grid with ``RequantShift(x, mul, add,
div=1, n_levels=2^32)`` (int32 output), then adds them and requantizes. Siracusa's Deeploy flow fuses that
pattern into its ``RequantizedAdd`` kernel. Deeploy's Generic platform has no such fusion and its RequantShift
kernels only produce int8: the generated Generic code types those int32 tensors ``int8_t`` and passes ±2^31 clip
bounds through ``int8_t`` parameters (0 and −1), so every residual Add computes garbage. Deeploy accepts the graph
without a word; running the generated code (:mod:`qdebug.targets.deeploy_host`) found it (0 % of the logits equal
on ``digits_cnn``).

:func:`generic_form` rewrites each such ``RequantShift`` into an integer ``Mul`` by the same multiplier (Generic's
Mul takes int8/uint8 × int32 → int32 exactly, with the unsigned offset handled) and folds its ``add`` into the
output requantization after the Add — the same integers, in ops Generic implements.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

__all__ = ["generic_form"]


def _attr(node: onnx.NodeProto, name: str) -> float | None:
    for a in node.attribute:
        if a.name == name:
            value = (
                numpy_helper.to_array(a.t)
                if a.type == onnx.AttributeProto.TENSOR
                else onnx.helper.get_attribute_value(a)
            )
            return float(np.asarray(value).reshape(-1)[0])
    return None


def _is_wide_rqs(node: onnx.NodeProto) -> bool:
    """A RequantShift with ``div = 1`` and more than 8 bits of output: an exact int32 scaling."""
    levels = _attr(node, "n_levels") or _attr(node, "n_levels_out") or 0
    return node.op_type == "RequantShift" and _attr(node, "div") == 1 and levels > 256


def generic_form(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` with every ``int32 RequantShift → Add → RequantShift`` term rewritten as an integer
    ``Mul`` (its ``add`` folded into the output RequantShift's); the number of terms rewritten. Terms whose
    multiplier is not a scalar, or whose Add does not feed exactly one RequantShift, are left alone."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    inits = {i.name: i for i in g.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in g.node:
        for t in node.input:
            consumers.setdefault(t, []).append(node)
    changed = 0
    for i, node in enumerate(list(g.node)):
        if not _is_wide_rqs(node) or node.input[1] not in inits or node.input[2] not in inits:
            continue
        users = consumers.get(node.output[0], [])
        add_users = consumers.get(users[0].output[0], []) if len(users) == 1 and users[0].op_type == "Add" else []
        if len(add_users) != 1 or add_users[0].op_type != "RequantShift" or add_users[0].input[2] not in inits:
            continue
        mul = numpy_helper.to_array(inits[node.input[1]]).astype(np.int64)
        add = numpy_helper.to_array(inits[node.input[2]]).astype(np.int64)
        rq_out = add_users[0]
        out_mul = numpy_helper.to_array(inits[rq_out.input[1]]).astype(np.int64)
        out_add = numpy_helper.to_array(inits[rq_out.input[2]]).astype(np.int64)
        if mul.size != 1 or add.size != 1 or out_mul.size != 1:
            continue
        name_m, name_a = f"{node.output[0]}_generic_mul", f"{rq_out.output[0]}_generic_add_{changed}"
        g.initializer.append(numpy_helper.from_array(mul.reshape(1).astype(np.int32), name_m))
        folded = (out_add + out_mul.reshape(()) * add.reshape(())).astype(np.int32)
        g.initializer.append(numpy_helper.from_array(folded, name_a))
        rq_out.input[2] = name_a
        inits[name_a] = g.initializer[-1]
        new = onnx.helper.make_node("Mul", [node.input[0], name_m], [node.output[0]], name=f"{node.name}_as_Mul")
        g.node.remove(g.node[i])
        g.node.insert(i, new)
        changed += 1
    used = {t for n in g.node for t in n.input}
    keep = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    return out, changed
