"""Run the float and the quantized model on the same samples and reduce every paired tensor
to streaming sums, one sample at a time.

Tensors are captured by exposing them as extra graph outputs (ONNX Runtime activation augmentation)
with graph optimizations off, so the QDQ model is evaluated as written (fake-quant on the CPU) and no
requested tensor is fused away. Each sample's tensors are reduced to :class:`~qdebug.metrics.ErrorSums`
and dropped before the next sample: peak memory is one sample's activations of both models, whatever
the number of samples.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from qdebug import reduce_graph
from qdebug.data import DataSource
from qdebug.errors import DataError, ModelError
from qdebug.graph import Pairing
from qdebug.metrics import BatchSums, ErrorSums, reduce_pairs, value_ranges

ProgressFn = Callable[[int, int], None]


def expose_outputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph outputs also include ``names`` (types left to ORT)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    existing = {o.name for o in out.graph.output}
    for name in dict.fromkeys(names):
        if name not in existing:
            # An untyped ValueInfo is enough for ORT; com.microsoft Q/DQ outputs have no inferred type.
            out.graph.output.append(onnx.ValueInfoProto(name=name))
            existing.add(name)
    return out


def make_session(model: onnx.ModelProto, providers: Sequence[str], *, optimize: bool = False) -> object:
    """An ORT session with optimizations off (unless asked) and clear errors."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    so.log_severity_level = 3
    try:
        return ort.InferenceSession(model.SerializeToString(), so, providers=list(providers))
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph/... types
        raise ModelError(f"ONNX Runtime cannot load the model {model.graph.name!r}: {exc}") from exc


@dataclass
class _Acc:
    """Mutable per-tensor sums (internal; results are frozen dataclasses)."""

    n: int

    def __post_init__(self) -> None:
        self.signal = np.zeros(self.n)
        self.noise = np.zeros(self.n)
        self.count = np.zeros(self.n, dtype=np.int64)
        self.max_abs = np.zeros(self.n)
        self.nf_ref = np.zeros(self.n, dtype=np.int64)
        self.nf_test = np.zeros(self.n, dtype=np.int64)
        self.samples = 0

    def add(self, idx: np.ndarray, b: BatchSums) -> None:
        self.signal[idx] += b.signal
        self.noise[idx] += b.noise
        self.count[idx] += b.count
        self.max_abs[idx] = np.maximum(self.max_abs[idx], b.max_abs)
        self.nf_ref[idx] += b.nonfinite_reference
        self.nf_test[idx] += b.nonfinite_test

    def sums(self, j: int) -> ErrorSums:
        return ErrorSums(
            signal=float(self.signal[j]),
            noise=float(self.noise[j]),
            count=int(self.count[j]),
            max_abs=float(self.max_abs[j]),
            nonfinite_reference=int(self.nf_ref[j]),
            nonfinite_test=int(self.nf_test[j]),
            samples=self.samples,
        )


@dataclass(frozen=True)
class CaptureResult:
    """Streaming reductions of every paired tensor over all samples."""

    cumulative: tuple[ErrorSums, ...]  # per activation, float vs quant (post-QDQ)
    local: tuple[ErrorSums | None, ...]  # per activation, pre- vs post-QDQ (None if not quantized)
    outputs: tuple[ErrorSums, ...]
    float_min: tuple[float | None, ...]
    float_max: tuple[float | None, ...]
    elements: tuple[int, ...]
    per_sample: np.ndarray  # samples × activations, cumulative SQNR dB
    per_sample_outputs: np.ndarray  # samples × outputs
    num_samples: int
    path: str = "numpy"  # the capture path that ran: "graph" or "numpy"
    fallback_samples: int = 0  # samples of a "graph" run redone the numpy way (NaN/Inf, shapes, ORT errors)
    fallback_reason: str | None = None  # why a requested "graph" run used the numpy path for every sample


CAPTURE_PATHS = ("graph", "numpy")


