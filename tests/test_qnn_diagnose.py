"""The QNN build's diagnosis: bisection wired into ``qdebug build`` and the remedies for the located region.

Real ONNX Runtime and onnxruntime-qnn (the HTP simulator); tests needing it fail under CI=true when it is missing.
The model is the sample CNN with its BatchNorms kept, at uint16: the HTP computes the block's first BatchNorm
badly (docs/qnn.md), which is a located region with a known fix to find.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import builders
import numpy as np
import onnx
import pytest
from conftest import CliResult
from onnx import TensorProto, helper, numpy_helper
from test_qnn_fixes import require_qnn

from qdebug.build import BuildOptions, build
from qdebug.build_manifest import BuildManifest
from qdebug.config import QuantConfig
from qdebug.errors import ConfigError
from qdebug.mixed.overrides import OverridesFile
from qdebug.model_io import is_dq, is_q
from qdebug.ort import make_session
from qdebug.quantizer import quantize
from qdebug.report import TargetAccuracy, TargetOutputAccuracy
from qdebug.targets.base import BisectMode
from qdebug.targets.qnn_compile import load_compiled
from qdebug.targets.qnn_diagnose import bisect_reason
from qdebug.targets.qnn_diagnosis_record import MANIFEST_KEY, LocatedBy, QnnDiagnosis, RemedyKind
from qdebug.targets.qnn_remedies import float_region

SAMPLES = Path(__file__).resolve().parents[1] / "sample_models"
CNN, CALIB = SAMPLES / "digits_cnn.onnx", SAMPLES / "digits_calib.npz"
BN_RELU = "/block/body/body.0/body.0.2/Relu_output_0"


@pytest.fixture
def qnn() -> None:
    """Marks a test as needing the real QNN backend."""
    require_qnn()


def _acc(htp: float, cpu: float, *, probe: float | None, flagged: bool = False) -> TargetAccuracy:
    from qdebug.report import TargetTensorDiff

    t = TargetTensorDiff("t", 0, "uint16", 3, 0.5, 20.0, excess_noise_ratio=5.0 if flagged else 0.1, flagged=flagged)
    return TargetAccuracy(
        "qnn", "x", 4, 0.1, (TargetOutputAccuracy("y", htp, cpu, None),), tensors=(t,), probe_vs_compiled=probe
    )


def test_bisection_runs_when_the_probe_cannot_be_trusted_and_something_diverges() -> None:
    auto = BisectMode.AUTO
    assert bisect_reason(auto, _acc(20.0, 35.0, probe=265.0, flagged=True)) is not None  # the detector's case
    assert bisect_reason(auto, _acc(20.0, 35.0, probe=0.0, flagged=True)) is None  # the probe's verdict stands
    assert bisect_reason(auto, _acc(34.9, 35.0, probe=3.0)) is None  # nothing to locate
    assert "no per-tensor probe" in str(bisect_reason(auto, _acc(20.0, 35.0, probe=None)))
    assert bisect_reason(BisectMode.NEVER, _acc(20.0, 35.0, probe=265.0, flagged=True)) is None
    assert bisect_reason(BisectMode.ALWAYS, _acc(35.0, 35.0, probe=0.0)) is not None
    assert BuildOptions("qnn", "uint8", bisect="Always").bisect is BisectMode.ALWAYS
    with pytest.raises(ConfigError, match="bisect 'sometimes'"):
        BuildOptions("qnn", "uint8", bisect="sometimes")
    with pytest.raises(ConfigError, match="--bisect applies to --target qnn"):
        BuildOptions("cpu", "uint8", bisect="always")
    with pytest.raises(ConfigError, match="--remedies applies to --target qnn"):
        BuildOptions("cpu", "uint8", remedies=True)  # off by default (issue 37): asking for them is the option


def _conv_relu_mul(tmp: Path) -> tuple[Path, Path]:
    """x → Conv → Relu → Mul(x2) → y, quantized for QNN (the quantizer fuses the Relu into the Conv's output Q)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((4, 2, 3, 3)) * 0.4).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32) * 0.1, "b")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Mul", ["r", "r"], ["y"], name="mul"),
    ]
    model = builders._model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
        [w, b],
    )
    fpath = tmp / "crm.onnx"
    onnx.save(model, str(fpath))
    qdq = quantize(fpath, None, QuantConfig(target="qnn", num_samples=8), tmp / "crm.qdq.onnx", check=False)
    return fpath, Path(qdq.model_path)


