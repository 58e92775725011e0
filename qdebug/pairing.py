"""ONNX graph helpers: loading with clear errors, model kinds, input specs, topological order,
constants, and the float↔quant pairing that walks QuantizeLinear→DequantizeLinear chains.

Pairing is structural: an activation is quantized where a QuantizeLinear (default or
``com.microsoft`` domain, any bit width) reads a float tensor and a DequantizeLinear reads the Q's
output; the pre-QDQ tensor keeps the float model's name because the quantizer inserts Q/DQ *after*
the producer. Weights are DequantizeLinear nodes fed by an integer constant (initializer or
``Constant`` node); their float counterpart is the same input of the consuming node's float twin: the
node of that name, else the node of the same op reading the same float activations in the same slots
with float weights of the same size (several such nodes: the one whose weights the dequantized ones
are closest to), never a name suffix.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from qdebug.errors import InputFileError, ModelError
from qdebug.io import open_input

QDQ_DOMAINS = ("", "ai.onnx", "com.microsoft")
QOPERATOR_OPS = frozenset(
    {
        "QLinearConv", "QLinearMatMul", "QGemm", "QLinearAdd", "QLinearMul", "QLinearSigmoid",
        "QLinearLeakyRelu", "QLinearConcat", "QLinearAveragePool", "QLinearGlobalAveragePool",
        "QLinearSoftmax", "QAttention", "QLinearWhere", "QEmbedLayerNormalization", "QLinearReduceMean",
        "QLinearConvTranspose",
    }
)  # fmt: skip
DYNAMIC_QUANT_OPS = frozenset(
    {"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul",
     "DynamicQuantizeLSTM", "MatMulIntegerToFloat"}
)  # fmt: skip
FLOAT_DTYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                          onnx.TensorProto.BFLOAT16})  # fmt: skip
_INT_TYPE_NAMES = {
    np.dtype(np.uint8): "uint8", np.dtype(np.int8): "int8", np.dtype(np.uint16): "uint16",
    np.dtype(np.int16): "int16", np.dtype(np.int32): "int32", np.dtype(np.uint32): "uint32",
}  # fmt: skip


class ModelKind(StrEnum):
    """What quantization, if any, a model carries."""

    FLOAT = "float"
    QDQ = "qdq"
    QOPERATOR = "qoperator"
    DYNAMIC = "dynamic"


def is_q(node: onnx.NodeProto) -> bool:
    """A QuantizeLinear of either domain."""
    return node.op_type == "QuantizeLinear" and node.domain in QDQ_DOMAINS


def is_dq(node: onnx.NodeProto) -> bool:
    """A DequantizeLinear of either domain."""
    return node.op_type == "DequantizeLinear" and node.domain in QDQ_DOMAINS


def file_sha256(path: str | Path) -> str:
    """Checksum of a file, streamed."""
    h = hashlib.sha256()
    with open_input(path) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_model(path: str | Path, role: str = "model") -> onnx.ModelProto:
    """Load an ONNX file (with its external data) or raise :class:`InputFileError` naming it.

    The file is only read, never rewritten.
    """
    p = Path(path)
    # by name, as onnx.load would: a .json/.txtpb name is a text format
    fmt = onnx.serialization.registry.get_format_from_file_extension(p.suffix) or "protobuf"
    with open_input(p, role) as fh:  # a FIFO, device, folder, link loop or overlong name: one line, never a hang
        data = fh.read()
    try:
        model = onnx.load_model_from_string(data, format=fmt)
    except Exception as exc:  # protobuf raises several unrelated types on garbage
        raise InputFileError(f"{role} {p}: not a valid ONNX file ({type(exc).__name__}: {exc})") from exc
    if model.ir_version <= 0 or not model.opset_import or len(model.graph.node) == 0:
        raise InputFileError(f"{role} {p}: not a valid ONNX model (no IR version, opset or nodes)")
    bad_text = _non_utf8_field(model, "model")
    if bad_text is not None:
        raise InputFileError(f"{role} {p}: not a valid ONNX model ({bad_text} is not UTF-8 text)")
    if not model.graph.output:  # ORT loads it, then every command fails later and unclearly (or "succeeds")
        raise ModelError(f"{role} {p}: the graph has no outputs; nothing can be computed or compared")
    if any(_is_external(t) for t in _all_tensors(model)):
        try:
            onnx.external_data_helper.load_external_data_for_model(model, str(p.parent))
        except (OSError, ValueError, onnx.checker.ValidationError) as exc:  # a missing file is the latter
            raise InputFileError(f"{role} {p}: cannot read its external data: {exc}") from exc
    return model


def _non_utf8_field(msg: Any, where: str) -> str | None:
    """The first string field (name, input, op type, ...) that is not UTF-8, as a path like
    ``model.graph.node[2].name``, else ``None``. ONNX's protos are proto2, so the parser accepts such bytes and hands
    them over as ``bytes`` where every reader expects ``str`` (a crash far from the file). Tensor data are not
    visited (only string and message fields are read)."""
    for fd in msg.DESCRIPTOR.fields:
        if fd.type == fd.TYPE_STRING:
            value = getattr(msg, fd.name)
            values = [value] if isinstance(value, str | bytes) else value
            if any(isinstance(v, bytes) for v in values):
                return f"{where}.{fd.name}"
        elif fd.type == fd.TYPE_MESSAGE:
            value = getattr(msg, fd.name)
            single = hasattr(value, "DESCRIPTOR")  # a message, not a repeated container of them
            items = ([value] if msg.HasField(fd.name) else []) if single else list(value)
            for i, item in enumerate(items):
                found = _non_utf8_field(item, f"{where}.{fd.name}" + ("" if single else f"[{i}]"))
                if found is not None:
                    return found
    return None


def _is_external(t: onnx.TensorProto) -> bool:
    return t.HasField("data_location") and t.data_location == onnx.TensorProto.EXTERNAL


def _all_tensors(model: onnx.ModelProto) -> Iterable[onnx.TensorProto]:
    yield from model.graph.initializer
    for node in model.graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield a.t


def model_kind(model: onnx.ModelProto) -> ModelKind:
    """Classify a model by the quantization operators it contains."""
    ops = {n.op_type for n in model.graph.node}
    if ops & QOPERATOR_OPS:
        return ModelKind.QOPERATOR
    if ops & DYNAMIC_QUANT_OPS:
        return ModelKind.DYNAMIC
    if any(is_q(n) or is_dq(n) for n in model.graph.node):
        return ModelKind.QDQ
    return ModelKind.FLOAT


@dataclass(frozen=True)
class InputSpec:
    """One graph input: name, shape (int for static dims, str/None for dynamic ones) and dtype."""

    name: str
    shape: tuple[int | str | None, ...]
    dtype: np.dtype[Any]

    @property
    def is_static(self) -> bool:
        """True when every dimension is a fixed positive integer."""
        return all(isinstance(d, int) and d > 0 for d in self.shape)


def input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    """The model's real inputs (graph inputs that are not initializers)."""
    inits = {i.name for i in model.graph.initializer}
    specs = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims: list[int | str | None] = []
        for d in tt.shape.dim:
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param"):
                dims.append(d.dim_param)
            else:
                dims.append(None)
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)) if tt.elem_type else np.dtype(np.float32)
        specs.append(InputSpec(vi.name, tuple(dims), dtype))
    return specs


