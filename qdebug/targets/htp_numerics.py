"""Known numeric behaviours of the QNN HTP that make it differ from ONNX Runtime's CPU QDQ, each found in a QDQ
model by its pattern and each with a rewrite of the QDQ model that the HTP computes right (exact on the CPU for the
Reciprocal, the same integers but for rare rounding ties for the Log; a changed grid for the other two).

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
* :attr:`HtpBehaviour.LOG_16BIT_INPUT_ABOVE_FP16` — a 16-bit ``Log`` whose input grid ends above the fp16 range
  (a mel front end's ``log(power)``, grid top ~1e10) saturates, then wraps, for inputs above a few ten thousand:
  right at 8 bits and for grids ending at 65 504 or below. ``Log(x) = Log(x / c) + log c`` with ``x / c`` on the
  input's integers (scale ``/ c``) and ``log c`` a whole number of output steps keeps every grid the CPU sees.

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
    LOG_16BIT_INPUT_ABOVE_FP16 = "log_16bit_input_above_fp16"

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
    HtpBehaviour.LOG_16BIT_INPUT_ABOVE_FP16: (
        "the HTP's 16-bit Log is wrong (saturates, then wraps) for inputs above the fp16 range; "
        "remedy: Log(x/c) + log(c) with x/c on the same integers"
    ),
}

#: fp16's largest value: a 16-bit Log's input grid ending above it is computed wrong on the HTP (a grid ending at
#: 65 500 is right, one ending at 66 000 is not)
_LOG_SAFE_TOP = 65504.0
#: where the remedy puts the top of the Log's input grid: well inside fp16, where the HTP's Log matches the CPU
_LOG_TARGET_TOP = 100.0


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


@dataclass(frozen=True)
class _LogSite:
    """A 16-bit Log between a DequantizeLinear and a QuantizeLinear, with both grids."""

    node: onnx.NodeProto
    dq: onnx.NodeProto
    q: onnx.NodeProto
    in_grid: tuple[float, float, int]
    out_grid: tuple[float, float, int]

    @property
    def top(self) -> float:
        """The largest value of the input grid."""
        scale, zp, elem = self.in_grid
        return scale * (_QRANGE[elem][1] - zp)

    def shift(self) -> int | None:
        """The whole number of output steps ``k`` with ``log c = k · scale_out`` that brings the input grid's top to
        :data:`_LOG_TARGET_TOP` or below, or None when the shifted output grid's zero point would leave its range."""
        scale, zp, elem = self.out_grid
        k = int(np.ceil((np.log(self.top) - np.log(_LOG_TARGET_TOP)) / scale))
        return k if k > 0 and _QRANGE[elem][0] <= int(zp) + k <= _QRANGE[elem][1] else None


def _log_sites(model: onnx.ModelProto) -> Iterable[_LogSite]:
    """Every Log reading a DequantizeLinear on a 16-bit grid and feeding a QuantizeLinear."""
    producer = {o: n for n in model.graph.node for o in n.output}
    consts = constant_values(model)
    for node in model.graph.node:
        if node.op_type != "Log" or node.domain not in ("", "ai.onnx"):
            continue
        dq = producer.get(node.input[0])
        q = next((c for c in model.graph.node if c.op_type == "QuantizeLinear" and c.input[0] == node.output[0]), None)
        if dq is None or not is_dq(dq) or q is None:
            continue
        in_grid, out_grid = _grid(dq, consts), _grid(q, consts)
        if in_grid is None or out_grid is None or in_grid[2] not in _SIXTEEN or out_grid[2] not in _QRANGE:
            continue
        yield _LogSite(node, dq, q, in_grid, out_grid)


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
    for site in _log_sites(model):
        if site.top > _LOG_SAFE_TOP:
            name = site.node.name or site.node.output[0]
            detail = f"input grid ends at {site.top:.4g}"
            out.append(HtpFinding(HtpBehaviour.LOG_16BIT_INPUT_ABOVE_FP16, name, site.node.output[0], detail))
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
    * ``LOG_16BIT_INPUT_ABOVE_FP16``: ``Log(x)`` becomes ``Log(x · 1/c) + log c``: ``x / c`` on the input's integers
      (its scale over ``c``), the Log's output on its grid shifted down by ``log c``, a whole number ``k`` of its
      steps, and ``log c`` the integer ``zero_point + k`` of that grid, so the Add lands on the original grid.
    """
    findings = find_behaviours(model) if behaviours is None else tuple(behaviours)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    done = _reciprocals_to_div(m, {f.node for f in findings if f.behaviour is HtpBehaviour.RECIPROCAL_INPUT_BELOW_ONE})
    done += _sigmoids_to_8bit(m, {f.node for f in findings if f.behaviour is HtpBehaviour.CONV_SILU_16BIT})
    done += _hardsigmoids_to_unit(
        m, {f.node for f in findings if f.behaviour is HtpBehaviour.HARDSIGMOID_16BIT_BELOW_ONE}
    )
    done += _logs_rescaled(m, {f.node for f in findings if f.behaviour is HtpBehaviour.LOG_16BIT_INPUT_ABOVE_FP16})
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


def _const(g: onnx.GraphProto, stem: str, q: int, scale: float, zero: int, elem: int, domain: str) -> onnx.NodeProto:
    """The initializers of the quantized constant ``(q − zero) · scale`` and its DequantizeLinear (output ``stem``)."""
    np_type = onnx.helper.tensor_dtype_to_np_dtype(elem)
    g.initializer.extend(
        [
            numpy_helper.from_array(np.array(q, dtype=np_type), f"{stem}_q"),
            numpy_helper.from_array(np.array(scale, dtype=np.float32), f"{stem}_scale"),
            numpy_helper.from_array(np.array(zero, dtype=np_type), f"{stem}_zero_point"),
        ]
    )
    inputs = [f"{stem}_q", f"{stem}_scale", f"{stem}_zero_point"]
    return helper.make_node("DequantizeLinear", inputs, [stem], name=f"{stem}_dq", domain=domain)


def _qdq_pair(stem: str, x: str, scale: str, zero: str, q: onnx.NodeProto) -> list[onnx.NodeProto]:
    """Q → DQ of ``x`` on the given grid parameters, in the domain of ``q``; the DQ's output is ``<stem>_dq``."""
    return [
        helper.make_node("QuantizeLinear", [x, scale, zero], [f"{stem}_q"], name=f"{stem}_quantize", domain=q.domain),
        helper.make_node(
            "DequantizeLinear", [f"{stem}_q", scale, zero], [f"{stem}_dq"], name=f"{stem}_dq_node", domain=q.domain
        ),
    ]


