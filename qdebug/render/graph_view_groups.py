"""The graph view's groups (:mod:`qdebug.render.graph_view`): tensors partitioned into a few dozen groups by their
name scopes or, when names carry no scope, by the graph's structure, cycles between groups merged, and repeated
blocks folded into ``×N`` groups.

**Groups.** :func:`group_tensors` first tries the names: ``/model.22/cv2.0/conv/Conv_output_0`` has the scope
path ``model.22 / cv2.0 / conv``, ``encoder.layer.3.attention.output`` has ``encoder / layer.3 / attention``.
The biggest group is split by its next scope level while that keeps at most ``max_groups`` groups, so a
YOLO opens as its ``model.N`` blocks and a BERT as its ``layer.N`` blocks. Names without a scope (PaddleOCR's
``p2o.Add.12``, ``swish_14.tmp_0``) fall back to the graph structure: the topological order is cut into
contiguous blocks at the places where the fewest tensors cross (the residual block boundaries). Groups whose
edges would form a cycle are merged, so the collapsed graph is a DAG and its layered drawing respects every edge.
Then runs of consecutive groups that are the same block (same ops, sizes and wiring, each fed by the previous
one: a transformer's layers, a stage's bottlenecks) become one ``×N`` group whose parts expand one by one.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Collapsed views aim at no more groups than this (a few dozen readable boxes).
MAX_GROUPS = 40
#: Blocks of fewer tensors are not merged into ×N groups.
MIN_REPEAT = 4
_NUM_SUFFIX = re.compile(r"^\d+$")
_BLOCK_DOT = re.compile(r"\.\d+\.")


def scope_path(name: str) -> tuple[str, ...]:
    """The scope of a tensor name, outermost first (empty when the name carries none).

    ``/model.22/cv2.0/conv/Conv_output_0`` → ``("model.22", "cv2.0", "conv")``;
    ``encoder.layer.3.attention.output.dense`` → ``("encoder", "layer.3", "attention", "output")``;
    ``p2o.Add.12`` and ``swish_14.tmp_0`` → ``()``.
    """
    if "/" in name:
        return tuple(p for p in name.split("/")[:-1] if p)
    if not _BLOCK_DOT.search(name):
        return ()
    parts: list[str] = []
    for p in name.split("."):
        if _NUM_SUFFIX.match(p) and parts:
            parts[-1] = f"{parts[-1]}.{p}"  # layer.3 is one scope, not two
        else:
            parts.append(p)
    return tuple(parts[:-1])


@dataclass(frozen=True)
class Group:
    """Tensors drawn as one box while collapsed. ``key`` is unique; ``members`` are in topological order.

    A group of ``N`` structurally identical consecutive blocks (transformer layers, repeated bottlenecks) has
    those blocks as ``parts``: expanding it draws each part as a box of its own, expanding a part its tensors.
    """

    key: str
    label: str
    members: tuple[str, ...]
    parts: tuple[Group, ...] = ()


@dataclass(frozen=True)
class Grouping:
    """A partition of the tensors into groups; ``method`` says how ("name scope", "graph structure", "none")."""

    groups: tuple[Group, ...]
    method: str
    of: Mapping[str, str] = field(default_factory=dict)  # tensor -> group key
    part_of: Mapping[str, str] = field(default_factory=dict)  # tensor -> part key (tensors of a ×N group only)

    def group(self, key: str) -> Group:
        """The group or part with that key (KeyError otherwise)."""
        for g in self.groups:
            if g.key == key:
                return g
            for p in g.parts:
                if p.key == key:
                    return p
        raise KeyError(key)

    def finest(self) -> dict[str, str]:
        """``{tensor: key}`` of the smallest box holding each tensor (its part in a ×N group, else its group)."""
        return {**self.of, **self.part_of}


def _by_scope(names: Sequence[str], max_groups: int) -> dict[tuple[str, ...], list[str]] | None:
    """Scope prefix → tensors, refining the biggest group one level at a time while ≤ ``max_groups``."""
    paths = {n: scope_path(n) for n in names}
    if sum(1 for p in paths.values() if p) < 0.5 * len(names):
        return None
    common = 0  # a prefix every scoped name shares (e.g. "model/model.0/auto_model") separates nothing
    scoped = [p for p in paths.values() if p]
    while all(len(p) > common and p[common] == scoped[0][common] for p in scoped):
        common += 1
    groups: dict[tuple[str, ...], list[str]] = {(): list(names)}
    depth: dict[tuple[str, ...], int] = {(): common}
    final: set[tuple[str, ...]] = set()
    while True:
        open_ = [k for k in groups if k not in final]
        if not open_:
            break
        key = max(open_, key=lambda k: len(groups[k]))
        d = depth[key]
        split: dict[tuple[str, ...], list[str]] = defaultdict(list)
        for n in groups[key]:
            p = paths[n]
            split[(*key, p[d]) if len(p) > d else (*key, "")].append(n)
        if len(split) <= 1 and all(len(paths[n]) > d for n in groups[key]):
            depth[key] = d + 1  # one child only: look one level deeper, same group
            continue
        room = max_groups - (len(groups) - 1)
        if len(split) <= 1 or room < 2 or (room < len(split) <= 8):
            final.add(key)
            continue
        del groups[key]
        if len(split) > max(8, room):  # e.g. 60 layers under one scope: runs of consecutive layers
            final.update(_runs(split, room, groups))
            continue
        for k, members in split.items():
            groups[k] = members
            depth[k] = d + 1
            if k[-1] == "":
                final.add(k)  # tensors directly in the parent scope
    if len(groups) < 2:
        return None
    return groups


def _runs(
    split: Mapping[tuple[str, ...], list[str]], room: int, into: dict[tuple[str, ...], list[str]]
) -> list[tuple[str, ...]]:
    """Put ``split``'s children (in order of first appearance) into at most ``room`` runs of consecutive
    children; returns the new keys (``(*parent, "first … last")``)."""
    items = [(k, ms) for k, ms in split.items() if k[-1] != ""]
    keys = [k for k in split if k[-1] == ""]  # the parent's own tensors stay apart (inputs, glue)
    for k in keys:
        into[k] = split[k]
    size = math.ceil(len(items) / max(1, room - len(keys)))
    for i in range(0, len(items), size):
        run = items[i : i + size]
        first, last = run[0][0], run[-1][0]
        k = first if len(run) == 1 else (*first[:-1], f"{first[-1] or '·'} … {last[-1] or '·'}")
        into[k] = [m for _, ms in run for m in ms]
        keys.append(k)
    return keys


def _cut_widths(names: Sequence[str], edges: Sequence[tuple[str, str]]) -> list[int]:
    """``w[i]``: edges crossing the cut between positions i-1 and i of the topological order."""
    at = {n: i for i, n in enumerate(names)}
    diff = [0] * (len(names) + 1)
    for a, b in edges:
        i, j = at[a], at[b]
        if i < j:
            diff[i + 1] += 1
            diff[j + 1] -= 1
    out, run = [], 0
    for d in diff[:-1]:
        run += d
        out.append(run)
    return out


def _by_structure(names: Sequence[str], edges: Sequence[tuple[str, str]], max_groups: int) -> list[list[str]]:
    """Contiguous blocks of the topological order, cut where the fewest edges cross (block boundaries)."""
    n = len(names)
    size = max(4, math.ceil(n / max(2, max_groups - 4)))
    widths = _cut_widths(names, edges)
    blocks: list[list[str]] = []
    start = 0
    while start < n:
        if n - start <= size * 3 // 2:
            blocks.append(list(names[start:]))
            break
        lo, hi = start + max(1, size // 2), min(n - 1, start + size * 3 // 2)
        cut = min(range(lo, hi + 1), key=lambda i: (widths[i], abs(i - start - size)))
        blocks.append(list(names[start:cut]))
        start = cut
    return blocks


def _ops_label(members: Sequence[str], ops: Mapping[str, str]) -> str:
    top = Counter(ops.get(m, "?") for m in members).most_common(3)
    return " ".join(f"{op}×{k}" for op, k in top)


def _sccs(keys: Sequence[str], succ: Mapping[str, set[str]]) -> dict[str, int]:
    """Strongly connected components (Tarjan, iterative): ``{key: component id}``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comp: dict[str, int] = {}

    def enter(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)

    for root in keys:
        if root in index:
            continue
        enter(root)
        work = [(root, iter(sorted(succ.get(root, ()))))]
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    enter(nxt)
                    work.append((nxt, iter(sorted(succ.get(nxt, ())))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                x = ""
                while x != v:
                    x = stack.pop()
                    on.discard(x)
                    comp[x] = index[v]
    return comp


def _condense(groups: list[Group], of: dict[str, str], edges: Sequence[tuple[str, str]]) -> list[Group]:
    """Merge groups on a cycle of the group graph so the collapsed graph is a DAG."""
    succ: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        if of[a] != of[b]:
            succ[of[a]].add(of[b])
    comp = _sccs([g.key for g in groups], succ)
    merged: dict[int, list[Group]] = defaultdict(list)
    for g in groups:
        merged[comp[g.key]].append(g)
    out = []
    for parts in merged.values():
        if len(parts) == 1:
            out.append(parts[0])
        else:
            members = tuple(m for p in parts for m in p.members)
            main = max(parts, key=lambda p: len(p.members))
            label = f"{main.label} (+{len(parts) - 1} merged)"
            out.append(Group(" + ".join(p.key for p in parts), label, members))
    return out


def _signature(
    g: Group, preds: Mapping[str, Sequence[str]], ops: Mapping[str, str], sizes: Mapping[str, int]
) -> tuple[Any, ...]:
    """What makes two blocks "the same": each member's op, its size (elements) and where its inputs come from (a
    member of the block, by position, or outside it), in topological order. The size keeps two Conv+SiLU stages
    of different widths apart: the same ops, not the same block."""
    at = {m: i for i, m in enumerate(g.members)}
    return tuple(
        (ops.get(m, "?"), sizes.get(m), tuple(sorted(at.get(p, -1) for p in preds.get(m, ())))) for m in g.members
    )


def _repeat_label(run: Sequence[Group]) -> str:
    first, last = run[0].label.split(" … ")[0], run[-1].label.split(" … ")[-1]
    return f"{first} … {last} ×{len(run)}"


def merge_repeats(
    groups: Sequence[Group],
    edges: Sequence[tuple[str, str]],
    ops: Mapping[str, str],
    sizes: Mapping[str, int] | None = None,
) -> list[Group]:
    """Runs of ≥ 2 consecutive groups (topological order) with the same signature (ops, sizes and internal
    wiring), each fed by the one before it, become one ×N group whose ``parts`` are those groups (a transformer's
    layers, a stage's repeated bottlenecks). Groups under :data:`MIN_REPEAT` tensors are left alone: two
    Conv+SiLU stages of equal size are one op each, not a repeated block."""
    sizes = sizes or {}
    preds: dict[str, list[str]] = defaultdict(list)
    for a, b in edges:
        preds[b].append(a)
    sigs = [_signature(g, preds, ops, sizes) if len(g.members) >= MIN_REPEAT else None for g in groups]
    out: list[Group] = []
    i = 0
    while i < len(groups):
        j = i + 1
        while j < len(groups) and sigs[j] is not None and sigs[j] == sigs[i]:
            prev = set(groups[j - 1].members)
            if not any(p in prev for m in groups[j].members for p in preds.get(m, ())):
                break  # identical but not chained (e.g. two parallel heads): not a repetition
            j += 1
        run = groups[i:j]
        if len(run) >= 2:
            members = tuple(m for g in run for m in g.members)
            out.append(Group(" + ".join(g.key for g in run) + " ×", _repeat_label(run), members, tuple(run)))
        else:
            out.append(groups[i])
        i = j
    return out


def group_tensors(
    names: Sequence[str],
    edges: Sequence[tuple[str, str]],
    ops: Mapping[str, str] | None = None,
    max_groups: int = MAX_GROUPS,
    sizes: Mapping[str, int] | None = None,
) -> Grouping:
    """Partition ``names`` (topological order) into at most about ``max_groups`` groups (module docstring).

    ``edges`` are ``(input, tensor)`` pairs between names; ``ops`` names each tensor's producer op (for the
    labels of structural blocks and for matching repeated blocks), ``sizes`` its element count (also for the
    matching). Consecutive identical blocks become one ×N group (:func:`merge_repeats`). Graphs no bigger than
    ``max_groups`` are not grouped (``method="none"``).
    """
    names = list(names)
    ops = ops or {}
    known = set(names)
    edges = [(a, b) for a, b in edges if a in known and b in known and a != b]
    if len(names) <= max_groups:
        return Grouping(tuple(Group(n, n, (n,)) for n in names), "none", {n: n for n in names})
    scoped = _by_scope(names, max_groups)
    groups: list[Group] = []
    if scoped is not None:
        method = "name scope"
        for key, members in scoped.items():
            label = "/".join(p for p in key if p) or "(top level)"
            if (not key or key[-1] == "") and len(members) <= max(3, len(names) // 20):
                # a scope's own few tensors (inputs, outputs, glue between blocks) stand alone: grouped, they
                # would sit before and after the blocks at once and merge everything into one cycle
                groups.extend(Group(m, m, (m,)) for m in members)
            else:
                groups.append(Group(label, label, tuple(members)))
    else:
        method = "graph structure"
        for i, block in enumerate(_by_structure(names, edges, max_groups)):
            bkey = f"block {i + 1}"
            groups.append(Group(bkey, f"{bkey}: {_ops_label(block, ops)}", tuple(block)))
    of = {m: g.key for g in groups for m in g.members}
    groups = _condense(groups, of, edges)
    order = {n: i for i, n in enumerate(names)}
    groups.sort(key=lambda g: min(order[m] for m in g.members))
    groups = [Group(g.key, g.label, tuple(sorted(g.members, key=order.__getitem__))) for g in groups]
    groups = merge_repeats(groups, edges, ops, sizes)
    of = {m: g.key for g in groups for m in g.members}
    part_of = {m: p.key for g in groups for p in g.parts for m in p.members}
    return Grouping(tuple(groups), method, of, part_of)
