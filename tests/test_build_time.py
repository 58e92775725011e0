"""``qdebug build``'s time (issue 37): the remedies only when asked (``--remedies``) or within ``--time-budget``, the
manifest and the summary saying what was skipped and the command that runs it; every data file checked before any
work; top-1 taken from the target check's own run when it covered the labelled set (no second simulator run);
progress lines with done/total and an ETA.

Real ONNX Runtime and onnxruntime-qnn (no mocks): the sample CNN with its BatchNorms kept at uint16, whose HTP
divergence the probe locates, so remedies would apply. QNN tests fail under CI=true when onnxruntime-qnn is missing.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import numpy as np
import pytest
from conftest import SAMPLE_MODELS, CliResult, assert_one_line_error
from test_qnn_fixes import require_qnn

from qdebug.build import BuildOptions, build
from qdebug.build_manifest import BuildManifest
from qdebug.build_progress import BuildProgress, clock
from qdebug.cli.build import rerun_command
from qdebug.data import ArrayData
from qdebug.errors import EXIT_DATA, ConfigError, DataError
from qdebug.evaluate import top1_accuracy
from qdebug.model_io import input_specs, load_model
from qdebug.targets.base import CompileJob, DiagnosisBudget
from qdebug.targets.qnn_diagnosis_record import MANIFEST_KEY, RemedyKind, RemedyTrial
from qdebug.targets.qnn_options import QnnOptions
from qdebug.targets.qnn_remedies import _choose, _Ctx, _measure

CNN = SAMPLE_MODELS / "digits_cnn.onnx"
CALIB = SAMPLE_MODELS / "digits_calib.npz"
EVAL = SAMPLE_MODELS / "digits_eval.npz"
#: the BatchNorms kept at uint16: the HTP diverges there (docs/qnn.md), so the diagnosis has remedies to try
KEPT_BN = ["-f", CNN, "--target", "qnn", "--precision", "uint16", "--skip-fix", "batchnorm_folding", "--calib", CALIB]


@pytest.fixture
def qnn() -> None:
    """Marks a test as needing the real QNN compiler / HTP simulator."""
    require_qnn()


@pytest.fixture(scope="module")
def small_eval(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 6 labelled samples of the digits evaluation set."""
    with np.load(EVAL) as z:
        arrays = {k: z[k][:6] for k in z.files}
    path = tmp_path_factory.mktemp("eval") / "eval6.npz"
    np.savez(path, **arrays)
    return path


def _remedy_files(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if ".remedy." in p.name)


