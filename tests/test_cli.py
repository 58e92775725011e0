"""The CLI in-process: quantize → debug, tables, JSON, --output, --fail-below, --color, --config."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import builders
import numpy as np
import pytest
from conftest import assert_one_line_error, save

from qdebug.cli import build_parser
from qdebug.debugger import DebugOptions, debug
from qdebug.errors import EXIT_CODES, EXIT_GATE, EXIT_OK, EXIT_USAGE
from qdebug.render.text import GREEN, RED, RESET, YELLOW, fmt_db
from qdebug.report import DebugReport

ANSI = re.compile(r"\x1b\[[0-9;]*m")
COLORED = re.compile(r"\x1b\[(3[123])m\s*([^\x1b]*?)\s*\x1b\[0m")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """tiny_convnet quantized through the CLI (module-wide)."""
    from qdebug.cli import main

    root = tmp_path_factory.mktemp("cli")
    f = save(builders.tiny_convnet(), root / "tiny.onnx")
    q = root / "tiny.qdq.onnx"
    assert main(["quantize", "-f", str(f), "-o", str(q), "--samples", "8", "--seed", "3"], out=_Sink()) == 0
    return f, q


class _Sink:
    def write(self, s: str) -> int:
        return len(s)

    def flush(self) -> None:
        pass


def test_quantize_then_debug(tmp_path: Path, run_cli) -> None:
    f = save(builders.tiny_convnet(), tmp_path / "m.onnx")
    q = tmp_path / "m.qdq.onnx"
    r = run_cli("quantize", "-f", f, "-o", q, "--samples", "8", "--activation-type", "uint8")
    assert r.code == EXIT_OK, r.stderr
    assert f"wrote {q}" in r.out
    assert re.search(r"nodes quantized 6/6 \(20 Q/DQ nodes\)", r.out), r.out
    assert "on 8 samples" in r.out
    assert q.is_file() and q.with_suffix(".calib.json").is_file()

    r = run_cli("debug", "-f", f, "-q", q, "--samples", "4", "--top", "3")
    assert r.code == EXIT_OK, r.stderr
    text = r.out
    for title in (
        "Model outputs (quantized vs float)",
        "Worst 3 local SQNR",
        "Worst 3 cumulative SQNR",
        "Worst 3 weight SQNR",
    ):
        assert title in text
    for kind in ("outputs", "local", "cumulative", "weight"):
        line = rf"^{kind}: count \d+  mean [-\d.]+  std [\d.]+  min [-\d.]+  max [-\d.]+ dB"
        assert re.search(line, text, re.M), kind
    worst_local = text.split("Worst 3 local SQNR")[1].split("\nlocal:")[0]
    assert "\nflat " not in worst_local  # its local SQNR is +inf: never among the worst
    assert "identical (inf)" in text
    assert not ANSI.search(text)  # not a terminal: no colour
    # the worst local table lists exactly 3 rows between the dashes and the summary
    block = text.split("Worst 3 local SQNR")[1].split("\nlocal:")[0].strip().splitlines()
    assert len(block) == 2 + 1 + 3  # title rest, header, dashes, 3 rows


def test_quantize_json(tmp_path: Path, run_cli) -> None:
    f = save(builders.tiny_convnet(), tmp_path / "m.onnx")
    r = run_cli("quantize", "-f", f, "-o", tmp_path / "q.onnx", "--samples", "4", "--per-channel",
                "--weight-type", "int8", "--json")  # fmt: skip
    assert r.code == 0, r.stderr
    d = json.loads(r.out)
    assert d["schema_version"] == 2 and d["choice"] is None  # weight flags given: followed exactly
    assert d["config"]["per_channel"] is True and d["config"]["weight_type"] == "int8"
    assert d["num_calibration_samples"] == 4 and d["nodes_total"] == 6  # Relu folded into the Q


def test_debug_json_schema(pair: tuple[Path, Path], run_cli) -> None:
    f, q = pair
    r = run_cli("debug", "-f", f, "-q", q, "--samples", "3", "--json")
    assert r.code == 0, r.stderr
    d = json.loads(r.out, parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}"))
    assert d["schema_version"] == 4  # the debug report (qdebug.report.SCHEMA_VERSION)
    assert {"activations", "weights", "model_outputs", "summary"} <= set(d)
    assert len(d["activations"]) == 7 and len(d["weights"]) == 6 and len(d["model_outputs"]) == 1
    for a in d["activations"]:
        assert {"tensor_name", "local_sqnr_db", "cumulative_sqnr_db"} <= set(a)
    for w in d["weights"]:
        assert {"weight_name", "weight_sqnr_db"} <= set(w)
    for o in d["model_outputs"]:
        assert {"output_name", "cumulative_sqnr_db"} <= set(o)
        assert isinstance(o["cumulative_sqnr_db"], float)
    for kind in ("local", "cumulative", "weight"):
        assert {"count", "mean", "std", "min", "max"} <= set(d["summary"][kind])
        assert d["summary"][kind]["count"] > 0
    flat = next(a for a in d["activations"] if a["tensor_name"] == "flat")
    assert flat["local_sqnr_db"] == "inf"
    assert d["meta"]["num_samples"] == 3
    # the printed numbers are the API's numbers
    api = debug(f, q, None, DebugOptions(num_samples=3))
    assert d["model_outputs"][0]["cumulative_sqnr_db"] == api.model_outputs[0].cumulative_sqnr_db


def test_output_file_reads_back_equal(pair: tuple[Path, Path], tmp_path: Path, run_cli) -> None:
    f, q = pair
    out = tmp_path / "reports" / "r.json"
    r = run_cli("debug", "-f", f, "-q", q, "--samples", "3", "-o", out, "--json")
    assert r.code == 0, r.stderr
    loaded = DebugReport.load(out)
    printed = DebugReport.from_json(r.out)
    assert loaded.to_dict() == printed.to_dict()
    api = debug(f, q, None, DebugOptions(num_samples=3))
    assert loaded.activations == api.activations
    assert loaded.weights == api.weights
    assert loaded.model_outputs == api.model_outputs
    assert loaded.summary == api.summary
    np.testing.assert_array_equal(loaded.per_sample.values, api.per_sample.values)
    assert loaded.per_sample.tensor_names == api.per_sample.tensor_names
    r = run_cli("debug", "-f", f, "-q", q, "--samples", "3", "-o", tmp_path / "r2.json")
    assert f"report written to {tmp_path / 'r2.json'}" in r.out


def test_fail_below(pair: tuple[Path, Path], run_cli) -> None:
    f, q = pair
    out_db = debug(f, q, None, DebugOptions(num_samples=3)).model_outputs[0].cumulative_sqnr_db
    assert 20 < out_db < 80
    high = run_cli("debug", "-f", f, "-q", q, "--samples", "3", "--fail-below", f"{out_db + 0.01:.3f}")
    assert high.code == EXIT_GATE == 10
    assert "FAIL" in high.stderr and "y (" in high.stderr and "Traceback" not in high.stderr
    assert "Model outputs" in high.out  # the report is still printed
    low = run_cli("debug", "-f", f, "-q", q, "--samples", "3", "--fail-below", f"{out_db - 0.01:.3f}")
    assert low.code == EXIT_OK, low.stderr
    assert low.stderr == ""


def test_fail_below_on_undefined_output(tmp_path: Path, run_cli) -> None:
    f, q = builders.zero_tensors()  # output 'diff' is undefined: it must fail any gate
    r = run_cli("debug", "-f", save(f, tmp_path / "f.onnx"), "-q", save(q, tmp_path / "q.onnx"), "--samples", "2",
                "--fail-below", "-1000")  # fmt: skip
    assert r.code == EXIT_GATE
    assert "diff (undefined)" in r.stderr


@pytest.mark.parametrize(
    ("value", "status", "color", "text"),
    [
        (40.5, "ok", GREEN, "40.50"),
        (40.0, "ok", YELLOW, "40.00"),
        (20.0, "ok", YELLOW, "20.00"),
        (19.99, "ok", RED, "19.99"),
        (-3.0, "ok", RED, "-3.00"),
        (math.inf, "identical", GREEN, "inf"),
        (None, "undefined", RED, "undefined"),
        (None, "nonfinite", RED, "nonfinite"),
    ],
)
def test_fmt_db_colours(value: float | None, status: str, color: str, text: str) -> None:
    assert fmt_db(value, status, color=True) == f"{color}{fmt_db(value, status)}{RESET}"
    assert fmt_db(value, status).strip() == text


def _check_colours(text: str) -> set[str]:
    seen = set()
    for code, value in COLORED.findall(text):
        color = f"\x1b[{code}m"
        seen.add(color)
        if value in ("undefined", "nonfinite", "missing"):
            assert color == RED, value
        elif value == "inf":
            assert color == GREEN
        else:
            v = float(value)
            assert color == (GREEN if v > 40 else YELLOW if v >= 20 else RED), (value, code)
    return seen


def test_color_always_by_thresholds(tmp_path: Path, run_cli) -> None:
    f1, q1, _ = builders.per_channel_weights()
    r = run_cli("debug", "-f", save(f1, tmp_path / "f1.onnx"), "-q", save(q1, tmp_path / "q1.onnx"), "--samples",
                "3", "--color", "always")  # fmt: skip
    assert r.code == 0, r.stderr
    seen = _check_colours(r.out)
    f2, q2 = builders.nonfinite_model()
    np.savez(tmp_path / "d.npz", x=np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 1, 8))
    r2 = run_cli("debug", "-f", save(f2, tmp_path / "f2.onnx"), "-q", save(q2, tmp_path / "q2.onnx"), "--data",
                 tmp_path / "d.npz", "--color", "always")  # fmt: skip
    assert r2.code == 0, r2.stderr
    seen |= _check_colours(r2.out)
    assert seen == {GREEN, YELLOW, RED}
    assert "nonfinite" in ANSI.sub("", r2.out)
    assert "tensor(s) hold NaN/Inf" in r2.out
    never = run_cli("debug", "-f", tmp_path / "f1.onnx", "-q", tmp_path / "q1.onnx", "--samples", "3", "--color",
                    "never")  # fmt: skip
    assert not ANSI.search(never.out)
    assert ANSI.sub("", r.out).replace(" ", "") == never.out.replace(" ", "")


def test_config_file_and_contradicting_flag(tmp_path: Path, run_cli) -> None:
    f = save(builders.tiny_convnet(), tmp_path / "m.onnx")
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"activation_type": "uint16", "per_channel": True, "num_samples": 4}))
    r = run_cli("quantize", "-f", f, "-o", tmp_path / "q.onnx", "-c", cfg, "--activation-type", "int8")
    assert_one_line_error(r, EXIT_USAGE, "activation_type", "'uint16'", "'int8'", "conflicting")
    assert not (tmp_path / "q.onnx").exists()
    # agreeing flags are fine, and the file's settings are used
    ok = run_cli("quantize", "-f", f, "-o", tmp_path / "q.onnx", "-c", cfg, "--activation-type", "uint16", "--json")
    assert ok.code == 0, ok.stderr
    d = json.loads(ok.out)
    assert d["config"]["activation_type"] == "uint16" and d["config"]["per_channel"] is True
    assert d["num_calibration_samples"] == 4


def test_bad_config_file(tmp_path: Path, run_cli) -> None:
    f = save(builders.tiny_convnet(), tmp_path / "m.onnx")
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"activation_type": "uint16", "colour": "blue", "num_samples": 0}))
    r = run_cli("quantize", "-f", f, "-o", tmp_path / "q.onnx", "-c", cfg)
    assert_one_line_error(r, EXIT_USAGE, str(cfg), "colour")
    cfg.write_text("{not json")
    assert_one_line_error(run_cli("quantize", "-f", f, "-o", tmp_path / "q.onnx", "-c", cfg), EXIT_USAGE, "JSON")


def test_usage_errors_and_version(run_cli, capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli("debug", "-f", "a.onnx")  # -q missing
    assert r.code == EXIT_USAGE and "required" in r.stderr and "Traceback" not in r.stderr
    assert run_cli("frobnicate").code == EXIT_USAGE
    assert run_cli("debug", "-f", "a", "-q", "b", "--data", "d.npz", "--samples", "3").code == EXIT_USAGE
    v = run_cli("--version")
    assert v.code == 0 and "qdebug 0.1.0" in v.stdout
    h = run_cli("debug", "--help")
    assert h.code == 0
    for code in EXIT_CODES:
        assert re.search(rf"^\s+{code}\s", h.stdout, re.M), code
    assert build_parser().prog == "qdebug"


def test_samples_must_be_positive(pair: tuple[Path, Path], run_cli) -> None:
    f, q = pair
    assert_one_line_error(run_cli("debug", "-f", f, "-q", q, "--samples", "0"), EXIT_USAGE, "--samples")


def test_debug_with_data_max_samples_and_ignore_key(pair: tuple[Path, Path], tmp_path: Path, run_cli) -> None:
    f, q = pair
    data = tmp_path / "eval.npz"
    np.savez(data, x=np.random.default_rng(0).random((6, 1, 1, 6, 6)).astype(np.float32), label=np.arange(6))
    r = run_cli("debug", "-f", f, "-q", q, "--data", data, "--ignore-key", "label", "--max-samples", "4", "--json")
    assert r.code == 0, r.stderr
    d = json.loads(r.out)
    assert d["meta"]["num_samples"] == 4 and len(d["per_sample"]["values"]) == 4
    assert_one_line_error(run_cli("debug", "-f", f, "-q", q, "--data", data), 5, str(data), "'label'")


def test_quantize_dynamic_batch_with_input_shape(tmp_path: Path, run_cli) -> None:
    f = save(builders.tiny_convnet(batch="N"), tmp_path / "dyn.onnx")
    q = tmp_path / "dyn.qdq.onnx"
    r = run_cli("quantize", "-f", f, "-o", q, "--samples", "4", "--input-shape", "x:2,1,6,6")
    assert r.code == EXIT_OK, r.stderr
    r = run_cli("debug", "-f", f, "-q", q, "--samples", "2", "--input-shape", "x:2,1,6,6", "--json")
    assert r.code == EXIT_OK, r.stderr
    assert json.loads(r.out)["meta"]["num_samples"] == 2
    r = run_cli("quantize", "-f", f, "-o", q, "--samples", "4", "--input-shape", "x:2,3,6,6")
    assert_one_line_error(r, 5, "'x'", "[2, 3, 6, 6]")


def test_capture_former_name_is_accepted_not_shown(pair: tuple[Path, Path], run_cli) -> None:
    """``--capture numpy`` (the fetch backend's former name) still runs, recorded as ``fetch``; help lists ``fetch``."""
    f, q = pair
    r = run_cli("debug", "-f", f, "-q", q, "--samples", "2", "--capture", "numpy", "--json")
    assert r.code == 0, r.stderr
    assert json.loads(r.out)["meta"]["capture"]["backend"] == "fetch"
    shown = run_cli("debug", "--help").stdout
    assert "{auto,graph,fetch,compiled}" in shown and "numpy" not in shown
