"""How a capture trades speed against memory: every threshold the capture's choices read, as one frozen value.

A :class:`CaptureTuning` is passed in (``capture(..., tuning=...)``, ``DebugOptions.tuning``) and travels with the
run, to Ray workers too; nothing reads a module global, so a test or a benchmark changes a threshold by
:func:`dataclasses.replace`, not by patching a module. The defaults were measured on the corpus
(docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from qdebug.cluster import SHARDS_PER_WORKER

__all__ = ["CaptureTuning", "SegmentRule"]

_MB = 1 << 20


@dataclass(frozen=True)
class CaptureTuning:
    """The capture's thresholds (see each field's comment for what it bounds and why)."""

    # -- auto (qdebug.capture.auto) --
    #: samples per inference call ``auto`` runs when the model batches and the user did not say
    auto_batch: int = 32
    #: ``auto`` batches only when at least this many samples fit in a batch: fewer are slower per sample than
    #: one sample per call (``--batch N`` is obeyed whatever fits)
    auto_min_batch: int = 4
    #: the merged graph is not tried above this mean of elements per paired tensor: its in-graph float64
    #: reductions then cost more per sample than a fetch-and-reduce
    graph_max_mean_elements: int = 16384
    #: samples after sample 0 that ``auto`` times on the fetch run before deciding (sample 0's first-run
    #: allocations make it a poor measure alone)
    compiled_probe: int = 3
    #: with fewer samples left after sample 0, ``auto`` keeps the fetch run without measuring anything else
    min_remaining: int = 8
    #: the merged graph is tried only if its estimated set-up is below this share of the fetch run's remaining time
    payback_share: float = 0.25
    #: nodes the merged graph adds per paired activation, at least (a lower bound of its size without building it)
    merged_nodes_per_pair: int = 18
    #: node count at which ONNX Runtime's quadratic session set-up term equals its linear one (a ratio: it
    #: carries over to a faster or slower machine)
    setup_knee_nodes: int = 700

    # -- the compiled reduction (qdebug.capture.compiled) --
    #: start-up of the compiled reduction before the C kernel is built (its build, or numba's import): paid on a
    #: background thread, so the price is CPU, not a stall
    compiled_startup_s: float = 1.0
    #: share of the numpy reduction's time the compiled pass saves (conservative)
    compiled_saving: float = 0.7

    # -- batching (qdebug.capture.batching) --
    #: a batch's exposed tensors (both models) are kept under this many bytes
    batch_bytes: int = 96 * _MB

    # -- the fetch run (qdebug.capture.fetch) --
    #: up to this many exposed bytes per sample the next sample is inferred while this one is reduced (two
    #: samples' tensors alive at once); above it peak memory stays one sample's tensors
    pipeline_bytes: int = 160 * _MB
    #: a pipelined whole-model run whose calls handle tensors of at most this many elements on average leaves the
    #: reduction a core (ORT's threads, woken for every node, cost more than they save on small tensors)
    small_call_elements: int = 16384
    #: up to this many exposed bytes per sample the second set of bound outputs is prepared on the worker while
    #: sample 0 runs; above it a sample is slow enough that those first costs do not show, and memory would rise
    prep_bytes: int = 32 * _MB
    #: a model's constant-only nodes are folded only when their values take at most this many bytes (folding
    #: a model's dequantized weights costs more memory and set-up than it saves)
    fold_max_bytes: int = 4 * _MB

    # -- segmenting (qdebug.capture.segmented) --
    #: one sample's exposed bytes above which a one-core run is cut into segments to bound memory
    segment_above: int = 512 * _MB
    #: the same threshold with two or more cores: a sample too large to overlap with the next one is overlapped
    #: segment by segment instead
    pipelined_above: int = 160 * _MB
    #: exposed bytes per segment: small enough that a segment's tensors are still in the caches when reduced
    segment_bytes: int = 32 * _MB
    #: every this many samples a segmented run returns freed heap pages to the system (fragmentation vs faults)
    trim_every: int = 4
    #: float models up to this size get unknown tensor sizes from one run of ORT instead of the slower symbolic
    #: shape inference
    probe_model_bytes: int = 2 * _MB

    # -- intra-op threads (qdebug.capture.threads) --
    #: how long a submission waits for the worker to begin (past it nothing is wrong, the hand-over is not ensured)
    started_wait_s: float = 0.05
    #: samples timed with each thread count in a segmented run's thread trial (the medians are compared)
    trial_samples: int = 6
    #: samples that must be left for the thread trial to start (two rebuilds of every segment session)
    trial_min_remaining: int = 40
    #: the fewer threads are kept only when their median sample is at least this much faster
    trial_margin: float = 0.08

    # -- post-Q/DQ tensors from integers (qdebug.capture.dequant) --
    #: values of a 16-bit type checked against ONNX Runtime's dequantization (every value of an 8-bit one)
    wide_checks: int = 4096

    # -- Ray (qdebug.capture.ray_backend) --
    #: shards per worker: a fast worker takes over a slow one's share, and the round trips stay negligible
    shards_per_worker: int = SHARDS_PER_WORKER
    #: seconds between two progress polls of the workers
    poll_s: float = 0.5
    #: CPUs Ray reserves for each worker, and so the cores its run may use (Ray does not pin workers to cores)
    worker_cpus: int = 1

    # -- the reduction kernels (qdebug.capture.kernels: their keyword parameters, same defaults) --
    #: elements of one tensor a batch reduces per numpy call (the size of its temporary copies)
    chunk_elements: int = 1 << 18
    #: the widest Concat node the merged graph uses (wider ones become trees)
    concat_fan_in: int = 16
    #: a merged model larger than this is left to the fetch run (protobuf's 2 GiB limit on one serialized model)
    max_merged_bytes: int = 1_500_000_000

    # -- the machine --
    #: the cores a run may use (``None``: this process's, :func:`qdebug.capture.fetch.usable_cores`)
    cores: int | None = None

    def threshold(self, pipelined: bool) -> int:
        """One sample's exposed bytes above which a run is segmented (:attr:`segment_above`, or on two or more
        cores :attr:`pipelined_above` when lower)."""
        return min(self.segment_above, self.pipelined_above) if pipelined else self.segment_above


@dataclass(frozen=True)
class SegmentRule:
    """How a fetch run on some number of cores treats one sample: ``pipelined`` (two or more cores: inference
    overlaps the reduction, the next sample's or, segmented, the next segment's), segmented above ``above`` exposed
    bytes per sample, in segments of about ``budget`` bytes. A value, so a run in another process (a Ray worker)
    applies the rule its driver made."""

    pipelined: bool
    above: int
    budget: int

    @classmethod
    def for_cores(cls, cores: int, tuning: CaptureTuning | None = None) -> SegmentRule:
        """The rule of a run that may use ``cores`` cores, by ``tuning`` (default: :class:`CaptureTuning`)."""
        tuning = tuning or CaptureTuning()
        pipelined = cores >= 2
        return cls(pipelined, tuning.threshold(pipelined), tuning.segment_bytes)
