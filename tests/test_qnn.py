"""The QNN HTP target with the real onnxruntime-qnn (HTP simulator on x86): compile, log parsing, fallback,
failures, SoC selection, running, and HTP-vs-CPU accuracy. No mocks.

Tests that need onnxruntime-qnn skip with the reason when it is missing, except under ``CI=true``, where
they fail: CI must exercise the real backend.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import builders
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdebug.config import QuantConfig
from qdebug.data import Limited, NpzData, SyntheticData
from qdebug.debugger import DebugOptions, debug
from qdebug.errors import ConfigError, InputFileError, MissingExtraError, ModelError
from qdebug.model_io import input_specs, load_model
from qdebug.pairing import pair_models
from qdebug.quantizer import quantize
from qdebug.report import TargetAccuracy
from qdebug.targets import available_targets, get_target
from qdebug.targets.model_fixes import fold_batchnorm
from qdebug.targets.qnn_accuracy import htp_accuracy
from qdebug.targets.qnn_bisect import bisect_divergence
from qdebug.targets.qnn_compile import compile_qnn
from qdebug.targets.qnn_log import parse_compile_log
from qdebug.targets.qnn_options import SOC_MODELS, QnnOptions, qnn_available
from qdebug.targets.qnn_session import qnn_session, run_compiled

SAMPLES = Path(__file__).resolve().parents[1] / "sample_models"


def require_qnn() -> None:
    """Skip (with the reason) when onnxruntime-qnn is unusable; under CI=true fail instead."""
    ok, why = qnn_available()
    if ok:
        return
    msg = f"onnxruntime-qnn is not usable here: {why}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{msg} (CI=true: the QNN tests must run, not skip)")
    print(msg, file=sys.stderr)
    pytest.skip(msg)


@pytest.fixture
def qnn() -> None:
    """Marks a test as needing the real QNN backend."""
    require_qnn()


def listing(folder: Path) -> set[str]:
    """Every entry of a folder, hidden ones included (temp leftovers would show here)."""
    return {p.name for p in folder.iterdir()}


# --------------------------------------------------------------------------- models


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def conv_erf_conv() -> onnx.ModelProto:
    """Conv → Erf → Conv: QNN rejects the Erf, so it falls back to the CPU between two HTP partitions."""
    rng = np.random.default_rng(1)
    w1 = numpy_helper.from_array((rng.standard_normal((4, 1, 3, 3)) * 0.5).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32), "w2")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Erf", ["c1"], ["e"], name="erf"),
        helper.make_node("Conv", ["e", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 6, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])
    return builders._model(nodes, [x], [y], [w1, w2])


def erf_only() -> onnx.ModelProto:
    """x → Erf → y: once quantized, nothing in it is for QNN (graph-I/O Q/DQ stay on the CPU by design)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    return builders._model([helper.make_node("Erf", ["x"], ["y"], name="erf")], [x], [y])


@pytest.fixture(scope="module")
def models(model_dir: Path, tiny_float: Path, tiny_quant: Callable[[str], Path]) -> dict[str, Path]:
    """QDQ models quantized by qdebug for the qnn target (shared by the module's tests)."""
    out: dict[str, Path] = {"tiny_float": tiny_float, "tiny_u16": tiny_quant("u16_qnn")}
    qnn8 = QuantConfig(target="qnn", num_samples=8)
    for name, model in (("conv_erf", conv_erf_conv()), ("erf_only", erf_only())):
        f = _save(model, model_dir / f"{name}.onnx")
        out[name] = Path(quantize(f, None, qnn8, model_dir / f"{name}.qnn.qdq.onnx").model_path)
    out["tiny"] = Path(quantize(tiny_float, None, qnn8, model_dir / "tiny.qnn.qdq.onnx").model_path)
    w16 = QuantConfig(activation_type="uint16", weight_type="int16", target="qnn", num_samples=8)
    out["tiny_w16"] = Path(quantize(tiny_float, None, w16, model_dir / "tiny.w16.qnn.qdq.onnx").model_path)
    cnn_cfg = QuantConfig(target="qnn", num_samples=32)
    out["cnn_float"] = SAMPLES / "digits_cnn.onnx"
    out["cnn"] = Path(
        quantize(out["cnn_float"], SAMPLES / "digits_calib.npz", cnn_cfg, model_dir / "cnn.qnn.qdq.onnx").model_path
    )
    return out


