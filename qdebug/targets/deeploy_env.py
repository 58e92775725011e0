"""Deeploy's own environment, and its front end + code generation run on an integer ONNX network.

deeploy-pulp 0.2.1 pins numpy<2 and protobuf==4.23.3, which qdebug's numpy-2 stack cannot hold, so it lives in
a virtual environment of its own (:func:`ensure_env` creates it on first use: ~75 s, ~410 MB) and is driven
through a worker process (:mod:`qdebug.targets._deeploy_worker`, run with that environment's interpreter; it
imports Deeploy, never qdebug).

:func:`generate` answers "does Deeploy accept this network, and is what it generates integer-only?": it
writes ``Network.c`` / ``Network.h`` atomically into ``out_dir`` and returns a :class:`DeeployResult`.
Deeploy does not reject float models (it has fp32 kernels), so ``integer_only`` is read from the buffer
types Deeploy chose, not from Deeploy's acceptance.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from qdebug._venv import VenvSpec, default_venv_dir, ensure_venv, env_python, run_worker, tail, venv_status
from qdebug.errors import ConfigError, InputFileError, TargetError
from qdebug.io import atomic_write_text

__all__ = [
    "DEEPLOY_VERSION",
    "PLATFORMS",
    "DeeployBuffer",
    "DeeployResult",
    "deeploy_available",
    "default_env_dir",
    "ensure_env",
    "env_python",
    "generate",
]

DEEPLOY_VERSION = "0.2.1"
#: Platforms :func:`generate` can build a deployer for ("Siracusa" and "PULPOpen" share the PULP deployer).
PLATFORMS = ("Generic", "Siracusa", "PULPOpen")
ENV_VAR = "QDEBUG_DEEPLOY_ENV"
SCHEMA_VERSION = 1

_WORKER = Path(__file__).with_name("_deeploy_worker.py")
_RESULT_PREFIX = "QDEBUG_DEEPLOY_RESULT "
#: The environment: its marker (written last: its presence with the version means the install completed).
_SPEC = VenvSpec(
    label="Deeploy",
    stamp=DEEPLOY_VERSION,
    installs=((f"deeploy-pulp=={DEEPLOY_VERSION}",),),
    check="import Deeploy.DeeployTypes, onnx_graphsurgeon",
    marker=".qdebug-deeploy",
    env_var=ENV_VAR,
    checkout_dir=".venv-deeploy",
    cache_dir=f"deeploy-{DEEPLOY_VERSION}",
    make_target="make deeploy-env",
    cost="~75 s, ~410 MB",
    first_use="`qdebug build --target deeploy` makes it",
)


def default_env_dir() -> Path:
    """Where the Deeploy environment lives: ``$QDEBUG_DEEPLOY_ENV``, else ``<repo>/.venv-deeploy`` when qdebug
    runs from its source tree, else ``~/.cache/qdebug/deeploy-<version>``."""
    return default_venv_dir(_SPEC)


def ensure_env(env_dir: str | Path | None = None, *, python: str | Path | None = None) -> Path:
    """Create Deeploy's environment on first use and return its interpreter.

    The environment is built in a temporary folder next to ``env_dir`` (``python -m venv``, then
    ``pip install deeploy-pulp==<version>``), marked complete, and renamed into place, so an interrupted
    install never looks usable; an existing environment without the marker (partial, broken, another
    version) is rebuilt. ``python`` is the interpreter to create it with (default: the running one).
    Raises :class:`TargetError` with the tail of pip's output when the install fails.
    """
    return ensure_venv(_SPEC, env_dir, python=python, error=TargetError)


def deeploy_available(env_dir: str | Path | None = None) -> tuple[bool, str]:
    """(usable here, a short description or why not); never raises and never creates the environment."""
    ok, why = venv_status(_SPEC, env_dir)
    return ok, (f"deeploy-pulp {why}" if ok else why)


@dataclass(frozen=True)
class DeeployBuffer:
    """A graph input or output buffer of the generated code: its C type, shape, and how it stores the ONNX values.

    The buffer holds ``onnx_value - offset`` (Deeploy's sign propagation on Generic stores unsigned tensors as
    signed ones); ``name`` is the ONNX graph input/output, ``index`` its position in ``DeeployNetwork_inputs`` /
    ``DeeployNetwork_outputs``.
    """

    role: str  # "input" or "output"
    index: int
    name: str
    ctype: str
    shape: tuple[int, ...]
    offset: int = 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeeployBuffer:
        """From the worker's record (or :func:`dataclasses.asdict`)."""
        return cls(
            str(d["role"]), int(d["index"]), str(d["name"]), str(d["ctype"]), tuple(int(x) for x in d["shape"]),
            int(d.get("offset", 0)),
        )  # fmt: skip


