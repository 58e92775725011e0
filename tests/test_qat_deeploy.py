"""The QAT-to-Deeploy path end to end: a decomposed-QCDQ QAT export (tests/qat_models.py) → ``qat.canonicalize`` →
``debug`` against its float parent → ``deeploy_snap`` → ``deeploy_export.export`` → Deeploy code generation for
Generic (the real Deeploy environment; fails, not skips, under ``CI=true``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import qat_models as qm
from test_deeploy_env import deeploy, deeploy_env  # noqa: F401  (fixtures)

from qdebug import qat
from qdebug.debugger import DebugOptions, debug
from qdebug.targets import deeploy_env as denv
from qdebug.targets import deeploy_export as de
from qdebug.targets.deeploy_snap import snap_scales_for_deeploy


def test_qcdq_qat_model_canonicalizes_debugs_exports_and_generates(deeploy: Path, tmp_path: Path) -> None:  # noqa: F811
    canonical = qat.canonicalize(qm.qat_convnet("qcdq"), output=tmp_path / "canon.onnx")
    assert canonical.path is not None

    report = debug(qm.float_parent(), canonical.path, None, DebugOptions(num_samples=8))
    found = {a.tensor_name for a in report.activations if a.quantized}
    assert found == set(qm.ACT_POINTS)
    assert all(a.quant_type == "int8" for a in report.activations if a.quantized)

    rng = np.random.default_rng(3)
    data = {"x": rng.uniform(-1.0, 1.0, (64, *qm.INPUT_SHAPE[1:])).astype(np.float32)[:, None]}
    as_is = de.export(canonical.path, tmp_path / "as_is", data=data, verbose=False, num_samples=64)
    assert as_is.max_lsb_diff <= 1 and as_is.equal_fraction > 0.9, as_is
    # Snapped (what build/recompile for Deeploy export): every requantization exact in int32 (docs/deeploy.md).
    snapped, rep = snap_scales_for_deeploy(onnx.load(str(canonical.path)))
    assert not rep.skipped, rep.skipped  # the Gemm behind the unquantized Flatten is snapped too
    exported = de.export(snapped, tmp_path / "net", data=data, verbose=False, num_samples=64)
    assert exported.max_lsb_diff <= 1 and exported.equal_fraction >= 0.999, exported
    assert {"network.onnx", "inputs.npz", "outputs.npz"} <= {p.name for p in (tmp_path / "net").iterdir()}

    res = denv.generate(tmp_path / "net", tmp_path / "generic", "Generic")
    assert res.ok, res.error
    assert (tmp_path / "generic" / "Network.c").is_file() and (tmp_path / "generic" / "Network.h").is_file()
    assert res.integer_only is True, res.float_buffers
