"""Run Deeploy's front end and code generation on one ONNX network, in Deeploy's own environment.

Run by :func:`qdebug.targets.deeploy_env.generate` as ``<deeploy-env>/bin/python _deeploy_worker.py REQUEST.json``
with the interpreter of the Deeploy virtual environment (deeploy-pulp pins numpy<2 and protobuf 4.23, which
qdebug's own environment cannot hold). It therefore imports only the standard library, numpy, onnx,
onnx-graphsurgeon and Deeploy — never qdebug.

The request names the ONNX file, an optional ``inputs.npz``, the platform and the folder to write
``Network.c`` / ``Network.h`` into (the parent's temporary folder: the parent renames it into place). The
last line on stdout is ``QDEBUG_DEEPLOY_RESULT <json>``; Deeploy's own log goes to stdout/stderr before it.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

RESULT_PREFIX = "QDEBUG_DEEPLOY_RESULT "

#: Platforms whose inputs Deeploy types with sign propagation (unsigned data → signed type + offset).
_SIGNPROP = {"Generic": True, "Siracusa": False, "PULPOpen": False}

# ONNX TensorProto element types → Deeploy type names, for inputs declared with an integer type.
_ONNX_INT_TYPES = {2: "uint8_t", 3: "int8_t", 4: "uint16_t", 5: "int16_t", 6: "int32_t", 12: "uint32_t"}


_ONNX_8BIT_TYPES = (2, 3)


def _mod(name: str) -> Any:
    return importlib.import_module(name)


def _input_types(model: Any, arrays: list[Any], signprop: bool) -> tuple[dict[str, Any], dict[str, int]]:
    """Deeploy pointer types and offsets of the graph inputs, keyed ``input_<i>`` as Deeploy renames them.

    An input declared INT8/UINT8 keeps that type (typing it from a sample would mistype a signed input whose
    sample happens to be non-negative); otherwise the type is inferred from the data as Deeploy's own test
    driver does (its reference networks declare FLOAT or INT32 inputs that carry int8 values), and without
    data the declared type is used. Graph inputs that are initializers are constants, not inputs.
    """
    import numpy as np

    adt = _mod("Deeploy.AbstractDataTypes")
    dt = _mod("Deeploy.CommonExtensions.DataTypes")
    by_name = {t.typeName: t for t in (*dt.IntegerDataTypes, *dt.FloatDataTypes)}
    unsigned_to_signed = {"uint8_t": "int8_t", "uint16_t": "int16_t", "uint32_t": "int32_t", "uint64_t": "int64_t"}
    types: dict[str, Any] = {}
    offsets: dict[str, int] = {}
    inits = {i.name for i in model.graph.initializer}
    for idx, inp in enumerate(i for i in model.graph.input if i.name not in inits):
        elem = inp.type.tensor_type.elem_type
        values = arrays[idx] if idx < len(arrays) else None
        if elem in _ONNX_8BIT_TYPES or (elem in _ONNX_INT_TYPES and (values is None or not values.size)):
            base = by_name[_ONNX_INT_TYPES[elem]]
        elif values is not None and values.size:
            v = values.reshape(-1).astype(np.float64)
            is_int = bool(np.abs(v.astype(np.int64) - v).max() <= 1e-3)
            base = dt.minimalIntegerType(v.astype(np.int64)) if is_int else dt.minimalFloatType(v)
        else:
            base = dt.float32_t
        offset = 0
        if signprop and issubclass(base, adt.IntegerImmediate) and base.typeName in unsigned_to_signed:
            signed = by_name[unsigned_to_signed[base.typeName]]
            base, offset = signed, 2 ** (signed.typeWidth - 1)
        types[f"input_{idx}"] = adt.PointerClass(base)
        offsets[f"input_{idx}"] = offset
    return types, offsets


def _fresh(optimizer: Any) -> Any:
    """A per-run copy of a module-level optimizer: deployers append their passes to its list in place.

    A deep copy is not possible (the passes hold onnx-graphsurgeon patterns that do not copy); the passes
    themselves are stateless, so a new optimizer over a new list is enough.
    """
    fresh = copy.copy(optimizer)
    fresh.passes = list(optimizer.passes)
    return fresh


def _deployer(platform: str, graph: Any, types: dict[str, Any], offsets: dict[str, int], state_dir: str) -> Any:
    """Build the deployer for ``platform``; the optimizer singletons are copied because deployers mutate them."""
    if platform == "Generic":
        gp = _mod("Deeploy.Targets.Generic.Platform")
        gd = _mod("Deeploy.Targets.Generic.Deployer")
        return gd.GenericDeployer(
            graph,
            gp.GenericPlatform(),
            types,
            _fresh(gp.GenericOptimizer),
            lambda g: list(g.nodes),
            name="DeeployNetwork",
            default_channels_first=True,
            deeployStateDir=state_dir,
            inputOffsets=dict(offsets),
        )
    if platform in ("Siracusa", "PULPOpen"):
        pp = _mod("Deeploy.Targets.PULPOpen.Platform")
        pd = _mod("Deeploy.Targets.PULPOpen.Deployer")
        return pd.PULPDeployer(
            graph,
            pp.PULPPlatform(),
            types,
            _fresh(pp.PULPOptimizer),
            lambda g: list(g.nodes),
            name="DeeployNetwork",
            default_channels_first=False,
            deeployStateDir=state_dir,
            inputOffsets=dict(offsets),
        )
    raise ValueError(f"unsupported platform {platform!r}")


def _float_buffers(deployer: Any) -> list[str]:
    """Names of the buffers (inputs, outputs, constants, intermediates) Deeploy typed as floating point."""
    adt = _mod("Deeploy.AbstractDataTypes")
    names: list[str] = []
    ctxt = deployer.ctxt
    for buf in [*ctxt.globalObjects.values(), *ctxt.localObjects.values()]:
        ty = getattr(buf, "_type", None)
        ref = getattr(ty, "referencedType", None)
        if isinstance(ref, type) and issubclass(ref, adt.FloatImmediate):
            names.append(str(buf.name))
    return names


def _culprits(deployer: Any, message: str) -> str:
    """`` (at node N (Op), ...)`` for the graph nodes whose name or tensors the error message mentions.

    Deeploy's errors often name only a tensor (``Could not broadcast X_tensor ...``); the user needs the node.
    """
    graph = getattr(deployer, "graph", None)
    if graph is None:
        return ""
    found: list[str] = []
    for node in graph.nodes:
        names = [node.name, *(t.name for t in node.inputs), *(t.name for t in node.outputs)]
        if any(n and n in message for n in names):
            found.append(f"{node.name} ({node.op})")
    if not found or all(f.split(" (")[0] in message for f in found):
        return ""
    return " (at node " + ", ".join(found[:3]) + ")"


def _io_buffers(deployer: Any, model: Any, offsets: dict[str, int]) -> list[dict[str, Any]]:
    """The network's input and output buffers as the generated code lays them out, for a harness that runs it.

    ``offset``: the generated buffer holds ``onnx_value - offset`` (Deeploy's sign propagation stores unsigned
    tensors as signed ones: inputs by the offset qdebug chose, outputs by ``n_levels/2`` when not signed).
    """
    inits = {i.name for i in model.graph.initializer}
    onnx_names = {
        "input": [i.name for i in model.graph.input if i.name not in inits],
        "output": [o.name for o in model.graph.output],
    }
    # The generated DeeployNetwork_inputs/outputs arrays follow the deployer's own lists (used inputs only).
    buffers = {"input": list(deployer.inputs()), "output": list(deployer.outputs())}
    found: list[dict[str, Any]] = []
    for role, bufs in buffers.items():
        for idx, buf in enumerate(bufs):
            names = onnx_names[role]
            signed = bool(getattr(buf, "_signed", True))
            levels = int(getattr(buf, "nLevels", 0) or 0)
            offset = offsets.get(str(buf.name), 0) if role == "input" else (0 if signed else levels // 2)
            found.append(
                {
                    "role": role,
                    "index": idx,
                    "name": names[idx] if idx < len(names) else str(buf.name),
                    "ctype": str(buf._type.referencedType.typeName),
                    "shape": [int(d) for d in buf.shape],
                    "offset": int(offset),
                }
            )
    return found


def _network_sources(deployer: Any) -> tuple[str, str]:
    """``Network.h`` and ``Network.c`` from the deployer's own generators (RunNetwork / InitNetwork)."""
    header = (
        "#ifndef __DEEPLOY_HEADER__\n#define __DEEPLOY_HEADER__\n"
        "#include <stdio.h>\n#include <stdint.h>\n#include <stdlib.h>\n"
        + deployer.generateIncludeString()
        + "\nvoid RunNetwork(uint32_t core_id, uint32_t numThreads);\n"
        + "void InitNetwork(uint32_t core_id, uint32_t numThreads);\n\n"
        + deployer.generateIOBufferInitializationCode()
        + "\n#endif\n"
    )
    source = (
        "#include <stdio.h>\n#include <stdlib.h>\n#include <math.h>\n"
        + deployer.generateIncludeString()
        + '\n#include "Network.h"\n\n'
        + deployer.generateBufferInitializationCode()
        + deployer.generateGlobalDefinitionCode()
        + "\nvoid RunNetwork(__attribute__((unused)) uint32_t core_id,"
        + " __attribute__((unused)) uint32_t numThreads) {\n"
        + deployer.generateInferenceInitializationCode()
        + deployer.generateFunction()
        + "\n}\n\nvoid InitNetwork(__attribute__((unused)) uint32_t core_id,"
        + " __attribute__((unused)) uint32_t numThreads) {\n"
        + deployer.generateEngineInitializationCode()
        + deployer.generateBufferAllocationCode()
        + "\n}\n"
    )
    return header, source


