"""Execute the user-facing notebooks (``notebooks/*.ipynb`` except ``dashboard*``, which has its own Voila test)
with nbclient, as a user would run them from ``notebooks/``, and check what they show."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
#: ``dashboard*`` notebooks are served by Voila and tested in the browser by their own test.
EXECUTED = sorted(p for p in NOTEBOOKS.glob("*.ipynb") if not p.name.startswith("dashboard"))
CELL_TIMEOUT_S = 300
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
PLOTLY_MIME = "application/vnd.plotly.v1+json"


def _ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


def execute(path: Path) -> Any:
    """Run every cell of ``path`` in a fresh ``python3`` kernel (jupyter_client starts it with this interpreter)
    with ``notebooks/`` as the working directory; returns the executed notebook."""
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    return nb


def outputs(nb: Any) -> list[Any]:
    """Every output of every code cell."""
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


def stdout_text(nb: Any) -> str:
    """All text printed to stdout."""
    return "".join(o.get("text", "") for o in outputs(nb) if o.output_type == "stream" and o.name == "stdout")


def mimetypes(nb: Any) -> set[str]:
    """The MIME types of every rich output."""
    return {m for o in outputs(nb) if o.output_type in ("execute_result", "display_data") for m in o.data}


@pytest.fixture(scope="module")
def executed() -> dict[str, Any]:
    """Cache: notebook stem -> executed notebook (each notebook runs once per test session)."""
    return {}


def run(stem: str, cache: dict[str, Any]) -> Any:
    """The executed notebook ``notebooks/<stem>.ipynb`` (executed on first use)."""
    if stem not in cache:
        t0 = time.perf_counter()
        cache[stem] = execute(NOTEBOOKS / f"{stem}.ipynb")
        print(f"{stem}.ipynb executed in {time.perf_counter() - t0:.1f} s")
    return cache[stem]


def test_python3_kernel_is_this_interpreter() -> None:
    """The ``python3`` kernelspec starts this interpreter (jupyter_client swaps a bare ``python`` for
    ``sys.executable``), so the notebooks see the qdebug under test, not another environment's."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    assert spec.argv[0] in ("python", "python3", sys.executable), (spec.resource_dir, spec.argv)


def test_notebooks_exist() -> None:
    names = {p.stem for p in EXECUTED}
    assert {"quickstart", "mixed_precision", "targets"} <= names, names


@pytest.mark.parametrize("path", EXECUTED, ids=_ids(EXECUTED))
def test_notebook_is_clean(path: Path) -> None:
    """Committed without outputs, for the ``python3`` kernel, with markdown explaining the views."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code
    assert all(not c.outputs and c.execution_count is None for c in code), f"{path.name}: strip the outputs"
    assert sum(c.cell_type == "markdown" for c in nb.cells) >= 3


@pytest.mark.slow
@pytest.mark.parametrize("path", EXECUTED, ids=_ids(EXECUTED))
def test_notebook_runs_without_errors(path: Path, executed: dict[str, Any]) -> None:
    nb = run(path.stem, executed)
    errors = [o for o in outputs(nb) if o.output_type == "error"]
    assert not errors, [f"{o.ename}: {o.evalue}" for o in errors]
    stderr = "".join(o.get("text", "") for o in outputs(nb) if o.output_type == "stream" and o.name == "stderr")
    assert "Traceback" not in stderr, stderr


@pytest.mark.slow
def test_quickstart_shows_the_report_and_the_app(executed: dict[str, Any]) -> None:
    nb = run("quickstart", executed)
    text = stdout_text(nb)
    assert "worst output SQNR:" in text
    assert "originator candidate:" in text
    assert "text/html" in mimetypes(nb)  # the report table
    last = [o for o in nb.cells[-1].outputs if o.output_type == "execute_result"]
    assert last and WIDGET_MIME in last[0].data, "the last cell displays the DebuggerApp widget"
    assert "DebuggerApp" in last[0].data["text/plain"]


@pytest.mark.slow
def test_mixed_precision_round_trips_through_the_cli(executed: dict[str, Any]) -> None:
    nb = run("mixed_precision", executed)
    text = stdout_text(nb)
    assert "promote 2 tensor(s) to uint16" in text  # plan.describe()
    assert "worst output SQNR:" in text and "->" in text  # before/after
    assert "goal reached: True" in text
    assert PLOTLY_MIME in mimetypes(nb)  # the Pareto figure
    assert "exit code 0" in text
    assert "models match: True" in text


@pytest.mark.slow
def test_targets_reports_each_target_or_why_not(executed: dict[str, Any]) -> None:
    nb = run("targets", executed)
    text = stdout_text(nb)
    lines = {ln.split()[0]: ln for ln in text.splitlines() if ln.split() and ln.split()[0] in ("qnn", "deeploy")}
    assert set(lines) == {"qnn", "deeploy"}, text
    qnn_ok = " available:" in lines["qnn"]
    deeploy_ok = " available:" in lines["deeploy"]
    if os.environ.get("CI") == "true":  # make test installs onnxruntime-qnn and the Deeploy environment
        assert qnn_ok and deeploy_ok, text
    if qnn_ok:
        assert "partitions: 1," in text and "single partition: True" in text
        assert "HTP vs float" in text and "top-1 on" in text
        assert "recompile ok: True" in text
    else:
        assert "QNN skipped:" in text
    if deeploy_ok:
        assert "Generic: ok True, integer only True" in text
        assert "Network.c" in text
        assert "fold_dequant_quant_to_requantshift" in text  # the export passes
    else:
        assert "Deeploy skipped:" in text


@pytest.mark.slow
def test_dashboard_notebook_executes(executed: dict[str, Any]) -> None:
    """The Voila entry point also runs under nbclient (its browser test is tests/browser/test_dashboard_voila.py):
    clean, no error, and its one output is the Dashboard widget."""
    path = NOTEBOOKS / "dashboard.ipynb"
    nb0 = nbformat.read(path, as_version=4)
    assert all(not c.outputs for c in nb0.cells if c.cell_type == "code"), "strip the outputs"
    nb = run("dashboard", executed)
    assert not [o for o in outputs(nb) if o.output_type == "error"]
    last = [o for o in nb.cells[-1].outputs if o.output_type == "execute_result"]
    assert last and WIDGET_MIME in last[0].data and "Dashboard" in last[0].data["text/plain"]
