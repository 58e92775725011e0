"""The gauntlet's judgement of ``build --target deeploy``: the host run's bit-exactness and what a refusal names.

An ok Deeploy build is only ok when its generated Generic code, compiled with gcc against qdebug's host kernels, ran
on the debug samples and computed exactly the integer network (the build manifest's ``deeploy.run.Generic``:
``ran`` and ``bit_exact``); otherwise the cell is a defect, whatever the exit code.

A refusal names the node it could not export (``<Op> node '<name>' cannot be exported to Deeploy: …``). For the
microcontroller-class set (issue 37) every model must end bit-exact or refused on an op **Deeploy itself does not
map** for integer inputs: the keys of ``GenericMapping`` in the pinned ``deeploy-pulp`` with a binding whose first
input is an integer type (read from Deeploy's own environment, made by ``make deeploy-env``; BatchNormalization, Pow,
Sqrt and Relu are mapped for float only). A refusal of an op Deeploy maps is then an export gap, and a refusal
naming no op (with Deeploy's environment present) a defect.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
from collections.abc import Mapping
from typing import Any

#: How qdebug's Deeploy export names what it cannot take (qdebug/targets/deeploy_export.py).
_REFUSED_NODE = re.compile(r"\b([A-Z][A-Za-z0-9]*) node '[^']*' cannot be exported to Deeploy")
#: Run in Deeploy's environment: every op of the Generic platform → the type names of its bindings' first input.
_GENERIC_OPS = """
import json
from Deeploy.Targets.Generic.Platform import GenericMapping
def first(b):
    t = b.typeChecker.input_types[0]
    return getattr(getattr(t, "referencedType", t), "typeName", str(t))
print(json.dumps({op: sorted({first(b) for m in l.maps for b in m.bindings}) for op, l in GenericMapping.items()}))
"""


def host_figures(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The Generic host run and the export's own check, from a build manifest (empty for another target)."""
    d = manifest.get("deeploy")
    if not isinstance(d, Mapping):
        return {}
    export = d.get("export") or {}
    run = (d.get("run") or {}).get("Generic") or {}
    return {
        "export_equal_fraction": export.get("equal_fraction"),
        "export_max_lsb": export.get("max_lsb_diff"),
        "host_ran": bool(run.get("ran")),
        "host_bit_exact": run.get("bit_exact"),
        "host_samples": run.get("num_samples"),
        "host_equal_fraction": run.get("equal_fraction_vs_integer_onnx"),
        "host_max_diff": run.get("max_diff_vs_integer_onnx"),
        "host_equal_fraction_vs_qdq": run.get("equal_fraction_vs_qdq"),
        "host_max_lsb_vs_qdq": run.get("max_lsb_vs_qdq"),
        "host_error": run.get("error") or run.get("why"),
    }


def host_problem(figures: Mapping[str, Any]) -> str | None:
    """Why an ok Deeploy build is a defect after all: its Generic code did not run on the host, or not exactly."""
    if not figures:
        return "exit 0 but the manifest has no deeploy section"
    if not figures.get("host_ran"):
        return f"build ok but the generated Generic code was not run on the host: {figures.get('host_error')}"
    if figures.get("host_bit_exact") is not True:
        frac, diff = figures.get("host_equal_fraction"), figures.get("host_max_diff")
        share = f"{frac:.4%}" if isinstance(frac, int | float) else "?"
        return f"build ok but the generated Generic code is not bit-exact on the host: {share} equal, max diff {diff}"
    return None


def refused_op(reason: str) -> str | None:
    """The op type a Deeploy refusal names, or None."""
    m = _REFUSED_NODE.search(reason)
    return m.group(1) if m else None


@functools.cache
def deeploy_generic_ops() -> tuple[str, ...] | None:
    """The op types Deeploy's Generic platform maps for an integer first input (an int8 network can use them), or
    None without Deeploy's environment. Some ops it maps for float only (BatchNormalization, Pow, Sqrt, Relu)."""
    from qdebug._venv import env_python
    from qdebug.targets.deeploy_env import deeploy_available, default_env_dir

    ok, _why = deeploy_available()
    if not ok:
        return None
    proc = subprocess.run(
        [str(env_python(default_env_dir())), "-c", _GENERIC_OPS],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        return None
    types: dict[str, list[str]] = json.loads(proc.stdout)
    return tuple(sorted(op for op, names in types.items() if any(n.startswith(("int", "uint")) for n in names)))


def deeploy_version() -> str:
    from qdebug.targets.deeploy_env import DEEPLOY_VERSION

    return DEEPLOY_VERSION


def refusal_figures(reason: str) -> dict[str, Any]:
    """The op a refusal names and whether Deeploy's Generic platform maps it (None when unknown)."""
    op = refused_op(reason)
    ops = deeploy_generic_ops()
    return {"refused_op": op, "deeploy_maps_op": None if op is None or ops is None else op in ops}


def refusal_problem(figures: Mapping[str, Any]) -> str | None:
    """Why a refusal is a defect under the microcontroller-class rule (module docstring), or None."""
    if deeploy_generic_ops() is None:  # no Deeploy environment (the build refuses for that): nothing to judge
        return None
    op = figures.get("refused_op")
    if op is None:
        return "the Deeploy build was refused without naming an op"
    if figures["deeploy_maps_op"]:
        return f"export gap: refused {op}, which Deeploy {deeploy_version()} maps on Generic for integer inputs"
    return None
