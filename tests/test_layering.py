"""Layering: the engine and its CLI never import UI, plotting, torch or the optional QNN backend."""

from __future__ import annotations

import json
import subprocess
import sys

FORBIDDEN = ("ipywidgets", "plotly", "voila", "widgets", "IPython", "matplotlib", "onnxruntime_qnn", "torch")

SCRIPT = """
import json, sys
import qdebug
import qdebug.cli, qdebug.debug, qdebug.quantize
import qdebug.capture, qdebug.config, qdebug.data, qdebug.graph, qdebug.metrics, qdebug.report
print(json.dumps(sorted(sys.modules)))
"""


def test_core_imports_no_ui_or_optional_backends() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    modules = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "qdebug.cli" in modules and "qdebug.debug" in modules  # the script really ran
    leaked = sorted(m for m in modules if m.split(".")[0] in FORBIDDEN)
    assert leaked == []


def test_the_check_can_fail() -> None:
    # Sanity check of the method: a module that is imported does show up.
    proc = subprocess.run(
        [sys.executable, "-c", "import json, sys, numpy; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "numpy" in json.loads(proc.stdout)
