"""What a build leaves behind: :class:`BuildManifest` (``manifest.json``: every input with its sha256, the config, the
fixes, the quantization and compile figures, the accuracy and the timings, paths relative to it) and
:class:`BuildResult`, the folder and its manifest.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qdebug.config import QuantConfig
from qdebug.io import load_json
from qdebug.passes import PassReport
from qdebug.quantizer import QuantizeResult
from qdebug.report import DebugReport, TargetAccuracy, encode_number
from qdebug.targets.compile_report import CompileReport

#: 2: the target's own entries (e.g. ``deeploy``, ``onnxruntime_qnn_version``) appear only for that target
#: (version 1 wrote both, ``null`` when unused); version-1 manifests are still read.
MANIFEST_SCHEMA_VERSION = 4  # 3: the target check's divergence fields; 4: ``skipped``
_MANIFEST_KEYS = frozenset(
    {
        "schema_version",
        "qdebug_version",
        "onnxruntime_version",
        "device",
        "precision",
        "soc",
        "inputs",
        "config",
        "fixes",
        "quantization",
        "compile",
        "accuracy",
        "timings",
        "files",
        "warnings",
        "skipped",
    }
)


@dataclass(frozen=True)
class InputFile:
    """One input of the build: its role, where it was read from, and its sha256 (a folder: over its files)."""

    role: str
    path: str
    sha256: str


@dataclass(frozen=True)
class OutputSqnr:
    """A model output's SQNR (dB) of some model against the float model, with the reason when undefined."""

    output_name: str
    sqnr_db: float | None
    status: str


@dataclass(frozen=True)
class TopOne:
    """Top-1 accuracy on the labelled evaluation set (``None`` for a model that was not built)."""

    num_samples: int
    float_model: float
    qdq_model: float | None
    compiled_model: float | None


@dataclass(frozen=True)
class BuildManifest:
    """What ``manifest.json`` holds. File paths are relative to the output folder."""

    qdebug_version: str
    onnxruntime_version: str
    device: str
    precision: str
    soc: str | None
    inputs: tuple[InputFile, ...]
    config: QuantConfig | None
    fixes: tuple[PassReport, ...]
    quantization: QuantizeResult | None
    compile: CompileReport
    num_debug_samples: int
    cpu_qdq_vs_float: tuple[OutputSqnr, ...]
    target_accuracy: TargetAccuracy | None
    top1: TopOne | None
    timings: Mapping[str, float]
    files: Mapping[str, str]
    warnings: tuple[str, ...] = ()
    #: the target's own top-level entries (:attr:`qdebug.targets.base.Compiled.manifest`), e.g. QNN's
    #: ``onnxruntime_qnn_version`` or Deeploy's ``deeploy`` section (export, snapping, code generation per platform;
    #: paths relative to the output folder)
    target_details: Mapping[str, Any] = field(default_factory=dict)
    #: the steps of the build not run and why, one line each (e.g. the remedies: not asked for, or over the
    #: ``--time-budget``); the CLI prints them with the command that runs them
    skipped: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``schema_version`` (+inf SQNR as the string ``"inf"``)."""
        return {
            "schema_version": MANIFEST_SCHEMA_VERSION,
            "qdebug_version": self.qdebug_version,
            "onnxruntime_version": self.onnxruntime_version,
            "device": self.device,
            "precision": self.precision,
            "soc": self.soc,
            "inputs": [vars(i).copy() for i in self.inputs],
            "config": None if self.config is None else self.config.to_dict(),
            "fixes": [f.to_dict() for f in self.fixes],
            "quantization": None if self.quantization is None else self.quantization.to_dict(),
            "compile": self.compile.to_dict(),
            "accuracy": {
                "num_debug_samples": self.num_debug_samples,
                "cpu_qdq_vs_float": [
                    {"output_name": o.output_name, "sqnr_db": encode_number(o.sqnr_db), "status": o.status}
                    for o in self.cpu_qdq_vs_float
                ],
                "target": None if self.target_accuracy is None else self.target_accuracy.to_dict(),
                "top1": None if self.top1 is None else vars(self.top1).copy(),
            },
            "timings": dict(self.timings),
            "files": dict(self.files),
            "warnings": list(self.warnings),
            "skipped": list(self.skipped),
            **json.loads(json.dumps(dict(self.target_details))),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BuildManifest:
        """Inverse of :meth:`to_dict`; refuses other schema versions."""
        from qdebug.errors import InputFileError
        from qdebug.report import decode_number

        if d.get("schema_version") not in (1, 2, 3, MANIFEST_SCHEMA_VERSION):
            raise InputFileError(f"build manifest schema_version {d.get('schema_version')!r} is not supported")
        acc = d["accuracy"]
        details = {k: v for k, v in d.items() if k not in _MANIFEST_KEYS and v is not None}  # v1 wrote nulls
        return cls(
            qdebug_version=d["qdebug_version"],
            onnxruntime_version=d["onnxruntime_version"],
            device=d["device"],
            precision=d["precision"],
            soc=d.get("soc"),
            inputs=tuple(InputFile(**i) for i in d["inputs"]),
            config=None if d["config"] is None else QuantConfig.from_dict(d["config"]),
            fixes=tuple(PassReport.from_dict(f) for f in d["fixes"]),
            quantization=None if d["quantization"] is None else QuantizeResult.from_dict(d["quantization"]),
            compile=CompileReport.from_dict(d["compile"]),
            num_debug_samples=acc["num_debug_samples"],
            cpu_qdq_vs_float=tuple(
                OutputSqnr(o["output_name"], decode_number(o["sqnr_db"]), o["status"]) for o in acc["cpu_qdq_vs_float"]
            ),
            target_accuracy=None if acc["target"] is None else TargetAccuracy.from_dict(acc["target"]),
            top1=None if acc["top1"] is None else TopOne(**acc["top1"]),
            timings=dict(d["timings"]),
            files=dict(d["files"]),
            warnings=tuple(d.get("warnings", ())),
            target_details=details,
            skipped=tuple(d.get("skipped", ())),
        )

    def to_json(self) -> str:
        """Strict JSON text."""
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"

    @classmethod
    def load(cls, path: str | Path) -> BuildManifest:
        """Read ``manifest.json``."""
        from qdebug.errors import InputFileError

        try:
            return cls.from_dict(load_json(path, "build manifest"))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise InputFileError(f"{path}: not a qdebug build manifest ({exc})") from exc


@dataclass(frozen=True)
class BuildResult:
    """What :func:`~qdebug.build.build` wrote into ``out_dir`` (``manifest``) and the in-memory debug report."""

    out_dir: Path
    manifest: BuildManifest
    report: DebugReport | None

    def path(self, role: str) -> Path:
        """Absolute path of an output file by role (``float_model``, ``qdq_model``, ``compiled_model``, ...)."""
        return self.out_dir / self.manifest.files[role]

    def to_dict(self) -> dict[str, Any]:
        """The manifest's dict."""
        return self.manifest.to_dict()
