"""Promote tensors of a QDQ model the user gave by rewriting its own Q/DQ pairs, keeping every other byte.

Re-quantizing the float model with the given model's ranges does not give the given model back (ORT's quantizer
makes its own weight, bias and node choices), so a promotion measured that way mixes the promotion's effect with a
re-quantization's. Here a promotion is a patch of the user's model: the promoted tensor's ``QuantizeLinear`` and
the ``DequantizeLinear`` nodes reading it take a 16-bit scale and zero point derived from the user's own 8-bit ones
(the same range on a finer grid: for uint8 → uint16 ``scale / 257`` and ``zero_point · 257``, so every 8-bit level
is a 16-bit level), and every other node and initializer is left as it was. A ``convert`` entry (ORT's type
conversion at a region's border) becomes a Q/DQ pair in the consumers' type in front of those consumers, on the
user's own grid when that type is the one the user's model used. Patching nothing gives the model back unchanged.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qdebug.config import Overrides, TensorOverride
from qdebug.errors import ConfigError
from qdebug.graph_index import unique_name
from qdebug.mixed.given import ORT_OUTPUT_SUFFIX
from qdebug.model_io import is_dq, is_q

#: Each quantization type's integer range.
BOUNDS: dict[str, tuple[int, int]] = {
    "uint8": (0, 255),
    "int8": (-128, 127),
    "uint16": (0, 65535),
    "int16": (-32768, 32767),
}
_NP = {"uint8": np.uint8, "int8": np.int8, "uint16": np.uint16, "int16": np.int16}
#: Opset from which ``ai.onnx`` Q/DQ take 16-bit types (below it ORT's ``com.microsoft`` Q/DQ do).
WIDE_QDQ_OPSET = 21


@dataclass(frozen=True)
class QParams:
    """One activation's quantization: scale, zero point and type."""

    scale: float
    zero_point: int
    quant_type: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"scale": self.scale, "zero_point": self.zero_point, "quant_type": self.quant_type}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> QParams:
        """Inverse of :meth:`to_dict`."""
        return cls(float(d["scale"]), int(d["zero_point"]), str(d["quant_type"]))

    @property
    def range(self) -> tuple[float, float]:
        """The real values the grid spans."""
        lo, hi = BOUNDS[self.quant_type]
        return (lo - self.zero_point) * self.scale, (hi - self.zero_point) * self.scale


@dataclass(frozen=True)
class TensorPatch:
    """What the patch changed for one tensor: its parameters before and after, and the consumers converted."""

    tensor: str
    before: QParams
    after: QParams
    converted_for: tuple[str, ...] = ()
    convert: QParams | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "tensor": self.tensor,
            "before": self.before.to_dict(),
            "after": self.after.to_dict(),
            "converted_for": list(self.converted_for),
            "convert": None if self.convert is None else self.convert.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TensorPatch:
        """Inverse of :meth:`to_dict`."""
        conv = d.get("convert")
        return cls(
            str(d["tensor"]),
            QParams.from_dict(d["before"]),
            QParams.from_dict(d["after"]),
            tuple(d.get("converted_for", ())),
            None if conv is None else QParams.from_dict(conv),
        )

    def describe(self) -> str:
        """One line: the tensor, its grid before → after, and the consumers kept on the old type."""
        b, a = self.before, self.after
        line = (
            f"{self.tensor}: {b.quant_type} (scale {b.scale:.6g}, zp {b.zero_point}) → {a.quant_type} "
            f"(scale {a.scale:.6g}, zp {a.zero_point})"
        )
        if self.convert is not None:
            line += f"; read as {self.convert.quant_type} by {', '.join(self.converted_for) or 'all consumers'}"
        return line


