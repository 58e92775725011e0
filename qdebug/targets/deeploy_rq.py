"""RequantShift construction shared by the Deeploy export modules (deeploy_fold, deeploy_passes, deeploy_transformer).

Deeploy's ``RequantShift(x, mul, add)``: ``y = clip(floor((x·mul + add + div/2) / div), lo, hi)``, ``div = 2^k``,
computed in int32 (docs/deeploy.md). Kept apart so that the op modules share it without importing each other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qdebug.errors import TargetError

_INT32_LIMIT = 2**31
_MAX_SHIFT = 30


class _State(Protocol):
    def unique(self, base: str) -> str: ...
    def set_const(self, name: str, value: np.ndarray) -> None: ...


class _Signed(Protocol):
    @property
    def signed(self) -> bool: ...


def _node(op: str, inputs: Sequence[str], outputs: Sequence[str], name: str, **attrs: Any) -> onnx.NodeProto:
    return helper.make_node(op, list(inputs), list(outputs), name=name, **attrs)


def _choose_requant(
    m: np.ndarray, acc_max: np.ndarray | float, zp: int, multiple_of: int = 1
) -> tuple[np.ndarray, int]:
    """(mul, k) with div = 2^k: the most precise pair whose int32 arithmetic cannot overflow (module docstring).
    ``multiple_of`` (a power of two) forces every mul to be a multiple of it."""
    for k in range(_MAX_SHIFT, -1, -1):
        mul = np.rint(m * 2.0**k / multiple_of) * multiple_of
        if np.max(mul * acc_max) + (abs(zp) + 1) * 2.0**k < _INT32_LIMIT and mul.min() >= 1:
            return mul.astype(np.int64), k
    raise TargetError(f"requantization factor {float(m.max()):.3g} cannot be represented in int32 RequantShift")


def _requant_node(
    state: _State,
    src: str,
    dst: str,
    mul: np.ndarray,
    add: np.ndarray,
    k: int,
    act: _Signed,
    ch_shape: tuple[int, ...],
) -> onnx.NodeProto:
    mul_name, add_name = state.unique(f"{dst}_rq_mul"), state.unique(f"{dst}_rq_add")
    state.set_const(mul_name, _channels(mul, ch_shape))
    state.set_const(add_name, _channels(add, ch_shape))
    return _rqs(src, mul_name, add_name, dst, state.unique(f"{dst}_RequantShift"), 2**k, 256, act.signed)


def _channels(v: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    flat = np.asarray(v, np.int64).reshape(-1)
    out = np.broadcast_to(flat, (math.prod(shape),)) if flat.size == 1 else flat
    return out.reshape(shape).astype(np.int32)


def _rqs(src: str, mul: str, add: str, dst: str, name: str, div: int, n_levels: int, signed: bool) -> onnx.NodeProto:
    node = _node("RequantShift", [src, mul, add], [dst], name)
    for key, val in (("div", float(div)), ("n_levels", float(n_levels)), ("signed", float(signed))):
        # Deeploy reads these as 1-element tensor attributes; plain ints fail there.
        node.attribute.append(helper.make_attribute(key, numpy_helper.from_array(np.array([val], np.float32), key)))
    return node
