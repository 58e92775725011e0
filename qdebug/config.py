"""The unified quantization config: the single source of truth for how a model is quantized.

One frozen dataclass, :class:`QuantConfig`, describes every knob qdebug exposes (types, symmetry,
per-channel, calibration, synthetic data, target and per-tensor overrides). It is validated on
construction (everything that does not depend on the target), round-trips through JSON, and its fields are
turned into ONNX Runtime's types in exactly one function, :func:`ort_quant_options`. What a target can run and
which ORT recipe it uses belong to the target (:func:`qdebug.targets.base.validate_config`,
:func:`qdebug.targets.base.to_ort_config`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, NamedTuple

from qdebug.errors import ConfigError
from qdebug.io import parse_json, read_input_text
from qdebug.target_registry import config_problems

SCHEMA_VERSION = 1

#: qdebug's type names → ORT ``QuantType`` member names.
QUANT_TYPES: dict[str, str] = {
    "uint8": "QUInt8",
    "int8": "QInt8",
    "uint16": "QUInt16",
    "int16": "QInt16",
}
_ORT_TYPE_TO_NAME = {v: k for k, v in QUANT_TYPES.items()}
CALIBRATION_METHODS: dict[str, str] = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}
DISTRIBUTIONS = ("uniform", "normal")
DEFAULT_SYNTHETIC_SAMPLES = 32


def normalize_quant_type(name: str) -> str:
    """Accept ``uint8`` / ``QUInt8`` / ``u8`` spellings and return qdebug's canonical name."""
    key = str(name).strip()
    if key in QUANT_TYPES:
        return key
    if key in _ORT_TYPE_TO_NAME:
        return _ORT_TYPE_TO_NAME[key]
    short = {"u8": "uint8", "s8": "int8", "i8": "int8", "u16": "uint16", "s16": "int16", "i16": "int16"}
    if key.lower() in short:
        return short[key.lower()]
    raise ConfigError(f"unknown quantization type {name!r}; expected one of {sorted(QUANT_TYPES)}")


@dataclass(frozen=True)
class ConvertOverride:
    """A type conversion of a tensor at some of its consumers (ORT's ``convert`` entry)."""

    quant_type: str
    recv_nodes: tuple[str, ...] | None = None
    #: the converted grid's range (ORT's default: the tensor's calibrated range); a recipe that must rebuild the
    #: same model without the calibration data carries it
    rmin: float | None = None
    rmax: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "quant_type", normalize_quant_type(self.quant_type))
        if self.recv_nodes is not None:
            object.__setattr__(self, "recv_nodes", tuple(sorted(self.recv_nodes)))

    def to_dict(self) -> dict[str, Any]:
        """JSON form, omitting unset fields (``recv_nodes`` a list)."""
        d: dict[str, Any] = {"quant_type": self.quant_type}
        if self.recv_nodes is not None:
            d["recv_nodes"] = list(self.recv_nodes)
        d.update({k: v for k in ("rmin", "rmax") if (v := getattr(self, k)) is not None})
        return d


