"""What a target's integer kernels require of the quantization, stated before quantizing.

A target fills :meth:`qdebug.targets.base.Target.quant_constraints` with a :class:`QuantConstraints`: its storage
types, whether weights must be symmetric, whether scales must be powers of two, and per-op :class:`OpRule` s such
as "a padded Conv's input must be zero-centred". :func:`constrained_overrides` turns the rules into ONNX Runtime
``TensorQuantOverrides`` (a symmetric grid on each tensor a rule names) that the quantizer applies, so the QDQ
model already obeys them instead of being refused by the target's export afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "ConstrainedTensor",
    "OpRule",
    "QuantConstraints",
    "RuleWhen",
    "Storage",
    "ZeroPoint",
    "constrained_overrides",
    "constrained_tensors",
    "constraint_note",
]

SCHEMA_VERSION = 1
#: Ops that move values without changing them: ORT gives their output the input's grid, so a rule on the output
#: must also hold for the input (the chain is walked back to the op that computes the values).
_PASS_THROUGH = frozenset({"MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze"})


class ZeroPoint(StrEnum):
    """What an input's zero point must be."""

    ANY = "any"
    #: The real 0 is the stored integer 0: a symmetric grid, or a non-negative tensor stored unsigned.
    ZERO = "zero"


class Storage(StrEnum):
    """How an op's activations are stored on the device."""

    INT8 = "int8"
    UINT8 = "uint8"
    EITHER = "int8 or uint8"


class RuleWhen(StrEnum):
    """When an :class:`OpRule` applies to a node."""

    ALWAYS = "always"
    #: The node has non-zero ``pads`` (or an ``auto_pad`` other than NOTSET/VALID).
    PADDED = "padded"


@dataclass(frozen=True)
class OpRule:
    """One op's requirement on its activation inputs ``inputs`` (positions), and why the target needs it."""

    op_type: str
    inputs: tuple[int, ...]
    zero_point: ZeroPoint
    when: RuleWhen
    storage: Storage
    why: str

    def applies(self, node: Any) -> bool:
        """Whether this rule concerns ``node`` (an ``onnx.NodeProto``)."""
        if node.op_type != self.op_type:
            return False
        if self.when is RuleWhen.ALWAYS:
            return True
        attrs = {a.name: a for a in node.attribute}
        auto = attrs["auto_pad"].s.decode() if "auto_pad" in attrs else "NOTSET"
        pads = attrs["pads"].ints if "pads" in attrs else []
        return auto not in ("NOTSET", "VALID") or any(int(p) != 0 for p in pads)


