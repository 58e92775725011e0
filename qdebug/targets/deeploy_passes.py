"""The Deeploy export's passes, in order (:data:`PASSES`): each ``(GraphState) -> int`` (its number of changes).

Each pass can be listed, run alone in a test, or disabled by name; :func:`qdebug.targets.deeploy_export.export`
runs them through the one pass runner. The central one, ``fold_dequant_quant_to_requantshift``, is
:mod:`qdebug.targets.deeploy_fold`'s; the others check the input, fold the weights, strip the graph's edge Q/DQ,
fold zero points and biases into the RequantShifts, and make the result explicit and integer-only for Deeploy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qdebug.errors import TargetError
from qdebug.graph_index import GraphIndex, topological_nodes
from qdebug.model_io import ModelKind, is_dq, is_q, model_kind
from qdebug.targets import deeploy_transformer as dt
from qdebug.targets.deeploy_evaluate import _run, _tensor_attr
from qdebug.targets.deeploy_fold import _PASS_THROUGH, fold_dequant_quant_to_requantshift
from qdebug.targets.deeploy_gelu import gelu_chains
from qdebug.targets.deeploy_graph import (
    Activation,
    GraphState,
    StatePass,
    _activation,
    _attrs,
    _label,
    _qparams,
    _replace_input,
)
from qdebug.targets.deeploy_movement import MOVEMENT_OPS, drop_identity_casts, identity_casts
from qdebug.targets.deeploy_rq import _INT32_LIMIT, _channels, _choose_requant, _node, _rqs
from qdebug.targets.deeploy_transformer import TRANSFORMER_OPS

__all__ = ["DEEPLOY_GENERIC_OPS", "OPTIONAL_PASSES", "PASSES", "SUPPORTED_OPS", "pass_names"]

#: Float ops with an integer form here (Relu/Clip only when absorbed by the following Q's clipping).
SUPPORTED_OPS = frozenset(
    {"Conv", "Gemm", "MatMul", "Add", "Relu", "Clip", "GlobalAveragePool", "BatchNormalization"}
    | MOVEMENT_OPS
    | TRANSFORMER_OPS
)
#: The op types Deeploy 0.2.1's Generic platform maps to a layer (its ``GenericMapping``, read in the installed
#: package; docs/deeploy.md, "Op coverage"), with integer or float kernels alike.
DEEPLOY_GENERIC_OPS = frozenset(
    {"Add", "BatchNormalization", "Concat", "Conv", "ConvTranspose", "DebugPrint", "Dequant", "Div", "Flatten",
     "Gather", "Gelu", "Gemm", "iGELU", "iLayerNorm", "IntegerDiv", "IntegerMean", "iSoftmax", "ITAMax",
     "ITAPartialMax", "LayerNormalization", "MatMul", "MatMulInteger", "MaxPool", "Mul", "Pad", "Pow", "Quant",
     "ReduceMean", "ReduceSum", "Relu", "RequantizediGELU", "RequantShift", "Reshape", "RQIntegerDiv", "Slice",
     "Softmax", "Sqrt", "Squeeze", "Transpose", "Unsqueeze"}
)  # fmt: skip


# --------------------------------------------------------------------------- the passes


def _after_conv(ix: GraphIndex, node: onnx.NodeProto) -> bool:
    """Whether ``node`` reads a Conv's output (through its Q/DQ pair)."""
    t = node.input[0]
    for _ in range(3):
        src = ix.producer.get(t)
        if src is None:
            return False
        if src.op_type == "Conv":
            return True
        if not (is_q(src) or is_dq(src)):
            return False
        t = src.input[0]
    return False


def _why_unsupported(op: str) -> str:
    """Why ``op`` is refused: no Deeploy mapping at all, or no integer form here yet."""
    if op not in DEEPLOY_GENERIC_OPS:
        return f"Deeploy 0.2.1 has no Generic mapping for {op}"
    return f"Deeploy 0.2.1 maps {op} on Generic, but qdebug's export has no integer form for it yet"


