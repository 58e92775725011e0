"""ONNX Runtime's symbolic shape inference, without the file it leaves behind.

``SymbolicShapeInference.infer_shapes`` saves ``sym_shape_infer_temp.onnx`` (and its external data) into the
*current directory* whenever some shape stays unknown, then raises: a qdebug run on a model with one op the tool
does not know left that file in the user's working directory. :func:`symbolic_shapes` runs the tool's same steps and
returns ``None`` instead, writing nothing.
"""

from __future__ import annotations

import logging
from typing import cast

import onnx

__all__ = ["symbolic_shapes"]


def symbolic_shapes(model: onnx.ModelProto, *, auto_merge: bool = True) -> onnx.ModelProto | None:
    """``model`` with the shapes ORT's symbolic inference finds, or ``None`` when it cannot infer all of them or
    fails (an op it does not know, an assertion: e.g. ppocr-cls), or is not installed (it needs ``sympy``).

    Its logger is silenced for the call (what it cannot infer is a warning on an unconfigured stderr; the callers
    only estimate), not the process's streams, which other threads may use."""
    tool_log = logging.getLogger("onnxruntime.tools.symbolic_shape_infer")
    level = tool_log.level
    tool_log.setLevel(logging.CRITICAL + 1)
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference, get_opset

        opset = get_opset(model)
        if not opset or opset < 7:
            return None
        # the steps of SymbolicShapeInference.infer_shapes, minus its save into the current directory
        tool = SymbolicShapeInference(2**31 - 1, auto_merge, False, 0)
        complete = False
        tool._preprocess(model)
        while tool.run_:
            complete = tool._infer_impl()
        tool._update_output_from_vi()
        return cast(onnx.ModelProto, tool.out_mp_) if complete else None
    except Exception:  # any failure of the tool (unknown op, assertion, a changed private API) leaves the caller's
        return None
    finally:
        tool_log.setLevel(level)
