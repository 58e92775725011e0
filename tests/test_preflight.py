"""The pre-flight every command runs before any work (issue 34, deliverable 3; ``Tool.guard`` in
``qdebug/cli/_base.py``, the checks in ``qdebug/cli/_preflight.py``): every input, every output against every input
and every other output, labels, hold-out data, option combinations — each problem one line, the right exit code,
nothing written, nothing left behind. One test (or table) per class of defect the issue measured: tracebacks,
accepted nonsense, fails late, wrong exit codes, culprit not named, leftovers. Real tiny models, real ONNX Runtime."""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import socket
import tempfile
from pathlib import Path

import builders
import numpy as np
import onnx
import pytest
from conftest import assert_one_line_error, save, tree_hashes

from qdebug.errors import EXIT_DATA, EXIT_INPUT_FILE, EXIT_MODEL, EXIT_OK, EXIT_USAGE, ConfigError, DataError

#: tiny_convnet's input, six samples (its output scores 3 classes)
X = np.random.default_rng(0).random((6, 1, 6, 6), dtype=np.float32)
#: a folder nobody can create a file in, root included (a permission check says yes to root there)
UNWRITABLE = Path("/proc/qdebug-preflight")


@pytest.fixture
def d(tmp_path: Path, tiny_float: Path, tiny_quant) -> Path:
    """A folder with the models, data with and without labels, and a debug report of the pair."""
    shutil.copy(tiny_float, tmp_path / "m.onnx")
    shutil.copy(tiny_quant("u8"), tmp_path / "q.onnx")
    np.savez(tmp_path / "data.npz", x=X)
    np.savez(tmp_path / "lab.npz", x=X, label=np.array([0, 1, 2, 0, 1, 2]))
    np.savez(tmp_path / "held.npz", x=X + 0.5)
    from qdebug.cli import main

    argv = ["debug", "-f", tmp_path / "m.onnx", "-q", tmp_path / "q.onnx", "--samples", "2", "-o", tmp_path / "r.json"]
    assert main([str(a) for a in argv], out=io.StringIO()) == EXIT_OK
    return tmp_path


def _run_untouched(run_cli, d: Path, *argv: str | Path):
    """Run the CLI and check that it changed nothing in ``d`` (no input modified, no output, no temp file)."""
    before = tree_hashes(d)
    listing = sorted(p.name for p in d.rglob("*"))
    r = run_cli(*argv)
    assert tree_hashes(d) == before
    assert sorted(p.name for p in d.rglob("*")) == listing, r.stderr
    return r


def _labels(d: Path, name: str, labels: np.ndarray | None) -> Path:
    arrays = {"x": X} if labels is None else {"x": X, "label": labels}
    np.savez(d / name, **arrays)  # type: ignore[arg-type]
    return d / name


# ---------------------------------------------------------------------------------------------- tracebacks
@pytest.mark.parametrize(
    ("name", "content"),
    [("model.json", None), ("list.json", b"[1, 2]"), ("other.json", b'{"name": "resnet", "layers": 3}')],
    ids=["an-onnx-file", "a-json-list", "an-unrelated-json-object"],
)
def test_tracebacks_report_of_a_file_that_is_not_a_report(run_cli, d: Path, name: str, content: bytes | None) -> None:
    """It was a traceback (UnicodeDecodeError, AttributeError) or 'schema_version None' without the file's name."""
    path = d / name
    path.write_bytes((d / "m.onnx").read_bytes() if content is None else content)
    r = _run_untouched(run_cli, d, "report", path, "-o", d / "out" / "r.html")
    assert_one_line_error(r, EXIT_INPUT_FILE, str(path))
    assert "attribute" not in r.stderr and "'list'" not in r.stderr  # no Python internals in the line
    if name == "list.json":
        assert "its JSON is a list" in r.stderr


