"""A fix's choice as a recipe the CLI and the dashboard apply: the overrides JSON ``qdebug quantize --overrides``
consumes (its base config carries per-channel, the weight type and the float fallback; its tensor overrides the
ranges and the 16-bit tensors), or, when a PTQ library's model won, that library recipe."""

from __future__ import annotations

import json
from pathlib import Path

from qdebug.errors import ConfigError
from qdebug.fix.result import FixResult


def recipe_json(result: FixResult, float_model: str | Path) -> str:
    """The chosen point's recipe as JSON text, checked against ``float_model``."""
    from qdebug.mixed.overrides import OverridesFile, check_against_model
    from qdebug.model_io import file_sha256, load_model

    chosen = result.trial(result.chosen)
    if chosen.library_recipe is not None:
        from qdebug.ptq import get_recipe

        doc = {"schema_version": 1, "kind": "qdebug-ptq-recipe", "recipe": get_recipe(chosen.library_recipe).to_dict(),
               "note": "a PTQ library's model was measured best: rerun it with qdebug fix --library "
               f"{chosen.library_recipe}"}  # fmt: skip
        return json.dumps(doc, indent=2)
    if chosen.config is None:
        raise ConfigError(f"the chosen point {chosen.name!r} has no recipe (it is your own model)")
    sha = file_sha256(float_model)
    ofile = OverridesFile.from_config(chosen.config, model_sha256=sha, requested=(),
                                      note=f"qdebug fix: {chosen.description}")  # fmt: skip
    check_against_model(ofile, load_model(float_model, "float model"), sha)
    return ofile.to_json()


__all__ = ["recipe_json"]
