"""The registry of compile targets: names → factories, at the ground floor.

It sits below everything (it imports only :mod:`qdebug.errors`) because the quantization config already needs
it: a :class:`~qdebug.config.QuantConfig` names its target, and only the target knows what it can run. The
built-in targets (:data:`BUILTIN_TARGET_MODULES`) are imported *by name* on first use, the way a plug-in is:
listing targets never loads a backend, and this module never depends on the targets built on top of the engine.
The :class:`~qdebug.targets.base.Target` protocol and the typed accessors live in :mod:`qdebug.targets.base`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from qdebug.errors import ConfigError

__all__ = [
    "BUILTIN_TARGET_MODULES",
    "config_problems",
    "lookup",
    "register_target",
    "target_names",
    "unregister_target",
]

#: Modules of the built-in targets, imported by name on first use; each calls :func:`register_target`.
#: (``qnn_diagnose`` imports and extends ``qnn``: the QNN target with its bisection and remedies)
BUILTIN_TARGET_MODULES: tuple[str, ...] = (
    "qdebug.targets.cpu",
    "qdebug.targets.qnn_diagnose",
    "qdebug.targets.deeploy",
)

_REGISTRY: dict[str, Callable[[], Any]] = {}
_LOADED = False


def register_target(name: str, factory: Callable[[], Any]) -> None:
    """Register a target factory under ``name`` (a plug-in target calls this when imported)."""
    _REGISTRY[name] = factory


def unregister_target(name: str) -> None:
    """Remove a registered target (plug-ins and tests)."""
    _REGISTRY.pop(name, None)


def _load_builtin() -> None:
    global _LOADED  # noqa: PLW0603 - a once-only import of the built-in target modules
    if _LOADED:
        return
    _LOADED = True
    for module in BUILTIN_TARGET_MODULES:
        importlib.import_module(module)


def target_names() -> tuple[str, ...]:
    """Every registered target name, in registration order (built-ins first)."""
    _load_builtin()
    return tuple(_REGISTRY)


def lookup(name: str) -> Any:
    """A new instance of the target registered as ``name`` (typed access: ``qdebug.targets.base.get_target``)."""
    _load_builtin()
    if name not in _REGISTRY:
        raise ConfigError(f"unknown target {name!r}; known: {list(_REGISTRY)}")
    return _REGISTRY[name]()


def config_problems(config: Any) -> list[str]:
    """What the config's target says is wrong with it (an unknown target name included)."""
    if config.target not in target_names():
        return [f"target {config.target!r} not in {list(target_names())}"]
    problems: list[str] = lookup(config.target).config_problems(config)
    return problems
