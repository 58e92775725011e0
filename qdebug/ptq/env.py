"""The PTQ libraries' own environments: what each holds, where it lives, and whether it is there.

Neither library is ever imported into qdebug's interpreter. NNCF's pins fit qdebug's (numpy 2, ONNX Runtime
1.31), but it pulls scikit-learn, scipy, networkx and the ``openvino-telemetry`` client, which must not enter
qdebug's environment; AMD Quark needs torch and pins ``onnxruntime<=1.28``. Each gets a virtual environment
created once (:func:`ensure_ptq_env`; ``make ptq-env`` / ``make ptq-env-quark``), located like Deeploy's:
``$QDEBUG_PTQ_NNCF_ENV`` / ``$QDEBUG_PTQ_QUARK_ENV``, else ``<repo>/.venv-ptq-nncf`` / ``.venv-ptq-quark`` in a
checkout, else ``~/.cache/qdebug/ptq-nncf-<version>`` / ``ptq-quark-<version>``.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from qdebug._venv import VenvSpec, default_venv_dir, ensure_venv, venv_status
from qdebug.errors import PtqError

__all__ = [
    "NNCF_VERSION",
    "QUARK_VERSION",
    "TELEMETRY_OFF",
    "PtqLibrary",
    "ensure_ptq_env",
    "ptq_available",
    "ptq_env_dir",
    "ptq_env_spec",
]


class PtqLibrary(StrEnum):
    """The third-party post-training quantization libraries qdebug can run."""

    NNCF = "nncf"
    QUARK = "quark"


NNCF_VERSION = "3.4.0"
QUARK_VERSION = "0.13"
#: Quark's environment's ONNX Runtime and onnx: the newest releases ``amd-quark`` 0.13 accepts.
QUARK_ORT = "1.28.0"
QUARK_ONNX = "1.22.0"

#: Added to the environment of every worker and every pip call that creates an environment, so nothing leaves
#: the machine. NNCF constructs an ``openvino_telemetry.Telemetry`` when it is imported, which (without a consent
#: file saying no) writes a client id under ``~/intel`` and sends usage events to Google Analytics; the NNCF
#: worker never lets that package load (see ``_nncf_worker._import_nncf``), and ``NNCF_CI`` makes NNCF replace its
#: telemetry with a stub should it load anyway. ONNX Runtime's telemetry is off as in qdebug's own process;
#: Hugging Face hubs (Quark pulls ``evaluate``/``datasets``) stay offline.
TELEMETRY_OFF: dict[str, str] = {
    "NNCF_CI": "1",
    "ORT_DISABLE_TELEMETRY": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_DATASETS_OFFLINE": "1",
    "DO_NOT_TRACK": "1",
}

_SPECS: dict[PtqLibrary, VenvSpec] = {
    PtqLibrary.NNCF: VenvSpec(
        label="NNCF",
        stamp=f"nncf=={NNCF_VERSION}",
        installs=((f"nncf=={NNCF_VERSION}", "onnx==1.23.2", "onnxruntime==1.31.1"),),
        # openvino_telemetry blocked, as the worker does: importing nncf would otherwise write ~/intel.
        check="import sys; sys.modules['openvino_telemetry'] = None; import nncf, onnx, onnxruntime",
        marker=".qdebug-ptq",
        env_var="QDEBUG_PTQ_NNCF_ENV",
        checkout_dir=".venv-ptq-nncf",
        cache_dir=f"ptq-nncf-{NNCF_VERSION}",
        make_target="make ptq-env",
        cost="~30 s, ~450 MB",
        first_use="`qdebug fix --library nncf-default` makes it",
        env=TELEMETRY_OFF,
    ),
    PtqLibrary.QUARK: VenvSpec(
        label="AMD Quark",
        stamp=f"amd-quark=={QUARK_VERSION}",
        # torch first, pinned to the CPU build: left to amd-quark's own requirement pip would take a CUDA one.
        installs=(
            ("torch==2.13.0",),
            (f"amd-quark=={QUARK_VERSION}", f"onnxruntime=={QUARK_ORT}", f"onnx=={QUARK_ONNX}", "torch==2.13.0"),
        ),
        check="import quark.onnx, onnx, onnxruntime, torch",
        marker=".qdebug-ptq",
        env_var="QDEBUG_PTQ_QUARK_ENV",
        checkout_dir=".venv-ptq-quark",
        cache_dir=f"ptq-quark-{QUARK_VERSION}",
        make_target="make ptq-env-quark",
        cost="a few minutes, ~1.5 GB",
        first_use="`qdebug fix --library quark-a8w8` makes it",
        env=TELEMETRY_OFF,
    ),
}


def ptq_env_spec(library: PtqLibrary | str) -> VenvSpec:
    """What ``library``'s environment holds and how it is made."""
    return _SPECS[PtqLibrary(library)]


def ptq_env_dir(library: PtqLibrary | str) -> Path:
    """Where ``library``'s environment lives (see the module doc)."""
    return default_venv_dir(ptq_env_spec(library))


def ensure_ptq_env(library: PtqLibrary | str, env_dir: str | Path | None = None) -> Path:
    """Create ``library``'s environment on first use and return its interpreter (raises :class:`PtqError`)."""
    return ensure_venv(ptq_env_spec(library), env_dir, error=PtqError)


def ptq_available(library: PtqLibrary | str, env_dir: str | Path | None = None) -> str | None:
    """``None`` when ``library`` can run here, else one line saying why not and the command that fixes it.

    Never raises (an unknown library is a reason too) and never creates the environment.
    """
    try:
        spec = ptq_env_spec(library)
    except ValueError:
        return f"unknown PTQ library {library!r}; known: {', '.join(PtqLibrary)}"
    ok, why = venv_status(spec, env_dir)
    return None if ok else why
