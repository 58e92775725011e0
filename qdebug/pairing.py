"""The float↔quant pairing that walks QuantizeLinear→DequantizeLinear chains (:func:`pair_models`), and each weight
pair's two arrays (:func:`weight_arrays`). Loading a model is :mod:`qdebug.model_io`, its index
:mod:`qdebug.graph_index`, quantized values in numpy :mod:`qdebug.qdq_values`.

Pairing is structural: an activation is quantized where a QuantizeLinear (default or
``com.microsoft`` domain, any bit width) reads a float tensor and a DequantizeLinear reads the Q's
output; the pre-QDQ tensor keeps the float model's name because the quantizer inserts Q/DQ *after*
the producer. Weights are DequantizeLinear nodes fed by an integer constant (initializer or
``Constant`` node); their float counterpart is the same input of the consuming node's float twin: the
node of that name, else the node of the same op reading the same float activations in the same slots
with float weights of the same size (several such nodes: the one whose weights the dequantized ones
are closest to), never a name suffix.

Why one module: the activation, weight and output pairings are one walk over the same two graph indices and name
maps (``_Sides``), and the records it returns are what every caller reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from qdebug.errors import ModelError
from qdebug.graph_index import GraphIndex, decode_constant, light_model
from qdebug.model_io import ModelKind, file_sha256, input_specs, is_dq, is_q, load_model, model_kind
from qdebug.qdq_values import dequantized_weight, int_attr, quant_type_name

# file_sha256 and load_model are re-exported: docs/overrides.md imports them from here.
__all__ = [
    "FLOAT_DTYPES",
    "ActivationPair",
    "OutputPair",
    "Pairing",
    "QuantParams",
    "WeightPair",
    "check_not_swapped",
    "file_sha256",
    "load_model",
    "pair_models",
    "weight_arrays",
]

FLOAT_DTYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                          onnx.TensorProto.BFLOAT16})  # fmt: skip


@dataclass(frozen=True)
class QuantParams:
    """Scale / zero point of one Q or DQ node (per-tensor values as Python scalars)."""

    quant_type: str
    domain: str
    scale: float | None
    zero_point: int | None
    axis: int | None = None
    channels: int = 1


@dataclass(frozen=True)
class ActivationPair:
    """A float-model tensor and where its value lives in the quantized model."""

    tensor_name: str
    pre_qdq: str
    post_qdq: str
    quantized: bool
    producer_op: str
    producer_node: str
    topo_index: int
    params: QuantParams | None = None
    converted_to: tuple[str, ...] = ()
    # A Relu/Clip of the float model that the quantizer removed because the Q's saturation does its job:
    # the local reference is then the clipped pre-QDQ tensor, as the float graph would have computed it.
    fused_activation: tuple[str, float, float] | None = None
    # The tensor's only consumers are one Relu/Clip: values it removes cannot matter downstream (and ORT
    # gives such a tensor the activation's range, so its Q clips them), so both sides are compared
    # through that activation.
    measured_through: tuple[str, float, float] | None = None
    # Float-model activation tensors read by this tensor's producer (graph edges for the views/suggestions).
    inputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class WeightPair:
    """A float weight and the integer constant + DequantizeLinear that replaced it."""

    weight_name: str
    quant_name: str
    dq_node: str
    consumer_node: str
    consumer_op: str
    input_index: int
    kind: str  # "weight" or "bias"
    params: QuantParams


@dataclass(frozen=True)
class OutputPair:
    """A model output in the float and the quantized model."""

    output_name: str
    quant_name: str


@dataclass(frozen=True)
class Pairing:
    """The explicit float↔quant correspondence used by the engine."""

    activations: tuple[ActivationPair, ...]
    weights: tuple[WeightPair, ...]
    outputs: tuple[OutputPair, ...]
    unmatched_float_tensors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default_factory=tuple)


def _params(node: onnx.NodeProto, consts: dict[str, onnx.TensorProto | onnx.NodeProto]) -> QuantParams:
    scale = decode_constant(consts[node.input[1]]) if len(node.input) > 1 and node.input[1] in consts else None
    zp = (
        decode_constant(consts[node.input[2]])
        if len(node.input) > 2 and node.input[2] and node.input[2] in consts
        else None
    )
    if zp is not None:
        qtype = quant_type_name(zp.dtype)
    else:
        out_dtype = int_attr(node, "output_dtype", 0)
        qtype = quant_type_name(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(out_dtype))) if out_dtype else "uint8"
    per_tensor = scale is not None and scale.size == 1
    return QuantParams(
        quant_type=qtype,
        domain=node.domain or "ai.onnx",
        scale=float(scale.reshape(-1)[0]) if per_tensor and scale is not None else None,
        zero_point=int(zp.reshape(-1)[0]) if per_tensor and zp is not None else (0 if per_tensor else None),
        axis=None if per_tensor else int_attr(node, "axis", 1),
        channels=1 if scale is None else int(scale.size),
    )


def _fused_activation(
    fnode: onnx.NodeProto | None,
    qproducer: onnx.NodeProto | None,
    f_consts: dict[str, onnx.TensorProto | onnx.NodeProto],
) -> tuple[str, float, float] | None:
    if fnode is None or fnode.op_type not in ("Relu", "Clip"):
        return None
    if qproducer is not None and qproducer.op_type == fnode.op_type:
        return None
    return _activation_bounds(fnode, f_consts)


def _activation_inputs(fnode: onnx.NodeProto | None, float_tensors: Set[str]) -> tuple[str, ...]:
    if fnode is None:
        return ()
    return tuple(dict.fromkeys(i for i in fnode.input if i in float_tensors))


def _consumer_activation(
    consumers: list[onnx.NodeProto], f_consts: dict[str, onnx.TensorProto | onnx.NodeProto]
) -> tuple[str, float, float] | None:
    bounds = {_activation_bounds(c, f_consts) if c.op_type in ("Relu", "Clip") else None for c in consumers}
    if len(consumers) == 0 or len(bounds) != 1:
        return None
    return bounds.pop()


def _activation_bounds(
    fnode: onnx.NodeProto, f_consts: dict[str, onnx.TensorProto | onnx.NodeProto]
) -> tuple[str, float, float]:
    if fnode.op_type == "Relu":
        return ("Relu", 0.0, float("inf"))
    lo, hi = -float("inf"), float("inf")
    for a in fnode.attribute:  # opset < 11
        if a.name == "min":
            lo = a.f
        elif a.name == "max":
            hi = a.f
    if len(fnode.input) > 1 and fnode.input[1] in f_consts:
        lo = float(decode_constant(f_consts[fnode.input[1]]))
    if len(fnode.input) > 2 and fnode.input[2] in f_consts:
        hi = float(decode_constant(f_consts[fnode.input[2]]))
    return ("Clip", lo, hi)


def _float_value_types(model: onnx.ModelProto) -> dict[str, int]:
    try:
        inferred = onnx.shape_inference.infer_shapes(light_model(model), strict_mode=False)
    except Exception:  # inference is best-effort; untyped tensors are then treated as float
        inferred = model
    g = inferred.graph
    types: dict[str, int] = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    return types


#: What every face says when the float and the quantized model were given the other way round.
SWAPPED_PAIR = (
    "these look swapped: the model given as the float model is quantized (QDQ) and the one given as the quantized "
    "model has no QuantizeLinear/DequantizeLinear; give them the other way round"
)


def check_not_swapped(float_model: onnx.ModelProto, quant_model: onnx.ModelProto | str | Path) -> None:
    """A :class:`ModelError` saying "these look swapped" when the float model is a QDQ model and the quantized one a
    float model, before any step fails on one of them alone with a misleading reason (the quantized model is read
    only when the float model is quantized: the usual case costs nothing)."""
    if model_kind(float_model) is not ModelKind.QDQ:
        return
    quant = quant_model if isinstance(quant_model, onnx.ModelProto) else load_model(quant_model, "quantized model")
    if model_kind(quant) is ModelKind.FLOAT:
        raise ModelError(SWAPPED_PAIR)


def _check_kinds(float_model: onnx.ModelProto, quant_model: onnx.ModelProto) -> None:
    check_not_swapped(float_model, quant_model)
    qkind = model_kind(quant_model)
    if qkind is ModelKind.QOPERATOR:
        raise ModelError(
            "the quantized model is in QOperator format (QLinearConv, QGemm, ...); qdebug needs a QDQ "
            "model: quantize with quant_format=QuantFormat.QDQ"
        )
    if qkind is ModelKind.DYNAMIC:
        raise ModelError(
            "the quantized model is dynamically quantized (DynamicQuantizeLinear/MatMulInteger); it has no "
            "static activation quantization to debug: quantize statically in QDQ format"
        )
    if qkind is ModelKind.FLOAT:
        raise ModelError("the 'quantized' model contains no QuantizeLinear/DequantizeLinear nodes")
    fkind = model_kind(float_model)
    if fkind is not ModelKind.FLOAT:
        raise ModelError(f"the float model is already quantized ({fkind.value}); pass the float parent")


def _check_inputs(float_model: onnx.ModelProto, quant_model: onnx.ModelProto) -> set[str]:
    f_inputs = {s.name: s for s in input_specs(float_model)}
    q_inputs = {s.name: s for s in input_specs(quant_model)}
    if set(f_inputs) != set(q_inputs):
        raise ModelError(
            f"the models do not correspond: float inputs {sorted(f_inputs)} vs quantized inputs {sorted(q_inputs)}"
        )
    for name, fs in f_inputs.items():
        qs = q_inputs[name]
        if len(fs.shape) != len(qs.shape) or any(
            isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(fs.shape, qs.shape, strict=True)
        ):
            raise ModelError(f"the models do not correspond: input {name!r} is {fs.shape} vs {qs.shape}")
    return set(q_inputs)


@dataclass(frozen=True)
class _Sides:
    """Both models' indexes and the float model's facts the pairing needs."""

    f: GraphIndex
    q: GraphIndex
    float_tensors: list[str]
    float_set: frozenset[str]
    f_types: dict[str, int]

    def float_node(self, name: str) -> tuple[int, onnx.NodeProto | None]:
        """(topological position, producer) of a float tensor; (-1, None) for a graph input."""
        node = self.f.producer.get(name)
        return (self.f.position[name], node) if node is not None else (-1, None)


def _quantized_pair(s: _Sides, q: onnx.NodeProto) -> ActivationPair | None:
    """The activation pair of one activation QuantizeLinear (``None``: not a new tensor, or no float twin)."""
    src = q.input[0]
    producer = s.q.producer.get(src)
    if producer is not None and is_dq(producer):
        return None  # a DQ→Q type conversion inside a mixed-precision region, not a new tensor
    dqs = [c for c in s.q.consumers_of(q.output[0]) if is_dq(c)]
    if not dqs:
        return None
    dq = dqs[0]
    # The quantizer keeps the producer's output name, except at graph outputs, where the DQ takes the output's
    # name and the producer writes '<out>_QuantizeLinear_Input'.
    name = src if src in s.float_set else dq.output[0] if dq.output[0] in s.float_set else None
    if name is None:
        return None
    # A mixed-precision "convert" hangs off its own DQ of the same Q (Q → DQ → Q' → DQ'), so every DQ of this Q
    # is searched for the re-quantizing Q', not just the first.
    qc = s.q.consts
    converted = tuple(sorted(_params(c, qc).quant_type for d in dqs for c in s.q.consumers_of(d.output[0]) if is_q(c)))
    idx, fnode = s.float_node(name)
    through = None if name in s.f.outputs else _consumer_activation(s.f.consumers_of(name), s.f.consts)
    return ActivationPair(
        tensor_name=name,
        pre_qdq=src,
        post_qdq=dq.output[0],
        quantized=True,
        producer_op=fnode.op_type if fnode is not None else "<input>",
        producer_node=(fnode.name or fnode.output[0]) if fnode is not None else name,
        topo_index=idx,
        params=_params(q, qc),
        converted_to=converted,
        fused_activation=_fused_activation(fnode, producer, s.f.consts),
        measured_through=through,
        inputs=_activation_inputs(fnode, s.float_set),
    )


def _activation_pairs(s: _Sides, q_inputs: set[str]) -> tuple[list[ActivationPair], list[str]]:
    """Every float activation with a counterpart (quantized or not), and the float tensors without one."""
    quantized = {}
    for q in s.q.nodes:
        if is_q(q) and q.input[0] not in s.q.consts and (pair := _quantized_pair(s, q)) is not None:
            quantized[pair.tensor_name] = pair
    if not quantized:
        raise ModelError(
            "the models do not correspond: no QuantizeLinear in the quantized model reads a tensor of the "
            "float model (were they exported from different graphs?)"
        )
    q_tensors = set(s.q.producer) | q_inputs
    activations: list[ActivationPair] = []
    unmatched: list[str] = []
    for name in s.float_tensors:
        if name in quantized:
            activations.append(quantized[name])
        elif s.f_types.get(name, onnx.TensorProto.FLOAT) not in FLOAT_DTYPES:
            continue
        elif name in q_tensors and not (
            name in s.q.producer and (is_q(s.q.producer[name]) or is_dq(s.q.producer[name]))
        ):
            idx, fnode = s.float_node(name)
            activations.append(
                ActivationPair(
                    tensor_name=name,
                    pre_qdq=name,
                    post_qdq=name,
                    quantized=False,
                    producer_op=fnode.op_type if fnode is not None else "<input>",
                    producer_node=(fnode.name or fnode.output[0]) if fnode is not None else name,
                    topo_index=idx,
                    inputs=_activation_inputs(fnode, s.float_set),
                )
            )
        else:
            unmatched.append(name)
    return _resolve_edges(s, activations), unmatched


def _resolve_edges(s: _Sides, activations: list[ActivationPair]) -> list[ActivationPair]:
    """Edges skip float tensors that have no counterpart (e.g. a Conv output whose Relu the quantizer removed):
    the edge then points at the nearest matched ancestors."""
    matched = {a.tensor_name for a in activations}

    def resolve(names: tuple[str, ...], depth: int = 0) -> tuple[str, ...]:
        out: list[str] = []
        for n in names:
            if n in matched or depth > 16:
                out.append(n)
            elif n in s.f.producer:
                out.extend(resolve(_activation_inputs(s.f.producer[n], s.float_set), depth + 1))
        return tuple(dict.fromkeys(out))

    return [replace(a, inputs=resolve(a.inputs)) for a in activations]


def _const_source(q: GraphIndex, t: str) -> str | None:
    """The integer (or float) constant a weight DQ reads: directly, or through a Q on a float constant (in-graph
    weight quantization)."""
    if t in q.consts:
        return t
    prod = q.producer.get(t)
    if prod is not None and is_q(prod) and prod.input[0] in q.consts:
        return str(prod.input[0])
    return None


def _const_size(c: onnx.TensorProto | onnx.NodeProto) -> int:
    """Element count of a constant, read from its dims when it is an initializer (no decoding)."""
    if isinstance(c, onnx.TensorProto):
        return int(np.prod(c.dims, dtype=np.int64))
    return int(decode_constant(c).size)


@dataclass(frozen=True)
class _WeightDQ:
    """A weight DequantizeLinear and the constant it dequantizes."""

    dq: onnx.NodeProto
    src: str


def _weight_dqs(q: GraphIndex) -> dict[str, _WeightDQ]:
    """Every weight DequantizeLinear of the quantized model (a constant, dequantized by constant parameters), by its
    output."""
    found: dict[str, _WeightDQ] = {}
    for dq in q.nodes:
        params = [i for i in dq.input[1:] if i]
        if is_dq(dq) and (src := _const_source(q, dq.input[0])) is not None and all(i in q.consts for i in params):
            found[dq.output[0]] = _WeightDQ(dq, src)
    return found


def _float_tensor(s: _Sides, act_map: Mapping[str, str], name: str) -> str | None:
    """The float activation a quantized-model tensor stands for: by the activation pairing (whose names survive a
    renamed producer), through a DQ ← Q conversion chain, or the same-named float tensor; ``None``: unknown."""
    for _ in range(8):  # a mixed-precision convert chain is Q → DQ → Q' → DQ': a few steps at most
        if name in act_map:
            return act_map[name]
        producer = s.q.producer.get(name)
        if producer is None or not (is_q(producer) or is_dq(producer)):
            return name if name in s.float_set else None
        q = s.q.producer.get(producer.input[0]) if is_dq(producer) else producer
        if q is None or not is_q(q):
            return None
        name = q.input[0]
    return None


def _named_twin(s: _Sides, consumer: onnx.NodeProto, by_name: Mapping[str, onnx.NodeProto]) -> onnx.NodeProto | None:
    """The float node of the same op with the consumer's name, else with one of its outputs' names."""
    twin = by_name.get(consumer.name) if consumer.name else None
    if twin is not None and twin.op_type == consumer.op_type:
        return twin
    twin = next((s.f.producer[o] for o in consumer.output if o in s.f.producer), None)
    return twin if twin is not None and twin.op_type == consumer.op_type else None


def _fits(s: _Sides, consumer: onnx.NodeProto, twin: onnx.NodeProto, weights: Mapping[str, _WeightDQ]) -> bool:
    """Whether ``twin`` holds a float constant where the consumer reads a weight, each of the quantized weight's
    size (a slot without one just stays unpaired, as the rest of the node's weights still pair)."""
    slots = [(k, inp) for k, inp in enumerate(consumer.input) if inp in weights]
    floats = [(twin.input[k], inp) for k, inp in slots if k < len(twin.input) and twin.input[k] in s.f.consts]
    return bool(floats) and all(
        _const_size(s.f.consts[f]) == _const_size(s.q.consts[weights[inp].src]) for f, inp in floats
    )


def _candidates(
    s: _Sides, consumer: onnx.NodeProto, weights: Mapping[str, _WeightDQ], act_map: Mapping[str, str]
) -> list[onnx.NodeProto]:
    """The float nodes a quantized consumer can be the twin of, by structure: the same op reading the same float
    activations in the same slots, with a float constant of the right size wherever it reads a weight."""
    known = [
        (k, _float_tensor(s, act_map, i))
        for k, i in enumerate(consumer.input)
        if i and i not in weights and i not in s.q.consts
    ]
    reads = [(k, t) for k, t in known if t is not None]
    if known and not reads:
        return []  # its activations have no float counterpart: no place in the float graph to look
    if reads:
        k0, t0 = reads[0]
        pool = [n for n in s.f.distinct_consumers(t0) if k0 < len(n.input) and n.input[k0] == t0]
    else:  # reads only constants: any node of the op
        pool = [n for n in s.f.nodes if n.op_type == consumer.op_type]
    return [
        n
        for n in pool
        if n.op_type == consumer.op_type
        and n.domain == consumer.domain
        and all(k < len(n.input) and n.input[k] == t for k, t in reads)
        and _fits(s, consumer, n, weights)
    ]


def _distance(s: _Sides, dequantized: Mapping[int, np.ndarray], twin: onnx.NodeProto, floats: dict[str, Any]) -> float:
    """Relative squared error between a consumer's dequantized weights (by input slot) and the twin's float ones:
    the tie-breaker between structurally equal twins (the right partner is close, another layer's weights are
    not). ``floats`` keeps the float weights decoded so far (a weight is a candidate of several consumers)."""
    err = ref = 0.0
    for k, d in dequantized.items():
        name = twin.input[k] if k < len(twin.input) else ""
        if name not in s.f.consts:
            continue
        if name not in floats:
            floats[name] = s.f.value(name).astype(np.float64).reshape(-1)
        f = floats[name]
        err += float(np.sum(np.square(f - d)))
        ref += float(np.sum(np.square(f)))
    return err / ref if ref > 0 else err


def _twins(
    s: _Sides, consumers: Sequence[onnx.NodeProto], weights: Mapping[str, _WeightDQ], act_map: Mapping[str, str]
) -> dict[int, onnx.NodeProto]:
    """Each quantized weight consumer's float twin (by ``id`` of the consumer): by name when the names say so, else
    by structure (:func:`_candidates`). Several structural candidates — one activation read by several Convs of the
    same shape — are told apart by their weights' values; equally close ones go to consumers in turn."""
    by_name = {n.name: n for n in s.f.nodes if n.name}
    twins: dict[int, onnx.NodeProto] = {}
    open_: list[tuple[onnx.NodeProto, list[onnx.NodeProto]]] = []
    for c in consumers:
        named = _named_twin(s, c, by_name)
        cands = [named] if named is not None and _fits(s, c, named, weights) else _candidates(s, c, weights, act_map)
        if len(cands) == 1:
            twins[id(c)] = cands[0]
        elif cands:
            open_.append((c, cands))
    taken = {id(t) for t in twins.values()}
    floats: dict[str, Any] = {}
    for c, cands in open_:
        deq = {k: dequantized_weight(weights[i].dq, s.q).reshape(-1) for k, i in enumerate(c.input) if i in weights}
        best = min(
            cands, key=lambda n: (_distance(s, deq, n, floats), id(n) in taken, s.f.position.get(n.output[0], -1))
        )
        twins[id(c)] = best
        taken.add(id(best))
    return twins


def _activation_map(activations: Sequence[ActivationPair]) -> dict[str, str]:
    """Quantized-model tensor → the float activation it holds: every paired activation's pre- and post-Q/DQ name."""
    found: dict[str, str] = {}
    for a in activations:
        found[a.pre_qdq] = found[a.post_qdq] = a.tensor_name
    return found


def _weight_pairs(s: _Sides, activations: Sequence[ActivationPair], warnings: list[str]) -> list[WeightPair]:
    """DQ(integer constant) → consumer; the float counterpart is the same input of the consumer's float twin
    (:func:`_twins`). Every quantized weight is paired or named in a warning."""
    weights = _weight_dqs(s.q)
    consumers = list({id(c): c for out in weights for c in s.q.consumers_of(out)}.values())
    twins = _twins(s, consumers, weights, _activation_map(activations))
    pairs: list[WeightPair] = []
    seen: set[tuple[str, str]] = set()
    for consumer in consumers:
        twin = twins.get(id(consumer))
        for idx, inp in enumerate(consumer.input):
            w = weights.get(inp)
            if twin is None or w is None or idx >= len(twin.input):
                continue
            fname, dq = twin.input[idx], w.dq
            if fname not in s.f.consts or (fname, dq.name or dq.output[0]) in seen:
                continue
            seen.add((fname, dq.name or dq.output[0]))
            typed = dq if dq.input[0] == w.src else s.q.producer[dq.input[0]]  # Q on a float constant: typed there
            kind = "bias" if idx == 2 and consumer.op_type in ("Conv", "Gemm", "ConvTranspose") else "weight"
            pairs.append(
                WeightPair(
                    weight_name=fname,
                    quant_name=w.src,
                    dq_node=dq.name or dq.output[0],
                    consumer_node=consumer.name or consumer.output[0],
                    consumer_op=consumer.op_type,
                    input_index=idx,
                    kind=kind,
                    params=_params(typed, s.q.consts),
                )
            )
    paired = {p.quant_name for p in pairs}
    unpaired = list(dict.fromkeys(w.src for w in weights.values() if w.src not in paired))
    if unpaired:
        warnings.append(
            f"{len(unpaired)} quantized weight(s) have no float counterpart and are not in the report: "
            + ", ".join(repr(u) for u in unpaired[:5])
            + (f" (and {len(unpaired) - 5} more)" if len(unpaired) > 5 else "")
        )
    return pairs


def _output_pairs(f: GraphIndex, q: GraphIndex, warnings: list[str]) -> list[OutputPair]:
    """Model outputs by name, else by position when the counts agree."""
    f_outs, q_outs = list(f.outputs), list(q.outputs)
    if set(f_outs) <= set(q_outs):
        return [OutputPair(n, n) for n in f_outs]
    if len(f_outs) == len(q_outs):
        warnings.append(f"model output names differ ({f_outs} vs {q_outs}); paired by position")
        return [OutputPair(a, b) for a, b in zip(f_outs, q_outs, strict=True)]
    raise ModelError(f"the models do not correspond: outputs {f_outs} vs {q_outs}")


def _check_correspondence(
    f: GraphIndex, activations: Sequence[ActivationPair], unmatched: Sequence[str], warnings: list[str]
) -> None:
    """Two models whose only shared names are graph inputs/outputs are not a float/quant pair (a coincidence such
    as ``input``/``logits``); many float tensors without a counterpart deserve a warning."""
    ends = set(f.inputs) | set(f.outputs)
    inner = [a for a in activations if a.tensor_name not in ends]
    if unmatched and not inner:
        raise ModelError(
            "the models do not correspond: they share only their graph input/output names "
            f"({', '.join(repr(a.tensor_name) for a in activations)}); {len(unmatched)} float tensor(s) have no "
            "counterpart in the quantized model"
        )
    if len(unmatched) > len(activations):
        warnings.append(
            f"{len(unmatched)} of {len(unmatched) + len(activations)} float tensors have no counterpart in the "
            f"quantized model (first: {unmatched[0]!r}); is it the quantized version of this float model?"
        )


def _index(model: onnx.ModelProto, role: str) -> GraphIndex:
    """The model's :class:`GraphIndex`; a graph that cannot be ordered is named by its role (both graphs are often
    called 'main_graph')."""
    try:
        return GraphIndex(model)
    except ModelError as exc:
        raise ModelError(exc.reason, role=role) from exc


def pair_models(float_model: onnx.ModelProto, quant_model: onnx.ModelProto) -> Pairing:
    """Build the float↔quant pairing from the quantized graph's Q/DQ structure.

    Raises :class:`ModelError` when the quantized model is not QDQ, or when the two models do not
    correspond (different inputs, outputs that cannot be matched, or no shared quantized tensor).
    """
    _check_kinds(float_model, quant_model)
    q_inputs = _check_inputs(float_model, quant_model)
    f = _index(float_model, "float model")
    float_tensors = [i for i in f.inputs if i in q_inputs] + [
        o for n in f.nodes if n.op_type != "Constant" for o in n.output if o
    ]
    sides = _Sides(
        f,
        _index(quant_model, "quantized model"),
        float_tensors,
        frozenset(float_tensors),
        _float_value_types(float_model),
    )
    activations, unmatched = _activation_pairs(sides, q_inputs)
    warnings: list[str] = []
    _check_correspondence(f, activations, unmatched, warnings)
    outputs = _output_pairs(f, sides.q, warnings)
    return Pairing(
        activations=tuple(activations),
        weights=tuple(_weight_pairs(sides, activations, warnings)),
        outputs=tuple(outputs),
        unmatched_float_tensors=tuple(unmatched),
        warnings=tuple(warnings),
    )


def weight_arrays(pair: WeightPair, float_index: GraphIndex, quant_index: GraphIndex) -> tuple[np.ndarray, np.ndarray]:
    """(float weight, dequantized weight) as float64 arrays of the same shape."""
    ref = float_index.value(pair.weight_name).astype(np.float64)
    test = dequantized_weight(quant_index.qdq_nodes[pair.dq_node], quant_index)
    if ref.shape != test.shape:
        if ref.size != test.size:
            raise ModelError(f"weight {pair.weight_name!r}: float shape {ref.shape} vs quantized shape {test.shape}")
        test = test.reshape(ref.shape)
    return ref, test