def check_supported(state: GraphState) -> int:
    """Reject what Deeploy cannot run before rewriting anything, naming the node or tensor.

    A float model has nothing to export; an op with no integer form (LayerNorm, Softmax, GAP, ...) would leave a
    float island Deeploy silently runs in fp32; 16-bit Q/DQ would need int16 kernels this export does not emit.
    """
    kind = model_kind(state.model)
    if kind is not ModelKind.QDQ:
        raise TargetError(f"the model is {kind.value}, not a QDQ model: quantize it first (target 'deeploy')")
    ix = state.index()
    consts = {k: ix.value(k) for k in ix.consts}
    # Every non-int8 tensor at once: after a mixed-precision promotion the user needs the whole list to undo.
    wide: dict[str, str] = {}
    for node in ix.nodes:
        if is_q(node) or is_dq(node):
            _, zp = _qparams(node, consts)
            if zp.dtype != np.int8 and not (is_dq(node) and zp.dtype == np.int32):
                tensor = node.output[0] if is_q(node) else node.input[0]
                wide.setdefault(tensor, f"tensor {tensor!r} is quantized to {zp.dtype} by {_label(node)}")
    if wide:
        what = "" if len(wide) == 1 else f"{len(wide)} tensors are not int8: "
        raise TargetError(
            f"{what}{'; '.join(wide.values())}; Deeploy export supports int8 "
            "activations/weights and int32 biases only (drop these 16-bit promotions for target 'deeploy')"
        )
    in_gelu = {m for _, members, _ in gelu_chains(ix, consts).values() for m in members}
    same_type = identity_casts(state.model)  # dropped by the next pass
    for node in ix.nodes:
        if is_q(node) or is_dq(node):
            continue
        if node.op_type == "Constant" or node.output[0] in same_type:
            continue
        if node.op_type in dt.GELU_ONLY_OPS and node.name not in in_gelu:
            raise TargetError(
                f"{_label(node)} cannot be exported to Deeploy: {node.op_type} has an integer form only inside a "
                "GELU (PyTorch's Erf or tanh form)"
            )
        if node.op_type == "BatchNormalization" and _after_conv(ix, node):
            raise TargetError(
                f"{_label(node)} cannot be exported to Deeploy: a BatchNormalization after a Conv must be folded into "
                "it in the float model before quantizing (the batchnorm_folding fix)"
            )
        if node.op_type not in SUPPORTED_OPS or node.domain not in ("", "ai.onnx"):
            raise TargetError(
                f"{_label(node)} cannot be exported to Deeploy: {_why_unsupported(node.op_type)} "
                f"(supported: {', '.join(sorted(SUPPORTED_OPS))})"
            )
    return 0


def quantize_pass_through_outputs(state: GraphState) -> int:
    """DQ → Reshape/Flatten/MaxPool → (no QuantizeLinear) becomes DQ → op → Q → DQ with the input's parameters.

    Why: QAT exports (and hand-written QDQ graphs) often leave the reshape before a Gemm unquantized, since it
    changes no value; every op of the integer network must end in an int8 tensor. Re-quantizing with the same
    per-tensor scale and zero point is the identity on values already on that grid, so this is exact.
    """
    g = state.graph
    ix = state.index()
    n = 0
    for node in ix.nodes:
        if node.op_type not in _PASS_THROUGH or not node.input:
            continue
        dq = ix.producer.get(node.input[0])
        users = ix.consumers_of(node.output[0])
        if dq is None or not is_dq(dq) or (len(users) == 1 and is_q(users[0])):
            continue
        out = node.output[0]
        q_out, dq_out = state.unique(f"{out}_quantized"), state.unique(f"{out}_dequantized")
        zp = list(dq.input[2:3])
        q = _node("QuantizeLinear", [out, dq.input[1], *zp], [q_out], state.unique(f"{node.name or out}_q"))
        d = _node("DequantizeLinear", [q_out, dq.input[1], *zp], [dq_out], state.unique(f"{node.name or out}_dq"))
        for user in users:
            for i, t in enumerate(user.input):
                if t == out:
                    user.input[i] = dq_out
        for o in g.output:
            if o.name == out:  # a graph output keeps its name: the new DQ produces it
                node.output[0], d.output[0] = dq_out, out
                q.input[0] = dq_out
        g.node.extend([q, d])
        n += 1
    if n:
        sorted_nodes = list(topological_nodes(g))
        del g.node[:]
        g.node.extend(sorted_nodes)
    return n