class _State:
    """Accumulators of one capture run (internal)."""

    def __init__(self, n_acts: int, n_outs: int, n_total: int) -> None:
        self.cum, self.loc, self.out = _Acc(n_acts), _Acc(n_acts), _Acc(n_outs)
        self.fmin = np.full(n_acts, np.inf)
        self.fmax = np.full(n_acts, -np.inf)
        self.elements = np.zeros(n_acts, dtype=np.int64)
        self.per_sample = np.full((n_total, n_acts), np.nan)
        self.per_sample_out = np.full((n_total, n_outs), np.nan)


class _NumpyPath:
    """Today's path: paired tensors exposed as outputs of two sessions, reduced in numpy."""

    def __init__(
        self, float_model: onnx.ModelProto, quant_model: onnx.ModelProto, pairing: Pairing, providers: Sequence[str]
    ) -> None:
        acts, outs = pairing.activations, pairing.outputs
        self.acts, self.outs = acts, outs
        self.f_names = list(dict.fromkeys([a.tensor_name for a in acts] + [o.output_name for o in outs]))
        self.q_names = list(
            dict.fromkeys(
                [a.pre_qdq for a in acts if a.quantized] + [a.post_qdq for a in acts] + [o.quant_name for o in outs]
            )
        )
        self.f_sess = make_session(expose_outputs(float_model, self.f_names), providers)
        self.q_sess = make_session(expose_outputs(quant_model, self.q_names), providers)
        f_index = {n: i for i, n in enumerate(self.f_names)}
        q_index = {n: i for i, n in enumerate(self.q_names)}
        # Fixed per-run plan: which fetched array feeds which comparison, and which are seen through an activation.
        self.act_f = [f_index[a.tensor_name] for a in acts]
        self.act_post = [q_index[a.post_qdq] for a in acts]
        self.all_idx = np.arange(len(acts))
        self.quant_idx = np.array([j for j, a in enumerate(acts) if a.quantized], dtype=np.intp)
        self.through = [(j, a.measured_through) for j, a in enumerate(acts) if a.measured_through is not None]
        self.pre_plan = [
            (q_index[a.pre_qdq], [act for act in (a.fused_activation, a.measured_through) if act is not None])
            for a in acts
            if a.quantized
        ]
        self.out_f = [f_index[o.output_name] for o in outs]
        self.out_q = [q_index[o.quant_name] for o in outs]
        self.out_idx = np.arange(len(outs))

    def sample(self, i: int, sample: Mapping[str, np.ndarray], st: _State) -> None:
        acts, outs = self.acts, self.outs
        try:
            f_vals = self.f_sess.run(self.f_names, sample)  # type: ignore[attr-defined]
            q_vals = self.q_sess.run(self.q_names, sample)  # type: ignore[attr-defined]
        except Exception as exc:
            raise DataError(f"sample {i}: ONNX Runtime failed to run the models: {exc}") from exc
        refs = [f_vals[k] for k in self.act_f]
        posts = [q_vals[k] for k in self.act_post]
        for j, (ref, post) in enumerate(zip(refs, posts, strict=True)):
            if ref.shape != post.shape:
                raise ModelError(
                    f"tensor {acts[j].tensor_name!r} has shape {ref.shape} in the float model but {post.shape} "
                    "in the quantized model: the models do not correspond"
                )
        ref_c, post_c = list(refs), list(posts)
        for j, (_, lo, hi) in self.through:
            ref_c[j], post_c[j] = np.clip(refs[j], lo, hi), np.clip(posts[j], lo, hi)
        cum_b = reduce_pairs(ref_c, post_c)
        st.cum.add(self.all_idx, cum_b)
        st.per_sample[i] = cum_b.sqnr_db()
        if len(self.quant_idx):
            pres = []
            for k, clips in self.pre_plan:
                pre = q_vals[k]
                for _, lo, hi in clips:
                    pre = np.clip(pre, lo, hi)
                pres.append(pre)
            st.loc.add(self.quant_idx, reduce_pairs(pres, [post_c[j] for j in self.quant_idx]))
        lo_v, hi_v = value_ranges(refs)
        st.fmin = np.fmin(st.fmin, lo_v)
        st.fmax = np.fmax(st.fmax, hi_v)
        st.elements[:] = [r.size for r in refs]
        o_refs = [f_vals[k] for k in self.out_f]
        o_tests = [q_vals[k] for k in self.out_q]
        for o, r, t in zip(outs, o_refs, o_tests, strict=True):
            if r.shape != t.shape:
                raise ModelError(f"model output {o.output_name!r}: shape {r.shape} vs {t.shape}")
        out_b = reduce_pairs(o_refs, o_tests)
        st.out.add(self.out_idx, out_b)
        st.per_sample_out[i] = out_b.sqnr_db()


