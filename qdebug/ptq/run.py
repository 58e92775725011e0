"""``run_ptq``: quantize a float model with a third-party PTQ library in its own environment → a QDQ model.

The caller's interpreter never imports the library: the model (raised to opset 13 when older, since every
library quantizes per channel only from there and NNCF otherwise falls back to per-tensor silently) and the
calibration samples (one ``.npz``: a key per model input, samples stacked on a leading axis) go to the library's
worker (``_nncf_worker.py`` / ``_quark_worker.py``) through a private temporary folder, which is also the worker's
HOME and TMPDIR, so whatever the library writes there (caches, ids) goes with it. The worker's model is checked
here — ONNX Runtime must load it and it must hold QuantizeLinear nodes — before it is written atomically to
``out``.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.version_converter

from qdebug._venv import run_worker, tail
from qdebug.config import normalize_quant_type
from qdebug.errors import ConfigError, DataError, ModelError, PtqError, QDebugError
from qdebug.io import atomic_path, refuse_overwrite_input, temp_dir
from qdebug.model_io import ModelKind, is_q, load_model, model_kind
from qdebug.ort import make_session
from qdebug.ptq.env import TELEMETRY_OFF, PtqLibrary, ensure_ptq_env
from qdebug.ptq.recipes import PtqRecipe, get_recipe

__all__ = ["PER_CHANNEL_OPSET", "PtqRun", "run_ptq"]

SCHEMA_VERSION = 1
#: The first opset whose QuantizeLinear/DequantizeLinear take an ``axis`` (per-channel quantization).
PER_CHANNEL_OPSET = 13
_RESULT_PREFIX = "QDEBUG_PTQ_RESULT "
_WORKERS = {
    PtqLibrary.NNCF: Path(__file__).with_name("_nncf_worker.py"),
    PtqLibrary.QUARK: Path(__file__).with_name("_quark_worker.py"),
}
#: The activation/weight types each library's worker can produce.
_TYPES = {
    PtqLibrary.NNCF: ("uint8", "int8"),
    PtqLibrary.QUARK: ("uint8", "int8", "uint16", "int16"),
}
#: ONNX domains ONNX Runtime's CPU provider runs (a node of any other domain is a library's custom op).
_ORT_DOMAINS = ("", "ai.onnx", "com.microsoft", "ai.onnx.ml")


@dataclass(frozen=True)
class PtqRun:
    """One PTQ run: the recipe, the library (and its version), the QDQ model written, how long the library took
    (environment start-up included, creation excluded) and what the caller should know."""

    recipe: str
    library: str
    library_version: str
    model_path: str
    seconds: float
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``schema_version``."""
        return {
            "schema_version": SCHEMA_VERSION,
            "recipe": self.recipe,
            "library": self.library,
            "library_version": self.library_version,
            "model_path": self.model_path,
            "seconds": self.seconds,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PtqRun:
        """Inverse of :meth:`to_dict`."""
        return cls(
            str(d["recipe"]), str(d["library"]), str(d["library_version"]), str(d["model_path"]),
            float(d["seconds"]), tuple(str(n) for n in d.get("notes", ())),
        )  # fmt: skip

    def to_json(self) -> str:
        """JSON text."""
        return json.dumps(self.to_dict(), indent=2)


def _stack(calibration: Sequence[Mapping[str, np.ndarray]], names: Sequence[str]) -> dict[str, np.ndarray]:
    """The samples as one array per input, stacked on a new leading axis (DataError naming what does not fit)."""
    if len(calibration) == 0:
        raise DataError("no calibration samples")
    stacked: dict[str, np.ndarray] = {}
    for name in names:
        missing = [i for i, s in enumerate(calibration) if name not in s]
        if missing:
            raise DataError(f"calibration sample {missing[0]} has no array for the model input {name!r}")
        arrays = [np.asarray(s[name]) for s in calibration]
        shapes = {a.shape for a in arrays}
        if len(shapes) > 1:
            raise DataError(f"calibration arrays of the input {name!r} differ in shape: {sorted(shapes)}")
        stacked[name] = np.stack(arrays)
    return stacked


def _input_names(model: onnx.ModelProto) -> list[str]:
    inits = {i.name for i in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def _unique_names(model: onnx.ModelProto, notes: list[str]) -> onnx.ModelProto:
    """A copy whose nodes all have distinct names (NNCF refuses a graph where two share one, as exporters leave
    them); the tensors, and so the outputs measured, keep their names."""
    names = [n.name for n in model.graph.node]
    if len(set(names)) == len(names) and all(names):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    seen: set[str] = set()
    renamed = 0
    for i, node in enumerate(out.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.name or node.op_type}/qdebug_{i}"
            renamed += 1
        seen.add(node.name)
    notes.append(f"{renamed} node(s) without a name of their own were named first (the library needs unique names)")
    return out


def _prepared(model: onnx.ModelProto, notes: list[str]) -> onnx.ModelProto:
    """The model at opset >= 13 (a note says when it was converted), every node named uniquely."""
    model = _unique_names(model, notes)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), PER_CHANNEL_OPSET)
    if opset >= PER_CHANNEL_OPSET:
        return model
    try:
        converted = onnx.version_converter.convert_version(model, PER_CHANNEL_OPSET)
    except Exception as exc:  # the converter raises bare RuntimeError/ValueError on what it cannot convert
        raise ModelError(f"cannot convert it from opset {opset} to {PER_CHANNEL_OPSET}: {exc}") from exc
    notes.append(f"converted from opset {opset} to {PER_CHANNEL_OPSET} first (per-channel Q/DQ need it)")
    return converted


