"""Post-Q/DQ tensors recomputed from the quantized integers instead of fetched from ONNX Runtime.

A quantized activation's post-Q/DQ tensor is ``DequantizeLinear(q)`` of the integer tensor ``q`` its QuantizeLinear
wrote. Exposing ``q`` (1-2 bytes per element) instead of the float32 result (4 bytes) moves a quarter to a half of
the bytes, and lets ONNX Runtime recycle the float buffer, which shortens the quantized model's inference
(benchmarks/bench_dequant.py). The reduction then
computes the post values itself, which is exact: ``DequantizeLinear`` is ``float32(int32(q) - zero_point) * scale``
in float32, one rounding, and the kernel forms the exact float64 product of the two float32 factors and rounds it to
float32 once, the same IEEE result.

Only what is certain is recomputed (:func:`find_specs`): a per-tensor DequantizeLinear (ONNX's or com.microsoft's)
with constant float32 scale and 8- or 16-bit integer zero point, no blocks, whose input is an activation. Before a
run uses them, :func:`verified` has this ONNX Runtime dequantize **every** integer value of each 8-bit (type, scale,
zero point), and ``wide_checks`` spread over each 16-bit one, and keeps only those whose every result matches bit
for bit; anything else keeps its float tensor exposed.

:class:`Dequantized` is the quantized model's values as the reducers see them: a post-Q/DQ tensor that was not
fetched is computed on first access (numpy; the reference reducer), while the compiled reducer reads the integers
directly (:func:`~qdebug.capture.compiled.reduce_sample_compiled`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from qdebug.capture.tuning import CaptureTuning
from qdebug.ort import make_session
from qdebug.pairing import Pairing

__all__ = ["DequantSpec", "Dequantized", "dequantize", "find_specs", "verified", "whole_run_specs"]

_INTS = {np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16)}
_DOMAINS = ("", "ai.onnx", "com.microsoft")


@dataclass(frozen=True)
class DequantSpec:
    """How to compute one post-Q/DQ tensor: ``float32(int32(ints) - zero_point) * scale``."""

    post: str  # the DequantizeLinear's output (the activation's post-Q/DQ tensor)
    ints: str  # its integer input, exposed instead
    scale: float  # a float32 value
    zero_point: int
    dtype: np.dtype[Any]  # the integer type
    domain: str = ""  # the DequantizeLinear's: ONNX's, or com.microsoft's (16-bit before opset 21)

    @property
    def key(self) -> tuple[str, int, int, str]:
        """What the result depends on: integer type, scale's bits, zero point, and which operator computes it."""
        return self.dtype.str, int(np.float32(self.scale).view(np.uint32)), self.zero_point, self.domain


def dequantize(spec: DequantSpec, ints: np.ndarray) -> np.ndarray:
    """The post-Q/DQ tensor of ``ints`` (numpy; the same float32 values as ONNX Runtime's DequantizeLinear).

    A view that repeats its values along an axis (a zero stride: a batch's tensor computed from constants, the same
    for every sample) gives a view that repeats them too: computed once, and the batch reduction still sees that
    every sample shares it (:mod:`qdebug.capture.kernels.batched`)."""
    once = ints[tuple(slice(0, 1) if stride == 0 else slice(None) for stride in ints.strides)]
    # A grid that reaches past float32 (a −FLT_MAX attention mask's: scale ~1.3e36) overflows to ±inf at its ends,
    # as DequantizeLinear's float32 product does in ONNX Runtime: the same values, no warning.
    with np.errstate(over="ignore"):
        values = (once.astype(np.int32) - np.int32(spec.zero_point)).astype(np.float32) * np.float32(spec.scale)
    return np.broadcast_to(values, ints.shape) if once.shape != ints.shape else values


def _scalar(inits: Mapping[str, onnx.TensorProto], name: str) -> np.ndarray | None:
    t = inits.get(name)
    if t is None:
        return None
    value = numpy_helper.to_array(t)
    return value if value.size == 1 else None


def find_specs(quant_model: onnx.ModelProto, pairing: Pairing) -> dict[str, DequantSpec]:
    """The quantized activations whose post-Q/DQ tensor can be recomputed, by post-Q/DQ name (see module doc)."""
    inits = {t.name: t for t in quant_model.graph.initializer}
    producer = {o: n for n in quant_model.graph.node for o in n.output if o}
    graph_inputs = {i.name for i in quant_model.graph.input}
    specs: dict[str, DequantSpec] = {}
    for a in pairing.activations:
        node = producer.get(a.post_qdq)
        if not a.quantized or node is None or node.op_type != "DequantizeLinear" or node.domain not in _DOMAINS:
            continue
        if len(node.input) < 3 or node.input[0] in inits or node.input[0] in graph_inputs:
            continue
        if any(at.name == "block_size" and at.i for at in node.attribute):
            continue
        scale, zp = _scalar(inits, node.input[1]), _scalar(inits, node.input[2])
        if scale is None or zp is None or scale.dtype != np.float32 or zp.dtype not in _INTS:
            continue
        domain = "com.microsoft" if node.domain == "com.microsoft" else ""
        specs[a.post_qdq] = DequantSpec(a.post_qdq, node.input[0], float(scale.reshape(())), int(zp), zp.dtype, domain)
    return specs