@dataclass(frozen=True)
class DeeployResult:
    """What Deeploy's code generation did with one network on one platform.

    ``integer_only`` is ``None`` when nothing was generated, else whether every buffer Deeploy typed (inputs,
    outputs, weights, intermediates) is an integer type; ``float_buffers`` names the others.
    """

    ok: bool
    platform: str
    out_dir: str
    files: tuple[str, ...]
    seconds: float
    error: str | None = None
    integer_only: bool | None = None
    float_buffers: tuple[str, ...] = ()
    log_path: str | None = None
    #: the graph's input and output buffers as generated (for running the code: :mod:`qdebug.targets.deeploy_host`)
    io: tuple[DeeployBuffer, ...] = ()

    def __bool__(self) -> bool:
        return self.ok

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``schema_version``."""
        d = asdict(self)
        d["files"] = list(self.files)
        d["float_buffers"] = list(self.float_buffers)
        d["io"] = [{**b, "shape": list(b["shape"])} for b in d["io"]]
        d["schema_version"] = SCHEMA_VERSION
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeeployResult:
        """Inverse of :meth:`to_dict`."""
        kw = {k: v for k, v in d.items() if k != "schema_version"}
        kw["files"] = tuple(kw.get("files", ()))
        kw["float_buffers"] = tuple(kw.get("float_buffers", ()))
        kw["io"] = tuple(DeeployBuffer.from_dict(b) for b in kw.get("io", ()))
        return cls(**kw)

    def to_json(self) -> str:
        """JSON text."""
        return json.dumps(self.to_dict(), indent=2)


def _resolve_network(network: Path, inputs_npz: str | Path | None) -> tuple[Path, Path | None]:
    if network.is_dir():
        onnx_path = network / "network.onnx"
        if not onnx_path.is_file():
            raise InputFileError(f"{network}: a network folder must hold network.onnx")
        if inputs_npz is None and (network / "inputs.npz").is_file():
            inputs_npz = network / "inputs.npz"
    elif network.is_file():
        onnx_path = network
    else:
        raise InputFileError(f"{network}: no such ONNX file or network folder")
    npz = Path(inputs_npz) if inputs_npz is not None else None
    if npz is not None and not npz.is_file():
        raise InputFileError(f"{npz}: no such inputs file")
    return onnx_path.resolve(), npz.resolve() if npz is not None else None


def _install(staging: Path, out_dir: Path) -> None:
    """Rename the finished ``staging`` folder to ``out_dir``, replacing an earlier output folder whole."""
    old: Path | None = None
    if out_dir.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".old", dir=out_dir.parent))
        os.replace(out_dir, old / "prev")
    try:
        os.replace(staging, out_dir)
    except BaseException:
        if old is not None:
            os.replace(old / "prev", out_dir)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def generate(
    network: str | Path,
    out_dir: str | Path,
    platform: str = "Generic",
    *,
    inputs_npz: str | Path | None = None,
    env_dir: str | Path | None = None,
    timeout_s: float = 300.0,
) -> DeeployResult:
    """Run Deeploy's front end and code generation on ``network`` (an ONNX file, or a folder holding
    ``network.onnx`` and optionally ``inputs.npz``) for ``platform``.

    On success ``out_dir`` holds ``Network.c``, ``Network.h`` and ``deeploy.log`` (replacing an earlier output
    folder whole). On failure ``out_dir`` is left as it was, ``error`` carries Deeploy's message (with the
    node it concerns when the message names only a tensor) and the log is written next to it as
    ``<out_dir>.deeploy.log``. Input types come from the declared integer input types, else from the data in
    ``inputs_npz`` (as Deeploy's own driver does), else float32. Bad arguments raise; Deeploy's rejections
    are reported in the result. Creates the Deeploy environment on first use (:func:`ensure_env`).
    """
    if platform not in PLATFORMS:
        raise ConfigError(f"unknown Deeploy platform {platform!r}; known: {', '.join(PLATFORMS)}")
    if not (isinstance(timeout_s, int | float) and timeout_s > 0):
        raise ConfigError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    onnx_path, npz = _resolve_network(Path(network), inputs_npz)
    dest = Path(out_dir).absolute()
    if dest.exists() and not dest.is_dir():
        raise InputFileError(f"{dest}: the output must be a folder")
    if dest.resolve() in (onnx_path.parent, npz.parent if npz else None):
        raise InputFileError(f"{dest}: refusing to replace the folder holding the input network")
    py = ensure_env(env_dir)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    t0 = time.perf_counter()
    try:
        request = {"onnx": str(onnx_path), "inputs": str(npz) if npz else None, "platform": platform}
        record, log = _run_worker(py, request, staging, timeout_s)
        seconds = time.perf_counter() - t0
        files = tuple(str(f) for f in record.get("files", ()))
        ok = bool(record.get("ok")) and all((staging / "out" / f).is_file() for f in files)
        if ok:
            atomic_write_text(staging / "out" / "deeploy.log", log)
            _install(staging / "out", dest)
            log_path = dest / "deeploy.log"
        else:
            log_path = atomic_write_text(dest.parent / f"{dest.name}.deeploy.log", log)
        integer_only = record.get("integer_only") if ok else None
        return DeeployResult(
            ok=ok,
            platform=platform,
            out_dir=str(dest),
            files=files if ok else (),
            seconds=seconds,
            error=None if ok else str(record.get("error") or "Deeploy wrote no code"),
            integer_only=None if integer_only is None else bool(integer_only),
            float_buffers=tuple(record.get("float_buffers", ())) if ok else (),
            log_path=str(log_path),
            io=tuple(DeeployBuffer.from_dict(b) for b in record.get("io", ())) if ok else (),
        )
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _run_worker(py: Path, request: dict[str, Any], staging: Path, timeout_s: float) -> tuple[dict[str, Any], str]:
    """Run the worker in Deeploy's environment on ``request``: (its result record, its log)."""
    request["out_dir"] = str(staging / "out")
    request_path = staging / "request.json"
    request_path.write_text(json.dumps(request), encoding="utf-8")
    run = run_worker(py, _WORKER, [str(request_path)], prefix=_RESULT_PREFIX, timeout_s=timeout_s, cwd=staging)
    if run.timed_out:  # run_worker has killed the worker
        return {"ok": False, "error": f"Deeploy did not finish within {timeout_s:g} s (worker stopped)"}, run.log
    if run.record is not None:
        return run.record, run.log
    error = f"the Deeploy worker died (exit code {run.returncode}) without a result; log tail:\n{tail(run.log)}"
    return {"ok": False, "error": error}, run.log
