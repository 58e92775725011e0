"""The bad-input corpus, round 2: the surface added since the first corpus (tests/test_bad_input_corpus.py).

``report`` (report.json → HTML, ``--search``, ``--manifest``, the models), ``diagnose``, search's hold-out, budgets,
goals and remedies, build regions, ``--html`` on debug/diagnose/search/build, ``--workers/--ray``, the ``dashboard``
and ``notebooks`` commands, and the odd paths every reader and writer may be handed: symlink loops, 256- and
300-byte names, FIFOs, devices, folders, read-only folders, hard and symbolic links (issue 34).

Each case is one defect × one command, run in-process through ``qdebug.cli.main`` with the first corpus' harness
(:class:`Case`, its one-line check) and checked for the same things: the documented exit code, exactly one line on
stderr (no traceback), the culprit (file, option or tensor) named, every input byte-identical afterwards and nothing
left behind (no output, temp file or folder; a FIFO or device given as an output still what it was). Refusals happen
before any work, so nothing is compiled for QNN/Deeploy, no Ray cluster is started and no Voila is served:

* a FIFO is watched while the case runs: whoever opens it is let through at once (it reads end-of-file) and the case
  fails for having opened it, instead of hanging; the FIFO float model also runs in a real process (timeout 60 s);
* Ray cannot be imported in-process (a refusal is due before Ray is needed: an unfixed ``--workers 100000`` would
  fork until a limit stops it); the unreachable ``--ray`` address runs in a real process with a timeout;
* ``dashboard`` fails the case if it gets as far as starting Voila (an unfixed ``--port 70000`` waits forever).

A read-only folder is made immutable (``chattr +i``): tests run as root, for whom permission bits stop nothing.
Legal outputs are checked too (:data:`LEGAL`): a 255-byte name, or one that is not UTF-8, is written with the umask's
mode (0644 under 022); three builds into one folder at once give one build and two one-line refusals.

Cases whose defect is still being fixed (issue 34) are in :data:`PENDING`: strict xfail, so a fix makes them XPASS
and fail until they are taken out. See docs/testing.md.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import builders
import numpy as np
import onnx
import pytest
from conftest import REPO, CliResult, tree_hashes
from test_bad_input_corpus import DATA_DEFECTS, Case, Maker, X, _assert_one_line, _listing, _npz, _write

from qdebug.errors import EXIT_CLUSTER, EXIT_DATA, EXIT_INPUT_FILE, EXIT_MODEL, EXIT_OK, EXIT_USAGE


def _ids(reason: str, ids: str) -> dict[str, str]:
    return dict.fromkeys(ids.split(), reason)


#: The defects still being fixed in parallel (issue 34), by case id: strict xfail, taken out as their fixes land.
#: "not in the issue": found by this corpus, not among the issue's classes.
PENDING: dict[str, str] = {
    # **_ids("what is still wrong", """case-id case-id ..."""),  (none left: every case passes)
}


@dataclass(frozen=True)
class SurfaceCase(Case):
    """A :class:`Case` with an environment (``None``: unset) and, where the real process is the point (a hang
    bounded by a timeout, Ray), a run in a subprocess."""

    env: tuple[tuple[str, str | None], ...] = ()
    process: bool = False


# ---------------------------------------------------------------------------------------------- makers
def _symlink_loop(name: str) -> Maker:
    def make(d: Path) -> Path:
        p = d / name
        p.symlink_to(name)  # itself: ELOOP
        return p

    return make


def _long_name(suffix: str, size: int = 300) -> Maker:
    return lambda d: d / ("n" * (size - len(suffix)) + suffix)


def _fifo(name: str) -> Maker:
    def make(d: Path) -> Path:
        p = d / name
        os.mkfifo(p)
        return p

    return make


def _device(name: str) -> Maker:
    """A character device like /dev/null (1, 3), made in the case's folder: qdebug must not replace the system's."""

    def make(d: Path) -> Path:
        p = d / name
        try:
            os.mknod(p, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("making a device node needs CAP_MKNOD")
        return p

    return make


def _folder(name: str) -> Maker:
    def make(d: Path) -> Path:
        p = d / name
        p.mkdir()
        return p

    return make


def _read_only(d: Path) -> Path:
    """``d/readonly``, a folder nobody can write in, root included (immutable); skipped where that cannot be made."""
    p = d / "readonly"
    p.mkdir()
    (p / "keep.txt").write_text("already here\n")
    if os.geteuid() != 0:
        p.chmod(0o555)
        return p
    chattr = shutil.which("chattr")
    made = chattr and subprocess.run([chattr, "+i", str(p)], capture_output=True, check=False).returncode == 0
    if not made:  # root ignores permission bits: only the immutable flag stops it, and this file system lacks it
        pytest.skip("running as root and the immutable flag cannot be set here: nothing makes a folder read-only")
    return p


def _release(d: Path) -> None:
    """Undo :func:`_read_only` so the folder can be removed."""
    p = d / "readonly"
    if p.is_dir() and not p.is_symlink():
        chattr = shutil.which("chattr")
        if chattr and os.geteuid() == 0:
            subprocess.run([chattr, "-i", str(p)], capture_output=True, check=False)
        p.chmod(0o755)


def _in_read_only(name: str) -> Maker:
    return lambda d: _read_only(d) / name


def _copy(name: str, source: str) -> Maker:
    return lambda d: Path(shutil.copy(d / source, d / name))


def _doc(name: str, edit: Callable[[dict[str, object]], object], source: str = "r.json") -> Maker:
    """A copy of one of qdebug's own JSON documents (``source``, in the case's folder), edited in place."""

    def make(d: Path) -> Path:
        doc = json.loads((d / source).read_text(encoding="utf-8"))
        edit(doc)
        return _write(d, name, json.dumps(doc).encode())

    return make


def _bytes(name: str, data: bytes) -> Maker:
    return lambda d: _write(d, name, data)


DEEP = 50_000
DEEP_LIST = b"[" * DEEP + b"]" * DEEP
DEEP_OBJECT = b'{"a": ' * DEEP + b"1" + b"}" * DEEP


# ---------------------------------------------------------------------------------------------- odd input paths
#: Every option of the new surface that reads a file (and the float model of every command), ``{bad}`` where it goes.
READERS: dict[str, tuple[str, ...]] = {
    "quantize-f": ("quantize", "-f", "{bad}", "--samples", "2", "-o", "{out}/q.onnx"),
    "quantize-calib": ("quantize", "-f", "{f}", "--calib", "{bad}", "-o", "{out}/q.onnx"),
    "quantize-config": ("quantize", "-f", "{f}", "--samples", "2", "-c", "{bad}", "-o", "{out}/q.onnx"),
    "debug-f": ("debug", "-f", "{bad}", "-q", "{q}", "--samples", "2"),
    "debug-q": ("debug", "-f", "{f}", "-q", "{bad}", "--samples", "2"),
    "debug-data": ("debug", "-f", "{f}", "-q", "{q}", "-d", "{bad}"),
    "diagnose-f": ("diagnose", "-f", "{bad}", "-q", "{q}", "--samples", "2"),
    "diagnose-q": ("diagnose", "-f", "{f}", "-q", "{bad}", "--samples", "2"),
    "search-f": ("search", "-f", "{bad}", "--debug-samples", "2", "--goal-sqnr", "10", "-o", "{out}/o.json"),
    "search-holdout": ("search", "-f", "{f}", "--calib", "{calib}", "--holdout", "{bad}", "--debug-samples", "2",
                       "--goal-sqnr", "10", "-o", "{out}/o.json"),
    "search-eval": ("search", "-f", "{f}", "--calib", "{calib}", "--eval", "{bad}", "--max-accuracy-drop", "5",
                    "--debug-samples", "2", "-o", "{out}/o.json"),
    "build-f": ("build", "-f", "{bad}", "--target", "cpu", "--precision", "uint8", "-o", "{out}/b"),
    "build-eval": ("build", "-f", "{f}", "--target", "cpu", "--precision", "uint8", "--calib", "{calib}",
                   "--eval", "{bad}", "-o", "{out}/b"),
    "build-overrides": ("build", "-f", "{f}", "--target", "cpu", "--precision", "uint8", "--overrides", "{bad}",
                        "-o", "{out}/b"),
    "report-json": ("report", "{bad}", "-o", "{out}/r.html"),
    "report-f": ("report", "{report}", "-f", "{bad}", "-q", "{q}", "--stats-samples", "2", "-o", "{out}/r.html"),
    "report-q": ("report", "{report}", "-f", "{f}", "-q", "{bad}", "--stats-samples", "2", "-o", "{out}/r.html"),
    "report-data": ("report", "{report}", "-f", "{f}", "-q", "{q}", "-d", "{bad}", "-o", "{out}/r.html"),
    "report-manifest": ("report", "{report}", "--manifest", "{bad}", "-o", "{out}/r.html"),
    "report-search": ("report", "{report}", "--search", "{bad}", "-o", "{out}/r.html"),
}  # fmt: skip

#: What a path can be besides a regular file: all input-file errors (3), refused before the file is opened.
PATH_DEFECTS: list[tuple[str, Maker, int, tuple[str, ...]]] = [
    ("symlink-loop", _symlink_loop("loop.in"), EXIT_INPUT_FILE, ()),
    ("name-300-bytes", _long_name(".in"), EXIT_INPUT_FILE, ()),
    ("fifo", _fifo("fifo.in"), EXIT_INPUT_FILE, ()),
    ("dev-null", lambda d: Path(os.devnull), EXIT_INPUT_FILE, ()),
    ("missing-non-utf8-name", lambda d: Path(os.fsdecode(bytes(d) + b"/\xff\xfe.in")), EXIT_INPUT_FILE, ()),
]
#: A folder where a file is read (the first corpus has it for the float model and the data options).
FOLDER_READERS = ("debug-q", "diagnose-f", "diagnose-q", "quantize-config", "build-overrides", "report-json",
                  "report-f", "report-q", "report-manifest", "report-search")  # fmt: skip


# ---------------------------------------------------------------------------------------------- JSON documents
def _qdebug_docs(source: str, part: str) -> list[tuple[str, Maker, int, tuple[str, ...]]]:
    """What is not one of qdebug's documents (``source``: a debug report or a build manifest; ``part`` one of its
    lists): an input-file error naming the file, whatever JSON or bytes it holds."""
    return [
        ("onnx-file", lambda d: Path(shutil.copy(d / "f.onnx", d / "model.json")), EXIT_INPUT_FILE, ()),
        ("json-list", _bytes("list.json", b"[1, 2]"), EXIT_INPUT_FILE, ()),
        ("unrelated-object", _bytes("other.json", b'{"name": "resnet", "layers": 3}'), EXIT_INPUT_FILE, ()),
        ("schema-version-missing", _doc("noschema.json", lambda j: j.pop("schema_version"), source), EXIT_INPUT_FILE,
         ()),
        ("schema-version-99", _doc("v99.json", lambda j: j.update(schema_version=99), source), EXIT_INPUT_FILE, ()),
        ("schema-version-text", _doc("v_text.json", lambda j: j.update(schema_version="3"), source), EXIT_INPUT_FILE,
         ()),
        (f"{part}-not-a-list", _doc("part5.json", lambda j: j.update({part: 5}), source), EXIT_INPUT_FILE, ()),
        (f"{part}-missing", _doc("no_part.json", lambda j: j.pop(part), source), EXIT_INPUT_FILE, ()),
        ("deep-list-50000", _bytes("deep_list.json", DEEP_LIST), EXIT_INPUT_FILE, ()),
        ("deep-object-50000", _bytes("deep_object.json", DEEP_OBJECT), EXIT_INPUT_FILE, ()),
        ("empty", _bytes("empty.json", b""), EXIT_INPUT_FILE, ()),
        ("truncated", lambda d: _write(d, "half.json", (d / source).read_bytes()[:500]), EXIT_INPUT_FILE, ()),
        ("non-utf8", _bytes("latin1.json", b'{"schema_version": "\xe9"}'), EXIT_INPUT_FILE, ()),
        ("missing", lambda d: d / "nope.json", EXIT_INPUT_FILE, ()),
    ]  # fmt: skip


#: ``qdebug report``'s report.json and --manifest, with the other qdebug document each could be mistaken for.
REPORT_DOC_READERS: dict[str, tuple[tuple[str, ...], list[tuple[str, Maker, int, tuple[str, ...]]], Maker]] = {
    "report-json": (READERS["report-json"], _qdebug_docs("r.json", "activations"),
                    _doc("search_as_report.json", lambda j: None, "search.json")),
    "report-manifest": (READERS["report-manifest"], _qdebug_docs("b/manifest.json", "files"),
                        _doc("report_as_manifest.json", lambda j: None)),
}  # fmt: skip
#: ``report --search``: like the report and the manifest, a file that is not a search result is an input-file error.
SEARCH_DOCS: list[tuple[str, Maker, int, tuple[str, ...]]] = [
    ("missing", lambda d: d / "missing.json", EXIT_INPUT_FILE, ()),
    ("onnx-file", lambda d: Path(shutil.copy(d / "f.onnx", d / "model.json")), EXIT_INPUT_FILE, ()),
    ("non-utf8", _bytes("latin1.json", b'{"steps": "\xe9"}'), EXIT_INPUT_FILE, ()),
    ("json-list", _bytes("list.json", b"[1, 2]"), EXIT_INPUT_FILE, ()),
    ("unrelated-object", _bytes("other.json", b'{"name": "resnet"}'), EXIT_INPUT_FILE, ()),
    ("debug-report", lambda d: d / "r.json", EXIT_INPUT_FILE, ()),
    ("deep-list-50000", _bytes("deep_list.json", DEEP_LIST), EXIT_INPUT_FILE, ()),
    ("deep-object-50000", _bytes("deep_object.json", DEEP_OBJECT), EXIT_INPUT_FILE, ()),
    ("steps-not-a-list", _doc("steps5.json", lambda j: j.update(steps=5), "search.json"), EXIT_INPUT_FILE, ()),
    ("truncated", lambda d: _write(d, "half.json", (d / "search.json").read_bytes()[:200]), EXIT_INPUT_FILE, ()),
]
#: --config and --overrides (the first corpus has their other shapes): 50,000-deep JSON is a usage error, not a
#: RecursionError; a model given as JSON is not UTF-8 text (3).
CONFIG_DOCS: list[tuple[str, Maker, int, tuple[str, ...]]] = [
    ("deep-list-50000", _bytes("deep_list.json", DEEP_LIST), EXIT_USAGE, ()),
    ("deep-object-50000", _bytes("deep_object.json", DEEP_OBJECT), EXIT_USAGE, ()),
    ("onnx-file", lambda d: Path(shutil.copy(d / "f.onnx", d / "model.json")), EXIT_INPUT_FILE, ()),
]
CONFIG_READERS: dict[str, tuple[str, ...]] = {
    "quantize-config": READERS["quantize-config"],
    "search-config": ("search", "-f", "{f}", "-c", "{bad}", "--goal-sqnr", "10", "-o", "{out}/o.json"),
    "build-config": ("build", "-f", "{f}", "--target", "cpu", "--precision", "uint8", "-c", "{bad}", "-o", "{out}/b"),
    "quantize-overrides": ("quantize", "-f", "{f}", "--samples", "2", "--overrides", "{bad}", "-o", "{out}/q.onnx"),
    "build-overrides": READERS["build-overrides"],
}


# ---------------------------------------------------------------------------------------------- data, labels
#: Data defects of the first corpus through the readers added since (hold-out, diagnose, report's statistics).
NEW_DATA_READERS: dict[str, tuple[str, ...]] = {
    "search-holdout": READERS["search-holdout"],
    "diagnose-data": ("diagnose", "-f", "{f}", "-q", "{q}", "-d", "{bad}", "--stats-samples", "2"),
    "report-data": READERS["report-data"],
}
NEW_DATA_DEFECTS = [d for d in DATA_DEFECTS if d[0] in {
    "missing-input", "float64", "wrong-shape", "nan", "object-array", "no-samples", "missing-file", "corrupt-zip",
    "truncated-zip", "huge-header", "empty-folder"}]  # fmt: skip


def _labels(name: str, labels: np.ndarray | None, key: str = "label") -> Maker:
    arrays = {"x": X} if labels is None else {"x": X, key: labels}
    return _npz(name, **arrays)


#: Labels the top-1 cannot be computed from (tiny_convnet has 3 classes, the data 3 samples): data errors (5).
LABEL_DEFECTS: list[tuple[str, Maker, int, tuple[str, ...]]] = [
    ("nan", _labels("nan.npz", np.array([0.0, np.nan, 1.0])), EXIT_DATA, ("label",)),
    ("all-99", _labels("all99.npz", np.array([99, 99, 99])), EXIT_DATA, ("label", "99")),
    ("one-past-the-classes", _labels("three.npz", np.array([0, 1, 3])), EXIT_DATA, ("label",)),
    ("negative", _labels("negative.npz", np.array([0, -1, 2])), EXIT_DATA, ("label",)),
    ("fractional", _labels("half.npz", np.array([0.5, 1.0, 2.0])), EXIT_DATA, ("label",)),
    ("infinite", _labels("inf.npz", np.array([0.0, np.inf, 1.0])), EXIT_DATA, ("label",)),
    ("too-few", _labels("few.npz", np.array([0, 1])), EXIT_DATA, ("label",)),
    ("too-many", _labels("many.npz", np.array([0, 1, 2, 0])), EXIT_DATA, ("label",)),
    ("strings", _labels("strings.npz", np.array(["cat", "dog", "cat"])), EXIT_DATA, ("label",)),
    ("none", _labels("unlabelled.npz", None), EXIT_DATA, ("label",)),
    ("other-key", _labels("other_key.npz", np.array([0, 1, 2]), key="y_true"), EXIT_DATA, ("label",)),
]
LABEL_READERS: dict[str, tuple[str, ...]] = {
    "search-max-accuracy-drop": READERS["search-eval"],
    "search-goal-sqnr": ("search", "-f", "{f}", "--calib", "{calib}", "--eval", "{bad}", "--goal-sqnr", "10",
                         "--debug-samples", "2", "-o", "{out}/o.json"),
    "build-eval": READERS["build-eval"],
}  # fmt: skip


# ---------------------------------------------------------------------------------------------- odd output paths
#: Each output option added since the first corpus: the command with its inputs, the option, and the input that
#: ``{hardlink_<input>}`` / ``{symlink_<input>}`` alias.
OUTPUTS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "debug-html": (("debug", "-f", "{f}", "-q", "{q}", "--samples", "2"), "--html", "q"),
    "diagnose-o": (("diagnose", "-f", "{f}", "-q", "{q}", "--samples", "2"), "-o", "f"),
    "diagnose-html": (("diagnose", "-f", "{f}", "-q", "{q}", "--samples", "2"), "--html", "q"),
    "search-html": (("search", "-f", "{f}", "--calib", "{calib}", "--debug-samples", "2", "--goal-sqnr", "10",
                     "-o", "{out}/o.json"), "--html", "calib"),
    "search-remedy-output": (("search", "-f", "{f}", "--calib", "{calib}", "--debug-samples", "2", "--goal-sqnr",
                              "10", "-o", "{out}/o.json", "--remedies"), "--remedy-output", "f"),
    "build-html": (("build", "-f", "{f}", "--target", "cpu", "--precision", "uint8", "--calib", "{calib}",
                    "-o", "{out}/b"), "--html", "calib"),
    "report-o": (("report", "{report}"), "-o", "report"),
}  # fmt: skip

#: (id, the output path or its maker, needles): every one a usage error (2) before any work.
OUTPUT_DEFECTS: list[tuple[str, str | Maker, tuple[str, ...]]] = [
    ("under-a-file", "{calib}/x.out", ("{calib}",)),
    ("name-256-bytes", "{dir}/" + "n" * 256, ("255",)),
    ("a-folder", _folder("a_folder"), ("{bad}", "folder")),
    ("a-fifo", _fifo("fifo.out"), ("{bad}",)),
    ("a-device", _device("null.out"), ("{bad}",)),
    ("symlink-loop", _symlink_loop("loop.out"), ("{bad}",)),
    ("in-a-read-only-folder", _in_read_only("x.out"), ("{dir}/readonly",)),
    ("hard-link-of-an-input", "{hardlink_{input}}", ("{%s}",)),
    ("symlink-to-an-input", "{symlink_{input}}", ("{%s}",)),
]

#: Two outputs of one command that are the same file, or one inside the other (2, before any work).
OUTPUT_COLLISIONS: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    ("debug-o-is-html", ("debug", "-f", "{f}", "-q", "{q}", "--samples", "2", "-o", "{dir}/x", "--html", "{dir}/x"),
     ("{dir}/x",)),
    ("debug-html-hard-links-o", ("debug", "-f", "{f}", "-q", "{q}", "--samples", "2", "-o", "{dir}/old.json",
                                 "--html", "{dir}/old_link.html"), ("old",)),
    ("debug-html-symlinks-o", ("debug", "-f", "{f}", "-q", "{q}", "--samples", "2", "-o", "{dir}/old.json",
                               "--html", "{dir}/old_symlink.html"), ("old",)),
    ("diagnose-o-is-html", ("diagnose", "-f", "{f}", "-q", "{q}", "--samples", "2", "-o", "{dir}/x",
                            "--html", "{dir}/x"), ("{dir}/x",)),
    ("search-o-is-remedy-output", ("search", "-f", "{f}", "--calib", "{calib}", "--debug-samples", "2",
                                   "--goal-sqnr", "10", "--remedies", "-o", "{dir}/x", "--remedy-output", "{dir}/x"),
     ("{dir}/x",)),
    ("search-o-is-html", ("search", "-f", "{f}", "--calib", "{calib}", "--debug-samples", "2", "--goal-sqnr", "10",
                          "-o", "{dir}/x", "--html", "{dir}/x"), ("{dir}/x",)),
    ("search-remedy-output-is-html", ("search", "-f", "{f}", "--calib", "{calib}", "--debug-samples", "2",
                                      "--goal-sqnr", "10", "--remedies", "-o", "{out}/o.json",
                                      "--remedy-output", "{dir}/x", "--html", "{dir}/x"), ("{dir}/x",)),
    ("search-o-is-workdir", ("search", "-f", "{f}", "--calib", "{calib}", "--debug-samples", "2", "--goal-sqnr",
                             "10", "-o", "{dir}/x", "--workdir", "{dir}/x"), ("{dir}/x",)),
    ("build-html-is-its-report", ("build", "-f", "{f}", "--target", "cpu", "--precision", "uint8", "--calib",
                                  "{calib}", "-o", "{out}", "--html", "{out}/report.json"), ("{out}",)),
    ("build-html-is-its-manifest", ("build", "-f", "{f}", "--target", "cpu", "--precision", "uint8", "--calib",
                                    "{calib}", "-o", "{out}", "--html", "{out}/manifest.json"), ("{out}",)),
    ("build-html-is-the-folder", ("build", "-f", "{f}", "--target", "cpu", "--precision", "uint8", "--calib",
                                  "{calib}", "-o", "{out}", "--html", "{out}"), ("{out}",)),
    ("report-o-is-manifest", ("report", "{report}", "--manifest", "{manifest}", "-o", "{manifest}"),
     ("{manifest}",)),
    ("report-o-is-search", ("report", "{report}", "--search", "{search}", "-o", "{search}"), ("{search}",)),
    ("report-o-is-q", ("report", "{report}", "-f", "{f}", "-q", "{q}", "-o", "{q}"), ("{q}",)),
]  # fmt: skip


# ---------------------------------------------------------------------------------------------- identities
#: The hold-out must be samples the search never saw: refused by content, not by path (2, naming --holdout).
HOLDOUT: list[tuple[str, tuple[str, ...], Maker | None]] = [
    ("holdout-is-calib", ("--holdout", "{calib}"), None),
    ("holdout-hard-links-calib", ("--holdout", "{hardlink_calib}"), None),
    ("holdout-symlinks-calib", ("--holdout", "{symlink_calib}"), None),
    ("holdout-copies-calib", ("--holdout", "{bad}"), _copy("calib_copy.npz", "calib.npz")),
    ("holdout-hard-links-data", ("-d", "{calib2}", "--holdout", "{hardlink_calib2}"), None),
    ("holdout-copies-data", ("-d", "{calib2}", "--holdout", "{bad}"), _copy("calib2_copy.npz", "calib2.npz")),
]
HOLDOUT_HEAD = ("search", "-f", "{f}", "--calib", "{calib}", "--debug-samples", "2", "--goal-sqnr", "10",
                "--holdout-samples", "2", "-o", "{out}/o.json")  # fmt: skip

#: A report read with models it was not made from, or one model given as both (4 and 2).
MISMATCH: list[tuple[str, tuple[str, ...], int, tuple[str, ...]]] = [
    ("report-of-other-models", ("report", "{report}", "-f", "{other_f}", "-q", "{other_q}", "-o", "{out}/r.html"),
     EXIT_MODEL, ("{report}",)),
    ("report-of-other-quant", ("report", "{report}", "-f", "{f}", "-q", "{other_q}", "-o", "{out}/r.html"),
     EXIT_MODEL, ("{other_q}",)),
    ("report-f-is-q-float", ("report", "{report}", "-f", "{f}", "-q", "{f}", "-o", "{out}/r.html"), EXIT_USAGE,
     ("{f}",)),
    ("report-f-is-q-quant", ("report", "{report}", "-f", "{q}", "-q", "{q}", "-o", "{out}/r.html"), EXIT_USAGE,
     ("{q}",)),
    ("debug-f-is-q", ("debug", "-f", "{q}", "-q", "{q}", "--samples", "2"), EXIT_USAGE, ("{q}",)),
    ("diagnose-f-hard-links-q", ("diagnose", "-f", "{hardlink_q}", "-q", "{q}", "--samples", "2"), EXIT_USAGE,
     ("{q}",)),
    ("holdout-shorter-than-holdout-samples", ("search", "-f", "{f}", "--calib", "{calib}", "--debug-samples", "2",
                                              "--goal-sqnr", "10", "--holdout", "{calib2}", "--holdout-samples", "5",
                                              "-o", "{out}/o.json"), EXIT_DATA, ("{calib2}",)),
]  # fmt: skip


#: What the issue saw fail late (after a compile, or with one output already written): refused before any work.
LATE: list[tuple[str, tuple[str, ...], int, tuple[str, ...], Maker | None]] = [
    ("build-qnn-eval-without-labels", ("build", "-f", "{f}", "--target", "qnn", "--precision", "uint8", "--calib",
                                       "{calib}", "--eval", "{bad}", "-o", "{out}/b"), EXIT_DATA, ("{bad}", "label"),
     _labels("unlabelled.npz", None)),
    ("debug-o-then-html-in-a-read-only-folder", (*("debug", "-f", "{f}", "-q", "{q}", "--samples", "2"), "-o",
                                                 "{out}/r.json", "--html", "{bad}"), EXIT_USAGE, ("{dir}/readonly",),
     _in_read_only("r.html")),
    ("diagnose-o-then-html-in-a-read-only-folder", ("diagnose", "-f", "{f}", "-q", "{q}", "--samples", "2", "-o",
                                                    "{out}/d.json", "--html", "{bad}"), EXIT_USAGE,
     ("{dir}/readonly",), _in_read_only("d.html")),
    ("search-o-then-html-in-a-read-only-folder", ("search", "-f", "{f}", "--calib", "{calib}", "--debug-samples", "2",
                                                  "--goal-sqnr", "10", "-o", "{out}/o.json", "--html", "{bad}"),
     EXIT_USAGE, ("{dir}/readonly",), _in_read_only("s.html")),
]  # fmt: skip

#: A region of the float model that cannot be built: options that cannot make one (2), or a tensor the model does not
#: have (4).
REGION: list[tuple[str, tuple[str, ...], int, tuple[str, ...]]] = [
    ("extract-outputs-alone", ("--extract-outputs", "y"), EXIT_USAGE, ("--extract-inputs",)),
    ("extract-inputs-alone", ("--extract-inputs", "r1"), EXIT_USAGE, ("--extract-outputs",)),
    ("extract-inputs-empty", ("--extract-inputs", ",", "--extract-outputs", "y"), EXIT_USAGE, ("--extract-inputs",)),
    ("extract-inputs-unknown", ("--extract-inputs", "nope", "--extract-outputs", "y"), EXIT_MODEL, ("'nope'",)),
    ("extract-outputs-unknown", ("--extract-inputs", "r1", "--extract-outputs", "nope"), EXIT_MODEL, ("'nope'",)),
    ("extract-reversed", ("--extract-inputs", "y", "--extract-outputs", "r1"), EXIT_USAGE, ("--extract-inputs",)),
    ("extract-same-tensor", ("--extract-inputs", "r1", "--extract-outputs", "r1"), EXIT_USAGE, ("r1",)),
    ("extract-twice", ("--extract-inputs", "r1,r1", "--extract-outputs", "y"), EXIT_USAGE, ("r1",)),
]


# ---------------------------------------------------------------------------------------------- option values
_SEARCH = ("search", "-f", "{f}", "--calib", "{calib}", "--debug-samples", "2", "-o", "{out}/o.json")
_GOAL = ("--goal-sqnr", "10")
_DEBUG = ("debug", "-f", "{f}", "-q", "{q}", "--samples", "2")
_DIAGNOSE = ("diagnose", "-f", "{f}", "-q", "{q}", "--samples", "2")
_QUANTIZE = ("quantize", "-f", "{f}", "--samples", "2", "-o", "{out}/q.onnx")
_BUILD = ("build", "-f", "{f}", "--target", "cpu", "--precision", "uint8", "--calib", "{calib}", "-o", "{out}/b")
_REPORT = ("report", "{report}", "-o", "{out}/r.html")
_DASH = ("dashboard", "--root", "{dir}")

#: (id, argv, needles): numbers that cannot mean anything and options that do nothing with the others given: usage
#: errors (2) naming the option, before any work.
OPTION_VALUES: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    # search: hold-out, budgets, goals
    ("search-holdout-samples-zero", (*_SEARCH, *_GOAL, "--holdout-samples", "0"), ("--holdout-samples",)),
    ("search-holdout-samples-negative", (*_SEARCH, *_GOAL, "--holdout-samples", "-2"), ("--holdout-samples",)),
    ("search-holdout-samples-text", (*_SEARCH, *_GOAL, "--holdout-samples", "all"), ("--holdout-samples",)),
    ("search-max-evaluations-zero", (*_SEARCH, *_GOAL, "--strategy", "stepwise", "--max-evaluations", "0"),
     ("--max-evaluations",)),
    ("search-max-evaluations-negative", (*_SEARCH, *_GOAL, "--strategy", "stepwise", "--max-evaluations", "-1"),
     ("--max-evaluations",)),
    ("search-max-steps-zero", (*_SEARCH, *_GOAL, "--max-steps", "0"), ("--max-steps",)),
    ("search-max-steps-negative", (*_SEARCH, *_GOAL, "--max-steps", "-3"), ("--max-steps",)),
    ("search-candidates-per-step-zero", (*_SEARCH, *_GOAL, "--strategy", "greedy", "--candidates-per-step", "0"),
     ("--candidates-per-step",)),
    ("search-measure-top-zero", (*_SEARCH, *_GOAL, "--strategy", "measured", "--measure-top", "0"),
     ("--measure-top",)),
    ("search-max-cost-fraction-zero", (*_SEARCH, *_GOAL, "--strategy", "stepwise", "--max-cost-fraction", "0"),
     ("--max-cost-fraction",)),
    ("search-max-cost-fraction-above-one", (*_SEARCH, *_GOAL, "--strategy", "stepwise", "--max-cost-fraction",
                                            "1.5"), ("--max-cost-fraction",)),
    ("search-max-cost-fraction-nan", (*_SEARCH, *_GOAL, "--strategy", "stepwise", "--max-cost-fraction", "nan"),
     ("--max-cost-fraction",)),
    ("search-goal-near-all16-nan", (*_SEARCH, "--goal-near-all16", "nan"), ("--goal-near-all16",)),
    ("search-goal-near-all16-inf", (*_SEARCH, "--goal-near-all16", "inf"), ("--goal-near-all16",)),
    ("search-goal-near-all16-negative", (*_SEARCH, "--goal-near-all16", "-3"), ("--goal-near-all16",)),
    ("search-goal-sqnr-inf", (*_SEARCH, "--goal-sqnr", "inf"), ("--goal-sqnr",)),
    ("search-max-accuracy-drop-negative", (*_SEARCH, "--eval", "{evalz}", "--max-accuracy-drop", "-1"),
     ("--max-accuracy-drop",)),
    ("search-max-accuracy-drop-above-100", (*_SEARCH, "--eval", "{evalz}", "--max-accuracy-drop", "150"),
     ("--max-accuracy-drop",)),
    ("search-debug-samples-zero", (*_SEARCH[:-4], "--debug-samples", "0", "-o", "{out}/o.json", *_GOAL),
     ("--debug-samples",)),
    ("search-to-int3", (*_SEARCH, *_GOAL, "--to", "int3"), ("int3",)),
    ("search-compile-points-bogus", (*_SEARCH, *_GOAL, "--target", "cpu", "--compile-points", "best"),
     ("--compile-points",)),
    ("search-target-samples-negative", (*_SEARCH, *_GOAL, "--target", "cpu", "--compile-points", "chosen",
                                        "--target-samples", "-1"), ("--target-samples",)),
    ("search-remedy-output-without-remedies", (*_SEARCH, *_GOAL, "--remedy-output", "{out}/r.json"),
     ("--remedies",)),
    # options that do nothing with the others given
    ("search-rank-without-measured", (*_SEARCH, *_GOAL, "--rank", "efficiency"), ("--rank",)),
    ("search-measure-top-with-prefix", (*_SEARCH, *_GOAL, "--measure-top", "3"), ("--measure-top",)),
    ("search-max-evaluations-with-prefix", (*_SEARCH, *_GOAL, "--max-evaluations", "5"), ("--max-evaluations",)),
    ("search-candidates-per-step-with-prefix", (*_SEARCH, *_GOAL, "--candidates-per-step", "2"),
     ("--candidates-per-step",)),
    ("search-max-cost-fraction-with-prefix", (*_SEARCH, *_GOAL, "--max-cost-fraction", "0.5"),
     ("--max-cost-fraction",)),
    ("search-target-samples-without-compile-points", (*_SEARCH, *_GOAL, "--target-samples", "2"),
     ("--target-samples",)),
    ("search-label-key-without-eval", (*_SEARCH, *_GOAL, "--label-key", "y"), ("--label-key",)),
    # debug, diagnose, report, build: statistics, HTML, regions
    ("debug-stats-samples-negative", (*_DEBUG, "--diagnose", "--stats-samples", "-1"), ("--stats-samples",)),
    ("debug-stats-samples-text", (*_DEBUG, "--diagnose", "--stats-samples", "few"), ("--stats-samples",)),
    ("debug-stats-samples-without-diagnostics", (*_DEBUG, "--stats-samples", "4"), ("--stats-samples",)),
    ("debug-batch-zero", (*_DEBUG, "--batch", "0"), ("--batch",)),
    ("debug-batch-negative", (*_DEBUG, "--batch", "-4"), ("--batch",)),
    ("diagnose-stats-samples-negative", (*_DIAGNOSE, "--stats-samples", "-1"), ("--stats-samples",)),
    ("diagnose-top-zero", (*_DIAGNOSE, "--top", "0"), ("--top",)),
    ("report-stats-samples-negative", (*_REPORT, "-f", "{f}", "-q", "{q}", "--stats-samples", "-1"),
     ("--stats-samples",)),
    ("report-stats-samples-without-models", (*_REPORT, "--stats-samples", "4"), ("--stats-samples",)),
    ("report-data-without-models", (*_REPORT, "-d", "{calib}"), ("--data",)),
    ("report-f-without-q", (*_REPORT, "-f", "{f}"), ("--quant-model",)),
    ("report-no-output", ("report", "{report}"), ("--output",)),
    ("build-stats-samples-negative", (*_BUILD, "--html", "{out}/b.html", "--stats-samples", "-1"),
     ("--stats-samples",)),
    ("build-stats-samples-without-html", (*_BUILD, "--stats-samples", "4"), ("--stats-samples",)),
    ("build-label-key-without-eval", (*_BUILD, "--label-key", "y"), ("--label-key",)),
    ("build-snap-grid-on-cpu", (*_BUILD, "--snap-grid", "fine"), ("--snap-grid",)),
    ("build-soc-on-cpu", (*_BUILD, "--soc", "SM8650"), ("--soc",)),
    # --workers / --ray: refused before Ray is imported
    *[(f"{c}-workers-{v}", (*argv, "--workers", v), ("--workers",))
      for c, argv in (("quantize", _QUANTIZE), ("debug", _DEBUG), ("diagnose", _DIAGNOSE),
                      ("search", (*_SEARCH, *_GOAL)))
      for v in ("0", "100000")],
    ("debug-workers-text", (*_DEBUG, "--workers", "many"), ("--workers",)),
    ("debug-ray-empty", (*_DEBUG, "--ray", ""), ("Ray address",)),
    ("debug-ray-port-99999", (*_DEBUG, "--ray", "127.0.0.1:99999"), ("99999",)),
    ("debug-ray-port-text", (*_DEBUG, "--ray", "127.0.0.1:http"), ("127.0.0.1:http",)),
    ("quantize-ray-not-an-address", (*_QUANTIZE, "--ray", "not an address"), ("not an address",)),
    ("search-ray-newline", (*_SEARCH, *_GOAL, "--ray", "10.0.0.1:6379\nx"), ("--ray",)),
    # dashboard: refused before Voila starts
    ("dashboard-port-70000", (*_DASH, "--port", "70000"), ("--port", "70000")),
    ("dashboard-port-65536", (*_DASH, "--port", "65536"), ("--port", "65536")),
    ("dashboard-port-zero", (*_DASH, "--port", "0"), ("--port",)),
    ("dashboard-port-text", (*_DASH, "--port", "http"), ("--port",)),
    ("dashboard-max-upload-mb-nan", (*_DASH, "--max-upload-mb", "nan"), ("--max-upload-mb",)),
    ("dashboard-max-upload-mb-inf", (*_DASH, "--max-upload-mb", "inf"), ("--max-upload-mb",)),
    ("dashboard-max-upload-mb-zero", (*_DASH, "--max-upload-mb", "0"), ("--max-upload-mb",)),
    ("dashboard-max-upload-mb-negative", (*_DASH, "--max-upload-mb", "-5"), ("--max-upload-mb",)),
    ("dashboard-max-upload-mb-text", (*_DASH, "--max-upload-mb", "big"), ("--max-upload-mb",)),
    ("dashboard-root-missing", ("dashboard", "--root", "{dir}/nowhere"), ("{dir}/nowhere",)),
    ("dashboard-root-a-file", ("dashboard", "--root", "{calib}"), ("{calib}",)),
]  # fmt: skip

#: ``QDEBUG_MAX_UPLOAD_MB`` values the dashboard must refuse before starting (2, naming the variable).
UPLOAD_ENV = [("text", "lots"), ("nan", "nan"), ("inf", "inf"), ("negative", "-3")]


# ---------------------------------------------------------------------------------------------- notebooks, dashboard
NOTEBOOKS: list[tuple[str, str | Maker, tuple[str, ...]]] = [
    ("under-a-file", "{calib}/nb", ("{calib}",)),
    ("a-file", "{calib}", ("{calib}",)),
    ("a-read-only-folder", _read_only, ("{bad}",)),
    ("in-a-read-only-folder", _in_read_only("nb"), ("{dir}/readonly",)),
    ("symlink-loop", _symlink_loop("loop_nb"), ("{bad}",)),
    ("name-256-bytes", "{dir}/" + "n" * 256, ("255",)),
    ("name-300-bytes", "{dir}/" + "n" * 300, ("255",)),
    ("a-fifo", _fifo("fifo_nb"), ("{bad}",)),
    ("a-device", _device("null_nb"), ("{bad}",)),
]
DASHBOARD_ROOTS: list[tuple[str, Maker, tuple[str, ...]]] = [
    ("root-symlink-loop", _symlink_loop("loop_root"), ("{bad}",)),
    ("root-name-300-bytes", _long_name(""), ("--root",)),
    ("root-a-fifo", _fifo("fifo_root"), ("{bad}",)),
]


# ---------------------------------------------------------------------------------------------- in a real process
PROCESS_CASES = [
    SurfaceCase("process-fifo-float-model-debug", ("debug", "-f", "{bad}", "-q", "{q}", "--samples", "2"),
                EXIT_INPUT_FILE, ("{bad}",), _fifo("fifo.onnx"), process=True),
    SurfaceCase("process-debug-ray-unreachable", (*_DEBUG, "--ray", "127.0.0.1:1"), EXIT_CLUSTER, ("127.0.0.1:1",),
                process=True),
]  # fmt: skip


# ---------------------------------------------------------------------------------------------- the table
def _tables() -> list[tuple[str, list[tuple[str, Maker, int, tuple[str, ...]]], Mapping[str, tuple[str, ...]]]]:
    return [
        ("path", PATH_DEFECTS, READERS),
        ("path", [("folder", _folder("a_folder.in"), EXIT_INPUT_FILE, ())],
         {k: v for k, v in READERS.items() if k in FOLDER_READERS}),
        *[("doc", docs, {command: argv}) for command, (argv, docs, _) in REPORT_DOC_READERS.items()],
        ("search-doc", SEARCH_DOCS, {"report-search": READERS["report-search"]}),
        ("config-doc", CONFIG_DOCS, CONFIG_READERS),
        ("data", NEW_DATA_DEFECTS, NEW_DATA_READERS),
        ("labels", LABEL_DEFECTS, LABEL_READERS),
    ]  # fmt: skip


def _output_cases() -> list[SurfaceCase]:
    cases = []
    for command, (head, flag, input_name) in OUTPUTS.items():
        for defect, where, needles in OUTPUT_DEFECTS:
            path = where.replace("{input}", input_name) if isinstance(where, str) else "{bad}"
            make = None if isinstance(where, str) else where
            words = tuple(n % input_name if "%s" in n else n for n in needles)
            cases.append(SurfaceCase(f"output-{defect}-{command}", (*head, flag, path), EXIT_USAGE, words, make))
    return cases


def _cases() -> list[SurfaceCase]:
    cases: list[SurfaceCase] = []
    for kind, defects, commands in _tables():
        for defect, make, code, words in defects:
            for command, argv in commands.items():
                cases.append(SurfaceCase(f"{kind}-{defect}-{command}", argv, code, ("{bad}", *words), make))
    for command, (argv, _, make) in REPORT_DOC_READERS.items():
        cases.append(SurfaceCase(f"doc-wrong-kind-{command}", argv, EXIT_INPUT_FILE, ("{bad}",), make))
    cases += _output_cases()
    cases += [SurfaceCase(f"collision-{n}", argv, EXIT_USAGE, words) for n, argv, words in OUTPUT_COLLISIONS]
    cases += [SurfaceCase(f"identity-{n}", (*HOLDOUT_HEAD, *extra), EXIT_USAGE, ("--holdout",), make)
              for n, extra, make in HOLDOUT]  # fmt: skip
    cases += [SurfaceCase(f"identity-{n}", argv, code, words) for n, argv, code, words in MISMATCH]
    cases += [SurfaceCase(f"option-{n}", argv, EXIT_USAGE, words) for n, argv, words in OPTION_VALUES]
    cases += [SurfaceCase(f"late-{n}", argv, code, words, make) for n, argv, code, words, make in LATE]
    cases += [SurfaceCase(f"region-build-{n}", (*_BUILD, *extra), code, words) for n, extra, code, words in REGION]
    cases += [
        SurfaceCase(f"option-dashboard-env-upload-{n}", _DASH, EXIT_USAGE, ("QDEBUG_MAX_UPLOAD_MB",),
                    env=(("QDEBUG_MAX_UPLOAD_MB", v),))
        for n, v in UPLOAD_ENV
    ]  # fmt: skip
    cases.append(SurfaceCase("option-debug-ray-auto-without-address", (*_DEBUG, "--ray", "auto"), EXIT_USAGE,
                             ("RAY_ADDRESS",), env=(("RAY_ADDRESS", None),)))  # fmt: skip
    for n, where, words in NOTEBOOKS:
        path, maker = (where, None) if isinstance(where, str) else ("{bad}", where)
        cases.append(SurfaceCase(f"notebooks-{n}", ("notebooks", path), EXIT_USAGE, words, maker))
    for n, make, words in DASHBOARD_ROOTS:
        cases.append(SurfaceCase(f"dashboard-{n}", ("dashboard", "--root", "{bad}"), EXIT_USAGE, words, make))
    cases += [
        SurfaceCase(f"workers-before-ray-{n}", (*argv, "--workers", "2"), code, words, make)
        for n, argv, code, words, make in (
            ("quantize-missing-model", ("quantize", "-f", "{dir}/none.onnx", "-o", "{out}/q.onnx"), EXIT_INPUT_FILE,
             ("{dir}/none.onnx",), None),
            ("debug-missing-quant", ("debug", "-f", "{f}", "-q", "{dir}/none.onnx"), EXIT_INPUT_FILE,
             ("{dir}/none.onnx",), None),
            ("diagnose-bad-data", ("diagnose", "-f", "{f}", "-q", "{q}", "-d", "{bad}"), EXIT_DATA, ("{bad}",),
             _npz("wrong_name.npz", image=X)),
            ("search-no-goal", ("search", "-f", "{f}", "-o", "{out}/o.json"), EXIT_USAGE, ("goal",), None),
        )
    ]  # fmt: skip
    return cases + PROCESS_CASES


CASES = _cases()


# ---------------------------------------------------------------------------------------------- the assets
@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory, tiny_float: Path, tiny_quant: Callable[[str], Path]) -> Path:
    """The good files every case starts from: the models, data with labels, and qdebug's own documents (a debug
    report, a search result, a build folder with its manifest), made by the commands that write them."""
    from qdebug.cli import main

    d = tmp_path_factory.mktemp("surface_assets")
    shutil.copy(tiny_float, d / "f.onnx")
    shutil.copy(tiny_quant("u8"), d / "q.onnx")
    np.savez(d / "calib.npz", x=X)
    np.savez(d / "calib2.npz", x=X[:2] + 0.5)
    np.savez(d / "evalz.npz", x=X, label=np.array([0, 1, 2]))
    (d / "cfg.json").write_text('{"activation_type": "uint8"}')
    onnx.save(builders.other_convnet(), str(d / "other_f.onnx"))
    from qdebug.config import QuantConfig
    from qdebug.quantizer import quantize

    quantize(d / "other_f.onnx", None, QuantConfig(num_samples=4), d / "other_q.onnx")
    (d / "other_q.calib.json").unlink()
    search: list[str] = []
    for argv, sink in (
        (["debug", "-f", d / "f.onnx", "-q", d / "q.onnx", "-d", d / "calib.npz", "-o", d / "r.json"], None),
        (["search", "-f", d / "f.onnx", "--calib", d / "calib.npz", "--goal-sqnr", "10", "-o", d / "s_o.json",
          "--json"], search),
        (["build", "-f", d / "f.onnx", "--target", "cpu", "--precision", "uint8", "--calib", d / "calib.npz",
          "-o", d / "b"], None),
    ):  # fmt: skip
        buf = io.StringIO()
        assert main([str(a) for a in argv], out=buf) == EXIT_OK
        if sink is not None:
            sink.append(buf.getvalue())
    (d / "search.json").write_text(search[0])
    (d / "s_o.json").unlink()
    return d


#: The assets' files, by placeholder (``{hardlink_<name>}`` and ``{symlink_<name>}`` alias each).
FILES = {"f": "f.onnx", "q": "q.onnx", "calib": "calib.npz", "calib2": "calib2.npz", "evalz": "evalz.npz",
         "cfg": "cfg.json", "report": "r.json", "search": "search.json", "other_f": "other_f.onnx",
         "other_q": "other_q.onnx"}  # fmt: skip


def _setup(assets: Path, d: Path) -> dict[str, str]:
    for p in assets.iterdir():
        (shutil.copytree if p.is_dir() else shutil.copy)(p, d / p.name)
    subs = {name: str(d / file) for name, file in FILES.items()}
    for name, file in FILES.items():  # named like the file (the suffix says what it is)
        os.link(d / file, d / f"hardlink_{file}")
        (d / f"symlink_{file}").symlink_to(d / file)
        subs |= {f"hardlink_{name}": str(d / f"hardlink_{file}"), f"symlink_{name}": str(d / f"symlink_{file}")}
    (d / "old.json").write_text("{}\n")  # an output that exists, and two other names of it
    os.link(d / "old.json", d / "old_link.html")
    (d / "old_symlink.html").symlink_to(d / "old.json")
    return {**subs, "manifest": str(d / "b" / "manifest.json"), "dir": str(d), "out": str(d / "out")}


# ---------------------------------------------------------------------------------------------- running a case
class VoilaStartedError(BaseException):
    """``dashboard`` got as far as starting Voila (a BaseException: nothing in ``main`` turns it into a message)."""


@contextlib.contextmanager
def _watch_fifos(fifos: list[Path]) -> Iterator[list[str]]:
    """While the block runs, let through whoever opens one of ``fifos`` (a reader sees end-of-file at once, a writer
    a closed pipe) and record that it was opened: a FIFO must be refused before it is opened, never hang a test."""
    opened: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for p in fifos:
                with contextlib.suppress(OSError):  # ENXIO: nobody reads it
                    os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
                    opened.append(f"{p} (read)")
                with contextlib.suppress(OSError):
                    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
                    try:
                        if os.read(fd, 1 << 16):
                            opened.append(f"{p} (written)")
                    except BlockingIOError:  # a writer holds it open
                        opened.append(f"{p} (written)")
                    finally:
                        os.close(fd)
            stop.wait(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    if fifos:
        thread.start()
    try:
        yield opened
    finally:
        stop.set()
        if fifos:
            thread.join()


def _in_process(argv: list[str], run_cli: Callable[..., CliResult], monkeypatch: pytest.MonkeyPatch) -> CliResult:
    def no_voila(cmd: object, *a: object, **k: object) -> None:
        raise VoilaStartedError(str(cmd))

    with monkeypatch.context() as mp:  # undone before the case's clean-up (which runs chattr)
        mp.setitem(sys.modules, "ray", None)  # import ray raises ImportError
        if argv and argv[0] == "dashboard":  # qdebug.cli.dashboard starts Voila with subprocess.Popen
            mp.setattr(subprocess, "Popen", no_voila)
        try:
            return run_cli(*argv)
        except VoilaStartedError as exc:
            pytest.fail(f"dashboard started Voila instead of refusing: {exc}")


def _in_a_process(argv: list[str], env: Mapping[str, str | None], timeout: float = 60) -> tuple[CliResult, float]:
    """``python -m qdebug.cli argv`` with its own temp folder (Ray's session folder would go there); killed, with
    whatever it started, after ``timeout`` s (a hang fails the case instead of blocking the suite)."""
    tmp = Path(tempfile.mkdtemp(prefix="qs-"))  # short: Ray's socket paths must fit in 107 bytes
    full = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(REPO)}
    for k, v in env.items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = v
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "qdebug.cli", *argv], env=full, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"qdebug {' '.join(argv)} still running after {timeout} s")
    finally:
        left = sorted(p.name for p in tmp.iterdir() if p.name != ".ses")  # .ses: ONNX Runtime's, on import
        shutil.rmtree(tmp, ignore_errors=True)
    assert left == [], f"left in TMPDIR: {left}"
    return CliResult(proc.returncode, out, out, err), time.monotonic() - t0


def _fifos(d: Path) -> list[Path]:
    return [p for p in d.rglob("*") if not p.is_symlink() and stat.S_ISFIFO(p.lstat().st_mode)]


def _run(
    case: SurfaceCase, d: Path, subs: dict[str, str], run_cli: Callable[..., CliResult], mp: pytest.MonkeyPatch
) -> CliResult:
    argv = [a.format(**subs) for a in case.argv]
    env = dict(case.env)
    with _watch_fifos(_fifos(d)) as opened:
        if case.process:
            r, seconds = _in_a_process(argv, env)
            assert seconds < 40, f"took {seconds:.0f} s to fail"
        else:
            for k, v in env.items():
                if v is None:
                    mp.delenv(k, raising=False)
                else:
                    mp.setenv(k, v)
            r = _in_process(argv, run_cli, mp)
    assert not opened, f"opened a FIFO instead of refusing it: {opened} (exit {r.code}: {r.stderr.strip()})"
    return r


def _param(cid: str, *values: object) -> object:
    marks = [pytest.mark.xfail(strict=True, reason=f"issue 34: {PENDING[cid]}, being fixed")] if cid in PENDING else []
    return pytest.param(*values, id=cid, marks=marks)


@pytest.mark.parametrize("case", [_param(c.id, c) for c in CASES])
def test_bad_input(
    case: SurfaceCase, assets: Path, tmp_path: Path, run_cli: Callable[..., CliResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path
    subs = _setup(assets, d)
    try:
        if case.make is not None:
            subs["bad"] = str(case.make(d))
        before, listing = tree_hashes(d), _listing(d)
        r = _run(case, d, subs, run_cli, monkeypatch)
        _assert_one_line(r, case.code, [n.format(**subs) for n in case.needles])
        assert tree_hashes(d) == before  # every input byte-identical; no file written, no FIFO or device replaced
        assert _listing(d) == listing  # no folder, temp file or partial output left behind
    finally:
        _release(d)


# ---------------------------------------------------------------------------------------------- legal outputs
def _name(size: int, suffix: str, fill: str = "x") -> str:
    return fill * (size - len(suffix)) + suffix


_Q249 = _name(249, ".onnx")  # its .calib.json beside it is 255 bytes
_LATIN1 = os.fsdecode("résumé".encode("latin-1"))  # a name that is not UTF-8
#: A legal output of every writing command, with the longest name allowed (255 bytes): (argv, what appears in the
#: case's folder). Written whole, with the umask's mode, nothing else beside it.
LEGAL: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "quantize-o-249": (("quantize", "-f", "{f}", "--calib", "{calib}", "-o", "{dir}/" + _Q249),
                       (_Q249, _Q249[:-5] + ".calib.json")),
    "debug-o-and-html-255": ((*_DEBUG, "-o", "{dir}/" + _name(255, ".json"), "--html", "{dir}/" + _name(255, ".html")),
                             (_name(255, ".json"), _name(255, ".html"))),
    "diagnose-o-and-html-255": ((*_DIAGNOSE, "-o", "{dir}/" + _name(255, ".json", "d"), "--html",
                                 "{dir}/" + _name(255, ".html", "d")),
                                (_name(255, ".json", "d"), _name(255, ".html", "d"))),
    "suggest-overrides-out-255": (("suggest", "-f", "{f}", "-q", "{q}", "--samples", "2", "--promote-top", "1",
                                   "--overrides-out", "{dir}/" + _name(255, ".json", "s")),
                                  (_name(255, ".json", "s"),)),
    "search-o-and-html-255": (("search", "-f", "{f}", "--calib", "{calib}", "--debug-samples", "2", "--goal-sqnr",
                               "10", "-o", "{dir}/" + _name(255, ".json", "o"), "--html",
                               "{dir}/" + _name(255, ".html", "o")),
                              (_name(255, ".json", "o"), _name(255, ".html", "o"))),
    "build-o-and-html-255": ((*_BUILD[:-2], "-o", "{dir}/" + _name(255, "", "b"), "--html",
                              "{dir}/" + _name(255, ".html", "b")), (_name(255, "", "b"), _name(255, ".html", "b"))),
    "report-o-255": (("report", "{report}", "-f", "{f}", "-q", "{q}", "--stats-samples", "2", "-o",
                      "{dir}/" + _name(255, ".html", "r")), (_name(255, ".html", "r"),)),
    "notebooks-255": (("notebooks", "{dir}/" + _name(255, "", "n")), (_name(255, "", "n"),)),
    "debug-o-and-html-non-utf8": ((*_DEBUG, "-o", "{dir}/" + _LATIN1 + ".json", "--html", "{dir}/" + _LATIN1 + ".html"),
                                  (_LATIN1 + ".json", _LATIN1 + ".html")),
    "build-o-non-utf8": ((*_BUILD[:-2], "-o", "{dir}/" + _LATIN1), (_LATIN1,)),
}  # fmt: skip


def _modes(paths: list[Path]) -> dict[str, str]:
    return {str(p): oct(p.stat().st_mode & 0o777) for p in paths}


LEGAL_IDS = {f"legal-{n}-umask-{u:03o}": (n, u) for n in LEGAL for u in (0o022, 0o027)}


@pytest.mark.parametrize(("name", "umask"), [_param(cid, *v) for cid, v in LEGAL_IDS.items()])
def test_a_legal_output_is_written_with_the_umasks_mode(
    name: str, umask: int, assets: Path, tmp_path: Path, run_cli: Callable[..., CliResult]
) -> None:
    """A 255-byte name (the longest a file system takes) or one that is not UTF-8 is written, not refused for its
    temporary name; files get 0666 and folders 0777 less the umask, as any other program's; nothing else appears
    beside them."""
    d = tmp_path
    subs = _setup(assets, d)
    argv, written = LEGAL[name]
    before, listing = tree_hashes(d), _listing(d)
    old = os.umask(umask)
    try:
        r = run_cli(*[a.format(**subs) for a in argv])
    finally:
        os.umask(old)
    assert r.code == EXIT_OK, r.stderr
    new = sorted(set(_listing(d)) - set(listing))
    assert sorted({n.split("/")[0] for n in new}) == sorted(written)
    made = [d / n for n in new]
    want = {str(p): oct((0o777 if p.is_dir() else 0o666) & ~umask) for p in made}
    assert _modes(made) == want
    assert {k: v for k, v in tree_hashes(d).items() if k in before} == before


# ---------------------------------------------------------------------------------------------- concurrency
@pytest.mark.parametrize("runs", [_param("concurrent-builds", 3)])
def test_concurrent_builds_into_one_folder_one_wins_the_others_are_refused(
    runs: int, assets: Path, tmp_path: Path
) -> None:
    """Three ``build -o out`` at once: one build folder, whole; each other build one line (2) naming it, and no
    staging folder left behind."""
    d = tmp_path
    subs = _setup(assets, d)
    listing = _listing(d)
    argv = [a.format(**subs) for a in (*_BUILD[:-1], "{dir}/built", "--debug-samples", "3")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen([sys.executable, "-m", "qdebug.cli", *argv], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(runs)
    ]  # fmt: skip
    try:
        results = [(p.communicate(timeout=120)[1], p.returncode)[::-1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    codes = sorted(code for code, _ in results)
    assert codes == [EXIT_OK] + [EXIT_USAGE] * (runs - 1), results
    for code, err in results:
        if code:
            assert err.count("\n") == 1 and "Traceback" not in err and "built" in err, err
    assert (d / "built" / "manifest.json").is_file()
    assert set(_listing(d)) - set(listing) == {"built", *(f"built/{p.name}" for p in (d / "built").iterdir())}


# ---------------------------------------------------------------------------------------------- the count
def test_the_corpus_is_large_and_distinct() -> None:
    """At least 150 distinct (defect × command) cases over the surface added since the first corpus, each command
    of it covered, and every pending id a real case."""
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)) >= 150
    assert len({(c.argv, c.make, c.env) for c in CASES}) == len(CASES)
    for command, least in (("report", 40), ("search", 40), ("build", 20), ("debug", 15), ("diagnose", 15),
                           ("dashboard", 15), ("notebooks", 8), ("quantize", 10)):  # fmt: skip
        assert sum(1 for c in CASES if c.argv[0] == command) >= least, command
    assert set(PENDING) <= {*ids, *LEGAL_IDS, "concurrent-builds"}
