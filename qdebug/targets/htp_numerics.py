"""Known numeric behaviours of the QNN HTP that make it differ from ONNX Runtime's CPU QDQ, each found in a QDQ
model by its pattern and each with a rewrite of the QDQ model that the HTP computes right (exact on the CPU for the
Reciprocal; a changed grid for the other two).

Every behaviour here was isolated on a single-op model on the HTP simulator (``tests/test_htp_numerics.py`` is the
reproduction; the measurements are in docs/qnn.md, "Known HTP numeric behaviours"):

* :attr:`HtpBehaviour.RECIPROCAL_INPUT_BELOW_ONE` — a quantized ``Reciprocal`` whose input grid ends below 1.0
  (``scale · (qmax − zero_point) < 1``) returns ``x_max / x`` instead of ``1 / x`` on the HTP, at 8 and 16 bits:
  off by the constant factor ``x_max``. A decomposed LayerNorm (``Sqrt`` → ``Reciprocal`` of a small variance)
  hits it. ``Div(1, x)`` on the same grids is computed like the CPU: :func:`rewrite_qdq` replaces it so.
* :attr:`HtpBehaviour.CONV_SILU_16BIT` — a Conv whose 16-bit output feeds ``x · Sigmoid(x)`` (SiLU, as YOLOv8
  exports it): for some output sizes (9×9, 10×10, 12×12 among those tried) the HTP writes whole blocks of the SiLU's
  output wrong (pairs of rows); the same Conv followed by Sigmoid alone, Tanh·x or Relu·x, and the SiLU without
  the Conv, are right. Putting the Sigmoid's output on an 8-bit grid (``[0, 1]`` in 255 steps: a 16→8 boundary)
  avoids it at the cost of that grid's rounding.
* :attr:`HtpBehaviour.HARDSIGMOID_16BIT_BELOW_ONE` — a ``HardSigmoid`` with a 16-bit output grid that ends below
  1.0 returns ``y · y_max`` instead of ``y`` (off by the top of its output grid; right at 8 bits, and at 16 bits
  when the grid ends at 1.0). A squeeze-and-excitation gate (PP-LCNet's, in the corpus's text-direction
  classifier) promoted to 16 bits hits it. The output grid ``[0, 1]`` on the same integer type avoids it.

:func:`find_behaviours` names the behaviours present in a QDQ model; :func:`rewrite_qdq` applies their rewrites.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qdebug.graph_index import constant_values, decode_constant
from qdebug.model_io import is_dq

__all__ = ["HtpBehaviour", "HtpFinding", "find_behaviours", "rewrite_qdq"]

#: ONNX integer element types a DequantizeLinear reads → (qmin, qmax).
_QRANGE: dict[int, tuple[int, int]] = {
    onnx.TensorProto.UINT8: (0, 255),
    onnx.TensorProto.INT8: (-128, 127),
    onnx.TensorProto.UINT16: (0, 65535),
    onnx.TensorProto.INT16: (-32768, 32767),
}
_SIXTEEN = (onnx.TensorProto.UINT16, onnx.TensorProto.INT16)


class HtpBehaviour(StrEnum):
    """A named way the HTP computes a quantized op differently from ONNX Runtime's CPU QDQ."""

    RECIPROCAL_INPUT_BELOW_ONE = "reciprocal_input_below_one"
    CONV_SILU_16BIT = "conv_silu_16bit"
    HARDSIGMOID_16BIT_BELOW_ONE = "hardsigmoid_16bit_below_one"

    @property
    def summary(self) -> str:
        """One line: what differs and what the remedy is."""
        return _SUMMARY[self]


_SUMMARY = {
    HtpBehaviour.RECIPROCAL_INPUT_BELOW_ONE: (
        "the HTP's quantized Reciprocal returns x_max/x instead of 1/x when its input grid ends below 1.0 "
        "(x_max = scale·(qmax−zero_point)); remedy: Div(1, x) on the same grids"
    ),
    HtpBehaviour.CONV_SILU_16BIT: (
        "the HTP computes a Conv followed by x·Sigmoid(x) at 16 bits wrong in whole blocks of rows for some output "
        "sizes; remedy: the Sigmoid's output on an 8-bit grid"
    ),
    HtpBehaviour.HARDSIGMOID_16BIT_BELOW_ONE: (
        "the HTP's 16-bit HardSigmoid returns y·y_max instead of y when its output grid ends below 1.0; "
        "remedy: the output grid [0, 1] on the same type"
    ),
}