@dataclass(frozen=True)
class PatchResult:
    """A patched model and what changed (:attr:`patches` empty: the model is the given one, unchanged)."""

    model: onnx.ModelProto
    patches: tuple[TensorPatch, ...]
    #: overridden tensors the model does not quantize (left in float, e.g. an Add fused with the Relu after it)
    skipped: tuple[str, ...] = ()

    def describe(self) -> str:
        """What changed, one line per tensor."""
        tail = [f"  {t}: not quantized in your model (stays float), left as it is" for t in self.skipped]
        if not self.patches:
            return "\n".join(["nothing changed: the model is yours, byte for byte", *tail])
        head = f"{len(self.patches)} tensor(s) re-gridded in your model; every other Q/DQ is unchanged:"
        return "\n".join([head, *(f"  {p.describe()}" for p in self.patches), *tail])


def widened(p: QParams, to: str) -> QParams:
    """``p``'s range on ``to``'s grid: every level of ``p`` is a level of the result when ``to`` is wider.

    A signed symmetric grid (zero point 0) stays symmetric (scale divided by the ratio of the half ranges); any other
    maps its end points onto ``to``'s end points (scale divided by the ratio of the spans, zero point moved with it).
    """
    lo, hi = BOUNDS[p.quant_type]
    nlo, nhi = BOUNDS[to]
    if p.zero_point == 0 and lo < 0 and nlo < 0:
        return QParams(p.scale * (-lo) / (-nlo), 0, to)
    scale = p.scale * (hi - lo) / (nhi - nlo)
    zp = int(np.clip(round(nlo + (p.zero_point - lo) * (nhi - nlo) / (hi - lo)), nlo, nhi))
    return QParams(scale, zp, to)


def _from_range(rmin: float, rmax: float, to: str) -> QParams:
    """ORT's asymmetric rule: the range (widened to hold 0) onto ``to``'s grid."""
    lo, hi = BOUNDS[to]
    rmin, rmax = min(rmin, 0.0), max(rmax, 0.0)
    scale = (rmax - rmin) / (hi - lo) if rmax > rmin else 1.0
    return QParams(scale, int(np.clip(round(lo - rmin / scale), lo, hi)), to)


def target_params(before: QParams, entry: TensorOverride) -> QParams:
    """The parameters an override entry asks for: its scale and zero point, else its range, else ``before`` on the
    entry's type's grid (:func:`widened`)."""
    to = entry.quant_type or before.quant_type
    if entry.scale is not None and entry.zero_point is not None:
        return QParams(float(entry.scale), int(entry.zero_point), to)
    if entry.rmin is not None and entry.rmax is not None:
        return _from_range(entry.rmin, entry.rmax, to)
    return before if to == before.quant_type else widened(before, to)


