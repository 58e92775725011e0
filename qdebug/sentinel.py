"""Sentinel constants: an attention mask like −3.4e38 (−FLT_MAX), −1e9 or −10000 added to scores before a Softmax.

A transformer masks padded positions by adding a huge negative constant to the attention scores (``Add``, or
``Where(mask, scores, const)``; the constant often reaches the join through ``Cast``/``Sub``/``Mul``/``Expand`` of the
``attention_mask`` input, e.g. ``(1 - mask) * -FLT_MAX``). In float the Softmax maps every masked logit to exactly 0.
Quantized, the join's output and the Softmax's input share one grid with the constant: at 8 bits over
[−3.4e38, 12] the step is ~1.3e36 and the scores keep no bit at all, while the tensor's SQNR reads ~760 dB because
the mask elements dominate its energy.

This module finds them and offers two remedies (docs/diagnostics.md#sentinels):

* :func:`clamp_sentinels` rewrites the constant to a finite value the downstream Softmax maps identically in
  float32 (a masked logit ≥ :data:`SOFTMAX_MARGIN` below its row's maximum: ``exp`` underflows to exactly 0), chosen
  from the scores' calibrated range, and can prove the identity on ONNX Runtime on given samples
  (:func:`check_identical`). The shared grid shrinks from ~1e38 to ~(score range + 110).
* keep the mask path in float: :attr:`Sentinel.float_nodes` are the node names to give ORT's ``nodes_to_exclude``
  (``QuantConfig.nodes_to_exclude``).

:func:`masked_sqnr` measures a sentinel-carrying tensor's SQNR over its non-sentinel elements only.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from qdebug.data import open_data
from qdebug.errors import ConfigError, ModelError
from qdebug.graph_index import VIEW_OPS, GraphIndex, constant_values, decode_constant
from qdebug.metrics import sqnr_from_energies
from qdebug.model_io import input_specs
from qdebug.ort import expose_outputs, make_session
from qdebug.pairing import pair_models
from qdebug.passes import PassReport
from qdebug.report import decode_number, encode_number

__all__ = [
    "MIN_SENTINEL_ABS",
    "SENTINEL_SCHEMA_VERSION",
    "SOFTMAX_MARGIN",
    "IdentityCheck",
    "MaskedSqnr",
    "Sentinel",
    "check_identical",
    "clamp_sentinels",
    "clamp_value",
    "find_sentinels",
    "masked_sqnr",
]

SENTINEL_SCHEMA_VERSION = 1
#: A constant is a sentinel candidate from this magnitude on (−10000 is the smallest mask value in common use).
MIN_SENTINEL_ABS = 1e4
#: ... and when the data it joins are known, it must be this many times beyond their largest magnitude.
MIN_SENTINEL_RATIO = 100.0
#: exp(−110) ≈ 1.7e−48 is below float32's smallest subnormal (1.4e−45): a logit this far below its row's maximum
#: gets exactly 0 from Softmax, as −FLT_MAX does.
SOFTMAX_MARGIN = 110.0

#: Ops a mask travels through between its constant and the scores (shape, type and {0, 1}-mask arithmetic).
_MASK_PATH_OPS = frozenset(
    {*VIEW_OPS, "Cast", "Expand", "Tile", "Mul", "Sub", "Add", "Neg", "Where", "Concat", "Slice", "Min", "Max",
     "ConstantOfShape"}
)  # fmt: skip
#: Ops between the join and the Softmax that keep the masked elements masked.
_TO_SOFTMAX_OPS = frozenset({*VIEW_OPS, "Cast", "Add", "Sub", "Mul", "Div", "Where", "Expand", "Slice"})
_SOFTMAX_OPS = frozenset({"Softmax", "LogSoftmax"})
#: Ops whose output is "real data" (scores), as opposed to a mask built from inputs and constants.
_DATA_OPS = frozenset(
    {"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "MatMulInteger", "Gather", "LayerNormalization",
     "Softmax", "Attention", "MultiHeadAttention"}
)  # fmt: skip
_MAX_HOPS = 12


def _label(node: onnx.NodeProto) -> str:
    """A node's name, or for an unnamed node its op and first output (ORT cannot exclude it by name)."""
    return node.name or f"<unnamed {node.op_type} → {node.output[0] if node.output else '?'}>"