def test_remedies_are_not_run_by_default_and_the_manifest_says_so(
    qnn: None, run_cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    out = tmp_path / "o"
    res = run_cli("build", *KEPT_BN, "--debug-samples", "4", "-o", out)
    assert res.code == 0, res.stderr
    m = BuildManifest.load(out / "manifest.json")
    assert m.target_details[MANIFEST_KEY]["first_divergent"] is not None  # there was something to remedy
    assert m.target_details[MANIFEST_KEY]["remedies"] is None and _remedy_files(out) == []
    assert len(m.skipped) == 1 and m.skipped[0].startswith("remedies: not asked (pass --remedies")
    assert "remedy " not in res.out  # no trial started
    assert f"skipped: {m.skipped[0]}" in res.out
    rerun = next(line for line in res.out.splitlines() if line.startswith("to run them: "))
    assert rerun.endswith(f"--debug-samples 4 --remedies -o {out}-remedies")


def test_time_budget_zero_runs_no_remedy_and_says_so(
    qnn: None, run_cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    out = tmp_path / "o"
    res = run_cli("build", *KEPT_BN, "--debug-samples", "4", "--time-budget", "0", "-o", out)
    assert res.code == 0, res.stderr
    m = BuildManifest.load(out / "manifest.json")
    assert m.target_details[MANIFEST_KEY]["remedies"] is None and _remedy_files(out) == []
    (line,) = m.skipped
    assert line.startswith("remedies: ~") and line.endswith("0 s of the --time-budget left"), line
    assert "remedy " not in res.out and f"skipped {line}" in res.out  # the progress line says so as it happens
    rerun = next(x for x in res.out.splitlines() if x.startswith("to run them: "))
    assert "--time-budget" not in rerun and rerun.endswith(f"--remedies -o {out}-remedies")


def test_a_time_budget_that_fits_runs_the_remedies(qnn: None, tmp_path: Path) -> None:
    opts = BuildOptions("qnn", "uint16", skip_fixes=("batchnorm_folding",), debug_samples=4, time_budget_s=3600)
    said: list[str] = []
    m = build(CNN, tmp_path / "o", opts, data=CALIB, progress=said.append).manifest
    assert m.skipped == () and m.target_details[MANIFEST_KEY]["remedies"]["trials"]
    assert any("trying ~" in s and "remedies" in s for s in said) and any(
        s.startswith("remedy 1/") and "ETA ~" in s for s in said
    )


def _bad(tmp: Path, name: str, **arrays: np.ndarray) -> Path:
    path = tmp / name
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


def test_bad_data_fails_before_any_work_in_one_line_naming_the_file(
    qnn: None, run_cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    x = np.zeros((4, 1, 1, 8, 8), np.float32)
    unlabelled = _bad(tmp_path, "unlabelled.npz", input=x)
    wrong_dtype = _bad(tmp_path, "int.npz", input=x.astype(np.int64), label=np.zeros(4, np.int64))
    wrong_key = _bad(tmp_path, "key.npz", pixels=x)
    cases = [
        (["--eval", unlabelled], f"{unlabelled}: no label array 'label'"),
        (["--eval", wrong_dtype], f"{wrong_dtype}: input 'input' has dtype int64"),
        (["--data", wrong_key], f"{wrong_key}: missing input(s) ['input']"),
    ]
    for extra, needle in cases:
        out = tmp_path / "o"
        res = run_cli("build", *KEPT_BN, *extra, "-o", out)
        assert_one_line_error(res, EXIT_DATA, needle)
        assert res.out == "" and not out.exists()  # not a progress line: nothing started
    said: list[str] = []  # the library checks the same before its first step
    with pytest.raises(DataError, match="missing input"):
        build(CNN, tmp_path / "o", BuildOptions("qnn", "uint8"), data=CALIB, debug_data=wrong_key, progress=said.append)
    assert said == []


def test_top1_comes_from_the_check_when_it_ran_the_labelled_set(qnn: None, small_eval: Path, tmp_path: Path) -> None:
    opts = BuildOptions("qnn", "uint8", debug_samples=8)
    said: list[str] = []
    res = build(CNN, tmp_path / "o", opts, data=CALIB, eval_data=small_eval, progress=said.append)
    top1 = res.manifest.top1
    assert top1 is not None and top1.num_samples == 6 and res.manifest.num_debug_samples == 6
    assert not any("measuring top-1" in s for s in said)  # the set was not run a second time
    assert any(s.startswith("target check: 6/6 samples") for s in said)  # counted on its one run
    acc = res.manifest.target_accuracy
    assert acc is not None and acc.num_samples == 6  # the outputs on every sample, the probe on the first 4
    assert "probe: per-tensor figures over the first 4 of the 6 samples (--probe-samples)" in acc.notes
    # the same figures as running each model over the set on its own
    assert top1.float_model == top1_accuracy(res.path("float_model"), small_eval)
    assert top1.qdq_model == top1_accuracy(res.path("qdq_model"), small_eval)
    from qdebug.targets.qnn_accuracy import compiled_top1
    from qdebug.targets.qnn_options import DEFAULT_OPTIONS

    fmodel = load_model(res.path("float_model"))
    assert top1.compiled_model == compiled_top1(
        res.path("compiled_model"), small_eval, "label", fmodel, DEFAULT_OPTIONS
    )


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"time_budget_s": -1}, "time_budget_s must be a number of seconds >= 0"),
        ({"probe_samples": 0}, "probe_samples must be a positive integer"),
        ({"device": "cpu", "precision": "uint8", "time_budget_s": 60}, "--time-budget applies to --target qnn"),
    ],
)
def test_the_new_options_are_validated(kwargs: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)):
        BuildOptions(**{"device": "qnn", "precision": "uint8", **kwargs})


