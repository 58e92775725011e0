"""The ``graph`` capture backend: both models merged into one ONNX Runtime graph whose extra nodes reduce every
pair to sums in-graph (:mod:`qdebug.capture.kernels.ingraph`), so no activation leaves ONNX Runtime.

A sample whose in-graph sums are not exact — NaN/Inf anywhere (the statuses and non-finite counts need the
tensors), shapes that differ at run time, or an ONNX Runtime error — is a :class:`~qdebug.capture.base.Fallback`
with that reason: the fetch backend redoes it and the report counts it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from qdebug.capture.base import Fallback, ModelPair, OpenOptions, RunInfo, SampleSums, UnsupportedPairError
from qdebug.capture.kernels import ingraph
from qdebug.capture.tuning import CaptureTuning
from qdebug.errors import ModelError
from qdebug.ort import make_session, ort_errors
from qdebug.pairing import Pairing

__all__ = ["GraphBackend", "GraphRun", "merged_model"]


def merged_model(
    float_model: onnx.ModelProto, quant_model: onnx.ModelProto, pairing: Pairing, tuning: CaptureTuning | None = None
) -> tuple[onnx.ModelProto, ingraph.Layout]:
    """The merged reduction model (cheap: no session yet); :class:`UnsupportedPairError` if it cannot be built."""
    tuning = tuning or CaptureTuning()
    try:
        return ingraph.build(
            float_model,
            quant_model,
            pairing,
            concat_fan_in=tuning.concat_fan_in,
            max_merged_bytes=tuning.max_merged_bytes,
        )
    except ingraph.UnsupportedGraphError as exc:
        raise UnsupportedPairError(str(exc)) from exc


class GraphRun:
    """One session of the merged reduction graph (built by :func:`merged_model`)."""

    def __init__(
        self, model: onnx.ModelProto, layout: ingraph.Layout, pairing: Pairing, providers: Sequence[str]
    ) -> None:
        self.layout = layout
        try:
            self.sess = make_session(model, providers)
        except ModelError as exc:  # an op or dtype the reduction nodes do not accept
            raise UnsupportedPairError(f"ONNX Runtime rejects the merged reduction graph: {exc}") from exc
        self.names = list(ingraph.OUTPUTS)
        self.errors = ort_errors()
        self.quant_idx = np.array([j for j, a in enumerate(pairing.activations) if a.quantized], dtype=np.intp)

    #: one sample at a time, nothing inferred ahead
    lookahead = 0
    #: its fallback samples are redone by a fetch run the loop opens
    fallback = None

    def prefetch(self, index: int, sample: Mapping[str, np.ndarray]) -> None:
        """Nothing: the merged graph runs each sample when it is reduced."""

    def close(self) -> None:
        """Nothing to stop: no thread of its own."""

    def info(self) -> RunInfo:
        """The merged graph: one sample per call, never segmented."""
        return RunInfo("graph")

    def reduce(self, index: int, sample: Mapping[str, np.ndarray]) -> SampleSums | Fallback:
        """Reduce one sample in-graph, or say why the fetch backend must."""
        try:
            out = dict(zip(self.names, self.sess.run(self.names, sample), strict=True))  # type: ignore[attr-defined]
        except self.errors as exc:  # the fetch backend reruns it and raises the precise error, if any
            return Fallback(f"ONNX Runtime failed on the merged graph: {type(exc).__name__}")
        problem = ingraph.problem(self.layout, out)
        return Fallback(problem) if problem else ingraph.read_sums(self.layout, self.quant_idx, out)


class GraphBackend:
    """Reduce in ONNX Runtime, in one merged graph (docs/metrics.md, "capture backends")."""

    name = "graph"

    def open(self, pair: ModelPair, options: OpenOptions) -> GraphRun:
        """The merged session (of the options, only the tuning applies to it); :class:`UnsupportedPairError` for a
        pair the merge cannot express."""
        model, layout = merged_model(pair.float_model, pair.quant_model, pair.pairing, options.tuning)
        return GraphRun(model, layout, pair.pairing, pair.providers)
