"""Layering: the engine and its CLI never import UI, plotting, torch or the optional QNN backend."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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


ROOT = Path(__file__).resolve().parents[1]
#: The contracts that must hold with ``TYPE_CHECKING`` imports counted too: an import made only for a type is still
#: a dependency, and a cycle hidden behind one is a cycle (issue 36).
TYPED_CONTRACTS = ("acyclic", "mixed", "fix", "render", "targets", "capture", "kernels")


def test_contracts_hold_with_type_checking_imports(tmp_path: Path) -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert "exclude_type_checking_imports = true" in text
    config = tmp_path / "pyproject.toml"
    config.write_text(text.replace("exclude_type_checking_imports = true", "exclude_type_checking_imports = false"))
    lint = Path(sys.executable).with_name("lint-imports")
    contracts = [a for c in TYPED_CONTRACTS for a in ("--contract", c)]
    proc = subprocess.run(
        [str(lint), "--no-cache", str(config), *contracts], cwd=ROOT, capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert f"{len(TYPED_CONTRACTS)} kept, 0 broken" in proc.stdout