@dataclass(frozen=True)
class HtpFinding:
    """One occurrence of a known behaviour: the node of the QDQ model a rewrite changes, the tensor where the
    difference shows, and the numbers."""

    behaviour: HtpBehaviour
    node: str
    tensor: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"behaviour": self.behaviour.value, "node": self.node, "tensor": self.tensor, "detail": self.detail}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HtpFinding:
        """Inverse of :meth:`to_dict`."""
        return cls(HtpBehaviour(d["behaviour"]), d["node"], d["tensor"], d.get("detail", ""))

    def describe(self) -> str:
        """One line for the CLI."""
        return f"{self.behaviour.value} at {self.node} ({self.detail}): {self.behaviour.summary}"


def _grid(dq: onnx.NodeProto, consts: Mapping[str, Any]) -> tuple[float, float, int] | None:
    """(scale, zero point, element type) of a per-tensor Q or DQ node with constant parameters, else None."""
    if len(dq.input) < 2 or dq.input[1] not in consts:
        return None
    scale = np.asarray(decode_constant(consts[dq.input[1]]), dtype=np.float64)
    if scale.size != 1:
        return None
    zc = consts.get(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
    if zc is None:
        return float(scale.reshape(())), 0, onnx.TensorProto.UINT8
    zp = np.asarray(decode_constant(zc))
    if zp.size != 1:
        return None
    elem = int(zc.data_type) if isinstance(zc, onnx.TensorProto) else int(zc.attribute[0].t.data_type)
    return float(scale.reshape(())), int(zp.reshape(())), elem


def _reciprocal_inputs(model: onnx.ModelProto) -> Iterable[tuple[onnx.NodeProto, onnx.NodeProto, float, int]]:
    """Every Reciprocal reading a DequantizeLinear: (node, that DQ, its grid's top value, its element type)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    consts = constant_values(model)
    for node in model.graph.node:
        if node.op_type != "Reciprocal" or node.domain not in ("", "ai.onnx"):
            continue
        dq = producer.get(node.input[0])
        if dq is None or not is_dq(dq):
            continue
        grid = _grid(dq, consts)
        if grid is None or grid[2] not in _QRANGE:
            continue
        scale, zp, elem = grid
        yield node, dq, scale * (_QRANGE[elem][1] - zp), elem


def _traces_to(name: str, target: str, producer: Mapping[str, onnx.NodeProto]) -> bool:
    """Whether ``name`` is ``target`` seen through a DequantizeLinear ← QuantizeLinear pair."""
    dq = producer.get(name)
    if dq is None or not is_dq(dq):
        return False
    q = producer.get(dq.input[0])
    return q is not None and q.op_type == "QuantizeLinear" and q.input[0] == target


def _conv_silu_sigmoids(model: onnx.ModelProto) -> Iterable[tuple[onnx.NodeProto, onnx.NodeProto, onnx.NodeProto]]:
    """Every Sigmoid of a SiLU (``x · Sigmoid(x)``) whose ``x`` is a Conv's output, both on 16-bit grids: (the
    Sigmoid, the QuantizeLinear of its output)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    consts = constant_values(model)
    for sig in model.graph.node:
        if sig.op_type != "Sigmoid":
            continue
        dq = producer.get(sig.input[0])
        q = producer.get(dq.input[0]) if dq is not None and is_dq(dq) else None
        conv = producer.get(q.input[0]) if q is not None and q.op_type == "QuantizeLinear" else None
        grid = _grid(dq, consts) if dq is not None else None
        if conv is None or conv.op_type != "Conv" or grid is None or grid[2] not in _SIXTEEN:
            continue
        q_out = next((c for c in consumers.get(sig.output[0], []) if c.op_type == "QuantizeLinear"), None)
        out_grid = _grid(q_out, consts) if q_out is not None else None
        if q_out is None or out_grid is None or out_grid[2] not in _SIXTEEN:
            continue  # with the Sigmoid's output on 8 bits the HTP computes it right
        muls = [m for d in consumers.get(q_out.output[0], []) if is_dq(d) for m in consumers.get(d.output[0], [])]
        mul = next(
            (m for m in muls if m.op_type == "Mul" and any(_traces_to(i, conv.output[0], producer) for i in m.input)),
            None,
        )
        if mul is not None:
            yield sig, q_out, mul


