"""The ``graph`` capture backend: both models merged into one ONNX Runtime graph whose extra nodes reduce every
pair to sums in-graph (:mod:`qdebug.capture.kernels.ingraph`), so no activation leaves ONNX Runtime.

A sample whose in-graph sums are not exact — NaN/Inf anywhere (the statuses and non-finite counts need the
tensors), shapes that differ at run time, or an ONNX Runtime error — is a :class:`~qdebug.capture.base.Fallback`
with that reason: the numpy backend redoes it and the report counts it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt
import onnx

from qdebug.capture.base import Fallback, ModelPair, OpenOptions, RunInfo, SampleSums, UnsupportedPairError
from qdebug.capture.kernels import ingraph
from qdebug.capture.tuning import CaptureTuning
from qdebug.errors import ModelError
from qdebug.metrics import BatchSums
from qdebug.ort import make_session, ort_errors
from qdebug.pairing import Pairing

__all__ = ["GraphBackend", "GraphRun", "merged_model"]

_SUMS = ("cum_sig", "cum_noise", "cum_max", "f_min", "f_max", "loc_sig", "loc_noise", "loc_max", "out_sig",
         "out_noise", "out_max")  # fmt: skip


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
        problem = self._problem(out)
        return Fallback(problem) if problem else self._sums(out)

    def _problem(self, out: dict[str, np.ndarray]) -> str | None:
        lay = self.layout
        for name in ("sums64", "stats32", "sizes"):
            if out[name].shape != (lay.lengths[name],):
                return "shapes differ at run time"
        if out["shapes_a"].shape != out["shapes_b"].shape or not np.array_equal(out["shapes_a"], out["shapes_b"]):
            return "shapes differ at run time"
        if not all(
            np.isfinite(out[k]).all() for k in ("sums64", "stats32", "check32", "small_a", "small_b", "small_p")
        ):
            return "NaN/Inf in the sample's tensors"
        return None

    def _sums(self, out: dict[str, np.ndarray]) -> SampleSums:
        lay = self.layout
        n, nq, no = lay.n_acts, lay.n_quant, lay.n_outs
        sizes = {"cum": n, "f": n, "loc": nq, "out": no}
        arrays = {kind: np.zeros(sizes[kind.split("_")[0]]) for kind in _SUMS}
        counts, out_counts = np.zeros(n, dtype=np.int64), np.zeros(no, dtype=np.int64)
        values = np.concatenate([out["sums64"], out["stats32"].astype(np.float64)])
        for kind, (items, where) in lay.pos.items():
            if kind == "act_count":
                counts[items] = out["sizes"][where]
            elif kind == "out_count":
                out_counts[items] = out["sizes"][where]
            else:
                arrays[kind][items] = values[where]
        if len(lay.small.acts):
            self._small(out, arrays, counts)
        a = arrays

        def batch(kind: str, count: npt.NDArray[np.int64]) -> BatchSums:
            zeros = np.zeros(len(count), dtype=np.int64)
            return BatchSums(a[f"{kind}_sig"], a[f"{kind}_noise"], count, a[f"{kind}_max"], zeros, zeros)

        return SampleSums(
            cumulative=batch("cum", counts),
            local=batch("loc", counts[self.quant_idx]),
            outputs=batch("out", out_counts),
            float_min=a["f_min"],
            float_max=a["f_max"],
            elements=counts,
        )

    def _small(self, out: dict[str, np.ndarray], arrays: dict[str, np.ndarray], counts: np.ndarray) -> None:
        """The numpy backend's own small-tensor arithmetic (float64 ``reduceat``) on the fetched vectors."""
        sm = self.layout.small
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


class GraphBackend:
    """Reduce in ONNX Runtime, in one merged graph (docs/metrics.md, "capture backends")."""

    name = "graph"

    def open(self, pair: ModelPair, options: OpenOptions) -> GraphRun:
        """The merged session (of the options, only the tuning applies to it); :class:`UnsupportedPairError` for a
        pair the merge cannot express."""
        model, layout = merged_model(pair.float_model, pair.quant_model, pair.pairing, options.tuning)
        return GraphRun(model, layout, pair.pairing, pair.providers)