def fold_weight_quantization(state: GraphState) -> int:
    """Constant-fold DequantizeLinear(integer constant): weights stay int8 (zero point 0), biases int32.

    Deeploy wants the integer values themselves as initializers; the scales move into the RequantShift.
    """
    ix = state.index()
    consts = {k: ix.value(k) for k in ix.consts}
    keep: list[onnx.NodeProto] = []
    n = 0
    for node in state.graph.node:
        if is_dq(node) and node.input[0] in consts:
            q = consts[node.input[0]]
            scale, zp = _qparams(node, consts)
            state.constants[node.output[0]] = _real(q, scale, zp, node)
            if np.any(zp != 0) and not _weight_use(ix, node.output[0]):
                n += 1  # an added or multiplied constant: its real value goes into a RequantShift
                continue
            if np.any(zp != 0):
                raise TargetError(
                    f"weight {node.input[0]!r} has a non-zero zero point; Deeploy needs symmetric weights"
                )
            axis = int(_attrs(node).get("axis", 1))
            if scale.size > 1 and axis != 0 and not (q.ndim == 2 and axis == 1):
                raise TargetError(f"weight {node.input[0]!r} is quantized per channel along axis {axis}; unsupported")
            state.weights[node.output[0]] = (q, scale.reshape(-1) if scale.size > 1 else scale.reshape(()))
            state.set_const(node.input[0], q)
            n += 1
        else:
            keep.append(node)
    # A weight held by a Constant node is now an initializer of the same name: drop the node.
    folded = {i.name for i in state.graph.initializer}
    keep = [k for k in keep if not (k.op_type == "Constant" and k.output[0] in folded)]
    del state.graph.node[:]
    state.graph.node.extend(keep)
    return n


def _real(q: np.ndarray, scale: np.ndarray, zp: np.ndarray, node: onnx.NodeProto) -> np.ndarray:
    """The real value of DQ(q) (per-axis parameters broadcast along the DQ's axis)."""
    axis = int(_attrs(node).get("axis", 1))
    shape = [1] * q.ndim
    if scale.size > 1 and q.ndim:
        shape[axis % q.ndim] = -1
    s, z = (
        scale.reshape(shape if scale.size > 1 else ()),
        np.asarray(zp, np.float64).reshape(shape if zp.size > 1 else ()),
    )
    return np.asarray((q.astype(np.float64) - z) * s)


def _weight_use(ix: GraphIndex, dq_out: str) -> bool:
    """Whether a DQ output is read as the weight or bias of a Conv/Gemm/MatMul (or a LayerNorm scale/bias)."""
    for user in ix.consumers_of(dq_out):
        if user.op_type in ("Conv", "Gemm", "MatMul") and dq_out in list(user.input)[1:]:
            return True
    return False


def strip_input_quant(state: GraphState) -> int:
    """Drop the leading QuantizeLinear: inputs are quantized offline into inputs.npz.

    The graph input keeps its name but is declared INT8 (or UINT8 when shifted) explicitly, because Deeploy
    types inputs from the data and would mistype a signed input whose sample is non-negative.
    """
    consts = state.consts()
    names = {i.name for i in state.graph.input}
    n = 0
    for node in list(state.graph.node):
        if is_q(node) and node.input[0] in names:
            scale, zp = _qparams(node, consts)
            act = _activation(float(scale.reshape(-1)[0]), int(zp.reshape(-1)[0]))
            state.inputs[node.input[0]] = act
            state.acts[node.input[0]] = act
            state.graph.node.remove(node)
            _replace_input(state.graph, node.output[0], node.input[0])
            for vi in state.graph.input:
                if vi.name == node.input[0]:
                    vi.type.tensor_type.elem_type = act.elem_type
            n += 1
    return n


