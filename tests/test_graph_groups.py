"""The graph's groups on tensor lists shaped like the architectures users bring (issue 38): a ResNet-50 opens as
its stem, bottleneck blocks (a stage's identical ones as one ×N box) and head, with torch's scoped names, with a
legacy exporter's unscoped ones, and with tensors named ``input.8`` whose producer nodes carry the scope; a YOLOv8
as its ``model.N`` modules, the Detect head cut into its branches. The grouped heatmap names as many groups as the
collapsed graph. No model is run: the grouping reads names, edges, ops and sizes only."""

from __future__ import annotations

import re

import pandas as pd
import pytest
from graph_shapes import Shapes, resnet50, yolov8

from qdebug.render import figures
from qdebug.render import graph_view as gv

#: ResNet-50's stages: (bottleneck blocks, ...) — the first block of each has the downsampling Conv.
STAGES = (3, 4, 6, 3)


def _group(shapes: Shapes) -> gv.Grouping:
    names, edges, ops, sizes = shapes
    return gv.group_tensors(names, edges, ops, sizes=sizes)


def _heatmap_ticks(shapes: Shapes, g: gv.Grouping) -> int:
    names = shapes[0]
    n = len(names)
    df = pd.DataFrame({"tensor_name": names, "topo_index": range(n), "producer_op": [shapes[2][x] for x in names],
                       "producer_node": names, "quant_type": ["uint8"] * n, "local_sqnr_db": [30.0] * n,
                       "local_status": ["ok"] * n, "cumulative_sqnr_db": [25.0] * n,
                       "cumulative_status": ["ok"] * n})  # fmt: skip
    fig = figures.layer_heatmap(df, groups=g.labels())
    assert fig.layout.xaxis2.labelalias["0"] == names[0]
    # every group as wide as a label is labelled; a smaller one beside a bigger one may stay blank (no overlap)
    labels = g.labels()
    text = dict(zip(dict.fromkeys(labels[x] for x in names), fig.layout.xaxis.ticktext, strict=True))
    wide = {labels[grp.members[0]] for grp in g.groups if len(grp.members) >= n / figures.GROUP_LABELS}
    assert wide and all(text[w] for w in wide)
    return len(fig.layout.xaxis.tickvals)


def _same_count_everywhere(shapes: Shapes, g: gv.Grouping) -> None:
    """The collapsed graph draws one node per group, the grouped heatmap one labelled tick per group."""
    names, edges, _, _ = shapes
    view = gv.graph_view(names, edges, g, set())
    assert len(view.nodes) == len(g.groups) == _heatmap_ticks(shapes, g) <= gv.MAX_GROUPS
    assert gv.ranks_respect_edges(view) == []
    assert sorted(m for grp in g.groups for m in grp.members) == sorted(names)  # a partition
    assert not any("merged" in grp.label for grp in g.groups)


@pytest.mark.parametrize("fused", [True, False], ids=["conv-relu-fused", "every-conv"])
def test_resnet50_scoped_opens_as_blocks_and_stages(fused: bool) -> None:
    shapes = resnet50(scoped=True, fused_relu=fused)
    g = _group(shapes)
    assert g.method == "name scope"
    labels = [grp.label for grp in g.groups]
    for s, blocks in enumerate(STAGES, start=1):
        # the first block (with the downsample) alone, the identical others as one ×N box expanding to its blocks
        assert f"layer{s}/layer{s}.0" in labels
        rep = g.group(f"layer{s}/layer{s}.0")
        assert len(rep.members) == (6 if fused else 8)
        run = next(
            grp
            for grp in g.groups
            if grp.label == f"layer{s}/layer{s}.1 … layer{s}/layer{s}.{blocks - 1} ×{blocks - 1}"
        )
        assert [p.label for p in run.parts] == [f"layer{s}/layer{s}.{b}" for b in range(1, blocks)]
    assert {"maxpool", "avgpool", "fc"} <= set(labels)
    assert len(g.groups) <= 16  # readable at a glance: the ResNet-50 was one "(top level) (+38 merged)" box
    _same_count_everywhere(shapes, g)


