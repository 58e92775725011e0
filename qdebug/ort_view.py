"""The float model as ONNX Runtime's quantizer will see it (:func:`quantizer_view`: Constant nodes made initializers,
the opset raised where the types need it, the nodes the version converter adds named), memoized by the model's
bytes; and ORT's quantizer logging held back (:func:`quiet_ort`), what matters kept for the result's notes.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import onnx

from qdebug.config import QUANT_TYPES, normalize_quant_type
from qdebug.graph_index import constants_to_initializers
from qdebug.io import temp_dir
from qdebug.ort import ort_log_severity

#: ORT's per-channel check on a 1-D weight (BatchNormalization's or LayerNormalization's scale, axis 1 asked): it
#: quantizes that weight per tensor instead, said once per norm of every such model; the report measures it as usual.
_RANK1_AXIS = re.compile(r"Axis -?\d+ is out-of-range for weight '.*' with rank 1$")


class _DropOrtAdvice(logging.Filter):
    """ORT logs a pre-processing advice on every call, and one warning per bias that is not an initializer (a real
    model can have dozens): noise on the user's terminal. The advice is dropped; the biases are collected for one
    note in the result."""

    def __init__(self) -> None:
        super().__init__()
        self.float_biases: list[str] = []
        self.other: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if msg.startswith("Expected bias '") and msg.endswith("' to be an initializer"):
            self.float_biases.append(msg.split("'")[1])
        elif "pre-process" in msg or "Automatically update the model to opset" in msg:
            pass  # advice the user cannot act on here: qdebug documents that 16-bit types raise the opset to 21
        elif _RANK1_AXIS.match(msg):
            pass  # a norm's 1-D scale under per-channel weights, quantized per tensor
        elif record.levelno >= logging.WARNING:
            self.other.append(msg.splitlines()[0] if msg else msg)
        else:
            return True
        return False

    def notes(self) -> list[str]:
        """One note for the biases ORT left in float."""
        notes = []
        b = sorted(set(self.float_biases))
        if b:
            more = f" and {len(b) - 3} more" if len(b) > 3 else ""
            notes.append(
                f"{len(b)} bias(es) are computed in the graph rather than stored as initializers and stay in float "
                f"(ONNX Runtime quantizes only initializer biases): {', '.join(b[:3])}{more}"
            )
        if self.other:  # one line for whatever else ORT's quantizer logged (it can be one line per tensor)
            more = f" (and {len(self.other) - 1} more)" if len(self.other) > 1 else ""
            notes.append(f"ONNX Runtime's quantizer warned: {self.other[0]}{more}")
        return notes


@contextlib.contextmanager
def quiet_ort() -> Any:
    """ORT's quantizer logs through Python's root logger and runs its own calibration sessions, whose C++ warnings
    (removed initializers, merged shapes) go to stderr: neither takes qdebug's session options. Both are held back
    here; what matters reaches the result's notes."""
    root = logging.getLogger()
    flt = _DropOrtAdvice()
    root.addFilter(flt)
    try:
        with ort_log_severity(3):
            yield flt
    finally:
        root.removeFilter(flt)