def test_tracebacks_nan_labels_with_an_accuracy_goal(run_cli, d: Path) -> None:
    nan = _labels(d, "nan.npz", np.array([0.0, 1.0, np.nan, 0.0, 1.0, 2.0]))
    r = _run_untouched(run_cli, d, "search", "-f", d / "m.onnx", "--calib", d / "data.npz", "--eval", nan,
                       "--max-accuracy-drop", "5", "-o", d / "o.json")  # fmt: skip
    assert_one_line_error(r, EXIT_DATA, str(nan), "'label'", "NaN", "sample 2")


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (["--max-upload-mb", "nan"], None, "--max-upload-mb"),
        ([], "lots", "QDEBUG_MAX_UPLOAD_MB"),
        ([], "nan", "QDEBUG_MAX_UPLOAD_MB"),
        (["--port", "70000"], None, "--port"),
    ],
    ids=["upload-nan", "env-upload-text", "env-upload-nan", "port-70000"],
)
def test_tracebacks_dashboard_numbers(run_cli, d: Path, monkeypatch, argv: list[str], env: str | None,
                                      needle: str) -> None:  # fmt: skip
    """--max-upload-mb nan and a non-numeric QDEBUG_MAX_UPLOAD_MB were tracebacks; --port 70000 waited forever."""
    import qdebug.cli.dashboard as dashboard_cli

    def never(cmd: list[str], env: dict[str, str]) -> int:
        raise AssertionError("Voila was started: the pre-flight let the command line through")

    monkeypatch.setattr(dashboard_cli, "serve", never)
    if env is not None:
        monkeypatch.setenv("QDEBUG_MAX_UPLOAD_MB", env)
    r = run_cli("dashboard", "--root", d, *argv)
    assert r.code == EXIT_USAGE and needle in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_tracebacks_notebooks_where_nothing_can_be_written(run_cli, d: Path) -> None:
    for where, needle in ((UNWRITABLE, "/proc"), (d / "data.npz" / "nb", str(d / "data.npz"))):
        r = _run_untouched(run_cli, d, "notebooks", where)
        assert_one_line_error(r, EXIT_USAGE, needle)


@pytest.mark.parametrize("where", ["loop", "n" * 300], ids=["symlink-loop", "name-300-bytes"])
def test_tracebacks_odd_paths_are_one_line_in_every_check(run_cli, d: Path, where: str) -> None:
    """ELOOP and ENAMETOOLONG from realpath/stat/samefile in the output checks, the clash checks and the tools' own
    checks (notebooks looks for notebooks already there) are one line each."""
    if where == "loop":
        (d / "loop").symlink_to("loop")
    bad = d / where
    for argv in (
        ["debug", "-f", d / "m.onnx", "-q", d / "q.onnx", "--samples", "2", "-o", bad, "--html", d / "x.html"],
        ["debug", "-f", bad, "-q", d / "q.onnx", "--samples", "2"],
        ["notebooks", bad],
        ["report", d / "r.json", "-o", d / "x.html", "--search", bad],
    ):
        r = _run_untouched(run_cli, d, *argv)
        assert r.code in (EXIT_USAGE, EXIT_INPUT_FILE) and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and where[:20] in r.stderr, r.stderr


# ---------------------------------------------------------------------------------------------- culprit not named
def test_culprit_named_report_json_of_another_kind(run_cli, d: Path) -> None:
    other = d / "other.json"
    other.write_text('{"a": 1}')
    r = _run_untouched(run_cli, d, "report", other, "-o", d / "x.html")
    assert_one_line_error(r, EXIT_INPUT_FILE, str(other), "not a qdebug debug report", "schema_version")


def test_culprit_named_report_made_from_other_models(run_cli, d: Path) -> None:
    """ORT's 'Graph output (x) does not exist' became one line naming the report and the model."""
    from qdebug.config import QuantConfig
    from qdebug.quantizer import quantize

    other_f = save(builders.other_convnet(), d / "other.onnx")
    quantize(other_f, None, QuantConfig(num_samples=2), d / "other.qdq.onnx")
    (d / "other.qdq.calib.json").unlink()
    r = _run_untouched(run_cli, d, "report", d / "r.json", "-f", other_f, "-q", d / "other.qdq.onnx",
                       "-o", d / "x.html")  # fmt: skip
    assert_one_line_error(r, EXIT_MODEL, f"{d / 'r.json'} was not made from {other_f}", "'r1'")
    r = _run_untouched(run_cli, d, "report", d / "r.json", "-f", d / "m.onnx", "-q", d / "other.qdq.onnx",
                       "-o", d / "x.html")  # fmt: skip
    assert_one_line_error(r, EXIT_MODEL, f"was not made from {d / 'other.qdq.onnx'} (quantized model")
    renamed = Path(shutil.copy(d / "m.onnx", d / "m_copy.onnx"))  # the same model under another name: fine
    r = run_cli("report", d / "r.json", "-f", renamed, "-q", d / "q.onnx", "--stats-samples", "2", "-o", d / "ok.html")
    assert r.code == EXIT_OK, r.stderr


