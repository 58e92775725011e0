"""Reading an ONNX model with clear errors, and its first facts: the file's checksum, the model's kind (float, QDQ,
QOperator, dynamic), its real inputs, and which nodes are QuantizeLinear / DequantizeLinear.

A file that cannot be a model (not ONNX, no opset or nodes, non-UTF-8 names, unreadable external data, no outputs)
is refused here in one line naming it, so nothing downstream meets it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import onnx

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
        # protobuf's own words ("DecodeError: Wire format was corrupt") say nothing to a user; a text format's parse
        # error names the line, so it is kept
        why = "its bytes are not an ONNX model: truncated, or another format" if fmt == "protobuf" else str(exc)
        raise InputFileError(f"{role} {p}: not a valid ONNX file ({why})") from exc
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
