"""The target registry imports built-in targets by name, one at a time (issue 36): a config loads its own target only,
and every name-imported module sits on the ``targets`` floor, which import-linter cannot check for it."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

from qdebug.target_registry import BUILTIN_TARGET_MODULES, BUILTIN_TARGETS

ROOT = Path(__file__).resolve().parents[1]

LOADED = """
import json, sys
{code}
print(json.dumps(sorted(m for m in sys.modules if m.startswith("qdebug"))))
"""


def _loaded(code: str) -> list[str]:
    """The qdebug modules a fresh interpreter has loaded after running ``code``."""
    proc = subprocess.run(
        [sys.executable, "-c", LOADED.format(code=code)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    modules: list[str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return modules


def _backends(modules: list[str]) -> list[str]:
    return [m for m in modules if m.startswith(("qdebug.capture", "qdebug.targets.qnn", "qdebug.targets.deeploy"))]


def test_default_config_loads_no_capture_and_no_target_backend() -> None:
    modules = _loaded("from qdebug.config import QuantConfig\nQuantConfig()")
    assert "qdebug.config" in modules and "qdebug.targets.cpu" in modules  # the default target's rules were asked
    assert _backends(modules) == []


def test_listing_target_names_imports_no_target() -> None:
    code = "from qdebug.target_registry import target_names\nassert target_names() == ('cpu', 'qnn', 'deeploy')"
    modules = _loaded(code)
    assert not [m for m in modules if m.startswith("qdebug.targets")]


def test_a_config_for_another_target_loads_that_target_only() -> None:
    config = "QuantConfig(target='deeploy', activation_type='int8', weight_type='int8')"
    code = f"from qdebug.config import QuantConfig\n{config}"
    modules = _loaded(code)
    assert "qdebug.targets.deeploy" in modules
    assert not [m for m in modules if m.startswith(("qdebug.capture", "qdebug.targets.qnn"))]


def test_every_builtin_module_registers_its_name() -> None:
    code = (
        "import importlib\nfrom qdebug import target_registry as r\n"
        "for name, module in r.BUILTIN_TARGETS.items():\n"
        "    importlib.import_module(module)\n"
        "    assert name in r._REGISTRY, (name, module)\n"
    )
    _loaded(code)
    assert tuple(BUILTIN_TARGETS.values()) == BUILTIN_TARGET_MODULES


def test_builtin_target_modules_sit_on_the_targets_floor() -> None:
    """The registry (ground floor) imports these by name; the edge goes up to ``targets`` and nowhere else, and each
    module is placed in the targets contract, so its own imports are checked."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    by_id = {c.get("id", c["name"]): c for c in contracts["contracts"]}
    top = next(c for c in contracts["contracts"] if c.get("containers") == ["qdebug"] and c["type"] == "layers")
    floors = [{m.strip() for m in layer.split("|")} for layer in top["layers"]]
    floor_of = {m: i for i, layer in enumerate(floors) for m in layer}
    assert floor_of["targets"] < floor_of["config"] and floor_of["targets"] < floor_of["target_registry"]
    in_targets = {m.strip() for layer in by_id["targets"]["layers"] for m in layer.replace(":", "|").split("|")}
    for module in BUILTIN_TARGET_MODULES:
        package, _, name = module.rpartition(".")
        assert package == "qdebug.targets", module
        assert name in in_targets, f"{module} is not placed in the targets contract"
