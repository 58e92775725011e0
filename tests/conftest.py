"""Shared fixtures: tiny models on disk, cached quantizations, and helpers for hashing and the CLI."""

from __future__ import annotations

import hashlib
import io
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

# before anything imports ONNX Runtime (builders does): its telemetry would write into the test's TMPDIR and ~/.cache
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

import onnx
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import builders

from qdebug.config import QuantConfig

REPO = Path(__file__).resolve().parents[1]
SAMPLE_MODELS = REPO / "sample_models"

#: The quantizations of ``tiny_convnet`` the tests use, by short name.
TINY_CONFIGS: dict[str, QuantConfig] = {
    "u8": QuantConfig(activation_type="uint8", weight_type="uint8", num_samples=16),
    "u16_qnn": QuantConfig(activation_type="uint16", weight_type="uint8", target="qnn", num_samples=16),
    "s8_per_channel": QuantConfig(activation_type="int8", weight_type="int8", per_channel=True, num_samples=16),
}

#: ``tiny_convnet`` in uint8 with a mixed-precision convert: ``r1`` is also given to ``conv2`` in uint16.
TINY_R1_CONVERT = QuantConfig(
    num_samples=8,
    tensor_overrides={"r1": [{"quant_type": "uint8", "convert": {"quant_type": "uint16", "recv_nodes": ["conv2"]}}]},
)


def sha256(path: str | Path) -> str:
    """Checksum of one file."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tree_hashes(root: Path) -> dict[str, str]:
    """Checksums of every file under ``root`` (to prove inputs were not modified)."""
    return {str(p.relative_to(root)): sha256(p) for p in sorted(root.rglob("*")) if p.is_file()}


def save(model: onnx.ModelProto, path: Path) -> Path:
    """Save a model and return its path."""
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="session", autouse=True)
def compiled_kernel() -> None:
    """The C kernel built before any test runs: ``auto`` reduces with it from the first sample only once it is built
    (:func:`qdebug.capture.compiled.ready`), so without this the first tests to capture would see another choice
    than the rest. ``make test`` installs gcc: a failed build is a failure of every test, never a skip."""
    from qdebug.capture.kernels import c_kernel

    c_kernel.load()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A session-wide folder for models shared by many tests (never modified by them)."""
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_float(model_dir: Path) -> Path:
    """``tiny_convnet`` saved to disk."""
    return save(builders.tiny_convnet(), model_dir / "tiny.onnx")


@pytest.fixture(scope="session")
def tiny_quant(tiny_float: Path, model_dir: Path) -> Callable[[str], Path]:
    """``tiny_quant(name)``: ``tiny_convnet`` quantized by qdebug with ``TINY_CONFIGS[name]`` (cached)."""
    from qdebug.quantizer import quantize

    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            out = model_dir / f"tiny.{name}.qdq.onnx"
            quantize(tiny_float, None, TINY_CONFIGS[name], out, per_channel_fallback=False)  # the config's own recipe
            cache[name] = out
        return cache[name]

    return get


@dataclass
class CliResult:
    """Exit code and the three streams of one in-process CLI run."""

    code: int
    out: str
    stdout: str
    stderr: str


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """Run ``qdebug.cli.main(argv)`` in-process and capture ``out`` (tables/JSON), stdout and stderr."""
    from qdebug.cli import main

    def run(*argv: str | Path) -> CliResult:
        capsys.readouterr()
        buf = io.StringIO()
        code = main([str(a) for a in argv], out=buf)
        captured = capsys.readouterr()
        return CliResult(code, buf.getvalue(), captured.out, captured.err)

    return run


def assert_one_line_error(result: CliResult, code: int, *needles: str) -> None:
    """The CLI failed with ``code`` and a single-line ``qdebug: error:`` message containing ``needles``."""
    assert result.code == code, (result.code, result.stderr)
    err = result.stderr.strip()
    assert "Traceback" not in result.stderr
    assert err.count("\n") == 0, err
    assert err.startswith("qdebug: error:"), err
    for n in needles:
        assert n in err, (n, err)


def all_files(paths: Iterable[Path]) -> dict[str, str]:
    """Checksums of some files."""
    return {str(p): sha256(p) for p in paths}
