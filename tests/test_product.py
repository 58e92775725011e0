"""The commands a new user runs first (``qdebug demo``, ``qdebug notebooks``, ``qdebug dashboard``, ``python -m
qdebug``) and where the bundled files are found, in this checkout (the installed wheel:
tests/browser/test_installed.py)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO, assert_one_line_error

from qdebug.samples import NOTEBOOK_DIR, SAMPLE_DIR, WALKTHROUGHS, bundled, get_sample


def test_a_checkout_reads_its_own_folders() -> None:
    """An editable install has no package-data copy: the repository's folders are the bundled files."""
    assert SAMPLE_DIR == REPO / "sample_models" and NOTEBOOK_DIR == REPO / "notebooks"
    assert bundled("sample_models") == SAMPLE_DIR
    assert get_sample("digits_cnn").path == REPO / "sample_models" / "digits_cnn.onnx"


def test_an_unknown_sample_names_the_others() -> None:
    import pytest

    from qdebug.errors import ConfigError

    with pytest.raises(ConfigError, match="digits_cnn, digits_transformer"):
        get_sample("resnet")


def test_demo_quantizes_debugs_and_says_where_the_report_is(tmp_path: Path, run_cli) -> None:
    out = tmp_path / "demo"
    r = run_cli("demo", "--sample", "digits_cnn", "--output-dir", out, "--max-samples", "8", "--color", "never")
    assert r.code == 0, r.stderr
    report = out / "report.json"
    assert f"demo report: {report.resolve()}" in r.out
    assert json.loads(report.read_text())["model_outputs"]
    assert sorted(p.name for p in out.iterdir()) == ["digits_cnn.qdq.calib.json", "digits_cnn.qdq.onnx", "report.json"]


def test_demo_refuses_an_output_folder_that_is_a_file(tmp_path: Path, run_cli) -> None:
    f = tmp_path / "taken"
    f.write_text("mine")
    r = run_cli("demo", "--output-dir", f)
    assert_one_line_error(r, 2, str(f))
    assert f.read_text() == "mine"


def test_notebooks_copies_the_walkthroughs_and_never_replaces_one_unasked(tmp_path: Path, run_cli) -> None:
    target = tmp_path / "nb"
    r = run_cli("notebooks", target)
    assert r.code == 0 and sorted(p.name for p in target.iterdir()) == sorted(WALKTHROUGHS)
    for name in WALKTHROUGHS:
        assert (target / name).read_bytes() == (NOTEBOOK_DIR / name).read_bytes()
    (target / "quickstart.ipynb").write_text("my edits")
    r = run_cli("notebooks", target)
    assert_one_line_error(r, 2, "quickstart.ipynb", "--force")
    assert (target / "quickstart.ipynb").read_text() == "my edits"
    assert run_cli("notebooks", target, "--force").code == 0
    assert (target / "quickstart.ipynb").read_bytes() == (NOTEBOOK_DIR / "quickstart.ipynb").read_bytes()


def test_the_walkthroughs_find_the_samples_from_anywhere() -> None:
    """No notebook reads a path relative to the repository; they import the UI under its installed name."""
    for name in (*WALKTHROUGHS, "dashboard.ipynb"):
        text = (NOTEBOOK_DIR / name).read_text()
        assert "../sample_models" not in text and "from widgets import" not in text, name
        assert "qdebug_widgets" in text, name


def test_dashboard_serves_the_bundled_notebook_on_localhost() -> None:
    from qdebug.cli.dashboard import DEFAULT_PORT, Dashboard

    cmd = Dashboard().command(argparse.Namespace(port=DEFAULT_PORT, ip="127.0.0.1", root=None))
    assert cmd[:3] == [sys.executable, "-m", "voila"]
    assert Path(cmd[3]) == NOTEBOOK_DIR / "dashboard.ipynb" and Path(cmd[3]).is_file()
    assert "--Voila.ip=127.0.0.1" in cmd and f"--port={DEFAULT_PORT}" in cmd and "--no-browser" in cmd


def test_dashboard_runs_offline_with_room_for_uploads_and_no_orphan_kernels(tmp_path: Path) -> None:
    """qdebug's Voila template (no CDN link; its files ship with the notebooks), a kernel websocket that carries an
    upload of the documented size, and idle kernels of closed pages culled."""
    from qdebug.cli.dashboard import voila_command, voila_env
    from qdebug.samples import VOILA_DATA_DIR, VOILA_TEMPLATE

    cmd = voila_command(NOTEBOOK_DIR / "dashboard.ipynb", 8866, max_upload_mb=25)
    assert f"--template={VOILA_TEMPLATE}" in cmd
    size = next(c for c in cmd if c.startswith("--Voila.tornado_settings="))
    assert int(size.split(":")[1].strip(" }")) >= 25e6 * 2
    assert any(c.startswith("--MappingKernelManager.cull_idle_timeout=") for c in cmd)
    env = voila_env(tmp_path, 25, base={"JUPYTER_PATH": "/elsewhere"})
    assert env["JUPYTER_PATH"].split(os.pathsep) == [str(VOILA_DATA_DIR), "/elsewhere"]
    assert env["QDEBUG_DASHBOARD_ROOT"] == str(tmp_path.resolve()) and env["QDEBUG_MAX_UPLOAD_MB"] == "25"
    template = VOILA_DATA_DIR / "voila" / "templates" / VOILA_TEMPLATE
    assert {p.name for p in template.iterdir()} >= {"conf.json", "index.html.j2", "page.html"}
    assert "https://" not in (template / "page.html").read_text()
    # qdebug's voila.py: the page gets its _xsrf cookie, so its close-time kernel shutdown is not refused (403)
    paths = [cmd[i + 1] for i, c in enumerate(cmd) if c == "--Voila.config_file_paths"]
    config = Path(paths[0]) / "voila.py"
    assert config.is_file() and "c.VoilaConfiguration.prelaunch_hook" in config.read_text()


def test_dashboard_refuses_a_root_that_is_not_a_folder(tmp_path: Path, run_cli) -> None:
    r = run_cli("dashboard", "--root", tmp_path / "missing")
    assert_one_line_error(r, 2, "missing", "not a folder")


def test_python_m_qdebug_is_the_command() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "qdebug", "--version"], capture_output=True, text=True, check=False, cwd=REPO
    )
    assert proc.returncode == 0 and proc.stdout.startswith("qdebug ")


def test_dashboard_without_the_ui_extra_names_it(run_cli, monkeypatch) -> None:
    """An environment without Voila: one line, exit 6, the pip extra named; nothing is started."""
    import importlib

    import qdebug._lazy as lazy

    real = importlib.import_module

    def missing(name: str, *args: object) -> object:
        if name.split(".", maxsplit=1)[0] == "voila":
            raise ImportError(f"No module named {name!r}")
        return real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(lazy.importlib, "import_module", missing)
    r = run_cli("dashboard", "--port", "1")
    assert_one_line_error(r, 6, "voila", "qdebug[ui]")
