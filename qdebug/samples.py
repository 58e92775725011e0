"""What ships with qdebug: the sample models (``sample_models/registry.json``: what each is and how to check it) and
the notebooks (walkthroughs and the Voila dashboard).

An installed wheel carries them as package data under ``qdebug/_data/`` (``setup.py`` copies the repository's
``sample_models/`` and ``notebooks/`` there when it builds), found through :mod:`importlib.resources`; a source
checkout (an editable install) has no copy, and they are read from the repository's own folders.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from qdebug.errors import ConfigError, InputFileError

#: The package-data folder of an installed wheel.
DATA_PACKAGE = "_data"


def bundled(name: str) -> Path:
    """The folder of bundled files ``name`` (``sample_models`` or ``notebooks``): the wheel's package data, else the
    source checkout's folder of that name."""
    packaged = resources.files("qdebug") / DATA_PACKAGE / name
    if packaged.is_dir():
        return Path(str(packaged))  # a wheel installs qdebug as plain files: the traversable is a real path
    return Path(__file__).resolve().parent.parent / name


SAMPLE_DIR = bundled("sample_models")
NOTEBOOK_DIR = bundled("notebooks")
#: The walkthrough notebooks ``qdebug notebooks`` copies (the dashboard notebook is served by ``qdebug dashboard``).
WALKTHROUGHS = ("quickstart.ipynb", "mixed_precision.ipynb", "targets.ipynb")
DASHBOARD_NOTEBOOK = "dashboard.ipynb"
#: A Jupyter data folder (for ``JUPYTER_PATH``) holding qdebug's Voila template ``voila/templates/qdebug``: Voila's lab
#: template without its CDN links, so the dashboard asks nothing of any host but the local server.
VOILA_DATA_DIR = NOTEBOOK_DIR / "share"
VOILA_TEMPLATE = "qdebug"


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


def get_sample(name: str, directory: Path = SAMPLE_DIR) -> SampleModel:
    """The bundled sample ``name`` (a :class:`ConfigError` lists the others when there is none)."""
    samples = {s.name: s for s in list_samples(directory)}
    if name not in samples:
        raise ConfigError(f"no bundled sample model {name!r}; the samples are: {', '.join(sorted(samples))}")
    return samples[name]
