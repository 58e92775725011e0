"""``qdebug suggest``: rank tensors to promote to 16 bits; optionally write the fixed overrides JSON."""

from __future__ import annotations

import argparse
import json
from typing import Any, ClassVar, TextIO

from qdebug.cli._base import Tool, add_debug_inputs, add_json, positive_int
from qdebug.cli._preflight import Checks, Output, Unused, check_promotion_type
from qdebug.cli.debug import DEBUG_REQUIRED, capture_backends, check_debug_args, debug_inputs, run_debug
from qdebug.errors import EXIT_OK
from qdebug.render.text import fmt_db, table


def inferred_base(report: Any, config_path: str | None, quant_model: str | None = None) -> Any:
    """The base config: --config, else the quantized model's own settings (types, symmetry, per-channel:
    :func:`qdebug.mixed.given.read_recipe`, the reading the dashboard uses too), else its dominant activation type."""
    from collections import Counter

    from qdebug.config import QuantConfig

    if config_path:
        return QuantConfig.load(config_path)
    if quant_model:
        from qdebug.errors import QDebugError
        from qdebug.mixed.given import read_recipe

        try:
            return read_recipe(quant_model).config
        except QDebugError:
            pass  # a model without activation Q/DQ: the report's types below
    types = Counter(a.quant_type for a in report.activations if a.quantized and a.quant_type)
    act = types.most_common(1)[0][0] if types else "uint8"
    return QuantConfig(activation_type=act)


class Suggest(Tool):
    """Rank promotion candidates; with --promote-top, plan the promotion (ORT's fixer applied)."""

    name = "suggest"
    help = "rank tensors to promote to 16 bits; optionally write the fixed overrides JSON"
    required: ClassVar[dict[str, str]] = DEBUG_REQUIRED

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Options of ``qdebug suggest``."""
        add_debug_inputs(parser, capture_backends())
        parser.add_argument("--top", type=positive_int, default=10, help="suggestions to list")
        parser.add_argument("--all", action="store_true", help="list every promotable tensor with its role")
        parser.add_argument(
            "--promote-top", type=int, metavar="K", help="promote the top K suggestions (fixer applied)"
        )
        parser.add_argument("--to", default="uint16", help="type to promote to (default uint16)")
        parser.add_argument(
            "--groups",
            action="store_true",
            help="with --promote-top: promote each chosen tensor's whole decomposed LayerNorm or attention core "
            "(one member alone cannot help)",
        )
        parser.add_argument("--config", "-c", help="base QuantConfig JSON (default: inferred from the quantized model)")
        parser.add_argument("--overrides-out", help="write the promotion as overrides JSON here (needs --promote-top)")
        add_json(parser, "the suggestions (and the plan)")

    def inputs(self, args: argparse.Namespace) -> dict[str, str | None]:
        """Both models, the data and the base config."""
        return {**debug_inputs(args), "--config": args.config}

    def outputs(self, args: argparse.Namespace) -> dict[str, Output]:
        """The overrides JSON."""
        return {"--overrides-out": Output(args.overrides_out)}

    def preflight(self, args: argparse.Namespace, checks: Checks) -> None:
        """debug's data options; what only a promotion uses (--groups, --to, --config, --overrides-out) needs
        --promote-top; --top does nothing beside --all."""
        from qdebug.config import QuantConfig

        check_debug_args(args, checks)
        if args.promote_top is not None and args.promote_top < 1:
            checks.add(f"--promote-top must be a positive integer, got {args.promote_top}")
        promote = args.promote_top is not None
        checks.unused([
            Unused("overrides_out", "--overrides-out", promote, "without --promote-top K (how many suggestions to "
                   "promote)"),
            Unused("groups", "--groups", promote, "without --promote-top K (it widens the promotion)"),
            Unused("to", "--to", promote, "without --promote-top K (the type a promotion uses)"),
            Unused("config", "--config", promote, "without --promote-top K (the base config of the promotion)"),
            Unused("top", "--top", not args.all, "with --all (every promotable tensor is listed)"),
        ])  # fmt: skip
        if checks.readable("--config", args.config):
            checks.run(QuantConfig.load, args.config)
        if promote:
            checks.run(check_promotion_type, "--to", args.to, None)

    def run(self, args: argparse.Namespace, out: TextIO) -> int:
        """Debug, rank, optionally plan and write the overrides."""
        from qdebug.mixed.suggest import analyse, suggest

        report = run_debug(args)
        items = analyse(report) if args.all else suggest(report, None if args.promote_top else args.top)
        shown = items if args.all else items[: max(args.top, args.promote_top or 0)]
        plan = _plan(args, report) if args.promote_top else None
        if args.json:
            doc: dict[str, Any] = {"schema_version": 1, "suggestions": [s.to_dict() for s in shown]}
            if plan is not None:
                doc["plan"] = plan.to_dict()
            print(json.dumps(doc, indent=2, allow_nan=False), file=out)
        else:
            _print_suggestions(shown, plan, out)
        if plan is not None and args.overrides_out:
            _write_overrides(args, plan)
            if not args.json:
                print(f"\noverrides written to {args.overrides_out}", file=out)
        return EXIT_OK


def _plan(args: argparse.Namespace, report: Any) -> Any:
    from qdebug.errors import ConfigError
    from qdebug.mixed.promote import promote
    from qdebug.mixed.suggest import suggest

    chosen = [s.tensor_name for s in suggest(report, args.promote_top)]
    if not chosen:
        raise ConfigError("no originator to promote: the report has no promotion candidate")
    if args.groups:
        chosen = _with_groups(args.float_model, report, chosen)
    return promote(args.float_model, chosen, args.to, config=inferred_base(report, args.config, args.quant_model))


def _with_groups(float_model: str, report: Any, chosen: list[str]) -> list[str]:
    """``chosen`` with every group (LayerNorm, attention core) one of them belongs to, in full."""
    from qdebug.mixed.candidates import candidates
    from qdebug.model_io import load_model

    groups = [c.tensors for c in candidates(load_model(float_model, "float model"), report) if len(c.tensors) > 1]
    out: list[str] = []
    for t in chosen:
        out += next((list(g) for g in groups if t in g), [t])
    return list(dict.fromkeys(out))


def _print_suggestions(shown: Any, plan: Any, out: TextIO) -> None:
    rows = [
        [
            str(s.rank),
            s.tensor_name,
            s.producer_op,
            str(s.role),
            fmt_db(s.local_sqnr_db),
            fmt_db(s.cumulative_sqnr_db),
            f"{s.estimated_output_gain_db:.2f}",
        ]
        for s in shown
    ]
    table(
        "Promotion candidates (estimated gains; measure with qdebug search or quantize --overrides)",
        ["#", "tensor", "op", "role", "local", "cumulative", "est. output gain dB"],
        rows,
        out,
    )
    for s in shown:
        print(f"{s.rank:>3}. {s.reason}", file=out)
    if plan is not None:
        print("\n" + plan.describe(), file=out)


def _write_overrides(args: argparse.Namespace, plan: Any) -> None:
    from qdebug.mixed.overrides import OverridesFile
    from qdebug.model_io import file_sha256

    OverridesFile.from_config(
        plan.config, model_sha256=file_sha256(args.float_model), requested=plan.requested, note="qdebug suggest"
    ).save(args.overrides_out)


__all__ = ["Suggest", "inferred_base"]
