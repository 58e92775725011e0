"""The rules an overrides file (:mod:`qdebug.mixed.overrides`) is checked against, each returning every problem it
finds rather than stopping at the first: the JSON form parsed into typed overrides, the rules that need no model, those
that depend on the config they are applied to, the file's ``target_fixes`` entry, and the per-tensor rules against the
float model (weight or activation, ``recv_nodes``, channels). :class:`~qdebug.mixed.overrides.OverridesFile` and
:func:`~qdebug.mixed.overrides.check_against_model` gather the problems into one
:class:`~qdebug.mixed.overrides.OverridesError`. See ``docs/overrides.md``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from qdebug.config import (
    QUANT_TYPES,
    ConvertOverride,
    Overrides,
    QuantConfig,
    TensorOverride,
    make_overrides,
    normalize_quant_type,
)
from qdebug.errors import ConfigError
from qdebug.targets.base import get_target, target_names

if TYPE_CHECKING:
    import onnx


OVERRIDES_SCHEMA_VERSION = 1
#: A file made for the float model *after* a target's compatibility fixes (``target_fixes``: written by ``qdebug
#: search --target``) is schema 2: a reader that does not know the key must refuse it rather than check its tensors
#: against the unfixed model. Every other file stays schema 1 (byte for byte what it was).
TARGET_FIXES_SCHEMA_VERSION = 2

TOP_KEYS = (
    "schema_version", "model_sha256", "base_config", "requested", "note", "target_fixes", "tensor_quant_overrides",
    "quant_model_sha256",
)  # fmt: skip
_ENTRY_KEYS = tuple(f.name for f in fields(TensorOverride))
_CONVERT_KEYS = tuple(f.name for f in fields(ConvertOverride))
# Keys ORT's quantizer reads inside "convert" (qdq_quantizer.calc_quant_params + recv_nodes); those that
# ConvertOverride cannot hold yet are reported as unsupported rather than unknown.
_ORT_CONVERT_KEYS = ("quant_type", "symmetric", "scale", "zero_point", "rmin", "rmax", "recv_nodes")
_KIND = {
    "quant_type": "type",
    "scale": "real",
    "rmin": "real",
    "rmax": "real",
    "zero_point": "int",
    "axis": "int",
    "symmetric": "bool",
    "reduce_range": "bool",
}
_QRANGE = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767)}
_SHA256 = re.compile(r"[0-9a-f]{64}")
_MAX_LISTED = 20


# --------------------------------------------------------------------------------------------- parsing
def to_plain(value: Any) -> Any:
    """ORT/numpy values → JSON-like Python values (QuantType → its name, numpy scalars → int/float, sets → lists)."""
    import enum

    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, Mapping):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return sorted(to_plain(v) for v in value) if all(isinstance(v, str) for v in value) else list(value)
    if isinstance(value, list | tuple):
        return [to_plain(v) for v in value]
    if hasattr(value, "dtype") and hasattr(value, "item") and getattr(value, "size", 1) == 1:
        # numpy scalar or 1-element array (ORT needs float32 scale/rmin/rmax): float32 values come back as their
        # shortest decimal, so 0.1 → float32 → 0.1 round-trips instead of becoming 0.10000000149.
        if getattr(value.dtype, "kind", "") == "f" and value.dtype.itemsize == 4:
            return float(str(value.reshape(())[()]))
        return value.item()
    return value


def _quant_type(value: Any, label: str) -> tuple[str | None, str | None]:
    """(canonical name, problem)."""
    if not isinstance(value, str):
        return None, f"{label}: quant_type must be a type name such as 'QUInt16', got {value!r}"
    try:
        return normalize_quant_type(value), None
    except ConfigError:
        supported = ", ".join(QUANT_TYPES.values())
        if value in ("QInt4", "QUInt4"):
            return None, f"{label}: 4-bit quant_type {value!r} is not supported by qdebug (supported: {supported})"
        return None, f"{label}: unknown quant_type {value!r} (supported: {supported})"


def _value(key: str, value: Any, label: str) -> tuple[Any, str | None]:
    """Type-check one override value; returns (value, problem). Range rules are TensorOverride.problems()."""
    kind = _KIND[key]
    if kind == "type":
        return _quant_type(value, label)
    if kind == "bool":
        if isinstance(value, bool):
            return value, None
        return None, f"{label}: {key} must be true or false, got {value!r}"
    if kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value, None
        return None, f"{label}: {key} must be an integer, got {value!r}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value), None
    return None, f"{label}: {key} must be a number, got {value!r}"


def _parse_convert(raw: Any, label: str) -> tuple[ConvertOverride | None, list[str]]:
    where = f"{label}: convert"
    if not isinstance(raw, Mapping):
        return None, [f"{where} must be an object, got {type(raw).__name__}"]
    problems: list[str] = []
    unsupported = sorted(k for k in raw if k in _ORT_CONVERT_KEYS and k not in _CONVERT_KEYS)
    unknown = sorted(str(k) for k in raw if k not in _ORT_CONVERT_KEYS and k not in _CONVERT_KEYS)
    if unsupported:
        problems.append(f"{where}: key(s) {unsupported} are valid in ORT but not supported by qdebug yet")
    if unknown:
        problems.append(f"{where}: unknown key(s) {unknown}; allowed: {list(_CONVERT_KEYS)}")
    qtype: str | None = None
    if "quant_type" not in raw:
        problems.append(f"{where} must give a quant_type")
    else:
        qtype, p = _quant_type(raw["quant_type"], where)
        problems += [p] if p else []
    recv: tuple[str, ...] | None = None
    if "recv_nodes" in raw:
        nodes = raw["recv_nodes"]
        if not isinstance(nodes, list | tuple | set | frozenset) or not all(isinstance(n, str) and n for n in nodes):
            problems.append(f"{where}: recv_nodes must be a list of node names, got {nodes!r}")
        elif not nodes:
            problems.append(f"{where}: recv_nodes is empty (omit it to convert for every consumer)")
        else:
            recv = tuple(set(nodes))
    bounds: dict[str, float | None] = {}
    for k in ("rmin", "rmax"):
        bounds[k], p = (None, None) if k not in raw else _value(k, raw[k], where)
        problems += [p] if p else []
    if (bounds["rmin"] is None) != (bounds["rmax"] is None):
        problems.append(f"{where}: rmin and rmax must be given together")
    if problems or qtype is None:
        return None, problems
    return ConvertOverride(quant_type=qtype, recv_nodes=recv, rmin=bounds["rmin"], rmax=bounds["rmax"]), []


def _parse_entry(raw: Any, label: str) -> tuple[TensorOverride | None, list[str]]:
    if isinstance(raw, TensorOverride):
        return raw, []
    if not isinstance(raw, Mapping):
        return None, [f"{label}: an override must be an object, got {type(raw).__name__}"]
    problems: list[str] = []
    unknown = sorted(str(k) for k in raw if k not in _ENTRY_KEYS)
    if unknown:
        problems.append(f"{label}: unknown key(s) {unknown}; allowed: {list(_ENTRY_KEYS)}")
    kw: dict[str, Any] = {}
    for key in _ENTRY_KEYS:
        if key not in raw:
            continue
        if key == "convert":
            conv, ps = _parse_convert(raw[key], label)
            problems += ps
            kw[key] = conv
        else:
            kw[key], p = _value(key, raw[key], label)
            problems += [p] if p else []
    if problems:
        return None, problems
    return TensorOverride(**kw), []


def parse_overrides(raw: Any) -> tuple[Overrides, list[str], set[str]]:
    """(the overrides that parsed, every problem, tensors with a parse problem)."""
    if not isinstance(raw, Mapping):
        return (
            (),
            [f"tensor_quant_overrides must be an object {{tensor: [override, ...]}}, got {type(raw).__name__}"],
            set(),
        )
    problems: list[str] = []
    broken: set[str] = set()
    parsed: dict[str, tuple[TensorOverride, ...]] = {}
    for name, entries in raw.items():
        if not isinstance(name, str) or not name:
            problems.append(f"tensor name {name!r} must be a non-empty string")
            continue
        if not isinstance(entries, list | tuple):
            problems.append(f"{name}: overrides must be a list of objects, got {type(entries).__name__}")
            broken.add(name)
            continue
        if not entries:
            problems.append(f"{name}: empty override list")
            broken.add(name)
            continue
        out: list[TensorOverride] = []
        for i, e in enumerate(entries):
            entry, ps = _parse_entry(e, name if len(entries) == 1 else f"{name}[{i}]")
            problems += ps
            if entry is not None:
                out.append(entry)
        if len(out) == len(entries):
            parsed[name] = tuple(out)
        else:
            broken.add(name)
    return make_overrides(parsed), problems, broken


# ---------------------------------------------------------------------------------- model-free rules
def _rule_problems(overrides: Overrides) -> list[str]:
    """Rules on the typed overrides that need neither a model nor a config."""
    problems: list[str] = []
    seen: set[str] = set()
    for name, entries in overrides:
        if name in seen:
            problems.append(f"{name}: overridden twice")
        seen.add(name)
        if not entries:
            problems.append(f"{name}: empty override list")
            continue
        for i, e in enumerate(entries):
            label = name if len(entries) == 1 else f"{name}[{i}]"
            problems += e.problems(label)
            if e.zero_point is not None and e.quant_type is not None:
                lo, hi = _QRANGE[e.quant_type]
                if not lo <= e.zero_point <= hi:
                    problems.append(f"{label}: zero_point {e.zero_point} is outside {e.quant_type} [{lo}, {hi}]")
            if e.convert is not None:
                if e.quant_type is not None and e.convert.quant_type == e.quant_type:
                    problems.append(f"{label}: convert quant_type must differ from the tensor's own ({e.quant_type})")
                if e.axis is not None or e.reduce_range is not None:
                    problems.append(
                        f"{label}: convert (activations) cannot be combined with axis/reduce_range (weights)"
                    )
        if len(entries) > 1:  # per-channel: ORT requires these to agree across channels
            first = entries[0]
            if first.axis is None:
                problems.append(f"{name}: per-channel overrides ({len(entries)} entries) need 'axis' in the first")
            for key in ("quant_type", "axis", "symmetric", "reduce_range"):
                if any(getattr(e, key) not in (None, getattr(first, key)) for e in entries[1:]):
                    problems.append(f"{name}: channels disagree on {key}")
            if len({e.scale is None for e in entries}) > 1:
                problems.append(f"{name}: scale/zero_point must be given for every channel or none")
    return problems


def config_problems(overrides: Overrides, config: QuantConfig) -> list[str]:
    """Rules that depend on the config the overrides are applied to."""
    problems: list[str] = []
    for name, entries in overrides:
        if not entries:
            continue  # reported by _rule_problems
        e = entries[0]
        if e.convert is not None and e.quant_type is None and e.convert.quant_type == config.activation_type:
            problems.append(
                f"{name}: convert quant_type {e.convert.quant_type} equals the default activation type; "
                "nothing to convert"
            )
        types = {x.quant_type for x in entries if x.quant_type} | {x.convert.quant_type for x in entries if x.convert}
        allowed = _target_types(config.target) or types
        if types - allowed:
            takes = f"{min(allowed)} only" if len(allowed) == 1 else str(sorted(allowed))
            problems.append(f"{name}: target {config.target!r} takes {takes}, overridden to {sorted(types)}")
    return problems


def _target_types(target: str) -> frozenset[str]:
    """Every type a target runs (activations or weights; an override may name either); empty if unknown."""
    if target not in target_names():
        return frozenset()
    t = get_target(target)
    return t.activation_types | getattr(t, "weight_types", frozenset())


def file_problems(overrides: Overrides, sha: str | None, base: QuantConfig | None) -> list[str]:
    """Every rule of a parsed file that does not need the model."""
    problems = _rule_problems(overrides)
    if sha is not None and not _SHA256.fullmatch(str(sha)):
        problems.append(f"model_sha256 must be 64 lowercase hex digits, got {sha!r}")
    if base is not None:
        if base.tensor_overrides:
            problems.append("base_config must not carry tensor_overrides (they belong in tensor_quant_overrides)")
        problems += config_problems(overrides, base)
    return problems


# ---------------------------------------------------------------------------------- the file's JSON
def entry_json(e: TensorOverride) -> dict[str, Any]:
    """One override as the file writes it: types by ORT's names (``QUInt16``)."""
    d = e.to_dict()
    if "quant_type" in d:
        d["quant_type"] = QUANT_TYPES[d["quant_type"]]
    if "convert" in d:
        d["convert"]["quant_type"] = QUANT_TYPES[d["convert"]["quant_type"]]
    return d