@dataclass(frozen=True)
class Sentinel:
    """One place where a sentinel constant meets real data on its way to a Softmax.

    ``constant`` is the tensor holding the sentinel (an initializer, a ``Constant`` or ``ConstantOfShape`` output)
    and ``value`` its sentinel element; ``join_node`` / ``join_op`` / ``join_output`` the node where it meets the
    ``scores`` tensor; ``softmax`` the Softmax it reaches; ``carriers`` the tensors from the join's output to the
    Softmax's input (they hold sentinel elements); ``path_nodes`` the nodes from the constant to the join.
    ``float_nodes`` are the node names to keep in float (ORT's ``nodes_to_exclude``) so that neither the mask nor
    the tensors it shares a grid with are quantized: the path from the constant, the join, the nodes up to and
    including the Softmax (whose input ORT would otherwise quantize). ``unnamed`` lists the path's nodes that have no
    name, which ``nodes_to_exclude`` cannot reach (``float_nodes`` leaves them out; clamping still works).
    """

    constant: str
    value: float
    join_node: str
    join_op: str
    join_output: str
    scores: str
    softmax: str
    carriers: tuple[str, ...]
    path_nodes: tuple[str, ...]
    float_nodes: tuple[str, ...]
    unnamed: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``schema_version`` (±inf/NaN as strings)."""
        return {
            "schema_version": SENTINEL_SCHEMA_VERSION,
            "constant": self.constant, "value": encode_number(self.value), "join_node": self.join_node,
            "join_op": self.join_op, "join_output": self.join_output, "scores": self.scores,
            "softmax": self.softmax, "carriers": list(self.carriers), "path_nodes": list(self.path_nodes),
            "float_nodes": list(self.float_nodes), "unnamed": list(self.unnamed),
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Sentinel:
        """Inverse of :meth:`to_dict`; refuses other schema versions."""
        if d.get("schema_version") != SENTINEL_SCHEMA_VERSION:
            raise ConfigError(f"sentinel schema_version {d.get('schema_version')!r} is not supported")
        value = decode_number(d["value"])
        return cls(
            constant=str(d["constant"]), value=float("nan") if value is None else float(value),
            join_node=str(d["join_node"]), join_op=str(d["join_op"]), join_output=str(d["join_output"]),
            scores=str(d["scores"]), softmax=str(d["softmax"]), carriers=tuple(d.get("carriers", ())),
            path_nodes=tuple(d.get("path_nodes", ())), float_nodes=tuple(d.get("float_nodes", ())),
            unnamed=tuple(d.get("unnamed", ())),
        )  # fmt: skip


# ---------------------------------------------------------------------------------------------- detection
def _sentinel_value(arr: np.ndarray, min_abs: float) -> float | None:
    """The constant's sentinel element (largest magnitude), if it is one: floats only, |v| ≥ ``min_abs``."""
    if arr.dtype.kind != "f" or arr.size == 0 or arr.size > 1 << 22:
        return None
    flat = arr.astype(np.float64).ravel()
    k = int(np.argmax(np.abs(flat)))
    v = float(flat[k])
    return v if (math.isinf(v) or abs(v) >= min_abs) and not math.isnan(v) else None


def _sources(idx: GraphIndex, min_abs: float) -> list[tuple[str, float]]:
    """Every constant tensor holding a sentinel-sized value, with that value."""
    out = []
    for name in idx.consts:
        try:
            v = _sentinel_value(idx.value(name), min_abs)
        except ModelError:  # an undecodable constant is not a mask (the pairing reports such a model)
            v = None
        if v is not None:
            out.append((name, v))
    for node in idx.nodes:
        if node.op_type == "ConstantOfShape" and node.output:
            attr = next((a for a in node.attribute if a.name == "value"), None)
            if attr is not None and (v := _sentinel_value(numpy_helper.to_array(attr.t), min_abs)) is not None:
                out.append((node.output[0], v))
    return out


