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
    per_channel: Mapping[str, int] | None = None,
    float_nodes: Sequence[str] = (),
    model_sha256: str,
    quant_model_sha256: str,
    requested: Sequence[str] = (),
    note: str = "",
    target_fixes: tuple[str, Sequence[str]] | None = None,
) -> OverridesFile:
    """The recipe of a patch of the user's QDQ model (module docstring, first kind); ``per_channel`` (weight → axis)
    and ``float_nodes`` are the diagnostics' remedies patched on top (:mod:`qdebug.mixed.patch_remedies`): an
    ``axis`` entry per weight, the nodes in ``base_config.nodes_to_exclude``."""
    entries: dict[str, list[TensorOverride]] = dict(recipe_overrides(tuple(patches)))
    entries.update({w: [TensorOverride(axis=a)] for w, a in (per_channel or {}).items()})
    base = config.replace(tensor_overrides=(), nodes_to_exclude=tuple(float_nodes) or config.nodes_to_exclude)
    return OverridesFile(
        make_overrides(entries),
        model_sha256=model_sha256,
        base_config=base,
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


def apply_to_quant_model(
    quant: onnx.ModelProto, float_model: onnx.ModelProto, ofile: OverridesFile
) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """A patch recipe applied to the QDQ model ``quant`` (``qdebug quantize --quant-model``): its activation entries
    re-grid ``quant``'s own Q/DQ pairs (:func:`~qdebug.mixed.patch.patch_model`), its ``axis`` entries quantize those
    weights per channel and ``base_config.nodes_to_exclude`` run in float
    (:mod:`qdebug.mixed.patch_remedies`), in that order, as the dashboard applies them. Returns the model and one
    line per change."""
    from qdebug.mixed.patch import patch_model
    from qdebug.mixed.patch_remedies import keep_in_float, per_channel_weights

    acts = tuple((t, es) for t, es in ofile.overrides if all(e.axis is None for e in es))
    weights = [t for t, es in ofile.overrides if any(e.axis is not None for e in es)]
    nodes = () if ofile.base_config is None else ofile.base_config.nodes_to_exclude
    done = patch_model(quant, acts, skip_float=True)
    lines = [p.describe() for p in done.patches] + [
        f"{t}: not quantized in the model, left float" for t in done.skipped
    ]
    model = done.model
    if weights:
        w = per_channel_weights(model, float_model, weights)
        model, lines = w.model, [*lines, *w.changes]
    if nodes:
        f = keep_in_float(model, float_model, nodes)
        model, lines = f.model, [*lines, *f.changes]
    return model, tuple(lines)


__all__ = ["apply_to_quant_model", "calibration_ranges", "patch_recipe", "ranges_recipe", "with_ranges"]
