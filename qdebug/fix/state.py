"""The fix's options (:class:`FixOptions`), its working state (:class:`FixState`: data, probe, trials so far, the
16-bit search's blocks) and how one candidate is tried (:func:`try_config`: quantized from the one calibration,
measured on the debug samples, recorded) and compared (:func:`better`). Every stage of :mod:`qdebug.fix.engine`
works through them."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from qdebug.config import CALIBRATION_METHODS, QuantConfig, normalize_quant_type
from qdebug.data import DataSource
from qdebug.errors import ConfigError, QDebugError
from qdebug.fix.probe import Measure, OutputProbe
from qdebug.fix.result import Stage, Trial
from qdebug.fix.space import Block, sixteen_bit_elements
from qdebug.quantizer import quantize

ProgressFn = Callable[[int, int, str], None]


#: The 16-bit search's time is never cut below this: on a small model a debug pass takes a fraction of a second,
#: and a budget of passes alone would stop it after a handful of candidates.
MIN_SEARCH_SECONDS = 30.0


#: A gain smaller than this is the noise of a few debug samples, not a remedy.
MIN_GAIN_DB = 0.1


@dataclass(frozen=True)
class FixOptions:
    """How a fix searches. ``budget_16bit``: the largest share of weight + activation elements it may put in 16
    bits (0: none, 1: no limit). ``goal_db``: the worst output SQNR to reach on the debug samples (``None``: close
    ``gap_fraction`` of the gap between the best 8-bit recipe and the W16A16 ceiling). ``holdout_samples``: the last
    samples of the data, seen by no stage (``None``: a quarter of the data, at most 24). ``libraries``: the PTQ
    recipes of :mod:`qdebug.ptq` to measure (``None``: every one whose environment exists; ``()``: none).
    ``metric``: a task metric (:func:`qdebug.task_metrics.load_metric` spec) measured beside the SQNR."""

    target: str = "cpu"
    activation_type: str = "uint8"
    weight_type: str = "int8"
    budget_16bit: float = 0.10
    goal_db: float | None = None
    gap_fraction: float = 0.8
    holdout_samples: int | None = None
    debug_samples: int = 8
    max_trials: int = 40
    max_pass_equivalents: float = 20.0
    calibration_methods: tuple[str, ...] = ("percentile", "entropy")
    libraries: tuple[str, ...] | None = None
    metric: Any = None
    label_key: str = "label"
    seed: int = 0

    def __post_init__(self) -> None:
        problems = []
        if not 0.0 <= self.budget_16bit <= 1.0:
            problems.append(f"budget_16bit must be between 0 and 1, got {self.budget_16bit}")
        if not 0.0 < self.gap_fraction <= 1.0:
            problems.append(f"gap_fraction must be in (0, 1], got {self.gap_fraction}")
        if self.goal_db is not None and not math.isfinite(self.goal_db):
            problems.append(f"goal_db must be finite, got {self.goal_db}")
        if self.debug_samples < 1 or self.max_trials < 4:
            problems.append("debug_samples must be ≥ 1 and max_trials ≥ 4")
        if not self.max_pass_equivalents > 0:
            problems.append(f"max_pass_equivalents must be > 0, got {self.max_pass_equivalents}")
        if self.holdout_samples is not None and self.holdout_samples < 0:
            problems.append(f"holdout_samples must be ≥ 0, got {self.holdout_samples}")
        unknown = [m for m in self.calibration_methods if m not in CALIBRATION_METHODS or m == "minmax"]
        if unknown:
            problems.append(f"calibration_methods: {unknown} (choose from percentile, entropy)")
        if problems:
            raise ConfigError("invalid fix options: " + "; ".join(problems))
        object.__setattr__(self, "activation_type", normalize_quant_type(self.activation_type))
        object.__setattr__(self, "weight_type", normalize_quant_type(self.weight_type))


@dataclass
class Leaf:
    """A block of the 16-bit search with its measured noise reduction (``None`` until measured)."""

    block: Block
    reduction: float | None = None


@dataclass
class FixState:
    """The fix's working state: data splits, probes, trials so far."""

    float_path: Path
    float_proto: onnx.ModelProto
    calib: DataSource
    holdout_samples: list[Any]
    probe: OutputProbe
    work: Path
    opts: FixOptions
    progress: ProgressFn | None
    trials: list[Trial] = field(default_factory=list)
    cache: str | None = None
    notes: list[str] = field(default_factory=list)
    leaves: list[Leaf] = field(default_factory=list)
    debug_source: DataSource | None = None
    t0: float = field(default_factory=time.perf_counter)
    pass_s: float | None = None
    stage_t0: float | None = None
    #: the 16-bit search stopped at its time budget
    stopped: bool = False
    holdout_labels: Sequence[Any] | None = None
    act_elements: dict[str, int] = field(default_factory=dict)
    weight_elements: dict[str, int] = field(default_factory=dict)

    def room(self, trials: int = 1) -> bool:
        """Whether ``trials`` more candidates fit: under ``max_trials``, and the 16-bit search so far under
        ``max_pass_equivalents`` debug passes (the stages before it are bounded by their own few candidates; a slow
        PTQ library must not leave the 16-bit search no time)."""
        if len(self.trials) + trials > self.opts.max_trials:
            return False
        if self.pass_s is None or self.stage_t0 is None:
            return True
        allowed = max(self.opts.max_pass_equivalents * self.pass_s, MIN_SEARCH_SECONDS)
        if time.perf_counter() - self.stage_t0 < allowed:
            return True
        self.stopped = True
        return False

    def say(self, message: str) -> None:
        """Report progress: ``message`` with the trials so far out of ``max_trials``."""
        if self.progress is not None:
            self.progress(len(self.trials), self.opts.max_trials, message)

    def share(self, config: QuantConfig) -> float:
        """The share of weight + activation elements ``config`` holds in 16 bits (0 before the debug pass)."""
        acts, ws = self.act_elements, self.weight_elements
        total = sum(acts.values()) + sum(ws.values())
        if not total:
            return 0.0
        wide = sum(acts.values()) if config.activation_type.endswith("16") else sixteen_bit_elements(config, acts)
        wide += sum(ws.values()) if config.weight_type.endswith("16") else sixteen_bit_elements(config, ws)
        return round(min(1.0, wide / total), 4)


def _quantize(st: FixState, config: QuantConfig, tag: str) -> Path:
    """``config`` quantized from the one calibration (the first call calibrates)."""
    out = st.work / f"{tag}.qdq.onnx"
    q = quantize(st.float_path, st.calib, config, out, calibration_cache=st.cache, check=False)
    st.cache = st.cache or q.calibration_cache
    return Path(q.model_path)


def try_config(st: FixState, name: str, stage: Stage, description: str, config: QuantConfig) -> Trial:
    """Quantize ``config`` and measure it on the debug samples; a failure is recorded, not raised."""
    st.say(f"{name}: {description}")
    t0 = time.perf_counter()
    try:
        m: Measure | None = st.probe.measure(_quantize(st, config, name))
        error = None
    except QDebugError as exc:
        m, error = None, str(exc)
    trial = Trial(name, stage, description, m, st.share(config), round(time.perf_counter() - t0, 3), config, error)
    st.trials.append(trial)
    return trial


def better(a: Trial, b: Trial | None) -> bool:
    """``a`` measures better than ``b`` by more than the noise of the debug samples."""
    if a.db is None:
        return False
    return b is None or b.db is None or a.db > b.db + MIN_GAIN_DB
