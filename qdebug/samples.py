"""The bundled sample models (``sample_models/registry.json``): what each is and how to check it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qdebug.errors import InputFileError

SAMPLE_DIR = Path(__file__).resolve().parent.parent / "sample_models"


@dataclass(frozen=True)
class SampleModel:
    """One entry of the registry, with absolute paths."""

    name: str
    path: Path
    description: str
    task: str
    calibration: Path
    evaluation: Path
    label_key: str
    float_accuracy: float
    inputs: tuple[dict[str, Any], ...]


def list_samples(directory: Path = SAMPLE_DIR) -> list[SampleModel]:
    """Every sample model in the registry."""
    reg = directory / "registry.json"
    try:
        data = json.loads(reg.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise InputFileError(f"{reg}: cannot read the sample registry ({exc})") from exc
    return [
        SampleModel(
            name=m["name"],
            path=directory / m["file"],
            description=m.get("description", ""),
            task=m["task"],
            calibration=directory / m["calibration"],
            evaluation=directory / m["evaluation"],
            label_key=m.get("label_key", "label"),
            float_accuracy=float(m["float_accuracy"]),
            inputs=tuple(m.get("inputs", ())),
        )
        for m in data["models"]
    ]
