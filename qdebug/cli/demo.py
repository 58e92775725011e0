"""``qdebug demo``: the main job on a bundled sample model — quantize it to 8-bit QDQ, debug it against its float
parent — from anywhere (the samples ship inside the wheel: :mod:`qdebug.samples`); ``qdebug demo --copy DIR`` copies
the samples and their data into ``DIR`` instead and prints the commands to try on them (the README's)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import ClassVar, TextIO

from qdebug.cli._base import Tool, positive_int
from qdebug.cli._preflight import Checks, Output, Unused
from qdebug.errors import EXIT_OK, ConfigError
from qdebug.render.text import print_report, use_color

DEFAULT_SAMPLE = "digits_transformer"
#: The sample ``--copy``'s ``fix`` example runs on (a CNN: the fix's remedies show on it in seconds).
FIX_SAMPLE = "digits_cnn"


class Demo(Tool):
    """Quantize and debug a bundled sample model."""

    name = "demo"
    help = "quantize and debug a bundled sample model (what to run first)"
    required: ClassVar[dict[str, str]] = {}

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Options of ``qdebug demo``."""
        from qdebug.samples import list_samples

        parser.add_argument(
            "--sample", default=DEFAULT_SAMPLE, choices=[s.name for s in list_samples()], help="the sample model"
        )
        parser.add_argument(
            "--output-dir",
            "-o",
            default="qdebug-demo",
            help="folder for the QDQ model, its calibration ranges and report.json (default: ./qdebug-demo)",
        )
        parser.add_argument("--max-samples", type=positive_int, default=128, help="evaluation samples to debug on")
        parser.add_argument(
            "--copy",
            metavar="DIR",
            help="instead: copy the sample models and their data into DIR (created if missing) and print the "
            "commands to try on them",
        )

    def outputs(self, args: argparse.Namespace) -> dict[str, Output]:
        """The QDQ model (with its ``.calib.json``) and the report, in the output folder; with ``--copy``, the
        folder the samples go to."""
        if args.copy is not None:
            return {"--copy": Output(args.copy, folder=True)}
        folder = Path(args.output_dir)
        return {
            "--output-dir": Output(str(folder / f"{args.sample}.qdq.onnx"), derived=(".calib.json",), model=True),
            "report": Output(str(folder / "report.json")),
        }

    def preflight(self, args: argparse.Namespace, checks: Checks) -> None:
        """``--copy`` runs nothing (the demo's own options do nothing with it) and never replaces a file that differs
        from the sample of that name (perhaps the user's own); an identical copy is left as it is."""
        copy = args.copy is not None
        checks.unused([
            Unused("output_dir", "--output-dir", not copy, "with --copy (it only copies the samples)"),
            Unused("max_samples", "--max-samples", not copy, "with --copy (it only copies the samples)"),
        ])  # fmt: skip
        if not copy:
            return
        target = Path(args.copy)
        for src in sample_files():
            dest = target / src.name
            if dest.exists() and not (dest.is_file() and dest.read_bytes() == src.read_bytes()):
                checks.add(f"--copy {dest} exists and is not the bundled {src.name}: give another folder")

    def run(self, args: argparse.Namespace, out: TextIO) -> int:
        """Quantize, debug, print the tables and where the report went (or, with ``--copy``, copy the samples)."""
        if args.copy is not None:
            return copy_samples(Path(args.copy), args.copy, args.sample, out)
        from qdebug.debugger import DebugOptions, debug
        from qdebug.quantizer import quantize
        from qdebug.samples import get_sample

        sample = get_sample(args.sample)
        folder = Path(args.output_dir)
        print(f"sample {sample.name}: {sample.description}", file=out)
        q = quantize(sample.path, sample.calibration, None, folder / f"{sample.name}.qdq.onnx")
        print(
            f"quantized to {q.model_path} ({q.nodes_quantized}/{q.nodes_total} nodes, calibrated on "
            f"{q.num_calibration_samples} samples)\n",
            file=out,
        )
        options = DebugOptions(num_samples=args.max_samples, ignore_data_keys=(sample.label_key,))
        report = debug(sample.path, q.model_path, sample.evaluation, options)
        path = report.save(folder / "report.json")
        print_report(report, out, 10, use_color(args.color, out))
        print(f"\ndemo report: {Path(path).resolve()}", file=out)
        for line in next_commands(folder, sample.name):
            print(line, file=out)
        return EXIT_OK