def _log_rewrite(g: onnx.GraphProto, site: _LogSite, k: int) -> list[onnx.NodeProto]:
    """The nodes replacing ``site``'s Log by ``Log(x · 1/c) + log c`` with ``log c = k · scale_out``."""
    (s_in, zf_in, e_in), (s_out, zf_out, e_out) = site.in_grid, site.out_grid
    z_in, z_out, log_c = int(zf_in), int(zf_out), k * s_out
    stem = f"{site.node.output[0]}_htp_log"
    qmax = _QRANGE[e_in][1]
    inv_c = _const(g, f"{stem}_inv_c", qmax, float(np.exp(-log_c)) / qmax, 0, e_in, site.dq.domain)
    plus = _const(g, f"{stem}_log_c", z_out + k, s_out, z_out, e_out, site.q.domain)
    in_t, out_t = onnx.helper.tensor_dtype_to_np_dtype(e_in), onnx.helper.tensor_dtype_to_np_dtype(e_out)
    g.initializer.extend(
        [
            numpy_helper.from_array(np.array(s_in * np.exp(-log_c), dtype=np.float32), f"{stem}_x_scale"),
            numpy_helper.from_array(np.array(z_in, dtype=in_t), f"{stem}_x_zero_point"),
            numpy_helper.from_array(np.array(z_out + k, dtype=out_t), f"{stem}_y_zero_point"),
        ]
    )
    name = site.node.name or site.node.output[0]
    return [
        inv_c,
        helper.make_node("Mul", [site.node.input[0], inv_c.output[0]], [f"{stem}_x"], name=f"{stem}_scale_down"),
        *_qdq_pair(f"{stem}_x", f"{stem}_x", f"{stem}_x_scale", f"{stem}_x_zero_point", site.dq),
        helper.make_node("Log", [f"{stem}_x_dq"], [f"{stem}_y"], name=name),
        *_qdq_pair(f"{stem}_y", f"{stem}_y", site.q.input[1], f"{stem}_y_zero_point", site.q),
        plus,
        helper.make_node("Add", [f"{stem}_y_dq", plus.output[0]], list(site.node.output), name=f"{stem}_add_log_c"),
    ]


def _logs_rescaled(m: onnx.ModelProto, wanted: set[str]) -> tuple[str, ...]:
    """Replace the named 16-bit Logs of ``m`` (in place) by ``Log(x / c) + log c``; the names replaced."""
    sites = {s.node.name or s.node.output[0]: s for s in _log_sites(m)}
    nodes: list[onnx.NodeProto] = []
    done: list[str] = []
    for node in m.graph.node:
        key = node.name or node.output[0]
        site = sites.get(key) if node.op_type == "Log" and key in wanted else None
        k = site.shift() if site is not None else None
        if site is None or k is None:
            nodes.append(node)
            continue
        nodes.extend(_log_rewrite(m.graph, site, k))
        done.append(key)
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return tuple(done)