def strip_output_dequant(state: GraphState) -> int:
    """Drop the trailing DequantizeLinear: outputs.npz holds the integer outputs Deeploy produces.

    The integer tensor takes the graph output's name so the npz keys match; its type is declared INT8/UINT8.
    """
    n = 0
    for o in state.graph.output:
        src = state.output_sources.pop(o.name, None)
        if src is not None:
            _rename_tensor(state, src, o.name)
            act = state.acts[o.name] = state.acts[src]
            state.outputs[o.name] = act
            o.type.tensor_type.elem_type = act.elem_type
            n += 1
    return n


def copy_aliased_io(state: GraphState) -> int:
    """A copying RequantShift (``mul`` 1, ``div`` 1) after a graph input read by a Reshape/Flatten and before a
    graph output made by one.

    Why: Deeploy's Reshape is no copy. Its generated code frees the aliased buffer after the last use, so a
    Reshape of a graph input freed the input buffer (measured: the second sample's input was written into freed
    memory), and it re-points an output variable inside ``RunNetwork`` while ``DeeployNetwork_outputs[]``, which a
    caller reads, keeps the buffer set up in ``InitNetwork`` (measured: a stale output). Generic only: the
    untiled Siracusa deployer maps no RequantShift that follows no Conv/Gemm/MatMul, and its code is not run here.
    """
    if state.platform != "Generic":
        return 0
    n = 0
    alias_ops = ("Reshape", "Flatten")
    for i in state.graph.input:
        readers = [nd for nd in state.graph.node if i.name in nd.input]
        act = state.inputs.get(i.name) or state.acts.get(i.name)
        if act is not None and any(nd.op_type in alias_ops for nd in readers):
            copy = state.unique(f"{i.name}_copy")
            _rename_tensor(state, i.name, copy)
            _insert_copy(state, i.name, copy, act, 0)
            n += 1
    producer = {t: node for node in state.graph.node for t in node.output}
    for o in state.graph.output:
        node = producer.get(o.name)
        if node is None or node.op_type not in alias_ops:
            continue
        view = state.unique(f"{o.name}_view")
        _rename_tensor(state, o.name, view)
        state.acts[view] = state.acts[o.name]
        _insert_copy(state, view, o.name, state.acts[o.name], list(state.graph.node).index(node) + 1)
        n += 1
    return n


def _insert_copy(state: GraphState, src: str, dst: str, act: Activation, at: int) -> None:
    """``dst = RequantShift(src, 1, 0)`` (``div`` 1) inserted at position ``at``, so the graph stays in order."""
    one, zero = state.unique(f"{dst}_copy_mul"), state.unique(f"{dst}_copy_add")
    state.set_const(one, np.array(1, np.int32))
    state.set_const(zero, np.array(0, np.int32))
    nodes = list(state.graph.node)
    nodes.insert(at, _rqs(src, one, zero, dst, state.unique(f"{dst}_copy"), 1, 256, act.signed))
    del state.graph.node[:]
    state.graph.node.extend(nodes)
    state.acts[dst] = act


def _rename_tensor(state: GraphState, old: str, new: str) -> None:
    for node in state.graph.node:
        for i, t in enumerate(node.output):
            if t == old:
                node.output[i] = new
        for i, t in enumerate(node.input):
            if t == old:
                node.input[i] = new


