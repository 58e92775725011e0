"""In-graph reduction: both models merged into one ONNX graph that reduces every paired tensor to sums.

The float model's nodes are renamed with an ``f/`` prefix and the quantized model's with ``q/``; both read the
same (unprefixed) graph inputs. For every pair the merged graph computes, per sample, exactly the sums the
numpy path (:func:`qdebug.metrics.reduce_pairs`, :func:`qdebug.metrics.value_ranges`) computes from fetched
tensors, and returns them as a handful of small vectors, so no activation leaves ONNX Runtime:

``sums64`` (float64)
    Σref², Σ(ref−post)² per activation; Σpre², Σ(pre−post)² per quantized activation; Σref², Σ(ref−test)²
    per model output. Squares are summed in float64 (``Cast`` before ``ReduceSumSquare``); the differences are
    float32, as in the numpy path for large tensors.
``stats32`` (float32)
    max|ref−post|, min(ref), max(ref) per activation; max|pre−post| per quantized activation; max|ref−test|
    per output.
``sizes`` (int64)
    the element count of every reference (activations, then outputs).
``shapes_a`` / ``shapes_b`` (int64)
    the concatenated run-time shapes of both sides of every pair whose shapes are not known statically: equal
    vectors mean equal shapes.
``check32`` (float32)
    Σ of every tensor that is clipped before it is compared (``fused_activation`` / ``measured_through``): a
    clip can turn ±inf into a finite value, so NaN/Inf in those tensors are detected here.

:class:`Layout` says where each value lands. Small float32 pairs of one static shape are stacked (``Concat``
along the batch axis, or as ``[1, n]`` rows) and reduced together: ONNX Runtime's per-node cost, not the
arithmetic, dominates for tensors of a few hundred elements. Larger or dynamic ones are reduced one by one.

Anything non-finite in a sample's vectors, or shapes that differ, means the sample must be redone the numpy way
(exact non-finite counts, statuses and error messages). The graph is evaluated with optimizations off, like the
numpy path's sessions, so every tensor has the same value in both. A float model at a lower default opset than
the quantized one (quantizers raise it for 16-bit Q/DQ) is converted up with ONNX's version converter first;
anything the merge cannot express raises :class:`UnsupportedGraphError` and the caller uses the numpy path.

The merged model is built in :mod:`qdebug.capture.kernels.ingraph_model` (:func:`build`, its :class:`Layout`); this
module reads one run's vectors back into a sample's sums (:func:`problem`, :func:`read_sums`) and runs the whole as a
:class:`~qdebug.capture.kernels.base.Reducer` (:class:`InGraphReducer`). The capture's ``graph`` backend uses it
through this module alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

from qdebug.capture.base import SampleSums
from qdebug.capture.dequant import Dequantized
from qdebug.capture.kernels.base import Samples, register_reducer
from qdebug.capture.kernels.ingraph_model import (
    CONCAT_FAN_IN,
    MAX_MERGED_BYTES,
    OUTPUTS,
    Layout,
    Small,
    UnsupportedGraphError,
    build,
)
from qdebug.capture.kernels.reference import ReductionPlan, reduce_sample
from qdebug.errors import ModelError
from qdebug.metrics import BatchSums
from qdebug.ort import make_session, ort_errors

#: The merged model's names the ``graph`` backend reads through this module, with the read-back and the reducer.
__all__ = [
    "CONCAT_FAN_IN",
    "MAX_MERGED_BYTES",
    "OUTPUTS",
    "InGraphReducer",
    "Layout",
    "Small",
    "UnsupportedGraphError",
    "build",
    "problem",
    "read_sums",
]


_SUMS = ("cum_sig", "cum_noise", "cum_max", "f_min", "f_max", "loc_sig", "loc_noise", "loc_max", "out_sig",
         "out_noise", "out_max")  # fmt: skip


def problem(layout: Layout, out: Mapping[str, np.ndarray]) -> str | None:
    """Why one run's vectors (:data:`OUTPUTS` by name) are not the sample's exact sums — shapes that differ at run
    time, NaN/Inf anywhere (the counts and statuses need the tensors) — or ``None``: :func:`read_sums` reads them."""
    for name in ("sums64", "stats32", "sizes"):
        if out[name].shape != (layout.lengths[name],):
            return "shapes differ at run time"
    if out["shapes_a"].shape != out["shapes_b"].shape or not np.array_equal(out["shapes_a"], out["shapes_b"]):
        return "shapes differ at run time"
    if not all(np.isfinite(out[k]).all() for k in ("sums64", "stats32", "check32", "small_a", "small_b", "small_p")):
        return "NaN/Inf in the sample's tensors"
    return None


def read_sums(layout: Layout, quant_idx: npt.NDArray[np.intp], out: Mapping[str, np.ndarray]) -> SampleSums:
    """One sample's sums from one run's vectors (:data:`OUTPUTS` by name) that :func:`problem` accepted;
    ``quant_idx``: the activation index of each quantized ordinal."""
    n, nq, no = layout.n_acts, layout.n_quant, layout.n_outs
    sizes = {"cum": n, "f": n, "loc": nq, "out": no}
    arrays = {kind: np.zeros(sizes[kind.split("_")[0]]) for kind in _SUMS}
    counts, out_counts = np.zeros(n, dtype=np.int64), np.zeros(no, dtype=np.int64)
    values = np.concatenate([out["sums64"], out["stats32"].astype(np.float64)])
    for kind, (items, where) in layout.pos.items():
        if kind == "act_count":
            counts[items] = out["sizes"][where]
        elif kind == "out_count":
            out_counts[items] = out["sizes"][where]
        else:
            arrays[kind][items] = values[where]
    if len(layout.small.acts):
        _read_small(layout.small, out, arrays, counts)
    a = arrays

    def batch(kind: str, count: npt.NDArray[np.int64]) -> BatchSums:
        zeros = np.zeros(len(count), dtype=np.int64)
        return BatchSums(a[f"{kind}_sig"], a[f"{kind}_noise"], count, a[f"{kind}_max"], zeros, zeros)

    return SampleSums(
        cumulative=batch("cum", counts),
        local=batch("loc", counts[quant_idx]),
        outputs=batch("out", out_counts),
        float_min=a["f_min"],
        float_max=a["f_max"],
        elements=counts,
    )


def _read_small(
    sm: Small, out: Mapping[str, np.ndarray], arrays: dict[str, np.ndarray], counts: npt.NDArray[np.int64]
) -> None:
    """The numpy path's own small-tensor arithmetic (float64 ``reduceat``) on the fetched ``small_*`` vectors."""
    x, y = out["small_a"].astype(np.float64), out["small_b"].astype(np.float64)
    arrays["f_min"][sm.acts] = np.minimum.reduceat(x, sm.offsets)
    arrays["f_max"][sm.acts] = np.maximum.reduceat(x, sm.offsets)
    if sm.through is not None:
        x, y = np.clip(x, *sm.through), np.clip(y, *sm.through)
    d = x - y
    arrays["cum_sig"][sm.acts] = np.add.reduceat(x * x, sm.offsets)
    arrays["cum_noise"][sm.acts] = np.add.reduceat(d * d, sm.offsets)
    arrays["cum_max"][sm.acts] = np.maximum.reduceat(np.abs(d), sm.offsets)
    counts[sm.acts] = sm.sizes
    if len(sm.quant):
        pre = out["small_p"].astype(np.float64)
        for lo, hi in sm.pre_clips:
            pre = np.clip(pre, lo, hi)
        dl = pre - y[: sm.quant_elements]
        offs = sm.offsets[: len(sm.quant)]
        arrays["loc_sig"][sm.quant] = np.add.reduceat(pre * pre, offs)
        arrays["loc_noise"][sm.quant] = np.add.reduceat(dl * dl, offs)
        arrays["loc_max"][sm.quant] = np.maximum.reduceat(np.abs(dl), offs)