class _GraphPath:
    """Both models merged into one session that returns each sample's sums (:mod:`qdebug.reduce_graph`)."""

    def __init__(
        self, float_model: onnx.ModelProto, quant_model: onnx.ModelProto, pairing: Pairing, providers: Sequence[str]
    ) -> None:
        model, self.layout = reduce_graph.build(float_model, quant_model, pairing)
        try:
            self.sess = make_session(model, providers)
        except ModelError as exc:  # an op or dtype the reduction nodes do not accept
            raise reduce_graph.UnsupportedGraphError(f"ONNX Runtime rejects the merged reduction graph: {exc}") from exc
        lay = self.layout
        self.quant_idx = np.array([j for j, a in enumerate(pairing.activations) if a.quantized], dtype=np.intp)
        self.all_idx = np.arange(lay.n_acts)
        self.out_idx = np.arange(lay.n_outs)
        self.names = list(reduce_graph.OUTPUTS)

    def sample(self, sample: Mapping[str, np.ndarray], i: int, st: _State) -> bool:
        """Reduce one sample in-graph; False if it must be redone the numpy way (nothing was accumulated)."""
        try:
            s64, s32, sizes, sh_a, sh_b, chk, sm_a, sm_b, sm_p = self.sess.run(self.names, sample)  # type: ignore[attr-defined]
        except Exception:
            return False  # the numpy path reruns it and raises the precise error, if any
        lay = self.layout
        if (
            s64.shape != (lay.lengths["sums64"],)
            or s32.shape != (lay.lengths["stats32"],)
            or sizes.shape != (lay.lengths["sizes"],)
            or sh_a.shape != sh_b.shape
            or not np.array_equal(sh_a, sh_b)
            or not (np.isfinite(s64).all() and np.isfinite(s32).all() and np.isfinite(chk).all())
            or not (np.isfinite(sm_a).all() and np.isfinite(sm_b).all() and np.isfinite(sm_p).all())
        ):
            return False
        n, nq, no = lay.n_acts, lay.n_quant, lay.n_outs
        values = np.concatenate([s64, s32.astype(np.float64)])
        arrays = {
            kind: np.zeros(size)
            for kind, size in (
                ("cum_sig", n), ("cum_noise", n), ("cum_max", n), ("f_min", n), ("f_max", n),
                ("loc_sig", nq), ("loc_noise", nq), ("loc_max", nq),
                ("out_sig", no), ("out_noise", no), ("out_max", no),
            )
        }  # fmt: skip
        counts = np.zeros(n, dtype=np.int64)
        out_counts = np.zeros(no, dtype=np.int64)
        for kind, (items, where) in lay.pos.items():
            if kind == "act_count":
                counts[items] = sizes[where]
            elif kind == "out_count":
                out_counts[items] = sizes[where]
            else:
                arrays[kind][items] = values[where]
        sm = lay.small
        if len(sm.acts):  # the numpy path's own small-tensor arithmetic (float64 reduceat), on one fetched vector
            x, y = sm_a.astype(np.float64), sm_b.astype(np.float64)
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
                pre = sm_p.astype(np.float64)
                for lo, hi in sm.pre_clips:
                    pre = np.clip(pre, lo, hi)
                dl = pre - y[: sm.quant_elements]
                offs = sm.offsets[: len(sm.quant)]
                arrays["loc_sig"][sm.quant] = np.add.reduceat(pre * pre, offs)
                arrays["loc_noise"][sm.quant] = np.add.reduceat(dl * dl, offs)
                arrays["loc_max"][sm.quant] = np.maximum.reduceat(np.abs(dl), offs)
        zeros_a, zeros_q, zeros_o = (np.zeros(k, dtype=np.int64) for k in (n, nq, no))
        a = arrays
        cum_b = BatchSums(a["cum_sig"], a["cum_noise"], counts, a["cum_max"], zeros_a, zeros_a)
        loc_b = BatchSums(a["loc_sig"], a["loc_noise"], counts[self.quant_idx], a["loc_max"], zeros_q, zeros_q)
        out_b = BatchSums(a["out_sig"], a["out_noise"], out_counts, a["out_max"], zeros_o, zeros_o)
        st.cum.add(self.all_idx, cum_b)
        st.per_sample[i] = cum_b.sqnr_db()
        if nq:
            st.loc.add(self.quant_idx, loc_b)
        st.fmin = np.fmin(st.fmin, a["f_min"])
        st.fmax = np.fmax(st.fmax, a["f_max"])
        st.elements[:] = counts
        st.out.add(self.out_idx, out_b)
        st.per_sample_out[i] = out_b.sqnr_db()
        return True


