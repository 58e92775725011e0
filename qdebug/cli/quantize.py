"""``qdebug quantize``: a float model → a QDQ model (calibrated, with optional tensor overrides)."""

from __future__ import annotations

import argparse
import json
from typing import Any, ClassVar, TextIO

from qdebug.cli._base import (
    Tool,
    add_calib,
    add_float_model,
    add_input_shape,
    add_json,
    add_output,
    add_scale_out,
    cluster_spec,
    warn,
)
from qdebug.cli._preflight import Checks, Output, Unused
from qdebug.errors import EXIT_OK

#: The flags that map one to one onto :class:`~qdebug.config.QuantConfig` fields.
CONFIG_FLAGS = (
    "activation_type",
    "weight_type",
    "per_channel",
    "activation_symmetric",
    "weight_symmetric",
    "calibration_method",
    "num_samples",
    "seed",
    "synthetic_distribution",
    "target",
)


def add_quant_config(p: argparse.ArgumentParser, targets: tuple[str, ...]) -> None:
    """The QuantConfig flags (each must agree with --config when both are given)."""
    from qdebug.config import CALIBRATION_METHODS, DISTRIBUTIONS, QUANT_TYPES

    p.add_argument("--config", "-c", help="QuantConfig JSON; flags below must not contradict it")
    p.add_argument("--activation-type", choices=list(QUANT_TYPES))
    p.add_argument("--weight-type", choices=list(QUANT_TYPES))
    p.add_argument("--per-channel", action="store_true", default=None)
    p.add_argument("--activation-symmetric", action="store_true", default=None)
    p.add_argument("--weight-symmetric", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--calibration-method", choices=list(CALIBRATION_METHODS))
    p.add_argument("--samples", type=int, dest="num_samples", help="number of calibration samples")
    p.add_argument("--seed", type=int)
    p.add_argument("--distribution", dest="synthetic_distribution", choices=list(DISTRIBUTIONS))
    p.add_argument("--target", choices=list(targets), help="the target whose quantization rules apply")


class Quantize(Tool):
    """Quantize a float model to QDQ."""

    name = "quantize"
    help = "quantize a float model to QDQ"
    required: ClassVar[dict[str, str]] = {"float_model": "--float-model/-f", "output": "--output/-o"}

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Options of ``qdebug quantize``."""
        from qdebug.targets.base import target_names

        add_float_model(parser, "--model", "-m")
        add_calib(parser, "--data", "-d")
        add_output(parser, "where to write the QDQ model", required=True)
        parser.add_argument(
            "--overrides",
            help="tensor overrides JSON (ORT TensorQuantOverrides, docs/overrides.md), checked against the model; "
            "its base_config is the config unless --config is given (then both must agree)",
        )
        parser.add_argument(
            "--quant-model",
            help="a QDQ model to patch instead of quantizing the float model: the overrides (a dashboard recipe) "
            "re-grid its own Q/DQ pairs and every other byte stays (docs/ui.md); needs --overrides",
        )
        add_quant_config(parser, target_names())
        add_input_shape(parser, "fix a dynamic input shape for synthetic calibration data, NAME:D0,D1,... (repeatable)")
        add_scale_out(parser)  # MinMax calibration sharded over the workers (docs/scale.md)
        parser.add_argument(
            "--no-output-check",
            dest="output_check",
            action="store_false",
            help="do not measure the written model's outputs on 4 check samples (nor measure per-channel and int8 "
            "weights and write whichever recipe measures best): the recipe is followed exactly",
        )
        add_json(parser, "the result")

    def inputs(self, args: argparse.Namespace) -> dict[str, str | None]:
        """The float model, calibration data, config and overrides."""
        return {
            "--float-model": args.float_model,
            "--calib": args.calib,
            "--config": args.config,
            "--overrides": args.overrides,
            "--quant-model": args.quant_model,
        }

    def outputs(self, args: argparse.Namespace) -> dict[str, Output]:
        """The QDQ model and its calibration ranges beside it."""
        return {"--output": Output(args.output, derived=(".calib.json",), model=True)}

    def preflight(self, args: argparse.Namespace, checks: Checks) -> None:
        """What only synthetic calibration data reads is refused beside --calib; --samples is a count."""
        synthetic = args.calib is None
        why = "with --calib (it shapes the synthetic calibration samples)"
        checks.unused([
            Unused("seed", "--seed", synthetic, "with --calib (it seeds the synthetic calibration samples)"),
            Unused("synthetic_distribution", "--distribution", synthetic, why),
            Unused("input_shape", "--input-shape", synthetic, why),
        ])  # fmt: skip
        if args.quant_model is not None and args.overrides is None:
            checks.add("--quant-model needs --overrides (the recipe to apply to it)")
        if args.num_samples is not None and args.num_samples < 1:
            checks.add(f"--samples must be a positive integer, got {args.num_samples}")

    def run(self, args: argparse.Namespace, out: TextIO) -> int:
        """Quantize, then print what was written."""
        from qdebug.config import QuantConfig
        from qdebug.quantizer import quantize

        ofile = _load_overrides(args.overrides, args.float_model) if args.overrides else None
        if args.quant_model is not None:
            return _patch(args, ofile, out)
        config = QuantConfig.load(args.config) if args.config else None
        base = ofile.resolve_base(config) if ofile is not None else config or QuantConfig()
        cfg = base.merged(**{k: getattr(args, k) for k in CONFIG_FLAGS})
        if ofile is not None:
            cfg = ofile.apply_to(cfg)  # validated before anything is written
            for w in ofile.drift(cfg):
                warn(w)
        result = quantize(
            args.float_model,
            args.calib,
            cfg,
            args.output,
            input_shapes=dict(args.input_shape) or None,
            check=args.output_check,
            per_channel_fallback=_may_choose_weights(args, config, ofile),
            cluster=cluster_spec(args),
        )
        if args.json:
            print(result.to_json(), file=out)
            return EXIT_OK
        print(
            f"wrote {result.model_path}\n"
            f"  nodes quantized {result.nodes_quantized}/{result.nodes_total} ({result.qdq_nodes} Q/DQ nodes)\n"
            f"  calibration {result.calibration_seconds:.3f} s on {result.num_calibration_samples} samples, "
            f"QDQ insertion {result.qdq_seconds:.3f} s\n"
            f"  calibration ranges: {result.calibration_cache}",
            file=out,
        )
        _print_check(result, out)
        if ofile is not None:
            print(f"  tensor overrides: {len(ofile.overrides)} tensor(s) from {args.overrides}", file=out)
        for w in result.warnings:
            warn(w)
        return EXIT_OK


def _patch(args: argparse.Namespace, ofile: Any, out: TextIO) -> int:
    """``--quant-model``: the overrides applied to that QDQ model's own Q/DQ pairs (:mod:`qdebug.mixed.patch`)."""
    from qdebug.errors import ConfigError
    from qdebug.io import atomic_save_model, atomic_write_bytes, read_input_bytes
    from qdebug.mixed.recipe import apply_to_quant_model
    from qdebug.model_io import file_sha256, load_model

    sha = file_sha256(args.quant_model)
    if ofile.quant_model_sha256 is not None and ofile.quant_model_sha256 != sha:
        raise ConfigError(f"{args.overrides}: made for another quantized model than {args.quant_model}")
    given = load_model(args.quant_model, "quantized model")
    model, changes = apply_to_quant_model(given, load_model(args.float_model, "float model"), ofile)
    if model is not given:
        atomic_save_model(model, args.output)
    else:  # nothing to change: the given file byte for byte
        atomic_write_bytes(args.output, read_input_bytes(args.quant_model, "quantized model"))
    if args.json:
        print(json.dumps({"model_path": str(args.output), "changes": list(changes)}), file=out)
        return EXIT_OK
    said = "\n  ".join(changes) or "nothing changed: the model is the given one, byte for byte"
    print(f"wrote {args.output}\n  {said}", file=out)
    return EXIT_OK


def _may_choose_weights(args: argparse.Namespace, config: Any, ofile: Any) -> bool:
    """Whether quantize may measure other weight recipes and write the best: not when the user wrote the recipe
    down (a config or overrides file: overrides reproduce a model byte for byte) or chose the weights by a flag."""
    chosen = any(getattr(args, k) is not None for k in ("per_channel", "weight_type", "weight_symmetric"))
    return ofile is None and config is None and not chosen


def _print_check(result: Any, out: TextIO) -> None:
    """The output check's lines: which samples, the worst output, and the weight recipe chosen by measurement."""
    worst = min(((db, n) for n, db in result.output_sqnr_db.items() if db is not None), default=None)
    if worst is None:
        return
    print(
        f"  outputs vs float on {result.checked_samples} check sample(s): worst {worst[1]!r} {worst[0]:.1f} dB "
        f"({'per-channel' if result.config.per_channel else 'per-tensor'} {result.config.weight_type} weights)\n"
        f"  check samples: {result.checked_on}",
        file=out,
    )
    if result.choice is not None:
        print(f"  {result.choice.summary()}", file=out)


def _load_overrides(path: str, float_model: str) -> Any:
    """The overrides file, checked against the float model; its warnings go to stderr even when it fails."""
    from qdebug.mixed.overrides import OverridesError, OverridesFile, check_against_model
    from qdebug.model_io import file_sha256, load_model

    ofile = OverridesFile.load(path)
    model = load_model(float_model, "float model")
    model_warnings: list[str] = []
    try:
        model_warnings = check_against_model(ofile, model, file_sha256(float_model))
    except OverridesError as exc:
        model_warnings = exc.warnings  # e.g. "made for another model file": it explains the error
        raise OverridesError(exc.problems, source=path, warnings=exc.warnings) from exc  # name the file
    finally:
        for w in model_warnings:
            warn(w)
    return ofile


__all__ = ["Quantize", "add_quant_config"]
