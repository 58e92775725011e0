"""What a QNN compile targets and how: the SoCs (:data:`SOC_MODELS`), :class:`QnnOptions` (validated on construction,
mapped to the provider's options in one place) and whether onnxruntime-qnn is usable here (:func:`qnn_available`,
without importing it)."""

from __future__ import annotations

import math
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qdebug._lazy import OPTIONAL_MODULES
from qdebug.errors import ConfigError, MissingExtraError
from qdebug.targets.base import BuildOptions

__all__ = [
    "CPU_EP",
    "DEFAULT_HTP_ARCH",
    "DEFAULT_OPTIONS",
    "QNN_EP",
    "SOC_MODELS",
    "V73_SOC",
    "QnnOptions",
    "qnn_available",
    "qnn_options",
]

QNN_EP = "QNNExecutionProvider"
CPU_EP = "CPUExecutionProvider"

#: SoC name → (QNN ``soc_model`` id, HTP architecture). Without a SoC the provider's default is used,
#: an HTP v68 (SM8350) on x86.
SOC_MODELS: dict[str, tuple[int, str]] = {
    "SM8350": (30, "v68"),
    "SM8450": (36, "v69"),
    "SM8475": (42, "v69"),
    "SM8550": (43, "v73"),
    "SM8635": (68, "v73"),
    "SM8650": (57, "v75"),
    "SM8735": (85, "v79"),
    "SM8750": (69, "v79"),
    "SM8850": (87, "v81"),
}
DEFAULT_HTP_ARCH = "v68"

#: The SoC a build compiles for when no --soc is given but the model needs HTP v73 (the oldest SoC that has it).
V73_SOC = "SM8550"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class QnnOptions:
    """How to compile for (and run on) the QNN HTP. Validated on construction.

    ``soc`` is a name of :data:`SOC_MODELS` (case-insensitive; ``None``: the provider's default, HTP
    v68). ``fail_on_fallback`` makes a compile that leaves any node on the CPU (graph-I/O Q/DQ aside) a
    failure. ``enable_fp16`` runs float parts in fp16 on the HTP; it needs ``soc`` because without a
    ``soc_model`` QNN silently takes no node of a float model. ``timeout_s`` bounds the compile.
    """

    soc: str | None = None
    fail_on_fallback: bool = False
    enable_fp16: bool = False
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        problems: list[str] = []
        if self.soc is not None:
            norm = str(self.soc).strip().upper()
            if norm in SOC_MODELS:
                object.__setattr__(self, "soc", norm)
            else:
                problems.append(f"unknown soc {self.soc!r}; known: {', '.join(SOC_MODELS)}")
        for flag in ("fail_on_fallback", "enable_fp16"):
            if not isinstance(getattr(self, flag), bool):
                problems.append(f"{flag} must be true or false, got {getattr(self, flag)!r}")
        if self.enable_fp16 is True and self.soc is None:
            problems.append(
                "enable_fp16 needs a soc (e.g. soc='SM8650'): without a soc_model QNN silently takes no node "
                "of a float model"
            )
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t <= 0:
            problems.append(f"timeout_s must be a positive number of seconds, got {t!r}")
        if problems:
            raise ConfigError("invalid QNN options: " + "; ".join(problems))

    @property
    def soc_model(self) -> int | None:
        """QNN's ``soc_model`` id, ``None`` for the provider's default."""
        return SOC_MODELS[self.soc][0] if self.soc else None

    @property
    def htp_arch(self) -> str:
        """The HTP architecture compiled for (``v68`` by default)."""
        return SOC_MODELS[self.soc][1] if self.soc else DEFAULT_HTP_ARCH

    def device_label(self) -> str:
        """E.g. ``"SM8650 (HTP v75)"`` or ``"default SoC (HTP v68)"``."""
        return f"{self.soc or 'default SoC'} (HTP {self.htp_arch})"

    def provider_options(self) -> dict[str, str]:
        """The QNN provider options these options map to (the only place that maps them)."""
        opts = {"backend_type": "htp"}
        if self.soc_model is not None:
            opts["soc_model"] = str(self.soc_model)
        if self.enable_fp16:
            opts["enable_htp_fp16_precision"] = "1"
        return opts

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "soc": self.soc,
            "fail_on_fallback": self.fail_on_fallback,
            "enable_fp16": self.enable_fp16,
            "timeout_s": self.timeout_s,
        }

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> QnnOptions:
        """Build from a plain mapping (e.g. the target interface's ``options``); strings are parsed.

        Unknown keys and unparsable values are reported together in one :class:`ConfigError`.
        """
        known = ("soc", "fail_on_fallback", "enable_fp16", "timeout_s")
        problems = [f"unknown QNN option {k!r}; known: {', '.join(known)}" for k in options if k not in known]
        kw: dict[str, Any] = {}
        if "soc" in options:
            soc = options["soc"]
            kw["soc"] = None if soc is None or (isinstance(soc, str) and not soc.strip()) else soc
        for flag in ("fail_on_fallback", "enable_fp16"):
            if flag in options:
                v = options[flag]
                if isinstance(v, str) and v.strip().lower() in _TRUE | _FALSE:
                    v = v.strip().lower() in _TRUE
                kw[flag] = v
        if "timeout_s" in options:
            v = options["timeout_s"]
            if isinstance(v, str):
                try:
                    v = float(v)
                except ValueError:
                    problems.append(f"timeout_s must be a number of seconds, got {v!r}")
            kw["timeout_s"] = v
        if problems:
            raise ConfigError("invalid QNN options: " + "; ".join(problems))
        return cls(**kw)


#: The options a caller gives none of: the provider's default SoC, fallback allowed, no fp16, a 600 s compile.
DEFAULT_OPTIONS = QnnOptions()


def qnn_available() -> tuple[bool, str]:
    """(usable here, a short description or why not); never raises.

    Looks for the package and its provider library without importing either: listing targets (the UI's
    dropdown, ``qdebug targets``) must not load optional backends.
    """
    try:
        import importlib.util
        from importlib.metadata import PackageNotFoundError, version

        spec = importlib.util.find_spec("onnxruntime_qnn")
        if spec is None or not spec.submodule_search_locations:
            extra, purpose = OPTIONAL_MODULES["onnxruntime_qnn"]
            return False, str(MissingExtraError("onnxruntime_qnn", extra, purpose))
        pkg_dir = Path(next(iter(spec.submodule_search_locations)))
        libs = [p for p in pkg_dir.rglob("*onnxruntime_providers_qnn*") if p.suffix in (".so", ".dll")]
        if not libs:
            return False, f"onnxruntime_qnn is installed but has no provider library under {pkg_dir}"
        import onnxruntime as ort

        if not hasattr(ort, "register_execution_provider_library"):
            return False, f"onnxruntime {ort.__version__} cannot load the QNN plugin provider (too old)"
        try:
            ver = version("onnxruntime-qnn")
        except PackageNotFoundError:
            ver = "?"
        where = "HTP simulator" if platform.machine().lower() in ("x86_64", "amd64") else "HTP"
        return True, f"onnxruntime-qnn {ver} ({where})"
    except Exception as exc:  # a broken install can raise anything
        return False, f"onnxruntime-qnn is unusable here: {type(exc).__name__}: {exc}"


def qnn_options(options: BuildOptions) -> QnnOptions:
    """The :class:`QnnOptions` of a QNN build (an unknown SoC is a ConfigError there)."""
    return QnnOptions(
        soc=options.soc,
        fail_on_fallback=options.fail_on_fallback,
        enable_fp16=not options.quantized,
        timeout_s=float(options.timeout_s),
    )