def test_resnet50_unscoped_names_split_at_residual_adds_and_stages() -> None:
    """onnx::Conv_412-style names carry no scope: blocks are cut where the residual stream alone is live, and a
    new stage starts where the block's output size changes."""
    shapes = resnet50(scoped=False)
    names = shapes[0]
    assert all(gv.scope_path(n) == () for n in names)
    g = _group(shapes)
    assert g.method == "graph structure"
    reps = [grp for grp in g.groups if grp.parts]
    assert [len(r.parts) for r in reps] == [b - 1 for b in STAGES]
    assert all(len(p.members) == 5 for r in reps for p in r.parts)  # relu, relu_1, conv3, Add, relu_2
    # each ×N run ends on a block output (a Relu after the residual Add), each block starts after one
    ops = shapes[2]
    assert all([ops[m] for m in p.members][-2:] == ["Add", "Relu"] for r in reps for p in r.parts)
    stage = [int(m.group(1)) for grp in g.groups if (m := re.search(r"\(stage (\d+)\)", grp.label))]
    assert stage == sorted(stage) and len(set(stage)) >= 4  # four stages of blocks (+ stem, head)
    assert re.fullmatch(r"block \d+–\d+ ×5 \(stage \d+\): .*", reps[2].label)
    _same_count_everywhere(shapes, g)


def test_torch_input_n_names_take_their_producer_nodes_scope() -> None:
    """torch names many outputs ``input.8``: the producer node (``/layer1/layer1.0/conv1/Conv``) gives the scope,
    and the grouping is the one of fully scoped names."""
    names, edges, ops, sizes = resnet50(scoped=True, fused_relu=False)
    ren = {n: (f"input.{4 * i}" if ops[n] == "Conv" else n) for i, n in enumerate(names)}
    nodes = {ren[n]: n.removesuffix("_output_0") for n in names}
    g0 = gv.group_tensors(names, edges, ops, sizes=sizes)
    g1 = gv.group_tensors([ren[n] for n in names], [(ren[a], ren[b]) for a, b in edges],
                          {ren[n]: o for n, o in ops.items()}, sizes={ren[n]: v for n, v in sizes.items()},
                          scopes=nodes)  # fmt: skip
    assert [x.label for x in g1.groups] == [x.label for x in g0.groups]
    without = gv.group_tensors([ren[n] for n in names], [(ren[a], ren[b]) for a, b in edges])
    assert not any("merged" in x.label or x.label == "(top level)" for x in without.groups)


def test_yolov8_opens_as_its_modules() -> None:
    shapes = yolov8()
    g = _group(shapes)
    assert g.method == "name scope"
    module = re.compile(r"^/(model\.\d+)/")

    def modules(grp: gv.Group) -> set[str]:
        return {m.group(1) for x in grp.members if (m := module.match(x))}

    # no group spans two modules, every module has its group(s), and the backbone/neck modules are one box each
    assert all(len(modules(grp)) <= 1 for grp in g.groups)
    seen = {next(iter(modules(grp))) for grp in g.groups if modules(grp)}
    assert seen == {f"model.{i}" for i in range(23)}
    for i in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 15, 18, 21):
        assert f"model.{i}" in {grp.label for grp in g.groups}
    # the Detect head (model.22) opens as its six branches
    assert {f"model.22/{h}.{j}" for h in ("cv2", "cv3") for j in range(3)} <= {grp.label for grp in g.groups}
    _same_count_everywhere(shapes, g)


def test_a_scope_before_and_after_its_blocks_is_cut_not_merged() -> None:
    """Detect's own tensors (a Concat after each branch pair, then the decode) sit before and after its branches:
    cut into runs, each drawn between the right branches, instead of one box swallowing the head."""
    names = ["in"]
    edges: list[tuple[str, str]] = []
    for j in range(3):
        prev = "in"
        for i in range(12):
            names.append(f"/d/b{j}/t{i}")
            edges.append((prev, names[-1]))
            prev = names[-1]
        names.append(f"/d/Concat_{j}_output_0")
        edges.append((prev, names[-1]))
    for k in range(20):  # the decode: many own tensors of /d after every branch
        names.append(f"/d/Decode_{k}_output_0")
        edges += [(names[-2], names[-1])] + (
            [(f"/d/Concat_{j}_output_0", names[-1]) for j in range(3)] if k == 0 else []
        )
    g = gv.group_tensors(names, edges, max_groups=10)
    view = gv.graph_view(names, edges, g, set())
    assert gv.ranks_respect_edges(view) == []
    assert not any("merged" in x.label for x in g.groups)
    # the shared prefix /d/ names nothing: its own tensors are the top level, in four runs between the branches
    assert [(x.label, len(x.members)) for x in g.groups] == [
        ("(top level) (1/4)", 1), ("b0", 12), ("(top level) (2/4)", 1), ("b1", 12), ("(top level) (3/4)", 1),
        ("b2", 12), ("(top level) (4/4)", 21),
    ]  # fmt: skip
