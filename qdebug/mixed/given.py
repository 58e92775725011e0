"""The recipe of a QDQ model the user gave: its quantization settings and the calibration ranges behind its Q/DQ
parameters, so a re-quantization (a 16-bit promotion, a search point) starts from *that* model and not from
qdebug's defaults.

A QDQ model does not carry its calibration cache, but every activation's ``QuantizeLinear`` holds a scale and a zero
point, and ORT's own rule turns a range back into them: asymmetric ``scale = (rmax - rmin) / (qmax - qmin)``,
``zp = round(qmin - rmin / scale)``; symmetric ``scale = 2·absmax / (qmax - qmin)``, ``zp`` the midpoint. The
inverse used here (``rmin = (qmin - zp)·scale``, ``rmax = (qmax - zp)·scale``; ``±scale·(qmax - qmin)/2`` when
symmetric) gives back the same scale and zero point, so re-quantizing with these ranges and the inferred settings
reproduces the given model's activation grid.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from qdebug.config import QuantConfig
from qdebug.errors import ModelError
from qdebug.model_io import is_dq, is_q, load_model

#: ONNX element type → qdebug's quantization type name (the ones a QuantConfig can hold).
_TYPES: dict[int, str] = {
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT16: "uint16",
    onnx.TensorProto.INT16: "int16",
}
#: What ORT appends to a graph output's name when it quantizes that output.
ORT_OUTPUT_SUFFIX = "_QuantizeLinear_Input"
_BOUNDS = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767)}


@dataclass(frozen=True)
class GivenRecipe:
    """What a QDQ model says about how it was quantized.

    ``config`` holds the dominant activation type, the weight type, per-channel and symmetry; ``ranges`` maps each
    quantized activation (the float tensor a ``QuantizeLinear`` reads) to the ``(rmin, rmax)`` ORT turns back into
    that tensor's scale and zero point; ``notes`` says what could not be carried over.
    """

    config: QuantConfig
    ranges: Mapping[str, tuple[float, float]]
    notes: tuple[str, ...] = ()


def _const(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    out = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output and n.attribute:
            attr = next((a for a in n.attribute if a.name == "value"), None)
            if attr is not None:
                out[n.output[0]] = numpy_helper.to_array(attr.t)
    return out


def _qtype(node: onnx.NodeProto, consts: Mapping[str, np.ndarray], elem: Mapping[str, int]) -> str | None:
    """The quantized type of a Q (its zero point, else its output's type) or DQ (its input's type)."""
    if len(node.input) > 2 and node.input[2] in consts:
        return {np.dtype(k).name: k for k in _BOUNDS}.get(consts[node.input[2]].dtype.name)
    if is_dq(node):
        t = consts.get(node.input[0])
        if t is not None:
            return {np.dtype(k).name: k for k in _BOUNDS}.get(t.dtype.name)
    return _TYPES.get(int(elem.get(node.output[0] if is_q(node) else node.input[0], -1)))


def symmetric_zero_point(qtype: str) -> int:
    """The zero point of a symmetric range for ``qtype`` (0 signed, the midpoint unsigned)."""
    lo, hi = _BOUNDS[qtype]
    return 0 if lo < 0 else (hi + 1) // 2


def range_of(scale: float, zero_point: int, qtype: str, symmetric: bool) -> tuple[float, float]:
    """The calibration range ORT maps back to exactly this ``scale`` and ``zero_point`` (module docstring)."""
    lo, hi = _BOUNDS[qtype]
    if symmetric:
        half = scale * (hi - lo) / 2
        return -half, half
    return (lo - zero_point) * scale, (hi - zero_point) * scale


def read_recipe(model: str | Path | onnx.ModelProto, target: str = "cpu") -> GivenRecipe:
    """The settings and activation ranges of the QDQ ``model`` (see :class:`GivenRecipe`); a model without any
    ``QuantizeLinear`` on an activation is a :class:`~qdebug.errors.ModelError`."""
    m = model if isinstance(model, onnx.ModelProto) else load_model(model, "quantized model")
    consts = _const(m)
    elem = {v.name: v.type.tensor_type.elem_type for v in (*m.graph.value_info, *m.graph.input, *m.graph.output)}
    acts: dict[str, tuple[float, int, str]] = {}
    weights: list[tuple[str, bool, bool]] = []  # (type, per channel, symmetric)
    for n in m.graph.node:
        qtype = _qtype(n, consts, elem) if (is_q(n) or is_dq(n)) else None
        if qtype is None or n.input[1] not in consts:
            continue
        scale = consts[n.input[1]]
        zp = consts[n.input[2]] if len(n.input) > 2 and n.input[2] in consts else np.zeros_like(scale, dtype=np.int64)
        if is_q(n) and n.input[0] not in consts and scale.size == 1:
            acts[n.input[0]] = (float(scale.reshape(-1)[0]), int(np.asarray(zp).reshape(-1)[0]), qtype)
        elif is_dq(n) and n.input[0] in consts:
            sym = bool(np.all(np.asarray(zp).astype(np.int64) == symmetric_zero_point(qtype)))
            weights.append((qtype, scale.size > 1, sym))
    if not acts:
        label = "the model" if isinstance(model, onnx.ModelProto) else str(model)
        raise ModelError(f"{label}: no QuantizeLinear on an activation, so no quantization settings to reuse")
    act_types = Counter(t for _, _, t in acts.values())
    act_type = act_types.most_common(1)[0][0]
    act_sym = all(zp == symmetric_zero_point(t) for _, zp, t in acts.values())
    notes = []
    if len(act_types) > 1:
        notes.append(
            "the given model mixes activation types ("
            + ", ".join(f"{n}× {t}" for t, n in act_types.most_common())
            + f"); re-quantizations use {act_type} for every activation not promoted"
        )
    w_type = Counter(t for t, _, _ in weights).most_common(1)[0][0] if weights else act_type
    per_channel = any(pc for _, pc, _ in weights)
    w_sym = all(s for _, _, s in weights) if weights else None
    config = QuantConfig(
        activation_type=act_type,
        weight_type=w_type,
        per_channel=per_channel,
        activation_symmetric=act_sym,
        weight_symmetric=w_sym,
        target=target,
    )
    ranges = {name: range_of(s, zp, t, act_sym) for name, (s, zp, t) in acts.items()}
    # ORT renames a quantized graph output ``y`` to ``y_QuantizeLinear_Input`` inside the QDQ model; the float
    # model (and the calibration cache) call it ``y``.
    outputs = {o.name for o in m.graph.output}
    for name in list(ranges):
        plain = name.removesuffix(ORT_OUTPUT_SUFFIX)
        if plain != name and plain in outputs:
            ranges[plain] = ranges[name]
    return GivenRecipe(config, ranges, tuple(notes))


def overlay_ranges(cache: str | Path, ranges: Mapping[str, tuple[float, float]], out: str | Path) -> Path:
    """A copy of ORT's calibration cache ``cache`` at ``out`` whose tensors named in ``ranges`` take those ranges
    (the other tensors, e.g. those the given model left in float, keep their calibrated ranges)."""
    from onnxruntime.quantization.calibrate import TensorData, load_tensors_data, save_tensors_data

    from qdebug.io import atomic_write_bytes

    data = load_tensors_data(str(cache))
    merged = dict(data.data)
    for name, (lo, hi) in ranges.items():
        merged[name] = TensorData(lowest=np.float32(lo), highest=np.float32(hi))
    tmp = Path(out).with_suffix(".tmp.json")
    save_tensors_data(type(data)(data.calibration_method, merged), str(tmp))
    try:
        return atomic_write_bytes(Path(out), tmp.read_bytes())
    finally:
        tmp.unlink(missing_ok=True)


__all__ = ["GivenRecipe", "overlay_ranges", "range_of", "read_recipe", "symmetric_zero_point"]
