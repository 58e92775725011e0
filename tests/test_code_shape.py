"""The code's shape, checked like its behaviour: no function grows past ~80 lines, and no module past 600 lines,
without a written reason.

A function longer than :data:`MAX_LINES` must carry a ``# long: <why>`` comment on its ``def`` line or the line
above it (docs/architecture.md, engineering rules). Ruff's complexity rules (C901, PLR0912, PLR0915) cover
branching and statement counts; this covers plain length, which ruff does not measure. A module longer than
:data:`MAX_MODULE_LINES` must say in its docstring, after ``Why one module:``, why it is not split into rooms.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 80
PACKAGES = ("qdebug", "widgets")


def _long_functions(root: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            lines = path.read_text(encoding="utf-8").splitlines()
            for node in ast.walk(ast.parse("\n".join(lines), filename=str(path))):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                marks = lines[first - 2 : node.lineno] if first >= 2 else lines[: node.lineno]
                if length > MAX_LINES and not any("# long:" in m for m in marks):
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_is_longer_than_80_lines_without_a_reason() -> None:
    assert _long_functions() == []


def test_the_check_can_fail(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(81))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(f"def long():\n{body}\n\n\n# long: a table\ndef ok():\n{body}\n")
    assert _long_functions(tmp_path, ("pkg",)) == ["pkg/m.py:1 long (82 lines)"]


#: A module longer than this needs a written reason at its top (docs/architecture.md): rooms of one purpose each.
MAX_MODULE_LINES = 600
#: The reason's marker, in the module's docstring.
WHY_ONE_MODULE = "Why one module:"


def _large_modules(root: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            lines = text.count("\n") + (not text.endswith("\n"))
            doc = ast.get_docstring(ast.parse(text, filename=str(path))) or ""
            if lines > MAX_MODULE_LINES and WHY_ONE_MODULE not in " ".join(doc.split()):
                found.append(f"{path.relative_to(root)} ({lines} lines)")
    return found


def test_no_module_is_longer_than_600_lines_without_a_reason() -> None:
    assert _large_modules() == []


def test_the_module_check_can_fail(tmp_path: Path) -> None:
    body = "\n".join(f"x{i} = {i}" for i in range(MAX_MODULE_LINES + 1))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "big.py").write_text(f'"""A table."""\n{body}\n')
    (tmp_path / "pkg" / "why.py").write_text(f'"""A table.\n\nWhy one\nmodule: one table."""\n{body}\n')
    assert _large_modules(tmp_path, ("pkg",)) == ["pkg/big.py (602 lines)"]