# ---------------------------------------------------------------------------------------------- wrong exit codes
def test_wrong_exit_code_missing_search_result_is_an_input_file_error(run_cli, d: Path) -> None:
    r = _run_untouched(run_cli, d, "report", d / "r.json", "--search", d / "missing.json", "-o", d / "x.html")
    assert_one_line_error(r, EXIT_INPUT_FILE, "--search", "missing.json", "no such file")


def test_several_problems_one_line_lowest_exit_code_first(run_cli, d: Path) -> None:
    """Every problem at once: a usage problem (2) and a missing input (3) in one line, exit 2."""
    r = _run_untouched(run_cli, d, "debug", "-f", d / "m.onnx", "-q", d / "nope.onnx", "--max-samples", "3")
    assert_one_line_error(r, EXIT_USAGE, "nope.onnx", "no such file", "--max-samples has no effect")


# ---------------------------------------------------------------------------------------------- accepted nonsense
@pytest.mark.parametrize("command", ["debug", "diagnose", "suggest", "report"])
def test_accepted_nonsense_one_model_as_float_and_quantized(run_cli, d: Path, command: str) -> None:
    """`report -f M -q M` was accepted silently; by real path or hard link, for every command reading the pair."""
    os.link(d / "q.onnx", d / "q_link.onnx")
    head = [command, d / "r.json", "-o", d / "x.html"] if command == "report" else [command, "--samples", "2"]
    for f, q in ((d / "q.onnx", d / "q.onnx"), (d / "q_link.onnx", d / "q.onnx")):
        r = _run_untouched(run_cli, d, *head, "-f", f, "-q", q)
        assert_one_line_error(r, EXIT_USAGE, "are the same file", str(q))


@pytest.mark.parametrize(
    ("labels", "words"),
    [
        (np.full(6, 99), ["6 of 6 are 3 or more", "first: 99", "0..2"]),
        (np.array([0, 1, 2, 0, 1, 3]), ["1 of 6 are 3 or more", "sample 5"]),
        (np.array([0, -1, 2, 0, 1, 2]), ["negative"]),
        (np.array([0.5, 1.0, 2.0, 0.0, 1.0, 2.0]), ["not whole numbers"]),
        (np.array(["a", "b", "c", "a", "b", "c"]), ["not class indices"]),
        (np.array([0, 1]), ["2 labels for 6 samples"]),
        (None, ["no label array 'label'", "--label-key"]),
    ],
    ids=["all-99", "one-past-the-classes", "negative", "fractional", "strings", "too-few", "none"],
)
def test_accepted_nonsense_labels_that_cannot_be_class_indices(run_cli, d: Path, labels, words: list[str]) -> None:
    """Every label 99 on a 3-class model gave 'float top-1 0 %' and 'goal reached', exit 0."""
    bad = _labels(d, "bad.npz", labels)
    for argv in (
        ["search", "-f", d / "m.onnx", "--calib", d / "data.npz", "--eval", bad, "--max-accuracy-drop", "5",
         "-o", d / "o.json"],
        ["build", "-f", d / "m.onnx", "--target", "cpu", "--precision", "uint8", "--eval", bad, "-o", d / "b"],
    ):  # fmt: skip
        r = _run_untouched(run_cli, d, *argv)
        assert_one_line_error(r, EXIT_DATA, str(bad), *words)