def _data_tensors(idx: GraphIndex) -> set[str]:
    """Tensors computed from real data: outputs of :data:`_DATA_OPS` and everything computed from them (a mask
    built from an input and constants is not)."""
    data: set[str] = set()
    for node in idx.nodes:
        if node.op_type in _DATA_OPS or any(i in data for i in node.input if i):
            data.update(o for o in node.output if o)
    return data


def _to_softmax(idx: GraphIndex, start: str) -> tuple[onnx.NodeProto, list[onnx.NodeProto], list[str]] | None:
    """The Softmax ``start`` reaches through :data:`_TO_SOFTMAX_OPS` (first found), the nodes between, and the
    tensors from ``start`` to the Softmax's input."""
    frontier: list[tuple[str, list[onnx.NodeProto], list[str]]] = [(start, [], [start])]
    for _ in range(_MAX_HOPS):
        nxt = []
        for t, between, tensors in frontier:
            for c in idx.distinct_consumers(t):
                if c.op_type in _SOFTMAX_OPS:
                    return c, between, tensors
                if c.op_type in _TO_SOFTMAX_OPS and c.output:
                    nxt.append((c.output[0], [*between, c], [*tensors, c.output[0]]))
        frontier = nxt
    return None


def _max_abs(rng: tuple[float, float] | None) -> float | None:
    return None if rng is None else max(abs(rng[0]), abs(rng[1]))


def _joins(idx: GraphIndex, source: str, data: set[str]) -> list[tuple[onnx.NodeProto, str, list[onnx.NodeProto]]]:
    """Walk forward from ``source`` along mask-path ops to the nodes where it meets real data: (join node, its real
    data input, the path's nodes before the join)."""
    found = []
    seen: set[int] = set()
    frontier: list[tuple[str, list[onnx.NodeProto]]] = [(source, [])]
    for _ in range(_MAX_HOPS):
        nxt = []
        for t, path in frontier:
            for c in idx.distinct_consumers(t):
                if id(c) in seen or not c.output:
                    continue
                seen.add(id(c))
                scores = next((i for i in c.input if i in data and i != t), None)
                if scores is not None and c.op_type in {"Add", "Where", "Sub", "Min", "Max"}:
                    found.append((c, scores, path))
                elif c.op_type in _MASK_PATH_OPS and c.output[0] not in data:
                    nxt.append((c.output[0], [*path, c]))
        frontier = nxt
    return found


def find_sentinels(
    model: onnx.ModelProto,
    ranges: Mapping[str, tuple[float, float]] | None = None,
    *,
    min_abs: float = MIN_SENTINEL_ABS,
    min_ratio: float = MIN_SENTINEL_RATIO,
) -> tuple[Sentinel, ...]:
    """Every sentinel of a float model: a constant with |v| ≥ ``min_abs`` (finite or inf; a ``ConstantOfShape``'s
    value too) whose value reaches, through mask-path ops (``Cast``, ``Expand``, ``Mul``, ``Sub``, views, ...), a
    node where it meets real data (the output of a MatMul/Gemm/Conv/Gather/... chain), and from there a
    Softmax. ``ranges`` (tensor → float (min, max), e.g. a report's or the calibration's) adds the magnitude test:
    the sentinel must be ≥ ``min_ratio`` × the largest |x| of the data it joins. One :class:`Sentinel` per join, in
    the model's topological order. The model is not modified."""
    idx = GraphIndex(model)
    data = _data_tensors(idx)
    out = []
    for source, value in _sources(idx, min_abs):
        for join, scores, path in _joins(idx, source, data):
            reach = _to_softmax(idx, join.output[0])
            if reach is None:
                continue
            big = _max_abs((ranges or {}).get(scores))
            if big is not None and math.isfinite(value) and abs(value) < min_ratio * big:
                continue
            softmax, between, carriers = reach
            nodes = [*path, join, *between, softmax]
            unnamed = tuple(_label(n) for n in nodes if not n.name)
            out.append(
                Sentinel(
                    constant=source, value=value, join_node=_label(join), join_op=join.op_type,
                    join_output=join.output[0], scores=scores, softmax=_label(softmax), carriers=tuple(carriers),
                    path_nodes=tuple(_label(n) for n in path),
                    float_nodes=tuple(dict.fromkeys(n.name for n in nodes if n.name)), unnamed=unnamed,
                )
            )  # fmt: skip
    out.sort(key=lambda s: idx.position.get(s.join_output, 0))
    return tuple(out)


