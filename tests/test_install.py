"""The newcomer's path after ``pip install qdebug``: the wheel built from the sources, installed into a fresh virtual
environment, run from a folder outside the repository — ``qdebug demo --copy samples``, then the README's "Use it"
commands word for word on the copied files; ``qdebug demo`` and ``--copy`` end with the next command to try; an
installed qdebug names no Makefile target.

The wheel is built with pip (its build dependencies from pip's configured index, as for any user); only qdebug itself
is installed into the new environment, its dependencies are this test environment's (a ``.pth`` line), so no
dependency is downloaded. ``tests/browser/test_installed.py`` does the full ``pip install 'qdebug[ui]'``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from typing import Any

import pytest

from qdebug.samples import SAMPLE_DIR, list_samples

REPO = Path(__file__).resolve().parents[1]
#: What a wheel is built from (a copy: building in the checkout would leave build/ and egg-info behind).
SOURCES = ("pyproject.toml", "setup.py", "README.md", "qdebug", "widgets", "sample_models", "notebooks")


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{shlex.join(cmd)} -> {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def readme_commands() -> list[str]:
    """The commands of the README's first shell block under "Use it", backslash continuations joined."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Use it\n", 1)[1]
    block = section.split("```bash\n", 1)[1].split("\n```", 1)[0]
    return [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip() and not c.startswith("#")]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The wheel, a venv holding only it (its dependencies: this environment's), and a work folder outside the repo."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, src / name)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "--disable-pip-version-check", "-w",
          str(tmp / "dist"), str(src)], tmp)  # fmt: skip
    (wheel,) = (tmp / "dist").glob("qdebug-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
          "--disable-pip-version-check", str(wheel)], tmp)  # fmt: skip
    purelib = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp).strip())
    # this environment's packages after the venv's own (a path line: its .pth files, the editable qdebug's, not run)
    (purelib / "zz-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}}
    env |= {"PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", "VIRTUAL_ENV": str(venv)}
    env |= {"QDEBUG_DEEPLOY_ENV": str(tmp / "no-deeploy"), "QDEBUG_PTQ_NNCF_ENV": str(tmp / "no-nncf")}
    work = tmp / "work"
    work.mkdir()
    return {"wheel": wheel, "venv": venv, "python": python, "env": env, "work": work}


def test_the_wheel_carries_every_sample_file(installed: dict[str, Any]) -> None:
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    for sample in list_samples():
        for path in (sample.path, sample.calibration, sample.evaluation):
            assert f"qdebug/_data/sample_models/{path.name}" in names, path.name
    out = _run([str(installed["python"]), "-c", "import qdebug; print(qdebug.__file__)"], installed["work"],
               installed["env"])  # fmt: skip
    assert out.startswith(str(installed["venv"])), out  # the installed copy, never the checkout


def test_demo_copy_then_the_readme_commands_from_the_installed_wheel(installed: dict[str, Any]) -> None:
    work, env = installed["work"], installed["env"]
    commands = readme_commands()
    assert commands[0] == "qdebug demo --copy samples", commands
    assert all(c.startswith("qdebug ") for c in commands), commands  # plain qdebug: no .venv/bin, no sample_models/
    outputs = []
    for command in commands:
        argv = shlex.split(command)
        outputs.append(_run([str(installed["venv"] / "bin" / argv[0]), *argv[1:], "--color", "never"], work, env))
    assert sorted(p.name for p in (work / "samples").iterdir()) == sorted(p.name for p in _copied())
    copy_lines = outputs[0].strip().splitlines()
    assert copy_lines[-1].startswith("next: qdebug fix -f samples/digits_cnn.onnx"), copy_lines
    assert (work / "out" / "model.qdq.onnx").is_file() and (work / "out" / "report.json").is_file()
    # the commands --copy prints run as printed, in the folder it was given
    tried = [line.strip() for line in copy_lines if line.startswith("  qdebug ")]
    assert len(tried) == 3, copy_lines
    for command in tried:
        argv = shlex.split(command)
        _run([str(installed["venv"] / "bin" / argv[0]), *argv[1:], "--quiet"], work, env)
    assert (work / "out" / "report.html").stat().st_size > 0


def test_an_installed_qdebug_names_no_makefile_target(installed: dict[str, Any]) -> None:
    script = (
        "from qdebug.targets.deeploy_env import deeploy_available\n"
        "from qdebug.ptq import ptq_available\n"
        "print(deeploy_available()[1]); print(ptq_available('nncf'))\n"
    )
    out = _run([str(installed["python"]), "-c", script], installed["work"], installed["env"])
    deeploy, nncf = out.strip().splitlines()
    assert "make " not in out, out
    assert "created on first use" in deeploy and "`qdebug build --target deeploy`" in deeploy, deeploy
    assert "created on first use" in nncf and "`qdebug fix --library nncf-default`" in nncf, nncf
    helps = _run([str(installed["venv"] / "bin" / "qdebug"), "fix", "--help"], installed["work"], installed["env"])
    assert not re.search(r"\bmake [a-z]", helps), helps


def _copied() -> list[Path]:
    files = {SAMPLE_DIR / "registry.json"}
    for sample in list_samples():
        files |= {sample.path, sample.calibration, sample.evaluation}
    return sorted(files)


# ---------------------------------------------------------------------------------------------- in-process
def test_demo_ends_with_the_next_command_to_try(tmp_path: Path, run_cli) -> None:
    out = tmp_path / "demo"
    r = run_cli("demo", "--sample", "digits_cnn", "--output-dir", out, "--max-samples", "8", "--color", "never")
    assert r.code == 0, r.stderr
    last = r.out.strip().splitlines()[-1]
    assert last.startswith("next: qdebug fix -f "), last
    argv = shlex.split(last.removeprefix("next: "))
    assert Path(argv[argv.index("-f") + 1]).is_file() and Path(argv[argv.index("-d") + 1]).is_file()
    assert argv[argv.index("-o") + 1] == str(out / "fixed.qdq.onnx")


def test_demo_copy_leaves_identical_files_and_refuses_a_different_one(tmp_path: Path, run_cli) -> None:
    target = tmp_path / "s"
    first = run_cli("demo", "--copy", target)
    assert first.code == 0, first.stderr
    for src in _copied():
        assert (target / src.name).read_bytes() == src.read_bytes()
    assert first.out.strip().splitlines()[-1].startswith(f"next: qdebug fix -f {target}/digits_cnn.onnx")
    again = run_cli("demo", "--copy", target)  # the same files: nothing to do, nothing refused
    assert again.code == 0, again.stderr
    (target / "digits_eval.npz").write_bytes(b"mine")
    refused = run_cli("demo", "--copy", target)
    assert refused.code == 2 and "digits_eval.npz exists and is not the bundled" in refused.stderr
    assert (target / "digits_eval.npz").read_bytes() == b"mine"
    unused = run_cli("demo", "--copy", tmp_path / "t", "--max-samples", "4")
    assert unused.code == 2 and "--max-samples has no effect with --copy" in unused.stderr
    assert not (tmp_path / "t").exists()


def test_the_notebooks_find_the_samples_wherever_they_run() -> None:
    """Every walkthrough reads the samples through ``qdebug.samples`` (the wheel's copy when installed), never a
    path relative to the repository, and tells no one to run make."""
    import json

    from qdebug.samples import NOTEBOOK_DIR, WALKTHROUGHS

    for name in WALKTHROUGHS:
        cells = json.loads((NOTEBOOK_DIR / name).read_text(encoding="utf-8"))["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        text = "\n".join("".join(c["source"]) for c in cells)
        assert "from qdebug.samples import SAMPLE_DIR" in code, name
        assert "sample_models" not in code and ".venv" not in text, name
        assert not re.search(r"\bmake [a-z]", text), name