def topological_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Nodes in a topological order (the stored order when it already is one)."""
    nodes = list(graph.node)
    available = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    ok = True
    seen = set(available)
    for n in nodes:
        if any(i not in seen for i in n.input):
            ok = False
            break
        seen.update(n.output)
    if ok:
        return nodes
    # Kahn's algorithm, stable with respect to the stored order.
    producers = {o: idx for idx, n in enumerate(nodes) for o in n.output}
    deps = [{producers[i] for i in n.input if i in producers and i not in available} for n in nodes]
    done: set[int] = set()
    order: list[onnx.NodeProto] = []
    while len(order) < len(nodes):
        progressed = False
        for idx, n in enumerate(nodes):
            if idx not in done and deps[idx] <= done:
                done.add(idx)
                order.append(n)
                progressed = True
        if not progressed:
            raise ModelError(f"graph {graph.name!r} has a cycle or reads tensors nothing produces")
    return order


def constant_values(model: onnx.ModelProto) -> dict[str, onnx.TensorProto | onnx.NodeProto]:
    """Where each constant tensor lives: initializers and ``Constant`` node outputs (decoded lazily)."""
    out: dict[str, onnx.TensorProto | onnx.NodeProto] = {i.name: i for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.domain in QDQ_DOMAINS:
            out[n.output[0]] = n
    return out


def decode_constant(c: onnx.TensorProto | onnx.NodeProto) -> np.ndarray:
    """Decode an initializer or a ``Constant`` node's value to numpy (a tensor that cannot be decoded — an
    undefined or unknown element type, data that do not fit its shape — is a :class:`ModelError` naming it)."""
    if isinstance(c, onnx.TensorProto):
        return _to_array(c, c.name)
    for a in c.attribute:
        if a.name == "value":
            return _to_array(a.t, c.output[0] if c.output else c.name)
        if a.name == "value_float":
            return np.array(a.f, dtype=np.float32)
        if a.name == "value_floats":
            return np.array(list(a.floats), dtype=np.float32)
        if a.name == "value_int":
            return np.array(a.i, dtype=np.int64)
        if a.name == "value_ints":
            return np.array(list(a.ints), dtype=np.int64)
    raise ModelError(f"Constant node {c.name or c.output[0]!r} has no supported value attribute")


def constants_to_initializers(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """The model with its top-level ``Constant`` nodes turned into initializers of the same name (the input is
    never modified), and the names moved.

    ONNX Runtime's QDQ quantizer treats a ``Constant`` node's output as an activation: a Conv weight exported that
    way (paddle2onnx writes every constant so) gets a calibrated per-tensor activation Q/DQ instead of the weight
    type, and Resize's ``scales`` get rounded (2.0 comes back as 1.99 and the model no longer runs). As initializers
    they are weights, as ORT's own ``quant_pre_process`` would make them. String and sparse constants stay nodes.
    """
    movable = [
        n
        for n in model.graph.node
        if n.op_type == "Constant"
        and n.domain in QDQ_DOMAINS
        and len(n.output) == 1
        and any(a.name in _DENSE_CONSTANT_ATTRS for a in n.attribute)
        and not any(a.name == "value" and a.t.data_type == onnx.TensorProto.STRING for a in n.attribute)
    ]
    if not movable:
        return model, []
    m = onnx.ModelProto()
    m.CopyFrom(model)
    moved = {n.output[0] for n in movable}
    kept = [n for n in m.graph.node if not (n.op_type == "Constant" and n.output and n.output[0] in moved)]
    by_name = {n.output[0]: n for n in movable}
    tensors = []
    for name in [n.output[0] for n in movable]:
        value = next((a.t for a in by_name[name].attribute if a.name == "value"), None)
        if value is not None:  # the tensor as it is (its exact type and bytes)
            t = onnx.TensorProto()
            t.CopyFrom(value)
            t.name = name
        else:
            t = numpy_helper.from_array(decode_constant(by_name[name]), name)
        tensors.append(t)
    del m.graph.node[:]
    m.graph.node.extend(kept)
    m.graph.initializer.extend(tensors)
    if m.ir_version < 4:  # before IR 4 every initializer must also be a graph input
        m.graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in tensors)
    return m, sorted(moved)


_DENSE_CONSTANT_ATTRS = frozenset({"value", "value_float", "value_floats", "value_int", "value_ints"})


def _to_array(t: onnx.TensorProto, name: str) -> np.ndarray:
    try:
        return numpy_helper.to_array(t)
    except (TypeError, ValueError, KeyError) as exc:  # onnx raises these on an unknown type or a size mismatch
        raise ModelError(f"constant {name!r} cannot be decoded: {exc}") from exc


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
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
        out_dtype = _attr(node, "output_dtype", 0)
        qtype = quant_type_name(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(out_dtype))) if out_dtype else "uint8"
    per_tensor = scale is not None and scale.size == 1
    return QuantParams(
        quant_type=qtype,
        domain=node.domain or "ai.onnx",
        scale=float(scale.reshape(-1)[0]) if per_tensor and scale is not None else None,
        zero_point=int(zp.reshape(-1)[0]) if per_tensor and zp is not None else (0 if per_tensor else None),
        axis=None if per_tensor else _attr(node, "axis", 1),
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


def light_model(
    model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]] | None = None, keep_values: int = 4096
) -> onnx.ModelProto:
    """The model for shape and type inference: initializers of more than ``keep_values`` values become typed graph
    inputs (inference serializes the whole model: MiniLM's 69 MB took 0.26 s for its types alone), inputs named in
    ``shapes`` are pinned to them. Small initializers stay: ONNX's data propagation reads them (Reshape's shape)."""
    g = model.graph
    light = onnx.helper.make_graph([], g.name, [], list(g.output))
    light.node.extend(g.node)
    for i in g.input:
        vi = onnx.ValueInfoProto()
        vi.CopyFrom(i)
        if shapes is not None and i.name in shapes and vi.type.HasField("tensor_type"):
            dims = vi.type.tensor_type.shape
            dims.ClearField("dim")
            for d in shapes[i.name]:
                dims.dim.add().dim_value = int(d)
        light.input.append(vi)
    inputs = {i.name for i in g.input}
    for t in g.initializer:
        if int(np.prod(t.dims)) <= keep_values:
            light.initializer.append(t)
        elif t.name not in inputs:
            light.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    out = onnx.helper.make_model(light, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    out.functions.extend(model.functions)
    return out


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


def _check_kinds(float_model: onnx.ModelProto, quant_model: onnx.ModelProto) -> None:
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
        deq = {k: _dequantized(weights[i].dq, s.q).reshape(-1) for k, i in enumerate(c.input) if i in weights}
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


#: Ops whose output holds exactly the values of their first input, rearranged (same min/max/histogram): a
#: calibrated range or a promotion crosses them unchanged in either direction.
VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose"})


class GraphIndex:
    """The one index of a model snapshot, built once: nodes in topological order, each tensor's producer (and its
    position) and consumers, constant values (initializers and Constant nodes), Q/DQ nodes, graph inputs and
    outputs. Every pass and analysis reads these maps instead of building its own."""

    def __init__(self, model: onnx.ModelProto) -> None:
        g = model.graph
        self.model = model
        self.consts = constant_values(model)
        self.nodes = topological_nodes(g)
        self.position = {o: idx for idx, n in enumerate(self.nodes) for o in n.output if o}
        self.producer = {o: n for n in self.nodes for o in n.output if o}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for n in self.nodes:
            for i in n.input:
                self.consumers[i].append(n)
        self.qdq_nodes = {(n.name or n.output[0]): n for n in self.nodes if is_dq(n) or is_q(n)}
        initializers = {t.name for t in g.initializer}
        self.inputs = tuple(i.name for i in g.input if i.name not in initializers)
        self.outputs = tuple(o.name for o in g.output)

    def value(self, name: str) -> np.ndarray:
        """Decoded value of a constant tensor."""
        return decode_constant(self.consts[name])

    def consumers_of(self, name: str) -> list[onnx.NodeProto]:
        """The nodes reading ``name`` (in topological order; empty for a tensor nothing reads)."""
        return self.consumers.get(name, [])

    def distinct_consumers(self, name: str) -> list[onnx.NodeProto]:
        """The nodes reading ``name``, each once (a node reading it in two slots is listed once)."""
        # By identity: NodeProto equality compares contents, and two distinct nodes may be equal.
        return list({id(n): n for n in self.consumers_of(name)}.values())

    def sole_consumer(self, name: str) -> onnx.NodeProto | None:
        """The one node reading ``name``, if exactly one does (and it is not a graph output)."""
        users = self.consumers_of(name)
        return users[0] if len(users) == 1 and name not in self.outputs else None

    def set_input(self, node: onnx.NodeProto, slot: int, name: str) -> None:
        """Make ``node`` (one of this index's nodes) read ``name`` in input ``slot``, keeping the consumer lists
        right. Why: a rewrite that redirects inputs one by one (the Deeploy scale snapping gives a scale tensor its
        own copy) asks "who else reads this?" after earlier redirects; rebuilding the index each time is quadratic."""
        old = node.input[slot]
        if old == name:
            return
        users = self.consumers.get(old, [])
        for k, u in enumerate(users):
            if u is node:
                del users[k]
                break
        node.input[slot] = name
        self.consumers[name].append(node)

    def activations(self) -> list[str]:
        """Graph inputs, then every non-constant node output, in topological order."""
        return [*self.inputs, *(o for n in self.nodes if n.op_type != "Constant" for o in n.output if o)]


def weight_arrays(pair: WeightPair, float_index: GraphIndex, quant_index: GraphIndex) -> tuple[np.ndarray, np.ndarray]:
    """(float weight, dequantized weight) as float64 arrays of the same shape."""
    ref = float_index.value(pair.weight_name).astype(np.float64)
    test = _dequantized(quant_index.qdq_nodes[pair.dq_node], quant_index)
    if ref.shape != test.shape:
        if ref.size != test.size:
            raise ModelError(f"weight {pair.weight_name!r}: float shape {ref.shape} vs quantized shape {test.shape}")
        test = test.reshape(ref.shape)
    return ref, test


def _dequantized(dq: onnx.NodeProto, quant_index: GraphIndex) -> np.ndarray:
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
            _attr(qnode, "axis", 1),
        )
    scale = quant_index.value(dq.input[1])
    zp = quant_index.value(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
    return dequantize(q_val, scale, zp, _attr(dq, "axis", 1), _attr(dq, "block_size", 0))


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