def test_label_problems_and_class_count() -> None:
    from qdebug.data import label_problems
    from qdebug.evaluate import num_classes

    assert label_problems(np.array([0, 1, 2]), 3) == []
    assert label_problems(np.array([0.0, 2.0]), 3) == []  # whole floats are indices
    assert any("NaN" in p for p in label_problems(np.array([np.inf, 0.0])))
    assert any("not class indices" in p for p in label_problems(np.array([True, False])))
    assert num_classes(builders.tiny_convnet()) == 3
    assert num_classes(builders.tiny_convnet(batch="N")) == 3  # a dynamic leading axis is the batch
    assert num_classes(builders.tiny_convnet(), "gap") == 4  # an inner tensor: its shape inferred


def _holdout_cases(d: Path) -> dict[str, list[str | Path]]:
    os.link(d / "data.npz", d / "hard.npz")
    shutil.copy(d / "data.npz", d / "copy.npz")
    np.savez_compressed(d / "resaved.npz", x=X[:4])  # other bytes, the same samples
    return {
        "hard-link-of-calib": ["--holdout", d / "hard.npz"],
        "copy-of-calib": ["--holdout", d / "copy.npz"],
        "resaved-samples-of-calib": ["--holdout", d / "resaved.npz"],
        "copy-of-data": ["--data", d / "data.npz", "--holdout", d / "copy.npz"],  # calibrated on held.npz
    }


def test_accepted_nonsense_holdout_by_content_not_path(run_cli, d: Path) -> None:
    """--holdout a hard link (or a copy, or the same samples saved again) of --calib/--data was reported as 'samples
    the search never saw'."""
    cases = _holdout_cases(d)
    for name, extra in cases.items():
        calib = d / ("held.npz" if "data" in name else "data.npz")
        r = _run_untouched(run_cli, d, "search", "-f", d / "m.onnx", "--calib", calib, *extra,
                           "--goal-sqnr", "10", "--debug-samples", "2", "-o", d / "o.json")  # fmt: skip
        assert_one_line_error(r, EXIT_USAGE, "--holdout", "the search sees them")


def test_seen_holdout_counts_shared_samples() -> None:
    """Some held-out samples shared: counted (a warning in the CLI), not refused."""
    from qdebug.mixed.holdout import seen_holdout
    from qdebug.model_io import input_specs

    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        np.savez(t / "calib.npz", x=X)
        np.savez(t / "mixed.npz", x=np.concatenate([X[:2], X[:2] + 0.5]))
        specs = input_specs(builders.tiny_convnet())
        seen = seen_holdout(t / "mixed.npz", {"--calib": (t / "calib.npz", None), "--data": (None, None)}, specs)
        assert (seen.samples, seen.seen, seen.all_seen) == (4, 2, False)
        line = seen.describe("mixed.npz")
        assert line is not None and "2 of the 4" in line and "--calib" in line
        debug_only = seen_holdout(t / "mixed.npz", {"--data": (t / "calib.npz", 1)}, specs)
        assert debug_only.seen == 1  # only the debug samples the search reads count


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["debug", "-f", "{m}", "-q", "{q}", "--samples", "2", "-o", "{d}/X", "--html", "{d}/X"], "the same file"),
        (["diagnose", "-f", "{m}", "-q", "{q}", "--samples", "2", "-o", "{d}/X", "--html", "{d}/X"], "the same file"),
        (["build", "-f", "{m}", "--target", "cpu", "--precision", "uint8", "-o", "{d}/out", "--html",
          "{d}/out/report.json"], "the folder build writes whole"),
        (["search", "-f", "{m}", "--goal-sqnr", "10", "--remedies", "-o", "{d}/X", "--remedy-output", "{d}/X"],
         "the same file"),
        (["search", "-f", "{m}", "--goal-sqnr", "10", "-o", "{d}/X", "--workdir", "{d}/X"], "the same file"),
        (["debug", "-f", "{m}", "-q", "{q}", "--samples", "2", "-o", "{d}/r.json", "--html", "{d}/r_link.html"],
         "the same file"),
    ],
    ids=["debug-o-is-html", "diagnose-o-is-html", "build-html-inside-the-build", "search-o-is-remedy-output",
         "search-o-is-workdir", "debug-html-hard-links-o"],
)  # fmt: skip
def test_accepted_nonsense_an_output_over_another_output(run_cli, d: Path, argv: list[str], needle: str) -> None:
    os.link(d / "r.json", d / "r_link.html")
    r = _run_untouched(run_cli, d, *[a.format(d=d, m=d / "m.onnx", q=d / "q.onnx") for a in argv])
    assert_one_line_error(r, EXIT_USAGE, needle)


