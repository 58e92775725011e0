"""A target's compatibility fixes applied to the float model *before* a search, so the search measures (and
compiles) the model that ``qdebug build --target T`` would quantize.

Why: the fixes change what there is to search. Folding standalone BatchNormalization nodes or fixing the input
shape can raise the 8-bit base more than any promotion of the unfixed model gains, and an unfused exact GELU
(``Erf``) splits the HTP graph at every search point until ``gelu_fusion`` runs. The fixes go
through the :class:`~qdebug.targets.base.Target` interface (:meth:`~qdebug.targets.base.Target.prepare`, the same
call ``build`` makes): nothing here knows which target does what.

The fixed float model's tensor names are the ones the overrides name; an overrides file written from such a search
records the fixes (:attr:`qdebug.mixed.overrides.OverridesFile.target_fixes`), so ``qdebug build --overrides`` checks
it against the model after *its* fixes rather than against the model as given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import onnx

from qdebug.config import QuantConfig
from qdebug.errors import MissingExtraError
from qdebug.passes import PassReport

__all__ = ["TargetFixes", "apply_target_fixes", "search_target_fixes"]


@dataclass(frozen=True)
class TargetFixes:
    """Which of ``target``'s compatibility fixes ran on the float model before the search (every fix of its
    pipeline, with what each did; ``changed`` names those that changed the model or the config)."""

    target: str
    fixes: tuple[PassReport, ...]
    #: sha256 of the float model file as the user gave it (the fixed model is the search's own copy)
    given_sha256: str = ""

    @property
    def changed(self) -> tuple[str, ...]:
        """Names of the fixes that changed something, in the order they ran."""
        return tuple(f.name for f in self.fixes if f.changed)

    def describe(self) -> str:
        """One line for the CLI: what changed, or that nothing did."""
        changed = [f for f in self.fixes if f.changed]
        if not changed:
            return f"{self.target}'s compatibility fixes changed nothing in this model"
        what = "; ".join(f"{f.name}: {f.detail}" for f in changed)
        return f"searched the model after {self.target}'s compatibility fixes ({what})"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``changed`` included for readers that do not re-derive it)."""
        return {
            "target": self.target,
            "given_sha256": self.given_sha256,
            "changed": list(self.changed),
            "fixes": [f.to_dict() for f in self.fixes],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TargetFixes:
        """Inverse of :meth:`to_dict`."""
        return cls(
            target=str(d["target"]),
            fixes=tuple(PassReport.from_dict(f) for f in d.get("fixes", ())),
            given_sha256=str(d.get("given_sha256", "")),
        )


def apply_target_fixes(
    model: onnx.ModelProto,
    target: str,
    config: QuantConfig | None,
    data: Any,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    label_key: str = "label",
    given_sha256: str = "",
) -> tuple[onnx.ModelProto, QuantConfig | None, TargetFixes]:
    """``target``'s compatibility fixes on ``model`` (a copy; the input is not modified) and ``config``: what
    ``qdebug build --target`` does before quantizing. Shapes for a static-shape fix come from ``input_shapes``, else
    the first sample of ``data`` (the calibration data, as in ``build``). A target whose fixes need its backend
    installed raises :class:`~qdebug.errors.MissingExtraError` with the way out (search the model as given)."""
    from qdebug.targets.base import ShapeSource, get_target
    from qdebug.targets.recompile import build_options

    t = get_target(target)
    try:
        prepared = t.prepare(model, config, build_options(target), ShapeSource(input_shapes, data, label_key))
    except MissingExtraError as exc:
        raise MissingExtraError(
            exc.module,
            exc.extra,
            f"applying {target}'s compatibility fixes before the search (to search the model as given instead: "
            "--no-target-fixes, or target_fixes=False)",
        ) from exc
    return prepared.model, prepared.config, TargetFixes(target, tuple(prepared.fixes), given_sha256)


def search_target_fixes(doc: Mapping[str, Any]) -> TargetFixes | None:
    """The target's fixes recorded in a search result's JSON (``SearchResult.to_dict()``); ``None`` when the model
    was searched as given — and for every document older than schema 3, which had no such record."""
    raw = doc.get("target_fixes")
    return None if raw is None else TargetFixes.from_dict(raw)