# --------------------------------------------------------------------------- options (no backend needed)


def test_soc_table_and_labels() -> None:
    assert SOC_MODELS["SM8650"] == (57, "v75")
    assert QnnOptions().device_label() == "default SoC (HTP v68)"
    assert QnnOptions(soc="sm8650").device_label() == "SM8650 (HTP v75)"  # case-insensitive, normalised
    assert QnnOptions(soc="SM8750").provider_options() == {"backend_type": "htp", "soc_model": "69"}
    assert "soc_model" not in QnnOptions().provider_options()


def test_unknown_soc_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as info:
        QnnOptions(soc="SM9999")
    assert "SM9999" in str(info.value)
    assert all(name in str(info.value) for name in SOC_MODELS)


def test_options_report_every_problem_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        QnnOptions(enable_fp16=True, timeout_s=0)
    msg = str(info.value)
    assert "enable_fp16 needs a soc" in msg and "timeout_s" in msg
    with pytest.raises(ConfigError) as info:
        QnnOptions.from_mapping({"soc": "SM8650", "sock": "x", "timeout_s": "soon"})
    assert "'sock'" in str(info.value) and "soon" in str(info.value)


def test_options_from_a_mapping_of_strings() -> None:
    o = QnnOptions.from_mapping({"soc": "sm8550", "fail_on_fallback": "true", "timeout_s": "30"})
    assert o == QnnOptions(soc="SM8550", fail_on_fallback=True, timeout_s=30.0)
    assert QnnOptions.from_mapping({"soc": ""}) == QnnOptions()


def test_parse_compile_log_keeps_the_last_pass_and_backend_errors() -> None:
    log = "\n".join(
        [
            "[V:onnxruntime:, qnn_execution_provider.cc:2198 GetCapabilityImpl] GetCapability pass 1 (pre-Layout)",
            "[V:onnxruntime:, qnn_execution_provider.cc:1713 LogNodeSupport] Validation FAILED for 3 nodes in "
            "OrtNodeUnit (Erf) :",
            "\tOperator type: Erf Node name: stale Node index: 1",
            "\tREASON : from pass 1",
            "[V:onnxruntime:, qnn_execution_provider.cc:2198 GetCapabilityImpl] GetCapability pass 2 (post-Layout)",
            "[V:onnxruntime:, qnn_execution_provider.cc:1713 LogNodeSupport] Validation FAILED for 1 nodes in "
            "OrtNodeUnit (QuantizeLinear) :",
            "\tOperator type: QuantizeLinear Node name: x_q Node index: 6",
            "\tREASON : QNN EP is configured to not take Q nodes that consume a graph input.",
            "",
            "[W:onnxruntime:, qnn_model_wrapper.cc:565 CreateQnnNode] QNN.backendValidateOpConfig() failed for "
            "node `gemm` of type `FullyConnected` with error code 3110",
            "[V:onnxruntime:, qnn_execution_provider.cc:1713 LogNodeSupport] Validation FAILED for 5 nodes in "
            "OrtNodeUnit (Gemm) :",
            "\tOperator type: Gemm Node name: gemm Node index: 23",
            "\tREASON : Failed to add node.",
            "[V:onnxruntime:, qnn_execution_provider.cc:1713 LogNodeSupport] Validation PASSED for 4 nodes in "
            "OrtNodeUnit (Conv) :",
            "\tOperator type: Conv Node name: conv1 Node index: 8",
            "[V:onnxruntime:, session_state.cc:1584 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on "
            "[QNNExecutionProvider]. Number of nodes: 1",
            "[V:onnxruntime:, session_state.cc:1586 VerifyEachNodeIsAssignedToAnEp]   QNN_1 (QNN_1_0)",
            "[V:onnxruntime:, session_state.cc:1584 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on "
            "[CPUExecutionProvider]. Number of nodes: 1",
            "[V:onnxruntime:, session_state.cc:1586 VerifyEachNodeIsAssignedToAnEp]   QuantizeLinear (x_q)",
            "[I:onnxruntime:, inference_session.cc:3296 operator()] Session successfully initialized.",
        ]
    )
    parsed = parse_compile_log(log)
    assert parsed.passes == 2
    assert [(u.op_type, u.passed, u.nodes) for u in parsed.units] == [
        ("QuantizeLinear", False, 1),
        ("Gemm", False, 5),
        ("Conv", True, 4),
    ]
    q, gemm, _ = parsed.units
    assert q.by_design and q.node_names == ("x_q",)
    assert not gemm.by_design and gemm.describe() == "Failed to add node. (QNN backend: FullyConnected: error 3110)"
    assert parsed.placements == {"QNNExecutionProvider": 1, "CPUExecutionProvider": 1}
    assert parsed.cpu_placed == (("QuantizeLinear", "x_q"),)


