"""PyTorch's GELU exports in a QDQ graph: the Div→Erf→Add→Mul→Mul chain (exact GELU) and the tanh form.

:func:`gelu_chains` finds each chain so that the Deeploy export turns it into one ``RequantizediGELU``
(:mod:`qdebug.targets.deeploy_transformer`), its check accepts Erf/Tanh/Pow only inside one, and the
zero-centring (:mod:`qdebug.targets.deeploy_zero_centre`) finds the GELU inputs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import onnx

from qdebug.graph_index import GraphIndex
from qdebug.model_io import is_dq, is_q

__all__ = ["gelu_chains"]


# --------------------------------------------------------------------------- GELU pattern


def _after_qdq(ix: GraphIndex, node: onnx.NodeProto) -> onnx.NodeProto | None:
    """The one op that reads ``node``'s output through a Q → DQ pair, else None."""
    users = ix.consumers_of(node.output[0])
    if len(users) != 1 or not is_q(users[0]):
        return None
    dqs = ix.consumers_of(users[0].output[0])
    ops = [c for d in dqs if is_dq(d) for c in ix.consumers_of(d.output[0])]
    return ops[0] if len(ops) == 1 else None


def _const_value(ix: GraphIndex, t: str, consts: Mapping[str, np.ndarray]) -> float | None:
    """The real scalar behind ``t`` (a DQ of a constant, or a float constant), else None."""
    p = ix.producer.get(t)
    if p is not None and is_dq(p) and p.input[0] in consts:
        q = np.asarray(consts[p.input[0]], np.float64)
        s = float(np.asarray(consts[p.input[1]]).reshape(-1)[0])
        z = float(np.asarray(consts[p.input[2]]).reshape(-1)[0]) if len(p.input) > 2 else 0.0
        v = s * (q - z)
    elif t in consts:
        v = np.asarray(consts[t], np.float64)
    else:
        return None
    return float(v.reshape(-1)[0]) if v.size == 1 else None


def _gelu_head(ix: GraphIndex, erf: onnx.NodeProto, consts: Mapping[str, np.ndarray]) -> onnx.NodeProto | None:
    """The Div(x, √2) in front of an Erf (through Q/DQ), else None."""
    dq = ix.producer.get(erf.input[0])
    q = ix.producer.get(dq.input[0]) if dq is not None and is_dq(dq) else None
    div = ix.producer.get(q.input[0]) if q is not None and is_q(q) else None
    if div is None or div.op_type != "Div":
        return None
    c = _const_value(ix, div.input[1], consts)
    return div if c is not None and abs(c - math.sqrt(2)) < 2e-2 else None


def gelu_chains(ix: GraphIndex, consts: Mapping[str, np.ndarray]) -> dict[str, tuple[onnx.NodeProto, set[str], str]]:
    """PyTorch's GELU written out as ops with Q/DQ between them: the exact form ``Mul(Mul(x, Add(Erf(Div(x, √2)),
    1)), 0.5)`` and the tanh form (:func:`_tanh_gelu`). Head (the chain's first node in graph order) name → (the
    last Mul, names of every node of the chain, the DQ output that feeds x)."""
    out: dict[str, tuple[onnx.NodeProto, set[str], str]] = {}
    order = {n.name: i for i, n in enumerate(ix.nodes)}
    for erf in ix.nodes:
        found = _erf_gelu(ix, erf, consts) if erf.op_type == "Erf" else None
        if erf.op_type == "Tanh":
            found = _tanh_gelu(ix, erf, consts)
        if found is not None:
            half, members, x = found
            out[min(members, key=order.__getitem__)] = (half, members, x)
    return out


def _near(v: float | None, want: float, rel: float = 2e-2) -> bool:
    return v is not None and abs(v - want) <= rel * abs(want)


def _has_const(ix: GraphIndex, node: onnx.NodeProto, consts: Mapping[str, np.ndarray], want: float) -> str | None:
    """The other input of a two-input ``node`` one of whose inputs is the constant ``want``, else None."""
    vals = [_const_value(ix, t, consts) for t in node.input]
    hit = [i for i, v in enumerate(vals) if _near(v, want)]
    return str(node.input[1 - hit[0]]) if len(node.input) == 2 and hit else None


