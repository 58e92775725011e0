"""Locate the first divergent tensor on the HTP without a probe: bisection over prefix subgraphs.

The probe (every quantized tensor exposed as a graph output) changes the HTP graph; on the corpus detector at
uint16 it named a tensor one step late and reported a spurious start (docs/qnn.md). Here each measurement compiles
the QDQ model *cut* at one tensor (the nodes it depends on, that tensor its only output), so the tensor is computed
by a graph that, up to it, is the real one. A tensor is divergent by the rule of :mod:`qdebug.targets.divergence`
(excess error vs float above the threshold). Divergence is assumed to persist once it starts (the errors propagate;
an isolated start is exactly what this does not see), so the last candidate is checked first and a binary search
finds the first divergent one: at most ``⌈log2 N⌉ + 1`` compiles for N candidates.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from qdebug.data import DataSource
from qdebug.errors import DataError, TargetError
from qdebug.io import temp_dir
from qdebug.metrics import reduce_pairs
from qdebug.model_io import load_model
from qdebug.ort import expose_outputs, make_session
from qdebug.pairing import pair_models
from qdebug.report import decode_number, encode_number
from qdebug.targets.divergence import EXCESS_NOISE_THRESHOLD, excess_ratio
from qdebug.targets.qnn_compile import compile_qnn
from qdebug.targets.qnn_options import CPU_EP, QnnOptions
from qdebug.targets.qnn_session import qnn_session

__all__ = ["PrefixBisection", "PrefixCheck", "bisect_divergence", "candidate_tensors", "prefix_model"]


@dataclass(frozen=True)
class PrefixCheck:
    """One prefix compile: the tensor it was cut at and that tensor's excess-noise ratio on the HTP."""

    tensor_name: str
    excess_noise_ratio: float
    compile_seconds: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (an infinite ratio as the string ``"inf"``)."""
        return {
            "tensor_name": self.tensor_name,
            "excess_noise_ratio": encode_number(self.excess_noise_ratio),
            "compile_seconds": round(self.compile_seconds, 4),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PrefixCheck:
        """Inverse of :meth:`to_dict`."""
        ratio = decode_number(d["excess_noise_ratio"])
        return cls(d["tensor_name"], float("nan") if ratio is None else ratio, float(d["compile_seconds"]))


@dataclass(frozen=True)
class PrefixBisection:
    """The first divergent tensor found by bisection (``None``: the last candidate is not divergent)."""

    first_divergent: str | None
    candidates: int
    checks: tuple[PrefixCheck, ...]  # in the order compiled
    seconds: float

    @property
    def compiles(self) -> int:
        """How many prefix models were compiled."""
        return len(self.checks)

    @property
    def max_compiles(self) -> int:
        """The bound on compiles for this many candidates: ``⌈log2 N⌉ + 1`` (the last one, then the search)."""
        return math.ceil(math.log2(self.candidates)) + 1 if self.candidates > 1 else self.candidates

    def ratio_of(self, tensor: str) -> float | None:
        """The excess-noise ratio measured for ``tensor`` (``None``: not compiled)."""
        return next((c.excess_noise_ratio for c in self.checks if c.tensor_name == tensor), None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "first_divergent": self.first_divergent,
            "candidates": self.candidates,
            "compiles": self.compiles,
            "max_compiles": self.max_compiles,
            "checks": [c.to_dict() for c in self.checks],
            "seconds": round(self.seconds, 4),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PrefixBisection:
        """Inverse of :meth:`to_dict` (``compiles`` and ``max_compiles`` are derived)."""
        return cls(
            d.get("first_divergent"),
            int(d["candidates"]),
            tuple(PrefixCheck.from_dict(c) for c in d.get("checks", ())),
            float(d["seconds"]),
        )


def prefix_model(model: onnx.ModelProto, output: str) -> onnx.ModelProto:
    """The nodes ``output`` depends on (graph order), the model's inputs and the initializers they use, with
    ``output`` as the only graph output (untyped: ORT infers it, as for the probe)."""
    producer = {o: k for k, n in enumerate(model.graph.node) for o in n.output}
    keep: set[int] = set()
    stack, seen = [output], {output}
    while stack:
        k = producer.get(stack.pop())
        if k is None or k in keep:
            continue
        keep.add(k)
        for i in model.graph.node[k].input:
            if i and i not in seen:
                seen.add(i)
                stack.append(i)
    nodes = [model.graph.node[k] for k in sorted(keep)]
    used = {i for n in nodes for i in n.input}
    graph = onnx.helper.make_graph(
        nodes,
        f"{model.graph.name}_prefix",
        list(model.graph.input),
        [onnx.ValueInfoProto(name=output)],
        [t for t in model.graph.initializer if t.name in used],
    )
    out = onnx.helper.make_model(graph, opset_imports=list(model.opset_import))
    out.ir_version = model.ir_version
    return out


def _ratio(
    qmodel: onnx.ModelProto,
    f_sess: Any,
    tensor: tuple[str, str, float],
    data: DataSource,
    options: QnnOptions,
    work: Path,
) -> PrefixCheck:
    """Compile the prefix cut at ``tensor`` (float name, QDQ name, mean scale²) and measure its ratio."""
    name, qname, scale2 = tensor
    path = work / "prefix.qdq.onnx"
    sub = prefix_model(qmodel, qname)
    onnx.save(sub, str(path))
    rep = compile_qnn(path, work, options, name="prefix")
    if not rep.ok or rep.compiled_model is None:
        raise TargetError(f"compiling the prefix cut at {name!r} failed: {rep.error}")
    c_sess: Any = make_session(sub, [CPU_EP])
    h_sess = qnn_session(rep.compiled_model, options)
    cf = hf = 0.0
    n = 0
    for sample in data:
        f = np.asarray(f_sess.run([name], sample)[0], dtype=np.float64)
        c = np.asarray(c_sess.run([qname], sample)[0], dtype=np.float64)
        h = np.asarray(h_sess.run([qname], sample)[0], dtype=np.float64)
        b = reduce_pairs([f, f], [c, h])
        cf, hf, n = cf + float(b.noise[0]), hf + float(b.noise[1]), n + c.size
    ratio = excess_ratio(hf, cf, n * scale2 / 12.0)
    return PrefixCheck(name, ratio, rep.compile_seconds)


def _candidates(fmodel: onnx.ModelProto, qmodel: onnx.ModelProto) -> dict[str, tuple[str, str, float]]:
    """Float name → (float name, QDQ name, mean scale²) of every quantized activation that is not a model output,
    in topological order."""
    pairing = pair_models(fmodel, qmodel)
    outputs = {o.name for o in qmodel.graph.output}
    return {
        a.tensor_name: (a.tensor_name, a.post_qdq, float(np.mean(np.square(a.params.scale))))
        for a in pairing.activations
        if a.quantized and a.params is not None and a.params.scale is not None and a.post_qdq not in outputs
    }


def candidate_tensors(float_model: onnx.ModelProto, qdq_model: onnx.ModelProto) -> list[str]:
    """The tensors :func:`bisect_divergence` searches by default (float names, topological order)."""
    return list(_candidates(float_model, qdq_model))


def bisect_divergence(
    float_model: str | Path,
    qdq_model: str | Path,
    data: DataSource,
    *,
    options: QnnOptions | None = None,
    candidates: Sequence[str] | None = None,
    threshold: float = EXCESS_NOISE_THRESHOLD,
) -> PrefixBisection:
    """The first of ``candidates`` (float tensor names, topological order; default every quantized activation
    that is not a model output) whose value, in the model cut there and compiled for the HTP, adds more than
    ``threshold`` times its own quantization error vs float (:mod:`qdebug.targets.divergence`)."""
    if len(data) == 0:
        raise DataError(f"{data.description}: no samples")
    options = options or QnnOptions()
    fmodel, qmodel = load_model(float_model, "float model"), load_model(qdq_model, "QDQ model")
    known = _candidates(fmodel, qmodel)
    names = [n for n in (candidates if candidates is not None else list(known)) if n in known]
    f_sess = make_session(expose_outputs(fmodel, names), [CPU_EP])
    t0, checks = time.perf_counter(), []
    with temp_dir(prefix="qdebug-prefix-") as tmp:

        def flagged(i: int) -> bool:
            with temp_dir(dir=tmp) as work:  # ORT refuses to overwrite a context file
                checks.append(_ratio(qmodel, f_sess, known[names[i]], data, options, Path(work)))
            return checks[-1].excess_noise_ratio > threshold

        first = None
        if names and flagged(len(names) - 1):
            lo, hi = -1, len(names) - 1  # names[lo] clean (or before the first), names[hi] divergent
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if flagged(mid) else (mid, hi)
            first = names[hi]
    return PrefixBisection(first, len(names), tuple(checks), time.perf_counter() - t0)