def _name_new_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Name the nodes ONNX's version converter adds without a name (from their first output, so the same model
    always gets the same names): overrides name their consumers in ``recv_nodes`` and ORT excludes nodes by name."""
    taken = {n.name for n in model.graph.node if n.name}
    for node in model.graph.node:
        if not node.name:
            stem = f"{node.output[0]}/{node.op_type}" if node.output else node.op_type
            # A lazy search: unpacking every candidate name per node dominated a re-quantization when the opset
            # converter left many nodes unnamed.
            name, k = stem, 0
            while name in taken:
                k += 1
                name = f"{stem}_{k}"
            node.name = name
            taken.add(name)
    return model


def quantizer_view(
    model: str | Path | onnx.ModelProto,
    weight_type: str,
    activation_types: Iterable[str],
    tensor_overrides: Mapping[str, Any] | None = None,
    *,
    per_channel: bool = False,
) -> onnx.ModelProto | None:
    """The float model as ONNX Runtime's quantizer will see it for these types, or ``None`` when ORT keeps it.

    ``quantize_static`` raises the opset where the types need it (16-bit Q/DQ: opset 21) with ONNX's version
    converter, which may add tensors and unnamed nodes (Softmax-12 becomes Flatten → Softmax → Reshape around
    ``<name>_intermediate``). Calibration, the mixed-precision fixer and the overrides check all read this one view
    (the added nodes named by :func:`_name_new_nodes`), so every name they use is one ORT will find.

    Constant nodes become initializers first (:func:`qdebug.graph_index.constants_to_initializers`, as
    :func:`~qdebug.quantizer.quantize` does), so the view has the weights ORT will quantize as weights.
    ``per_channel`` also raises an opset below 13 to 13: per-channel Q/DQ need its ``axis`` attribute, and ORT's
    quantizer would otherwise write a model ONNX Runtime cannot load (u2netp, opset 11)."""
    types = [normalize_quant_type(t) for t in activation_types]
    act = next((t for t in types if t.endswith("16")), types[0] if types else "uint8")
    # The view is a function of the model and of what decides ORT's opset (the types, whether an override is 16-bit,
    # per-channel): every step of a search asks for the same one, and making it (opset conversion, shape inference
    # twice) is slow on large models. Memoized by the model's bytes.
    data = Path(model).read_bytes() if isinstance(model, str | Path) else model.SerializeToString()
    weight = normalize_quant_type(weight_type)
    if len(data) > _VIEW_BYTES:  # not kept: memory
        return _make_view(model, weight, act, tensor_overrides, per_channel)
    # ORT reads the activation type and the overrides only for whether one is 16-bit (``update_opset_version``)
    wide = act.endswith("16") or _wants_16bit(tensor_overrides)
    key = (hashlib.sha256(data).hexdigest(), weight, wide, per_channel)
    if key not in _VIEWS:
        _VIEWS[key] = _make_view(model, weight, act, tensor_overrides, per_channel)
        while len(_VIEWS) > _VIEWS_KEPT:
            _VIEWS.pop(next(iter(_VIEWS)))
    view = _VIEWS[key]
    if view is None:
        return None
    copy = onnx.ModelProto()
    copy.CopyFrom(view)  # the caller's to change
    return copy


#: Views kept (:func:`quantizer_view`): a search needs three at most (the 8-bit base; the 16-bit one of the float
#: model the fixer reads and of the copy ``quantize`` hands to ORT).
_VIEWS_KEPT = 3
#: Larger models' views are made every time, not kept.
_VIEW_BYTES = 256 << 20
_VIEWS: dict[tuple[str, str, bool, bool], onnx.ModelProto | None] = {}


def _wants_16bit(overrides: Mapping[str, Any] | None) -> bool:
    """Whether an override (or its ``convert``) asks for a 16-bit type: what makes ORT raise the opset to 21
    (``update_opset_version`` reads the same two fields)."""
    for entries in (overrides or {}).values():
        for e in entries if isinstance(entries, list | tuple) else ():
            if not isinstance(e, Mapping):
                continue
            conv = e.get("convert")
            for qt in (e.get("quant_type"), conv.get("quant_type") if isinstance(conv, Mapping) else None):
                if qt is not None and str(getattr(qt, "name", qt)).lower().endswith("int16"):
                    return True
    return False


def _make_view(
    model: str | Path | onnx.ModelProto,
    weight_type: str,
    act: str,
    tensor_overrides: Mapping[str, Any] | None,
    per_channel: bool,
) -> onnx.ModelProto | None:
    """:func:`quantizer_view`, computed."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization.quant_utils import (
        get_opset_version,
        load_model_with_shape_infer,
        save_and_reload_model_with_shape_infer,
        update_opset_version,
    )

    with temp_dir(prefix="qdebug-view-") as tmp:
        path = Path(model) if isinstance(model, str | Path) else Path(tmp) / "float.onnx"
        if isinstance(model, onnx.ModelProto):
            onnx.save_model(model, str(path))
        loaded = load_model_with_shape_infer(path)  # as quantize_static loads it: the converter sees the shapes
        moved, _ = constants_to_initializers(loaded)  # as quantize() does first: Constant nodes are weights
        with quiet_ort():
            updated = update_opset_version(
                moved,
                QuantType[QUANT_TYPES[normalize_quant_type(weight_type)]],
                QuantType[QUANT_TYPES[act]],
                tensor_quant_overrides=dict(tensor_overrides) if tensor_overrides else None,
            )
        if per_channel and get_opset_version(updated) < PER_CHANNEL_OPSET:
            converted = onnx.version_converter.convert_version(updated, PER_CHANNEL_OPSET)
            updated = save_and_reload_model_with_shape_infer(converted)
    return None if updated is loaded else _name_new_nodes(updated)  # `moved` is `loaded` when nothing moved


#: The first opset whose QuantizeLinear/DequantizeLinear take an ``axis`` (per-channel quantization).
PER_CHANNEL_OPSET = 13