# ---------------------------------------------------------------------------------------------- the clamp
def clamp_value(value: float, score_range: tuple[float, float], margin: float = SOFTMAX_MARGIN) -> float:
    """The finite value that replaces sentinel ``value`` for scores in ``score_range``: the sign of ``value``,
    magnitude |min| + |max| + ``margin``. Added to a score (``Add``) or standing for it (``Where``), a masked logit
    is then ≤ min − ``margin`` ≤ its row's maximum − ``margin`` (any row with one unmasked element), so Softmax
    gives it exactly 0 in float32, as it did the sentinel."""
    lo, hi = score_range
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        raise ConfigError(f"score range [{lo}, {hi}] must be finite and ordered")
    magnitude = float(np.float32(abs(lo) + abs(hi) + margin))
    return -magnitude if value < 0 else magnitude


def _range_for(
    s: Sentinel, score_range: tuple[float, float] | Mapping[str, tuple[float, float]]
) -> tuple[float, float]:
    if isinstance(score_range, Mapping):
        if s.scores not in score_range:
            raise ConfigError(f"no score range for {s.scores!r} (the data the sentinel at {s.join_node} joins)")
        lo, hi = score_range[s.scores]
        return float(lo), float(hi)
    return float(score_range[0]), float(score_range[1])


def _replaced(arr: np.ndarray, new: float, min_abs: float) -> np.ndarray:
    """``arr`` with every sentinel-sized element (|v| ≥ ``min_abs`` or inf) set to ``new``, in its dtype."""
    big = np.abs(arr.astype(np.float64)) >= min_abs
    return np.where(big, np.asarray(new, dtype=arr.dtype), arr).astype(arr.dtype)


def _rewrite_constant(model: onnx.ModelProto, name: str, new: float, min_abs: float) -> str:
    """Set the sentinel elements of constant ``name`` (in ``model``, in place) to ``new``; the old value's text."""
    for node in model.graph.node:
        if node.op_type == "ConstantOfShape" and node.output and node.output[0] == name:
            attr = next(a for a in node.attribute if a.name == "value")
            old = numpy_helper.to_array(attr.t)
            attr.t.CopyFrom(numpy_helper.from_array(_replaced(old, new, min_abs), attr.t.name))
            return f"{float(old.ravel()[0]):.4g}"
    where = constant_values(model)[name]
    old = decode_constant(where)
    tensor = numpy_helper.from_array(_replaced(old, new, min_abs), name)
    if isinstance(where, onnx.TensorProto):
        where.CopyFrom(tensor)
    else:
        for a in list(where.attribute):
            where.attribute.remove(a)
        where.attribute.append(onnx.helper.make_attribute("value", tensor))
    k = int(np.argmax(np.abs(old.astype(np.float64)).ravel()))
    return f"{float(old.ravel()[k]):.4g}"


def _split_shared(model: onnx.ModelProto, name: str, on_path: set[str]) -> str:
    """When constant ``name`` is also read off the mask paths, give the path's readers (node names or labels in
    ``on_path``) a copy of their own, so the rewrite changes nothing else; the name the path now reads."""
    readers = [n for n in model.graph.node if name in n.input]
    if all(_label(n) in on_path for n in readers):
        return name
    copy = f"{name}/sentinel_clamped"
    where = constant_values(model).get(name)
    if where is None:  # a ConstantOfShape output: its only reader set is the mask path in practice
        return name
    model.graph.initializer.append(numpy_helper.from_array(decode_constant(where), copy))
    for n in readers:
        if _label(n) in on_path:
            for k, i in enumerate(n.input):
                if i == name:
                    n.input[k] = copy
    return copy


