"""The 16-bit part of a fix's remedy space: tensors (weights and activations) grouped into contiguous blocks of the
graph, each block a set of tensors to put in 16 bits, split in two when the search needs a finer choice.

A block of weights becomes per-tensor ``quant_type`` overrides (the weight type's 16-bit sibling); a block of
activations becomes a promotion through ORT's mixed-precision fixer (:func:`qdebug.mixed.promote.promote`),
which adds the type conversions its neighbours need.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import onnx

from qdebug.config import QuantConfig, make_overrides
from qdebug.mixed.promote import activation_tensors, promote
from qdebug.report import DebugReport


class UnitKind(StrEnum):
    """What a unit of the 16-bit space is."""

    WEIGHT = "weight"
    ACTIVATION = "activation"


@dataclass(frozen=True)
class Unit:
    """One tensor that may go to 16 bits: its kind, its element count and its place in the graph."""

    kind: UnitKind
    tensor: str
    elements: int
    order: int


@dataclass(frozen=True)
class Block:
    """Contiguous units of one kind (or both, before the first split)."""

    units: tuple[Unit, ...]

    @property
    def elements(self) -> int:
        """Elements the block puts in 16 bits."""
        return sum(u.elements for u in self.units)

    @property
    def kinds(self) -> frozenset[UnitKind]:
        """The kinds of tensors in the block."""
        return frozenset(u.kind for u in self.units)

    def label(self) -> str:
        """A short human name: the kind, the count and the first and last tensor."""
        kind = "+".join(sorted(str(k) for k in self.kinds))
        first, last = self.units[0].tensor, self.units[-1].tensor
        span = first if first == last else f"{first} … {last}"
        return f"{len(self.units)} {kind} tensor(s): {span}"

    def split(self) -> tuple[Block, ...]:
        """Two halves: by kind when the block mixes them, else at the element midpoint of its graph order."""
        if len(self.kinds) > 1:
            return tuple(Block(tuple(u for u in self.units if u.kind is k)) for k in sorted(self.kinds))
        if len(self.units) < 2:
            return (self,)
        half, acc, cut = self.elements / 2, 0, 1
        for i, u in enumerate(self.units[:-1]):
            acc += u.elements
            cut = i + 1
            if acc >= half:
                break
        return Block(self.units[:cut]), Block(self.units[cut:])


def units_of(report: DebugReport) -> tuple[Unit, ...]:
    """Every 8-bit tensor of ``report`` that could go to 16 bits, in graph order (weights at their consumer)."""
    out: dict[tuple[UnitKind, str], Unit] = {}
    order = {a.producer_node: a.topo_index for a in report.activations}
    for a in report.activations:
        if a.quantized and a.quant_type and not a.quant_type.endswith("16") and a.elements > 0:
            out[(UnitKind.ACTIVATION, a.tensor_name)] = Unit(
                UnitKind.ACTIVATION, a.tensor_name, a.elements, a.topo_index
            )
    for w in report.weights:
        if w.kind == "weight" and not w.quant_type.endswith("16") and w.elements > 0:
            key = (UnitKind.WEIGHT, w.weight_name)
            if key not in out:
                out[key] = Unit(UnitKind.WEIGHT, w.weight_name, w.elements, order.get(w.consumer_node, 0))
    return tuple(sorted(out.values(), key=lambda u: (u.order, u.kind, u.tensor)))


def initial_blocks(units: Sequence[Unit], per_kind: int) -> list[Block]:
    """Each kind's units cut into ``per_kind`` contiguous blocks of about equal elements."""
    blocks: list[Block] = []
    for kind in UnitKind:
        mine = [u for u in units if u.kind is kind]
        total = sum(u.elements for u in mine)
        cut, acc, cur = 1, 0, []
        for u in mine:
            cur.append(u)
            acc += u.elements
            if acc >= total * cut / per_kind:
                blocks.append(Block(tuple(cur)))
                cur, cut = [], cut + 1
        if cur:
            blocks.append(Block(tuple(cur)))
    return blocks


def sixteen_bit_type(kind: str) -> str:
    """The 16-bit type of the same signedness."""
    return "int16" if kind.startswith("int") else "uint16"


def with_sixteen_bit(
    base: QuantConfig, float_model: onnx.ModelProto, units: Iterable[Unit], *, acts: set[str] | None = None
) -> QuantConfig:
    """``base`` with the weight units as 16-bit weight overrides and the activation units promoted (ORT's fixer)."""
    units = list(units)
    merged: dict[str, Any] = {n: list(es) for n, es in base.tensor_overrides}
    wtype = "int16"  # ORT's per-channel uint16 weights measure worse than 8-bit ones (docs/fix.md): signed, always
    for u in units:
        if u.kind is UnitKind.WEIGHT:
            entries = merged.get(u.tensor) or [{}]
            first = entries[0] if isinstance(entries[0], Mapping) else entries[0].to_dict()
            merged[u.tensor] = [{**first, "quant_type": wtype}, *entries[1:]]
    cfg = base.replace(tensor_overrides=make_overrides(merged))
    promotable = acts if acts is not None else activation_tensors(float_model)[0]
    tensors = [u.tensor for u in units if u.kind is UnitKind.ACTIVATION and u.tensor in promotable]
    if not tensors:
        return cfg
    return promote(float_model, tensors, sixteen_bit_type(base.activation_type), config=cfg).config


def sixteen_bit_elements(config: QuantConfig, elements: Mapping[str, int]) -> int:
    """Elements ``config`` holds in 16 bits (its overrides' types and converts), of the tensors in ``elements``."""
    total = 0
    for name, entries in config.tensor_overrides:
        e = entries[0]
        wide = (e.quant_type or "").endswith("16") or (e.convert is not None and e.convert.quant_type.endswith("16"))
        if wide:
            total += elements.get(name, 0)
    return total


__all__ = [
    "Block",
    "Unit",
    "UnitKind",
    "initial_blocks",
    "sixteen_bit_elements",
    "sixteen_bit_type",
    "units_of",
    "with_sixteen_bit",
]