def fold_input_zero_point(state: GraphState) -> int:
    """Fold a non-zero input zero point into the bias: conv(x − zp) = conv(x) − zp·Σw (per output channel).

    This is exact only where no padding reads the zero point, so a padded Conv on such an input gets its padding
    as an explicit Pad whose value is that zero point (Deeploy pads with 0 otherwise); the target's constraints
    make the input symmetric instead when it quantizes, so this serves QDQ models quantized elsewhere. Shifted
    uint8 tensors (ReLU outputs, non-negative inputs) have zero point 0 and never get here.
    """
    consts = state.consts()
    ix = state.index()
    n = 0
    pads_before: dict[str, onnx.NodeProto] = {}  # inserted after the loop: the loop edits the graph's own nodes
    for node in ix.nodes:
        zp = state.pending_zp.pop(node.name, 0)
        if not zp:
            continue
        a = _attrs(node)
        if node.op_type == "Conv" and any(a.get("pads", [])):
            pads_before[node.name] = _explicit_pad(state, node, list(a["pads"]), zp)
        w = consts[node.input[1]].astype(np.int64)
        out_axis = 0 if node.op_type == "Conv" or (node.op_type == "Gemm" and a.get("transB", 0)) else 1
        corr = -zp * w.sum(axis=tuple(i for i in range(w.ndim) if i != out_axis))
        if node.op_type in ("Conv", "Gemm"):
            state.set_const(node.input[2], (consts[node.input[2]].astype(np.int64) + corr).astype(np.int32))
        else:  # MatMul has no bias: the correction goes into the RequantShift's add, times its mul
            rq = ix.consumers_of(node.output[0])[0]
            if rq.op_type == "Reshape":  # the [1, N] view of a MatMul with more than two dimensions
                rq = ix.consumers_of(rq.output[0])[0]
            mul, add = consts[rq.input[1]].astype(np.int64), consts[rq.input[2]].astype(np.int64)
            state.set_const(rq.input[2], (add + mul * np.resize(corr, add.shape)).astype(np.int32))
        n += 1
    if pads_before:
        nodes: list[onnx.NodeProto] = []
        for node in state.graph.node:
            nodes += [pads_before[node.name], node] if node.name in pads_before else [node]
        del state.graph.node[:]
        state.graph.node.extend(nodes)
    return n


def _explicit_pad(state: GraphState, conv: onnx.NodeProto, pads: list[int], zp: int) -> onnx.NodeProto:
    """``conv`` unpadded, and the Pad node to put before it, with value ``zp`` (the stored integer of the real 0):
    Deeploy's Pad2D template pads each spatial axis equally at both ends."""
    x = conv.input[0]
    if len(pads) != 4 or pads[:2] != pads[2:]:
        raise TargetError(
            f"{_label(conv)}: input {x!r} has zero point {zp} and the Conv pads {pads}, which Deeploy's Pad cannot "
            "write (only a 2-D Conv padded equally at both ends); quantize that tensor symmetrically"
        )
    padded = state.unique(f"{x}_padded")
    if x in state.acts:
        state.acts[padded] = state.acts[x]
    pad = _node("Pad", [x], [padded], state.unique(f"{conv.name}_pad"), mode="constant",
                pads=[0, 0, pads[0], pads[1], 0, 0, pads[0], pads[1]], value=zp)  # fmt: skip
    conv.input[0] = padded
    for attr in conv.attribute:
        if attr.name == "pads":
            del attr.ints[:]
            attr.ints.extend([0, 0, 0, 0])
    return pad


def fold_conv_bias(state: GraphState) -> int:
    """Move each Conv's int32 bias into the following RequantShift: add' = add + mul·bias.

    Deeploy's integer Conv takes no bias (and on Siracusa every Conv is followed by a RequantShift anyway).
    """
    consts = state.consts()
    ix = state.index()
    n = 0
    for node in ix.nodes:
        if node.op_type != "Conv" or len(node.input) < 3 or not node.input[2]:
            continue
        users = ix.consumers_of(node.output[0])
        if len(users) != 1 or users[0].op_type != "RequantShift":
            raise TargetError(f"{_label(node)}: a biased Conv must feed exactly one RequantShift")
        rq = users[0]
        bias = consts[node.input[2]].astype(np.int64)
        mul, add = consts[rq.input[1]].astype(np.int64), consts[rq.input[2]].astype(np.int64)
        new_add = add + mul * bias.reshape(add.shape)
        if np.abs(new_add).max() >= _INT32_LIMIT:
            raise TargetError(f"{_label(node)}: folded RequantShift add overflows int32")
        state.set_const(rq.input[2], new_add.astype(np.int32))
        del node.input[2]
        n += 1
    return n