def _custom_ops(model: onnx.ModelProto) -> list[str]:
    return sorted({f"{n.domain}:{n.op_type}" for n in model.graph.node if n.domain not in _ORT_DOMAINS})


def _checked_output(path: Path, library: PtqLibrary) -> tuple[int, list[str]]:
    """The worker's model must load in this ONNX Runtime and hold QuantizeLinear nodes: (their count, notes)."""
    model = onnx.load(str(path))
    custom = _custom_ops(model)
    try:
        make_session(model, ["CPUExecutionProvider"], role="output")
    except ModelError as exc:
        hint = f" (it uses custom ops {', '.join(custom)} that need the library's own runtime)" if custom else ""
        raise PtqError(f"{library}'s model cannot be run by ONNX Runtime{hint}: {exc.reason}") from exc
    if model_kind(model) != ModelKind.QDQ:
        raise PtqError(f"{library} wrote a model without QuantizeLinear/DequantizeLinear nodes")
    n_q = sum(1 for n in model.graph.node if is_q(n))
    notes = [f"custom ops {', '.join(custom)} (ONNX Runtime runs them)"] if custom else []
    return n_q, notes


def _checked_types(recipe: PtqRecipe, activation_type: str, weight_type: str) -> tuple[str, str]:
    act, weight = normalize_quant_type(activation_type), normalize_quant_type(weight_type)
    allowed = _TYPES[recipe.library]
    bad = [t for t in (act, weight) if t not in allowed]
    if bad:
        raise ConfigError(f"PTQ recipe {recipe.name}: {recipe.library} cannot quantize to {bad[0]} (it can: "
                          f"{', '.join(allowed)})")  # fmt: skip
    return act, weight


