"""The models a debug session starts from, made ready for a target: its compatibility fixes (:meth:`Target.prepare
<qdebug.targets.base.Target.prepare>`, the call ``qdebug build`` makes) on the float model, or, for a float/QDQ pair
the user gave, the input shapes the target fixed applied to both models, so the pair stays the user's pair.

The dashboard's Run calls :func:`prepare_models`; the fixed models are copies written into the run's folder and the
user's files are only read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import onnx

from qdebug.errors import MissingExtraError
from qdebug.io import atomic_save_model
from qdebug.model_io import input_specs, load_model
from qdebug.passes import PassReport
from qdebug.targets.base import BuildOptions, ShapeSource
from qdebug.targets.model_fixes import fix_static_shapes

if TYPE_CHECKING:
    from qdebug.config import QuantConfig

__all__ = ["PreparedModels", "fix_pair_shapes", "prepare_models"]


@dataclass(frozen=True)
class PreparedModels:
    """The models to debug for a target: the float model (a fixed copy, or the user's file when nothing changed), the
    QDQ model if one was given, the config to quantize with, and the fixes run on a float model quantized here
    (``None``: none ran, because a QDQ model was given or the target's backend is not installed here)."""

    float_model: Path
    quant_model: Path | None
    config: QuantConfig | None
    fixes: tuple[PassReport, ...] | None


def prepare_models(
    float_model: Path,
    quant_model: Path | None,
    options: BuildOptions,
    config: QuantConfig | None,
    data: Path | None,
    out_dir: Path,
    progress: Callable[[str], None] | None = None,
) -> PreparedModels:
    """``options.target``'s compatibility fixes on the float model (e.g. input shapes fixed from ``data``'s first
    sample for QNN, BatchNormalization folded for Deeploy), written to ``out_dir`` when they changed it. With a given
    QDQ model only the input shapes apply, to both models (:func:`fix_pair_shapes`). A target whose backend is missing
    prepares nothing: its compile says why."""
    target = options.target
    model = load_model(float_model, "float model")
    if progress is not None:
        progress(f"applying the {options.device} compatibility fixes")
    try:
        prepared = target.prepare(model, config, options, ShapeSource(None, data))
    except MissingExtraError:
        return PreparedModels(float_model, quant_model, config, None)
    if quant_model is not None:
        pair = fix_pair_shapes(float_model, quant_model, prepared.model, out_dir)
        return PreparedModels(pair[0], pair[1], config, None)
    if not prepared.changed:
        return PreparedModels(float_model, None, config, tuple(prepared.fixes))
    path = atomic_save_model(prepared.model, out_dir / f"{float_model.stem}.{options.device}.onnx")
    return PreparedModels(path, None, prepared.config, tuple(prepared.fixes))


def fix_pair_shapes(
    float_model: Path, quant_model: Path, prepared: onnx.ModelProto, out_dir: Path
) -> tuple[Path, Path]:
    """The given pair with the input shapes the target fixed in ``prepared`` (copies in ``out_dir``, named
    ``<stem>.static.onnx``), or as is when the float model's inputs were static already or the target fixed none."""
    before = input_specs(load_model(float_model, "float model"))
    after = input_specs(prepared)
    if all(s.is_static for s in before) or not all(s.is_static for s in after):
        return float_model, quant_model
    shapes = {s.name: tuple(int(d) for d in s.shape if isinstance(d, int)) for s in after}
    out: list[Path] = []
    for path, what in ((float_model, "float model"), (quant_model, "quantized model")):
        fixed, _ = fix_static_shapes(load_model(path, what), shapes)
        out.append(atomic_save_model(fixed, out_dir / f"{path.stem}.static.onnx"))
    return out[0], out[1]
