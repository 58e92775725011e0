"""What the commands that write the HTML report or run the diagnostics share (``report``, ``diagnose``,
``debug --html/--diagnose``, ``build --html``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

#: The default number of samples the per-tensor statistics of the diagnostics see.
STATS_SAMPLES = 8


def add_stats_samples(p: argparse.ArgumentParser) -> None:
    """``--stats-samples N``: samples for the diagnostics' per-tensor statistics."""
    p.add_argument(
        "--stats-samples",
        type=int,
        default=STATS_SAMPLES,
        metavar="N",
        help=f"samples for the diagnostics' per-tensor statistics (default {STATS_SAMPLES}; 0: report-only checks)",
    )


def add_html(p: argparse.ArgumentParser, help: str = "also write the one-file HTML report here") -> None:
    """``--html PATH``: also write the one-file HTML report."""
    p.add_argument("--html", default=None, metavar="PATH", help=help)


def run_diagnostics(report: Any, args: argparse.Namespace) -> Any:
    """:func:`qdebug.diagnose.diagnose_models` with the options of ``debug`` (the same samples) and
    ``--stats-samples`` (0: no statistics pass)."""
    from qdebug.diagnose import diagnose_models
    from qdebug.errors import ConfigError

    if args.stats_samples < 0:
        raise ConfigError("--stats-samples must be 0 or a positive integer")
    synthetic = {
        k: getattr(args, a) for k, a in (("seed", "seed"), ("distribution", "distribution")) if hasattr(args, a)
    }
    # the task metric's label array is never a model input (the debug run ignored it too)
    ignore = [*(getattr(args, "ignore_key", None) or []), *([args.label_key] if getattr(args, "metric", None) else [])]
    if ignore:
        synthetic["ignore"] = tuple(ignore)
    samples = args.stats_samples
    if args.data is None and getattr(args, "samples", None):  # synthetic: the debug run's samples, no more
        samples = min(samples, args.samples)
    return diagnose_models(
        report, args.float_model, args.quant_model, args.data, max_samples=samples,
        input_shapes=dict(getattr(args, "input_shape", None) or []) or None, synthetic=synthetic,
    )  # fmt: skip


def require_html() -> None:
    """Fail before any work when the HTML report cannot be written: plotly and grandalf are the ``ui`` extra
    (:class:`~qdebug.errors.MissingExtraError` names it)."""
    from qdebug._lazy import require

    require("plotly")
    require("grandalf")


def write_html(
    path: str | Path, report: Any, diagnostics: Any, *, manifest: Any = None, out_dir: Any = None, gains: Any = None
) -> Path:
    """The HTML report with the diagnostics and the suggestions (plotly, the ``ui`` extra, loads here); ``gains``
    (:class:`~qdebug.mixed.gains.MeasuredGains`) adds what a search measured next to the predictions."""
    from qdebug.mixed.suggest import suggest
    from qdebug.render.html import write_report_html

    return write_report_html(
        path, report, diagnostics=diagnostics, suggestions=suggest(report), manifest=manifest, out_dir=out_dir,
        measured_gains=gains,
    )  # fmt: skip


def load_search_gains(path: str | Path) -> Any:
    """The measured gains of a search result JSON (``qdebug search --json > search.json``); a file that is not one
    is a one-line :class:`~qdebug.errors.InputFileError` naming it (exit 3, as for any input of the wrong kind)."""
    from qdebug.cli._preflight import load_kind
    from qdebug.io import load_json
    from qdebug.mixed.gains import MeasuredGains

    def load(p: str) -> Any:
        return MeasuredGains.from_search_dict(load_json(p, "search result"))  # JSON nested boundedly

    return load_kind(load, str(path), "search result", "write one with: qdebug search ... --json > search.json")


__all__ = [
    "STATS_SAMPLES",
    "add_html",
    "add_stats_samples",
    "load_search_gains",
    "require_html",
    "run_diagnostics",
    "write_html",
]
