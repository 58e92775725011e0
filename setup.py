"""Packaging details pyproject.toml cannot say: the UI package's import name and the bundled data.

* ``widgets/`` (the UI layer's folder in the repository) installs as ``qdebug_widgets``: a top-level ``widgets`` would
  collide with other distributions of that name in one environment. A source checkout imports it as either name.
* The sample models and the notebooks ship inside the wheel as package data of ``qdebug`` (``qdebug/_data/``), found
  through ``importlib.resources`` (:mod:`qdebug.samples`): ``build_py`` copies them there from the repository's
  ``sample_models/`` and ``notebooks/``, so the repository keeps one copy of each file.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
#: What the wheel carries of each bundled folder (no generator scripts: they need torch).
BUNDLED = {
    "sample_models": ("*.onnx", "*.npz", "registry.json", "README.md"),
    "notebooks": ("*.ipynb", "README.md", "share/voila/templates/qdebug/*", "share/voila_config/voila.py"),
}


class BuildWithData(build_py):
    """``build_py`` plus the bundled folders copied into ``qdebug/_data/`` of the build."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads the repository's folders themselves
            return
        for folder, patterns in BUNDLED.items():
            target = Path(self.build_lib) / "qdebug" / "_data" / folder
            target.mkdir(parents=True, exist_ok=True)
            for pattern in patterns:
                for src in sorted((ROOT / folder).glob(pattern)):
                    dest = target / src.relative_to(ROOT / folder)  # the Voila template keeps its folder layout
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src, dest)


setup(
    packages=[*find_packages(include=["qdebug", "qdebug.*"]), "qdebug_widgets"],
    package_dir={"qdebug_widgets": "widgets"},
    # The host kernels and harness that run Deeploy's generated C (qdebug.targets.deeploy_host).
    # ... and the vendored plotly.js bundle the HTML report inlines (qdebug/render/vendor/README.md).
    # ... and the compiled reduction's C source, built on first use (qdebug.capture.kernels.c_kernel).
    package_data={
        "qdebug.targets": ["deeploy_host/*.c", "deeploy_host/*.h"],
        "qdebug.capture.kernels": ["_reduce.c"],
        "qdebug.render": ["vendor/*.gz", "vendor/*.txt", "vendor/README.md"],
    },
    cmdclass={"build_py": BuildWithData},
)
