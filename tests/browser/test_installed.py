"""The product as a user installs it: build the wheel, ``pip install 'qdebug[ui]'`` into a fresh virtual environment
outside the checkout, and from a folder that is not the repository run ``qdebug demo``, serve ``qdebug dashboard``
and load it in chromium, copy the walkthroughs with ``qdebug notebooks`` and execute one of them.

Nothing here may find the repository: the working directory and every path the installed qdebug uses are under
``tmp_path``, and ``PYTHONPATH`` is cleared. Dependencies come from pip's configured index (its cache makes a
second run fast).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from browser.conftest import REPO, assert_no_page_errors, free_port, serve, server_env

pytestmark = pytest.mark.slow

#: What a wheel is built from (a copy: building in the checkout would leave build/ and egg-info behind).
SOURCES = ("pyproject.toml", "setup.py", "README.md", "qdebug", "widgets", "sample_models", "notebooks")
PIP_TIMEOUT_S = 1200


def _copy_sources(dest: Path) -> Path:
    dest.mkdir()
    for name in SOURCES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, dest / name)
    return dest


def _env(venv: Path, tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    return {**env, **server_env(tmp)}


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)} -> {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A wheel built from a copy of the sources, installed with [ui] into a fresh venv; returns its paths."""
    tmp = tmp_path_factory.mktemp("installed")
    src = _copy_sources(tmp / "src")
    dist = tmp / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)],
        tmp,
        dict(os.environ),
    )
    (wheel,) = dist.glob("qdebug-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp, dict(os.environ))
    env = _env(venv, tmp)
    _run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{wheel}[ui]"],
        tmp,
        env,
        timeout=PIP_TIMEOUT_S,
    )
    work = tmp / "work"
    work.mkdir()
    return {"tmp": tmp, "wheel": wheel, "venv": venv, "env": env, "work": work}


def test_the_wheel_carries_the_samples_notebooks_and_ui(installed: dict[str, Any]) -> None:
    names = zipfile.ZipFile(installed["wheel"]).namelist()
    for must in (
        "qdebug/_data/sample_models/digits_cnn.onnx",
        "qdebug/_data/sample_models/registry.json",
        "qdebug/_data/notebooks/dashboard.ipynb",
        "qdebug/_data/notebooks/share/voila_config/voila.py",  # the dashboard's close-time kernel shutdown needs it
        "qdebug/_data/notebooks/quickstart.ipynb",
        "qdebug_widgets/__init__.py",
        "qdebug_widgets/dashboard.py",
        "qdebug/__main__.py",
        "qdebug/render/vendor/plotly-cartesian.min.js.gz",  # the HTML report's plotly.js (and its licence)
        "qdebug/render/vendor/LICENSE-plotly.js.txt",
        "qdebug/capture/kernels/_reduce.c",  # the compiled reduction's source, built on first use
    ):
        assert must in names, must
    assert not [n for n in names if n.startswith("widgets/")]  # no top-level 'widgets' to collide with
    assert not [n for n in names if n.endswith("generate.py")]  # the torch generator scripts stay in the repository
    # found through importlib.resources in site-packages, never through a source tree
    out = _run(
        [
            str(installed["venv"] / "bin" / "python"),
            "-c",
            "import qdebug, qdebug.samples as s, qdebug_widgets; print(qdebug.__file__); print(s.SAMPLE_DIR); "
            "print(s.NOTEBOOK_DIR); print(qdebug_widgets.__file__); "
            "from qdebug.capture.kernels import c_kernel; print(c_kernel.load().path)",  # built from installed source
        ],
        installed["work"],
        installed["env"],
    )
    site = str(installed["venv"] / "lib")
    for line in out.split():
        assert line.startswith(site), line
    assert str(REPO) not in out


def test_qdebug_demo_and_python_m(installed: dict[str, Any]) -> None:
    venv, env, work = installed["venv"], installed["env"], installed["work"]
    out = _run([str(venv / "bin" / "qdebug"), "demo", "--max-samples", "32", "--color", "never"], work, env)
    assert "model outputs" in out.lower() or "output" in out
    report = work / "qdebug-demo" / "report.json"
    assert f"demo report: {report}" in out and json.loads(report.read_text())["model_outputs"]
    version = _run([str(venv / "bin" / "python"), "-m", "qdebug", "--version"], work, env)
    assert version.startswith("qdebug ")


def test_qdebug_notebooks_copies_walkthroughs_that_run(installed: dict[str, Any]) -> None:
    venv, env, work = installed["venv"], installed["env"], installed["work"]
    nbdir = work / "walkthroughs"
    out = _run([str(venv / "bin" / "qdebug"), "notebooks", str(nbdir)], work, env)
    assert sorted(p.name for p in nbdir.iterdir()) == ["mixed_precision.ipynb", "quickstart.ipynb", "targets.ipynb"]
    assert "jupyter lab" in out
    # a second copy would replace the user's (edited) notebooks: refused, one line, exit 2
    again = subprocess.run(
        [str(venv / "bin" / "qdebug"), "notebooks", str(nbdir)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "--force" in again.stderr
    script = (
        "import nbformat, nbclient, sys\n"
        "nb = nbformat.read('quickstart.ipynb', as_version=4)\n"
        "nbclient.NotebookClient(nb, timeout=300, kernel_name='python3', resources={'metadata': {'path': '.'}})"
        ".execute()\n"
        "nbformat.write(nb, 'quickstart.executed.ipynb')\n"
    )
    _run([str(venv / "bin" / "python"), "-c", script], nbdir, env, timeout=900)
    nb = json.loads((nbdir / "quickstart.executed.ipynb").read_text())
    outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)


def test_qdebug_dashboard_serves_the_page(installed: dict[str, Any], page: Any, page_errors: list[str]) -> None:
    from playwright.sync_api import expect

    venv, env, work = installed["venv"], installed["env"], installed["work"]
    port = free_port()
    cmd = [str(venv / "bin" / "qdebug"), "dashboard", "--port", str(port), "--root", str(work)]
    with serve(cmd, port, cwd=work, env=env):
        page.goto(f"http://127.0.0.1:{port}/")
        expect(page.locator(".qd-dash-run")).to_be_visible()
        expect(page.locator(".qd-dash-sample select")).to_have_value(re.compile("digits"))
    assert_no_page_errors(page_errors)