@dataclass(frozen=True)
class TensorOverride:
    """One entry of ORT's ``TensorQuantOverrides`` list for a tensor (one per channel if per-channel)."""

    quant_type: str | None = None
    scale: float | None = None
    zero_point: int | None = None
    symmetric: bool | None = None
    reduce_range: bool | None = None
    rmin: float | None = None
    rmax: float | None = None
    axis: int | None = None
    convert: ConvertOverride | None = None

    def __post_init__(self) -> None:
        if self.quant_type is not None:
            object.__setattr__(self, "quant_type", normalize_quant_type(self.quant_type))

    def problems(self, tensor: str) -> list[str]:
        """Every rule of ORT's override checker this entry breaks (empty when valid)."""
        out: list[str] = []
        if (self.scale is None) != (self.zero_point is None):
            out.append(f"{tensor}: 'scale' and 'zero_point' must be given together")
        if self.scale is not None:
            if not math.isfinite(self.scale) or self.scale <= 0:
                out.append(f"{tensor}: scale must be a finite positive number, got {self.scale}")
            clash = [k for k in ("symmetric", "reduce_range", "rmin", "rmax") if getattr(self, k) is not None]
            if clash:
                out.append(f"{tensor}: {', '.join(clash)} cannot be combined with an explicit scale/zero_point")
        for k in ("rmin", "rmax"):
            v = getattr(self, k)
            if v is not None and not math.isfinite(v):
                out.append(f"{tensor}: {k} must be finite, got {v}")
        if self.rmin is not None and self.rmax is not None and self.rmin > self.rmax:
            out.append(f"{tensor}: rmin {self.rmin} > rmax {self.rmax}")
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON form, omitting unset fields."""
        d: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            if isinstance(v, ConvertOverride):
                d[f.name] = v.to_dict()
            else:
                d[f.name] = v
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TensorOverride:
        """Inverse of :meth:`to_dict`; unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown tensor-override keys {unknown}; allowed: {sorted(known)}")
        kw = dict(d)
        if "convert" in kw and kw["convert"] is not None:
            c = kw["convert"]
            kw["convert"] = ConvertOverride(
                quant_type=c["quant_type"],
                recv_nodes=tuple(c["recv_nodes"]) if c.get("recv_nodes") is not None else None,
                rmin=c.get("rmin"),
                rmax=c.get("rmax"),
            )
        return cls(**kw)

    def to_ort(self, default_type: str = "uint8") -> dict[str, Any]:
        """ORT's dict form: ``QuantType`` members, ``recv_nodes`` as a set, and numbers as the numpy values
        ORT's quantizer computes with (it reads ``rmin.dtype`` and squeezes ``scale``). ``default_type`` is
        the type a ``zero_point`` takes when the entry sets no ``quant_type``."""
        import numpy as np
        from onnxruntime.quantization import QuantType

        np_types = {"uint8": np.uint8, "int8": np.int8, "uint16": np.uint16, "int16": np.int16}
        d: dict[str, Any] = {}
        for key, v in self.to_dict().items():
            if key == "quant_type":
                d[key] = QuantType[QUANT_TYPES[v]]
            elif key in ("rmin", "rmax", "scale"):
                d[key] = np.array(v, dtype=np.float32)
            elif key == "zero_point":
                d[key] = np.array(v, dtype=np_types[self.quant_type or normalize_quant_type(default_type)])
            elif key == "convert":
                conv: dict[str, Any] = {"quant_type": QuantType[QUANT_TYPES[v["quant_type"]]]}
                if "recv_nodes" in v:
                    conv["recv_nodes"] = set(v["recv_nodes"])
                conv.update({k: np.array(v[k], dtype=np.float32) for k in ("rmin", "rmax") if k in v})
                d[key] = conv
            else:
                d[key] = v
        return d


Overrides = tuple[tuple[str, tuple[TensorOverride, ...]], ...]


def make_overrides(mapping: Mapping[str, Any]) -> Overrides:
    """Normalise ``{tensor: [TensorOverride | dict, ...]}`` into the config's frozen form."""
    out: list[tuple[str, tuple[TensorOverride, ...]]] = []
    for name in sorted(mapping):
        entries = mapping[name]
        if isinstance(entries, TensorOverride | Mapping):
            entries = [entries]
        out.append(
            (
                name,
                tuple(e if isinstance(e, TensorOverride) else TensorOverride.from_dict(e) for e in entries),
            )
        )
    return tuple(out)


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def _is_opt_bool(v: Any) -> bool:
    return v is None or isinstance(v, bool)


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_opt_int(v: Any) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_names(v: Any) -> bool:
    return isinstance(v, list | tuple) and all(isinstance(e, str) and e for e in v)


def _is_overrides(v: Any) -> bool:
    return v is None or (isinstance(v, Mapping) and all(isinstance(e, Mapping | list) for e in v.values()))


