"""The one exception hierarchy of qdebug, and the exit code of each kind.

Every error a user can cause derives from :class:`QDebugError`; the CLI turns it into a one-line
message and the exit code below in exactly one place (``qdebug.cli.main``). Anything else that
escapes is a bug and exits with :data:`EXIT_INTERNAL`.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_INPUT_FILE = 3
EXIT_MODEL = 4
EXIT_DATA = 5
EXIT_MISSING_EXTRA = 6
EXIT_TARGET = 7
EXIT_CLUSTER = 8
EXIT_PTQ = 9
EXIT_GATE = 10

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "success",
    EXIT_INTERNAL: "internal error (a bug: please report it with the traceback from --debug)",
    EXIT_USAGE: "bad command line or conflicting configuration",
    EXIT_INPUT_FILE: "an input file is missing, unreadable, corrupt or not ONNX/NPZ",
    EXIT_MODEL: "a model is of the wrong kind (QOperator, dynamic quantization, float/quant mismatch, ...)",
    EXIT_DATA: "calibration/debug data do not fit the model (names, shapes, dtypes, NaN/Inf, empty)",
    EXIT_MISSING_EXTRA: "an optional dependency is not installed (the message names the pip extra)",
    EXIT_TARGET: "a target backend (QNN, Deeploy) failed",
    EXIT_CLUSTER: "the Ray cluster could not be started or reached, or its workers kept failing",
    EXIT_PTQ: "a third-party PTQ library (NNCF, AMD Quark) is missing its environment or failed on the model",
    EXIT_GATE: "a quality gate failed (e.g. --fail-below)",
}


class QDebugError(Exception):
    """Base class of every error qdebug raises on purpose."""

    exit_code: int = EXIT_INTERNAL


class ConfigError(QDebugError, ValueError):
    """Invalid or conflicting options."""

    exit_code = EXIT_USAGE


class InputFileError(QDebugError):
    """A file the user passed is missing, unreadable, corrupt or of the wrong format."""

    exit_code = EXIT_INPUT_FILE


class ModelError(QDebugError):
    """A model is valid ONNX but not what the operation needs.

    ``role`` says which of several models is at fault ("float model", "quantized model") when the code raising it
    sees only protos, so that the caller, which knows the files, can name the right one (``reason`` is the message
    without the role).
    """

    exit_code = EXIT_MODEL

    def __init__(self, message: str = "", *, role: str | None = None) -> None:
        super().__init__(f"{role}: {message}" if role else message)
        self.role = role
        self.reason = message


class DataError(QDebugError, ValueError):
    """Calibration or debug data do not fit the model."""

    exit_code = EXIT_DATA


class MissingExtraError(QDebugError, ImportError):
    """An optional backend is not installed."""

    exit_code = EXIT_MISSING_EXTRA

    def __init__(self, module: str, extra: str, purpose: str) -> None:
        self.module = module
        self.extra = extra
        super().__init__(
            f"{purpose} needs the optional package '{module}', which is not installed: pip install 'qdebug[{extra}]'"
        )


class TargetError(QDebugError):
    """A compile target (QNN, Deeploy) rejected the model or failed."""

    exit_code = EXIT_TARGET


class ClusterError(QDebugError):
    """The Ray cluster could not be started or reached, or a shard kept failing after its retries."""

    exit_code = EXIT_CLUSTER


class QualityGateError(QDebugError):
    """A user-requested quality threshold was not met."""

    exit_code = EXIT_GATE


class PtqError(QDebugError):
    """A third-party PTQ library (NNCF, AMD Quark) is not set up, or failed on a model."""

    exit_code = EXIT_PTQ
