"""``qdebug demo``: the main job on a bundled sample model — quantize it to 8-bit QDQ, debug it against its float
parent — from anywhere (the samples ship inside the wheel: :mod:`qdebug.samples`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import ClassVar, TextIO

from qdebug.cli._base import Tool, positive_int
from qdebug.cli._preflight import Output
from qdebug.errors import EXIT_OK
from qdebug.render.text import print_report, use_color

DEFAULT_SAMPLE = "digits_transformer"


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

    def outputs(self, args: argparse.Namespace) -> dict[str, Output]:
        """The QDQ model (with its ``.calib.json``) and the report, in the output folder."""
        folder = Path(args.output_dir)
        return {
            "--output-dir": Output(str(folder / f"{args.sample}.qdq.onnx"), derived=(".calib.json",), model=True),
            "report": Output(str(folder / "report.json")),
        }

    def run(self, args: argparse.Namespace, out: TextIO) -> int:
        """Quantize, debug, print the tables and where the report went."""
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
        # what a newcomer tries next, with this sample's own files (installed or in a checkout)
        print(
            "next: qdebug report (the HTML report), qdebug fix (measured remedies and a fixed model), qdebug "
            f"dashboard (the same in a browser), e.g.\n  qdebug fix -f {sample.path} -d {sample.calibration} "
            f"-o {folder / 'fixed.qdq.onnx'} --html {folder / 'fix.html'}",
            file=out,
        )
        return EXIT_OK


__all__ = ["DEFAULT_SAMPLE", "Demo"]