def test_qnn_tests_fail_instead_of_skipping_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime_qnn", None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        require_qnn()
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="qdebug\\[qnn\\]"):
        require_qnn()


def test_missing_backend_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_quant) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime_qnn", None)  # makes the import fail, as if not installed
    ok, why = qnn_available()
    assert not ok and "qdebug[qnn]" in why
    with pytest.raises(MissingExtraError) as info:
        compile_qnn(tiny_quant("u16_qnn"), tmp_path)
    assert info.value.extra == "qnn"
    assert listing(tmp_path) == set()


# --------------------------------------------------------------------------- compiling


def test_tiny_convnet_compiles_to_one_partition(qnn: None, models: dict[str, Path], tmp_path: Path) -> None:
    r = compile_qnn(models["tiny"], tmp_path)
    assert r.ok and r.error is None, r.error
    assert r.single_partition
    assert (r.accelerator_partitions, r.cpu_nodes, r.graph_io_qdq_on_cpu) == (1, 0, 2)
    assert {(f.op_type, f.by_design) for f in r.fallback} == {("QuantizeLinear", True), ("DequantizeLinear", True)}
    assert r.fallback_by_op() == {}
    # Every node but the graph-input Q and graph-output DQ went to the HTP.
    source_nodes = len(onnx.load(str(models["tiny"])).graph.node)
    assert r.accelerator_nodes == source_nodes - 2
    assert r.context_bytes > 0 and r.compile_seconds > 0
    assert r.device == "default SoC (HTP v68)"
    assert listing(tmp_path) == {"model.qnn_ctx.onnx", "model.qnn_compile.log"}
    compiled = onnx.load(str(r.compiled_model))
    assert [n.op_type for n in compiled.graph.node] == ["QuantizeLinear", "EPContext", "DequantizeLinear"]
    assert "Validation PASSED" in Path(str(r.log_path)).read_text()
    # A second compile into the same folder replaces the outputs (ORT alone refuses to overwrite a context).
    again = compile_qnn(models["tiny"], tmp_path)
    assert again.ok and listing(tmp_path) == {"model.qnn_ctx.onnx", "model.qnn_compile.log"}


def test_sample_cnn_compiles_to_one_partition(qnn: None, models: dict[str, Path], tmp_path: Path) -> None:
    r = compile_qnn(models["cnn"], tmp_path, name="cnn")
    assert r.ok and r.single_partition, r.error
    assert r.graph_io_qdq_on_cpu == 2 and r.accelerator_nodes > 40


def test_uint16_activations_compile_to_one_partition(qnn: None, models: dict[str, Path], tmp_path: Path) -> None:
    r = compile_qnn(models["tiny_u16"], tmp_path)
    assert r.ok and r.single_partition, r.error


def test_sixteen_bit_weights_need_a_v73_soc(qnn: None, models: dict[str, Path], tmp_path: Path) -> None:
    r = compile_qnn(models["tiny_w16"], tmp_path / "v75", QnnOptions(soc="SM8650"))
    assert r.ok and r.single_partition, r.error
    assert r.device == "SM8650 (HTP v75)" and "v75" in r.device
    assert r.options["soc_model"] == "57"
    # The default SoC (v68) refuses 16-bit weights; the report says why, with the hint.
    bad = compile_qnn(models["tiny_w16"], tmp_path / "v68")
    assert not bad.ok and bad.compiled_model is None
    assert bad.error is not None and "16-bit weights" in bad.error and "v73" in bad.error
    assert {"Conv", "Gemm"} <= set(bad.fallback_by_op())
    assert listing(tmp_path / "v68") == {"model.qnn_compile.log"}


