"""Layering: the engine and its CLI never import UI, plotting, torch or the optional QNN backend."""

from __future__ import annotations

import json
import subprocess
import sys

FORBIDDEN = ("ipywidgets", "plotly", "voila", "widgets", "IPython", "matplotlib", "onnxruntime_qnn", "torch")

# Every submodule of qdebug (Polygraphy-style): a new module that imports a UI library or an optional
# backend at import time fails here without anyone having to list it.
SCRIPT = """
import importlib, json, pkgutil, sys
import qdebug
for info in pkgutil.walk_packages(qdebug.__path__, "qdebug."):
    importlib.import_module(info.name)
import qdebug.targets
qdebug.targets.available_targets()  # listing targets must not need their backends either
print(json.dumps(sorted(sys.modules)))
"""


def test_core_imports_no_ui_or_optional_backends() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    modules = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "qdebug.cli" in modules and "qdebug.debugger" in modules  # the script really ran
    leaked = sorted(m for m in modules if m.split(".")[0] in FORBIDDEN)
    assert leaked == []


def test_the_check_can_fail() -> None:
    # Sanity check of the method: a module that is imported does show up.
    proc = subprocess.run(
        [sys.executable, "-c", "import json, sys, numpy; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "numpy" in json.loads(proc.stdout)
