"""QNN compatibility loop, before and after: HTP partitions and CPU-fallback nodes per model, with the QNN fixes
alone (``--skip-fix qnn_compat``) and with the loop (``qdebug.targets.qnn_compat``), each through the QNN target's
own steps as ``qdebug build --target qnn`` runs them: ``QnnTarget.prepare`` (the fixes, then the loop) → qdebug's
``quantize`` (the model's ``calib.npz`` beside it when there is one, else synthetic samples) → ``QnnTarget.compile``.
The HTP accuracy check is left out: this measures placement only.

Models are given by path. A symbolic input dimension takes its size from the first calibration sample, else from
``--dim NAME=SIZE`` (e.g. ``--dim S=100`` for DeepFilterNet's frames), else 1.

Usage::

    .venv/bin/python benchmarks/qnn_compat.py MODEL.onnx [MODEL.onnx ...] [--dim S=100] [--samples 8]
                                             [--precision uint8|uint16|int8] [--markdown PATH]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qdebug.config import QuantConfig  # noqa: E402
from qdebug.model_io import input_specs  # noqa: E402
from qdebug.quantizer import quantize  # noqa: E402
from qdebug.targets.base import BuildOptions, CompileJob, ShapeSource, get_target  # noqa: E402
from qdebug.targets.compile_report import CompileReport  # noqa: E402
from qdebug.targets.qnn_compat import COMPAT_FIX  # noqa: E402


@dataclass(frozen=True)
class Placement:
    """One compile's placement: partitions, CPU nodes, the ops left on the CPU, and what the loop did."""

    ok: bool
    partitions: int
    cpu_nodes: int
    fallback: str
    loop: str
    loop_s: float

    @property
    def cell(self) -> str:
        """``partitions / CPU nodes`` (``failed`` when the compile failed)."""
        return f"{self.partitions} / {self.cpu_nodes}" if self.ok else f"failed ({self.partitions} / {self.cpu_nodes})"


def _shapes(model: onnx.ModelProto, data: Path | None, dims: Mapping[str, int]) -> dict[str, list[int]] | None:
    if data is not None:
        return None  # the first calibration sample decides, as in a build with --calib
    return {
        s.name: [d if isinstance(d, int) else int(dims.get(str(d), 1)) for d in s.shape] for s in input_specs(model)
    }


def place(
    path: Path, work: Path, *, loop: bool, dims: Mapping[str, int], samples: int, precision: str = "uint8"
) -> Placement:
    """The QNN target's prepare → quantize → compile of ``path``, with or without the compatibility loop."""
    target = get_target("qnn")
    data = path.with_name("calib.npz") if path.with_name("calib.npz").is_file() else None
    model = onnx.load(str(path))
    shapes = _shapes(model, data, dims)
    skip = () if loop else (COMPAT_FIX,)
    options = BuildOptions("qnn", precision, input_shapes=shapes, skip_fixes=skip)
    cfg = QuantConfig(target="qnn", num_samples=samples, **(target.precisions[precision].config or {}))
    t0 = time.perf_counter()
    prepared = target.prepare(model, cfg, options, ShapeSource(shapes, data))
    prep_s = time.perf_counter() - t0
    compat = next(f for f in prepared.fixes if f.name == COMPAT_FIX)
    fpath = work / f"{path.stem}.{'loop' if loop else 'fixes'}.float.onnx"
    onnx.save(prepared.model, str(fpath))
    assert prepared.config is not None
    qdq = quantize(fpath, data, prepared.config, fpath.with_suffix(".qdq.onnx"), check=False).model_path
    compiled = target.compile(CompileJob(Path(qdq), work, options, stem=f"{path.stem}.{int(loop)}"))
    r: CompileReport = compiled.report
    ops = ", ".join(f"{op} {n}" for op, n in sorted(r.fallback_by_op().items()))
    return Placement(r.ok, r.accelerator_partitions, r.cpu_nodes, ops, compat.detail, prep_s)


def main(argv: Sequence[str] | None = None) -> int:
    """Print (and optionally write) the before/after table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--dim", action="append", default=[], help="NAME=SIZE for a symbolic input dimension")
    ap.add_argument("--samples", type=int, default=8, help="calibration samples (default 8)")
    ap.add_argument("--precision", choices=("uint8", "uint16", "int8"), default="uint8")
    ap.add_argument("--markdown", type=Path)
    args = ap.parse_args(argv)
    dims = {k: int(v) for k, v in (d.split("=", 1) for d in args.dim)}
    rows = [
        "| model | fixes only: partitions / CPU nodes | with the loop | CPU ops before | the loop | prepare s |",
        "|---|---|---|---|---|---|",
    ]
    for path in args.models:
        with tempfile.TemporaryDirectory(prefix="qnn-compat-bench-") as tmp:
            kw = {"dims": dims, "samples": args.samples, "precision": args.precision}
            before = place(path, Path(tmp), loop=False, **kw)  # type: ignore[arg-type]
            after = place(path, Path(tmp), loop=True, **kw)  # type: ignore[arg-type]
        row = (
            f"| {path.stem} | {before.cell} | {after.cell} | {before.fallback or '-'} | {after.loop} | "
            f"{before.loop_s:.1f} → {after.loop_s:.1f} |"
        )
        print(row, flush=True)
        rows.append(row)
    text = "\n".join(rows) + "\n"
    print("\n" + text)
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