def _work(
    recipe: PtqRecipe,
    model: onnx.ModelProto,
    calibration: dict[str, np.ndarray],
    request: dict[str, Any],
    out: Path,
    timeout_s: float | None,
) -> tuple[dict[str, Any], float, list[str]]:
    """Hand the model and samples to the library's worker; copy its checked model to ``out`` atomically."""
    python = ensure_ptq_env(recipe.library)
    with temp_dir(prefix="qdebug-ptq-") as tmp_name:
        tmp = Path(tmp_name)
        onnx.save(model, str(tmp / "float.onnx"))
        np.savez(tmp / "calibration.npz", allow_pickle=False, **calibration)
        request = {**request, "model": str(tmp / "float.onnx"), "calibration": str(tmp / "calibration.npz"),
                   "out": str(tmp / "quantized.onnx")}  # fmt: skip
        (tmp / "request.json").write_text(json.dumps(request), encoding="utf-8")
        env = {**TELEMETRY_OFF, "HOME": tmp_name, "TMPDIR": tmp_name}
        t0 = time.perf_counter()
        run = run_worker(python, _WORKERS[recipe.library], [str(tmp / "request.json")], prefix=_RESULT_PREFIX,
                         timeout_s=timeout_s, cwd=tmp, env=env)  # fmt: skip
        seconds = time.perf_counter() - t0
        if run.timed_out:
            raise PtqError(f"{recipe.library} did not finish within {timeout_s:g} s (worker stopped)")
        record = run.record
        if record is None:
            last = tail(run.log, 1) or "no output"
            raise PtqError(f"{recipe.library}'s worker died (exit code {run.returncode}) without a result: {last}")
        if not record.get("ok"):
            raise PtqError(f"{recipe.library} {record.get('version', '')} failed: {record.get('error')}")
        n_q, notes = _checked_output(tmp / "quantized.onnx", recipe.library)
        with atomic_path(out) as dest:
            shutil.copyfile(tmp / "quantized.onnx", dest)
    return record, seconds, [*record.get("notes", ()), f"{n_q} QuantizeLinear nodes", *notes]


def run_ptq(
    recipe: str | PtqRecipe,
    float_model: str | Path,
    calibration: Sequence[Mapping[str, np.ndarray]],
    out: str | Path,
    *,
    activation_type: str = "uint8",
    weight_type: str = "int8",
    timeout_s: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> PtqRun:
    """Quantize ``float_model`` with ``recipe`` (a :data:`~qdebug.ptq.RECIPES` name or a :class:`PtqRecipe`) on
    the ``calibration`` samples (each a mapping input name → array, shaped as the model's input) and write the
    QDQ model to ``out``.

    The library runs in its own environment, created on first use; ``timeout_s`` stops it. ``activation_type`` /
    ``weight_type`` are 8-bit for NNCF (which picks each tensor's signedness from its preset), 8- or 16-bit for
    Quark. Every failure raises a :class:`~qdebug.errors.QDebugError` whose one-line message names the model and
    the recipe; ``out`` is only written when the model it gets loads in ONNX Runtime and is QDQ.
    """
    rec = get_recipe(recipe)
    src, dest = Path(float_model), Path(out)
    say = progress or (lambda _msg: None)
    try:
        act, weight = _checked_types(rec, activation_type, weight_type)
        if timeout_s is not None and not timeout_s > 0:
            raise ConfigError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        refuse_overwrite_input(dest, src)
        model = load_model(src, "float model")
        if model_kind(model) != ModelKind.FLOAT:
            raise ModelError(f"it is already quantized ({model_kind(model)}); PTQ needs the float model")
        notes: list[str] = []
        stacked = _stack(calibration, _input_names(model))
        prepared = _prepared(model, notes)
        say(f"{rec.name}: running {rec.library} on {len(calibration)} calibration samples")
        request = {"options": dict(rec.options), "activation_type": act, "weight_type": weight}
        record, seconds, more = _work(rec, prepared, stacked, request, dest, timeout_s)
    except QDebugError as exc:
        raise _named(exc, src, rec) from exc
    say(f"{rec.name}: done in {seconds:.1f} s")
    return PtqRun(rec.name, str(rec.library), str(record.get("version", "")), str(dest), seconds, (*notes, *more))


def _named(exc: QDebugError, model: Path, recipe: PtqRecipe) -> QDebugError:
    """``exc`` again, of the same kind, as one line naming the model (unless it already does) and the recipe."""
    text = " ".join(str(exc).split())
    message = (
        f"PTQ recipe {recipe.name}: {text}" if str(model) in text else f"{model}: PTQ recipe {recipe.name}: {text}"
    )
    try:
        return type(exc)(message)
    except TypeError:  # a kind whose constructor wants more than a message
        return PtqError(message)
