"""Deeploy's own front end and code generation, run from qdebug in Deeploy's separate environment.

These tests need the Deeploy environment. It is created once per session (``ensure_env``; ``make deeploy-env``
pre-creates it). When it cannot be created the tests skip with the reason, except under ``CI=true``, where
they fail: CI must exercise the real Deeploy.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import builders
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdebug.config import QuantConfig
from qdebug.errors import ConfigError, InputFileError, QDebugError, TargetError
from qdebug.targets.deeploy_env import (
    DEEPLOY_VERSION,
    DeeployResult,
    deeploy_available,
    default_env_dir,
    ensure_env,
    generate,
)

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "tests" / "data" / "deeploy_reference"  # vendored: see its README.md

#: Deeploy's reference networks that upstream's own driver also fails on, with the node Deeploy stops at.
FAILS_GENERIC = {"Integer_GEMM_TransB_RQ": "rqs1"}
FAILS_SIRACUSA = {"Integer_GEMM_TransB_RQ", "Integer_GEMM_Regular", "Integer_MatMul_Regular_RQ"}
#: Networks with float Quant/Dequant nodes: Deeploy accepts them, but they are not integer-only.
MIXED = {"Mixed_Quant", "Mixed_Dequant"}
#: A few Siracusa networks (of each kind) keep the runtime modest.
SIRACUSA = ["CNN_Linear2", "Integer_Conv_DW_2D_RQ", "miniMobileNet", "Integer_GEMM_Regular"]

NETWORKS = sorted(p.name for p in REFERENCE.iterdir() if (p / "network.onnx").is_file()) if REFERENCE.is_dir() else []


def _fail_or_skip(msg: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{msg} (CI=true: the Deeploy tests must run, not skip)")
    print(msg, file=sys.stderr)
    pytest.skip(msg)


@pytest.fixture(scope="session")
def deeploy_env() -> Path | str:
    """Create (or find) the Deeploy environment once per session: its python, or why it could not be made."""
    try:
        return ensure_env()
    except QDebugError as exc:
        return f"the Deeploy environment could not be created: {exc}"


@pytest.fixture
def deeploy(deeploy_env: Path | str) -> Path:
    """Marks a test as needing the Deeploy environment (skip with the reason, or fail under CI=true)."""
    if isinstance(deeploy_env, str):
        _fail_or_skip(deeploy_env)
    assert isinstance(deeploy_env, Path)
    return deeploy_env


@pytest.fixture
def reference() -> Path:
    """Deeploy's reference networks (vendored in ``tests/data/deeploy_reference``)."""
    if not NETWORKS:
        _fail_or_skip(f"Deeploy's reference networks are missing at {REFERENCE}")
    return REFERENCE