def clamp_sentinels(
    model: onnx.ModelProto,
    sentinels: Sequence[Sentinel],
    score_range: tuple[float, float] | Mapping[str, tuple[float, float]],
    *,
    samples: Iterable[Mapping[str, np.ndarray]] | None = None,
    margin: float = SOFTMAX_MARGIN,
    min_abs: float = MIN_SENTINEL_ABS,
) -> tuple[onnx.ModelProto, PassReport]:
    """A copy of ``model`` whose sentinel constants are finite values the downstream Softmax maps identically
    (:func:`clamp_value`), and the :class:`~qdebug.passes.PassReport` of the rewrite. ``model`` is not modified.

    ``score_range`` is the scores' calibrated (min, max) — one range for all, or per sentinel ``scores`` tensor.
    A constant feeding several joins gets the largest magnitude they need; a constant also read off the mask path
    is copied for the path. With ``samples``, the original and the clamped model run on ONNX Runtime and must give
    the same outputs (:func:`check_identical`); if they do not (e.g. a row masked entirely, which −FLT_MAX turns
    uniform and a finite value does not), the model is returned unchanged with the report's warning saying why.
    Deterministic: the same model, sentinels and ranges give the same bytes."""
    t0 = time.perf_counter()
    out = onnx.ModelProto()
    out.CopyFrom(model)
    need: dict[str, float] = {}
    on_path: dict[str, set[str]] = defaultdict(set)
    for s in sentinels:
        v = clamp_value(s.value, _range_for(s, score_range), margin)
        need[s.constant] = v if s.constant not in need or abs(v) > abs(need[s.constant]) else need[s.constant]
        on_path[s.constant].update((*s.path_nodes, s.join_node))
    details = []
    for const, new in need.items():
        target = _split_shared(out, const, on_path[const])
        old = _rewrite_constant(out, target, new, min_abs)
        details.append(f"{const}: {old} → {new:.6g}" + (f" (as {target})" if target != const else ""))
    n = len(model.graph.node)
    report = PassReport(
        name="clamp_sentinels", changed=bool(need), rewrites=len(need),
        detail=f"{len(need)} sentinel constant(s) clamped to a value Softmax maps identically (margin {margin:g})",
        nodes_before=n, nodes_after=len(out.graph.node), details=tuple(details),
        seconds=round(time.perf_counter() - t0, 4),
    )  # fmt: skip
    if samples is None or not need:
        return out, report
    check = check_identical(model, out, samples)
    if check.identical:
        return out, _with(report, details=(*details, check.summary), seconds=round(time.perf_counter() - t0, 4))
    unchanged = onnx.ModelProto()
    unchanged.CopyFrom(model)
    return unchanged, _with(
        report, changed=False, rewrites=0, detail="clamp not applied: the outputs changed",
        warnings=(check.summary,), seconds=round(time.perf_counter() - t0, 4),
    )  # fmt: skip


def _with(report: PassReport, **changes: Any) -> PassReport:
    from dataclasses import replace

    return replace(report, **changes)


@dataclass(frozen=True)
class IdentityCheck:
    """Two float models run on the same samples: the largest output difference relative to the output's largest
    magnitude, where it was, and whether that is within float rounding (``rtol``)."""

    samples: int
    max_rel_diff: float
    worst_output: str
    bit_identical: bool
    rtol: float

    @property
    def identical(self) -> bool:
        """Bit-identical, or within ``rtol`` of each output's largest magnitude."""
        return self.samples > 0 and self.max_rel_diff <= self.rtol

    @property
    def summary(self) -> str:
        """One line."""
        if self.bit_identical:
            return f"outputs bit-identical to the original on {self.samples} sample(s) (ONNX Runtime)"
        return (
            f"largest output difference {self.max_rel_diff:.3g} of the output's range at {self.worst_output!r} on "
            f"{self.samples} sample(s) ({'within' if self.identical else 'beyond'} float rounding, {self.rtol:g})"
        )


