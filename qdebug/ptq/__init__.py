"""The field's post-training quantization libraries (NNCF, AMD Quark), run as measured alternatives to ORT's.

Neither library is imported into qdebug's interpreter: each lives in a virtual environment of its own
(:mod:`qdebug.ptq.env`, ``make ptq-env`` / ``make ptq-env-quark``) and runs in a worker process that imports
only the library, onnx, onnxruntime and numpy. :func:`run_ptq` takes a float model and calibration samples and
writes a QDQ model ONNX Runtime loads; docs/ptq.md says what each recipe in :data:`RECIPES` does.
"""

from __future__ import annotations

from qdebug.ptq.env import PtqLibrary, ensure_ptq_env, ptq_available, ptq_env_dir
from qdebug.ptq.recipes import RECIPES, PtqRecipe, get_recipe
from qdebug.ptq.run import PtqRun, run_ptq

__all__ = [
    "RECIPES",
    "PtqLibrary",
    "PtqRecipe",
    "PtqRun",
    "ensure_ptq_env",
    "get_recipe",
    "ptq_available",
    "ptq_env_dir",
    "run_ptq",
]
