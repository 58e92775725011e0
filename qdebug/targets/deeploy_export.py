"""QDQ int8 model → Deeploy-ready integer ONNX (``network.onnx`` + ``inputs.npz`` + ``outputs.npz``).

The export is a list of small named passes (:data:`PASSES`) over one mutable :class:`GraphState`; each can be
listed, run alone in a test, or disabled by name. :func:`export` runs them through the one pass runner
(:func:`qdebug.passes.run_passes`), each adapted to the ``model -> (model, PassReport)`` signature. The contract
they target is Deeploy's integer network (docs/deeploy.md): integer
Conv/Gemm/MatMul/Add/MaxPool/Reshape/Flatten, each accumulator brought back to 8 bits by
``RequantShift(x, mul, add)`` with ``y = clip(floor((x·mul + add + div/2) / div), lo, hi)``.

Integer representation of an activation. ORT gives every activation a scale ``s`` and an int8 zero point ``zp``.
A tensor whose ``zp`` is −128 (a ReLU output, or a non-negative graph input) is stored *shifted* as
``u = q + 128`` in uint8 (``signed=0`` RequantShift), so its effective zero point is 0; every other tensor is
stored as ``q`` in int8 with its zero point folded into the consumer's bias. Why: a Conv pads with integer 0,
which is the real value 0 only if the effective zero point is 0; with the shift, the common ReLU→Conv case is
exact at the borders.

Requantization constants. For an accumulator ``acc`` (real value ``acc·s_in·s_w``) and an output ``(s_out, zp)``
the exact target is ``round(acc·M) + zp`` with ``M = s_in·s_w/s_out``. We take ``div = 2^k`` with the largest
``k ≤ 30`` such that ``|acc|·mul + |add| + div/2 < 2^31`` for the worst-case ``|acc|`` (Σ|w|·255 + |bias|, since
Deeploy computes in int32), ``mul = round(M·div)``, ``add = zp·div`` (no ``div/2``: Deeploy adds it). The largest
relative error ``|mul/div − M| / M`` over the network is reported as ``worst_requant_rel_error``. The export never
changes a scale: :func:`qdebug.targets.deeploy_snap.snap_scales_for_deeploy` makes the QDQ model's ratios exactly
``mul/2^k`` beforehand (``build``/``recompile`` for Deeploy do), and this export then finds that same ``mul``.

A bias whose scale is the accumulator scale over ``2^j`` (``s_in·s_w/2^j``, j ≤ 4; the tie-free snapping writes
odd biases with ``j = 1``) is split: its integer part (floor) stays the Conv/Gemm bias, its fraction ``r/2^j`` goes
into the RequantShift add as ``r·mul/2^j``, with ``mul`` chosen a multiple of ``2^j``. Any other bias scale is
read in accumulator units, as the quantizers write it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qdebug._signals import signals_held
from qdebug.errors import DataError, TargetError
from qdebug.graph_index import GraphIndex, topological_nodes
from qdebug.io import new_temp_dir
from qdebug.model_io import ModelKind, is_dq, is_q, model_kind
from qdebug.passes import Pass, PassReport, run_passes
from qdebug.targets import deeploy_transformer as dt
from qdebug.targets.deeploy_graph import Activation, GraphState, StatePass, _activation
from qdebug.targets.deeploy_rq import _INT32_LIMIT, _channels, _choose_requant, _node, _requant_node, _rqs
from qdebug.targets.deeploy_transformer import TRANSFORMER_OPS

__all__ = [
    "PASSES",
    "Activation",
    "ExportResult",
    "GraphState",
    "PassResult",
    "evaluate_integer",
    "export",
    "pass_names",
]

SCHEMA_VERSION = 1
#: Deeploy's LayerNorm forms: ``iLayerNorm`` (mapped on Generic), ``iRMSNorm`` (the decomposition for Siracusa).
LAYERNORM_FORMS = ("iLayerNorm", "iRMSNorm")
#: Each Deeploy platform's form of the network: (LayerNorm form, MatMul operands int8 only). Generic maps
#: iLayerNorm and takes uint8 MatMul operands; PULPOpen (Siracusa) maps iRMSNorm only and its MatMul is int8 × int8.
PLATFORM_FORMS: dict[str, tuple[str, bool]] = {
    "Generic": ("iLayerNorm", False),
    "Siracusa": ("iRMSNorm", True),
    "PULPOpen": ("iRMSNorm", True),
}
#: Float ops with an integer form here (Relu/Clip only when absorbed by the following Q's clipping).
SUPPORTED_OPS = frozenset(
    {"Conv", "Gemm", "MatMul", "Add", "MaxPool", "Reshape", "Flatten", "Relu", "Clip", "GlobalAveragePool"}
    | TRANSFORMER_OPS
)
_PASS_THROUGH = frozenset({"MaxPool", "Reshape", "Flatten", "Transpose"})
_WHY_UNSUPPORTED = {
    "BatchNormalization": "must be folded into the preceding Conv in the float model before quantizing",
}
_OUTPUT_FILES = ("network.onnx", "inputs.npz", "outputs.npz")


#: The export's passes share the one report type of every rewrite (:class:`qdebug.passes.PassReport`).
PassResult = PassReport


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _label(node: onnx.NodeProto) -> str:
    return f"{node.op_type} node {node.name or node.output[0]!r}"


def _qparams(node: onnx.NodeProto, consts: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(scale, zero point) of a Q/DQ node; ORT always puts them in initializers or Constant nodes."""
    if node.input[1] not in consts:
        raise TargetError(f"{_label(node)}: its scale {node.input[1]!r} is not a constant")
    scale = np.asarray(consts[node.input[1]], dtype=np.float64)
    zp = np.asarray(consts[node.input[2]]) if len(node.input) > 2 and node.input[2] else np.zeros((), np.int8)
    return scale, zp


