"""Third-party PTQ libraries (qdebug.ptq): NNCF run for real in its own environment on the bundled sample models.

The tests marked with the ``nncf`` fixture need NNCF's environment, created once per session (``ensure_ptq_env``;
``make ptq-env`` pre-creates it, and ``make test`` does). When it cannot be created they skip with the reason,
except under ``CI=true``, where they fail: CI must run the real NNCF. Nothing here needs AMD Quark's environment
(``make ptq-env-quark``, for the benchmark only).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import builders
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from qdebug.errors import ConfigError, DataError, InputFileError, ModelError, PtqError, QDebugError
from qdebug.ptq import RECIPES, PtqLibrary, PtqRecipe, PtqRun, ensure_ptq_env, ptq_available, ptq_env_dir, run_ptq
from qdebug.ptq.env import TELEMETRY_OFF

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_models"
PTQ_DIR = REPO / "qdebug" / "ptq"
#: Modules of the libraries and of what only they pull: none may load in qdebug's interpreter.
LIBRARY_MODULES = ("nncf", "quark", "torch", "openvino_telemetry", "sklearn")


def _fail_or_skip(msg: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{msg} (CI=true: the NNCF tests must run, not skip)")
    print(msg, file=sys.stderr)
    pytest.skip(msg)


@pytest.fixture(scope="session")
def nncf_env() -> Path | str:
    """Create (or find) NNCF's environment once per session: its python, or why it could not be made."""
    try:
        return ensure_ptq_env(PtqLibrary.NNCF)
    except QDebugError as exc:
        return f"NNCF's environment could not be created: {exc}"


@pytest.fixture
def nncf(nncf_env: Path | str) -> Path:
    """Marks a test as needing NNCF's environment (skip with the reason, or fail under CI=true)."""
    if isinstance(nncf_env, str):
        _fail_or_skip(nncf_env)
    assert isinstance(nncf_env, Path)
    return nncf_env


def _digits(start: int, n: int) -> list[dict[str, np.ndarray]]:
    """Samples of the bundled digits data: calibration from digits_calib.npz, held-out ones from digits_eval.npz."""
    name = "digits_calib.npz" if start < 0 else "digits_eval.npz"
    with np.load(SAMPLES / name) as z:
        x = z["input"]
    first = max(start, 0)
    return [{"input": x[i]} for i in range(first, first + n)]