def test_progress_lines_count_samples_with_an_eta() -> None:
    t = [100.0]
    lines: list[str] = []
    bp = BuildProgress(lines.append, every_s=3.0, now=lambda: t[0])
    model = load_model(CNN)
    x = np.zeros((4, 1, 1, 8, 8), np.float32)
    source = bp.counted(ArrayData({"input": x}, input_specs(model)), "target check")
    assert len(source) == 4
    for _ in source:
        t[0] += 2.0  # two seconds a sample
    assert lines == [
        "target check: 1/4 samples, 2.00 s/sample, ETA 0:06",
        "target check: 3/4 samples, 2.00 s/sample, ETA 0:02",
        "target check: 4/4 samples, 2.00 s/sample, 0:08 in all",
    ]
    assert clock(3725) == "1:02:05" and clock(59.6) == "1:00"


def test_the_rerun_command_asks_for_the_remedies_in_a_new_folder() -> None:
    argv = ["build", "-f", "m.onnx", "--time-budget", "10", "--no-remedies", "-o", "out/b", "--json"]
    assert rerun_command(argv, "out/b/") == "qdebug build -f m.onnx --json --remedies -o out/b-remedies"
    assert (
        rerun_command(["build", "-f", "a b.onnx", "--output=x"], "x")
        == "qdebug build -f 'a b.onnx' --remedies -o x-remedies"
    )


def test_a_remedy_trial_that_no_longer_fits_the_budget_is_skipped_with_its_reason(tmp_path: Path) -> None:
    """Each trial is checked against the budget before it compiles: one past the deadline is not run, and why is
    recorded (the trials before it keep their results)."""
    spent = DiagnosisBudget(asked=True, deadline=time.monotonic() - 1.0, trial_s=5.0)
    ctx = _Ctx(cast(CompileJob, None), QnnOptions(), 10.0, tmp_path, budget=spent)
    trial, compiled = _measure(ctx, RemedyKind.SOC, "SM8550", tmp_path / "never-read.onnx", QnnOptions())
    assert trial is None and compiled is None and list(tmp_path.iterdir()) == []
    [(kind, why)] = ctx.over_budget
    assert kind is RemedyKind.SOC and "remedy soc (SM8550)" in why and "--time-budget left" in why


def test_a_remedy_is_chosen_when_it_keeps_the_builds_own_placement() -> None:
    """A model with a node QNN never takes keeps that CPU node in every trial: a remedy that gains is still chosen
    then, but one that adds a partition or a CPU node never is."""
    rewrite = RemedyTrial(RemedyKind.HTP_REWRITE, "Log", True, partitions=1, cpu_nodes=1, gain_db=22.5)
    split = RemedyTrial(RemedyKind.SOC, "SM8650", True, partitions=2, cpu_nodes=1, gain_db=30.0)
    more_cpu = RemedyTrial(RemedyKind.PER_CHANNEL, "pc", True, partitions=1, cpu_nodes=3, gain_db=40.0)
    assert _choose([rewrite, split, more_cpu], partitions=1, cpu_nodes=1) == 0
    assert _choose([rewrite, split, more_cpu], partitions=1, cpu_nodes=0) is None  # the build itself was clean
    small = RemedyTrial(RemedyKind.HTP_REWRITE, "Log", True, partitions=1, cpu_nodes=0, gain_db=0.5)
    assert _choose([small]) is None  # below MIN_GAIN_DB