#: (argv after the command's head, the option refused): an option that does nothing with the others given.
NO_EFFECT = {
    "debug": [
        (["--samples", "2", "--max-samples", "3"], "--max-samples"),
        (["--samples", "2", "--ignore-key", "label"], "--ignore-key"),
        (["-d", "{d}/data.npz", "--seed", "0"], "--seed"),  # the default value given: still refused
        (["-d", "{d}/data.npz", "--distribution", "normal"], "--distribution"),
        (["-d", "{d}/data.npz", "--input-shape", "x:1,1,6,6"], "--input-shape"),
        (["--samples", "2", "--stats-samples", "4"], "--stats-samples"),
        (["--samples", "2", "--json", "--diagnose"], "--diagnose"),
        (["--samples", "2", "--json", "--top", "3"], "--top"),
        (["--samples", "2", "--batch", "2", "--capture", "graph"], "graph does not batch"),
    ],
    "suggest": [
        (["--samples", "2", "--groups"], "--groups"),
        (["--samples", "2", "--to", "int16"], "--to"),
        (["--samples", "2", "--config", "{d}/cfg.json"], "--config"),
        (["--samples", "2", "--all", "--top", "3"], "--top"),
    ],
    "search": [
        (["--goal-sqnr", "10", "--measure-top", "3"], "--measure-top"),
        (["--goal-sqnr", "10", "--rank", "efficiency", "--strategy", "greedy"], "--rank"),
        (["--goal-sqnr", "10", "--max-evaluations", "5"], "--max-evaluations"),
        (["--goal-sqnr", "10", "--candidates-per-step", "2"], "--candidates-per-step"),
        (["--goal-sqnr", "10", "--max-cost-fraction", "0.5", "--strategy", "measured"], "--max-cost-fraction"),
        (["--goal-sqnr", "10", "--target-samples", "2"], "--target-samples"),
        (["--goal-sqnr", "10", "--label-key", "y"], "--label-key"),
        (["--max-accuracy-drop", "1", "--eval", "{d}/lab.npz", "--holdout-samples", "2"], "--holdout-samples"),
        (["--goal-sqnr", "10", "--remedy-output", "{d}/r2.json"], "--remedy-output"),
        (["--goal-sqnr", "10", "--no-target-fixes"], "--no-target-fixes"),
    ],
    "build": [
        (["--stats-samples", "4"], "--stats-samples"),
        (["--label-key", "y"], "--label-key"),
        (["--snap-grid", "fine"], "--snap-grid"),
        (["--bisect", "auto"], "--bisect"),  # the default value given: BuildOptions alone could not tell
        (["--soc", "SM8650"], "--soc"),
    ],
    "quantize": [
        (["--calib", "{d}/data.npz", "--seed", "1"], "--seed"),
        (["--calib", "{d}/data.npz", "--input-shape", "x:1,1,6,6"], "--input-shape"),
    ],
    "report": [
        (["--stats-samples", "4"], "--stats-samples"),
        (["-d", "{d}/data.npz"], "--data"),
    ],
}
HEADS = {
    "debug": ["debug", "-f", "{d}/m.onnx", "-q", "{d}/q.onnx"],
    "suggest": ["suggest", "-f", "{d}/m.onnx", "-q", "{d}/q.onnx"],
    "search": ["search", "-f", "{d}/m.onnx", "--calib", "{d}/data.npz", "-o", "{d}/o.json"],
    "build": ["build", "-f", "{d}/m.onnx", "--target", "cpu", "--precision", "uint8", "-o", "{d}/b"],
    "quantize": ["quantize", "-f", "{d}/m.onnx", "-o", "{d}/qq.onnx"],
    "report": ["report", "{d}/r.json", "-o", "{d}/x.html"],
}
_NO_EFFECT_CASES = [(c, argv, flag) for c, cases in NO_EFFECT.items() for argv, flag in cases]


@pytest.mark.parametrize(("command", "argv", "flag"), _NO_EFFECT_CASES,
                         ids=[f"{c}-{f.lstrip('-')}" for c, _, f in _NO_EFFECT_CASES])  # fmt: skip