def _io(name: str, value: np.ndarray) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape))


def _models_of(plan: ReductionPlan, f: Mapping[str, np.ndarray], q: Mapping[str, np.ndarray]) -> tuple[Any, ...]:
    """A float and a quantized model that compute ``plan``'s tensors from graph inputs holding one sample's values
    (``in/<name>``; a post-Q/DQ tensor given as integers through a real ``DequantizeLinear``), and the feed names."""
    specs = q.specs if isinstance(q, Dequantized) else {}
    fetched: Mapping[str, np.ndarray] = q.fetched if isinstance(q, Dequantized) else {n: q[n] for n in plan.quant_names}
    inputs = {**{n: f[n] for n in plan.float_names}, **fetched}
    graph_inputs = [_io(f"in/{n}", v) for n, v in inputs.items()]
    f_nodes = [helper.make_node("Identity", [f"in/{n}"], [n]) for n in plan.float_names]
    q_nodes, q_inits = [helper.make_node("Identity", [f"in/{n}"], [n]) for n in fetched], []
    for post, spec in specs.items():
        if spec.ints in fetched:
            scale, zp = f"{post}/scale", f"{post}/zero_point"
            q_inits += [numpy_helper.from_array(np.array(spec.scale, np.float32), scale),
                        numpy_helper.from_array(np.array(spec.zero_point, spec.dtype), zp)]  # fmt: skip
            q_nodes.append(helper.make_node("DequantizeLinear", [f"in/{spec.ints}", scale, zp], [post]))

    def model(nodes: list[onnx.NodeProto], inits: list[TensorProto], values: Mapping[str, np.ndarray]) -> Any:
        outs = [_io(n.output[0], values[n.output[0]]) for n in nodes]
        graph = helper.make_graph(nodes, "m", graph_inputs, outs, inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)

    return model(f_nodes, [], f), model(q_nodes, q_inits, q), list(inputs)