def target_fixes_problems(raw: Any) -> list[str]:
    """What is wrong with a ``target_fixes`` entry (``{"target": name, "fixes": [name, ...]}``)."""
    if not isinstance(raw, Mapping) or set(raw) != {"target", "fixes"}:
        return [f"target_fixes must be an object with 'target' and 'fixes', got {raw!r}"]
    target, fixes = raw["target"], raw["fixes"]
    ok = isinstance(target, str) and target and isinstance(fixes, list | tuple)
    if not ok or not all(isinstance(f, str) and f for f in fixes):
        return [f"target_fixes needs a target name and a list of fix names, got {dict(raw)!r}"]
    return []


def read_target_fixes(d: Mapping[str, Any], version: Any, problems: list[str]) -> tuple[str, tuple[str, ...]] | None:
    """The ``target_fixes`` entry of a file (schema 2 only; schema 2 without it is a problem too)."""
    raw = d.get("target_fixes")
    if raw is None:
        if version == TARGET_FIXES_SCHEMA_VERSION:
            problems.append(f"schema_version {TARGET_FIXES_SCHEMA_VERSION} needs target_fixes")
        return None
    if version != TARGET_FIXES_SCHEMA_VERSION:
        problems.append(f"target_fixes needs schema_version {TARGET_FIXES_SCHEMA_VERSION}, got {version!r}")
        return None
    ps = target_fixes_problems(raw)
    problems += ps
    return None if ps else (str(raw["target"]), tuple(str(f) for f in raw["fixes"]))