def test_float_region_computes_the_region_in_float_with_its_fused_relu(tmp_path: Path) -> None:
    fpath, qpath = _conv_relu_mul(tmp_path)
    fmodel, qmodel = onnx.load(str(fpath)), onnx.load(str(qpath))
    assert not any(n.op_type == "Relu" for n in qmodel.graph.node)  # fused into the Conv's output Q
    out = float_region(qmodel, ["conv", "relu"], fmodel)
    conv = next(n for n in out.graph.node if n.name == "conv")
    inits = {t.name for t in out.graph.initializer}
    assert conv.input[1] in inits and conv.input[2] in inits  # float weights and bias, no DequantizeLinear
    producers = {o: n for n in out.graph.node for o in n.output}
    relu = next(n for n in out.graph.node if n.op_type == "Relu")  # put back: the removed Q was its clamp
    assert relu.input[0] == conv.output[0] and relu.output[0] == "r"
    assert not any(is_q(n) and n.input[0] == "r" for n in out.graph.node)
    assert all(i == "r" for i in next(n for n in out.graph.node if n.name == "mul").input)
    read = {i for n in out.graph.node for i in n.input} | {o.name for o in out.graph.output}
    assert all(n.output[0] in read for n in out.graph.node if is_dq(n))  # no dangling weight DQ (HTP error 3110)
    assert producers["r"] is relu
    onnx.checker.check_model(out)
    # The region in float is closer to the float model than the QDQ model (same numbers otherwise).
    x = {"x": np.random.default_rng(3).uniform(-1, 1, (1, 2, 6, 6)).astype(np.float32)}
    f = make_session(fmodel, ["CPUExecutionProvider"]).run(None, x)[0]
    q = make_session(qmodel, ["CPUExecutionProvider"]).run(None, x)[0]
    r = make_session(out, ["CPUExecutionProvider"]).run(None, x)[0]
    assert float(np.sum((r - f) ** 2)) < float(np.sum((q - f) ** 2))


@pytest.fixture(scope="module")
def bn_kept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, BuildManifest]:
    """The sample CNN with its BatchNorms kept at uint16, built with bisection forced and the remedies on."""
    require_qnn()
    out = tmp_path_factory.mktemp("diag") / "cnn16"
    opts = BuildOptions(
        "qnn", "uint16", skip_fixes=("batchnorm_folding",), debug_samples=8, bisect="always", remedies=True
    )
    res = build(CNN, out, opts, data=CALIB)
    return out, res.manifest


def test_build_bisects_and_names_the_batchnorm_region(qnn: None, bn_kept: tuple[Path, BuildManifest]) -> None:
    _, m = bn_kept
    d = QnnDiagnosis.from_dict(m.target_details[MANIFEST_KEY])
    assert d.located_by is LocatedBy.BISECTION and d.first_divergent == BN_RELU
    assert d.probe_first_divergent == BN_RELU  # the probe agrees on this model (it did not on the detector)
    b = d.bisection
    assert b is not None and b.first_divergent == BN_RELU
    assert b.compiles <= math.ceil(math.log2(b.candidates)) + 2 and b.seconds > 0
    assert b.ratio_of(BN_RELU) is not None and b.ratio_of(BN_RELU) > 50  # type: ignore[operator]
    assert ("BatchNormalization", "/block/body/body.0/body.0.1/BatchNormalization") in d.region_nodes
    assert BN_RELU in d.region_tensors
    assert json.loads(json.dumps(d.to_dict())) == d.to_dict() and QnnDiagnosis.from_dict(d.to_dict()) == d
    assert "diagnose_s" in m.timings


