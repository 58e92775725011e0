"""The overrides file: ONNX Runtime's ``TensorQuantOverrides``, typed, validated and carried as JSON.

An :class:`OverridesFile` is what qdebug's mixed-precision tools hand to each other and to
``qdebug quantize --overrides``: the per-tensor overrides (already *fixed*, i.e. with ORT's ``convert``
boundaries), the config they were made for (without the overrides), and the sha256 of the float model
file they refer to. Inside qdebug the overrides are always the typed :data:`~qdebug.config.Overrides`;
ORT's in-memory dict (``QuantType`` members, ``recv_nodes`` sets) exists only at the boundary
(:meth:`OverridesFile.to_ort` / :meth:`OverridesFile.from_ort`).

Validation never stops at the first problem: loading a file reports every problem it finds in one
:class:`OverridesError`, and :func:`check_against_model` does the same for the model-dependent rules.
See ``docs/overrides.md``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
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
from qdebug.graph_index import GraphIndex
from qdebug.io import parse_json, read_input_text
from qdebug.targets.base import get_target, target_names

if TYPE_CHECKING:
    import onnx

__all__ = [
    "OVERRIDES_SCHEMA_VERSION",
    "TARGET_FIXES_SCHEMA_VERSION",
    "OverridesError",
    "OverridesFile",
    "check_against_model",
]

OVERRIDES_SCHEMA_VERSION = 1
#: A file made for the float model *after* a target's compatibility fixes (``target_fixes``: written by ``qdebug
#: search --target``) is schema 2: a reader that does not know the key must refuse it rather than check its tensors
#: against the unfixed model. Every other file stays schema 1 (byte for byte what it was).
TARGET_FIXES_SCHEMA_VERSION = 2

_TOP_KEYS = (
    "schema_version", "model_sha256", "base_config", "requested", "note", "target_fixes", "tensor_quant_overrides",
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


class OverridesError(ConfigError):
    """An overrides file (or dict) breaks one or more rules; ``problems`` lists every one of them.

    ``warnings`` carries what :func:`check_against_model` would have warned about (e.g. a checksum
    mismatch), so that a caller can still show it next to the error.
    """

    def __init__(self, problems: Iterable[str], source: str | Path | None = None, warnings: Iterable[str] = ()) -> None:
        self.problems: list[str] = list(problems)
        self.warnings: list[str] = list(warnings)
        self.source = None if source is None else str(source)
        n = len(self.problems)
        head = f"{self.source}: " if self.source else ""
        super().__init__(
            f"{head}invalid tensor overrides ({n} problem{'s' if n != 1 else ''}): " + "; ".join(self.problems)
        )


# --------------------------------------------------------------------------------------------- parsing
def _plain(value: Any) -> Any:
    """ORT/numpy values → JSON-like Python values (QuantType → its name, numpy scalars → int/float, sets → lists)."""
    import enum

    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return sorted(_plain(v) for v in value) if all(isinstance(v, str) for v in value) else list(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
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
    if problems or qtype is None:
        return None, problems
    return ConvertOverride(quant_type=qtype, recv_nodes=recv), []


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


def _parse_overrides(raw: Any) -> tuple[Overrides, list[str], set[str]]:
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


def _config_problems(overrides: Overrides, config: QuantConfig) -> list[str]:
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


def _file_problems(overrides: Overrides, sha: str | None, base: QuantConfig | None) -> list[str]:
    """Every rule of a parsed file that does not need the model."""
    problems = _rule_problems(overrides)
    if sha is not None and not _SHA256.fullmatch(str(sha)):
        problems.append(f"model_sha256 must be 64 lowercase hex digits, got {sha!r}")
    if base is not None:
        if base.tensor_overrides:
            problems.append("base_config must not carry tensor_overrides (they belong in tensor_quant_overrides)")
        problems += _config_problems(overrides, base)
    return problems


# --------------------------------------------------------------------------------------- the file
def _entry_json(e: TensorOverride) -> dict[str, Any]:
    d = e.to_dict()
    if "quant_type" in d:
        d["quant_type"] = QUANT_TYPES[d["quant_type"]]
    if "convert" in d:
        d["convert"]["quant_type"] = QUANT_TYPES[d["convert"]["quant_type"]]
    return d


@dataclass(frozen=True)
class OverridesFile:
    """ORT ``TensorQuantOverrides`` plus what they were made for. Validated on construction.

    ``overrides`` may be given as a mapping ``{tensor: [TensorOverride | dict, ...]}``; it is stored in the
    config's frozen, name-sorted form. ``base_config`` is the config the overrides were fixed for, *without*
    tensor overrides. ``requested`` names the tensors the user originally asked to promote (informational).
    """

    overrides: Overrides
    model_sha256: str | None = None
    base_config: QuantConfig | None = None
    requested: tuple[str, ...] = ()
    note: str = ""
    #: ``(target, (fix, ...))``: the overrides name tensors of the model with ``model_sha256`` *after* these of the
    #: target's compatibility fixes (a search of the fixed model); ``qdebug build --target`` checks them after its own
    #: fixes. ``None``: made for the model as it is.
    target_fixes: tuple[str, tuple[str, ...]] | None = None

    def __post_init__(self) -> None:
        parse_problems: list[str] = []
        if isinstance(self.overrides, Mapping):  # dict entries go through the file parser: all problems at once
            overrides, parse_problems, _ = _parse_overrides(self.overrides)
        else:
            overrides = tuple((name, tuple(entries)) for name, entries in sorted(self.overrides, key=lambda t: t[0]))
        object.__setattr__(self, "overrides", overrides)
        object.__setattr__(self, "requested", tuple(self.requested))
        if self.target_fixes is not None:
            object.__setattr__(self, "target_fixes", (self.target_fixes[0], tuple(self.target_fixes[1])))
        problems = parse_problems + self.problems()
        if problems:
            raise OverridesError(problems)

    def problems(self) -> list[str]:
        """Every model-independent rule these overrides break (empty when valid)."""
        p = _file_problems(self.overrides, self.model_sha256, self.base_config)
        if not all(isinstance(r, str) and r for r in self.requested):
            p.append(f"requested must be a list of tensor names, got {list(self.requested)!r}")
        if not isinstance(self.note, str):
            p.append(f"note must be a string, got {self.note!r}")
        if self.target_fixes is not None:
            p += _target_fixes_problems({"target": self.target_fixes[0], "fixes": list(self.target_fixes[1])})
        return p

    # ------------------------------------------------------------------------ construction helpers
    @classmethod
    def from_config(
        cls,
        config: QuantConfig,
        *,
        model_sha256: str | None = None,
        requested: Iterable[str] = (),
        note: str = "",
        target_fixes: tuple[str, Sequence[str]] | None = None,
    ) -> OverridesFile:
        """The overrides of ``config`` with the rest of it as ``base_config`` (``target_fixes``: see the field)."""
        return cls(
            overrides=config.tensor_overrides,
            model_sha256=model_sha256,
            base_config=config.replace(tensor_overrides=()),
            requested=tuple(requested),
            note=note,
            target_fixes=None if target_fixes is None else (target_fixes[0], tuple(target_fixes[1])),
        )

    @property
    def tensors(self) -> tuple[str, ...]:
        """The overridden tensor names, sorted."""
        return tuple(name for name, _ in self.overrides)

    # ----------------------------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: ORT's structure, ``QuantType`` by ORT name, ``recv_nodes`` as sorted lists."""
        fixed = self.target_fixes is not None
        d: dict[str, Any] = {
            "schema_version": TARGET_FIXES_SCHEMA_VERSION if fixed else OVERRIDES_SCHEMA_VERSION,
            "model_sha256": self.model_sha256,
            "base_config": None,
            "requested": list(self.requested),
        }
        if self.base_config is not None:
            base = self.base_config.to_dict()
            del base["tensor_overrides"]
            d["base_config"] = base
        if self.note:
            d["note"] = self.note
        if self.target_fixes is not None:
            d["target_fixes"] = {"target": self.target_fixes[0], "fixes": list(self.target_fixes[1])}
        d["tensor_quant_overrides"] = {name: [_entry_json(e) for e in entries] for name, entries in self.overrides}
        return d

    @classmethod
    def from_dict(cls, d: Any) -> OverridesFile:
        """Inverse of :meth:`to_dict`; raises one :class:`OverridesError` listing every problem."""
        if not isinstance(d, Mapping):
            raise OverridesError([f"an overrides file must be a JSON object, got {type(d).__name__}"])
        problems: list[str] = []
        unknown = sorted(str(k) for k in d if k not in _TOP_KEYS)
        if unknown:
            problems.append(f"unknown top-level key(s) {unknown}; allowed: {list(_TOP_KEYS)}")
        version = d.get("schema_version")
        if "schema_version" not in d:
            problems.append(f"missing schema_version (expected {OVERRIDES_SCHEMA_VERSION})")
        elif isinstance(version, bool) or version not in (OVERRIDES_SCHEMA_VERSION, TARGET_FIXES_SCHEMA_VERSION):
            problems.append(
                f"schema_version {version!r} is not supported (expected {OVERRIDES_SCHEMA_VERSION}, or "
                f"{TARGET_FIXES_SCHEMA_VERSION} with target_fixes)"
            )
        fixes = _read_target_fixes(d, version, problems)
        sha = d.get("model_sha256")
        if sha is not None and not isinstance(sha, str):
            problems.append(f"model_sha256 must be a string or null, got {sha!r}")
            sha = None
        base: QuantConfig | None = None
        raw_base = d.get("base_config")
        if raw_base is not None:
            if not isinstance(raw_base, Mapping):
                problems.append(f"base_config must be an object or null, got {type(raw_base).__name__}")
            else:
                try:
                    base = QuantConfig.from_dict(raw_base)
                except ConfigError as exc:
                    problems.append(f"base_config: {exc}")
        requested = d.get("requested", [])
        if not isinstance(requested, list) or not all(isinstance(r, str) and r for r in requested):
            problems.append(f"requested must be a list of tensor names, got {requested!r}")
            requested = []
        note = d.get("note", "")
        if not isinstance(note, str):
            problems.append(f"note must be a string, got {note!r}")
            note = ""
        if "tensor_quant_overrides" not in d:
            problems.append("missing tensor_quant_overrides")
            overrides: Overrides = ()
            broken: set[str] = set()
        else:
            overrides, ps, broken = _parse_overrides(d["tensor_quant_overrides"])
            problems += ps
        # Semantic rules run on what parsed, skipping tensors that already have a parse problem.
        problems += _file_problems(tuple((n, es) for n, es in overrides if n not in broken), sha, base)
        if problems:
            raise OverridesError(problems)
        return cls(overrides, sha, base, tuple(requested), note, fixes)

    def to_json(self) -> str:
        """Strict JSON text (no NaN/Infinity)."""
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> OverridesFile:
        """Parse JSON text (see :meth:`from_dict`); malformed JSON is reported with its line and column."""
        try:
            data = parse_json(text)
        except json.JSONDecodeError as exc:
            raise OverridesError([f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"]) from exc
        return cls.from_dict(data)

    def save(self, path: str | Path) -> Path:
        """Write the JSON file atomically."""
        from qdebug.io import atomic_write_text

        return atomic_write_text(path, self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> OverridesFile:
        """Read and validate a file; every problem is reported at once, prefixed with the path."""
        p = Path(path)
        text = read_input_text(p, "overrides file")
        try:
            return cls.from_json(text)
        except OverridesError as exc:
            raise OverridesError(exc.problems, source=p, warnings=exc.warnings) from exc

    # ------------------------------------------------------------------------------------- ORT
    def to_ort(self) -> dict[str, list[dict[str, Any]]]:
        """ORT's in-memory ``TensorQuantOverrides`` (``QuantType`` members, ``recv_nodes`` sets), a fresh copy.

        Accepted unchanged by ``get_qnn_qdq_config(init_overrides=...)``, ``get_qdq_config(tensor_quant_overrides=...)``
        and ``quantize_static(extra_options={"TensorQuantOverrides": ...})``.
        """
        return {name: [e.to_ort() for e in entries] for name, entries in self.overrides}

    @classmethod
    def from_ort(
        cls,
        overrides: Mapping[str, Any],
        *,
        model_sha256: str | None = None,
        base_config: QuantConfig | None = None,
        requested: Iterable[str] = (),
        note: str = "",
    ) -> OverridesFile:
        """From ORT's dict (e.g. the output of its mixed-precision fixer): ``QuantType`` members or names,
        ``recv_nodes`` as sets or lists, numpy scalars. Same validation as :meth:`from_dict`."""
        d: dict[str, Any] = {
            "schema_version": OVERRIDES_SCHEMA_VERSION,
            "model_sha256": model_sha256,
            "base_config": None,
            "requested": list(requested),
            "note": note,
            "tensor_quant_overrides": _plain(overrides),
        }
        if base_config is not None:
            d["base_config"] = base_config.to_dict()
        return cls.from_dict(d)

    # ---------------------------------------------------------------------------------- config
    def resolve_base(self, config: QuantConfig | None) -> QuantConfig:
        """The base config to quantize with: ``config`` if given (it must agree with ``base_config`` on every
        field but ``tensor_overrides``), else ``base_config``, else the defaults."""
        if config is None:
            return self.base_config or QuantConfig()
        if self.base_config is None:
            return config
        base = self.base_config
        conflicts = [
            f"{f.name}: config says {getattr(config, f.name)!r}, overrides file says {getattr(base, f.name)!r}"
            for f in fields(QuantConfig)
            if f.name != "tensor_overrides" and getattr(config, f.name) != getattr(base, f.name)
        ]
        if conflicts:
            raise ConfigError("config and overrides file's base_config disagree: " + "; ".join(conflicts))
        return config

    def drift(self, config: QuantConfig) -> list[str]:
        """Warnings when ``config`` differs from ``base_config`` in a setting the fixed overrides depend on."""
        if self.base_config is None:
            return []
        return [
            f"the overrides were fixed for {key}={getattr(self.base_config, key)!r} but are applied with "
            f"{key}={getattr(config, key)!r}; their convert boundaries may no longer fit"
            for key in ("activation_type", "activation_symmetric", "target")
            if getattr(config, key) != getattr(self.base_config, key)
        ]

    def apply_to(self, config: QuantConfig) -> QuantConfig:
        """``config`` with these tensor overrides. A config that already holds *different* overrides is an error."""
        if config.tensor_overrides and config.tensor_overrides != self.overrides:
            mine, theirs = dict(self.overrides), dict(config.tensor_overrides)
            differ = sorted(n for n in set(mine) | set(theirs) if mine.get(n) != theirs.get(n))
            raise ConfigError(f"the config already has different tensor overrides for {_listing(differ)}")
        problems = _config_problems(self.overrides, config)
        if problems:
            raise OverridesError(problems)
        return config.replace(tensor_overrides=self.overrides)


# ------------------------------------------------------------------------------------- model rules
def _listing(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:_MAX_LISTED])
    return shown + (f" and {len(names) - _MAX_LISTED} more" if len(names) > _MAX_LISTED else "")


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
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


def _target_fixes_problems(raw: Any) -> list[str]:
    """What is wrong with a ``target_fixes`` entry (``{"target": name, "fixes": [name, ...]}``)."""
    if not isinstance(raw, Mapping) or set(raw) != {"target", "fixes"}:
        return [f"target_fixes must be an object with 'target' and 'fixes', got {raw!r}"]
    target, fixes = raw["target"], raw["fixes"]
    ok = isinstance(target, str) and target and isinstance(fixes, list | tuple)
    if not ok or not all(isinstance(f, str) and f for f in fixes):
        return [f"target_fixes needs a target name and a list of fix names, got {dict(raw)!r}"]
    return []


def _read_target_fixes(d: Mapping[str, Any], version: Any, problems: list[str]) -> tuple[str, tuple[str, ...]] | None:
    """The ``target_fixes`` entry of a file (schema 2 only; schema 2 without it is a problem too)."""
    raw = d.get("target_fixes")
    if raw is None:
        if version == TARGET_FIXES_SCHEMA_VERSION:
            problems.append(f"schema_version {TARGET_FIXES_SCHEMA_VERSION} needs target_fixes")
        return None
    if version != TARGET_FIXES_SCHEMA_VERSION:
        problems.append(f"target_fixes needs schema_version {TARGET_FIXES_SCHEMA_VERSION}, got {version!r}")
        return None
    ps = _target_fixes_problems(raw)
    problems += ps
    return None if ps else (str(raw["target"]), tuple(str(f) for f in raw["fixes"]))


def _identity_problems(
    ofile: OverridesFile, known: set[str], model_sha256: str, warnings: list[str], problems: list[str]
) -> None:
    """Which model the file was made for, and overridden/requested tensors the model does not have."""
    unknown = [t for t in ofile.tensors if t not in known]
    if ofile.model_sha256 is not None and ofile.model_sha256 != model_sha256:
        msg = (
            f"the overrides were made for a different model file (sha256 {ofile.model_sha256[:12]}…, "
            f"this model's is {model_sha256[:12]}…)"
        )
        if unknown:
            msg += f"; overridden tensors not in this model: {_listing(unknown)}"
        else:
            msg += "; every overridden tensor exists in this model"
        warnings.append(msg)
    if unknown:
        problems.append(
            f"{len(unknown)} overridden tensor(s) are not tensors of the model "
            f"(graph input, node output or initializer): {_listing(unknown)}"
        )
    missing_req = [t for t in ofile.requested if t not in known]
    if missing_req:
        warnings.append(f"requested tensor(s) not in the model: {_listing(missing_req)}")


def _entry_problems(name: str, entries: tuple[TensorOverride, ...], weight: Any, consumers: list[str]) -> list[str]:
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


def _channel_problems(name: str, entries: tuple[TensorOverride, ...], weight: Any) -> list[str]:
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


def check_against_model(ofile: OverridesFile, model: onnx.ModelProto, model_sha256: str) -> list[str]:
    """Check the overrides against the float ``model`` (whose file has sha256 ``model_sha256``).

    Returns warnings (e.g. a checksum mismatch, an override on a non-float tensor that ORT will ignore) and
    raises one :class:`OverridesError` listing every hard problem: tensors not in the model, ``recv_nodes``
    that do not consume the tensor, activation-only keys on weights and weight-only keys on activations,
    per-channel overrides that do not fit the weight. The error carries the warnings too (``.warnings``).
    """
    import onnx

    from qdebug.quantizer import quantizer_view

    # The overrides name tensors and nodes of the model ORT quantizes: its Constant nodes made initializers, and its
    # opset raised first for 16-bit types.
    named = {t for _, es in ofile.overrides for e in es for t in (e.quant_type, e.convert and e.convert.quant_type)}
    model = quantizer_view(model, "uint8", sorted(t for t in named if t)) or model
    ix = GraphIndex(model)
    inits = {t.name: t for t in model.graph.initializer}
    known = set(ix.producer) | {i.name for i in model.graph.input} | set(inits)
    warnings: list[str] = []
    problems: list[str] = []
    _identity_problems(ofile, known, model_sha256, warnings, problems)
    types = _elem_types(model)
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    for name, entries in ofile.overrides:
        if name not in known:
            continue
        if name in types and types[name] not in floats:
            dtype = onnx.TensorProto.DataType.Name(types[name])
            warnings.append(f"{name}: is {dtype}, not float; ORT does not quantize it, so its override has no effect")
        consumers = [n.name for n in ix.distinct_consumers(name)]
        problems += _entry_problems(name, entries, inits.get(name), consumers)
        problems += _channel_problems(name, entries, inits.get(name))
    if problems and ofile.target_fixes is not None:
        target, fixes = ofile.target_fixes
        problems.append(
            f"these overrides were made for the model after {target}'s compatibility fixes {list(fixes)}: apply them "
            f"with `qdebug build --target {target} --overrides` (it runs the same fixes first), or search again with "
            "--no-target-fixes for overrides of the model as given"
        )
    if problems:
        raise OverridesError(problems, warnings=warnings)
    return warnings
