"""The graph view's groups (:mod:`qdebug.render.graph_view`): tensors partitioned into a few dozen groups by their
name scopes or, when names carry no scope, by the graph's structure, groups on a cycle cut into runs, and repeated
blocks folded into ``×N`` groups. The graph and the grouped heatmap show the same partition.

**Groups.** :func:`group_tensors` first tries the names: ``/model.22/cv2.0/conv/Conv_output_0`` has the scope
path ``model.22 / cv2.0 / conv``, ``encoder.layer.3.attention.output`` has ``encoder / layer.3 / attention``; a
tensor whose name has none takes its producer node's (torch's ``input.8`` under ``/layer1/layer1.0/conv1/Conv``)
or a neighbour's. The biggest group is split by its next scope level while it is big and that keeps at most
``max_groups`` groups, so a YOLO opens as its ``model.N`` modules, a ResNet as its bottleneck blocks, a BERT as
its ``layer.N`` blocks. Names without a scope (PaddleOCR's ``p2o.Add.12``, ``onnx::Conv_412``) fall back to the
graph structure: the topological order is cut where one tensor alone is live and either feeds several tensors
(the residual stream between blocks) or changes size (a stage boundary). Groups whose edges would form a cycle
are cut into runs of the topological order (runs cannot form a cycle), so the collapsed graph is a DAG and its
layered drawing respects every edge. Then runs of consecutive groups that are the same block (same ops, sizes
and wiring, each fed by the previous one: a transformer's layers, a stage's bottlenecks) become one ``×N`` group
whose parts expand one by one.
"""

from __future__ import annotations

import itertools
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

    def labels(self) -> dict[str, str]:
        """``{tensor: label of its group}`` (labels made unique): the grouped heatmap's axis, so that it names the
        same groups as the collapsed graph, as many."""
        seen: Counter[str] = Counter()
        out: dict[str, str] = {}
        for g in self.groups:
            seen[g.label] += 1
            label = g.label if seen[g.label] == 1 else f"{g.label} #{seen[g.label]}"
            out.update(dict.fromkeys(g.members, label))
        return out

    def finest(self) -> dict[str, str]:
        """``{tensor: key}`` of the smallest box holding each tensor (its part in a ×N group, else its group)."""
        return {**self.of, **self.part_of}


def _scope_paths(
    names: Sequence[str], edges: Sequence[tuple[str, str]], scopes: Mapping[str, str]
) -> dict[str, tuple[str, ...]] | None:
    """Each tensor's scope: its name's, else its producer node's (torch names a Conv's output ``input.8`` but its
    node ``/layer1/layer1.0/conv1/Conv``); ``None`` when fewer than half the tensors have one. A tensor inside the
    graph with neither takes its consumer's scope (else its input's): a top-level catch-all group would sit before
    and after every block and merge them all into one cycle."""
    paths = {n: scope_path(n) or scope_path(scopes.get(n, "")) for n in names}
    if sum(1 for p in paths.values() if p) < 0.5 * len(names):
        return None
    preds: dict[str, list[str]] = defaultdict(list)
    succs: dict[str, list[str]] = defaultdict(list)
    for a, b in edges:
        preds[b].append(a)
        succs[a].append(b)
    for _ in range(3):  # a chain of unscoped tensors takes the scope one step per pass
        for n in names:
            if not paths[n] and preds[n]:
                near = [paths[m] for m in succs[n] if paths[m]] or [paths[m] for m in preds[n] if paths[m]]
                if near:
                    paths[n] = near[0]
    return paths