# ------------------------------------------------------------------------------------- model rules
def listing(names: list[str]) -> str:
    """``names`` quoted for a message, the first few only and how many more."""
    shown = ", ".join(repr(n) for n in names[:_MAX_LISTED])
    return shown + (f" and {len(names) - _MAX_LISTED} more" if len(names) > _MAX_LISTED else "")


def elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every typed tensor (shape inference is best-effort)."""
    import onnx

    try:
        g = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    except Exception:  # inference fails on some custom ops / >2 GB models: fall back to declared types
        g = model.graph
    types = {t.name: t.data_type for t in g.initializer}
    for vi in [*g.input, *g.value_info, *g.output]:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    return types


def entry_problems(name: str, entries: tuple[TensorOverride, ...], weight: Any, consumers: list[str]) -> list[str]:
    """Keys that do not fit the tensor's kind (weight or activation) and ``recv_nodes`` that do not read it."""
    problems = []
    for i, e in enumerate(entries):
        label = name if len(entries) == 1 else f"{name}[{i}]"
        if weight is not None and e.convert is not None:
            problems.append(f"{label}: is a weight (initializer); 'convert' applies only to activations")
        if weight is None and e.reduce_range is not None:
            problems.append(f"{label}: is an activation; 'reduce_range' applies only to weights")
        if e.convert is not None and e.convert.recv_nodes is not None:
            bad = [r for r in e.convert.recv_nodes if r not in consumers]
            if bad:
                real = sorted(c for c in consumers if c)
                problems.append(
                    f"{label}: recv_nodes {bad} do not consume this tensor (its consumers: {real or 'none'})"
                )
    return problems


def channel_problems(name: str, entries: tuple[TensorOverride, ...], weight: Any) -> list[str]:
    """Per-channel overrides: only on weights, with an axis in range and one entry per channel."""
    first = entries[0]
    if weight is None:
        if first.axis is not None or len(entries) > 1:
            return [f"{name}: is an activation; per-channel overrides (axis) apply only to weights"]
        return []
    if first.axis is None:
        return []
    rank = len(weight.dims)
    axis = first.axis + rank if first.axis < 0 else first.axis
    if not 0 <= axis < rank:
        return [f"{name}: axis {first.axis} is out of range for a rank-{rank} weight"]
    if len(entries) > 1 and len(entries) != weight.dims[axis]:
        return [
            f"{name}: {len(entries)} channel overrides but the weight has {weight.dims[axis]} "
            f"channels along axis {first.axis}"
        ]
    return []