def _replace_input(graph: onnx.GraphProto, old: str, new: str) -> None:
    for n in graph.node:
        for i, t in enumerate(n.input):
            if t == old:
                n.input[i] = new
    for o in graph.output:
        if o.name == old:
            o.name = new


# --------------------------------------------------------------------------- the passes


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
    in_gelu = {m for _, members, _ in dt.gelu_chains(ix, consts).values() for m in members}
    for node in ix.nodes:
        if is_q(node) or is_dq(node):
            continue
        if node.op_type == "Constant":
            continue
        if node.op_type in dt.GELU_ONLY_OPS and node.name not in in_gelu:
            raise TargetError(
                f"{_label(node)} cannot be exported to Deeploy: {node.op_type} has an integer form only inside a "
                "GELU (PyTorch's Erf or tanh form)"
            )
        if node.op_type not in SUPPORTED_OPS or node.domain not in ("", "ai.onnx"):
            why = _WHY_UNSUPPORTED.get(node.op_type, "has no integer form in this export")
            raise TargetError(
                f"{_label(node)} cannot be exported to Deeploy: {node.op_type} {why} "
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
    if node.op_type in _PASS_THROUGH:
        src = state.acts.get(ins[0])
        if src is None or (src.scale, src.zero_point) != (out_act.scale, out_act.zero_point):
            raise TargetError(f"{_label(node)}: its output is requantized to another scale; not supported")
        state.acts[out] = src  # keep the input's storage (shifted or not)
        return [_node(node.op_type, ins, [out], node.name, **_attrs(node))]
    if node.op_type in TRANSFORMER_OPS or node.op_type in ("MatMul", "Add"):
        done = dt.integer_transformer_node(state, node, ins, out, out_act, shapes)
        if done is not None:
            return done
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
    gelus = dt.gelu_chains(ix, {**consts, **state.constants})
    inside = {m for _, members, _ in gelus.values() for m in members}
    for node in ix.nodes:
        if is_q(node) or is_dq(node) or node.op_type in ("Relu", "Clip") or node.op_type == "Constant":
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
        for s in skipped:
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
    integer = _node(op, new_ins, [acc], node.name, **keep)
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

    This is exact only where no padding reads the zero point, so a padded Conv on such an input is refused
    (shifted uint8 tensors, e.g. ReLU outputs and non-negative inputs, have zero point 0 and never get here).
    """
    consts = state.consts()
    ix = state.index()
    n = 0
    for node in ix.nodes:
        zp = state.pending_zp.pop(node.name, 0)
        if not zp:
            continue
        a = _attrs(node)
        if node.op_type == "Conv" and any(a.get("pads", [])):
            raise TargetError(
                f"{_label(node)}: input {node.input[0]!r} has zero point {zp} and the Conv pads; the padding "
                "would not be the real 0 (quantize that tensor symmetrically or remove the padding)"
            )
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
    return n


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
            if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
                raise TargetError(f"{_label(node)}: auto_pad is not supported; export explicit pads")
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
               "Concat", "iLayerNorm", "iRMSNorm", "iSoftmax", "RequantizediGELU"}  # fmt: skip
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
    ("quantize_pass_through_outputs", quantize_pass_through_outputs),
    ("fold_weight_quantization", fold_weight_quantization),
    ("strip_input_quant", strip_input_quant),
    ("fold_dequant_quant_to_requantshift", fold_dequant_quant_to_requantshift),
    ("strip_output_dequant", strip_output_dequant),
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
        elif (z := dt.evaluate_node(node, x, a)) is not None:
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


# --------------------------------------------------------------------------- export


@dataclass(frozen=True)
class ExportResult:
    """Where the export went, what each pass did, and how bit-exact the integer graph is against ORT's QDQ run."""

    out_dir: str
    passes: tuple[PassReport, ...]
    num_samples: int
    equal_fraction: float
    max_lsb_diff: int
    worst_requant_rel_error: float

    @property
    def bit_exact_ok(self) -> bool:
        """The issue's target: ≥ 99.9 % equal elements and never more than 1 LSB apart."""
        return self.equal_fraction >= 0.999 and self.max_lsb_diff <= 1

    def __bool__(self) -> bool:
        return self.bit_exact_ok

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``schema_version``."""
        d = asdict(self)
        d["schema_version"] = SCHEMA_VERSION
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ExportResult:
        """Inverse of :meth:`to_dict`."""
        kw = {k: v for k, v in d.items() if k != "schema_version"}
        kw["passes"] = tuple(PassReport.from_dict(p) for p in kw["passes"])
        return cls(**kw)

    def to_json(self) -> str:
        """JSON text."""
        return json.dumps(self.to_dict(), indent=2)


def _select(
    passes: Sequence[str] | None, disable: Sequence[str], enable: Sequence[str] = ()
) -> list[tuple[str, StatePass]]:
    known = dict(PASSES)
    default = [p for p in known if p not in OPTIONAL_PASSES or p in enable]
    wanted = list(passes) if passes is not None else default
    unknown = [p for p in (*wanted, *disable, *enable) if p not in known]
    if unknown:
        raise TargetError(f"unknown export pass(es) {unknown}; known: {list(known)}")
    return [(name, known[name]) for name in wanted if name not in disable]


def _as_pass(name: str, fn: StatePass, state: GraphState) -> Pass:
    """One export pass in the one pass signature (:data:`qdebug.passes.Pass`): it rewrites a copy of the model it
    is given, through ``state`` (whose facts the later passes read), and reports its change count. A malformed
    graph's KeyError/IndexError/ValueError becomes a TargetError naming the pass."""

    def run(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassReport]:
        state.model = onnx.ModelProto()
        state.model.CopyFrom(model)
        try:
            changes = fn(state)
        except (KeyError, IndexError, ValueError) as exc:
            raise TargetError(f"export pass {name!r} failed: {type(exc).__name__}: {exc}") from exc
        return state.model, PassReport(name, changed=changes > 0, rewrites=changes)

    return run


def _progress_line(r: PassReport) -> str:
    return f"{r.name} … nodes {r.nodes_before} → {r.nodes_after} ({r.rewrites} changes)"


def _input_activations(model: onnx.ModelProto) -> dict[str, Activation]:
    ix = GraphIndex(model)
    consts = {k: ix.value(k) for k in ix.consts}
    names = {i.name for i in model.graph.input}
    out: dict[str, Activation] = {}
    for node in ix.nodes:
        if is_q(node) and node.input[0] in names:
            scale, zp = _qparams(node, consts)
            out[node.input[0]] = _activation(float(scale.reshape(-1)[0]), int(zp.reshape(-1)[0]))
    return out


def _samples(
    model: onnx.ModelProto, data: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]] | None, n: int
) -> list[dict[str, np.ndarray]]:
    """Integer input samples ``q`` per graph input: float ``data`` quantized with the input's own
    QuantizeLinear parameters, or ``n`` seeded random int8 samples."""
    acts = _input_activations(model)
    shapes = {vi.name: [d.dim_value if d.dim_value > 0 else 1 for d in vi.type.tensor_type.shape.dim]
              for vi in model.graph.input}  # fmt: skip
    if data is None:
        rng = np.random.default_rng(0)
        return [{k: rng.integers(-128, 128, shapes[k]).astype(np.int64) for k in acts} for _ in range(n)]
    per_sample: list[Mapping[str, np.ndarray]]
    if isinstance(data, Mapping):
        count = min(len(np.asarray(v)) for v in data.values())
        per_sample = [{k: np.asarray(v)[i] for k, v in data.items()} for i in range(min(count, n))]
    else:
        per_sample = list(data)[:n]
    out = []
    for i, sample in enumerate(per_sample):
        q: dict[str, np.ndarray] = {}
        for k, act in acts.items():
            if k not in sample:
                raise DataError(f"sample {i}: no array for graph input {k!r} (has {sorted(sample)})")
            x = np.asarray(sample[k], np.float64)
            if list(x.shape) != shapes[k]:
                raise DataError(f"sample {i}: input {k!r} has shape {list(x.shape)}, the model expects {shapes[k]}")
            q[k] = np.clip(np.rint(x / act.scale) + act.zero_point, -128, 127).astype(np.int64)
        out.append(q)
    if not out:
        raise DataError("no samples to export with")
    return out


