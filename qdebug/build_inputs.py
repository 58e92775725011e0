"""What :func:`qdebug.build.build` reads and checks before any work (:func:`read_inputs` → :class:`BuildJob`): the
float model (not quantized, not compiled, loadable by ONNX Runtime), the output folder, the data's and config's
checksums, the overrides (against the model as given, and again after the target's fixes), the config for the device
× precision (:func:`resolve_config`) and the evaluation data's labels (:func:`check_eval_data`). Bad input raises
here, before anything is written.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from qdebug.build_manifest import InputFile
from qdebug.build_progress import BuildProgress
from qdebug.config import QuantConfig
from qdebug.data import DataSource
from qdebug.errors import ConfigError, ModelError
from qdebug.io import input_problem
from qdebug.model_io import ModelKind, file_sha256, load_model, model_kind
from qdebug.ort import make_session
from qdebug.passes import PassReport
from qdebug.targets.base import BuildOptions, Target, get_target
from qdebug.targets.compile_report import CompileReport

if TYPE_CHECKING:
    from qdebug.mixed.overrides import OverridesFile


DataLike = str | Path | Mapping[str, np.ndarray] | DataSource | None


def resolve_config(
    device: str,
    precision: str,
    config: QuantConfig | None = None,
    overrides: OverridesFile | None = None,
) -> QuantConfig | None:
    """The :class:`QuantConfig` for ``device`` × ``precision`` on top of ``config`` and an overrides file.

    Settings the config (or the overrides file's ``base_config``) set explicitly and ``precision`` contradicts are
    a :class:`~qdebug.errors.ConfigError` (:meth:`QuantConfig.merged`). ``None`` for a precision that quantizes
    nothing (e.g. QNN fp16; a config or overrides given with it is an error: it would be silently ignored).
    """
    t = get_target(device)
    spec = t.precisions.get(precision)
    if spec is None:
        raise ConfigError(f"precision {precision!r} is not supported on device {device!r}{t.precision_hint(precision)}")
    if spec.config is None:
        if config is not None or overrides is not None:
            raise ConfigError(f"precision {precision} quantizes nothing: --config and --overrides do not apply")
        return None
    base = overrides.resolve_base(config) if overrides is not None else config or QuantConfig()
    cfg = base.merged(target=device, **spec.config)
    if overrides is not None:
        cfg = overrides.apply_to(cfg)
    return cfg


def check_eval_data(model: onnx.ModelProto, eval_data: str | Path | None, options: BuildOptions) -> None:
    """Before any work, what every step of a build that reads ``eval_data``'s labels will ask: top-1 of the float,
    the QDQ and the target's compiled model — on every target, QNN's simulator run and Deeploy's host run included —
    reads them through :func:`qdebug.data.read_labels`, minutes after the start. Asked here of the float ``model``
    (the region's end tensor scores a region): its inputs, one class index per sample, below its number of classes.
    A problem raises what top-1 would raise, naming the file and the label array."""
    if eval_data is None:
        return
    from qdebug.evaluate import check_eval_set
    from qdebug.io import check_input

    check_input(eval_data, "evaluation data")
    scores = options.extract_outputs[0] if options.extract_outputs else None
    check_eval_set(model, eval_data, options.label_key, scores=scores)


def check_data(model: onnx.ModelProto, data: DataLike, options: BuildOptions) -> None:
    """Before any work, a calibration or debug data file or folder as the steps will open it: readable, the float
    ``model``'s inputs with their dtypes and shapes (label arrays ignored); a problem raises the
    :class:`~qdebug.errors.DataError` those steps would raise minutes later, naming the file and the array."""
    if not isinstance(data, str | Path):
        return  # arrays or a source in memory: checked where they are opened
    from qdebug.data import open_data
    from qdebug.model_io import input_specs

    open_data(data, input_specs(model), ignore=(options.label_key,), input_shapes=options.input_shapes)


def _data_sha256(path: Path) -> str:
    if path.is_dir():
        import hashlib

        h = hashlib.sha256()
        for f in sorted(path.glob("*.npz")):
            h.update(f"{f.name}\0{file_sha256(f)}\n".encode())
        return h.hexdigest()
    return file_sha256(path)


def _is_epcontext(model: onnx.ModelProto) -> bool:
    return any(n.op_type == "EPContext" for n in model.graph.node)


def _check_float_model(model: onnx.ModelProto, path: Path) -> None:
    if _is_epcontext(model):
        raise ModelError(f"{path}: is a compiled EPContext model; build takes the float ONNX model it came from")
    kind = model_kind(model)
    if kind is not ModelKind.FLOAT:
        raise ModelError(f"{path}: is already quantized ({kind.value}); build takes the float model")


def prepare_out(out: Path) -> None:
    """Refuse an output that exists and is not an empty folder (a build fills a new folder or nothing)."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out}: exists and is not an empty folder; choose a new output folder")


def _check_overrides_before_fixes(ofile: OverridesFile, model: onnx.ModelProto, sha256: str, target: str) -> list[str]:
    """The overrides against the model as given. A file made for the model after *this* target's fixes (``qdebug
    search --target``: :attr:`OverridesFile.target_fixes`) names tensors and consumers of the fixed model (a fused
    GELU is one node): only which model file it is for is checked here, the rest after the fixes
    (:func:`check_overrides_after_fixes`)."""
    from qdebug.mixed.overrides import check_against_model

    if ofile.target_fixes is None or ofile.target_fixes[0] != target:
        return check_against_model(ofile, model, sha256)
    if ofile.model_sha256 is not None and ofile.model_sha256 != sha256:
        return [
            f"the overrides were made for a different model file (sha256 {ofile.model_sha256[:12]}…, this model's "
            f"is {sha256[:12]}…); they are checked against this model after the {target} fixes"
        ]
    return []


def check_overrides_after_fixes(
    ofile: OverridesFile, model: onnx.ModelProto, changed: Sequence[str], target: str
) -> None:
    """The user's overrides must still name tensors (and consumers) of the *fixed* model."""
    from qdebug.mixed.overrides import OverridesError, OverridesFile, check_against_model

    try:
        check_against_model(OverridesFile(ofile.overrides), model, "")
    except OverridesError as exc:
        raise ConfigError(
            f"the overrides no longer fit the model after the {target.upper()} fix(es) {list(changed)}: "
            + "; ".join(exc.problems)
            + " (make them for the fixed float model, or pass --skip-fix for the fix that removed the tensors)"
        ) from exc


@dataclass
class BuildJob:
    """What ``build`` read and checked before any work, and what it learned on the way (for a failure's message)."""

    src: Path
    out: Path
    model: onnx.ModelProto
    options: BuildOptions
    target: Target
    cfg: QuantConfig | None
    ofile: OverridesFile | None
    data: DataLike
    eval_data: Path | None
    debug_data: DataLike
    say: BuildProgress
    inputs: list[InputFile] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    fixes: tuple[PassReport, ...] = ()
    compile_report: CompileReport | None = None
    region: Any = None  # the :class:`qdebug.region.Region` built, if any
    skipped: list[str] = field(default_factory=list)  # steps not run and why (:attr:`BuildManifest.skipped`)

    def timed(self, key: str, t0: float) -> None:
        self.timings[key] = round(time.perf_counter() - t0, 4)


def read_inputs(
    src: Path,
    out: Path,
    options: BuildOptions,
    config: Any,
    overrides: Any,
    data: DataLike,
    eval_data: str | Path | None,
    debug_data: DataLike,
    say: BuildProgress,
) -> BuildJob:
    """Load and check every input before anything is written (bad input raises here)."""
    model = load_model(src, "model")
    _check_float_model(model, src)
    # ORT must load the model before any step does: its errors would otherwise name the staging copy
    make_session(model, ["CPUExecutionProvider"], what=str(src))
    prepare_out(out)
    inputs = [InputFile("model", str(src.resolve()), file_sha256(src))]
    for role, value in (("data", data), ("debug_data", debug_data), ("eval_data", eval_data)):
        if isinstance(value, str | Path) and input_problem(value, folder=True) is None:  # else open_data says why
            inputs.append(InputFile(role, str(Path(value).resolve()), _data_sha256(Path(value))))
    cfg_obj = config
    if isinstance(config, str | Path):
        cfg_obj = QuantConfig.load(config)
        inputs.append(InputFile("config", str(Path(config).resolve()), file_sha256(config)))
    warnings: list[str] = []
    ofile = None
    if overrides is not None:
        from qdebug.mixed.overrides import OverridesError, OverridesFile

        ofile = overrides if isinstance(overrides, OverridesFile) else OverridesFile.load(overrides)
        try:
            warnings += _check_overrides_before_fixes(ofile, model, inputs[0].sha256, options.target.name)
        except OverridesError as exc:  # the check sees the parsed file only: name it
            source = None if isinstance(overrides, OverridesFile) else overrides
            raise OverridesError(exc.problems, source=source, warnings=exc.warnings) from exc
        if isinstance(overrides, str | Path):
            inputs.append(InputFile("overrides", str(Path(overrides).resolve()), file_sha256(overrides)))
    cfg = resolve_config(options.device, options.precision, cfg_obj, ofile)
    if ofile is not None and cfg is not None:
        warnings += ofile.drift(cfg)
    check_eval_data(model, eval_data, options)
    for value in (data, debug_data):
        check_data(model, value, options)
    evals = None if eval_data is None else Path(eval_data)
    return BuildJob(
        src, out, model, options, options.target, cfg, ofile, data, evals, debug_data, say, inputs, warnings
    )
