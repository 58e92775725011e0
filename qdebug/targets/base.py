"""The target interface and its registry: every target-specific fact and step lives behind :class:`Target`.

What a compile produced (``CompileReport`` and its failure checks) is :mod:`qdebug.targets.compile_report`'s.

Targets import their backend lazily (``qdebug._lazy.require``), so listing targets never needs the backend;
``available()`` says why a target cannot be used here (the UI's target dropdown shows that reason).

Why one module: the :class:`Target` protocol and :class:`TargetBase` name every value a step takes or returns
(``BuildOptions``, ``CompileJob``, ``Compiled``, ``Diagnosis`` and its budget, the precisions): the interface is read
whole by every target, and split, each half would import the other.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from qdebug.errors import ConfigError
from qdebug.passes import PassReport
from qdebug.target_registry import config_problems, lookup, register_target, target_names, unregister_target
from qdebug.targets.compile_report import CompileReport

if TYPE_CHECKING:
    import onnx

    from qdebug.config import QuantConfig
    from qdebug.report import TargetAccuracy
    from qdebug.targets.quant_constraints import QuantConstraints

__all__ = [
    "OPTION_FLAGS",
    "Availability",
    "BisectMode",
    "BuildOptions",
    "CompileJob",
    "Compiled",
    "Diagnosis",
    "DiagnosisBudget",
    "OutputsSink",
    "Precision",
    "Prepared",
    "ProgressFn",
    "Requantizer",
    "ShapeSource",
    "Target",
    "TargetBase",
    "available_targets",
    "config_problems",
    "get_target",
    "register_target",
    "shapes_for",
    "target_names",
    "to_ort_config",
    "unregister_target",
    "validate_config",
]


@dataclass(frozen=True)
class Precision:
    """One ``--precision`` a target offers: the :class:`~qdebug.config.QuantConfig` settings it stands for.

    ``config`` is ``None`` for a precision that quantizes nothing (e.g. QNN fp16: the float model is compiled).
    """

    name: str
    config: Mapping[str, Any] | None
    help: str = ""

    @property
    def quantized(self) -> bool:
        """False when the float model is compiled as it is."""
        return self.config is not None


#: The precisions ORT's QDQ recipes share (CPU and QNN): u8/u8, u16 activations with u8 weights, and "int8" =
#: u8 activations with s8 symmetric weights (ORT's recommended CPU format "U8S8"; on the HTP, activations are
#: unsigned, so "int8" is about the weights — the LayerNorm-gamma trap).
UINT8 = Precision("uint8", {"activation_type": "uint8", "weight_type": "uint8"}, "u8 activations, u8 weights")
UINT16 = Precision("uint16", {"activation_type": "uint16", "weight_type": "uint8"}, "u16 activations, u8 weights")
INT8_WEIGHTS = Precision(
    "int8",
    {"activation_type": "uint8", "weight_type": "int8", "weight_symmetric": True},
    "u8 activations, s8 symmetric weights",
)


class Availability(NamedTuple):
    """Whether a target can be used on this machine, and a short description or the reason it cannot."""

    ok: bool
    reason: str


#: Build options each target may or may not take, with their command-line spelling (for error messages).
OPTION_FLAGS: dict[str, str] = {
    "soc": "--soc",
    "fail_on_fallback": "--fail-on-fallback",
    "skip_fixes": "--skip-fix",
    "probe_tensors": "--no-tensor-probe",
    "snap_scales": "--no-snap-scales",
    "bisect": "--bisect",
    "remedies": "--remedies",
    "time_budget_s": "--time-budget",
    "probe_samples": "--probe-samples",
}


class BisectMode(StrEnum):
    """When the target locates a divergence by compiling prefix subgraphs instead of trusting its probe:
    ``auto`` when the probe changed the compiled graph, ``always``, ``never``."""

    AUTO = "auto"
    ALWAYS = "always"
    NEVER = "never"


SNAP_GRIDS = ("tie_free", "fine")
ProgressFn = Callable[[str], None]
#: (model role, the float model's output names, one sample's outputs of that model in their order)
OutputsSink = Callable[[str, Sequence[str], Sequence[Any]], None]


@dataclass(frozen=True)
class BuildOptions:
    """What to build for, validated on construction against the target's own rules (:meth:`Target.option_problems`).

    ``device`` names a registered target (``--target``); ``precision`` one of its :attr:`Target.precisions`.
    ``input_shapes`` fixes dynamic input dimensions (static-shape fix, synthetic data); without it the first
    sample of the data decides. ``debug_samples`` caps the samples used by ``debug`` and the target-side check;
    ``eval_data`` is always used whole. ``skip_fixes`` names compatibility fixes not to apply. ``snap_scales`` /
    ``snap_grid``: Deeploy's requantization snapping (docs/deeploy.md); ``probe_tensors``: QNN's per-tensor check.
    """

    device: str
    precision: str
    soc: str | None = None
    fail_on_fallback: bool = False
    debug_samples: int = 32
    input_shapes: Mapping[str, Sequence[int]] | None = None
    label_key: str = "label"
    skip_fixes: tuple[str, ...] = ()
    probe_tensors: bool = True
    #: QNN: the per-tensor probe runs on the first this many of the debug samples (``None``: all): its figures are
    #: per-tensor error ratios, and on the simulator a probe run costs more than the compiled model's
    probe_samples: int | None = 4
    timeout_s: float = 600.0
    snap_scales: bool = True
    snap_grid: str = "tie_free"
    #: QNN: locate the divergence by prefix compiles (:class:`BisectMode`; a string is parsed)
    bisect: BisectMode = BisectMode.AUTO
    #: QNN: try the standard remedies on a located divergence (docs/qnn.md); off unless asked: each costs a compile
    #: and a simulator run
    remedies: bool = False
    #: seconds the whole build may take: the diagnosis (bisection under ``auto``, the remedies) runs within what is
    #: left after the main build, each step only if its estimated cost fits (``None``: no budget)
    time_budget_s: float | None = None
    #: build only the region of the float model between these tensors (``--extract-inputs/--extract-outputs``,
    #: :mod:`qdebug.region`); both empty: the whole model
    extract_inputs: tuple[str, ...] = ()
    extract_outputs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "skip_fixes", tuple(self.skip_fixes))
        object.__setattr__(self, "extract_inputs", tuple(self.extract_inputs))
        object.__setattr__(self, "extract_outputs", tuple(self.extract_outputs))
        if not isinstance(self.bisect, BisectMode):
            try:
                object.__setattr__(self, "bisect", BisectMode(str(self.bisect).strip().lower()))
            except ValueError:
                raise ConfigError(
                    f"invalid build options: bisect {self.bisect!r} not in {[m.value for m in BisectMode]}"
                ) from None
        problems = self.problems()
        if problems:
            raise ConfigError("invalid build options: " + "; ".join(problems))

    @property
    def target(self) -> Target:
        """The registered target these options build for."""
        return get_target(self.device)

    def problems(self) -> list[str]:
        """Every invalid or conflicting option, all at once."""
        p: list[str] = []
        if self.device not in target_names():
            p.append(f"device {self.device!r} not in {list(target_names())}")
        else:
            p += self._target_problems(self.target)
        if self.snap_grid not in SNAP_GRIDS:
            p.append(f"snap_grid {self.snap_grid!r} not in {list(SNAP_GRIDS)}")
        if bool(self.extract_inputs) != bool(self.extract_outputs):
            p.append("a region needs both --extract-inputs and --extract-outputs")
        if not isinstance(self.debug_samples, int) or self.debug_samples < 1:
            p.append(f"debug_samples must be a positive integer, got {self.debug_samples!r}")
        known = sorted({f for n in target_names() for f in get_target(n).fix_names})
        unknown = sorted(set(self.skip_fixes) - set(known))
        if unknown:
            p.append(f"unknown fix name(s) {unknown}; known: {known}")
        if not (isinstance(self.timeout_s, int | float) and self.timeout_s > 0):
            p.append(f"timeout_s must be positive, got {self.timeout_s!r}")
        if self.probe_samples is not None and (
            isinstance(self.probe_samples, bool) or not isinstance(self.probe_samples, int) or self.probe_samples < 1
        ):
            p.append(f"probe_samples must be a positive integer, got {self.probe_samples!r}")
        budget = self.time_budget_s
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int | float) or not budget >= 0):
            p.append(f"time_budget_s must be a number of seconds >= 0, got {budget!r}")
        return p

    def _target_problems(self, t: Target) -> list[str]:
        p: list[str] = []
        if self.precision not in t.precisions:
            everywhere = sorted({q for n in target_names() for q in get_target(n).precisions})
            if self.precision not in everywhere:
                return [f"precision {self.precision!r} not in {everywhere}"]
            p.append(
                f"precision {self.precision!r} is not supported on device {t.name!r}; use one of "
                f"{list(t.precisions)}{t.precision_hint(self.precision)}"
            )
        defaults = BuildOptions.__dataclass_fields__
        for option, flag in OPTION_FLAGS.items():
            if option not in t.options and getattr(self, option) not in ((), None, defaults[option].default):
                takers = [n for n in target_names() if option in get_target(n).options]
                p.append(f"{flag} applies to --target {', '.join(takers)} only")
        stray = sorted(
            set(self.skip_fixes) & ({f for n in target_names() for f in get_target(n).fix_names} - set(t.fix_names))
        )
        if stray and "skip_fixes" in t.options:
            p.append(f"--skip-fix {stray} does not apply to --target {t.name} (its fixes: {list(t.fix_names)})")
        if not p:
            p += t.option_problems(self)
        return p

    def precision_spec(self) -> Precision:
        """The chosen precision of the chosen target."""
        return self.target.precisions[self.precision]

    @property
    def quantized(self) -> bool:
        """False when the precision compiles the float model as it is (e.g. QNN fp16)."""
        return self.precision_spec().quantized


@dataclass(frozen=True)
class Prepared:
    """The float model after a target's compatibility fixes, the config to quantize it with, one report per fix."""

    model: onnx.ModelProto
    config: QuantConfig | None
    fixes: tuple[PassReport, ...] = ()

    @property
    def changed(self) -> tuple[str, ...]:
        """Names of the fixes that changed something."""
        return tuple(f.name for f in self.fixes if f.changed)


