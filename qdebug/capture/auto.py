"""The ``auto`` capture choice: the backend is picked from costs measured on the run's own first samples.

Neither backend wins everywhere (docs/benchmarks.md). The merged graph (``graph``) saves the per-tensor fetch and
numpy arithmetic, which dominates on small models with many small tensors, but ONNX Runtime's session set-up grows
with the *square* of the node count, and on models with large activations its in-graph float64 reductions cost
more per sample than a fetch-and-reduce. Every threshold below is a field of
:class:`~qdebug.capture.tuning.CaptureTuning`. So:

0. a model whose inputs all have a batch axis is **batched** when sample 0 shows that at least ``auto_min_batch``
   samples fit in a batch (up to ``auto_batch``; ``batch`` overrides) and the samples after it fill at least one
   such batch: ``fetch`` keeps the run (a batch pays the per-call costs the merged graph avoids once per batch),
   and the compiled reduction is still weighed as in 2; a **segmented** run (one sample too large to expose at
   once) reduces with the compiled pass from the start, the kernel loading beside the first sample, exposes the
   quantized integers instead of post-Q/DQ floats where it can (:mod:`qdebug.capture.dequant`), and, pipelined
   with enough samples left, times its segments' inference with ONNX Runtime's default threads and with one fewer
   and keeps the faster (:mod:`qdebug.capture.threads`). Otherwise:
1. samples 0 to ``compiled_probe`` run on ``fetch`` (always opened: it is also every backend's fallback), each
   timed, with its reduction and inference apart; the fastest after sample 0 is its per-sample cost (sample 0's
   first-run allocations make it a poor measure alone). With fewer than ``min_remaining`` samples after sample 0,
   ``fetch`` keeps the run at once; so it does when the C kernel reduces from the first sample (nothing to weigh
   in 2) and sample 0 already rules the merged graph out as 3 would — tensors too large, or a set-up that even
   sample 0's time, an over-estimate, would not repay — and the run pipelines from sample 1;
2. if what the compiled reduction would save over the remaining samples exceeds its start-up
   (``compiled_startup_s``; :func:`_saving_per_sample`), the kernel loads on a background thread while numpy goes
   on reducing, and the fetch run switches to that one-pass reduction (``compiled``) at the first sample after —
   no new session, nothing else to measure. Without it (or if it fails to load) the reason says what it would have
   saved; a run kept on ``fetch`` early is weighed the same way once it has the samples;
3. else, if the paired tensors average more than ``graph_max_mean_elements`` elements, ``fetch`` keeps the run
   (the merged graph is slower per sample there); so it does if even the smallest merged graph — both models'
   nodes plus ``merged_nodes_per_pair`` per pair — could not repay its estimated set-up; otherwise the merged
   model is *built* (no session: a protobuf) and its set-up is **estimated** from the fetch sessions' measured
   set-up scaled by the node counts (:func:`estimate_setup`); if that estimate exceeds ``payback_share`` of the
   fetch run's remaining time, ``fetch`` keeps the run;
4. otherwise the merged session is created and the next sample runs on it, timed: the faster per sample keeps the
   run (the probe is a first run of its session, so it includes ONNX Runtime's first-run allocations).

Every sample is reduced exactly once, by one backend or the other; sums merge exactly, so the result is the
same whichever backend reduced which sample. :meth:`AutoRun.info` records the backend and the reason, with
the numbers, and goes into the report's ``meta.capture``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from qdebug.capture import compiled
from qdebug.capture.base import (
    FALLBACK_BACKEND,
    CaptureRun,
    Fallback,
    ModelPair,
    OpenOptions,
    RunInfo,
    SampleSums,
    UnsupportedPairError,
)
from qdebug.capture.batching import stackable
from qdebug.capture.compose import FetchingRun, fetch_layout, open_fetch_run
from qdebug.capture.fetch import usable_cores
from qdebug.capture.merged import GraphRun, merged_model
from qdebug.capture.threads import ThreadTrial
from qdebug.capture.tuning import CaptureTuning, SegmentRule
from qdebug.pairing import Pairing

__all__ = ["AUTO", "AutoBackend", "AutoRun", "Choice", "estimate_setup"]

#: The ``capture`` value that chooses the backend per run (the default of ``DebugOptions`` and ``--capture``).
AUTO = "auto"


@dataclass(frozen=True)
class Choice:
    """The backend ``auto`` settled on and why (with the measured and estimated numbers)."""

    backend: str
    reason: str


def estimate_setup(measured_s: float, measured_nodes: Sequence[int], nodes: int, knee: int = 700) -> float:
    """Session set-up time of a graph of ``nodes`` nodes, from sessions of ``measured_nodes`` nodes that took
    ``measured_s`` together to create, with set-up ∝ n·(1 + n / ``knee``) (linear for small graphs, quadratic for
    large ones; :attr:`~qdebug.capture.tuning.CaptureTuning.setup_knee_nodes`). The measured time also holds the
    models' copying and weights, so this errs high — towards ``fetch``, the backend that needs no second session."""
    cost = [n * (1 + n / knee) for n in measured_nodes]
    return measured_s * nodes * (1 + nodes / knee) / sum(cost) if sum(cost) else float("inf")