def tighten_requant_to_observed_range(state: GraphState) -> int:
    """Re-choose div = 2^k from the accumulator range *observed* on the samples (×4 margin) instead of the
    worst case. Off by default.

    The worst-case bound (every input at ±255 against every weight's sign) leaves as few as 12 bits for ``mul``
    on wide layers, a relative error of ~1e-4 that flips a rounding in ~1 % of the elements against ONNX Runtime's
    float computation. Real accumulators stay far below that bound, so a data-driven bound buys 2–5 bits — at the
    price of an int32 overflow in Deeploy if a future input drives an accumulator 4× past anything seen here.
    """
    if not state.samples:
        return 0
    consts = state.consts()
    ix = state.index()
    rqs = [n for n in ix.nodes if n.name in state.requant_targets]
    observed = {n.name: 0.0 for n in rqs}
    for sample in state.samples:
        stored = {k: v - state.inputs[k].offset for k, v in sample.items()}
        vals = _run(state.model, stored)
        for rq in rqs:
            mul, add = consts[rq.input[1]].astype(np.int64), consts[rq.input[2]].astype(np.int64)
            div = int(_tensor_attr(_attrs(rq)["div"]))
            zp = state.requant_targets[rq.name][1]
            bias = (add - zp * div) // mul  # add = zp·div + mul·bias by construction
            observed[rq.name] = max(observed[rq.name], float(np.abs(vals[rq.input[0]] + bias).max()))
    n = 0
    for rq in rqs:
        m, zp, worst = state.requant_targets[rq.name]
        mul, add = consts[rq.input[1]].astype(np.int64), consts[rq.input[2]].astype(np.int64)
        div = int(_tensor_attr(_attrs(rq)["div"]))
        bias = (add - zp * div) // mul
        new_mul, k = _choose_requant(m, np.minimum(worst, 4 * observed[rq.name] + 1), zp)
        if 2**k <= div or ix.producer[rq.input[0]].op_type not in ("Conv", "Gemm", "MatMul"):
            continue
        shape = mul.shape
        state.set_const(rq.input[1], _channels(new_mul, shape))
        state.set_const(rq.input[2], _channels(zp * 2**k + new_mul.reshape(-1) * bias.reshape(-1), shape))
        for a in rq.attribute:
            if a.name == "div":
                a.t.CopyFrom(numpy_helper.from_array(np.array([float(2**k)], np.float32), "div"))
        state.requant_errors[rq.name] = float(np.max(np.abs(new_mul / 2.0**k - m) / m))
        n += 1
    return n


def explicit_attributes(state: GraphState) -> int:
    """Write every attribute Deeploy's parsers read (it does not apply ONNX defaults itself)."""
    consts = state.consts()
    n = 0
    for node in state.graph.node:
        a = _attrs(node)
        want: dict[str, Any] = {}
        if node.op_type in ("Conv", "MaxPool"):
            if node.op_type == "Conv":
                kshape = list(consts[node.input[1]].shape[2:])
                want = {"group": 1, "dilations": [1] * len(kshape)}
            else:
                kshape = list(a["kernel_shape"])
                want = {"ceil_mode": 0}
            auto = a.get("auto_pad", b"NOTSET")
            if auto not in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
                raise TargetError(f"{_label(node)}: auto_pad is not supported; export explicit pads")
            if auto in (b"VALID", "VALID"):  # no padding: the explicit pads below say so
                del node.attribute[[x.name for x in node.attribute].index("auto_pad")]
            want |= {"kernel_shape": kshape, "strides": [1] * len(kshape), "pads": [0] * (2 * len(kshape))}
        elif node.op_type == "Gemm":
            want = {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0}
        elif node.op_type == "Transpose" and "perm" not in a:
            raise TargetError(f"{_label(node)}: needs an explicit perm (Deeploy's TransposeParser requires it)")
        elif node.op_type == "Flatten":
            want = {"axis": 1}  # Deeploy's FlattenParser requires it (measured: "Did not find adequate mapping")
        for key, val in want.items():
            if key not in a:
                node.attribute.append(helper.make_attribute(key, val))
                n += 1
    return n


def remove_orphans(state: GraphState) -> int:
    """Drop nodes whose outputs nobody reads and initializers nothing uses (leftover scales, zero points)."""
    g = state.graph
    n = 0
    while True:
        used = {t for node in g.node for t in node.input} | {o.name for o in g.output}
        dead = [node for node in g.node if not any(t in used for t in node.output)]
        if not dead:
            break
        for node in dead:
            g.node.remove(node)
        n += len(dead)
    used = {t for node in g.node for t in node.input}
    for init in list(g.initializer):
        if init.name not in used:
            g.initializer.remove(init)
            n += 1
    return n