def worst_output_sqnr(float_model: Path, qdq_model: Path, samples: Sequence[dict[str, np.ndarray]]) -> float:
    """Energies summed over the samples, per output, then the worst output (graph optimizations off)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    fs = ort.InferenceSession(str(float_model), so, providers=["CPUExecutionProvider"])
    qs = ort.InferenceSession(str(qdq_model), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in fs.get_outputs()]
    signal, noise = np.zeros(len(names)), np.zeros(len(names))
    for s in samples:
        for i, (f, q) in enumerate(zip(fs.run(names, s), qs.run(names, s), strict=True)):
            f64 = np.asarray(f, np.float64)
            signal[i] += float(np.sum(f64 * f64))
            noise[i] += float(np.sum((f64 - q) ** 2))
    return float(np.min(10 * np.log10(signal / noise)))


def _q_count(path: Path) -> int:
    return sum(1 for n in onnx.load(str(path)).graph.node if n.op_type == "QuantizeLinear")


# --------------------------------------------------------------------------- no environment needed


def test_fails_instead_of_skipping_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        _fail_or_skip("no env")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="no env"):
        _fail_or_skip("no env")


def test_available_names_the_make_target_and_never_creates(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("QDEBUG_PTQ_NNCF_ENV", str(tmp_path / "nncf"))
    monkeypatch.setenv("QDEBUG_PTQ_QUARK_ENV", str(tmp_path / "quark"))
    assert ptq_env_dir("nncf") == tmp_path / "nncf"
    why = ptq_available(PtqLibrary.NNCF)
    assert why is not None and "make ptq-env" in why and "\n" not in why
    quark_why = ptq_available("quark")
    assert quark_why is not None and "make ptq-env-quark" in quark_why
    assert not (tmp_path / "nncf").exists() and not (tmp_path / "quark").exists()
    assert "unknown PTQ library" in str(ptq_available("aimet"))
    monkeypatch.delenv("QDEBUG_PTQ_NNCF_ENV")
    assert ptq_env_dir("nncf") == REPO / ".venv-ptq-nncf"  # running from the source tree


def test_registry_and_round_trips() -> None:
    assert {"nncf-default", "nncf-mixed", "nncf-transformer", "nncf-bias-correction"} <= set(RECIPES)
    assert {"quark-xint8", "quark-a8w8", "quark-cle", "quark-minmse", "quark-adaround"} <= set(RECIPES)
    for name, recipe in RECIPES.items():
        assert recipe.name == name and recipe.description
        assert PtqRecipe.from_dict(json.loads(json.dumps(recipe.to_dict()))) == recipe
    run = PtqRun("nncf-default", "nncf", "3.4.0", "/x.onnx", 1.5, ("a note",))
    d = run.to_dict()
    assert d["schema_version"] == 1 and PtqRun.from_dict(json.loads(run.to_json())) == run
    with pytest.raises(ConfigError, match="JSON"):
        PtqRecipe(PtqLibrary.NNCF, "bad", "", {"x": object()})  # type: ignore[dict-item]


def test_bad_arguments_are_one_line_errors_naming_model_and_recipe(tmp_path: Path) -> None:
    calib = _digits(-1, 2)
    cnn = SAMPLES / "digits_cnn.onnx"
    with pytest.raises(ConfigError, match="unknown PTQ recipe 'nncf-nope'"):
        run_ptq("nncf-nope", cnn, calib, tmp_path / "o.onnx")
    with pytest.raises(ConfigError, match=r"digits_cnn\.onnx: PTQ recipe nncf-default: .*int16"):
        run_ptq("nncf-default", cnn, calib, tmp_path / "o.onnx", activation_type="int16")
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model")
    with pytest.raises(InputFileError, match=r"PTQ recipe nncf-default: .*garbage\.onnx") as info:
        run_ptq("nncf-default", garbage, calib, tmp_path / "o.onnx")
    assert "\n" not in str(info.value)
    with pytest.raises(DataError, match=r"digits_cnn\.onnx: PTQ recipe nncf-mixed: no calibration samples"):
        run_ptq("nncf-mixed", cnn, [], tmp_path / "o.onnx")
    with pytest.raises(DataError, match="'input'"):
        run_ptq("nncf-mixed", cnn, [{"x": np.zeros((1, 1, 8, 8), np.float32)}], tmp_path / "o.onnx")
    with pytest.raises(InputFileError, match="refusing to overwrite"):
        run_ptq("nncf-mixed", cnn, calib, cnn)
    assert not (tmp_path / "o.onnx").exists()


def test_workers_import_only_their_library() -> None:
    allowed = {"__future__", "importlib", "json", "sys", "time", "traceback", "typing", "numpy", "onnx"}
    for worker in ("_nncf_worker.py", "_quark_worker.py"):
        tree = ast.parse((PTQ_DIR / worker).read_text())
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module.split(".")[0])
        assert names <= allowed, (worker, names - allowed)  # the libraries load by importlib, qdebug never


def test_qdebug_never_imports_a_library() -> None:
    script = (
        "import importlib, json, pkgutil, sys\nimport qdebug.ptq\n"
        "for info in pkgutil.walk_packages(qdebug.ptq.__path__, 'qdebug.ptq.'):\n"
        "    importlib.import_module(info.name)\n"
        "from qdebug.ptq import RECIPES, ptq_available\n"
        "[ptq_available(lib) for lib in ('nncf', 'quark')]\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    modules = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "qdebug.ptq.run" in modules
    assert sorted(m for m in modules if m.split(".")[0] in LIBRARY_MODULES) == []


# --------------------------------------------------------------------------- with NNCF


def test_nncf_default_on_the_cnn(nncf: Path, tmp_path: Path) -> None:
    out = tmp_path / "cnn.nncf.onnx"
    messages: list[str] = []
    run = run_ptq("nncf-default", SAMPLES / "digits_cnn.onnx", _digits(-1, 8), out, progress=messages.append)
    assert run.model_path == str(out) and run.library == "nncf" and run.library_version == "3.4.0"
    assert _q_count(out) > 0 and any("QuantizeLinear" in n for n in run.notes)
    assert messages and "nncf-default" in messages[0]
    # On 24 held-out samples (the eval set's, not calibration's). The bound: any sound 8-bit quantization of this
    # model clears it (ORT's and NNCF's recipes all do, docs/ptq.md); wrong scales or an input left unquantized
    # would not.
    assert worst_output_sqnr(SAMPLES / "digits_cnn.onnx", out, _digits(0, 24)) > 20.0
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]  # nothing else left beside it
    assert not [m for m in sys.modules if m.split(".")[0] in LIBRARY_MODULES]


def test_nncf_transformer_mode_on_the_tiny_transformer(nncf: Path, tmp_path: Path) -> None:
    model = SAMPLES / "digits_transformer.onnx"
    out = tmp_path / "tr.nncf.onnx"
    run = run_ptq("nncf-transformer", model, _digits(-1, 8), out)
    assert run.recipe == "nncf-transformer" and _q_count(out) > 0
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])  # loads in this ONNX Runtime
    # the bound as for the CNN, lower: SmoothQuant's mode is not the best recipe for this tiny model (docs/ptq.md)
    assert worst_output_sqnr(model, out, _digits(0, 24)) > 15.0


def test_old_opset_is_converted_to_13_first(nncf: Path, tmp_path: Path) -> None:
    model = builders.tiny_convnet()
    model.opset_import[0].version = 11  # Conv/Relu/Add/GAP/Flatten/Gemm read the same at 11
    src = tmp_path / "old.onnx"
    onnx.save(model, str(src))
    rng = np.random.default_rng(0)
    calib = [{"x": rng.standard_normal((1, 1, 6, 6)).astype(np.float32)} for _ in range(8)]
    run = run_ptq("nncf-mixed", src, calib, tmp_path / "old.q.onnx")
    assert any("from opset 11 to 13" in n for n in run.notes)
    out = onnx.load(str(tmp_path / "old.q.onnx"))
    assert out.opset_import[0].version >= 13
    # per channel: the conv weights' scales are vectors, which opset 11 could not express
    scales = {i.name: i for i in out.graph.initializer}
    dq_w = [n for n in out.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in scales]
    assert any(
        len(scales[n.input[1]].dims) == 1 and scales[n.input[1]].dims[0] > 1 for n in dq_w if n.input[1] in scales
    )


def test_a_library_failure_is_one_line_naming_model_and_recipe(nncf: Path, tmp_path: Path) -> None:
    # A quantized model is refused before NNCF runs; samples of the wrong shape make NNCF itself fail.
    qdq = tmp_path / "q.onnx"
    run_ptq("nncf-default", SAMPLES / "digits_cnn.onnx", _digits(-1, 4), qdq)
    with pytest.raises(ModelError, match=r"q\.onnx: PTQ recipe nncf-default: it is already quantized"):
        run_ptq("nncf-default", qdq, _digits(-1, 4), tmp_path / "qq.onnx")
    wrong = [{"input": np.zeros((1, 1, 5, 5), np.float32)} for _ in range(4)]
    with pytest.raises(PtqError, match=r"digits_cnn\.onnx: PTQ recipe nncf-mixed: nncf 3\.4\.0 failed: ") as info:
        run_ptq("nncf-mixed", SAMPLES / "digits_cnn.onnx", wrong, tmp_path / "bad.onnx")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "bad.onnx").exists() and not (tmp_path / "qq.onnx").exists()


TELEMETRY_PROBE = """
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("worker", sys.argv[1])
worker = importlib.util.module_from_spec(spec); spec.loader.exec_module(worker)
if sys.argv[2] == "worker":
    nncf = worker._import_nncf()