def test_float_model_in_fp16_on_a_named_soc(qnn: None, models: dict[str, Path], tmp_path: Path) -> None:
    r = compile_qnn(models["tiny_float"], tmp_path, QnnOptions(soc="SM8650", enable_fp16=True))
    assert r.ok and r.single_partition, r.error
    assert r.graph_io_qdq_on_cpu == 0 and r.options["enable_htp_fp16_precision"] == "1"


def test_fallback_reports_the_op_and_the_backends_reason(qnn: None, models: dict[str, Path], tmp_path: Path) -> None:
    r = compile_qnn(models["conv_erf"], tmp_path)
    assert r.ok, r.error
    assert r.cpu_nodes > 0 and not r.single_partition
    assert r.accelerator_partitions == 2  # the Erf splits the HTP graph in two
    erf = [f for f in r.fallback if f.op_type == "Erf"]
    assert len(erf) == 1 and not erf[0].by_design
    assert "Operators of type `Erf` are not supported by QNN EP" in erf[0].reason
    assert r.fallback_by_op()["Erf"] == erf[0].nodes == r.cpu_nodes  # DQ → Erf → Q, as one node unit
    assert any("Erf" in w for w in r.warnings)

    strict = compile_qnn(models["conv_erf"], tmp_path, QnnOptions(fail_on_fallback=True))
    assert not strict.ok and strict.compiled_model is None
    assert strict.error is not None and "fail_on_fallback" in strict.error and "Erf" in strict.error
    assert "not supported by QNN EP" in strict.error
    # The earlier (non-strict) context is gone: the folder never shows a model its log does not describe.
    assert listing(tmp_path) == {"model.qnn_compile.log"}


def test_zero_nodes_taken_is_a_failure_not_a_silent_success(qnn: None, models: dict[str, Path], tmp_path: Path) -> None:
    r = compile_qnn(models["erf_only"], tmp_path)
    assert not r.ok and r.compiled_model is None
    assert r.error is not None and "QNN took none" in r.error and "Erf" in r.error
    assert r.accelerator_partitions == 0 and r.accelerator_nodes == 0
    assert listing(tmp_path) == {"model.qnn_compile.log"}


def test_timeout_is_a_failure_without_leftovers(qnn: None, models: dict[str, Path], tmp_path: Path) -> None:
    r = compile_qnn(models["tiny"], tmp_path, QnnOptions(timeout_s=0.01))
    assert not r.ok and r.error is not None and "did not finish" in r.error
    assert listing(tmp_path) == {"model.qnn_compile.log"}


