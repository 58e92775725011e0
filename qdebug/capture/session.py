"""ONNX Runtime sessions for capture: optimizations off (the QDQ model runs as written) and clear errors."""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from qdebug.errors import ModelError

__all__ = ["expose_outputs", "make_session", "ort_errors"]


def expose_outputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph outputs also include ``names`` (types left to ORT)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    existing = {o.name for o in out.graph.output}
    for name in dict.fromkeys(names):
        if name not in existing:
            # An untyped ValueInfo is enough for ORT; com.microsoft Q/DQ outputs have no inferred type.
            out.graph.output.append(onnx.ValueInfoProto(name=name))
            existing.add(name)
    return out


def make_session(model: onnx.ModelProto, providers: Sequence[str], *, optimize: bool = False) -> object:
    """An ORT session with optimizations off (unless asked) and clear errors."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    so.log_severity_level = 3
    try:
        return ort.InferenceSession(model.SerializeToString(), so, providers=list(providers))
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph/... types
        raise ModelError(f"ONNX Runtime cannot load the model {model.graph.name!r}: {exc}") from exc


def ort_errors() -> tuple[type[Exception], ...]:
    """The exception classes ONNX Runtime raises from ``run`` (they share no base class but ``Exception``), plus
    the Python errors its bindings raise for inputs of the wrong type or shape."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    names = ("Fail", "InvalidArgument", "RuntimeException", "InvalidGraph", "NotImplemented", "EPFail")
    found = tuple(c for c in (getattr(state, n, None) for n in names) if isinstance(c, type))
    return (*found, RuntimeError, ValueError, TypeError)