else:
    import nncf
import nncf.telemetry.wrapper as w
print(json.dumps({"loaded": "openvino_telemetry" in sys.modules and sys.modules["openvino_telemetry"] is not None,
                  "stub": type(w.telemetry).__name__}))
"""


def test_telemetry_is_off(nncf: Path, tmp_path: Path) -> None:
    """The worker's NNCF never loads openvino_telemetry (which writes ~/intel and sends events); the check can
    fail: a plain ``import nncf`` in the same environment loads it and writes its client id under HOME."""
    results = {}
    for how in ("worker", "plain"):
        home = tmp_path / how
        home.mkdir()
        env = {k: v for k, v in os.environ.items() if k not in ("CI", "NNCF_CI", "PYTHONPATH")}
        env["HOME"] = str(home)
        proc = subprocess.run(
            [str(nncf), "-c", TELEMETRY_PROBE, str(PTQ_DIR / "_nncf_worker.py"), how],
            capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path, check=True,
        )  # fmt: skip
        results[how] = (json.loads(proc.stdout.strip().splitlines()[-1]), sorted(p.name for p in home.rglob("*")))
    assert results["worker"] == ({"loaded": False, "stub": "MagicMock"}, [])
    plain, written = results["plain"]
    assert plain == {"loaded": True, "stub": "NNCFTelemetry"} and "openvino_ga_cid" in written
    assert TELEMETRY_OFF["NNCF_CI"] == "1"  # and every worker also runs with NNCF's own opt-out


def test_unnamed_nodes_are_named_apart_first(nncf: Path, tmp_path: Path) -> None:
    """Exporters leave nodes without names; NNCF refuses a graph where two share one (the empty name too), so the
    copy it gets names them apart (the tensors, and so the outputs measured, keep theirs)."""
    model = onnx.load(str(SAMPLES / "digits_cnn.onnx"))
    for node in model.graph.node:
        node.name = ""
    src = tmp_path / "unnamed.onnx"
    onnx.save(model, str(src))
    run = run_ptq("nncf-default", src, _digits(-1, 8), tmp_path / "q.onnx")
    assert any("named first" in n for n in run.notes)
    assert worst_output_sqnr(src, tmp_path / "q.onnx", _digits(0, 24)) > 20.0
    assert not any(n.name for n in onnx.load(str(src)).graph.node)  # the user's file is untouched