def _all_values(dtype: np.dtype[Any], checks: int) -> np.ndarray:
    """Every value of an 8-bit type (``checks`` of a 16-bit one, spread evenly, both ends included: all 65,536 for
    every activation would be large check tensors for the same formula), then a few again: a length that is not a
    multiple of any vector width, so ORT's vectorised body and its scalar tail both run."""
    info = np.iinfo(dtype)
    lo, hi = int(info.min), int(info.max)
    values = np.arange(lo, hi + 1, dtype=np.int64) if hi - lo < checks else np.linspace(lo, hi, checks)
    values = values.round().astype(np.int64).astype(dtype)
    return np.concatenate([values, values[:13]])


def verified(
    specs: Mapping[str, DequantSpec],
    quant_model: onnx.ModelProto,
    providers: Sequence[str],
    checks: int = CaptureTuning.wide_checks,
) -> dict[str, DequantSpec]:
    """The specs whose recomputation ONNX Runtime confirms bit for bit on every 8-bit value (``checks`` 16-bit
    ones; one small session of one DequantizeLinear per distinct type, scale and zero point); none when that
    session cannot be made."""
    groups: dict[tuple[str, int, int, str], DequantSpec] = {}
    for spec in specs.values():
        groups.setdefault(spec.key, spec)
    if not groups:
        return {}
    nodes, inputs, outputs, inits, feed = [], [], [], [], {}
    for g, spec in enumerate(groups.values()):
        x = _all_values(spec.dtype, checks)
        feed[f"x{g}"] = x
        elem = onnx.helper.np_dtype_to_tensor_dtype(spec.dtype)
        inputs.append(onnx.helper.make_tensor_value_info(f"x{g}", elem, [len(x)]))
        outputs.append(onnx.helper.make_tensor_value_info(f"y{g}", onnx.TensorProto.FLOAT, [len(x)]))
        inits.append(numpy_helper.from_array(np.array(spec.scale, np.float32), f"s{g}"))
        inits.append(numpy_helper.from_array(np.array(spec.zero_point, spec.dtype), f"z{g}"))
        nodes.append(
            onnx.helper.make_node("DequantizeLinear", [f"x{g}", f"s{g}", f"z{g}"], [f"y{g}"], domain=spec.domain)
        )
    opset = max((o.version for o in quant_model.opset_import if o.domain in ("", "ai.onnx")), default=13)
    graph = onnx.helper.make_graph(nodes, "qdebug_dequant_check", inputs, outputs, inits)
    opsets = [onnx.helper.make_opsetid("", max(opset, 13)), onnx.helper.make_opsetid("com.microsoft", 1)]
    model = onnx.helper.make_model(graph, opset_imports=opsets)
    model.ir_version = quant_model.ir_version
    try:
        sess: Any = make_session(model, providers, role="dequantization check")
        got = sess.run(None, feed)
    except Exception:  # an ORT that cannot run it (its own error types): keep every float tensor exposed
        return {}
    good = {
        key
        for (key, spec), y, x in zip(groups.items(), got, feed.values(), strict=True)
        if np.array_equal(np.asarray(y).view(np.uint32), dequantize(spec, x).view(np.uint32))
    }
    return {post: spec for post, spec in specs.items() if spec.key in good}


class Dequantized(Mapping[str, np.ndarray]):
    """The quantized model's fetched values plus the post-Q/DQ tensors of ``specs`` computed on first access from
    their integers (kept for the rest of the sample). :meth:`ints` gives a reducer that reads the integers instead."""

    def __init__(self, values: Mapping[str, np.ndarray], specs: Mapping[str, DequantSpec]) -> None:
        self.fetched, self.specs = values, specs
        self._made: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self.fetched:
            return self.fetched[name]
        if name not in self._made:
            spec = self.specs.get(name)
            if spec is None or spec.ints not in self.fetched:
                raise KeyError(name)
            self._made[name] = dequantize(spec, self.fetched[spec.ints])
        return self._made[name]

    def __contains__(self, name: object) -> bool:
        return name in self.fetched or (name in self.specs and self.specs[name].ints in self.fetched)  # type: ignore[index]

    def __iter__(self) -> Iterator[str]:
        yield from self.fetched
        yield from (n for n, s in self.specs.items() if n not in self.fetched and s.ints in self.fetched)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def ints(self, name: str) -> tuple[np.ndarray, DequantSpec] | None:
        """The integers and spec of a post-Q/DQ tensor that was not fetched (``None``: it was, or has no spec)."""
        if name in self.fetched or name in self._made:
            return None
        spec = self.specs.get(name)
        return None if spec is None or spec.ints not in self.fetched else (self.fetched[spec.ints], spec)

    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's shape without computing it."""
        found = self.ints(name)
        return tuple(found[0].shape) if found is not None else tuple(self[name].shape)


def whole_run_specs(
    quant_model: onnx.ModelProto, pairing: Pairing, providers: Sequence[str], checks: int
) -> dict[str, DequantSpec]:
    """The post-Q/DQ tensors a whole-model run can compute from their integers (:mod:`qdebug.capture.dequant`):
    every one ONNX Runtime confirms, except those that are model outputs (ORT writes those anyway)."""
    outputs = {o.quant_name for o in pairing.outputs} | {o.name for o in quant_model.graph.output}
    specs = {post: spec for post, spec in find_specs(quant_model, pairing).items() if post not in outputs}
    return verified(specs, quant_model, providers, checks) if specs else {}
