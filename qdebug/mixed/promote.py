"""Promote activation tensors to 16 bits with ORT's mixed-precision fixer, and show the result first.

``promote()`` turns "run tensor T in 16 bits" into a *valid* set of ``TensorQuantOverrides``: ORT's
``MixedPrecisionTensorQuantOverridesFixer`` (the one ``get_qnn_qdq_config(init_overrides=...)`` runs)
extends the request to the whole region whose ops need one type for all inputs and outputs, and adds
``convert`` entries (DQ→Q type conversions) at the region's borders. Nothing is quantized here: the
returned :class:`PromotionPlan` shows which tensors were overridden and where the converts are, and
carries the :class:`~qdebug.config.QuantConfig` to quantize with.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import onnx

from qdebug.config import (
    QUANT_TYPES,
    Overrides,
    QuantConfig,
    make_overrides,
    normalize_quant_type,
)
from qdebug.errors import ConfigError
from qdebug.graph_index import VIEW_OPS, GraphIndex
from qdebug.mixed.overrides import OverridesFile
from qdebug.model_io import load_model
from qdebug.ort_view import quantizer_view
from qdebug.targets.base import get_target

#: Activation types each target can run (QNN HTP: unsigned 8/16-bit activations; Deeploy: int8 only).


@dataclass(frozen=True)
class ConvertBoundary:
    """A conversion ORT will insert: ``tensor`` produced as ``from_type``, read as ``to_type`` by ``recv_nodes``."""

    tensor: str
    from_type: str
    to_type: str
    recv_nodes: tuple[str, ...] | None


@dataclass(frozen=True)
class PromotionPlan:
    """What a promotion will do, before anything is re-quantized."""

    requested: tuple[str, ...]
    to: str
    base_config: QuantConfig
    config: QuantConfig
    promoted: tuple[str, ...]  # every tensor produced in the new type (requested + region)
    converts: tuple[ConvertBoundary, ...]
    #: tensors the fixer added that the QDQ model being patched keeps in float, left out (:meth:`without`)
    float_in_model: tuple[str, ...] = ()

    def without(self, float_tensors: Iterable[str]) -> PromotionPlan:
        """This plan with ``float_tensors`` (tensors a given QDQ model keeps in float, which a patch cannot promote)
        dropped from the promoted tensors, the converts and the config's overrides, and named in
        :attr:`float_in_model`; the plan itself when none of them is in it."""
        drop = set(float_tensors) & ({*self.promoted} | {c.tensor for c in self.converts})
        if not drop:
            return self
        kept = tuple((t, es) for t, es in self.overrides if t not in drop)
        return replace(
            self,
            config=self.config.replace(tensor_overrides=kept),
            promoted=tuple(t for t in self.promoted if t not in drop),
            converts=tuple(c for c in self.converts if c.tensor not in drop),
            float_in_model=tuple(sorted(drop)),
        )

    @property
    def overrides(self) -> Overrides:
        """The fixed overrides (also in ``config.tensor_overrides``)."""
        return self.config.tensor_overrides

    @property
    def added(self) -> tuple[str, ...]:
        """Tensors the fixer moved to the new type beyond the requested ones."""
        return tuple(t for t in self.promoted if t not in self.requested)

    def describe(self) -> str:
        """Human-readable summary of the fixed overrides."""
        lines = [f"promote {len(self.requested)} tensor(s) to {self.to} (default {self.base_config.activation_type}):"]
        for t in self.promoted:
            tag = "requested" if t in self.requested else "region (fixer)"
            lines.append(f"  {t}: {self.to}  [{tag}]")
        for c in self.converts:
            who = ", ".join(c.recv_nodes) if c.recv_nodes else "all consumers"
            lines.append(f"  convert {c.tensor}: {c.from_type} -> {c.to_type} for {who}")
        if self.float_in_model:
            lines.append(
                f"  left out: {', '.join(self.float_in_model)} — float in your model (not quantized there), so "
                "there is nothing to promote or convert"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "requested": list(self.requested),
            "to": self.to,
            "promoted": list(self.promoted),
            "converts": [
                {
                    "tensor": c.tensor,
                    "from_type": c.from_type,
                    "to_type": c.to_type,
                    "recv_nodes": None if c.recv_nodes is None else list(c.recv_nodes),
                }
                for c in self.converts
            ],
            "float_in_model": list(self.float_in_model),
            "config": self.config.to_dict(),
            "base_config": self.base_config.to_dict(),
        }


def activation_tensors(model: onnx.ModelProto) -> tuple[set[str], set[str]]:
    """(activation tensor names, weight/constant names) of a float model (from its :class:`GraphIndex`)."""
    index = GraphIndex(model)
    return set(index.activations()), set(index.consts)


def check_promotable(model: onnx.ModelProto, tensors: Iterable[str], to: str, target: str) -> None:
    """Raise :class:`ConfigError` listing every tensor/type that cannot be promoted."""
    acts, weights = activation_tensors(model)
    problems = []
    for t in tensors:
        if t in weights:
            problems.append(
                f"{t!r} is a weight/constant: promotion applies to activations (weights follow weight_type)"
            )
        elif t not in acts:
            close = difflib.get_close_matches(t, sorted(acts), n=3)
            hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
            problems.append(f"{t!r} is not a tensor of the model{hint}")
    allowed = get_target(target).activation_types
    if to not in allowed:
        problems.append(f"target {target!r} cannot run activations as {to}; it takes {sorted(allowed)}")
    if problems:
        raise ConfigError("cannot promote: " + "; ".join(problems))


def fix_overrides(
    model: onnx.ModelProto, init: Mapping[str, list[dict[str, Any]]], default_type: str, symmetric: bool
) -> dict[str, list[dict[str, Any]]]:
    """Run ORT's mixed-precision fixer on ORT-form overrides (returns a new dict)."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization.execution_providers.qnn.mixed_precision_overrides_utils import (
        MixedPrecisionTensorQuantOverridesFixer,
    )
    from onnxruntime.quantization.tensor_quant_overrides import TensorQuantOverridesHelper

    helper = TensorQuantOverridesHelper(copy.deepcopy(dict(init)))
    default = QuantType[QUANT_TYPES[default_type]]
    try:
        fixer = MixedPrecisionTensorQuantOverridesFixer.create_from_model(helper, model, default)
        fixer.apply(default, symmetric)
    except (ValueError, KeyError, AssertionError) as exc:
        raise ConfigError(f"ONNX Runtime's mixed-precision fixer rejected the overrides: {exc}") from exc
    return dict(helper.get_dict())