class InGraphReducer:
    """The in-graph reduction as a :class:`~qdebug.capture.kernels.base.Reducer`: models whose graph inputs are the
    samples' tensors, merged by :func:`build`, run by ONNX Runtime (optimizations off, as the ``graph`` backend
    runs it), read back by :func:`read_sums`; a sample :func:`problem` rejects, or a pair the merge or ONNX Runtime
    does not take, is the reference's, as the capture then redoes it."""

    name = "ingraph"

    def __init__(self, *, concat_fan_in: int = CONCAT_FAN_IN, max_merged_bytes: int = MAX_MERGED_BYTES) -> None:
        self.concat_fan_in, self.max_merged_bytes = concat_fan_in, max_merged_bytes

    def reduce(self, plan: ReductionPlan, samples: Samples) -> list[SampleSums]:
        """See :class:`~qdebug.capture.kernels.base.Reducer`."""
        fm, qm, feed = _models_of(plan, *samples[0])
        quant_idx = np.array([j for j, a in enumerate(plan.pairing.activations) if a.quantized], dtype=np.intp)
        try:
            model, layout = build(fm, qm, plan.pairing, concat_fan_in=self.concat_fan_in,
                                  max_merged_bytes=self.max_merged_bytes)  # fmt: skip
            sess: Any = make_session(model, ["CPUExecutionProvider"])
        except (UnsupportedGraphError, ModelError):
            return [reduce_sample(plan, f, q) for f, q in samples]
        result = []
        for f, q in samples:
            values = {**f, **(q.fetched if isinstance(q, Dequantized) else q)}
            try:
                out = dict(zip(OUTPUTS, sess.run(list(OUTPUTS), {f"in/{n}": values[n] for n in feed}), strict=True))
            except ort_errors():
                out = None
            if out is None or problem(layout, out) is not None:
                result.append(reduce_sample(plan, f, q))
            else:
                result.append(read_sums(layout, quant_idx, out))
        return result


register_reducer("ingraph", InGraphReducer)
