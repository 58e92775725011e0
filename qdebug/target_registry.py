"""The registry of compile targets: names → factories, at the ground floor.

It sits below everything (it imports only :mod:`qdebug.errors`) because the quantization config already needs
it: a :class:`~qdebug.config.QuantConfig` names its target, and only the target knows what it can run. The
built-in targets (:data:`BUILTIN_TARGETS`) are imported *by name* when first looked up, the way a plug-in is, and
only the one looked up: listing targets never loads one, validating a config loads its own target only, and this
module never depends on the targets built on top of the engine.
The :class:`~qdebug.targets.base.Target` protocol and the typed accessors live in :mod:`qdebug.targets.base`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from qdebug.errors import ConfigError

__all__ = [
    "BUILTIN_TARGETS",
    "BUILTIN_TARGET_MODULES",
    "config_problems",
    "lookup",
    "register_target",
    "target_names",
    "unregister_target",
]

#: The built-in targets: name → the module that registers it, imported by name when that target is first looked up
#: (``qnn_diagnose`` imports and extends ``qnn``: the QNN target with its bisection and remedies). Every module here
#: sits on the ``targets`` floor; ``tests/test_target_registry.py`` checks that, since import-linter cannot see an
#: import by name.
BUILTIN_TARGETS: dict[str, str] = {
    "cpu": "qdebug.targets.cpu",
    "qnn": "qdebug.targets.qnn_diagnose",
    "deeploy": "qdebug.targets.deeploy",
}
#: The modules of :data:`BUILTIN_TARGETS`, in its order.
BUILTIN_TARGET_MODULES: tuple[str, ...] = tuple(BUILTIN_TARGETS.values())

_REGISTRY: dict[str, Callable[[], Any]] = {}
#: Built-in targets whose module has not been imported yet (a name unregistered before then is dropped too).
_PENDING: dict[str, str] = dict(BUILTIN_TARGETS)


def register_target(name: str, factory: Callable[[], Any]) -> None:
    """Register a target factory under ``name`` (a plug-in target calls this when imported)."""
    _REGISTRY[name] = factory


def unregister_target(name: str) -> None:
    """Remove a registered target (plug-ins and tests)."""
    _REGISTRY.pop(name, None)
    _PENDING.pop(name, None)


def _load(name: str) -> None:
    """Import the built-in module of target ``name`` if it is still pending (it registers the target)."""
    module = _PENDING.pop(name, None)
    if module is not None:
        importlib.import_module(module)


def target_names() -> tuple[str, ...]:
    """Every registered target name, built-ins first (listing names imports no target module)."""
    builtin = [n for n in BUILTIN_TARGETS if n in _PENDING or n in _REGISTRY]
    return tuple(dict.fromkeys([*builtin, *_REGISTRY]))


def lookup(name: str) -> Any:
    """A new instance of the target registered as ``name``, its built-in module imported on first use (typed access:
    ``qdebug.targets.base.get_target``)."""
    _load(name)
    if name not in _REGISTRY:
        raise ConfigError(f"unknown target {name!r}; known: {list(target_names())}")
    return _REGISTRY[name]()


def config_problems(config: Any) -> list[str]:
    """What the config's target says is wrong with it (an unknown target name included)."""
    if config.target not in target_names():
        return [f"target {config.target!r} not in {list(target_names())}"]
    problems: list[str] = lookup(config.target).config_problems(config)
    return problems
