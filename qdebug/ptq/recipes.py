"""The PTQ recipes qdebug can run: a library and the options its worker passes to it, registered by name."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from qdebug.errors import ConfigError
from qdebug.ptq.env import PtqLibrary

__all__ = ["RECIPES", "PtqRecipe", "get_recipe"]

SCHEMA_VERSION = 1

#: A recipe option's value (JSON: it travels to the worker in the request file).
OptionValue = str | int | float | bool


@dataclass(frozen=True)
class PtqRecipe:
    """One way of quantizing with a library: its name, what it does, and the options the library's worker reads.

    NNCF's worker reads ``preset`` ("performance" | "mixed"), ``model_type`` ("transformer"),
    ``fast_bias_correction`` (bool; ``False`` runs the full BiasCorrection) and ``smooth_quant_alpha``; Quark's
    reads ``scale`` ("float" | "pow2"), ``calibrate_method`` ("minmax" | "percentile" | "minmse" | "entropy"),
    ``per_channel`` (weights; default true), ``cle`` (bool), ``smooth_quant_alpha``, ``adaround`` (bool) and
    ``adaround_steps`` (int). Quark's activation and weight types are ``run_ptq``'s (its own A8W8/XINT8
    configurations use int8 activations: pass ``activation_type="int8"`` for those exactly).
    """

    library: PtqLibrary
    name: str
    description: str
    options: Mapping[str, OptionValue] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "library", PtqLibrary(self.library))
        if not self.name or not self.name.strip():
            raise ConfigError("a PTQ recipe needs a name")
        try:
            json.dumps(dict(self.options))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"PTQ recipe {self.name!r}: options must be JSON values ({exc})") from exc
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``schema_version``."""
        return {
            "schema_version": SCHEMA_VERSION,
            "library": str(self.library),
            "name": self.name,
            "description": self.description,
            "options": dict(self.options),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PtqRecipe:
        """Inverse of :meth:`to_dict`."""
        return cls(PtqLibrary(d["library"]), str(d["name"]), str(d.get("description", "")), dict(d.get("options", {})))


def _recipes(*recipes: PtqRecipe) -> Mapping[str, PtqRecipe]:
    return MappingProxyType({r.name: r for r in recipes})


_NNCF, _QUARK = PtqLibrary.NNCF, PtqLibrary.QUARK

#: Every recipe by name. NNCF's quantize per channel where the opset allows (the model is raised to opset 13
#: first) and pick each tensor's signedness themselves; Quark's are its CPU configurations.
RECIPES: Mapping[str, PtqRecipe] = _recipes(
    PtqRecipe(_NNCF, "nncf-default", "NNCF's default: performance preset (symmetric), fast bias correction", {}),
    PtqRecipe(
        _NNCF, "nncf-mixed", "NNCF, mixed preset: symmetric weights, asymmetric activations", {"preset": "mixed"}
    ),
    PtqRecipe(
        _NNCF,
        "nncf-transformer",
        "NNCF with model_type=TRANSFORMER: SmoothQuant, mixed preset, some MatMul/Gemm left in float",
        {"model_type": "transformer"},
    ),
    PtqRecipe(
        _NNCF,
        "nncf-bias-correction",
        "NNCF, mixed preset with the full (not fast) BiasCorrection; fails on many models",
        {"preset": "mixed", "fast_bias_correction": False},
    ),
    PtqRecipe(
        _QUARK,
        "quark-xint8",
        "AMD Quark XINT8-style: power-of-two scales, MinMSE activation calibration, per-tensor (as Quark requires)",
        {"scale": "pow2", "calibrate_method": "minmse", "per_channel": False},
    ),
    PtqRecipe(
        _QUARK,
        "quark-a8w8",
        "AMD Quark A8W8-style: float scales, Percentile activation calibration (Quark's default), per-channel weights",
        {},
    ),
    PtqRecipe(_QUARK, "quark-cle", "quark-a8w8 after cross-layer equalization (CLE)", {"cle": True}),
    PtqRecipe(_QUARK, "quark-minmse", "quark-a8w8 with MinMSE activation calibration", {"calibrate_method": "minmse"}),
    PtqRecipe(_QUARK, "quark-smoothquant", "quark-a8w8 after SmoothQuant (alpha 0.5)", {"smooth_quant_alpha": 0.5}),
    PtqRecipe(
        _QUARK,
        "quark-adaround",
        "quark-a8w8 with AdaRound weight rounding, 500 steps (minutes per model: run it with a timeout)",
        {"adaround": True, "adaround_steps": 500},
    ),
)


def get_recipe(recipe: str | PtqRecipe) -> PtqRecipe:
    """``recipe`` itself, or the registered recipe of that name (:class:`ConfigError` naming the known ones)."""
    if isinstance(recipe, PtqRecipe):
        return recipe
    try:
        return RECIPES[recipe]
    except KeyError:
        raise ConfigError(f"unknown PTQ recipe {recipe!r}; known: {', '.join(RECIPES)}") from None
