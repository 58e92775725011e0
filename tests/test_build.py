"""``qdebug build`` and ``qdebug.build``: device × precision → config, the QNN build of the sample models with and
without the fixes, the manifest, every bad input via the CLI in-process, and ``recompile`` in the mixed-precision loop.

Real ONNX Runtime and onnxruntime-qnn throughout (no mocks); tests needing onnxruntime-qnn fail under CI=true when it
is missing and are skipped with the reason elsewhere.
"""

from __future__ import annotations

import io
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import SAMPLE_MODELS, CliResult, assert_one_line_error, sha256
from test_qnn_fixes import dynamic_convnet, erf_only, ln_gelu_block, require_qnn, samples

from qdebug.build import BuildError, BuildOptions, RecompileResult, build, recompile
from qdebug.build_inputs import resolve_config
from qdebug.build_manifest import BuildManifest
from qdebug.config import QuantConfig
from qdebug.errors import (
    EXIT_INPUT_FILE,
    EXIT_MISSING_EXTRA,
    EXIT_MODEL,
    EXIT_TARGET,
    EXIT_USAGE,
    ConfigError,
    ModelError,
)
from qdebug.report import DebugReport
from qdebug.targets.base import get_target

CALIB = SAMPLE_MODELS / "digits_calib.npz"
EVAL = SAMPLE_MODELS / "digits_eval.npz"
TRANSFORMER = SAMPLE_MODELS / "digits_transformer.onnx"
CNN = SAMPLE_MODELS / "digits_cnn.onnx"


@pytest.fixture
def qnn() -> None:
    """Marks a test as needing the real QNN compiler / HTP simulator."""
    require_qnn()


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def _no_leftovers(parent: Path, out_name: str) -> None:
    """Neither the output folder nor a staging folder of it remains."""
    assert not (parent / out_name).exists()
    assert not [p.name for p in parent.iterdir() if p.name.startswith((f".{out_name}.", ".qd-"))]


# ------------------------------------------------------------------------------------------------ the mapping
@pytest.mark.parametrize(
    ("device", "precision", "act", "wgt", "sym"),
    [
        ("qnn", "uint8", "uint8", "uint8", None),
        ("qnn", "uint16", "uint16", "uint8", None),
        ("qnn", "int8", "uint8", "int8", True),
        ("cpu", "uint8", "uint8", "uint8", None),
        ("cpu", "uint16", "uint16", "uint8", None),
        ("cpu", "int8", "uint8", "int8", True),
    ],
)
def test_device_and_precision_map_onto_the_one_config(
    device: str, precision: str, act: str, wgt: str, sym: bool | None
) -> None:
    cfg = resolve_config(device, precision)
    assert cfg == QuantConfig(activation_type=act, weight_type=wgt, weight_symmetric=sym, target=device)
    # A config that agrees (or leaves a setting at its default) merges; one that contradicts is an error.
    assert resolve_config(device, precision, QuantConfig(per_channel=True)) == cfg.replace(per_channel=True)
    with pytest.raises(ConfigError, match="conflicting"):
        resolve_config(device, precision, QuantConfig(weight_type="int16"))