def _by_scope(
    names: Sequence[str], paths: Mapping[str, tuple[str, ...]], max_groups: int
) -> dict[tuple[str, ...], list[str]] | None:
    """Scope prefix → tensors, refining the biggest group one level at a time while it is big (over an eighth
    of the model at the default ``max_groups``) and the result stays ≤ ``max_groups``: a ResNet opens as its
    bottleneck blocks, not as their single Convs."""
    big = max(2 * MIN_REPEAT, len(names) // max(1, max_groups // 5))
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
        if len(groups[key]) <= big and len(groups) > 1:
            break  # every open group is small enough: a block stays one box
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
    _fold_small_children(groups, max(3, len(names) // 20))
    return groups


def _fold_small_children(groups: dict[tuple[str, ...], list[str]], small: int) -> None:
    """A scope whose own tensors are many (YOLO's Detect: the decode after its heads) takes in its small
    sub-scopes (``dfl``): interleaved with those own tensors, each would be cut into single-tensor pieces."""
    for k in [k for k in groups if k and k[-1] == "" and len(groups[k]) > small]:
        parent = k[:-1]
        for c in [c for c in groups if len(c) == len(k) and c[:-1] == parent and c[-1]]:
            if len(groups[c]) <= MIN_REPEAT + 1:
                groups[k] += groups.pop(c)


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


def _liveness(names: Sequence[str], edges: Sequence[tuple[str, str]]) -> tuple[list[int], list[str | None]]:
    """``live[i]``: distinct tensors made before position i of the topological order and read at or after it;
    ``one[i]``: that tensor when there is exactly one (the residual stream between two blocks)."""
    at = {n: i for i, n in enumerate(names)}
    last: dict[str, int] = {}
    for a, b in edges:
        if at[a] < at[b]:
            last[a] = max(last.get(a, at[a]), at[b])
    diff = [0] * (len(names) + 1)
    for t, j in last.items():
        diff[at[t] + 1] += 1
        diff[j + 1] -= 1
    live, run = [], 0
    for d in diff[:-1]:
        run += d
        live.append(run)
    one: list[str | None] = [None] * len(names)
    ends = sorted(last.items(), key=lambda kv: at[kv[0]])
    for t, j in ends:  # a single live tensor is the last one made before the cut that is still read
        for i in range(at[t] + 1, j + 1):
            if live[i] == 1:
                one[i] = t
    return live, one


def _split_long(lo: int, hi: int, live: Sequence[int], size: int) -> list[int]:
    """Cut positions in ``[lo, hi)`` giving pieces of about ``size``, each where the fewest tensors are live."""
    cuts, start = [], lo
    while hi - start > size * 3 // 2:
        a, b = start + max(1, size // 2), min(hi - 1, start + size * 3 // 2)
        cut = min(range(a, b + 1), key=lambda i: (live[i], abs(i - start - size)))
        cuts.append(cut)
        start = cut
    return cuts


def _units(names: Sequence[str], edges: Sequence[tuple[str, str]], sizes: Mapping[str, int]) -> list[int]:
    """Cut positions between the graph's blocks: where one tensor alone is live and it either feeds several
    tensors (the residual stream entering the next block) or the tensor size changes (a stage boundary)."""
    _, one = _liveness(names, edges)
    fanout = Counter(a for a, _ in edges)
    cuts = []
    for i in range(1, len(names)):
        t = one[i]
        if t is None:
            continue
        resized = sizes.get(names[i - 1]) is not None and sizes.get(names[i - 1]) != sizes.get(names[i])
        if fanout[t] >= 2 or resized:
            cuts.append(i)
    return cuts


def _by_structure(
    names: Sequence[str],
    edges: Sequence[tuple[str, str]],
    max_groups: int,
    ops: Mapping[str, str],
    sizes: Mapping[str, int],
) -> list[list[str]]:
    """Contiguous blocks of the topological order: the graph's own blocks (:func:`_units`: a ResNet's
    bottlenecks, a transformer's halves), consecutive tiny ones joined (a stem, a head), long ones cut where the
    fewest tensors are live, packed into runs when there are more than ``max_groups`` even with repeated blocks
    folded."""
    n = len(names)
    live, _ = _liveness(names, edges)
    bounds = [0, *_units(names, edges, sizes), n]
    spans = [(a, b) for a, b in itertools.pairwise(bounds)]
    joined: list[tuple[int, int]] = []
    for a, b in spans:  # runs of tiny blocks (a stem's Conv, Relu, MaxPool) are one block
        if joined and b - a < MIN_REPEAT and joined[-1][1] - joined[-1][0] < MIN_REPEAT:
            joined[-1] = (joined[-1][0], b)
        else:
            joined.append((a, b))
    big = max(2 * MIN_REPEAT, n // max(1, max_groups // 5))
    cut: list[int] = []
    for a, b in joined:
        cut += [a, *(_split_long(a, b, live, big // 2) if b - a > big else [])]
    cut.append(n)
    spans = list(itertools.pairwise(cut))

    def shown(spans: Sequence[tuple[int, int]]) -> int:  # boxes once repeated blocks are folded into ×N groups
        return len(merge_repeats([Group(str(a), "", tuple(names[a:b])) for a, b in spans], edges, ops, sizes))

    if len(spans) > max_groups and shown(spans) > max_groups:  # runs of k consecutive blocks
        k = math.ceil(len(spans) / max_groups)
        spans = [(spans[i][0], spans[min(i + k, len(spans)) - 1][1]) for i in range(0, len(spans), k)]
    return [list(names[a:b]) for a, b in spans]


def _stages(blocks: Sequence[Sequence[str]], sizes: Mapping[str, int]) -> list[int]:
    """Each block's stage: a new one starts where the block's output size differs from the previous block's."""
    out, stage, prev = [], 0, None
    for b in blocks:
        size = sizes.get(b[-1])
        if size != prev:
            stage += 1
        out.append(stage)
        prev = size
    return out


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


def _merge_cycles(groups: list[Group], comp: Mapping[str, int]) -> list[Group]:
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


def _group_sccs(groups: Sequence[Group], edges: Sequence[tuple[str, str]]) -> dict[str, int]:
    of = {m: g.key for g in groups for m in g.members}
    succ: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        if of[a] != of[b]:
            succ[of[a]].add(of[b])
    return _sccs([g.key for g in groups], succ)


def _condense(
    groups: list[Group], edges: Sequence[tuple[str, str]], order: Mapping[str, int], max_groups: int
) -> list[Group]:
    """Make the group graph a DAG. Groups on a cycle (a scope's own tensors before and after its sub-blocks, as
    YOLO's Detect) are cut into runs that no other group of the cycle interrupts in topological order: runs of
    one order cannot form a cycle. Only if that makes too many groups are the groups of a cycle merged."""
    comp = _group_sccs(groups, edges)
    size = Counter(comp.values())
    cyclic = sorted((m for g in groups if size[comp[g.key]] > 1 for m in g.members), key=order.__getitem__)
    if not cyclic:
        return groups
    of = {m: g.key for g in groups for m in g.members}
    runs: dict[str, list[list[str]]] = defaultdict(list)
    prev: dict[int, str] = {}
    for m in cyclic:  # a new run where the previous tensor of the same cycle was in another group
        c = comp[of[m]]
        if prev.get(c) != of[m] or not runs[of[m]]:
            runs[of[m]].append([])
        runs[of[m]][-1].append(m)
        prev[c] = of[m]
    out: list[Group] = []
    for g in groups:
        parts = runs.get(g.key)
        if not parts or len(parts) == 1:
            out.append(g)
            continue
        k = len(parts)
        out += [Group(f"{g.key} ({i + 1}/{k})", f"{g.label} ({i + 1}/{k})", tuple(p)) for i, p in enumerate(parts)]
    if len(out) > max(max_groups + max_groups // 2, len(groups) + 8):
        return _merge_cycles(groups, comp)
    return _merge_cycles(out, _group_sccs(out, edges))  # a no-op: kept as the guarantee of a DAG


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


_BLOCK_LABEL = re.compile(r"^block (\d+)(?:–\d+)?( \(stage \d+\))?: (.*)$")


def _repeat_label(run: Sequence[Group]) -> str:
    a, b = _BLOCK_LABEL.match(run[0].label), _BLOCK_LABEL.match(run[-1].label)
    if a and b:  # structural blocks: "block 6–8 ×3 (stage 2): Relu×3 Conv×1 Add×1"
        return f"block {a.group(1)}–{b.group(1)} ×{len(run)}{a.group(2) or ''}: {a.group(3)}"
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
    scopes: Mapping[str, str] | None = None,
) -> Grouping:
    """Partition ``names`` (topological order) into at most about ``max_groups`` groups (module docstring).

    ``edges`` are ``(input, tensor)`` pairs between names; ``ops`` names each tensor's producer op (for the
    labels of structural blocks and for matching repeated blocks), ``sizes`` its element count (also for the
    matching, and for the stages of structural blocks), ``scopes`` its producer node's name (its scope when the
    tensor's own name has none). Consecutive identical blocks become one ×N group (:func:`merge_repeats`). Graphs
    no bigger than ``max_groups`` are not grouped (``method="none"``). The graph view and the grouped heatmap both
    show this partition (:meth:`Grouping.labels`).
    """
    names = list(names)
    ops = ops or {}
    sizes = sizes or {}
    known = set(names)
    edges = [(a, b) for a, b in edges if a in known and b in known and a != b]
    if len(names) <= max_groups:
        return Grouping(tuple(Group(n, n, (n,)) for n in names), "none", {n: n for n in names})
    paths = _scope_paths(names, edges, scopes or {})
    scoped = _by_scope(names, paths, max_groups) if paths is not None else None
    groups: list[Group] = []
    if scoped is not None:
        method = "name scope"
        for key, members in scoped.items():
            label = "/".join(p for p in key if p) or "(top level)"
            if (not key or key[-1] == "") and len(members) <= max(3, len(names) // 20):
                # a scope's own few tensors (inputs, outputs, glue between blocks) stand alone: grouped, they
                # would sit before and after the blocks at once
                groups.extend(Group(m, m, (m,)) for m in members)
            else:
                groups.append(Group(label, label, tuple(members)))
    else:
        method = "graph structure"
        blocks = _by_structure(names, edges, max_groups, ops, sizes)
        stages = _stages(blocks, sizes) if sizes else [0] * len(blocks)
        staged = 1 < len(set(stages)) <= len(blocks) // 2  # a stage per block (a U-Net) says nothing
        for i, (block, st) in enumerate(zip(blocks, stages, strict=True)):
            bkey = f"block {i + 1}"
            where = f" (stage {st})" if staged else ""
            groups.append(Group(bkey, f"{bkey}{where}: {_ops_label(block, ops)}", tuple(block)))
    order = {n: i for i, n in enumerate(names)}
    groups = _condense(groups, edges, order, max_groups)
    groups.sort(key=lambda g: min(order[m] for m in g.members))
    groups = [Group(g.key, g.label, tuple(sorted(g.members, key=order.__getitem__))) for g in groups]
    groups = merge_repeats(groups, edges, ops, sizes)
    of = {m: g.key for g in groups for m in g.members}
    part_of = {m: p.key for g in groups for p in g.parts for m in p.members}
    return Grouping(tuple(groups), method, of, part_of)