def test_bad_input_raises(qnn: None, models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(ModelError, match="float model"):
        compile_qnn(models["tiny_float"], out)
    with pytest.raises(InputFileError, match="no such file"):
        compile_qnn(tmp_path / "missing.onnx", out)
    compiled = compile_qnn(models["tiny"], tmp_path / "first")
    with pytest.raises(ModelError, match="already a compiled QNN model"):
        compile_qnn(str(compiled.compiled_model), out)
    dyn = quantize(
        _save(builders.tiny_convnet(batch="N"), tmp_path / "dyn.onnx"),
        None,
        QuantConfig(target="qnn", num_samples=2),
        tmp_path / "dyn.qdq.onnx",
    )
    with pytest.raises(ModelError, match="fixed input shapes"):
        compile_qnn(dyn.model_path, out)
    # A QDQ model ONNX Runtime itself cannot load: named in the error.
    broken = onnx.load(str(models["tiny"]))
    broken.graph.node[-1].op_type = "NoSuchOp"
    broken_path = _save(broken, tmp_path / "broken.onnx")
    with pytest.raises(ModelError, match=r"broken\.onnx"):
        compile_qnn(broken_path, out)
    with pytest.raises(ConfigError):
        compile_qnn(models["tiny"], out, name="../escape")
    assert not out.exists() or listing(out) <= {"model.qnn_compile.log"}
    assert not (out.exists() and any(p.name.startswith(".") for p in out.iterdir()))


def test_the_registered_target(qnn: None, models: dict[str, Path], tmp_path: Path) -> None:
    assert available_targets()["qnn"][0] is True
    target = get_target("qnn")
    assert target.name == "qnn"
    from qdebug.targets.base import BuildOptions, CompileJob

    options = BuildOptions("qnn", "uint8", soc="SM8650")
    r = target.compile(CompileJob(model=models["tiny"], out_dir=tmp_path, options=options, stem="tiny")).report
    assert r.ok and r.device == "SM8650 (HTP v75)"
    assert r.compiled_model == str(tmp_path / "tiny.qnn_ctx.onnx")
    with pytest.raises(ConfigError, match="unknown soc 'SM1234'"):
        BuildOptions("qnn", "uint8", soc="SM1234")


# --------------------------------------------------------------------------- running


def test_run_compiled_on_the_htp(qnn: None, models: dict[str, Path], tmp_path: Path) -> None:
    r = compile_qnn(models["tiny"], tmp_path)
    assert r.ok, r.error
    assert "QNNExecutionProvider" in qnn_session(str(r.compiled_model)).get_providers()
    data = SyntheticData(input_specs(load_model(models["tiny"])), 4)
    outs = list(run_compiled(str(r.compiled_model), data))
    assert len(outs) == 4
    for o in outs:
        assert set(o) == {"y"}
        assert o["y"].shape == (1, 3) and o["y"].dtype == np.float32 and np.isfinite(o["y"]).all()
    with pytest.raises(ModelError, match="not a compiled QNN model"):
        run_compiled(models["tiny"], data)
    with pytest.raises(ConfigError, match="unknown output"):
        run_compiled(str(r.compiled_model), data, output_names=["nope"])


def test_htp_accuracy_on_the_sample_cnn(qnn: None, models: dict[str, Path], tmp_path: Path) -> None:
    compiled = compile_qnn(models["cnn"], tmp_path)
    assert compiled.ok, compiled.error
    specs = input_specs(load_model(models["cnn_float"]))
    data = Limited(NpzData(SAMPLES / "digits_eval.npz", specs, ignore=["label"]), 24)
    acc = htp_accuracy(models["cnn_float"], models["cnn"], str(compiled.compiled_model), data, out_dir=tmp_path)
    assert acc.target == "qnn" and acc.device == "default SoC (HTP v68)" and acc.num_samples == 24
    assert acc.seconds_per_sample > 0
    (out,) = acc.outputs
    assert out.output_name == "logits"
    for v in (out.target_vs_float_db, out.cpu_vs_float_db, out.target_vs_cpu_db):
        assert v is not None and math.isfinite(v)
    # The HTP really computes differently from ONNX Runtime's CPU (not a silent CPU fallback).
    assert out.target_vs_cpu_db is not None and out.target_vs_cpu_db < 80

    pairing = pair_models(load_model(models["cnn_float"]), load_model(models["cnn"]))
    names = [a.tensor_name for a in pairing.activations if a.quantized]
    assert acc.tensors and {t.tensor_name for t in acc.tensors} <= set(names)
    order = [t.tensor_name for t in acc.tensors]
    assert order == [n for n in names if n in set(order)]  # topological, as in the debug report
    for t in acc.tensors:
        assert 0.0 <= t.fraction_differ <= 1.0 and t.max_lsb >= 0 and t.quant_type == "uint8"
        assert (t.max_lsb == 0) == (t.fraction_differ == 0.0)
    assert any(t.max_lsb > 0 for t in acc.tensors)
    # Flagged by the excess-noise rule; the first start is the first flagged tensor (nothing flagged before it).
    for t in acc.tensors:
        assert t.excess_noise_ratio is not None and t.flagged == (t.excess_noise_ratio > acc.excess_threshold)
    assert acc.first_divergent is None or acc.first_divergent in order
    if acc.first_divergent is not None:
        first = order.index(acc.first_divergent)
        assert not any(t.flagged for t in acc.tensors[:first]) and acc.tensors[first].flagged
        assert acc.first_divergent == acc.divergence_starts[0]
    assert acc.probe_single_partition is True
    assert listing(tmp_path) == {
        "model.qnn_ctx.onnx",
        "model.qnn_compile.log",
        "probe.qnn_ctx.onnx",
        "probe.qnn_compile.log",
    }
    assert type(acc).from_dict(acc.to_dict()) == acc


def test_probe_drops_tensors_around_data_movement_when_they_split_the_graph(
    qnn: None, model_dir: Path, tmp_path: Path
) -> None:
    # The sample transformer: exposing the tensors around its attention Transpose/Reshape ops splits the
    # HTP graph, so the probe retries without them and says so. Its Erf GELU stays on the CPU.
    float_model = SAMPLES / "digits_transformer.onnx"
    qdq = quantize(
        float_model, SAMPLES / "digits_calib.npz", QuantConfig(target="qnn", num_samples=8), model_dir / "tr.qdq.onnx"
    ).model_path
    compiled = compile_qnn(qdq, tmp_path)
    assert compiled.ok and compiled.fallback_by_op().get("Erf", 0) > 0
    specs = input_specs(load_model(float_model))
    data = Limited(NpzData(SAMPLES / "digits_eval.npz", specs, ignore=["label"]), 4)
    acc = htp_accuracy(float_model, qdq, str(compiled.compiled_model), data, out_dir=tmp_path)
    assert acc.probe_single_partition is True
    assert any("data-movement" in n for n in acc.notes)
    assert acc.tensors and all(0.0 <= t.fraction_differ <= 1.0 for t in acc.tensors)
    assert "/blocks/blocks.0/attn/Transpose_output_0" not in {t.tensor_name for t in acc.tensors}
    (out,) = acc.outputs
    assert out.target_vs_cpu_db is not None and math.isfinite(out.target_vs_cpu_db)


# --------------------------------------------------------------------------- where the HTP diverges


@pytest.fixture(scope="module")
def cnn16(model_dir: Path) -> dict[str, tuple[Path, Path]]:
    """digits_cnn at uint16 activations, (float, QDQ): ``kept`` as exported (the HTP computes its BatchNorms badly,
    docs/qnn.md) and ``folded`` (the BatchNorms folded into the Convs: the HTP stays within quantization noise)."""
    folded, _ = fold_batchnorm(load_model(SAMPLES / "digits_cnn.onnx"))
    floats = {"kept": SAMPLES / "digits_cnn.onnx", "folded": _save(folded, model_dir / "cnn_folded.onnx")}
    cfg = QuantConfig(target="qnn", activation_type="uint16", num_samples=16)
    return {
        k: (f, Path(quantize(f, SAMPLES / "digits_calib.npz", cfg, model_dir / f"cnn16_{k}.qdq.onnx").model_path))
        for k, f in floats.items()
    }


def _cnn16_accuracy(pair: tuple[Path, Path], tmp_path: Path, **kw: Any) -> TargetAccuracy:
    fpath, qpath = pair
    compiled = compile_qnn(qpath, tmp_path)
    assert compiled.ok and compiled.single_partition, compiled.error
    data = Limited(NpzData(SAMPLES / "digits_eval.npz", input_specs(load_model(fpath)), ignore=["label"]), 8)
    return htp_accuracy(fpath, qpath, str(compiled.compiled_model), data, out_dir=tmp_path, **kw)


def test_divergence_starts_at_the_batchnorm_the_htp_computes_badly(
    qnn: None, cnn16: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    acc = _cnn16_accuracy(cnn16["kept"], tmp_path)
    (out,) = acc.outputs
    assert out.cpu_vs_float_db is not None and out.target_vs_float_db is not None
    assert out.target_vs_float_db < out.cpu_vs_float_db - 15  # measured 11.3 vs 34.5 dB
    # The stem (Conv → BN → Relu) stays within its quantization noise on the HTP; the block's first BN does not.
    # Its output is not compared (the quantizer fuses the Relu after it), so the start is the Relu's output,
    # computed by that BatchNormalization.
    assert acc.divergence_rule == "excess_noise" and acc.excess_threshold == 1.0
    assert acc.first_divergent == "/block/body/body.0/body.0.2/Relu_output_0"
    assert acc.divergence_starts == (acc.first_divergent,)  # one region: everything after it inherits
    assert ("BatchNormalization", "/block/body/body.0/body.0.1/BatchNormalization") in acc.first_divergent_nodes
    assert "BatchNormalization" in dict(acc.divergence_ops)
    names = [t.tensor_name for t in acc.tensors]
    start = names.index(acc.first_divergent)
    assert not any(t.flagged for t in acc.tensors[:start]) and all(t.flagged for t in acc.tensors[start:])
    t = acc.tensors[start]
    assert t.excess_noise_ratio is not None and t.excess_noise_ratio > 50  # measured 294
    assert t.sqnr_drop_db is not None and t.sqnr_drop_db > 17
    # Measured here (no debug report given) the CPU-QDQ error is the debug report's cumulative SQNR.
    report = debug(*cnn16["kept"], acc_data(cnn16["kept"][0]), DebugOptions())
    for d in acc.tensors:
        if d.tensor_name != "input":
            assert d.cpu_vs_float_db == pytest.approx(report.activation(d.tensor_name).cumulative_sqnr_db, abs=0.01)
    # Given the debug report's figures instead, the verdict is the same.
    cpu = {a.tensor_name: a.cumulative_sqnr_db for a in report.activations}
    again = _cnn16_accuracy(cnn16["kept"], tmp_path / "again", cpu_sqnr_db=cpu)
    assert again.first_divergent == acc.first_divergent and again.divergence_starts == acc.divergence_starts
    assert type(acc).from_dict(json.loads(json.dumps(acc.to_dict()))) == acc


def acc_data(fpath: Path) -> Limited:
    """The 8 samples the HTP checks of this module run on."""
    return Limited(NpzData(SAMPLES / "digits_eval.npz", input_specs(load_model(fpath)), ignore=["label"]), 8)


def test_sixteen_bit_lsb_noise_is_not_divergence(
    qnn: None, cnn16: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    # With 65,536 steps every tensor differs from ORT CPU by hundreds of LSB (measured 234–573), so the old
    # absolute rule (> 1 LSB) named the model's first tensor; in units of each tensor's own quantization error
    # the HTP adds ≤ 0.06×, and nothing is flagged — the HTP is within 0.3 dB of the CPU-QDQ model at the output.
    acc = _cnn16_accuracy(cnn16["folded"], tmp_path)
    computed = [t for t in acc.tensors if t.op_type]  # the graph input is not computed by the model
    old_rule_first = next(t.tensor_name for t in acc.tensors if t.max_lsb > 1)
    assert old_rule_first == computed[0].tensor_name
    assert acc.first_divergent is None and acc.divergence_starts == () and acc.divergence_ops == ()
    assert not acc.flagged
    assert all(t.excess_noise_ratio is not None and t.excess_noise_ratio < 0.5 for t in acc.tensors)
    (out,) = acc.outputs
    assert out.cpu_vs_float_db is not None and out.target_vs_float_db is not None
    assert out.target_vs_float_db > out.cpu_vs_float_db - 1.0


def test_bisection_over_prefix_compiles_finds_the_same_start_without_a_probe(
    qnn: None, cnn16: dict[str, tuple[Path, Path]]
) -> None:
    # Each check compiles the model cut at one tensor (no extra outputs), so the HTP graph is the real one up to it.
    kept = bisect_divergence(*cnn16["kept"], acc_data(cnn16["kept"][0]))
    assert kept.first_divergent == "/block/body/body.0/body.0.2/Relu_output_0"
    assert kept.candidates == 13 and kept.compiles <= math.ceil(math.log2(kept.candidates)) + 2
    by_name = {c.tensor_name: c.excess_noise_ratio for c in kept.checks}
    assert by_name[kept.first_divergent] > 50 and kept.seconds > 0
    assert all(r <= 1.0 for n, r in by_name.items() if n in {"/stem/stem.2/Relu_output_0"})
    folded = bisect_divergence(*cnn16["folded"], acc_data(cnn16["folded"][0]))
    assert folded.first_divergent is None and folded.compiles == 1  # the last tensor is fine: nothing to search