def generate(request: dict[str, Any]) -> dict[str, Any]:
    """Parse, lower, bind and generate; return the result record (Deeploy's failures are reported, not raised)."""
    import numpy as np
    import onnx

    platform = str(request["platform"])
    out_dir = Path(request["out_dir"])
    stage = "load"
    t0 = time.perf_counter()
    deployer: Any = None
    try:
        model = onnx.load(str(request["onnx"]))
        # Deeploy needs a shape on every tensor and fails cryptically without one (e.g. in a Conv padding
        # pass); ONNX's own inference fills what it can (it stops at custom ops such as RequantShift, whose
        # shapes the exporter must give). The user's file is not touched.
        # Pad in the attribute form Deeploy's PadParser reads fails ONNX's inference; the exporter gave every shape.
        with contextlib.suppress(onnx.shape_inference.InferenceError):
            model = onnx.shape_inference.infer_shapes(model)
        arrays: list[Any] = []
        if request.get("inputs"):
            with np.load(str(request["inputs"])) as npz:
                data = {k: npz[k] for k in npz.files}
            inits = {i.name for i in model.graph.initializer}
            names = [i.name for i in model.graph.input if i.name not in inits]
            # Matched by name, else by position (Deeploy's reference files use their own names).
            arrays = [data[n] for n in names] if all(n in data for n in names) else list(data.values())
        types, offsets = _input_types(model, arrays, _SIGNPROP[platform])
        gs = _mod("onnx_graphsurgeon")
        graph = gs.import_onnx(model)
        with tempfile.TemporaryDirectory(prefix="deeploy-state-") as state_dir:
            stage = "deploy"
            deployer = _deployer(platform, graph, types, offsets, state_dir)
            deployer.prepare()
            stage = "codegen"
            header, source = _network_sources(deployer)
        stage = "write"
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "Network.h").write_text(header, encoding="utf-8")
        (out_dir / "Network.c").write_text(source, encoding="utf-8")
        floats = _float_buffers(deployer)
        try:
            io = _io_buffers(deployer, model, offsets)
        except Exception:  # describing the buffers is a convenience for running the code, never a failure
            traceback.print_exc()
            io = []
        return {
            "io": io,
            "ok": True,
            "stage": "done",
            "seconds": time.perf_counter() - t0,
            "files": ["Network.c", "Network.h"],
            "float_buffers": floats,
            "integer_only": not floats,
            "error": None,
        }
    except Exception as exc:  # Deeploy signals rejection with bare Exception/AssertionError/KeyError
        traceback.print_exc()
        message = str(exc) or f"{type(exc).__name__} (no message)"
        message += _culprits(deployer, message)
        return {
            "ok": False,
            "stage": stage,
            "seconds": time.perf_counter() - t0,
            "files": [],
            "float_buffers": [],
            "integer_only": None,
            "error": f"{type(exc).__name__}: {message}",
        }


def main(argv: list[str]) -> int:
    """Entry point: ``_deeploy_worker.py REQUEST.json``; prints the result line last and exits 0."""
    request = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    result = generate(request)
    sys.stderr.flush()
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