def listing(folder: Path) -> list[str]:
    """Every entry under ``folder`` (hidden ones included), relative."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def assert_generated(res: DeeployResult) -> None:
    """Deeploy succeeded and wrote non-empty Network.c / Network.h."""
    assert res.ok, res.error
    out = Path(res.out_dir)
    for name in ("Network.c", "Network.h"):
        assert name in res.files
        assert (out / name).stat().st_size > 0
    assert "RunNetwork" in (out / "Network.c").read_text()
    assert res.log_path is not None and Path(res.log_path).is_file()


# --------------------------------------------------------------------------- no environment needed


def test_fails_instead_of_skipping_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        _fail_or_skip("no env")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="no env"):
        _fail_or_skip("no env")


def test_env_dir_override_and_available_never_creates(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    where = tmp_path / "elsewhere"
    monkeypatch.setenv("QDEBUG_DEEPLOY_ENV", str(where))
    assert default_env_dir() == where
    ok, why = deeploy_available()
    assert not ok and "make deeploy-env" in why
    assert not where.exists()
    monkeypatch.delenv("QDEBUG_DEEPLOY_ENV")
    assert default_env_dir() == REPO / ".venv-deeploy"  # running from the source tree


def test_partial_env_is_not_usable(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir(parents=True)
    (tmp_path / "bin" / "python").write_text("")
    ok, why = deeploy_available(tmp_path)
    assert not ok and "incomplete" in why
    (tmp_path / ".qdebug-deeploy").write_text("0.0.1\n")  # another version's marker
    assert not deeploy_available(tmp_path)[0]


def test_pip_failure_is_a_clear_error(tmp_path: Path) -> None:
    # An interpreter that cannot make a venv: the failure names the step and carries the output's tail.
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'no venv module here' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(TargetError, match="no venv module here"):
        ensure_env(tmp_path / "env", python=fake)
    assert listing(tmp_path) == ["python"]  # the temporary environment is gone


def test_bad_arguments_raise(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="platform"):
        generate(tmp_path, tmp_path / "out", "Nope")
    with pytest.raises(InputFileError, match=r"network\.onnx"):
        generate(tmp_path, tmp_path / "out")


def test_result_round_trips() -> None:
    res = DeeployResult(True, "Generic", "/x", ("Network.c", "Network.h"), 1.5, integer_only=True)
    assert DeeployResult.from_dict(res.to_dict()) == res
    assert res.to_dict()["schema_version"] == 1 and bool(res)


# --------------------------------------------------------------------------- with Deeploy


def test_env_is_marked_with_the_version(deeploy: Path) -> None:
    env = deeploy.parent.parent
    assert (env / ".qdebug-deeploy").read_text().strip() == DEEPLOY_VERSION
    assert deeploy_available(env)[0]
    assert ensure_env(env) == deeploy  # already there: not rebuilt


@pytest.mark.parametrize("name", NETWORKS)
def test_reference_network_generic(deeploy: Path, reference: Path, name: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = generate(reference / name, out, "Generic")
    if name in FAILS_GENERIC:
        assert not res.ok
        assert res.error is not None and f"at node {FAILS_GENERIC[name]}" in res.error
        assert not out.exists()
        assert listing(tmp_path) == ["out.deeploy.log"]  # nothing half-written, the log beside it
        return
    assert_generated(res)
    assert res.integer_only is (name not in MIXED), res.float_buffers


@pytest.mark.parametrize("name", SIRACUSA)
def test_reference_network_siracusa(deeploy: Path, reference: Path, name: str, tmp_path: Path) -> None:
    res = generate(reference / name, tmp_path / "out", "Siracusa")
    if name in FAILS_SIRACUSA:
        assert not res.ok and res.error
        assert not (tmp_path / "out").exists()
        return
    assert_generated(res)
    assert res.integer_only is True


def test_qdq_model_is_rejected_naming_quantizelinear(deeploy: Path, tmp_path: Path) -> None:
    from qdebug.quantizer import quantize

    fp = tmp_path / "tiny.onnx"
    onnx.save(builders.tiny_convnet(), str(fp))
    qdq = tmp_path / "tiny.qdq.onnx"
    quantize(fp, None, QuantConfig(activation_type="int8", weight_type="int8", num_samples=4), qdq)
    out = tmp_path / "out"
    res = generate(qdq, out, "Generic")
    assert not res.ok
    # Deeploy stops at the first Q/DQ node it meets (here a weight's DequantizeLinear), naming it.
    assert res.error is not None and re.search(r"node \S+ with op type (De)?[Qq]uantizeLinear", res.error)
    assert res.integer_only is None and res.files == ()
    assert not out.exists()


def float_mlp() -> onnx.ModelProto:
    """A float Gemm → Relu → Gemm network with ops Deeploy has fp32 kernels for (no value_info: inferred)."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "float_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [w1, w2],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_float_model_is_accepted_but_not_integer_only(deeploy: Path, tmp_path: Path) -> None:
    fp = tmp_path / "float.onnx"
    onnx.save(float_mlp(), str(fp))
    res = generate(fp, tmp_path / "out", "Generic")
    assert_generated(res)
    assert res.integer_only is False and res.float_buffers


def test_failure_leaves_earlier_output_untouched(deeploy: Path, reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert generate(reference / "CNN_Linear2", out, "Generic").ok
    before = {p: (out / p).read_bytes() for p in listing(out)}
    res = generate(reference / "Integer_GEMM_TransB_RQ", out, "Generic")
    assert not res.ok
    assert {p: (out / p).read_bytes() for p in listing(out)} == before
    assert sorted(listing(tmp_path)) == sorted(["out", "out.deeploy.log", *(f"out/{p}" for p in before)])
    # A later success replaces the folder whole.
    assert generate(reference / "Integer_Add_Regular", out, "Generic").ok
    assert set(listing(out)) == {"Network.c", "Network.h", "deeploy.log"}