def annotate_shapes(state: GraphState) -> int:
    """Write an explicit shape (and integer type) in value_info for every tensor.

    ONNX shape inference stops at RequantShift, and Deeploy needs every shape; running the integer evaluator
    once on zeros gives them all. Symbolic input dimensions are fixed to 1.
    """
    g = state.graph
    feeds: dict[str, np.ndarray] = {}
    for vi in g.input:
        dims = [d.dim_value if d.dim_value > 0 else 1 for d in vi.type.tensor_type.shape.dim]
        for i, d in enumerate(vi.type.tensor_type.shape.dim):
            d.Clear()
            d.dim_value = dims[i]
        feeds[vi.name] = np.zeros(dims, np.int64)
    values = _run(state.model, feeds)
    del g.value_info[:]
    outputs = {o.name: o for o in g.output}
    inputs = {i.name for i in g.input}
    for node in g.node:
        for t in node.output:
            act = state.acts.get(t)
            elem = act.elem_type if act is not None else TensorProto.INT32  # accumulators are int32
            shape = list(values[t].shape)
            if t in outputs:
                outputs[t].type.tensor_type.elem_type = elem
                del outputs[t].type.tensor_type.shape.dim[:]
                for d in shape:
                    outputs[t].type.tensor_type.shape.dim.add().dim_value = d
            elif t not in inputs:
                g.value_info.append(helper.make_tensor_value_info(t, elem, shape))
    return len(g.value_info)


def check_integer_only(state: GraphState) -> int:
    """Verify the result: no Q/DQ, no float op, only integer initializers, a shape on every tensor.

    Deeploy does not reject float graphs (it has fp32 kernels), so this export checks its own output.
    """
    g = state.graph
    allowed = {"Conv", "Gemm", "MatMul", "Add", "Mul", "MaxPool", "Reshape", "Flatten", "RequantShift", "Transpose",
               "Concat", "iLayerNorm", "iRMSNorm", "iSoftmax", "RequantizediGELU", "Slice", "Pad"}  # fmt: skip
    for node in g.node:
        if node.op_type not in allowed:
            raise TargetError(f"internal: {_label(node)} is left in the integer graph")
    for init in g.initializer:
        if init.data_type in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16):
            raise TargetError(f"internal: initializer {init.name!r} is float")
    known = {v.name for v in (*g.value_info, *g.input, *g.output)} | {i.name for i in g.initializer}
    missing = [t for node in g.node for t in node.output if t not in known]
    if missing:
        raise TargetError(f"internal: tensors without a shape: {missing[:5]}")
    return 0


#: The export passes in order, by name.
PASSES: tuple[tuple[str, StatePass], ...] = (
    ("check_supported", check_supported),
    ("drop_identity_casts", drop_identity_casts),
    ("quantize_pass_through_outputs", quantize_pass_through_outputs),
    ("fold_weight_quantization", fold_weight_quantization),
    ("strip_input_quant", strip_input_quant),
    ("fold_dequant_quant_to_requantshift", fold_dequant_quant_to_requantshift),
    ("strip_output_dequant", strip_output_dequant),
    ("copy_aliased_io", copy_aliased_io),
    ("fold_input_zero_point", fold_input_zero_point),
    ("fold_conv_bias", fold_conv_bias),
    ("tighten_requant_to_observed_range", tighten_requant_to_observed_range),
    ("explicit_attributes", explicit_attributes),
    ("remove_orphans", remove_orphans),
    ("annotate_shapes", annotate_shapes),
    ("check_integer_only", check_integer_only),
)


#: Passes that only run when named in ``passes=`` or ``enable=`` (they trade a guarantee for precision).
OPTIONAL_PASSES = frozenset({"tighten_requant_to_observed_range"})


def pass_names() -> tuple[str, ...]:
    """Names of :data:`PASSES`, in order."""
    return tuple(name for name, _ in PASSES)