def _compare(
    qdq: onnx.ModelProto, state: GraphState, exported: onnx.ModelProto, samples: Sequence[Mapping[str, np.ndarray]]
) -> tuple[float, int, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Run ORT CPU (optimizations off) on the dequantized inputs and the integer graph; compare on the q grid."""
    from qdebug.ort import make_session

    sess: Any = make_session(qdq, ("CPUExecutionProvider",))  # the engine's own CPU-QDQ session (optimizations off)
    equal = total = 0
    worst = 0
    first_in: dict[str, np.ndarray] = {}
    first_out: dict[str, np.ndarray] = {}
    for i, q_in in enumerate(samples):
        feeds = {
            k: (state.inputs[k].scale * (v - state.inputs[k].zero_point)).astype(np.float32) for k, v in q_in.items()
        }
        stored_in = {k: v - state.inputs[k].offset for k, v in q_in.items()}
        ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
        got = evaluate_integer(exported, stored_in)
        for name, act in state.outputs.items():
            ref_q = np.clip(np.rint(ref[name].astype(np.float64) / act.scale) + act.zero_point, -128, 127)
            got_q = got[name] + act.offset
            diff = np.abs(ref_q.astype(np.int64) - got_q)
            equal += int((diff == 0).sum())
            total += diff.size
            worst = max(worst, int(diff.max(initial=0)))
        if i == 0:
            first_in = {k: v.astype(np.uint8 if state.inputs[k].offset else np.int8) for k, v in stored_in.items()}
            first_out = {k: v.astype(np.uint8 if state.outputs[k].offset else np.int8) for k, v in got.items()}
    return (equal / total if total else 1.0), worst, first_in, first_out


def _write_export(
    out: Path, model: onnx.ModelProto, first_in: Mapping[str, np.ndarray], first_out: Mapping[str, np.ndarray]
) -> None:
    """``out`` appears whole or not at all: built in a temp folder next to it and renamed (a previous export is
    moved aside first, so a failure keeps one whole folder)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp: Path | None = None
    try:
        with signals_held():  # mkdir's mode (it becomes the output), a short name; a signal raised inside the try
            tmp = new_temp_dir(out.parent)
        onnx.save_model(model, str(tmp / "network.onnx"))
        np.savez(tmp / "inputs.npz", **first_in)  # type: ignore[arg-type]
        np.savez(tmp / "outputs.npz", **first_out)  # type: ignore[arg-type]
        if out.exists():  # a previous export: move it aside first, so a failure keeps one whole folder
            old = new_temp_dir(out.parent, ".old")
            os.replace(out, old / "prev")
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def export(
    qdq_model: onnx.ModelProto | str | Path,
    out_dir: str | Path,
    *,
    passes: Sequence[str] | None = None,
    disable: Sequence[str] = (),
    enable: Sequence[str] = (),
    data: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]] | None = None,
    verbose: bool = True,
    num_samples: int = 16,
    layernorm: str | None = None,
    platform: str = "Generic",
) -> ExportResult:
    """Export a QDQ int8 model to ``out_dir/{network.onnx, inputs.npz, outputs.npz}`` for Deeploy.

    ``passes`` replaces the default pass list (:func:`pass_names`), ``disable`` removes passes from it and
    ``enable`` adds optional ones (:data:`OPTIONAL_PASSES`). ``data``: *float* input samples, either
    ``{input name: array[N, *shape]}`` (an npz's layout) or a list of ``{input name: array}``; they are quantized
    with the model's own input QuantizeLinear. ``None`` draws ``num_samples`` seeded random int8 inputs. At most
    ``num_samples`` samples are compared with ONNX Runtime; the first becomes inputs.npz/outputs.npz.

    ``platform`` picks the network's form (:data:`PLATFORM_FORMS`): ``"Siracusa"``/``"PULPOpen"`` write
    LayerNorm as a centring MatMul + ``iRMSNorm`` and re-encode uint8 MatMul operands to int8 (docs/deeploy.md,
    "Siracusa"); ``layernorm`` overrides the LayerNorm form alone.

    ``out_dir`` appears whole or not at all: it is built in a temp folder next to it and renamed. An existing
    ``out_dir`` is replaced only if it holds nothing but a previous export's three files.
    """
    from qdebug.model_io import load_model

    src = qdq_model if isinstance(qdq_model, onnx.ModelProto) else load_model(qdq_model, "QDQ model")
    model = onnx.ModelProto()
    model.CopyFrom(src)
    if platform not in PLATFORM_FORMS:
        raise TargetError(f"platform must be one of {tuple(PLATFORM_FORMS)}, got {platform!r}")
    form, int8_matmul = PLATFORM_FORMS[platform]
    layernorm = layernorm or form
    if layernorm not in LAYERNORM_FORMS:
        raise TargetError(f"layernorm must be one of {LAYERNORM_FORMS}, got {layernorm!r}")
    state = GraphState(model, layernorm=layernorm, int8_matmul=int8_matmul)
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or set(os.listdir(out)) - set(_OUTPUT_FILES)):
        raise TargetError(f"{out}: exists and holds other files than a previous export; choose another folder")
    selected = _select(passes, disable, enable)
    if model_kind(src) is ModelKind.QDQ:
        state.samples = _samples(src, data, num_samples)
        state.shapes = _static_shapes(src)
    model, results = run_passes(
        model, [_as_pass(name, fn, state) for name, fn in selected], progress=print if verbose else None,
        line=_progress_line,
    )  # fmt: skip
    samples = state.samples
    if not state.inputs or not state.outputs:
        raise TargetError(
            "the exported graph has no quantized input or output (were strip_input_quant/strip_output_dequant "
            "disabled?); nothing to write"
        )
    eq, worst, first_in, first_out = _compare(src, state, model, samples)
    _write_export(out, model, first_in, first_out)
    result = ExportResult(
        out_dir=str(out),
        passes=results,
        num_samples=len(samples),
        equal_fraction=eq,
        max_lsb_diff=worst,
        worst_requant_rel_error=max(state.requant_errors.values(), default=0.0),
    )
    if verbose:
        print(f"bit-exactness vs ORT QDQ on {len(samples)} samples: {eq:.4%} equal, max {worst} LSB")
    return result
