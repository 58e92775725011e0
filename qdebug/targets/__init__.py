"""Compile targets behind one interface (:class:`~qdebug.targets.base.Target`), registered by name.

Built in: ``cpu`` (:mod:`qdebug.targets.cpu`), ``qnn`` (:mod:`qdebug.targets.qnn`), ``deeploy``
(:mod:`qdebug.targets.deeploy`). Adding a target is one module that subclasses
:class:`~qdebug.targets.base.TargetBase` and calls :func:`~qdebug.targets.base.register_target` (docs/architecture.md).
"""

from qdebug.targets.base import (
    Availability,
    BuildOptions,
    Precision,
    Target,
    TargetBase,
    available_targets,
    get_target,
    register_target,
    target_names,
    unregister_target,
)
from qdebug.targets.compile_report import CompileReport, FallbackNode, FixReport

__all__ = [
    "Availability",
    "BuildOptions",
    "CompileReport",
    "FallbackNode",
    "FixReport",
    "Precision",
    "Target",
    "TargetBase",
    "available_targets",
    "get_target",
    "register_target",
    "target_names",
    "unregister_target",
]