def test_accepted_nonsense_an_option_with_no_effect_is_refused(run_cli, d: Path, command: str, argv: list[str],
                                                               flag: str) -> None:  # fmt: skip
    """The rule of docs/cli.md: an option that changes nothing given the others is a usage error naming it."""
    (d / "cfg.json").write_text('{"activation_type": "uint8"}')
    r = _run_untouched(run_cli, d, *[a.format(d=d) for a in [*HEADS[command], *argv]])
    assert_one_line_error(r, EXIT_USAGE, flag)


def test_given_options_tells_a_default_value_given_from_none() -> None:
    from qdebug.cli import build_parser
    from qdebug.cli._preflight import given_options

    top = build_parser()
    argv = ["debug", "-f", "m", "-q", "q", "--seed", "0", "--ignore-key", "a", "--json"]
    args = top.parse_args(argv)
    assert given_options(top, args.parser, argv) == {"float_model", "quant_model", "seed", "ignore_key", "json"}
    assert args.seed == 0 and args.ignore_key == ["a"]  # the parser's defaults are back
    again = top.parse_args(["debug", "-f", "m", "-q", "q"])
    assert again.seed == 0 and again.ignore_key == [] and again.json is False


# ---------------------------------------------------------------------------------------------- fails late
def test_fails_late_build_eval_without_labels_is_refused_before_any_work(run_cli, d: Path) -> None:
    """`build --target qnn --eval data.npz` without labels failed after compile and simulation; the same question
    is asked first, whatever the target (cpu here: nothing is quantized, nothing printed)."""
    r = _run_untouched(run_cli, d, "build", "-f", d / "m.onnx", "--target", "cpu", "--precision", "uint8",
                       "--eval", d / "data.npz", "-o", d / "b")  # fmt: skip
    assert_one_line_error(r, EXIT_DATA, str(d / "data.npz"), "no label array 'label'")
    assert r.out == ""  # not even "... quantizing"


@pytest.mark.parametrize("target", ["cpu", "qnn", "deeploy"])
def test_fails_late_check_eval_data_asks_what_every_target_will(tmp_path: Path, target: str) -> None:
    """The function ``build`` calls before any work, with each target's options (QNN is not compiled: the question
    needs only the float model and the labels)."""
    from qdebug.build import BuildOptions
    from qdebug.build_inputs import check_eval_data
    from qdebug.targets.base import get_target

    precision = next(iter(get_target(target).precisions))
    options = BuildOptions(device=target, precision=precision)
    model = builders.tiny_convnet()
    np.savez(tmp_path / "none.npz", x=X)
    with pytest.raises(DataError, match="no label array 'label'"):
        check_eval_data(model, tmp_path / "none.npz", options)
    np.savez(tmp_path / "nine.npz", x=X, label=np.full(6, 9))
    with pytest.raises(DataError, match="3 or more"):
        check_eval_data(model, tmp_path / "nine.npz", options)
    np.savez(tmp_path / "ok.npz", x=X, label=np.arange(6) % 3)
    check_eval_data(model, tmp_path / "ok.npz", options)
    region = BuildOptions(device=target, precision=precision, extract_inputs=("r1",), extract_outputs=("gap",))
    np.savez(tmp_path / "four.npz", x=X, label=np.full(6, 3))  # 'gap' has 4 channels: 3 is a class there
    check_eval_data(model, tmp_path / "four.npz", region)
    check_eval_data(model, None, options)


# ---------------------------------------------------------------------------------------------- leftovers
def test_leftovers_unwritable_html_refused_before_the_report_is_written(run_cli, d: Path) -> None:
    """debug wrote r.json, then failed on the HTML: half the outputs stayed."""
    r = _run_untouched(run_cli, d, "debug", "-f", d / "m.onnx", "-q", d / "q.onnx", "--samples", "2",
                       "-o", d / "new.json", "--html", UNWRITABLE / "r.html")  # fmt: skip
    assert_one_line_error(r, EXIT_USAGE, "--html", "cannot create a file in /proc")


