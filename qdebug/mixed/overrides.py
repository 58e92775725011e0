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

The rules themselves live in :mod:`qdebug.mixed.overrides_rules`; this module holds the file and the check against a
model that gathers their problems.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdebug.config import Overrides, QuantConfig
from qdebug.errors import ConfigError
from qdebug.graph_index import GraphIndex
from qdebug.io import parse_json, read_input_text
from qdebug.mixed.overrides_rules import (
    OVERRIDES_SCHEMA_VERSION,
    TARGET_FIXES_SCHEMA_VERSION,
    TOP_KEYS,
    channel_problems,
    config_problems,
    elem_types,
    entry_json,
    entry_problems,
    file_problems,
    listing,
    parse_overrides,
    read_target_fixes,
    target_fixes_problems,
    to_plain,
)

if TYPE_CHECKING:
    import onnx

__all__ = [
    "OVERRIDES_SCHEMA_VERSION",
    "TARGET_FIXES_SCHEMA_VERSION",
    "OverridesError",
    "OverridesFile",
    "check_against_model",
]


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
    #: the sha256 of the QDQ model these overrides patch (a promotion of a model the user gave, whose other Q/DQ
    #: parameters stay its own: ``qdebug quantize --quant-model`` applies them to it, :mod:`qdebug.mixed.patch`);
    #: ``None``: they are applied by quantizing the float model
    quant_model_sha256: str | None = None

    def __post_init__(self) -> None:
        parse_problems: list[str] = []
        if isinstance(self.overrides, Mapping):  # dict entries go through the file parser: all problems at once
            overrides, parse_problems, _ = parse_overrides(self.overrides)
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
        p = file_problems(self.overrides, self.model_sha256, self.base_config)
        if not all(isinstance(r, str) and r for r in self.requested):
            p.append(f"requested must be a list of tensor names, got {list(self.requested)!r}")
        if not isinstance(self.note, str):
            p.append(f"note must be a string, got {self.note!r}")
        if self.quant_model_sha256 is not None and not isinstance(self.quant_model_sha256, str):
            p.append(f"quant_model_sha256 must be a string or null, got {self.quant_model_sha256!r}")
        if self.target_fixes is not None:
            p += target_fixes_problems({"target": self.target_fixes[0], "fixes": list(self.target_fixes[1])})
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
        quant_model_sha256: str | None = None,
    ) -> OverridesFile:
        """The overrides of ``config`` with the rest of it as ``base_config`` (``target_fixes``,
        ``quant_model_sha256``: see the fields)."""
        return cls(
            overrides=config.tensor_overrides,
            model_sha256=model_sha256,
            base_config=config.replace(tensor_overrides=()),
            requested=tuple(requested),
            note=note,
            target_fixes=None if target_fixes is None else (target_fixes[0], tuple(target_fixes[1])),
            quant_model_sha256=quant_model_sha256,
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
        if self.quant_model_sha256 is not None:
            d["quant_model_sha256"] = self.quant_model_sha256
        d["tensor_quant_overrides"] = {name: [entry_json(e) for e in entries] for name, entries in self.overrides}
        return d

    @classmethod
    def from_dict(cls, d: Any) -> OverridesFile:
        """Inverse of :meth:`to_dict`; raises one :class:`OverridesError` listing every problem."""
        if not isinstance(d, Mapping):
            raise OverridesError([f"an overrides file must be a JSON object, got {type(d).__name__}"])
        problems: list[str] = []
        unknown = sorted(str(k) for k in d if k not in TOP_KEYS)
        if unknown:
            problems.append(f"unknown top-level key(s) {unknown}; allowed: {list(TOP_KEYS)}")
        version = d.get("schema_version")
        if "schema_version" not in d:
            problems.append(f"missing schema_version (expected {OVERRIDES_SCHEMA_VERSION})")
        elif isinstance(version, bool) or version not in (OVERRIDES_SCHEMA_VERSION, TARGET_FIXES_SCHEMA_VERSION):
            problems.append(
                f"schema_version {version!r} is not supported (expected {OVERRIDES_SCHEMA_VERSION}, or "
                f"{TARGET_FIXES_SCHEMA_VERSION} with target_fixes)"
            )
        fixes = read_target_fixes(d, version, problems)
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
            overrides, ps, broken = parse_overrides(d["tensor_quant_overrides"])
            problems += ps
        # Semantic rules run on what parsed, skipping tensors that already have a parse problem.
        problems += file_problems(tuple((n, es) for n, es in overrides if n not in broken), sha, base)
        qsha = d.get("quant_model_sha256")
        if qsha is not None and not isinstance(qsha, str):
            problems.append(f"quant_model_sha256 must be a string or null, got {qsha!r}")
            qsha = None
        if problems:
            raise OverridesError(problems)
        return cls(overrides, sha, base, tuple(requested), note, fixes, qsha)

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
            "tensor_quant_overrides": to_plain(overrides),
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
            raise ConfigError(f"the config already has different tensor overrides for {listing(differ)}")
        problems = config_problems(self.overrides, config)
        if problems:
            raise OverridesError(problems)
        return config.replace(tensor_overrides=self.overrides)


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
            msg += f"; overridden tensors not in this model: {listing(unknown)}"
        else:
            msg += "; every overridden tensor exists in this model"
        warnings.append(msg)
    if unknown:
        problems.append(
            f"{len(unknown)} overridden tensor(s) are not tensors of the model "
            f"(graph input, node output or initializer): {listing(unknown)}"
        )
    missing_req = [t for t in ofile.requested if t not in known]
    if missing_req:
        warnings.append(f"requested tensor(s) not in the model: {listing(missing_req)}")


def check_against_model(ofile: OverridesFile, model: onnx.ModelProto, model_sha256: str) -> list[str]:
    """Check the overrides against the float ``model`` (whose file has sha256 ``model_sha256``).

    Returns warnings (e.g. a checksum mismatch, an override on a non-float tensor that ORT will ignore) and
    raises one :class:`OverridesError` listing every hard problem: tensors not in the model, ``recv_nodes``
    that do not consume the tensor, activation-only keys on weights and weight-only keys on activations,
    per-channel overrides that do not fit the weight. The error carries the warnings too (``.warnings``).
    """
    import onnx

    from qdebug.ort_view import quantizer_view

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
    types = elem_types(model)
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    for name, entries in ofile.overrides:
        if name not in known:
            continue
        if name in types and types[name] not in floats:
            dtype = onnx.TensorProto.DataType.Name(types[name])
            warnings.append(f"{name}: is {dtype}, not float; ORT does not quantize it, so its override has no effect")
        consumers = [n.name for n in ix.distinct_consumers(name)]
        problems += entry_problems(name, entries, inits.get(name), consumers)
        problems += channel_problems(name, entries, inits.get(name))
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
