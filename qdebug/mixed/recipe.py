"""The recipe of a variant the dashboard made, as an overrides JSON the CLI rebuilds the same model from.

Two kinds, by how the variant was made:

* a patch of the QDQ model the user gave (:mod:`qdebug.mixed.patch`): each re-gridded tensor's type with the exact
  scale and zero point it was given, and :attr:`~qdebug.mixed.overrides.OverridesFile.quant_model_sha256` naming the
  user's model; ``qdebug quantize -f FLOAT --quant-model USER.qdq.onnx --overrides recipe.json -o fixed.qdq.onnx``
  applies it to that model;
* a quantization of the float model by qdebug: the config's overrides with the calibration range of every tensor
  (``rmin``/``rmax``), so ``qdebug quantize -f FLOAT --overrides recipe.json -o fixed.qdq.onnx`` gives the same
  activation grid without the calibration data (ORT takes an override's range over a calibrated one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import onnx

from qdebug.config import Overrides, QuantConfig, TensorOverride, make_overrides
from qdebug.mixed.overrides import OverridesFile
from qdebug.mixed.patch import TensorPatch, recipe_overrides


def calibration_ranges(cache: str | Path) -> dict[str, tuple[float, float]]:
    """Every tensor's ``(rmin, rmax)`` in ORT's calibration cache ``cache``."""
    from onnxruntime.quantization.calibrate import load_tensors_data

    data = load_tensors_data(str(cache))
    return {
        n: (float(td.range_value[0].reshape(-1)[0]), float(td.range_value[1].reshape(-1)[0]))
        for n, td in data.data.items()
    }


def effective_ranges(
    model: onnx.ModelProto, ranges: Mapping[str, tuple[float, float]], excluded: Sequence[str] = ()
) -> dict[str, tuple[float, float]]:
    """``ranges`` as ORT's quantizer adjusts them before computing any scale (``adjust_tensor_ranges``): the input of a
    ``Relu``/``Clip`` that feeds only it takes its output's range, a ``Softmax`` output is ``[0, 1]`` (an override's
    range is used as given, so a recipe must carry the adjusted one)."""
    out = dict(ranges)
    readers: dict[str, int] = {}
    for n in model.graph.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    for n in model.graph.node:
        if n.name in excluded:
            continue
        if n.op_type in ("Clip", "Relu") and readers.get(n.input[0]) == 1 and n.input[0] in out and n.output[0] in out:
            out[n.input[0]] = out[n.output[0]]
        elif n.op_type == "Softmax" and n.output[0] in out:
            out[n.output[0]] = (0.0, 1.0)
    return out


def with_ranges(overrides: Overrides, ranges: Mapping[str, tuple[float, float]]) -> dict[str, list[TensorOverride]]:
    """``overrides`` with ``ranges`` written into them: an overridden tensor's entries take its range (unless they
    fix a scale or a range already), every other tensor with a range gets an entry holding only that range."""
    out: dict[str, list[TensorOverride]] = {}
    given = dict(overrides)
    for name in sorted(set(given) | set(ranges)):
        entries = list(given.get(name, (TensorOverride(),)))
        if name in ranges:
            lo, hi = ranges[name]
            entries = [_ranged(e, lo, hi) for e in entries]
        if any(e != TensorOverride() for e in entries):
            out[name] = entries
    return out


def _ranged(e: TensorOverride, lo: float, hi: float) -> TensorOverride:
    """``e`` with the range ``(lo, hi)``, and its convert with it too (ORT converts from the calibrated range)."""
    if e.axis is not None:
        return e
    if e.convert is not None and e.convert.rmin is None:
        e = replace(e, convert=replace(e.convert, rmin=lo, rmax=hi))
    return e if (e.scale is not None or e.rmin is not None) else replace(e, rmin=lo, rmax=hi)


def patch_recipe(
    patches: Sequence[TensorPatch],
    config: QuantConfig,
    *,
    model_sha256: str,
    quant_model_sha256: str,
    requested: Sequence[str] = (),
    note: str = "",
    target_fixes: tuple[str, Sequence[str]] | None = None,
) -> OverridesFile:
    """The recipe of a patch of the user's QDQ model (module docstring, first kind)."""
    return OverridesFile(
        make_overrides(recipe_overrides(tuple(patches))),
        model_sha256=model_sha256,
        base_config=config.replace(tensor_overrides=()),
        requested=tuple(requested),
        note=note,
        target_fixes=None if target_fixes is None else (target_fixes[0], tuple(target_fixes[1])),
        quant_model_sha256=quant_model_sha256,
    )


def ranges_recipe(
    float_model: onnx.ModelProto,
    config: QuantConfig,
    cache: str | Path,
    *,
    model_sha256: str,
    requested: Sequence[str] = (),
    note: str = "",
    target_fixes: tuple[str, Sequence[str]] | None = None,
) -> OverridesFile:
    """The recipe of a quantization of ``float_model`` by qdebug with its calibration ranges as ORT used them
    (:func:`effective_ranges`; module docstring, second kind)."""
    ranges = effective_ranges(float_model, calibration_ranges(cache), config.nodes_to_exclude)
    return OverridesFile(
        make_overrides(with_ranges(config.tensor_overrides, ranges)),
        model_sha256=model_sha256,
        base_config=config.replace(tensor_overrides=()),
        requested=tuple(requested),
        note=note,
        target_fixes=None if target_fixes is None else (target_fixes[0], tuple(target_fixes[1])),
    )


__all__ = ["calibration_ranges", "patch_recipe", "ranges_recipe", "with_ranges"]