@dataclass(frozen=True)
class Compiled:
    """What a target's compile produced.

    ``files`` maps manifest roles to paths relative to the build folder; ``manifest`` holds the target's own
    manifest entries (e.g. ``{"deeploy": {...}}``); ``warnings`` are for the user.
    """

    report: CompileReport
    files: Mapping[str, str] = field(default_factory=dict)
    manifest: Mapping[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    #: what the target did besides compiling, for ``recompile``'s notes (e.g. Deeploy's snapping, bit-exactness)
    notes: tuple[str, ...] = ()


class Target(Protocol):
    """A compile target: everything target-specific lives behind this interface (docs/architecture.md).

    The attributes are what the rest of qdebug reads instead of branching on a target's name: the CLI's choices,
    the dashboard's target and precision lists, the mixed-precision type checks and ``build``/``recompile``.
    :class:`TargetBase` gives every method a default, so a new target writes only what differs.
    """

    @property
    def name(self) -> str:
        """The registry name, e.g. ``"qnn"``."""

    @property
    def description(self) -> str:
        """One line for listings, e.g. ``"Qualcomm QNN HTP (EPContext; the HTP simulator on x86)"``."""

    @property
    def precisions(self) -> Mapping[str, Precision]:
        """``--precision`` name → what it means, in display order (the first is the default)."""

    @property
    def activation_types(self) -> frozenset[str]:
        """Activation types the target runs (what a 16-bit promotion may use)."""

    @property
    def options(self) -> frozenset[str]:
        """The target-specific build options it takes (keys of :data:`OPTION_FLAGS`)."""

    @property
    def fix_names(self) -> tuple[str, ...]:
        """Names of its compatibility fixes (``--skip-fix``), in the order they run."""

    def available(self) -> Availability:
        """Usable here, and why not — never raises and never imports the backend."""
        ...

    def precision_hint(self, precision: str) -> str:
        """A parenthesised hint appended to "precision X is not supported" (or ``""``)."""
        ...

    def option_problems(self, options: BuildOptions) -> list[str]:
        """Rules of its own beyond :data:`OPTION_FLAGS` (e.g. QNN fp16 needs a SoC)."""
        ...

    def config_problems(self, config: QuantConfig) -> list[str]:
        """What in a quantization config this target cannot run (types, symmetry)."""
        ...

    def quant_constraints(self) -> QuantConstraints | None:
        """What its integer kernels need of the quantization, met by :meth:`ort_config` (or ``None``)."""

    def ort_config(self, config: QuantConfig, model: str | Path | onnx.ModelProto, reader: Any) -> Any:
        """ONNX Runtime's ``StaticQuantConfig`` for ``config`` (the target's own ORT recipe)."""
        ...

    def prepare(
        self, model: onnx.ModelProto, config: QuantConfig | None, options: BuildOptions, shapes: ShapeSource
    ) -> Prepared:
        """Compatibility fixes on the float model (and its config) before quantizing; the input is not modified."""
        ...

    def after_quantize(
        self, qdq_model: Path, dest: Path, options: BuildOptions, progress: ProgressFn
    ) -> tuple[Path, Mapping[str, Any]]:
        """A step on the QDQ model before it is compiled (e.g. Deeploy's scale snapping), written to ``dest``
        (which may be ``qdq_model``): the model to compile and what was done (handed to :meth:`compile` as
        :attr:`CompileJob.after`). ``(qdq_model, {})`` when there is nothing to do."""
        ...

    def compile(self, job: CompileJob) -> Compiled:
        """Compile ``job.model`` into ``job.out_dir``; a failure is *reported* in the result, bad input raises."""
        ...

    def check(self, job: CompileJob, compiled: Compiled) -> TargetAccuracy | None:
        """The compiled model's accuracy on the target (per output, maybe per tensor), or ``None``."""
        ...

    def compiled_top1(
        self, job: CompileJob, compiled: Compiled, eval_data: Path, qdq_top1: float | None
    ) -> float | None:
        """Top-1 of the compiled model on the labelled ``eval_data`` (``None``: it cannot be run here)."""
        ...

    def describe(self, report: CompileReport) -> list[str]:
        """Plain lines about a compile report for the CLI (no colour; the first is the headline)."""
        ...

    def describe_manifest(self, manifest: Mapping[str, Any]) -> list[str]:
        """Plain lines about the target's own manifest entries (:attr:`Compiled.manifest`)."""
        ...

    def diagnose(self, job: CompileJob, compiled: Compiled, accuracy: TargetAccuracy | None) -> Diagnosis:
        """After the check: what the target learns about a divergence (e.g. QNN's bisection and remedies),
        as extra manifest entries and files in ``job.out_dir``."""
        ...

    def hints(self, report: CompileReport, fixes: Sequence[PassReport]) -> list[str]:
        """Warnings that tie a fallback to a skipped fix (or anything else the user can act on)."""
        ...


@dataclass(frozen=True)
class ShapeSource:
    """Where the static-shape fix takes shapes from: ``--input-shape``, else the first data sample, else defaults."""

    given: Mapping[str, Sequence[int]] | None
    data: Any
    label_key: str = "label"


@dataclass(frozen=True)
class CompileJob:
    """Everything a target's compile and check steps get from ``build`` / ``recompile``.

    ``model`` is what to compile (the QDQ model, or the float model for an unquantized precision);
    ``float_model`` / ``qdq_model`` the reference pair for the accuracy check (``qdq_model`` ``None`` when not
    quantized); ``samples`` the debug samples; ``stem`` names the outputs.
    """

    model: Path
    out_dir: Path
    options: BuildOptions
    float_model: Path | None = None
    qdq_model: Path | None = None
    samples: Any = None
    stem: str = "model"
    progress: ProgressFn = field(default=lambda _msg: None)
    #: what :meth:`Target.after_quantize` did (its manifest entries)
    after: Mapping[str, Any] = field(default_factory=dict)
    #: per float tensor name, the CPU-QDQ model's cumulative SQNR vs float (dB) from the debug report on
    #: ``samples``, so a target's per-tensor check measures its own error in these units without recomputing
    #: them (empty: not debugged yet; the target measures them itself)
    cpu_sqnr_db: Mapping[str, float | None] = field(default_factory=dict)
    #: the quantization config of ``qdq_model`` (``None``: not quantized, or unknown)
    config: QuantConfig | None = None
    #: re-quantizes the float model with another config (``build`` gives one; ``None``: the target cannot)
    requantizer: Requantizer | None = None
    #: what the diagnosis may spend on extra compiles and simulator runs (``None``: as the options say, no limit)
    budget: DiagnosisBudget | None = None
    #: called by :meth:`Target.check` once per sample and model it ran (``"float"``, ``"qdq"``, ``"compiled"``) with
    #: the float model's output names and that model's outputs in their order, so ``build`` measures top-1 on the
    #: samples the check ran instead of running them again (``None``: nobody listens)
    outputs_sink: OutputsSink | None = None


@dataclass(frozen=True)
class DiagnosisBudget:
    """What ``build`` lets :meth:`Target.diagnose` spend beyond the main build: whether the extra steps were asked
    for (``--remedies`` or ``--time-budget``), the :func:`time.monotonic` deadline of ``--time-budget`` (``None``:
    none) and one trial's estimated seconds (the main build's compile plus its simulator run on the same samples)."""

    asked: bool
    deadline: float | None = None
    trial_s: float = 0.0

    def refusal(self, what: str, trials: int) -> str | None:
        """Why ``trials`` trials of ``what`` do not run (``None``: they fit): not asked, or their estimated cost is
        more than the budget has left."""
        if not self.asked:
            return f"{what}: not asked (pass --remedies, or --time-budget SECONDS to run what fits)"
        if self.deadline is None:
            return None
        left = max(0.0, self.deadline - time.monotonic())
        need = trials * self.trial_s
        if need > left or left <= 0.0:
            return (
                f"{what}: ~{need:.0f} s estimated ({trials} × {self.trial_s:.1f} s, the build's compile + simulator "
                f"run), {left:.0f} s of the --time-budget left"
            )
        return None


class Requantizer(Protocol):
    """What ``build`` lends a target's :meth:`Target.diagnose` to try other quantizations of the same float
    model (the quantizer and the mixed-precision planner sit above the targets)."""

    def promote(self, config: QuantConfig, tensors: Sequence[str], to: str) -> QuantConfig:
        """``config`` with ``tensors`` promoted to ``to`` (ORT's mixed-precision fixer adds the converts)."""
        ...

    def quantize(self, config: QuantConfig, dest: Path) -> Path:
        """The float model quantized with ``config`` at ``dest`` (the build's calibration ranges reused)."""
        ...

    def save_overrides(self, config: QuantConfig, dest: Path, requested: Sequence[str], note: str) -> Path:
        """``config``'s tensor overrides as an overrides JSON file (``qdebug build --overrides``) at ``dest``."""
        ...


@dataclass(frozen=True)
class Diagnosis:
    """What :meth:`Target.diagnose` adds to the build: manifest entries, files (role → path relative to the build
    folder) and warnings."""

    manifest: Mapping[str, Any] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    #: the steps not run and why, one line each (not asked for, or over the time budget)
    skipped: tuple[str, ...] = ()


def get_target(name: str) -> Target:
    """The target registered as ``name``; an unknown name is a :class:`ConfigError` listing the known ones."""
    target: Target = lookup(name)
    return target


def available_targets() -> dict[str, Availability]:
    """Every registered target with (available, reason)."""
    return {name: Availability(*get_target(name).available()) for name in target_names()}


def validate_config(config: QuantConfig) -> QuantConfig:
    """``config`` if its target can run it, else a :class:`ConfigError` listing every problem."""
    problems = config_problems(config)
    if problems:
        raise ConfigError("invalid quantization config: " + "; ".join(problems))
    return config


def to_ort_config(config: QuantConfig, model: str | Path | onnx.ModelProto, reader: Any) -> Any:
    """ONNX Runtime's ``StaticQuantConfig`` for ``config``, by its target's recipe (validated first)."""
    cfg = get_target(validate_config(config).target).ort_config(config, model, reader)
    if config.nodes_to_exclude:  # a float fallback is the same request on every target's recipe
        cfg.nodes_to_exclude = sorted({*(cfg.nodes_to_exclude or []), *config.nodes_to_exclude})
    return cfg


class TargetBase:
    """Defaults for every :class:`Target` method: no options, no fixes, nothing after quantizing, no target-side
    check; ORT's generic QDQ recipe. A target subclasses it and overrides what differs."""

    name: str = ""
    description: str = ""
    precisions: Mapping[str, Precision] = {}
    activation_types: frozenset[str] = frozenset()
    weight_types: frozenset[str] = frozenset({"uint8", "int8", "uint16", "int16"})
    options: frozenset[str] = frozenset()
    fix_names: tuple[str, ...] = ()

    def available(self) -> Availability:
        """Usable everywhere (override when a backend is needed)."""
        return Availability(True, self.description)

    def precision_hint(self, precision: str) -> str:
        """No hint by default."""
        return ""

    def sixteen_bit_weights_note(self) -> str:
        """What a user must know before 16-bit weights on this target (none by default)."""
        return ""

    def float_fallback_note(self) -> str:
        """What keeping nodes in float (``QuantConfig.nodes_to_exclude``) costs on this target (the CPU: nothing)."""
        return "float nodes run on the CPU at no extra cost"

    def qdq_notes(self, qdq_model: onnx.ModelProto) -> list[str]:
        """What this target is known to compute differently from ORT's CPU in a QDQ model, one line each (none by
        default)."""
        return []

    def option_problems(self, options: BuildOptions) -> list[str]:
        """No rules of its own by default."""
        return []

    def config_problems(self, config: QuantConfig) -> list[str]:
        """Activation and weight types outside :attr:`activation_types` / :attr:`weight_types`."""
        p = []
        if config.activation_type not in self.activation_types:
            p.append(
                f"target {self.name!r} cannot run {config.activation_type} activations; it takes "
                f"{sorted(self.activation_types)}"
            )
        if config.weight_type not in self.weight_types:
            p.append(
                f"target {self.name!r} cannot run {config.weight_type} weights; it takes {sorted(self.weight_types)}"
            )
        return p

    def quant_constraints(self) -> QuantConstraints | None:
        """None: the config's own symmetry and types are all a target needs by default."""
        return None

    def ort_config(self, config: QuantConfig, model: str | Path | onnx.ModelProto, reader: Any) -> Any:
        """ORT's generic ``get_qdq_config`` (the CPU execution provider's recipe), meeting :meth:`quant_constraints`."""
        from onnxruntime.quantization import get_qdq_config

        from qdebug.config import ort_quant_options
        from qdebug.targets.quant_constraints import constrained_overrides

        o = ort_quant_options(config)
        return _ort_call(
            get_qdq_config,
            model,
            reader,
            calibrate_method=o.method,
            activation_type=o.activation_type,
            weight_type=o.weight_type,
            activation_symmetric=config.activation_symmetric,
            weight_symmetric=config.weight_symmetric,
            per_channel=config.per_channel,
            tensor_quant_overrides=constrained_overrides(self.quant_constraints(), model, reader, o.overrides),
        )

    def prepare(
        self, model: onnx.ModelProto, config: QuantConfig | None, options: BuildOptions, shapes: ShapeSource
    ) -> Prepared:
        """No fixes: a copy of the model, the config as given."""
        import onnx

        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        return Prepared(copy, config, ())

    def after_quantize(
        self, qdq_model: Path, dest: Path, options: BuildOptions, progress: ProgressFn
    ) -> tuple[Path, Mapping[str, Any]]:
        """Nothing to do by default."""
        return qdq_model, {}

    def compile(self, job: CompileJob) -> Compiled:  # pragma: no cover - every target implements it
        """Every target compiles its own way."""
        raise NotImplementedError

    def check(self, job: CompileJob, compiled: Compiled) -> TargetAccuracy | None:
        """No target-side accuracy by default."""
        return None

    def compiled_top1(
        self, job: CompileJob, compiled: Compiled, eval_data: Path, qdq_top1: float | None
    ) -> float | None:
        """Not run by default."""
        return None

    def describe(self, report: CompileReport) -> list[str]:
        """A one-line headline (the target's own name, device, nodes and time)."""
        state = "OK" if report.ok else "FAILED"
        return [
            f"{self.name} compile {state}: {report.device}, {report.accelerator_nodes} nodes, "
            f"{report.compile_seconds:.2f} s"
        ]

    def describe_manifest(self, manifest: Mapping[str, Any]) -> list[str]:
        """No manifest entries of its own by default."""
        return []

    def diagnose(self, job: CompileJob, compiled: Compiled, accuracy: TargetAccuracy | None) -> Diagnosis:
        """Nothing to diagnose by default."""
        return Diagnosis()

    def hints(self, report: CompileReport, fixes: Sequence[PassReport]) -> list[str]:
        """No hints by default."""
        return []


def _ort_call(fn: Callable[..., Any], model: str | Path | onnx.ModelProto, reader: Any, **kwargs: Any) -> Any:
    """Call one of ORT's config builders; its complaints about the options become a :class:`ConfigError`."""
    try:
        return fn(str(model) if isinstance(model, Path) else model, reader, **kwargs)
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"ONNX Runtime rejected the quantization config: {exc}") from exc


def shapes_for(model: onnx.ModelProto, source: ShapeSource) -> tuple[dict[str, list[int]], str]:
    """Shapes for the static-shape fix: ``--input-shape`` first, then the first data sample, then the documented
    defaults; and where they came from (for the fix's report)."""
    from qdebug.data import open_data, resolve_shapes
    from qdebug.model_io import input_specs

    specs = input_specs(model)
    shapes = {k: list(v) for k, v in (source.given or {}).items()}
    missing = [s for s in specs if not s.is_static and s.name not in shapes]
    if not missing:
        return shapes, "from --input-shape" if source.given else ""
    if source.data is not None:
        data = open_data(source.data, specs, num_samples=1, ignore=(source.label_key,), input_shapes=source.given)
        first = next(iter(data), None)
        if first is None:
            from qdebug.errors import ModelError

            raise ModelError(f"{data.description}: holds no samples")
        for s in missing:
            shapes[s.name] = list(first[s.name].shape)
        return shapes, "from the first data sample"
    for s in missing:
        shapes[s.name] = list(resolve_shapes([s])[s.name])
    return shapes, "defaults (batch 1, other dims 32: no data and no --input-shape)"