#: Override keys that carry values rather than types (kept through the fixer, see :func:`promote`).
_VALUE_KEYS = ("rmin", "rmax", "scale", "zero_point")


def overrides_from_ort(d: Mapping[str, list[dict[str, Any]]]) -> Overrides:
    """ORT's dict form (QuantType members, sets, numpy numbers) → the typed config form (validated)."""
    return OverridesFile.from_ort(d).overrides


def _fixed_types(model: onnx.ModelProto, base: QuantConfig, requested: tuple[str, ...], to: str) -> dict[str, Any]:
    """ORT's fixer on the base overrides plus the requested promotions, with the config's own values put back.

    ORT's fixer reasons about types only: an existing entry that holds values (rmin/rmax, scale/zero_point) but
    no quant_type fails its "existing type" check when the tensor joins the region or gets a convert. So the types
    are fixed alone, then the values are put back: the config's own numbers, not ORT's float32 copies.
    """
    from onnxruntime.quantization import QuantType

    init = base.ort_overrides()
    qt = QuantType[QUANT_TYPES[to]]
    acts, _ = activation_tensors(model)
    originals = base.overrides_dict
    values: dict[str, dict[str, Any]] = {}
    for name in [n for n, es in init.items() if n in acts and len(es) == 1]:
        vals = {k: getattr(originals[name][0], k) for k in _VALUE_KEYS if k in init[name][0]}
        if vals:
            values[name] = vals
            for k in vals:
                del init[name][0][k]
            if not init[name][0]:
                del init[name]
    for t in requested:
        entries = init.setdefault(t, [{}])
        if any("convert" in e for e in entries):
            raise ConfigError(f"{t!r} already has a mixed-precision convert; start from the base config")
        entries[0]["quant_type"] = qt
    fixed = fix_overrides(model, init, base.activation_type, base.activation_symmetric)
    clashes = []
    for name, vals in values.items():
        entry = fixed.setdefault(name, [{}])[0]
        entry.update(vals)
        was = originals[name][0].quant_type or base.activation_type
        now = normalize_quant_type(entry["quant_type"].name) if "quant_type" in entry else base.activation_type
        if "scale" in vals and now != was:  # a scale/zero_point is only meaningful for the type it was set for
            clashes.append(f"{name!r} has an explicit scale/zero_point for {was} but the promotion makes it {now}")
    if clashes:
        raise ConfigError("cannot promote: " + "; ".join(clashes))
    return fixed


