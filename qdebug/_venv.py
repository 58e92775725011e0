"""Virtual environments of their own for tools whose pins qdebug's interpreter cannot (or must not) hold.

Deeploy pins numpy<2; NNCF pulls scikit-learn and a telemetry client; AMD Quark needs torch and an older ONNX
Runtime. Each lives in a virtual environment created once, on first use, and is driven through a worker script
run with that environment's interpreter (it imports the tool, never qdebug); its result comes back as one
prefixed JSON line on stdout. :class:`VenvSpec` says what an environment holds and where it lives;
:func:`ensure_venv` creates it, :func:`venv_status` says whether it is there without creating it, and
:func:`run_worker` runs a worker in it.

An environment is built in a temporary folder beside its final place and renamed into place only after its
marker file (which records what was installed) is written, so an interrupted install never looks usable, and
an environment whose marker names other contents is rebuilt.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qdebug.cancel import run_process
from qdebug.errors import QDebugError

__all__ = [
    "VenvSpec",
    "WorkerRun",
    "default_venv_dir",
    "ensure_venv",
    "env_python",
    "run_worker",
    "tail",
    "venv_complete",
    "venv_status",
    "worker_env",
]

_REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class VenvSpec:
    """What a tool's environment holds and where it lives.

    ``installs`` are the argument lists of successive ``pip install`` calls (one per step: e.g. torch from its
    own wheel before a package that would otherwise pull another build of it); ``stamp`` is what the marker file
    records (an environment whose marker says otherwise is rebuilt); ``check`` is Python code the new
    environment must run before it is marked complete; ``env`` is added to the environment of every pip call.
    """

    label: str  # e.g. "Deeploy": how messages name it
    stamp: str
    installs: tuple[tuple[str, ...], ...]
    check: str
    marker: str  # the marker file's name inside the environment
    env_var: str  # overrides the location
    checkout_dir: str  # the folder name under the repository when qdebug runs from its source tree
    cache_dir: str  # the folder name under ~/.cache/qdebug otherwise
    make_target: str  # the command that creates it in a source checkout (a Makefile target), for messages
    cost: str = ""  # e.g. "~75 s, ~410 MB", for messages
    #: what creates it on first use, for messages outside a source checkout (which has no Makefile), e.g.
    #: "`qdebug build --target deeploy` makes it"
    first_use: str = ""
    env: Mapping[str, str] = field(default_factory=dict)


def default_venv_dir(spec: VenvSpec) -> Path:
    """``$<env_var>``, else ``<repo>/<checkout_dir>`` when qdebug runs from its source tree, else
    ``~/.cache/qdebug/<cache_dir>``."""
    override = os.environ.get(spec.env_var, "").strip()
    if override:
        return Path(override).expanduser()
    if _in_checkout():
        return _REPO / spec.checkout_dir
    return Path.home() / ".cache" / "qdebug" / spec.cache_dir


def _in_checkout() -> bool:
    """qdebug runs from its source tree (where the Makefile's targets exist), not from an installed wheel."""
    return (_REPO / "pyproject.toml").is_file() and (_REPO / "qdebug").is_dir()


def env_python(env_dir: Path) -> Path:
    """The interpreter of a virtual environment."""
    return env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def venv_complete(spec: VenvSpec, env_dir: Path) -> bool:
    """Whether ``env_dir`` holds a finished environment of ``spec`` (its marker, with the stamp, and python)."""
    try:
        ok = (env_dir / spec.marker).read_text(encoding="utf-8").strip() == spec.stamp
    except OSError:
        return False
    return ok and env_python(env_dir).exists()


def tail(text: str, lines: int = 15) -> str:
    """The last ``lines`` lines of ``text`` (for error messages)."""
    return "\n".join(text.strip().splitlines()[-lines:])


def worker_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a tool's subprocess runs with: ours without PYTHONPATH/PYTHONHOME (they would put
    qdebug's own site-packages before the tool's), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(extra or {})
    return env