def _saving_per_sample(reduce_s: float, infer_s: float, pipelined: bool, saving: float) -> float:
    """Seconds per sample the compiled reduction saves, from numpy's measured reduction and inference times.

    Not pipelined, a sample costs inference + reduction, and the compiled pass removes
    ``saving`` of the reduction (:attr:`~qdebug.capture.tuning.CaptureTuning.compiled_saving`). Pipelined, it costs
    about the longer of the two (the next sample's inference runs beside this one's reduction), so only the part
    of the reduction above the inference is saved outright — but the CPU it frees also goes to the inference's
    threads, so the estimate is the mean of the two.
    """
    alone = saving * reduce_s
    if not pipelined:
        return alone
    # neither bound holds on measured runs; the mean errs towards switching, whose cost is bounded by the start-up
    beside = max(0.0, max(infer_s, reduce_s) - max(infer_s, (1 - saving) * reduce_s))
    return (alone + beside) / 2


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


class AutoRun:
    """A run that measures both backends on its first samples and keeps the faster (see the module doc)."""

    def __init__(
        self,
        float_model: onnx.ModelProto,
        quant_model: onnx.ModelProto,
        pairing: Pairing,
        providers: Sequence[str],
        samples: int,
        clock: Callable[[], float] = time.perf_counter,
        input_shapes: Mapping[str, tuple[int, ...]] | None = None,
        segment_rule: SegmentRule | None = None,
        batch: int | None = None,
        tuning: CaptureTuning | None = None,
    ) -> None:
        self.models, self.pairing, self.providers = (float_model, quant_model), pairing, tuple(providers)
        self.tuning = tune = tuning or CaptureTuning()
        self.samples, self.clock = samples, clock
        self.warm_up: compiled.WarmUp | None = None  # numba loading while numpy keeps reducing (_try_compiled)
        self.switched_at: int | None = None  # the first sample the compiled reduction reduced
        self.trial: ThreadTrial | None = None  # a segmented run's intra-op threads, measured (_start_trial)
        t0 = clock()
        limit = (tune.auto_batch if samples > 2 else 1) if batch is None else batch
        pair = ModelPair(float_model, quant_model, pairing, providers)
        options = OpenOptions(samples, input_shapes, segment_rule, batch, tune)
        # a segmented run reduces with the compiled pass (_compiled_from_start)
        layout = fetch_layout(pair, options, dequant=compiled.available())
        self.segmented = layout.cut is not None  # one sample runs in segments (decided here, kept)
        self.fetch: FetchingRun = open_fetch_run(
            pair,
            options,
            layout,
            batch=limit,
            dequant_whole=compiled.ready(),  # so does every run once the C kernel is built (_kernel_from_start)
            min_batch=tune.auto_min_batch if batch is None else 2,  # fewer per call: auto runs one sample per call
        )
        self.fetch_setup = clock() - t0
        self.graph: GraphRun | None = None
        self.totals: list[float] = []  # per fetch sample until decided: the whole call, the reduction, the inference
        self.reduce_times: list[float] = []
        self.infer_times: list[float] = []
        self.compiled_weighed = False  # whether the compiled reduction has been weighed (once per run)
        self.missing_fast = ""  # what the compiled reduction would save, when numba is not installed
        self.choice: Choice | None = None
        self.held: list[tuple[int, Mapping[str, np.ndarray]]] = []  # announced while undecided (:meth:`prefetch`)
        self.batch_asked = batch is not None and batch > 1
        # decided after sample 0, once one sample's size is known
        self.batch_planned = self._batches(limit, stackable(float_model))
        self.kernel_ready = self._kernel_from_start()
        if self.segmented and samples > 1 and compiled.available():
            self._compiled_from_start()
        if self.choice is None and samples - 1 < tune.min_remaining:
            # decided before sample 0, so that sample 1 is announced to the fetch run at once and inferred on the
            # worker while sample 0 is reduced
            self._keep_fetch(f"{samples} sample(s): too few to pay for a second session")

    def _kernel_from_start(self) -> bool:
        """Reduce with the compiled pass from sample 0 when it costs nothing to load (the C kernel is built,
        :func:`~qdebug.capture.compiled.ready`): it is faster than numpy's on every tensor size measured, so there
        is nothing to weigh; the merged graph is still weighed against it as it would be against numpy."""
        if not compiled.ready():
            return False
        try:
            kernel = compiled.kernel()
        except Exception:  # a library that does not load after all (its error types vary): weighed as before
            return False
        self.fetch.use_reducer(compiled.reduce_sample_compiled, kernel)
        self.switched_at, self.compiled_weighed = 0, True
        return True

    def _compiled_from_start(self) -> None:
        """A segmented run reduces with the compiled pass from the first sample after its kernel has loaded (at once
        when the C kernel is built): the one-pass kernel reduces such large samples faster than numpy whatever the
        number of samples, and its loading overlaps the first sample's segment sessions being made. The same
        reduction at every N, so the process's memory does not step up with numba at some N and not others."""
        assert self.segmented
        if not self.kernel_ready:
            self.warm_up = compiled.start_warm_up()
        self.compiled_weighed = True
        self.choice = Choice(
            "compiled",
            f"one sample runs in {self.fetch.segment_count} segments: the one-pass kernel reduces such large "
            "tensors faster than numpy at any number of samples",
        )

    def _batches(self, limit: int, stackable: bool) -> bool:
        """Whether the fetch run will batch: asked for (up to ``limit`` per call), one sample is not cut into
        segments, and every input has an axis to stack samples on (``stackable``; the first batch still checks that
        ONNX Runtime runs it and that the values hold)."""
        return limit > 1 and not self.segmented and stackable

    def final(self) -> Choice:
        """The choice, also when the data ran out before it was made (or before numba had loaded)."""
        note = self.trial.note if self.trial is not None else self.fetch.thread_note
        threads = f"; {note}" if note else ""
        if self.kernel_ready and (self.choice is None or self.choice.backend != "graph"):
            reason = self.choice.reason if self.choice else "the data ran out before the merged graph could be weighed"
            impl = compiled.implementation()
            return Choice("compiled", f"{reason}; the compiled {impl} kernel reduced from the first sample{threads}")
        if self.choice is not None and self.choice.backend == "compiled":
            if self.switched_at is None:
                return Choice(
                    FALLBACK_BACKEND, f"{self.choice.reason}; the data ran out before the compiled kernel had loaded"
                )
            return Choice(
                "compiled",
                f"{self.choice.reason}; from sample {self.switched_at}, once the {compiled.implementation()} kernel "
                f"had loaded{threads}",
            )
        return self.choice or Choice(FALLBACK_BACKEND, "the data ran out before the backends could be compared")

    @property
    def current(self) -> CaptureRun:
        """The run that reduces the next sample once the choice is made."""
        return self.graph if self.choice is not None and self.choice.backend == "graph" and self.graph else self.fetch

    @property
    def lookahead(self) -> int:
        """Samples to announce ahead: the fetch run's once it is the choice, else one."""
        return self.fetch.lookahead if self.choice is not None and self.current is self.fetch else 1

    def prefetch(self, index: int, sample: Mapping[str, np.ndarray]) -> None:
        """Announce the next sample to the fetch run once it is the choice (never while the backends are timed:
        held until then, see :meth:`_release`)."""
        if self.choice is None:
            self.held.append((index, sample))  # the loop holds these samples anyway: no extra memory
        elif self.current is self.fetch:
            self.fetch.prefetch(index, sample)

    def _release(self, index: int) -> None:
        """Once the choice is made, announce to the fetch run the samples read ahead while it was not: the loop
        announces each sample once, so without this the samples already read would run one at a time on this
        thread instead of beside the previous sample's reduction."""
        held, self.held = self.held, []
        if self.choice is not None and self.current is self.fetch:
            for i, sample in held:
                if i > index:
                    self.fetch.prefetch(i, sample)

    def close(self) -> None:
        """Stop the fetch run's worker thread (and wait for numba's warm-up, which cannot be interrupted)."""
        self.fetch.close()
        if self.warm_up is not None:
            self.warm_up.join()

    @property
    def fallback(self) -> CaptureRun:
        """The fetch run, always open: it also redoes the merged graph's fallback samples."""
        return self.fetch

    def info(self) -> RunInfo:
        """The backend :meth:`final` names and, when the fetch run kept the samples, its batching and segments
        (a batch reason only when batching was asked for or planned: otherwise there is nothing to explain)."""
        choice = self.final()
        if choice.backend == "graph":
            return RunInfo(choice.backend, choice.reason)
        size, why = self.fetch.batching()
        if not self.batch_asked and not self.batch_planned:
            why = None
        return RunInfo(choice.backend, choice.reason, size, why, self.fetch.segment_count, self.fetch.segment_note)

    def reduce(self, index: int, sample: Mapping[str, np.ndarray]) -> SampleSums | Fallback:
        """Samples 0-``compiled_probe`` on the fetch run (timed), then the compiled reduction or the merged graph if
        either pays (the graph only after winning a timed probe sample), else the fetch run (see the module doc)."""
        if self.choice is not None:
            if self.warm_up is not None and not self.warm_up.is_alive():
                self._switch(index)
            if self.trial is not None or self._start_trial(index):
                return self._timed_for_trial(index, sample)
            res: SampleSums | Fallback
            if index == 0 and self.current is self.fetch:
                res = self._fetch_sample_0(index, sample)[0]
            else:
                res = self.current.reduce(index, sample)
            if self.choice.backend == FALLBACK_BACKEND and self.current is self.fetch and not self.compiled_weighed:
                self._measure_fetch(0.0, index)  # a run decided early (few samples) still weighs compiled
            return res
        if self.graph is not None:
            res = self._probe(index, sample)
            self._release(index)
            return res
        self.held = [(i, s) for i, s in self.held if i > index]  # the samples reduced so far are not announced
        t0 = self.clock()
        sums, batched = self._fetch_sample_0(index, sample) if index == 0 else (self.fetch.reduce(index, sample), False)
        self._measure_fetch(self.clock() - t0, index)
        if batched:
            self._release(index)
            return sums
        mean = float(sums.elements.mean()) if sums.elements.size else 0.0
        if index == 0:
            self._ruled_out_at_sample_0(mean)
        elif len(self.totals) > self.tuning.compiled_probe:
            self._decide(index, mean)
        if self.choice is not None:
            self._release(index)
        return sums

    def _fetch_sample_0(self, index: int, sample: Mapping[str, np.ndarray]) -> tuple[SampleSums, bool]:
        """Sample 0 on the fetch run, and whether the run batches from here: decided once the sample's size is known,
        before its reduction — a run that will not batch then infers its next sample, or makes its next set of bound
        outputs, on the idle core meanwhile (:meth:`FetchRun.reduce`)."""
        batched: list[bool] = []
        res = self.fetch.reduce(index, sample, lambda: batched.append(self._batch_after_sample_0()))
        if not batched:  # a segmented run: its size is not one sample's tensors
            batched.append(self._batch_after_sample_0())
        return res, batched[0]

    def _start_trial(self, index: int) -> bool:
        """From the second sample the compiled pass reduces of a pipelined segmented run: time the segments'
        inference with ORT's default threads and with one fewer (:class:`~qdebug.capture.threads.ThreadTrial`)."""
        fetch = self.fetch.rethreadable()
        if self.switched_at is None or index <= self.switched_at or fetch is None:
            return False
        self.trial = ThreadTrial(fetch, usable_cores(self.tuning), self.samples - index, self.tuning)
        return True

    def _timed_for_trial(self, index: int, sample: Mapping[str, np.ndarray]) -> SampleSums | Fallback:
        """One sample of the segmented run, its wall time given to the thread trial while it is on."""
        assert self.trial is not None
        t0 = self.clock()
        res = self.fetch.reduce(index, sample)
        if self.trial.active and self.fetch.rethreadable() is not None:
            self.trial.record(self.clock() - t0)
        return res

    def _batch_after_sample_0(self) -> bool:
        """Once sample 0 has shown how many samples fit in a batch: batch (``fetch`` keeps the run; the merged graph's
        one advantage, small tensors' per-call costs, is what a batch pays once per batch) if enough do — two when
        the user asked, ``auto_min_batch`` when ``auto`` decides, and then only if a full batch of samples is left:
        fewer run as one partial batch, whose first call at new shapes and check against a sample alone are not
        repaid — else one sample per call from here."""
        fit, left = self.fetch.batch_size, self.samples - 1
        reason = None
        if self.batch_planned and not self.batch_asked and fit >= self.tuning.auto_min_batch and left < fit:
            reason = (
                f"{left} sample(s) after the first, fewer than a full batch of {fit}: one partial batch's first call "
                "and check would not be repaid"
            )
        elif self.batch_planned and fit >= (2 if self.batch_asked else self.tuning.auto_min_batch):
            why = "" if self.batch_asked else "the model's inputs have a batch axis, "
            self._keep_fetch(f"{why}batches of up to {fit} samples per inference call")
            return True
        if not self.batch_asked:
            self.fetch.stop_batching(reason)
        return False

    def _measure_fetch(self, total_s: float, index: int) -> None:
        """Record the fetch run's times for this sample: the whole call, its reduction, its inference."""
        self.totals.append(total_s)
        self.reduce_times.append(self.fetch.reduce_seconds or 0.0)
        self.infer_times.append(self.fetch.infer_seconds or 0.0)
        if self.choice is not None and len(self.totals) > self.tuning.compiled_probe:
            self.compiled_weighed = True
            self._try_compiled(index)

    def _decide(self, index: int, mean_elements: float) -> None:
        """After the fetch run's probe samples: the compiled reduction if it pays, else the merged graph's chance."""
        self.compiled_weighed = True
        if not self.kernel_ready and self._try_compiled(index):
            return
        if mean_elements > self.tuning.graph_max_mean_elements:
            self._keep_fetch(
                f"tensors of {mean_elements:,.0f} elements on average (> {self.tuning.graph_max_mean_elements:,}): "
                f"the merged graph's in-graph reductions are slower per sample than {self.run_name}'s"
            )
        else:
            self._open_graph(index)

    @property
    def run_name(self) -> str:
        """What the fetch-and-reduce run is called in reasons: ``compiled`` when its kernel reduces from the first
        sample, else ``fetch``."""
        return "compiled" if self.kernel_ready else FALLBACK_BACKEND

    def _keep_fetch(self, why: str) -> None:
        """The fetch-and-reduce run keeps the rest of the samples (numpy's reduction, or the kernel's when ready)."""
        why = f"{why}; {self.missing_fast}" if self.missing_fast else why
        self.choice, self.graph = (
            Choice(FALLBACK_BACKEND, why),
            None,
        )  # drop the merged session: its memory goes with it

    @property
    def fetch_per_sample(self) -> float:
        """The fetch run's steady per-sample time: the fastest call after sample 0 (whose first-run costs make it a
        poor measure), sample 0 if it is the only one."""
        return min(self.totals[1:] or self.totals)

    def _try_compiled(self, index: int) -> bool:
        """Start switching to the compiled reduction if what it saves on the remaining samples
        (:func:`_saving_per_sample`, from the fastest fetch samples after sample 0) exceeds numba's start-up. It
        needs no new session: numba loads on a background thread while numpy goes on reducing, and the run switches
        at the first sample after (:meth:`_switch`). Without numba, the reason says what it would save."""
        reduce_s, infer_s = min(self.reduce_times[1:]), min(self.infer_times[1:])
        remaining = self.samples - index - 1
        saving = remaining * _saving_per_sample(reduce_s, infer_s, self.fetch.pipelining, self.tuning.compiled_saving)
        startup = compiled.startup_s(self.tuning.compiled_startup_s)
        if saving <= startup:
            return False
        if not compiled.available():  # said in the reason: the user can install it
            self.missing_fast = f"a compiled reduction would save est. {saving:.1f} s: pip install 'qdebug[fast]'"
            if self.choice is not None:
                self._keep_fetch(self.choice.reason)
            return False
        self.warm_up = compiled.start_warm_up()
        self.choice, self.graph = (
            Choice(
                "compiled",
                f"numpy's reduction took {_ms(reduce_s)}/sample beside {_ms(infer_s)} of inference: the compiled "
                f"pass saves est. {saving:.1f} s over the {remaining} remaining samples, more than its "
                f"{startup:.1f} s start-up",
            ),
            None,
        )
        return True

    def _switch(self, index: int) -> None:
        """numba has loaded (or failed to): reduce with the compiled pass from sample ``index`` on (or keep numpy,
        with the reason)."""
        assert self.warm_up is not None and self.choice is not None
        error, self.warm_up = self.warm_up.error, None
        if error is not None:
            self._keep_fetch(f"{self.choice.reason}; but the compiled reduction could not load ({error})")
            return
        self.fetch.use_reducer(compiled.reduce_sample_compiled, compiled.kernel())
        self.switched_at = index

    def _graph_cannot_pay(self, remaining: int, per: float, which: str = "") -> bool:
        """Keep the fetch-and-reduce run, with the reason, if the merged graph's set-up could not pay back even at
        its smallest: a session of both models' nodes plus ``merged_nodes_per_pair`` per pair, which needs no
        building it. ``which`` says where ``per`` comes from."""
        nodes = [len(m.graph.node) for m in self.models]
        tune = self.tuning
        fewest = sum(nodes) + tune.merged_nodes_per_pair * len(self.pairing.activations)
        least = estimate_setup(self.fetch_setup, nodes, fewest, tune.setup_knee_nodes)
        if least <= tune.payback_share * remaining * per:
            return False
        self._keep_fetch(
            f"merged graph set-up est. over {_ms(least)} (over {fewest} nodes) > {tune.payback_share:.0%} of "
            f"{self.run_name}'s remaining {_ms(remaining * per)} ({remaining} samples x {_ms(per)}{which})"
        )
        return True

    def _ruled_out_at_sample_0(self, mean_elements: float) -> None:
        """With the compiled kernel reducing from sample 0 there is nothing else to weigh: if sample 0 already shows
        that the merged graph cannot win — tensors too large for it, or a set-up that even sample 0's time (an
        over-estimate: first-run costs) would not pay back — decide now, and the run pipelines from sample 1
        instead of timing ``compiled_probe`` more samples one by one."""
        if not self.kernel_ready:
            return
        if mean_elements > self.tuning.graph_max_mean_elements:
            self._decide(0, mean_elements)
        else:
            self._graph_cannot_pay(self.samples - 1, self.totals[0], ", sample 0's time")

    def _open_graph(self, index: int) -> None:
        """Estimate the merged graph's set-up; create its session only if it can pay itself back."""
        remaining, per = self.samples - index - 1, self.fetch_per_sample
        if self._graph_cannot_pay(remaining, per):
            return
        nodes = [len(m.graph.node) for m in self.models]
        try:
            model, layout = merged_model(*self.models, self.pairing, self.tuning)
        except UnsupportedPairError as exc:
            self._keep_fetch(f"the merged graph cannot express this pair: {exc}")
            return
        tune = self.tuning
        est = estimate_setup(self.fetch_setup, nodes, len(model.graph.node), tune.setup_knee_nodes)
        budget = tune.payback_share * remaining * per
        if est > budget:
            self._keep_fetch(
                f"merged graph set-up est. {est:.1f} s ({len(model.graph.node)} nodes) > {tune.payback_share:.0%} of "
                f"{self.run_name}'s remaining {remaining * per:.1f} s ({remaining} samples x {_ms(per)})"
            )
            return
        t0 = self.clock()
        try:
            self.graph = GraphRun(model, layout, self.pairing, self.providers)
        except UnsupportedPairError as exc:
            self._keep_fetch(str(exc))
            return
        self.graph_setup = self.clock() - t0
        self.graph_estimate = est

    def _probe(self, index: int, sample: Mapping[str, np.ndarray]) -> SampleSums | Fallback:
        """One sample on the merged graph, timed against the fetch run's steady per-sample time: the faster keeps
        the run."""
        assert self.graph is not None
        t0 = self.clock()
        res = self.graph.reduce(index, sample)
        took = self.clock() - t0
        per = self.fetch_per_sample
        setup = f"set-up {self.graph_setup:.2f} s, est. {self.graph_estimate:.2f} s"
        if isinstance(res, Fallback):
            self._keep_fetch(f"the merged graph could not reduce its probe sample ({res.reason}; {setup})")
        elif took < per:
            self.choice = Choice("graph", f"measured {_ms(took)}/sample vs {self.run_name} {_ms(per)}/sample ({setup})")
        else:
            self._keep_fetch(f"merged graph measured {_ms(took)}/sample vs {self.run_name} {_ms(per)}/sample ({setup})")
        return res


class AutoBackend:
    """The ``auto`` choice as a backend: its run measures the others on the first samples (not registered: it is
    no backend of its own, and ``--capture`` lists it first)."""

    name = AUTO

    def open(self, pair: ModelPair, options: OpenOptions) -> AutoRun:
        """An :class:`AutoRun` for ``options.samples`` samples."""
        return AutoRun(
            *pair,
            options.samples,
            input_shapes=options.input_shapes,
            segment_rule=options.segment_rule,
            batch=options.batch,
            tuning=options.tuning,
        )
