"""Compile one model with the QNN execution provider, in a process of its own.

Run by :func:`qdebug.targets.qnn_compile.compile_qnn` as ``python -m qdebug.targets._qnn_worker REQUEST.json``.
It lives in its own process for two reasons: ONNX Runtime's verbose log (the only place where QNN says
which nodes it took and why it refused the others) goes to the process's stderr, which the parent
redirects into the compile log; and a crash inside the QNN libraries must not take the caller down.

The request names the model, the context file to write, the provider options and session config
entries. The worker writes a JSON result (stage, error, providers, seconds) to the path the request
names; a worker that dies leaves no result, which the parent reports with the log's tail. This module
imports only the standard library, ``onnxruntime`` and ``onnxruntime_qnn``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

QNN_EP = "QNNExecutionProvider"


def register_qnn(ort: Any) -> list[Any]:
    """Register the QNN plugin library once per process and return its EP devices.

    ONNX Runtime refuses a second registration under the same name, so the devices already
    present (registered by us or by the user's own code) are reused.
    """
    devices = [d for d in ort.get_ep_devices() if d.ep_name == QNN_EP]
    if not devices:
        import onnxruntime_qnn

        ort.register_execution_provider_library(QNN_EP, onnxruntime_qnn.get_library_path())
        devices = [d for d in ort.get_ep_devices() if d.ep_name == QNN_EP]
    return devices


def _write(path: Path, result: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result), encoding="utf-8")
    tmp.replace(path)


def compile_model(request: dict[str, Any]) -> dict[str, Any]:
    """Create the compiling session; return the result record (never raises for ORT failures)."""
    import onnxruntime as ort

    model = str(request["model"])
    devices = register_qnn(ort)
    if not devices:
        return {"stage": "setup", "error": "onnxruntime-qnn registered no QNN device"}
    so = ort.SessionOptions()
    so.log_severity_level = 0  # verbose: node placement and rejection reasons are only logged at this level
    for key, value in request["session_config"].items():
        so.add_session_config_entry(key, value)
    so.add_provider_for_devices(devices, request["provider_options"])
    t0 = time.perf_counter()
    try:
        sess = ort.InferenceSession(model, so)
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph/... types
        qnn_error = f"{type(exc).__name__}: {exc}"
        # Tell a model ORT itself cannot load (the user's input) from one QNN failed on.
        try:
            cpu = ort.SessionOptions()
            cpu.log_severity_level = 3
            ort.InferenceSession(model, cpu, providers=["CPUExecutionProvider"])
        except Exception as cpu_exc:
            return {"stage": "load", "error": f"{type(cpu_exc).__name__}: {cpu_exc}"}
        return {"stage": "compile", "error": qnn_error, "seconds": time.perf_counter() - t0}
    return {
        "stage": "done",
        "error": None,
        "providers": list(sess.get_providers()),
        "seconds": time.perf_counter() - t0,
    }


def main(argv: list[str]) -> int:
    """Entry point: ``argv`` is ``[REQUEST.json]``; exit 0 when a result was written."""
    if len(argv) != 1:
        print("usage: python -m qdebug.targets._qnn_worker REQUEST.json", file=sys.stderr)
        return 2
    request = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    result_path = Path(request["result"])
    try:
        result = compile_model(request)
    except Exception as exc:  # e.g. onnxruntime_qnn missing or a broken install: report, do not just die
        result = {"stage": "setup", "error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.flush()
    sys.stderr.flush()
    _write(result_path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