def test_fp16_quantizes_nothing_and_takes_no_config() -> None:
    assert get_target("qnn").precisions["fp16"].config is None and "fp16" not in get_target("cpu").precisions
    assert resolve_config("qnn", "fp16") is None
    with pytest.raises(ConfigError, match="quantizes nothing"):
        resolve_config("qnn", "fp16", QuantConfig())
    with pytest.raises(ConfigError, match="not supported on device 'cpu'"):
        resolve_config("cpu", "fp16")


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"device": "cpu", "precision": "fp16"}, "not supported on device 'cpu'"),
        ({"device": "qnn", "precision": "fp16"}, "needs --soc"),
        ({"device": "gpu", "precision": "uint8"}, "device 'gpu'"),
        ({"device": "qnn", "precision": "int4"}, "precision 'int4'"),
        ({"device": "cpu", "precision": "uint8", "soc": "SM8650"}, "--soc applies"),
        ({"device": "cpu", "precision": "uint8", "fail_on_fallback": True}, "--fail-on-fallback applies"),
        ({"device": "qnn", "precision": "uint8", "skip_fixes": ("nope",)}, "unknown fix"),
        ({"device": "qnn", "precision": "uint8", "debug_samples": 0}, "debug_samples"),
    ],
)
def test_build_options_are_validated(kwargs: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        BuildOptions(**kwargs)


# ------------------------------------------------------------------------------------------------ sample models
@pytest.fixture(scope="module")
def transformer_int8(tmp_path_factory: pytest.TempPathFactory) -> tuple[CliResult, Path, dict[str, str]]:
    """``qdebug build`` of the sample transformer at int8 on QNN, through the CLI (run once for several tests)."""
    require_qnn()
    from qdebug.cli import main

    root = tmp_path_factory.mktemp("build")
    hashes = {str(p): sha256(p) for p in (TRANSFORMER, CALIB, EVAL)}
    out = root / "out"
    buf = io.StringIO()
    argv = ["build", "--float-model", TRANSFORMER, "--target", "qnn", "--precision", "int8", "--calib", CALIB]
    argv += ["--eval", EVAL, "--debug-samples", "16", "-o", out]
    code = main([str(a) for a in argv], out=buf)
    return CliResult(code, buf.getvalue(), "", ""), out, hashes


@pytest.mark.slow
def test_transformer_int8_builds_to_one_partition_and_says_what_it_changed(
    transformer_int8: tuple[CliResult, Path, dict[str, str]],
) -> None:
    res, out, hashes = transformer_int8
    assert res.code == 0, res.out
    assert {str(p): sha256(p) for p in (TRANSFORMER, CALIB, EVAL)} == hashes  # inputs only read
    assert "EPContext partitions 1," in res.out and "CPU fallback 0 node(s)" in res.out
    for line in ("gelu_fusion               yes", "layernorm_gamma_unsigned  yes", "static_shapes             no"):
        assert line in res.out
    assert "top-1 on 540 samples" in res.out
    m = BuildManifest.load(out / "manifest.json")
    assert m.compile.single_partition and m.compile.target == "qnn" and m.compile.graph_io_qdq_on_cpu == 2
    assert m.compile.context_bytes > 0 and m.compile.device == "default SoC (HTP v68)"
    assert [(f.name, f.changed) for f in m.fixes] == [
        ("static_shapes", False),
        ("batchnorm_folding", False),
        ("gelu_fusion", True),
        ("layernorm_gamma_unsigned", True),
        ("qnn_compat", False),
    ]
    assert m.config is not None and (m.config.activation_type, m.config.weight_type) == ("uint8", "int8")
    assert m.config.overrides_dict["norm.weight"][0].quant_type == "uint8"
    assert {i.role: i.sha256 for i in m.inputs} == {
        "model": hashes[str(TRANSFORMER)],
        "data": hashes[str(CALIB)],
        "eval_data": hashes[str(EVAL)],
    }
    assert m.quantization is not None and m.quantization.nodes_quantized > 0 and m.quantization.qdq_seconds > 0
    for role in ("float_model", "qdq_model", "compiled_model", "compile_log", "report", "calibration_cache"):
        assert (out / m.files[role]).is_file(), role
    assert sorted(p.name for p in out.iterdir()) == sorted(m.files.values())  # nothing else, nothing half-written
    # The compiled model is one EPContext node (+ the graph-I/O Q/DQ ORT keeps on the CPU).
    ops = sorted(n.op_type for n in onnx.load(str(out / m.files["compiled_model"])).graph.node)
    assert ops == ["DequantizeLinear", "EPContext", "QuantizeLinear"]
    # Accuracy: CPU-QDQ vs float from debug, HTP vs both from the simulator, top-1 of all three models.
    assert m.num_debug_samples == 16 and [o.output_name for o in m.cpu_qdq_vs_float] == ["logits"]
    acc = m.target_accuracy
    assert acc is not None and acc.num_samples == 16 and acc.seconds_per_sample > 0
    (o,) = acc.outputs
    assert o.target_vs_float_db is not None and o.target_vs_float_db > 20
    assert o.cpu_vs_float_db == pytest.approx(m.cpu_qdq_vs_float[0].sqnr_db, abs=1e-3)
    assert m.top1 is not None and m.top1.num_samples == 540
    assert m.top1.float_model == pytest.approx(0.97963, abs=1e-4)
    assert m.top1.compiled_model is not None and m.top1.compiled_model > 0.9
    report = DebugReport.load(out / "report.json")
    assert report.target_accuracy == acc
    assert report.meta.quant_model == str((out / m.files["qdq_model"]).resolve())
    # The JSON round-trips.
    assert BuildManifest.from_dict(json.loads(m.to_json())) == m


def test_transformer_without_the_fixes_is_split(qnn: None, run_cli: Callable[..., CliResult], tmp_path: Path) -> None:
    out = tmp_path / "nofix"
    res = run_cli(
        "build", "--float-model", TRANSFORMER, "--target", "qnn", "--precision", "int8", "--calib", CALIB,
        "--skip-fix", "gelu_fusion", "--skip-fix", "layernorm_gamma_unsigned",
        "--debug-samples", "4", "--no-tensor-probe", "-o", out,
    )  # fmt: skip
    assert res.code == 0, res.stderr  # a split graph still builds, loudly
    m = BuildManifest.load(out / "manifest.json")
    assert m.compile.accelerator_partitions > 1 and m.compile.cpu_nodes > 0
    by_op = m.compile.fallback_by_op()
    assert by_op.get("Erf", 0) > 0 and by_op.get("LayerNormalization", 0) > 0
    assert "CPU fallback by op type" in res.out and "Operators of type `Erf` are not supported" in res.out
    assert "the skipped gelu_fusion fix" in res.out and "the skipped layernorm_gamma_unsigned fix" in res.out
    assert len(m.warnings) == 2


def test_cnn_builds_with_batchnorm_folded_and_uint16_activations(
    qnn: None, run_cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    out = tmp_path / "cnn16"
    res = run_cli(
        "build", "--float-model", CNN, "--target", "qnn", "--precision", "uint16", "--calib", CALIB,
        "--debug-samples", "8", "-o", out,
    )  # fmt: skip
    assert res.code == 0, res.stderr
    m = BuildManifest.load(out / "manifest.json")
    assert m.compile.single_partition
    assert next(f for f in m.fixes if f.name == "batchnorm_folding").changed
    assert m.config is not None and m.config.activation_type == "uint16"
    qdq = onnx.load(str(out / m.files["qdq_model"]))
    zps = {t.name: t for t in qdq.graph.initializer if t.name.endswith("_zero_point")}
    assert any(t.data_type == onnx.TensorProto.UINT16 for t in zps.values())
    # Folding BN is what keeps the HTP close to the CPU with 16-bit activations (9 dB without it, see docs/qnn.md).
    acc = m.target_accuracy
    assert acc is not None and acc.outputs[0].target_vs_float_db is not None
    assert acc.outputs[0].target_vs_float_db > 30
    # Every tensor is hundreds of LSB from ORT CPU at 16 bits, yet within its own quantization error: no divergence.
    # The CPU-QDQ error per tensor is the debug report's (build hands it to the target's check).
    assert acc.divergence_rule == "excess_noise" and acc.first_divergent is None and not acc.flagged
    assert any(t.max_lsb > 1 for t in acc.tensors)
    report = DebugReport.load(out / "report.json")
    cumulative = {a.tensor_name: a.cumulative_sqnr_db for a in report.activations}
    assert all(t.cpu_vs_float_db == cumulative.get(t.tensor_name) for t in acc.tensors)
    assert "divergence: none" in res.out


# ------------------------------------------------------------------------------------------------ small models
def test_cpu_build_delivers_the_qdq_model(run_cli: Callable[..., CliResult], tmp_path: Path) -> None:
    model = _save(ln_gelu_block(), tmp_path / "block.onnx")
    data = tmp_path / "data.npz"
    np.savez(data, **samples(ln_gelu_block(), 8))
    out = tmp_path / "cpu"
    res = run_cli("build", "--float-model", model, "--target", "cpu", "--precision", "int8", "--calib", data, "-o", out)
    assert res.code == 0, res.stderr
    m = BuildManifest.load(out / "manifest.json")
    assert m.compile.target == "cpu" and m.compile.ok and m.fixes == ()
    assert m.files["compiled_model"] == m.files["qdq_model"] == "block.qdq.onnx"
    assert m.config == QuantConfig(activation_type="uint8", weight_type="int8", weight_symmetric=True, target="cpu")
    assert m.target_accuracy is None and m.cpu_qdq_vs_float[0].sqnr_db is not None
    assert "CPU check OK" in res.out


def test_dynamic_model_gets_its_shapes_from_the_data(qnn: None, tmp_path: Path) -> None:
    model = _save(dynamic_convnet(), tmp_path / "dyn.onnx")
    data = tmp_path / "data.npz"
    np.savez(data, **samples(dynamic_convnet(), 6, shapes={"x": [1, 3, 16, 16]}))
    res = build(model, tmp_path / "out", BuildOptions("qnn", "uint8", debug_samples=4), data=data)
    m = res.manifest
    fix = m.fixes[0]
    assert fix.name == "static_shapes" and fix.changed and "from the first data sample" in fix.detail
    assert m.compile.single_partition
    fixed = onnx.load(str(res.path("float_model")))
    assert [d.dim_value for d in fixed.graph.input[0].type.tensor_type.shape.dim] == [1, 3, 16, 16]
    # --input-shape wins over the data (and synthetic calibration then uses it).
    res2 = build(
        model, tmp_path / "out2", BuildOptions("qnn", "uint8", debug_samples=2, input_shapes={"x": [1, 3, 8, 8]})
    )
    assert "from --input-shape" in res2.manifest.fixes[0].detail and res2.manifest.compile.single_partition


def test_fp16_compiles_the_float_model(qnn: None, tmp_path: Path) -> None:
    model = _save(ln_gelu_block(), tmp_path / "block.onnx")
    res = build(model, tmp_path / "out", BuildOptions("qnn", "fp16", soc="SM8650", debug_samples=2))
    m = res.manifest
    assert m.config is None and m.quantization is None and res.report is None
    assert m.compile.single_partition and m.compile.device == "SM8650 (HTP v75)"
    assert "qdq_model" not in m.files and "report" not in m.files
    acc = m.target_accuracy
    assert acc is not None and acc.outputs[0].cpu_vs_float_db is None
    assert acc.outputs[0].target_vs_float_db is not None and acc.outputs[0].target_vs_float_db > 40


def test_overrides_that_a_fix_invalidates_are_an_error(qnn: None, tmp_path: Path) -> None:
    from qdebug.mixed.overrides import OverridesFile

    model = _save(ln_gelu_block(), tmp_path / "block.onnx")
    ofile = OverridesFile.from_config(QuantConfig(target="qnn", tensor_overrides={"e": [{"quant_type": "uint16"}]}))
    with pytest.raises(ConfigError, match=r"after the QNN fix\(es\).*'e'"):
        build(model, tmp_path / "out", BuildOptions("qnn", "uint8"), overrides=ofile)
    _no_leftovers(tmp_path, "out")


# ------------------------------------------------------------------------------------------------ bad input
@pytest.fixture(scope="module")
def artefacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A float model, its QDQ model, an EPContext model, a config file and a non-empty folder."""
    from qdebug.quantizer import quantize

    d = tmp_path_factory.mktemp("bad")
    block = _save(ln_gelu_block(), d / "block.onnx")
    qdq = Path(quantize(block, None, QuantConfig(target="qnn"), d / "block.qdq.onnx").model_path)
    ctx = d / "fake.qnn_ctx.onnx"
    m = onnx.load(str(qdq))
    m.graph.node.append(onnx.helper.make_node("EPContext", [], ["unused"], name="ctx", domain="com.microsoft"))
    _save(m, ctx)
    cfg = d / "u16w.json"
    cfg.write_text(QuantConfig(weight_type="uint16", target="qnn").to_json(), encoding="utf-8")
    full = d / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine", encoding="utf-8")
    return {"block": block, "qdq": qdq, "ctx": ctx, "config": cfg, "full": full, "erf": _save(erf_only(), d / "e.onnx")}


BAD = [  # (id, argv after "build", exit code, part of the message); {name} is a path of the artefacts fixture
    ("qdq-as-input", "--float-model {qdq} --target qnn --precision uint8", EXIT_MODEL, "already quantized"),
    ("epcontext", "--float-model {ctx} --target qnn --precision uint8", EXIT_MODEL, "EPContext"),
    ("missing", "--float-model {block}.nope --target cpu --precision int8", EXIT_INPUT_FILE, "no such"),
    ("cpu-fp16", "--float-model {block} --target cpu --precision fp16", EXIT_USAGE, "not supported"),
    ("fp16-no-soc", "--float-model {block} --target qnn --precision fp16", EXIT_USAGE, "needs --soc"),
    (
        "unknown-soc",
        "--float-model {block} --target qnn --precision uint8 --soc SM1234",
        EXIT_USAGE,
        "unknown soc 'SM1234'",
    ),
    (
        "config-conflict",
        "--float-model {block} --target qnn --precision uint8 --config {config}",
        EXIT_USAGE,
        "weight_type: config says 'uint16'",
    ),
    ("cannot-compile", "--float-model {erf} --target qnn --precision uint8", EXIT_TARGET, "QNN took none of the"),
    (
        "fail-on-fallback",
        "--float-model {block} --target qnn --precision uint8 --skip-fix gelu_fusion --fail-on-fallback",
        EXIT_TARGET,
        "fail_on_fallback",
    ),
]


@pytest.mark.parametrize(("case", "argv", "code", "needle"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_one_line_error_and_no_output(
    case: str,
    argv: str,
    code: int,
    needle: str,
    artefacts: dict[str, Path],
    run_cli: Callable[..., CliResult],
    tmp_path: Path,
) -> None:
    if code == EXIT_TARGET or case == "unknown-soc":  # the others are refused before QNN is looked at
        require_qnn()
    out = tmp_path / "out"
    res = run_cli("build", *argv.format(**{k: str(v) for k, v in artefacts.items()}).split(), "-o", out)
    assert_one_line_error(res, code, needle)
    _no_leftovers(tmp_path, "out")
    if code == EXIT_TARGET:  # what QNN said is printed before the error, and its log is kept outside out/
        assert "FAILED" in res.out and "log: " in res.out
        log = Path(res.out.split("log: ")[1].split("\n")[0])
        assert log.is_file() and "out" not in log.parts
        shutil.rmtree(log.parent)  # the kept log is the user's to delete; here it is ours


def test_a_non_empty_output_folder_is_refused(artefacts: dict[str, Path], run_cli: Callable[..., CliResult]) -> None:
    full = artefacts["full"]
    res = run_cli("build", "--float-model", artefacts["block"], "--target", "cpu", "--precision", "int8", "-o", full)
    assert_one_line_error(res, EXIT_USAGE, "not an empty folder")
    assert sorted(p.name for p in full.iterdir()) == ["keep.txt"]


def test_missing_onnxruntime_qnn_names_the_extra(
    artefacts: dict[str, Path], run_cli: Callable[..., CliResult], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime_qnn", None)  # `import onnxruntime_qnn` now raises ImportError
    res = run_cli(
        "build", "--float-model", artefacts["block"], "--target", "qnn", "--precision", "uint8", "-o", tmp_path / "o"
    )
    assert_one_line_error(res, EXIT_MISSING_EXTRA, "pip install 'qdebug[qnn]'")
    _no_leftovers(tmp_path, "o")


def test_build_error_carries_the_compile_report(qnn: None, artefacts: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(BuildError) as info:
        build(artefacts["erf"], tmp_path / "out", BuildOptions("qnn", "uint8"))
    rep = info.value.compile_report
    assert rep is not None and not rep.ok and rep.fallback_by_op() == {"Erf": 6}
    assert info.value.fixes and info.value.exit_code == EXIT_TARGET
    assert rep.log_path is not None and Path(rep.log_path).is_file()
    shutil.rmtree(Path(rep.log_path).parent)


# ------------------------------------------------------------------------------------------------ recompile
def test_recompile_rejects_what_is_not_a_qdq_model(artefacts: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not a QDQ model"):
        recompile(artefacts["block"], tmp_path, "cpu")
    with pytest.raises(ModelError, match="EPContext"):
        recompile(artefacts["ctx"], tmp_path, "qnn")
    with pytest.raises(ConfigError, match="unknown target"):
        recompile(artefacts["qdq"], tmp_path, "gpu")


def test_recompile_for_cpu_is_a_load_and_run_check(artefacts: dict[str, Path], tmp_path: Path) -> None:
    res = recompile(artefacts["qdq"], tmp_path, "cpu")
    assert res.ok and res.compile.target == "cpu" and res.compile.accelerator_nodes > 0
    assert RecompileResult.from_dict(json.loads(json.dumps(res.to_dict()))) == res


@pytest.mark.slow
def test_promote_requantize_recompile_on_the_sample_cnn(qnn: None, tmp_path: Path) -> None:
    from qdebug.debugger import DebugOptions
    from qdebug.mixed.session import MixedPrecisionSession

    built = build(CNN, tmp_path / "cnn", BuildOptions("qnn", "uint8", debug_samples=8), data=CALIB)
    session = MixedPrecisionSession(
        built.path("float_model"),
        CALIB,
        built.manifest.config,
        debug_options=DebugOptions(num_samples=8),
        workdir=tmp_path / "work",
    )
    plan = session.promote([s.tensor_name for s in session.suggest(3)])
    assert plan.converts  # a real mixed-precision model: uint8 and uint16 regions with converts between them
    evaluation = session.evaluate(plan, name="promoted")
    result = session.recompile(evaluation)
    assert result.ok and result.compile.single_partition, result.compile
    acc = result.target_accuracy
    assert acc is not None and acc.num_samples == 8
    htp, cpu = acc.outputs[0].target_vs_float_db, acc.outputs[0].cpu_vs_float_db
    assert htp is not None and cpu is not None and htp > cpu - 3  # the HTP keeps up with the CPU model


@pytest.mark.slow
def test_promote_recompile_on_the_fixed_transformer(
    transformer_int8: tuple[CliResult, Path, dict[str, str]], tmp_path: Path
) -> None:
    from qdebug.debugger import DebugOptions
    from qdebug.mixed.session import MixedPrecisionSession

    res, out, _ = transformer_int8
    assert res.code == 0
    m = BuildManifest.load(out / "manifest.json")
    session = MixedPrecisionSession(
        out / m.files["float_model"], CALIB, m.config, debug_options=DebugOptions(num_samples=4), workdir=tmp_path
    )
    evaluation = session.evaluate(session.promote([s.tensor_name for s in session.suggest(2)]), name="p2")
    result = session.recompile(evaluation)
    assert result.ok and result.compile.single_partition, result.compile


def test_without_a_soc_16bit_weights_compile_for_a_soc_that_runs_them(qnn: None, tmp_path: Path) -> None:
    """QNN's recipe makes some weights 16-bit at uint16 activations; the default SoC (HTP v68) cannot run them, so
    the build picks the oldest SoC that can, says so, and checks the model on that SoC."""
    res = build(TRANSFORMER, tmp_path / "out", BuildOptions("qnn", "uint16", debug_samples=2), data=CALIB)
    m = res.manifest
    assert m.compile.ok and m.compile.device == "SM8550 (HTP v73)"
    assert any("16-bit weights" in w and "SM8550" in w for w in m.warnings), m.warnings
    assert m.target_details["compiled_soc"] == "SM8550"
    assert m.target_accuracy is not None and m.target_accuracy.device == "SM8550 (HTP v73)"
    assert BuildManifest.from_dict(m.to_dict()) == m


def lstm_block() -> onnx.ModelProto:
    """MatMul → LSTM → MatMul: ORT's QDQ recipe quantizes the MatMuls and leaves the LSTM in float (like silero-vad's
    recurrent cell in the corpus)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    hidden, width = 16, 8

    def const(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)

    inits = [const("W", (1, 4 * hidden, width)), const("R", (1, 4 * hidden, hidden)), const("M", (width, width))]
    inits += [const("M2", (hidden, 4)), numpy_helper.from_array(np.array([1], np.int64), "axis")]
    nodes = [
        helper.make_node("MatMul", ["x", "M"], ["a"], name="mm"),
        helper.make_node("LSTM", ["a", "W", "R"], ["y", "y_h"], hidden_size=hidden, name="lstm"),
        helper.make_node("Squeeze", ["y", "axis"], ["ys"], name="squeeze"),
        helper.make_node("MatMul", ["ys", "M2"], ["out"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "lstm_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 1, width])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [3, 1, 4])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_without_a_soc_a_float_op_compiles_for_a_soc_that_runs_it(qnn: None, tmp_path: Path) -> None:
    """The default SoC (HTP v68) has no float unit: the LSTM ORT leaves in float makes QNN fail to finalize the graph
    (QNN_COMMON_ERROR_MEM_ALLOC, the gauntlet's silero-vad at uint8). Without --soc the build compiles for SM8550
    instead and says why; with an explicit --soc it does not second-guess the user."""
    model = _save(lstm_block(), tmp_path / "lstm.onnx")
    data = tmp_path / "calib.npz"
    np.savez(data, x=np.random.default_rng(1).normal(0, 1, (8, 3, 1, 8)).astype(np.float32))
    res = build(model, tmp_path / "out", BuildOptions("qnn", "uint8", debug_samples=2), data=data)
    m = res.manifest
    assert m.compile.ok and m.compile.device == "SM8550 (HTP v73)", m.compile
    assert any("default SoC" in w and "SM8550" in w and "MEM_ALLOC" in w for w in m.warnings), m.warnings
    assert m.target_details["compiled_soc"] == "SM8550"
    assert m.target_accuracy is not None and m.target_accuracy.device == "SM8550 (HTP v73)"
    with pytest.raises(BuildError) as info:
        build(model, tmp_path / "out68", BuildOptions("qnn", "uint8", soc="SM8350", debug_samples=2), data=data)
    rep = info.value.compile_report
    assert rep is not None and not rep.ok and "MEM_ALLOC" in (rep.error or "")
    assert "(refused: )" not in (rep.error or "")  # only graph-I/O Q/DQ were left out: nothing to list