@dataclass(frozen=True)
class QuantConstraints:
    """A target's integer contract, as far as quantizing can meet it."""

    target: str
    activation_storage: Storage
    weight_symmetric: bool
    power_of_two_scales: bool
    #: How the target realises a scale ratio (one line), e.g. "mul / 2^k in an int32 RequantShift".
    scales: str
    rules: tuple[OpRule, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``schema_version``."""
        return {**asdict(self), "schema_version": SCHEMA_VERSION}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> QuantConstraints:
        """Inverse of :meth:`to_dict`."""
        rules = tuple(
            OpRule(r["op_type"], tuple(r["inputs"]), ZeroPoint(r["zero_point"]), RuleWhen(r["when"]),
                   Storage(r["storage"]), r["why"])
            for r in d["rules"]
        )  # fmt: skip
        return cls(d["target"], Storage(d["activation_storage"]), bool(d["weight_symmetric"]),
                   bool(d["power_of_two_scales"]), d["scales"], rules)  # fmt: skip


@dataclass(frozen=True)
class ConstrainedTensor:
    """A float model's tensor that a rule puts on a symmetric grid: which node's rule, and why."""

    tensor: str
    node: str
    op_type: str
    why: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def _nonnegative(tensor: str, producer: Mapping[str, Any], consts: Mapping[str, np.ndarray],
                 nonnegative_inputs: frozenset[str]) -> bool:  # fmt: skip
    """Whether ``tensor`` is non-negative by construction (a Relu, a Clip at ≥ 0, or a shape op of one): ORT then
    gives it zero point −128 on int8, which the target stores unsigned with an effective zero point 0."""
    node = producer.get(tensor)
    if node is None:
        return tensor in nonnegative_inputs
    if node.op_type == "Relu":
        return True
    if node.op_type == "Clip":
        attrs = {a.name: a for a in node.attribute}
        lo = attrs["min"].f if "min" in attrs else None
        if len(node.input) > 1 and node.input[1] in consts:
            lo = float(consts[node.input[1]].reshape(-1)[0])
        return lo is not None and lo >= 0
    if node.op_type in _PASS_THROUGH:
        return _nonnegative(node.input[0], producer, consts, nonnegative_inputs)
    return False


def constrained_tensors(
    model: Any, constraints: QuantConstraints, nonnegative_inputs: frozenset[str] = frozenset()
) -> tuple[ConstrainedTensor, ...]:
    """The activation tensors of the float ``model`` (an ``onnx.ModelProto``) that must be quantized symmetrically
    to meet ``constraints``: each input a :data:`ZeroPoint.ZERO` rule names that is not non-negative by
    construction (``nonnegative_inputs``: graph inputs whose calibration data has no negative value), and the
    pass-through chain that shares its grid."""
    from onnx import numpy_helper

    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    out: dict[str, ConstrainedTensor] = {}
    for node in model.graph.node:
        for rule in constraints.rules:
            if rule.zero_point is not ZeroPoint.ZERO or not rule.applies(node):
                continue
            for i in rule.inputs:
                t = node.input[i] if i < len(node.input) else ""
                while t and t not in consts and not _nonnegative(t, producer, consts, nonnegative_inputs):
                    out.setdefault(t, ConstrainedTensor(t, node.name or node.output[0], node.op_type, rule.why))
                    src = producer.get(t)
                    t = src.input[0] if src is not None and src.op_type in _PASS_THROUGH else ""
    return tuple(out.values())


def nonnegative_graph_inputs(samples: Iterable[Mapping[str, Any]], names: Iterable[str]) -> frozenset[str]:
    """The graph inputs among ``names`` with no negative value in any sample (ORT then calibrates them to zero
    point −128: stored unsigned, effective zero point 0, so no symmetric grid is needed)."""
    todo = set(names)
    if not todo:
        return frozenset()
    lowest = dict.fromkeys(todo, np.inf)
    for sample in samples:
        for k in todo & set(sample):
            lowest[k] = min(lowest[k], float(np.min(np.asarray(sample[k]))))
    return frozenset(k for k, v in lowest.items() if v >= 0)


def _with_symmetric(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The user's own entries for a tensor, made symmetric unless they fix a grid themselves (theirs wins)."""
    if any(k in e for e in entries for k in ("symmetric", "scale", "zero_point", "rmin", "rmax")):
        return entries
    return [{**e, "symmetric": True} for e in entries] or [{"symmetric": True}]


def constrained_overrides(
    constraints: QuantConstraints | None,
    model: Any,
    reader: Any,
    overrides: Mapping[str, list[dict[str, Any]]] | None,
) -> dict[str, list[dict[str, Any]]] | None:
    """ORT ``TensorQuantOverrides`` for ``model`` (a path or ``onnx.ModelProto``): ``overrides`` (the user's) plus a
    symmetric grid on every tensor of :func:`constrained_tensors`. ``reader`` (an ORT calibration reader over a
    :class:`~qdebug.data.DataSource`, or None) tells which graph inputs are non-negative."""
    if constraints is None:
        return dict(overrides) if overrides else None
    import onnx

    m = model if isinstance(model, onnx.ModelProto) else onnx.load(str(Path(model)), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    inputs = [i.name for i in m.graph.input if i.name not in inits]
    tensors = constrained_tensors(m, constraints)
    source = getattr(reader, "source", None)
    candidates = [c.tensor for c in tensors if c.tensor in inputs]
    if source is not None and candidates:  # one pass over the calibration data, only for an input a rule names
        nonneg = nonnegative_graph_inputs(source, candidates)
        tensors = constrained_tensors(m, constraints, nonneg) if nonneg else tensors
    merged = {k: list(v) for k, v in (overrides or {}).items()}
    for c in tensors:
        merged[c.tensor] = _with_symmetric(merged.get(c.tensor, []))
    return merged or None


def constraint_note(target: str, given: Mapping[str, Any], ort_config: Any) -> str | None:
    """One line naming the tensors the target's constraints put on a symmetric grid in ``ort_config`` (ORT's
    ``StaticQuantConfig``) beyond the user's own overrides ``given``; None when there are none."""
    final = (getattr(ort_config, "extra_options", None) or {}).get("TensorQuantOverrides") or {}
    added = [t for t, entries in final.items() if t not in given and any(e.get("symmetric") for e in entries)]
    if not added:
        return None
    names = ", ".join(repr(t) for t in added[:4]) + (", …" if len(added) > 4 else "")
    return (
        f"target {target!r}: {len(added)} tensor(s) quantized symmetric to meet its kernels' constraints "
        f"(Target.quant_constraints): {names}"
    )