def test_leftovers_html_a_folder_leaves_no_build(run_cli, d: Path) -> None:
    (d / "folder").mkdir()
    r = _run_untouched(run_cli, d, "build", "-f", d / "m.onnx", "--target", "cpu", "--precision", "uint8",
                       "-o", d / "b", "--html", d / "folder")  # fmt: skip
    assert_one_line_error(r, EXIT_USAGE, "--html", "is a folder")


def test_leftovers_outputs_are_all_written_or_none(tmp_path: Path) -> None:
    """A failure while writing the second output removes the first: no partial set (``staged_outputs``)."""
    from qdebug.cli._base import staged_outputs

    a, b = tmp_path / "a.json", tmp_path / "sub" / "b.html"
    with pytest.raises(RuntimeError), staged_outputs(str(a), str(b), None) as staged:
        staged[str(a)].write_text("a")
        raise RuntimeError("the HTML could not be rendered")
    assert not a.exists() and not b.exists()
    assert [p.name for p in tmp_path.rglob("*")] == ["sub"]  # its folder (removed by main when empty), no temp
    with staged_outputs(str(a), str(b)) as staged:
        staged[str(a)].write_text("a")
        staged[str(b)].write_text("b")
        assert not a.exists()  # nothing in place before the end
    assert a.read_text() == "a" and b.read_text() == "b"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a.json", "b.html", "sub"]


def test_leftovers_debug_html_that_fails_late_leaves_no_report(run_cli, d: Path, monkeypatch) -> None:
    """The HTML fails after the pre-flight passed (here: its renderer raises): the report JSON is not left."""
    import qdebug.cli.debug as debug_cli

    def broken(path: Path, report: object, diags: object) -> None:
        Path(path).write_text("half")
        raise ConfigError("the HTML report could not be rendered")

    monkeypatch.setattr(debug_cli, "write_html", broken)
    r = _run_untouched(run_cli, d, "debug", "-f", d / "m.onnx", "-q", d / "q.onnx", "--samples", "2",
                       "-o", d / "new.json", "--html", d / "new.html")  # fmt: skip
    assert_one_line_error(r, EXIT_USAGE, "could not be rendered")


def test_leftovers_voila_runtime_folder_removed_when_it_fails_to_start(run_cli, tmp_path: Path, monkeypatch) -> None:
    """Voila that cannot start (its port taken between the pre-flight and its start) exits; its connection files'
    folder goes with it. Real Voila."""
    pytest.importorskip("voila")
    from qdebug.cli.dashboard import Dashboard

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = run_cli("dashboard", "--root", tmp_path, "--port", port)  # the pre-flight sees it taken
        assert_one_line_error(r, EXIT_USAGE, f"--port {port}", "in use")
        args = argparse.Namespace(root=str(tmp_path), port=port, ip="127.0.0.1", max_upload_mb=None)
        with pytest.raises(ConfigError, match="Voila exited"):
            Dashboard().run(args, io.StringIO())
    assert list(tmp.iterdir()) == []


def test_voila_env_points_its_runtime_files_at_the_folder_given(tmp_path: Path) -> None:
    from qdebug.cli.dashboard import voila_env

    env = voila_env(tmp_path, 25, base={}, runtime_dir=tmp_path / "rt")
    assert env["JUPYTER_RUNTIME_DIR"] == str(tmp_path / "rt") and env["QDEBUG_MAX_UPLOAD_MB"] == "25"


# ---------------------------------------------------------------------------------------------- the good path
def test_a_clean_command_line_still_runs(run_cli, d: Path) -> None:
    r = run_cli("debug", "-f", d / "m.onnx", "-q", d / "q.onnx", "-d", d / "data.npz", "-o", d / "out" / "r.json",
                "--html", d / "out" / "r.html", "--stats-samples", "2")  # fmt: skip
    assert r.code == EXIT_OK, r.stderr
    assert json.loads((d / "out" / "r.json").read_text())["meta"]["num_samples"] == 6
    assert (d / "out" / "r.html").stat().st_size > 0
    assert sorted(p.name for p in (d / "out").iterdir()) == ["r.html", "r.json"]  # no staging folder left
    onnx.checker.check_model(onnx.load(str(d / "m.onnx")))  # inputs untouched and valid