#: The JSON type each config field takes (a string "no" for a boolean is an error, not ``True``).
_FIELD_TYPES: dict[str, tuple[Any, str]] = {
    "activation_type": (_is_str, "a type name"),
    "weight_type": (_is_str, "a type name"),
    "per_channel": (_is_bool, "true or false"),
    "activation_symmetric": (_is_bool, "true or false"),
    "weight_symmetric": (_is_opt_bool, "true, false or null"),
    "calibration_method": (_is_str, "a method name"),
    "num_samples": (_is_opt_int, "an integer or null"),
    "seed": (_is_int, "an integer"),
    "synthetic_distribution": (_is_str, "a distribution name"),
    "target": (_is_str, "a target name"),
    "tensor_overrides": (_is_overrides, "an object of tensor name -> list of override objects"),
    "nodes_to_exclude": (_is_names, "a list of node names"),
}


@dataclass(frozen=True)
class QuantConfig:
    """How to quantize a float model. Validated on construction; see ``docs/config.md``.

    ``weight_symmetric=None`` means "the target's default" (ORT: symmetric for signed weight types).
    ``num_samples=None`` means every sample of the given data, or :data:`DEFAULT_SYNTHETIC_SAMPLES`
    synthetic ones when there is no data.
    """

    activation_type: str = "uint8"
    weight_type: str = "uint8"
    per_channel: bool = False
    activation_symmetric: bool = False
    weight_symmetric: bool | None = None
    calibration_method: str = "minmax"
    num_samples: int | None = None
    seed: int = 0
    synthetic_distribution: str = "uniform"
    target: str = "cpu"
    tensor_overrides: Overrides = field(default_factory=tuple)
    #: nodes ORT leaves in float (its ``nodes_to_exclude``): a float fallback, e.g. an attention mask's path
    nodes_to_exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "activation_type", normalize_quant_type(self.activation_type))
        object.__setattr__(self, "nodes_to_exclude", tuple(sorted(set(self.nodes_to_exclude))))
        object.__setattr__(self, "weight_type", normalize_quant_type(self.weight_type))
        if isinstance(self.tensor_overrides, Mapping):
            object.__setattr__(self, "tensor_overrides", make_overrides(self.tensor_overrides))
        problems = self.problems()
        if problems:
            raise ConfigError("invalid quantization config: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """Every invalid or conflicting setting, all at once."""
        p: list[str] = []
        if self.calibration_method not in CALIBRATION_METHODS:
            p.append(f"calibration_method {self.calibration_method!r} not in {sorted(CALIBRATION_METHODS)}")
        if self.synthetic_distribution not in DISTRIBUTIONS:
            p.append(f"synthetic_distribution {self.synthetic_distribution!r} not in {list(DISTRIBUTIONS)}")
        if not isinstance(self.target, str) or not self.target:
            p.append(f"target must be a target name, got {self.target!r}")
        else:
            p.extend(config_problems(self))  # what the target can run (types, symmetry): the target's own rules
        if self.num_samples is not None and (not isinstance(self.num_samples, int) or self.num_samples < 1):
            p.append(f"num_samples must be a positive integer or null, got {self.num_samples!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            p.append(f"seed must be a non-negative integer, got {self.seed!r}")
        if self.calibration_method == "entropy" and self.activation_symmetric:
            p.append("calibration_method 'entropy' already picks a range; activation_symmetric conflicts")
        seen: set[str] = set()
        for name, entries in self.tensor_overrides:
            if name in seen:
                p.append(f"tensor {name!r} is overridden twice")
            seen.add(name)
            if not entries:
                p.append(f"tensor {name!r} has an empty override list")
            for e in entries:
                p.extend(e.problems(name))
        return p

    # ----------------------------------------------------------------- conversions
    @property
    def overrides_dict(self) -> dict[str, tuple[TensorOverride, ...]]:
        """Tensor overrides as a plain mapping."""
        return dict(self.tensor_overrides)

    def replace(self, **changes: Any) -> QuantConfig:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``schema_version``."""
        d = asdict(self)
        d["tensor_overrides"] = {n: [e.to_dict() for e in es] for n, es in self.tensor_overrides}
        if self.nodes_to_exclude:  # absent when empty: configs written before the field read the same
            d["nodes_to_exclude"] = list(self.nodes_to_exclude)
        else:
            d.pop("nodes_to_exclude")
        d["schema_version"] = SCHEMA_VERSION
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> QuantConfig:
        """Inverse of :meth:`to_dict`. Unknown keys and values of the wrong JSON type are errors (all listed), never
        silently coerced (``"per_channel": "no"`` is not true)."""
        if not isinstance(d, Mapping):
            raise ConfigError(f"a quantization config must be a JSON object, got {type(d).__name__}")
        data = dict(d)
        version = data.pop("schema_version", SCHEMA_VERSION)
        if version != SCHEMA_VERSION:
            raise ConfigError(f"quantization config schema_version {version} is not supported")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown quantization config keys {unknown}; allowed: {sorted(known)}")
        wrong = [
            f"{k} must be {what}, got {data[k]!r}"
            for k, (ok, what) in _FIELD_TYPES.items()
            if k in data and not ok(data[k])
        ]
        if wrong:
            raise ConfigError("invalid quantization config: " + "; ".join(wrong))
        if "tensor_overrides" in data:
            data["tensor_overrides"] = make_overrides(data["tensor_overrides"] or {})
        if "nodes_to_exclude" in data:
            data["nodes_to_exclude"] = tuple(data["nodes_to_exclude"])
        return cls(**data)

    def to_json(self) -> str:
        """Serialise to JSON text."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> QuantConfig:
        """Parse JSON text (see :meth:`from_dict`)."""
        try:
            return cls.from_dict(parse_json(text))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"quantization config is not valid JSON: {exc}") from exc

    @classmethod
    def load(cls, path: str | Path) -> QuantConfig:
        """Read a JSON config file (a regular file: :func:`qdebug.io.read_input_text`)."""
        text = read_input_text(path, "config")
        try:
            return cls.from_json(text)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from exc

    def merged(self, **flags: Any) -> QuantConfig:
        """Apply explicitly given settings on top of this config.

        A flag that contradicts a value this config set explicitly (i.e. not the default) is an error,
        never a silent override: the user said two different things.
        """
        defaults = QuantConfig()
        conflicts = []
        changes = {}
        for key, raw in flags.items():
            if raw is None:
                continue
            current = getattr(self, key)
            value = normalize_quant_type(raw) if key in ("activation_type", "weight_type") else raw
            if current != value and current != getattr(defaults, key):
                conflicts.append(f"{key}: config says {current!r}, command line says {value!r}")
            changes[key] = value
        if conflicts:
            raise ConfigError("conflicting quantization settings: " + "; ".join(conflicts))
        return self.replace(**changes) if changes else self

    def ort_overrides(self) -> dict[str, list[dict[str, Any]]]:
        """The tensor overrides in ORT's ``TensorQuantOverrides`` dict form."""
        return {name: [e.to_ort(self.activation_type) for e in entries] for name, entries in self.tensor_overrides}


class OrtQuantOptions(NamedTuple):
    """A :class:`QuantConfig`'s fields as ONNX Runtime's own types (what every ORT recipe takes)."""

    activation_type: Any
    weight_type: Any
    method: Any
    overrides: dict[str, list[dict[str, Any]]] | None


def ort_quant_options(config: QuantConfig) -> OrtQuantOptions:
    """The one place :class:`QuantConfig` values become ORT ``QuantType`` / ``CalibrationMethod`` / overrides."""
    from onnxruntime.quantization import CalibrationMethod, QuantType

    return OrtQuantOptions(
        activation_type=QuantType[QUANT_TYPES[config.activation_type]],
        weight_type=QuantType[QUANT_TYPES[config.weight_type]],
        method=CalibrationMethod[CALIBRATION_METHODS[config.calibration_method]],
        overrides=config.ort_overrides() or None,
    )