def _build(spec: VenvSpec, tmp: Path, base: str, error: type[QDebugError]) -> None:
    """Create the environment in ``tmp``, install into it and check it; raise ``error`` naming the failed step."""
    pip = [str(env_python(tmp)), "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    steps = [[base, "-m", "venv", str(tmp)], *([*pip, *args] for args in spec.installs)]
    env = worker_env(spec.env)
    for cmd in steps:
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False, env=env
        )  # fmt: skip
        if proc.returncode != 0:
            raise error(
                f"creating the {spec.label} environment failed ({' '.join(cmd[-3:])}, exit code {proc.returncode}):\n"
                + tail(proc.stdout + "\n" + proc.stderr)
            )
    check = subprocess.run(
        [str(env_python(tmp)), "-c", spec.check],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if check.returncode != 0:
        raise error(f"the new {spec.label} environment does not work:\n" + tail(check.stderr))
    (tmp / spec.marker).write_text(spec.stamp + "\n", encoding="utf-8")


def ensure_venv(
    spec: VenvSpec,
    env_dir: str | Path | None = None,
    *,
    python: str | Path | None = None,
    error: type[QDebugError] = QDebugError,
) -> Path:
    """Create ``spec``'s environment on first use and return its interpreter.

    ``python`` creates it (default: the running interpreter). Raises ``error`` with the tail of pip's output
    when a step fails; the temporary folder is removed whatever happens.
    """
    target = Path(env_dir) if env_dir is not None else default_venv_dir(spec)
    target = target.expanduser().absolute()
    if venv_complete(spec, target):
        return env_python(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    base = str(python) if python is not None else sys.executable
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        _build(spec, tmp, base, error)
        if venv_complete(spec, target):  # another process finished first: keep its environment
            shutil.rmtree(tmp, ignore_errors=True)
            return env_python(target)
        if target.exists() or target.is_symlink():
            # An incomplete environment: move it aside first so the rename below cannot fail half-way.
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
            os.replace(target, old / "env")
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # A venv records its own path in its scripts (pip, activate), which now point at the temporary folder;
    # qdebug only runs `bin/python`, which works from anywhere.
    return env_python(target)


def venv_status(spec: VenvSpec, env_dir: str | Path | None = None) -> tuple[bool, str]:
    """(usable here, a short description or why not and how to create it); never raises, never creates."""
    try:
        target = Path(env_dir) if env_dir is not None else default_venv_dir(spec)
        if venv_complete(spec, target):
            return True, f"{spec.stamp} in {target}"
        cost = f", {spec.cost}" if spec.cost else ""
        if not _in_checkout():  # an installed qdebug: no Makefile to point at; the first use creates it
            by = f": {spec.first_use}" if spec.first_use else ""
            if target.exists():
                return False, f"the {spec.label} environment {target} is incomplete (the next use rebuilds it{by})"
            return False, f"no {spec.label} environment at {target} yet (created on first use{cost}{by})"
        if target.exists():
            return False, f"the {spec.label} environment {target} is incomplete (`{spec.make_target}` rebuilds it)"
        return False, f"no {spec.label} environment at {target} (create it with `{spec.make_target}`{cost})"
    except Exception as exc:  # e.g. an unreadable home folder
        return False, f"the {spec.label} environment is unusable: {type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class WorkerRun:
    """What a worker run left: its result record (``None``: it printed none), its log, and whether it timed out."""

    record: dict[str, Any] | None
    log: str
    returncode: int | None
    timed_out: bool = False


def _decode(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode("utf-8", "replace")


def run_worker(
    python: Path,
    script: Path,
    args: Sequence[str],
    *,
    prefix: str,
    timeout_s: float | None,
    cwd: Path,
    env: Mapping[str, str] | None = None,
) -> WorkerRun:
    """Run ``python script *args`` and read the last stdout line starting with ``prefix`` as its JSON result.

    A worker past ``timeout_s`` is killed (``subprocess.run`` does) and reported as timed out.
    """
    try:
        proc = run_process(  # a cancel (the dashboard's) kills the worker and what it started
            [str(python), str(script), *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=cwd,
            env=worker_env(env),
        )
    except subprocess.TimeoutExpired as exc:
        return WorkerRun(None, _decode(exc.stdout) + _decode(exc.stderr), None, timed_out=True)
    log = proc.stdout + ("\n--- stderr ---\n" + proc.stderr if proc.stderr else "")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(prefix):
            record: dict[str, Any] = json.loads(line[len(prefix) :])
            return WorkerRun(record, log, proc.returncode)
    return WorkerRun(None, log, proc.returncode)
