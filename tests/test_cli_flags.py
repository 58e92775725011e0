"""One set of global flags on every command: ``--color``, ``--json``, ``--quiet`` parse the same everywhere (defined
once, in ``qdebug.cli._base.add_global_flags``); ``--json`` on a command without a document of its own prints the run's
summary; ``--quiet`` leaves stdout empty."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import builders
import pytest
from conftest import save

from qdebug.cli import TOOLS, build_parser
from qdebug.errors import EXIT_OK, EXIT_USAGE

GLOBAL = ["--color", "always", "--json", "--quiet"]


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


@pytest.mark.parametrize("tool", TOOLS, ids=lambda t: t.name)
def test_every_command_parses_the_global_flags(tool: object) -> None:
    name = tool.name  # type: ignore[attr-defined]
    sp = _subparsers()[name]
    flags = {s: a for a in sp._actions for s in a.option_strings if s in ("--color", "--json", "--quiet")}
    assert set(flags) == {"--color", "--json", "--quiet"}, name
    assert tuple(flags["--color"].choices or ()) == ("auto", "always", "never") and flags["--color"].default == "auto"
    assert flags["--json"].default is False and flags["--quiet"].default is False
    positionals = ["x" for a in sp._actions if not a.option_strings and a.required]
    for argv in (GLOBAL, ["--color", "never"], ["--json"], ["--quiet"]):
        args, extra = build_parser().parse_known_args([name, *positionals, *argv])
        assert not extra, (name, argv, extra)
        assert args.tool is tool
    args, _ = build_parser().parse_known_args([name, *positionals, *GLOBAL])
    assert (args.color, args.json, args.quiet) == ("always", True, True)
    with pytest.raises(SystemExit):  # one set of choices everywhere
        build_parser().parse_known_args([name, *positionals, "--color", "sometimes"])


def test_json_without_a_document_prints_the_run_summary(tmp_path: Path, run_cli) -> None:
    r = run_cli("notebooks", tmp_path / "nb", "--json")
    assert r.code == EXIT_OK, r.stderr
    doc = json.loads(r.out)
    assert doc == {"schema_version": 1, "command": "notebooks", "exit_code": 0, "outputs": [str(tmp_path / "nb")]}
    assert "copied" in r.stderr  # the text goes to stderr: stdout is only the JSON
    again = run_cli("notebooks", tmp_path / "nb", "--json")  # refused by the pre-flight: the summary says so too
    assert again.code == EXIT_USAGE
    failed = json.loads(again.out)
    assert failed["exit_code"] == EXIT_USAGE and failed["outputs"] == [] and "--force" in failed["error"]
    assert again.stderr.startswith("qdebug: error:") and again.stderr.count("\n") == 1


def test_quiet_prints_nothing_but_the_json_document(tmp_path: Path, run_cli) -> None:
    quiet = run_cli("notebooks", tmp_path / "a", "--quiet")
    assert quiet.code == EXIT_OK and quiet.out == "" and quiet.stdout == "" and quiet.stderr == ""
    assert (tmp_path / "a" / "quickstart.ipynb").is_file()
    summary = run_cli("notebooks", tmp_path / "b", "--quiet", "--json")
    assert json.loads(summary.out)["outputs"] == [str(tmp_path / "b")] and summary.stderr == ""
    f = save(builders.tiny_convnet(), tmp_path / "m.onnx")
    q = tmp_path / "m.qdq.onnx"
    r = run_cli("quantize", "-f", f, "-o", q, "--samples", "4", "--quiet", "--color", "always")
    assert r.code == EXIT_OK and r.out == "" and q.is_file(), r.stderr
    doc = run_cli("debug", "-f", f, "-q", q, "--samples", "2", "--quiet", "--json", "--color", "always")
    assert doc.code == EXIT_OK, doc.stderr
    assert json.loads(doc.out)["model_outputs"]  # --quiet keeps the command's own document; --color is harmless