def _hardsigmoid_outputs(model: onnx.ModelProto) -> Iterable[tuple[onnx.NodeProto, onnx.NodeProto, float, int]]:
    """Every HardSigmoid whose output QuantizeLinear is on a 16-bit grid: (the node, that Q, its grid's top, type)."""
    consts = constant_values(model)
    for node in model.graph.node:
        if node.op_type != "HardSigmoid":
            continue
        q = next((c for c in model.graph.node if c.op_type == "QuantizeLinear" and c.input[0] == node.output[0]), None)
        grid = _grid(q, consts) if q is not None else None
        if q is None or grid is None or grid[2] not in _SIXTEEN:
            continue
        scale, zp, elem = grid
        yield node, q, scale * (_QRANGE[elem][1] - zp), elem


def find_behaviours(model: onnx.ModelProto) -> tuple[HtpFinding, ...]:
    """The known HTP behaviours present in a QDQ model, in graph order."""
    out = []
    for node, _, top, _ in _reciprocal_inputs(model):
        if top < 1.0:
            out.append(
                HtpFinding(
                    HtpBehaviour.RECIPROCAL_INPUT_BELOW_ONE,
                    node.name or node.output[0],
                    node.output[0],
                    f"input grid ends at {top:.4g}",
                )
            )
    for sig, _, mul in _conv_silu_sigmoids(model):
        # the node rewritten is the Sigmoid; the wrong values show at the SiLU's output, where a probe finds them
        name = sig.name or sig.output[0]
        out.append(HtpFinding(HtpBehaviour.CONV_SILU_16BIT, name, mul.output[0], "16-bit SiLU"))
    for node, _, top, _ in _hardsigmoid_outputs(model):
        # a grid a rounding step short of 1.0 is 1.0: only a grid that really ends below it is off
        if top < 1.0 - 1e-4:
            name = node.name or node.output[0]
            detail = f"output grid ends at {top:.4g}"
            out.append(HtpFinding(HtpBehaviour.HARDSIGMOID_16BIT_BELOW_ONE, name, node.output[0], detail))
    return tuple(out)


def _one(g: onnx.GraphProto, elem: int, stem: str) -> str:
    """The initializers of a quantized constant 1.0 (the caller adds its DequantizeLinear) and the DQ's output name:
    on the divisor's integer type, at the top of its grid so that 1.0 is exact."""
    qmax = _QRANGE[elem][1]
    np_type = onnx.helper.tensor_dtype_to_np_dtype(elem)
    g.initializer.extend(
        [
            numpy_helper.from_array(np.array(qmax, dtype=np_type), f"{stem}_one_q"),
            numpy_helper.from_array(np.array(1.0 / qmax, dtype=np.float32), f"{stem}_one_scale"),
            numpy_helper.from_array(np.array(0, dtype=np_type), f"{stem}_one_zero_point"),
        ]
    )
    return f"{stem}_one"