def test_remedies_are_measured_and_the_fp16_region_is_chosen(qnn: None, bn_kept: tuple[Path, BuildManifest]) -> None:
    out, m = bn_kept
    d = QnnDiagnosis.from_dict(m.target_details[MANIFEST_KEY])
    r = d.remedies
    assert r is not None and r.baseline_db is not None and r.cpu_vs_float_db is not None
    assert r.baseline_db < r.cpu_vs_float_db - 15  # measured 8.8 vs 37.7 dB
    kinds = {t.kind for t in r.trials}
    assert {RemedyKind.PER_CHANNEL, RemedyKind.SOC, RemedyKind.FP16_REGION} <= kinds
    assert dict(r.skipped)[RemedyKind.REGION_16BIT] == "activations are already uint16"
    assert all(t.ok and t.target_vs_float_db is not None for t in r.trials)
    # Neither another HTP architecture nor per-channel weights fix the HTP's BatchNorm; computing it in fp16 does.
    assert all(abs(t.gain_db or 0.0) < 1.0 for t in r.trials if t.kind is not RemedyKind.FP16_REGION)
    best = r.best
    assert best is not None and best.kind is RemedyKind.FP16_REGION
    assert best.gain_db is not None and best.gain_db > 20  # measured +30.6 dB (39.3 dB vs float)
    assert best.partitions == 1 and best.cpu_nodes == 0
    for role in ("remedy_qdq_model", "remedy_compiled_model"):
        assert m.files[role] == r.files[role] and (out / r.files[role]).is_file()
    _, graph = load_compiled(out / r.files["remedy_compiled_model"])
    assert graph.partitions == 1  # the remedy recompiled into one partition


def test_a_quantization_remedy_is_exported_as_overrides(qnn: None, tmp_path: Path) -> None:
    # At uint8 with the BatchNorms kept, keeping the region in 16 bits is tried through the mixed-precision
    # overrides; whichever remedy wins, a quantization one comes with an overrides file the build takes back.
    out = tmp_path / "cnn8"
    opts = BuildOptions(
        "qnn", "uint8", skip_fixes=("batchnorm_folding",), debug_samples=8, bisect="never", remedies=True
    )
    m = build(CNN, out, opts, data=CALIB).manifest
    d = QnnDiagnosis.from_dict(m.target_details[MANIFEST_KEY])
    assert d.located_by is LocatedBy.PROBE and d.remedies is not None
    t16 = next(t for t in d.remedies.trials if t.kind is RemedyKind.REGION_16BIT)
    assert t16.ok and t16.partitions == 1 and t16.gain_db is not None
    best = d.remedies.best
    if best is not None and best.kind in (RemedyKind.REGION_16BIT, RemedyKind.PER_CHANNEL):
        ofile = OverridesFile.load(out / d.remedies.files["remedy_overrides"])
        assert ofile.note.startswith("qdebug build remedy")


def test_cli_prints_the_bisection_and_the_remedies(
    qnn: None, run_cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    res = run_cli(
        "build", "-f", CNN, "--target", "qnn", "--precision", "uint16", "--skip-fix", "batchnorm_folding",
        "--calib", CALIB, "--debug-samples", "4", "--bisect", "always", "--no-remedies", "-o", tmp_path / "o",
    )  # fmt: skip
    assert res.code == 0, res.stderr
    assert f"bisection over prefix compiles (asked for (--bisect always)): first divergent {BN_RELU}" in res.out
    assert "divergent region (bisection): BatchNormalization" in res.out
    assert "remedies for the region" not in res.out
    m = BuildManifest.load(tmp_path / "o" / "manifest.json")
    assert m.target_details[MANIFEST_KEY]["remedies"] is None
