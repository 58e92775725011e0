"""Turn the dated benchmark entries that the docs used to carry as prose into JSON-lines data files, one per script.

This is how the files next to it were made (issue 36, the docs diet); it is kept so the extraction can be checked,
not rerun on every change. It reads the docs as they were at one commit (``git show COMMIT:docs/X.md``), finds every
Markdown table, and writes one JSON object per table row with the context the prose around it gave: the section
heading, the date, the commit and the command (the first ones mentioned between the previous table and this one, or
in the section heading or earlier in the section), the machine sentence, and the row's cells under the table's
own column names. A table whose command names no script is filed by its section (``SECTION_FILES``); the rest (runs
of the ``qdebug`` CLI itself) go to ``qdebug_cli.jsonl``. Outside ``docs/benchmarks.md`` only tables
with a date or a command nearby (measurements, not reference tables) are taken.

    .venv/bin/python benchmarks/results/extract_history.py --commit 4a00e3d
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

#: The docs whose tables are extracted.
DOCS = ("docs/benchmarks.md", "docs/mixed_precision.md", "docs/qnn.md", "docs/ui.md", "docs/deeploy.md")

#: Section headings (a prefix, lower case) whose tables name no script in their text, and the file they belong to.
SECTION_FILES = {
    "why the merged graph's session took 25 s": "profile_segments",
    "where the numpy path spends time": "profile_reduce",
    "why pp-ocrv4 rec cannot": "profile_segments",
    "segmented capture": "bench_realmodels",
    "bundled models": "bench_debug",
    "method": "bench_debug",
    "wall time after the in-graph reduction": "bench_debug",
    "results (before": "bench_debug",
    "where qdebug's time goes": "profile_debug",
    "(a) first quantize": "bench_mixed",
    "(b) one promotion step": "bench_mixed",
    "(c) ": "bench_mixed",
    "mixed precision": "bench_mixed",
    "ui: graph overlay": "bench_ui",
    "the grouped graph view": "bench_ui",
    "the dashboard on corpus models": "ui_views",
    "scale-out on ray": "bench_ray",
    "one sample's memory on the workers": "bench_ray_memory",
    "html report": "bench_html_report",
    "quantize's weight-recipe choice": "bench_quantize_choice",
    "qdebug fix side by side": "bench_fix",
    "what a build costs": "bench_qnn",
    "performance": "ui_views",
}

DATE = re.compile(r"\b(20\d\d-\d\d-\d\d)\b")
COMMIT = re.compile(r"\b(?:at|before|after|commit|=|\()\s*`?([0-9a-f]{7})\b")
SPAN = re.compile(r"`([^`]*)`")
COMMAND_WORDS = ("benchmarks/", "bench_", "profile_", "qdebug ")
SCRIPT = re.compile(r"\b((?:bench|profile)_[a-z_]+|ui_views|rss_curve|child_runs)\.py")
MACHINE = re.compile(r"[^.\n]*\b(?:\d-core|\d cores|cores?,)[^.]*\.?")


def doc_at(commit: str, path: str) -> str:
    """The text of ``path`` at ``commit``."""
    return subprocess.run(
        ["git", "-C", str(REPO), "show", f"{commit}:{path}"], check=True, capture_output=True, text=True
    ).stdout


def cells(line: str) -> list[str]:
    """The cells of one Markdown table row."""
    return [c.strip() for c in line.strip().strip("|").split("|")]


def file_for(section: str, command: str | None) -> str:
    """The data file (without extension) a table belongs to: its command's script, else its section."""
    if command and (m := SCRIPT.search(command)):
        return m.group(1)
    low = section.lower()
    for prefix, name in SECTION_FILES.items():
        if low.startswith(prefix):
            return name
    return "qdebug_cli"


def command_in(*texts: str) -> str | None:
    """The first code span (backticks paired from the start) that names a benchmark script or a qdebug command."""
    for text in texts:
        for m in SPAN.finditer(text):
            if any(w in m.group(1) for w in COMMAND_WORDS):
                return " ".join(m.group(1).split())
    return None


def first(pattern: re.Pattern[str], *texts: str) -> str | None:
    """The first match of ``pattern`` in the first text that has one."""
    for text in texts:
        if m := pattern.search(text):
            return m.group(1) if m.groups() else m.group(0).strip()
    return None


def extract(doc: str, text: str) -> list[dict[str, object]]:
    """One record per table row of ``text`` (the doc ``doc``), with its context."""
    records: list[dict[str, object]] = []
    section, context, section_text, lines = "", "", "", text.splitlines()
    i, table_no = 0, 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            section, context, section_text = line.lstrip("#").strip(), "", ""
        elif line.lstrip().startswith("|") and i + 1 < len(lines) and set(lines[i + 1].strip()) <= set("|-: "):
            header = cells(line)
            j = i + 2
            command = command_in(context, section, section_text)
            meta = {
                "source": doc,
                "section": section,
                "table": table_no,
                "date": first(DATE, section, context, section_text),
                "commit": first(COMMIT, section, context, section_text),
                "machine": first(MACHINE, context, section_text),
                "command": command,
            }
            measured = doc.endswith("benchmarks.md") or bool(command or meta["date"])
            while measured and j < len(lines) and lines[j].lstrip().startswith("|"):
                row = cells(lines[j])
                record = dict(meta)
                record.update({(h or f"col{k}"): (row[k] if k < len(row) else "") for k, h in enumerate(header)})
                record["_file"] = file_for(section, command)
                records.append(record)
                j += 1
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                j += 1
            table_no += 1
            section_text += context
            context = ""
            i = j
            continue
        else:
            context += line + "\n"
        i += 1
    return records


def main() -> None:
    """Extract every table of ``DOCS`` at ``--commit`` into ``<script>.jsonl`` files here."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commit", default="4a00e3d", help="the commit whose docs are read")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    by_file: dict[str, list[dict[str, object]]] = defaultdict(list)
    for doc in DOCS:
        for record in extract(doc, doc_at(args.commit, doc)):
            by_file[str(record.pop("_file"))].append(record)
    for name, records in sorted(by_file.items()):
        path = args.out / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
        print(f"{path.name}: {len(records)} rows")


if __name__ == "__main__":
    main()