def _converter_views(original: onnx.ModelProto, view: onnx.ModelProto, requested: tuple[str, ...]) -> tuple[str, ...]:
    """Tensors the opset conversion added that hold the requested tensors' values (the Softmax output
    ``<name>_intermediate`` reshaped into ``<name>``): promoted with them, or the op would still compute in 8 bits."""
    old = {t for n in original.graph.node for t in (*n.input, *n.output)}
    edges = [(n.input[0], n.output[0]) for n in view.graph.node if n.op_type in VIEW_OPS and n.input and n.output]
    added: list[str] = []
    frontier = list(requested)
    while frontier:
        t = frontier.pop()
        for a, b in edges:
            other = b if a == t else a if b == t else None
            if other and other not in old and other not in added:
                added.append(other)
                frontier.append(other)
    return tuple(added)


@runtime_checkable
class _HasFloatModel(Protocol):
    """What :func:`promote` reads of a session: its float model and base config."""

    float_proto: onnx.ModelProto
    base_config: QuantConfig


def promote(
    source: Any,
    tensors: Iterable[str],
    to: str = "uint16",
    *,
    config: QuantConfig | None = None,
) -> PromotionPlan:
    """Plan the promotion of ``tensors`` to ``to`` (default uint16) with valid, fixed overrides.

    ``source`` is a :class:`~qdebug.mixed.session.MixedPrecisionSession`, a float model path or a
    ``ModelProto``. ``config`` is the base config (default: the session's, else ``QuantConfig()``);
    overrides it already carries that are not type overrides (e.g. rmin/rmax) are kept.
    Nothing is quantized: inspect :meth:`PromotionPlan.describe`, then re-quantize with ``plan.config``.
    """
    if isinstance(source, _HasFloatModel):  # a session (duck-typed: the session module sits above this one)
        model = source.float_proto
        base = config or source.base_config
    elif isinstance(source, onnx.ModelProto):
        model, base = source, config or QuantConfig()
    elif isinstance(source, str | Path):
        model, base = load_model(source, "float model"), config or QuantConfig()
    else:
        raise ConfigError(f"promote() needs a session, a model path or a ModelProto, got {type(source).__name__}")
    requested = tuple(dict.fromkeys(tensors))
    if not requested:
        raise ConfigError("promote() needs at least one tensor")
    to = normalize_quant_type(to)
    if to == base.activation_type:
        raise ConfigError(f"activations are already {to} by default; choose another type to promote to")
    check_promotable(model, requested, to, base.target)
    # ORT quantizes the opset-raised view of the model (16-bit Q/DQ need opset 21): the fixer must reason on it.
    view = quantizer_view(
        model, base.weight_type, [to, base.activation_type], base.ort_overrides() or None, per_channel=base.per_channel
    )
    targets = requested
    if view is not None:
        targets += _converter_views(model, view, requested)
        model = view
    fixed = _fixed_types(model, base, targets, to)
    # Entries the fixer never reads (weights, per-channel lists) stay exactly as the config had them.
    acts, _ = activation_tensors(model)
    untouched = {n: es for n, es in base.overrides_dict.items() if n not in acts or len(es) != 1}
    typed = make_overrides({**dict(overrides_from_ort(fixed)), **untouched})
    promoted = tuple(name for name, es in typed if es and es[0].quant_type == to)
    converts = tuple(
        ConvertBoundary(
            tensor=name,
            from_type=es[0].quant_type or base.activation_type,
            to_type=es[0].convert.quant_type,
            recv_nodes=es[0].convert.recv_nodes,
        )
        for name, es in typed
        if es and es[0].convert is not None
    )
    return PromotionPlan(
        requested=requested,
        to=to,
        base_config=base,
        config=base.replace(tensor_overrides=typed),
        promoted=promoted,
        converts=converts,
    )