class _Graph:
    """The look-ups a patch needs over one model (built once)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        g = model.graph
        self.inits = {i.name: i for i in g.initializer}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in g.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.q_of: dict[str, onnx.NodeProto] = {}
        for n in g.node:
            if is_q(n) and n.input[0] not in self.inits:
                self.q_of.setdefault(n.input[0], n)
        outputs = {o.name for o in g.output}
        for name in list(self.q_of):  # a quantized graph output is named y_QuantizeLinear_Input inside the model
            plain = name.removesuffix(ORT_OUTPUT_SUFFIX)
            if plain != name and plain in outputs:
                self.q_of.setdefault(plain, self.q_of[name])
        self.order = {n.output[0]: i for i, n in enumerate(g.node) if n.output}
        self.names = {o for n in g.node for o in n.output} | set(self.inits) | {i.name for i in g.input}

    def params(self, q: onnx.NodeProto) -> QParams:
        missing = [i for i in q.input[1:] if i and i not in self.inits]
        if missing:
            raise ConfigError(f"{q.input[0]}: its QuantizeLinear reads {missing[0]!r}, not an initializer: not patched")
        scale = numpy_helper.to_array(self.inits[q.input[1]]).reshape(-1)
        if scale.size != 1:
            raise ConfigError(f"{q.input[0]}: its QuantizeLinear is per-axis; only per-tensor activations are patched")
        if len(q.input) > 2 and q.input[2]:
            zp = numpy_helper.to_array(self.inits[q.input[2]])
            return QParams(float(scale[0]), int(zp.reshape(-1)[0]), np.dtype(zp.dtype).name)
        return QParams(float(scale[0]), 0, "uint8")  # ONNX's default zero point is a uint8 0

    def fresh(self, base: str) -> str:
        return unique_name(base, self.names)

    def constants(self, tensor: str, p: QParams, scale_dtype: np.dtype[Any]) -> tuple[str, str]:
        """New scale and zero-point initializers for ``p`` (the old ones may be shared: they are never edited)."""
        s = self.fresh(f"{tensor}_scale_{p.quant_type}")
        z = self.fresh(f"{tensor}_zero_point_{p.quant_type}")
        self.model.graph.initializer.extend([
            numpy_helper.from_array(np.array(p.scale, dtype=scale_dtype), s),
            numpy_helper.from_array(np.array(p.zero_point, dtype=_NP[p.quant_type]), z),
        ])  # fmt: skip
        return s, z


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _wide_domain(model: onnx.ModelProto, node: onnx.NodeProto, quant_type: str) -> None:
    """A 16-bit Q/DQ below opset 21 runs as ORT's ``com.microsoft`` op (what ORT's quantizer writes)."""
    if quant_type.endswith("16") and _opset(model) < WIDE_QDQ_OPSET and node.domain in ("", "ai.onnx"):
        node.domain = "com.microsoft"
        if not any(o.domain == "com.microsoft" for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid("com.microsoft", 1))


def _set_type(model: onnx.ModelProto, name: str, quant_type: str) -> None:
    for vi in model.graph.value_info:
        if vi.name == name:
            vi.type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(_NP[quant_type]))


def _regrid(g: _Graph, tensor: str, q: onnx.NodeProto, p: QParams) -> list[onnx.NodeProto]:
    """Point ``q`` and the DQ nodes reading it at new constants for ``p``; returns those DQ nodes."""
    scale_dtype = numpy_helper.to_array(g.inits[q.input[1]]).dtype
    s, z = g.constants(tensor, p, scale_dtype)
    dqs = [n for n in g.consumers.get(q.output[0], []) if is_dq(n)]
    for n in (q, *dqs):
        del n.input[1:]
        n.input.extend([s, z])
        _wide_domain(g.model, n, p.quant_type)
    _set_type(g.model, q.output[0], p.quant_type)
    return dqs


def _convert(
    g: _Graph, tensor: str, dqs: list[onnx.NodeProto], p: QParams, recv: tuple[str, ...] | None
) -> tuple[list[str], list[onnx.NodeProto]]:
    """A Q/DQ pair on ``p``'s grid in front of the consumers ``recv`` (every consumer when ``None``) of ``dqs``:
    the consumers rewired and the new nodes (to insert after the last of ``dqs``)."""
    scale_dtype = np.dtype(np.float32)
    s, z = g.constants(f"{tensor}_convert", p, scale_dtype)
    done: list[str] = []
    new_nodes: list[onnx.NodeProto] = []
    for dq in dqs:
        users = [n for n in g.consumers.get(dq.output[0], []) if recv is None or n.name in recv]
        if not users:
            continue
        qn, dqn = g.fresh(f"{tensor}_convert_q"), g.fresh(f"{tensor}_convert_dq")
        qo, dqo = g.fresh(f"{qn}_out"), g.fresh(f"{dqn}_out")
        q = helper.make_node("QuantizeLinear", [dq.output[0], s, z], [qo], name=qn)
        d = helper.make_node("DequantizeLinear", [qo, s, z], [dqo], name=dqn)
        for n in (q, d):
            _wide_domain(g.model, n, p.quant_type)
        new_nodes += [q, d]
        for u in users:
            for i, name in enumerate(u.input):
                if name == dq.output[0]:
                    u.input[i] = dqo
            done.append(u.name)
    return sorted(set(done)), new_nodes


def _insert(model: onnx.ModelProto, after: Mapping[str, list[onnx.NodeProto]]) -> None:
    """Insert each list of new nodes right after the node whose first output names it (the graph stays sorted)."""
    if not after:
        return
    nodes: list[onnx.NodeProto] = []
    for n in model.graph.node:
        nodes.append(copy.deepcopy(n))
        nodes.extend(after.get(n.output[0], []) if n.output else [])
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def quantized_tensors(model: onnx.ModelProto) -> frozenset[str]:
    """The activation tensors ``model`` quantizes (a ``QuantizeLinear`` on them): the only ones a patch can promote;
    any other is kept in float by the model and :func:`patch_model` leaves it as it is."""
    return frozenset(_Graph(model).q_of)


def patch_model(model: onnx.ModelProto, overrides: Overrides, *, skip_float: bool = False) -> PatchResult:
    """``model`` (a QDQ model) with the activation ``overrides`` applied to its own Q/DQ pairs (module docstring).

    Every overridden tensor must have a per-tensor ``QuantizeLinear`` in ``model`` (a :class:`ConfigError` names the
    first that has not), or with ``skip_float`` is left as it is and named in :attr:`PatchResult.skipped` (a tensor
    the model keeps in float is finer than 16 bits already); an entry that asks for nothing new leaves its tensor as
    it is. ``model`` is not modified.
    """
    if not overrides:
        return PatchResult(model, ())
    out = copy.deepcopy(model)
    g = _Graph(out)
    missing = [t for t, _ in overrides if t not in g.q_of]
    if skip_float:
        overrides = tuple((t, es) for t, es in overrides if t in g.q_of)
    elif missing:
        raise ConfigError(
            f"cannot patch {missing[0]!r}: the quantized model has no QuantizeLinear on it"
            + (f" (nor on {len(missing) - 1} other tensor(s))" if len(missing) > 1 else "")
        )
    patches = []
    inserted: dict[str, list[onnx.NodeProto]] = {}
    for tensor, entries in overrides:
        q = g.q_of[tensor]
        before = g.params(q)
        entry = entries[0]
        after = target_params(before, entry)
        if after == before and entry.convert is None:
            continue
        dqs = _regrid(g, tensor, q, after) if after != before else [n for n in g.consumers[q.output[0]] if is_dq(n)]
        conv: QParams | None = None
        converted: tuple[str, ...] = ()
        if entry.convert is not None:
            c = entry.convert.quant_type
            conv = before if c == before.quant_type else widened(before, c)
            if entry.convert.rmin is not None and entry.convert.rmax is not None:
                conv = _from_range(entry.convert.rmin, entry.convert.rmax, c)
            done, nodes = _convert(g, tensor, dqs, conv, entry.convert.recv_nodes)
            converted = tuple(done)
            if nodes:
                last = max(dqs, key=lambda n: g.order[n.output[0]])
                inserted.setdefault(last.output[0], []).extend(nodes)
        patches.append(TensorPatch(tensor, before, after, converted, conv))
    _insert(out, inserted)
    if not patches:
        return PatchResult(model, (), tuple(missing))
    return PatchResult(out, tuple(patches), tuple(missing))


def recipe_overrides(patches: tuple[TensorPatch, ...]) -> dict[str, list[TensorOverride]]:
    """The overrides that rebuild ``patches`` exactly from the same model: each tensor's new type with the scale and
    zero point it was given (and its convert), for :func:`patch_model` or an overrides JSON."""
    from qdebug.config import ConvertOverride

    out: dict[str, list[TensorOverride]] = {}
    for p in patches:
        conv = None
        if p.convert is not None:
            conv = ConvertOverride(p.convert.quant_type, p.converted_for or None)
        out[p.tensor] = [
            TensorOverride(quant_type=p.after.quant_type, scale=p.after.scale, zero_point=p.after.zero_point,
                           convert=conv)
        ]  # fmt: skip
    return out


__all__ = [
    "BOUNDS",
    "PatchResult",
    "QParams",
    "TensorPatch",
    "patch_model",
    "quantized_tensors",
    "recipe_overrides",
    "target_params",
    "widened",
]