def check_identical(
    original: onnx.ModelProto,
    rewritten: onnx.ModelProto,
    samples: Iterable[Mapping[str, np.ndarray]],
    *,
    rtol: float = 1e-5,
    providers: Sequence[str] = ("CPUExecutionProvider",),
) -> IdentityCheck:
    """Run both float models on ONNX Runtime on ``samples`` (graph optimizations off) and compare every output."""
    a: Any = make_session(original, providers, role="float model")
    b: Any = make_session(rewritten, providers, role="rewritten float model")
    names = {i.name for i in a.get_inputs()}
    n, worst, where, bits = 0, 0.0, "", True
    for sample in samples:
        feed = {k: v for k, v in sample.items() if k in names}
        for out, x, y in zip(a.get_outputs(), a.run(None, feed), b.run(None, feed), strict=True):
            x64, y64 = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
            bits = bits and np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
            scale = float(np.max(np.abs(x64[np.isfinite(x64)]), initial=0.0)) or 1.0
            same = (x64 == y64) | (np.isnan(x64) & np.isnan(y64))  # equal infinities are no difference
            with np.errstate(invalid="ignore"):
                d = np.where(same, 0.0, np.nan_to_num(np.abs(x64 - y64), nan=np.inf))
            rel = float(d.max(initial=0.0)) / scale
            if not where or rel > worst:
                worst, where = rel, out.name
        n += 1
    return IdentityCheck(n, worst, where, bits and n > 0, rtol)


# ---------------------------------------------------------------------------------------------- masked SQNR
@dataclass(frozen=True)
class MaskedSqnr:
    """A sentinel-carrying tensor's SQNR over its non-sentinel elements (those whose float value is farther than
    ``tolerance`` — the grid step — from the sentinel), and how many elements were left out."""

    tensor: str
    sqnr_db: float | None
    sentinel_elements: int
    elements: int
    tolerance: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "tensor": self.tensor, "sqnr_db": encode_number(self.sqnr_db), "sentinel_elements": self.sentinel_elements,
            "elements": self.elements, "tolerance": encode_number(self.tolerance),
        }  # fmt: skip


def masked_sqnr(
    float_model: onnx.ModelProto,
    quant_model: onnx.ModelProto,
    tensors: Mapping[str, tuple[float, float]],
    data: Any = None,
    *,
    max_samples: int = 8,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    synthetic: Mapping[str, Any] | None = None,
    providers: Sequence[str] = ("CPUExecutionProvider",),
) -> dict[str, MaskedSqnr]:
    """SQNR of each tensor (float name → (sentinel value, tolerance)) over the elements whose float value is not
    within ``tolerance`` of the sentinel: float model against the quantized model's dequantized value of it, on the
    first ``max_samples`` samples of ``data`` (as :func:`qdebug.debugger` takes it), one sample in memory at a time."""
    pairing = pair_models(float_model, quant_model)
    post = {p.tensor_name: p.post_qdq for p in pairing.activations if p.tensor_name in tensors}
    names = list(post)
    if not names:
        return {}
    fs: Any = make_session(expose_outputs(float_model, names), providers, role="float model")
    qs: Any = make_session(expose_outputs(quant_model, [post[t] for t in names]), providers, role="quantized model")
    sums = {t: [0.0, 0.0, 0, 0] for t in names}  # signal, noise, sentinel elements, elements
    source = open_data(
        data, input_specs(float_model), num_samples=max_samples, input_shapes=input_shapes, **(synthetic or {})
    )
    f_in, q_in = {i.name for i in fs.get_inputs()}, {i.name for i in qs.get_inputs()}
    for k, sample in enumerate(source):
        if k >= max_samples:
            break
        xs = fs.run(names, {n: v for n, v in sample.items() if n in f_in})
        ys = qs.run([post[t] for t in names], {n: v for n, v in sample.items() if n in q_in})
        for t, x, y in zip(names, xs, ys, strict=True):
            value, tol = tensors[t]
            x64, y64 = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
            masked = ~np.isfinite(x64) | (np.abs(x64 - value) <= tol)
            keep = ~masked
            s = sums[t]
            s[0] += float(np.sum(x64[keep] ** 2))
            s[1] += float(np.sum((x64[keep] - y64[keep]) ** 2))
            s[2] += int(masked.sum())
            s[3] += x64.size
    out = {}
    for t, (sig, noise, n_masked, n) in sums.items():
        db = None if n_masked == n else sqnr_from_energies(sig, noise)[0]
        out[t] = MaskedSqnr(t, db, int(n_masked), int(n), tensors[t][1])
    return out
