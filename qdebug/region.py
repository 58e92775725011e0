"""A region of a float model, cut between named tensors, and the data that feeds it.

``qdebug build --extract-inputs T1,T2 --extract-outputs T3`` builds only the part of the model between those
tensors for the target (e.g. a transformer encoder for an MCU, with the embedding lookup and the pooling left to
the host). The region is cut with ``onnx.utils.Extractor`` from the float model; its inputs take the dtype and
shape of the first sample's values. The user's data feeds the *original* inputs, so :func:`region_data` runs the
float model on ONNX Runtime up to the region's inputs and returns their values, sample by sample, in the layout of
an ``.npz`` (``(N, *sample_shape)``); arrays that are not model inputs (labels) pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from qdebug.errors import ConfigError, DataError, ModelError

__all__ = ["Region", "check_region", "extract_region", "parse_tensor_list", "probe", "region_data"]


@dataclass(frozen=True)
class Region:
    """The tensors a region is cut at: its new graph inputs and outputs."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the build manifest's ``region``)."""
        return {"inputs": list(self.inputs), "outputs": list(self.outputs)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Region:
        """Inverse of :meth:`to_dict`."""
        return cls(tuple(d["inputs"]), tuple(d["outputs"]))


def parse_tensor_list(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"a,b"`` (or a list of such strings) → ``("a", "b")``; empty items are dropped."""
    if text is None:
        return ()
    items = [text] if isinstance(text, str) else list(text)
    return tuple(t.strip() for item in items for t in item.split(",") if t.strip())


def _tensor_names(model: onnx.ModelProto) -> set[str]:
    g = model.graph
    return {o for n in g.node for o in n.output if o} | {i.name for i in g.input}


def check_region(model: onnx.ModelProto, region: Region, what: str) -> None:
    """Every named tensor exists, none is named twice, and both lists are non-empty (one-line errors)."""
    if not region.inputs or not region.outputs:
        raise ConfigError("a region needs both --extract-inputs and --extract-outputs")
    names = _tensor_names(model)
    inits = {t.name for t in model.graph.initializer}
    for flag, tensors in (("--extract-inputs", region.inputs), ("--extract-outputs", region.outputs)):
        for t in tensors:
            if t in inits and t not in names:
                raise ConfigError(f"{flag}: {t!r} is a constant (initializer) of {what}, not an activation")
            if t not in names:
                raise ModelError(f"{flag}: {what} has no tensor {t!r}")
    twice = sorted({t for t in region.inputs + region.outputs if (region.inputs + region.outputs).count(t) > 1})
    if twice:
        raise ConfigError(f"--extract-inputs/--extract-outputs name {twice} more than once")


def _value_info(name: str, value: np.ndarray) -> onnx.ValueInfoProto:
    elem = onnx.helper.np_dtype_to_tensor_dtype(value.dtype)
    return onnx.helper.make_tensor_value_info(name, elem, list(value.shape))


def _run_to(model: onnx.ModelProto, tensors: Sequence[str], what: str) -> Any:
    """A session of ``model`` whose outputs are ``tensors`` (intermediate ones exposed by name)."""
    from qdebug.ort import make_session

    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.output[:]
    m.graph.output.extend(onnx.ValueInfoProto(name=t) for t in tensors)
    return make_session(m, ["CPUExecutionProvider"], what=what)


def _values(
    sess: Any, computed: Sequence[str], feed: Mapping[str, np.ndarray], what: str, i: int
) -> dict[str, np.ndarray]:
    """``computed`` on one sample; ONNX Runtime's failure is a one-line :class:`DataError` naming the sample."""
    from qdebug.ort import ort_errors, ort_message

    try:
        return dict(zip(computed, sess.run(list(computed), dict(feed)), strict=True))
    except ort_errors() as exc:
        raise DataError(f"{what}: computing the region's inputs failed on sample {i}: {ort_message(exc)}") from exc


def probe(
    model: onnx.ModelProto, sample: Mapping[str, np.ndarray], tensors: Sequence[str], what: str
) -> dict[str, np.ndarray]:
    """The values of ``tensors`` (graph inputs or intermediate tensors) on one sample of ``model``'s inputs."""
    graph_inputs = {i.name for i in model.graph.input} - {t.name for t in model.graph.initializer}
    computed = [t for t in tensors if t not in graph_inputs]
    values: dict[str, np.ndarray] = {}
    if computed:
        sess = _run_to(model, computed, what)
        values = _values(sess, computed, {k: sample[k] for k in graph_inputs}, what, 0)
    return {t: np.asarray(values[t] if t in values else sample[t]) for t in tensors}


def region_data(
    model: onnx.ModelProto, samples: Iterable[Mapping[str, np.ndarray]], region: Region, what: str
) -> dict[str, np.ndarray]:
    """The region's input values for every sample (``(N, *sample_shape)`` per region input)."""
    feeds = {i.name for i in model.graph.input} - {t.name for t in model.graph.initializer}
    computed = [t for t in region.inputs if t not in feeds]
    sess = _run_to(model, computed, what) if computed else None
    rows: dict[str, list[np.ndarray]] = {t: [] for t in region.inputs}
    for i, sample in enumerate(samples):
        values = _values(sess, computed, {k: sample[k] for k in feeds}, what, i) if sess else {}
        for t in region.inputs:
            rows[t].append(np.asarray(values[t] if t in values else sample[t]))
    return {t: np.stack(v) for t, v in rows.items()}


def extract_region(
    model: onnx.ModelProto, region: Region, first: Mapping[str, np.ndarray], what: str
) -> onnx.ModelProto:
    """The float model cut to ``region``; ``first`` maps every region input *and output* to its value on one
    sample (their dtypes and shapes type the new graph's inputs and outputs)."""
    check_region(model, region, what)
    from onnx.utils import Extractor

    g = onnx.ModelProto()
    g.CopyFrom(model)
    typed = {t: _value_info(t, first[t]) for t in (*region.inputs, *region.outputs)}
    kept = [v for v in g.graph.value_info if v.name not in typed]
    del g.graph.value_info[:]
    g.graph.value_info.extend([*kept, *typed.values()])
    for io in (g.graph.input, g.graph.output):  # the region's typing wins over the original graph's
        keep = [v for v in io if v.name not in typed]
        del io[:]
        io.extend(keep)
    sub = Extractor(g).extract_model(list(region.inputs), list(region.outputs))
    _check_closed(sub, region, model, what)
    return sub


def _check_closed(sub: onnx.ModelProto, region: Region, model: onnx.ModelProto, what: str) -> None:
    """Every tensor the region reads is produced inside it, a constant, or one of its inputs."""
    have = set(region.inputs) | {t.name for t in sub.graph.initializer} | {o for n in sub.graph.node for o in n.output}
    originals = {i.name for i in model.graph.input}
    for n in sub.graph.node:
        missing = [t for t in n.input if t and t not in have]
        if missing:
            src = f" (an input of {what})" if missing[0] in originals else ""
            raise ConfigError(
                f"--extract-inputs: the region reads {missing[0]!r}{src} at node {n.name or n.op_type!r}, "
                "which none of the named inputs computes: add it (or a tensor computed from it) to --extract-inputs"
            )
    if not sub.graph.node:
        raise ConfigError("--extract-inputs/--extract-outputs: the region between them holds no node")
