"""Compile targets (QNN HTP, later Deeploy) behind one small interface; see :mod:`qdebug.targets.base`."""

from qdebug.targets.base import (
    CompileReport,
    FallbackNode,
    FixReport,
    Target,
    available_targets,
    get_target,
    register_target,
)

__all__ = [
    "CompileReport",
    "FallbackNode",
    "FixReport",
    "Target",
    "available_targets",
    "get_target",
    "register_target",
]