def capture(
    float_model: onnx.ModelProto,
    quant_model: onnx.ModelProto,
    pairing: Pairing,
    data: DataSource,
    providers: Sequence[str] = ("CPUExecutionProvider",),
    progress: ProgressFn | None = None,
    path: str = "graph",
) -> CaptureResult:
    """Run both models sample by sample and reduce every paired tensor to sums.

    ``path="graph"`` (the default) reduces in ONNX Runtime (:mod:`qdebug.reduce_graph`) and falls back to the
    numpy path for the whole run when the merged graph cannot be built or loaded, and for any sample whose
    in-graph sums hold NaN/Inf or whose shapes differ (so non-finite counts, statuses and errors stay exact).
    ``path="numpy"`` fetches every paired tensor and reduces it in numpy.
    """
    if path not in CAPTURE_PATHS:
        raise ValueError(f"capture path must be one of {CAPTURE_PATHS}, got {path!r}")
    acts, outs = pairing.activations, pairing.outputs
    n_total = len(data)
    st = _State(len(acts), len(outs), n_total)
    graph: _GraphPath | None = None
    reason: str | None = None
    if path == "graph":
        try:
            graph = _GraphPath(float_model, quant_model, pairing, providers)
        except reduce_graph.UnsupportedGraphError as exc:
            reason = str(exc)
    numpy_path: _NumpyPath | None = None
    fallbacks = 0

    i = -1
    for i, sample in enumerate(data):
        if i >= n_total:  # a source that yields more than it announced
            break
        if graph is None or not graph.sample(sample, i, st):
            if numpy_path is None:
                numpy_path = _NumpyPath(float_model, quant_model, pairing, providers)
            numpy_path.sample(i, sample, st)
            fallbacks += graph is not None
        if progress is not None:
            progress(i + 1, n_total)
    n_done = i + 1
    if n_done == 0:
        raise DataError(f"{data.description}: no samples")
    for acc in (st.cum, st.loc, st.out):
        acc.samples = n_done
    return CaptureResult(
        cumulative=tuple(st.cum.sums(j) for j in range(len(acts))),
        local=tuple(st.loc.sums(j) if a.quantized else None for j, a in enumerate(acts)),
        outputs=tuple(st.out.sums(j) for j in range(len(outs))),
        float_min=tuple(float(v) if np.isfinite(v) else None for v in st.fmin),
        float_max=tuple(float(v) if np.isfinite(v) else None for v in st.fmax),
        elements=tuple(int(e) for e in st.elements),
        per_sample=st.per_sample[:n_done],
        per_sample_outputs=st.per_sample_out[:n_done],
        num_samples=n_done,
        path="graph" if graph is not None else "numpy",
        fallback_samples=fallbacks,
        fallback_reason=reason,
    )