def _tail(
    ix: GraphIndex, head: onnx.NodeProto, consts: Mapping[str, np.ndarray], x_src: str
) -> list[onnx.NodeProto] | None:
    """The shared end of both GELU forms after Erf/Tanh: ``Mul(Mul(x, Add(·, 1)), 0.5)`` (through Q/DQ)."""
    add = _after_qdq(ix, head)
    mul = _after_qdq(ix, add) if add is not None and add.op_type == "Add" else None
    half = _after_qdq(ix, mul) if mul is not None and mul.op_type == "Mul" else None
    if add is None or mul is None or half is None or half.op_type != "Mul" or _has_const(ix, add, consts, 1.0) is None:
        return None
    if x_src not in {_dq_source(ix, t) for t in mul.input} or _has_const(ix, half, consts, 0.5) is None:
        return None
    return [add, mul, half]


def _dq_source(ix: GraphIndex, t: str) -> str | None:
    """The quantized tensor (a Q output) behind the DQ output ``t``."""
    dq = ix.producer.get(t)
    return str(dq.input[0]) if dq is not None and is_dq(dq) else None


def _op_before(ix: GraphIndex, t: str) -> onnx.NodeProto | None:
    """The op whose output reaches ``t`` through one Q → DQ pair."""
    src = _dq_source(ix, t)
    q = ix.producer.get(src) if src is not None else None
    return ix.producer.get(q.input[0]) if q is not None and is_q(q) else None


def _erf_gelu(
    ix: GraphIndex, erf: onnx.NodeProto, consts: Mapping[str, np.ndarray]
) -> tuple[onnx.NodeProto, set[str], str] | None:
    div = _gelu_head(ix, erf, consts)
    x_src = _dq_source(ix, div.input[0]) if div is not None else None
    tail = _tail(ix, erf, consts, x_src) if div is not None and x_src is not None else None
    if div is None or tail is None:
        return None
    return tail[-1], {div.name, erf.name, *(n.name for n in tail)}, str(div.input[0])


def _cube_of(
    ix: GraphIndex, node: onnx.NodeProto | None, consts: Mapping[str, np.ndarray]
) -> tuple[str, set[str]] | None:
    """``x³`` as ``Pow(x, 3)``, ``Mul(x, Mul(x, x))`` or ``Mul(Mul(x, x), x)`` (Q/DQ between): (x's quantized
    source, the nodes)."""
    if node is None:
        return None
    if node.op_type == "Pow" and _near(_const_value(ix, node.input[1], consts), 3.0, 1e-6):
        src = _dq_source(ix, node.input[0])
        return (src, {node.name}) if src else None
    if node.op_type != "Mul" or len(node.input) != 2:
        return None
    for i in (0, 1):
        sq = _op_before(ix, node.input[1 - i])
        src = _dq_source(ix, node.input[i])
        if sq is not None and sq.op_type == "Mul" and src and {_dq_source(ix, t) for t in sq.input} == {src}:
            return src, {node.name, sq.name}
    return None


def _tanh_gelu(
    ix: GraphIndex, tanh: onnx.NodeProto, consts: Mapping[str, np.ndarray]
) -> tuple[onnx.NodeProto, set[str], str] | None:
    """``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`` as PyTorch's ``gelu(approximate="tanh")`` exports it
    (any operand order, ``Pow(x, 3)`` or two Muls for the cube), Q/DQ between the ops."""
    beta = _op_before(ix, tanh.input[0])
    inner = _has_const(ix, beta, consts, math.sqrt(2 / math.pi)) if beta is not None and beta.op_type == "Mul" else None
    add = _op_before(ix, inner) if inner is not None else None
    if add is None or add.op_type != "Add" or len(add.input) != 2:
        return None
    for i in (0, 1):
        x_src, kmul = _dq_source(ix, add.input[i]), _op_before(ix, add.input[1 - i])
        cubed = _has_const(ix, kmul, consts, 0.044715) if kmul is not None and kmul.op_type == "Mul" else None
        cube = _cube_of(ix, _op_before(ix, cubed), consts) if cubed is not None else None
        if x_src is None or cube is None or cube[0] != x_src:
            continue
        tail = _tail(ix, tanh, consts, x_src)
        if tail is not None and beta is not None and kmul is not None:  # (both are, once cube was found)
            members = {beta.name, add.name, kmul.name, tanh.name, *cube[1], *(n.name for n in tail)}
            return tail[-1], members, str(add.input[i])
    return None