def next_commands(folder: Path, sample_name: str) -> list[str]:
    """What a newcomer tries after the demo (its output ``folder``): the HTML report, the dashboard, the samples to
    run every command on; the last line is the next command, runnable as printed: the fix of this sample."""
    from qdebug.samples import get_sample

    sample = get_sample(sample_name)
    report, html = shlex.quote(str(folder / "report.json")), shlex.quote(str(folder / "report.html"))
    fixed, fix_html = shlex.quote(str(folder / "fixed.qdq.onnx")), shlex.quote(str(folder / "fix.html"))
    model, calib = shlex.quote(str(sample.path)), shlex.quote(str(sample.calibration))
    return [
        f"see it: qdebug report {report} -o {html} (the HTML report), qdebug dashboard (in a browser), qdebug demo "
        "--copy samples (the sample models and data, with the commands to try on them)",
        f"next: qdebug fix -f {model} -d {calib} -o {fixed} --html {fix_html}",
    ]


def sample_files() -> list[Path]:
    """The bundled files ``--copy`` copies: every sample model, its calibration and evaluation data, and the registry
    (so that :func:`qdebug.samples.list_samples` reads the copy as it reads the bundle)."""
    from qdebug.samples import SAMPLE_DIR, list_samples

    files = [SAMPLE_DIR / "registry.json"]
    for sample in list_samples():
        files += [p for p in (sample.path, sample.calibration, sample.evaluation) if p not in files]
    return files


def copy_samples(target: Path, shown: str, sample_name: str, out: TextIO) -> int:
    """Copy :func:`sample_files` into ``target`` (``shown``: the folder as the user wrote it, for the commands to
    paste), then print the commands to try on ``sample_name``'s files, the next command last."""
    from qdebug.io import atomic_write_bytes

    files = sample_files()
    try:
        target.mkdir(parents=True, exist_ok=True)
        for src in files:
            dest = target / src.name
            if not dest.exists():  # the pre-flight found any file of that name identical: nothing to replace
                atomic_write_bytes(dest, src.read_bytes())
    except OSError as exc:  # the folder changed since the guard looked (or a file system refusing late)
        raise ConfigError(f"{target}: cannot copy the samples there ({exc.strerror or exc})") from exc
    print(f"copied {', '.join(f.name for f in files)} to {target.resolve()}", file=out)
    for line in try_commands(shown, sample_name):
        print(line, file=out)
    return EXIT_OK


def try_commands(folder: str, sample_name: str) -> list[str]:
    """What to run on the copied samples in ``folder``: quantize and debug ``sample_name``, then fix the CNN (the
    README's "Use it"), outputs under ``out/``; the last line is the next command to try."""
    from qdebug.samples import get_sample

    here = Path(folder)
    model, fixed = get_sample(sample_name), get_sample(FIX_SAMPLE)

    def q(path: Path) -> str:
        return shlex.quote(str(here / path.name))

    qdq = f"out/{model.name}.qdq.onnx"
    return [
        "try:",
        f"  qdebug quantize -f {q(model.path)} --calib {q(model.calibration)} -o {qdq}",
        f"  qdebug debug -f {q(model.path)} -q {qdq} -d {q(model.evaluation)} --ignore-key {model.label_key} "
        "-o out/report.json",
        "  qdebug report out/report.json -o out/report.html",
        f"next: qdebug fix -f {q(fixed.path)} -d {q(fixed.calibration)} -o out/fixed.qdq.onnx --html out/fix.html",
    ]


__all__ = ["DEFAULT_SAMPLE", "Demo", "copy_samples", "next_commands", "sample_files", "try_commands"]