def rewrite_qdq(
    model: onnx.ModelProto, behaviours: Sequence[HtpFinding] | None = None
) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """A copy of the QDQ model with the rewrite of each finding (default: every one :func:`find_behaviours`
    names) and the names of the nodes rewritten. The input model is not modified.

    * ``RECIPROCAL_INPUT_BELOW_ONE``: ``Reciprocal(x)`` becomes ``Div(DQ(1), x)``, its constant 1.0 quantized
      exactly on the divisor's integer type; the output Q/DQ are kept, so the CPU computes the same values.
    * ``CONV_SILU_16BIT``: the Sigmoid's output Q and its DQs move to the uint8 grid ``[0, 1]``.
    * ``HARDSIGMOID_16BIT_BELOW_ONE``: the HardSigmoid's output Q and its DQs move to ``[0, 1]`` on their type.
    """
    findings = find_behaviours(model) if behaviours is None else tuple(behaviours)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    done = _reciprocals_to_div(m, {f.node for f in findings if f.behaviour is HtpBehaviour.RECIPROCAL_INPUT_BELOW_ONE})
    done += _sigmoids_to_8bit(m, {f.node for f in findings if f.behaviour is HtpBehaviour.CONV_SILU_16BIT})
    done += _hardsigmoids_to_unit(
        m, {f.node for f in findings if f.behaviour is HtpBehaviour.HARDSIGMOID_16BIT_BELOW_ONE}
    )
    return m, done


def _reciprocals_to_div(m: onnx.ModelProto, wanted: set[str]) -> tuple[str, ...]:
    """Replace the named Reciprocals of ``m`` (in place) by ``Div(DQ(1), x)``; the names replaced."""
    # the constant's DequantizeLinear in the divisor's domain (ORT writes 16-bit Q/DQ as com.microsoft before opset 21)
    targets = {node.name or node.output[0]: (elem, dq.domain) for node, dq, _, elem in _reciprocal_inputs(m)}
    nodes: list[onnx.NodeProto] = []
    done: list[str] = []
    for node in m.graph.node:
        key = node.name or node.output[0]
        if node.op_type != "Reciprocal" or key not in wanted or key not in targets:
            nodes.append(node)
            continue
        stem = f"{node.output[0]}_htp_div"
        elem, domain = targets[key]
        one = _one(m.graph, elem, stem)
        inputs = [f"{stem}_one_q", f"{stem}_one_scale", f"{stem}_one_zero_point"]
        nodes.append(helper.make_node("DequantizeLinear", inputs, [one], name=f"{stem}_one_dq", domain=domain))
        nodes.append(helper.make_node("Div", [one, node.input[0]], list(node.output), name=key))
        done.append(key)
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return tuple(done)


def _sigmoids_to_8bit(m: onnx.ModelProto, wanted: set[str]) -> tuple[str, ...]:
    """Put the output grid of the named SiLU Sigmoids of ``m`` (in place) on uint8 ``[0, 1]``; the names moved."""
    done: list[str] = []
    for sig, q, _ in list(_conv_silu_sigmoids(m)):
        key = sig.name or sig.output[0]
        if key not in wanted:
            continue
        _regrid(m, q, f"{sig.output[0]}_htp_u8", 1.0 / 255.0, np.array(0, dtype=np.uint8))
        done.append(key)
    return tuple(done)


def _regrid(m: onnx.ModelProto, q: onnx.NodeProto, stem: str, scale: float, zero: np.ndarray) -> None:
    """Point ``q`` and every DequantizeLinear of its output at new grid parameters ``<stem>_scale/_zero_point``."""
    m.graph.initializer.extend(
        [
            numpy_helper.from_array(np.array(scale, dtype=np.float32), f"{stem}_scale"),
            numpy_helper.from_array(zero, f"{stem}_zero_point"),
        ]
    )
    for node in [q, *(n for n in m.graph.node if is_dq(n) and n.input[0] == q.output[0])]:
        del node.input[1:]
        node.input.extend([f"{stem}_scale", f"{stem}_zero_point"])


def _hardsigmoids_to_unit(m: onnx.ModelProto, wanted: set[str]) -> tuple[str, ...]:
    """Put the 16-bit output grid of the named HardSigmoids of ``m`` (in place) on ``[0, 1]``; the names moved."""
    done: list[str] = []
    for node, q, _, elem in list(_hardsigmoid_outputs(m)):
        key = node.name or node.output[0]
        if key in wanted:
            qmax = _QRANGE[elem][1]
            zero = np.array(0, dtype=onnx.helper.tensor_dtype_to_np_dtype(elem))
            _regrid(m, q, f"{node.output[0]}_htp_unit", 1.0 / qmax, zero)
            done.append(key)
    return tuple(done)
