"""Train and export the qdebug sample models on the scikit-learn digits dataset.

Run from the repository root::

    .venv/bin/python sample_models/generate.py

This script needs torch and scikit-learn; neither is required at qdebug
runtime. It writes, next to itself:

* ``digits_cnn.onnx``          - small residual CNN (Conv/BN/ReLU, MaxPool, Add, Gemm)
* ``digits_transformer.onnx``  - tiny pre-LN transformer over the 8 image rows
* ``digits_calib.npz``         - 128 train-split samples, key ``input``
* ``digits_eval.npz``          - the whole test split, keys ``input`` and ``label``
* ``registry.json``            - model metadata (float accuracy measured with onnxruntime)

Everything is seeded and single-threaded so that re-running produces the
same bytes on the same software stack.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits  # type: ignore[import-untyped]
from sklearn.model_selection import train_test_split  # type: ignore[import-untyped]
from torch import nn

HERE = Path(__file__).resolve().parent
SEED = 0
TEST_SIZE = 540
NUM_CALIB = 128
OPSET = 17
INPUT_SHAPE = (1, 1, 8, 8)
NUM_CLASSES = 10


def set_determinism(seed: int) -> None:
    """Seed every RNG in use and force deterministic single-threaded kernels."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)


# --------------------------------------------------------------------------- data


def load_splits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return ``(x_train, y_train, x_test, y_test)``; x is float32 (N,1,8,8) in [0,1]."""
    digits = load_digits()
    x = (digits.data.astype(np.float32) / np.float32(16.0)).reshape(-1, 1, 8, 8)
    y = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=TEST_SIZE, random_state=SEED, stratify=y)
    return (
        np.ascontiguousarray(x_tr),
        np.ascontiguousarray(y_tr),
        np.ascontiguousarray(x_te),
        np.ascontiguousarray(y_te),
    )


def random_shift(x: torch.Tensor, gen: torch.Generator, max_shift: int = 1) -> torch.Tensor:
    """Augment a batch by translating each image by up to ``max_shift`` pixels (zero fill)."""
    n = x.shape[0]
    pad = F.pad(x, (max_shift,) * 4)
    dy = torch.randint(0, 2 * max_shift + 1, (n,), generator=gen)
    dx = torch.randint(0, 2 * max_shift + 1, (n,), generator=gen)
    out = torch.empty_like(x)
    for i in range(n):
        out[i] = pad[i, :, dy[i] : dy[i] + 8, dx[i] : dx[i] + 8]
    return out


# ------------------------------------------------------------------------- models


class ConvBnRelu(nn.Sequential):
    """3x3 Conv -> BatchNorm -> optional ReLU."""

    def __init__(self, cin: int, cout: int, relu: bool = True) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(cin, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        if relu:
            layers.append(nn.ReLU())
        super().__init__(*layers)


class ResidualBlock(nn.Module):
    """Two conv-bn layers with an identity skip connection (Add) and a final ReLU."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(ConvBnRelu(channels, channels), ConvBnRelu(channels, channels, relu=False))
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.act(x + self.body(x))
        return out


class DigitsCNN(nn.Module):
    """Stem conv, residual block, MaxPool, conv, GlobalAveragePool, Flatten, Linear(Gemm)."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.stem = ConvBnRelu(1, width)
        self.block = ResidualBlock(width)
        self.pool = nn.MaxPool2d(2)
        self.conv = ConvBnRelu(width, 2 * width)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(2 * width, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.block(self.stem(x)))
        x = self.gap(self.conv(x))
        logits: torch.Tensor = self.head(torch.flatten(x, 1))
        return logits


class SelfAttention(nn.Module):
    """Multi-head self-attention with explicit MatMul / scale / Softmax / MatMul."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.d_head = d_model // heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.scale = 1.0 / math.sqrt(self.d_head)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        # [B, T, D] -> [B, H, T, Dh]; -1 keeps the Reshape target a constant.
        t = x.shape[1]
        return x.reshape(-1, t, self.heads, self.d_head).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, d = x.shape[1], x.shape[2]
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        att = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * self.scale, dim=-1)
        out = torch.matmul(att, v).transpose(1, 2).reshape(-1, t, d)
        projected: torch.Tensor = self.proj(out)
        return projected


class EncoderBlock(nn.Module):
    """Pre-LN transformer block: x + Attn(LN(x)), then x + MLP(LN(x)) with exact GELU."""

    def __init__(self, d_model: int, heads: int, mlp: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, mlp), nn.GELU(), nn.Linear(mlp, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class DigitsTransformer(nn.Module):
    """Treat the 8 image rows as 8 tokens of 8 features; mean-pool; linear head."""

    def __init__(self, d_model: int = 32, heads: int = 2, mlp: int = 64, depth: int = 2) -> None:
        super().__init__()
        self.embed = nn.Linear(8, d_model)
        self.pos = nn.Parameter(torch.zeros(1, 8, d_model))
        nn.init.normal_(self.pos, std=0.02)
        self.blocks = nn.Sequential(*[EncoderBlock(d_model, heads, mlp) for _ in range(depth)])
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(-1, 8, 8)  # [B,1,8,8] -> [B, tokens=8, features=8]
        x = self.blocks(self.embed(x) + self.pos)
        logits: torch.Tensor = self.head(self.norm(x.mean(dim=1)))
        return logits


# ----------------------------------------------------------------------- training


def train(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    lr: float,
    weight_decay: float,
    augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None,
    batch_size: int = 32,
) -> None:
    """Train with AdamW, cosine LR decay and label-free deterministic shuffling."""
    gen = torch.Generator().manual_seed(SEED)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    steps = epochs * math.ceil(len(xt) / batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(xt), generator=gen)
        for i in range(0, len(xt), batch_size):
            idx = perm[i : i + batch_size]
            xb = xt[idx]
            if augment is not None:
                xb = augment(xb, gen)
            loss = F.cross_entropy(model(xb), yt[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            sched.step()
    model.eval()


@torch.no_grad()
def torch_accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Top-1 accuracy of an eval-mode torch model."""
    pred = model(torch.from_numpy(x)).argmax(dim=1).numpy()
    return float((pred == y).mean())


# ------------------------------------------------------------------------- export


def _strip(model: onnx.ModelProto) -> None:
    """Remove doc strings and metadata (which may embed absolute source paths)."""
    model.doc_string = ""
    del model.metadata_props[:]
    model.graph.doc_string = ""
    for node in model.graph.node:
        node.doc_string = ""
    for vi in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        vi.doc_string = ""
    for init in model.graph.initializer:
        init.doc_string = ""


def _qualname(node_name: str) -> str:
    """Module path of a TorchScript-exported node, e.g. ``/blocks/blocks.0/attn/q/MatMul``
    -> ``blocks.0.attn.q`` (children of containers repeat their parent's prefix)."""
    parts: list[str] = []
    for part in node_name.strip("/").split("/")[:-1]:
        if parts and part.startswith(parts[-1] + "."):
            parts[-1] = part
        else:
            parts.append(part)
    return ".".join(parts) or node_name.strip("/")


def _tidy(model: onnx.ModelProto) -> None:
    """Turn Constant nodes into initializers and give exporter-generated weights
    (``onnx::Conv_45``, ``onnx::MatMul_216``, ...) names derived from their module."""
    graph = model.graph
    consts = [n for n in graph.node if n.op_type == "Constant"]
    for node in consts:
        (attr,) = node.attribute
        assert attr.name == "value", f"unsupported Constant attribute {attr.name}"
        tensor = onnx.TensorProto()
        tensor.CopyFrom(attr.t)
        tensor.name = node.output[0]
        graph.initializer.append(tensor)
        graph.node.remove(node)

    rename: dict[str, str] = {}
    taken = {i.name for i in graph.initializer}
    init_names = set(taken)
    for node in graph.node:
        for idx, name in enumerate(node.input):
            if name in init_names and name.startswith("onnx::") and name not in rename:
                role = ("input", "weight", "bias")[idx] if idx < 3 else f"in{idx}"
                new = f"{_qualname(node.name)}.{role}"
                assert new not in taken, f"initializer name clash: {new}"
                rename[name] = new
                taken.add(new)
    for init in graph.initializer:
        init.name = rename.get(init.name, init.name)
    for node in graph.node:
        for idx, name in enumerate(node.input):
            node.input[idx] = rename.get(name, name)


def export_onnx(model: nn.Module, path: Path, fold_constants: bool = True) -> onnx.ModelProto:
    """Export ``model`` at batch 1 / opset 17 and save the shape-inferred, stripped graph.

    ``fold_constants=False`` keeps BatchNormalization as its own node (the exporter otherwise fuses it into
    the Conv), so the debugger shows the BN tensors a user would see in many real exports.
    """
    model.eval()
    dummy = torch.zeros(INPUT_SHAPE, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # legacy exporter on purpose
            torch.onnx.export(
                model,
                (dummy,),
                str(raw),
                input_names=["input"],
                output_names=["logits"],
                opset_version=OPSET,
                dynamo=False,
                do_constant_folding=fold_constants,
                keep_initializers_as_inputs=False,
                export_params=True,
            )
        m = onnx.load(str(raw))
    _strip(m)
    _tidy(m)
    init_names = {i.name for i in m.graph.initializer}
    assert not any(i.name in init_names for i in m.graph.input), "initializer listed as input"
    m = onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True, data_prop=True)
    onnx.checker.check_model(m, full_check=True)
    _check_static(m)
    onnx.save_model(m, str(path), save_as_external_data=False)
    return m


def _check_static(m: onnx.ModelProto) -> None:
    """Assert every graph input/output/value_info has a fully static shape."""
    for vi in [*m.graph.input, *m.graph.output, *m.graph.value_info]:
        dims = vi.type.tensor_type.shape.dim
        assert all(d.HasField("dim_value") for d in dims), f"non-static shape: {vi.name}"


def ort_eval(path: Path, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Run the ONNX file sample by sample on CPU; return (top-1 accuracy, logits)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    logits = np.concatenate([sess.run(["logits"], {"input": s})[0] for s in x])
    return float((logits.argmax(axis=1) == y).mean()), logits


def sha256(path: Path) -> str:
    """Hex sha256 of a file."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- main


def build_entry(
    name: str,
    description: str,
    *,
    model: nn.Module,
    onnx_model: onnx.ModelProto,
    accuracy: float,
    num_eval: int,
) -> dict[str, Any]:
    """Registry entry for one exported model."""
    path = HERE / f"{name}.onnx"
    return {
        "name": name,
        "file": path.name,
        "description": description,
        "task": "classification",
        "inputs": [{"name": "input", "shape": list(INPUT_SHAPE), "dtype": "float32"}],
        "outputs": [{"name": "logits", "shape": [1, NUM_CLASSES], "dtype": "float32"}],
        "calibration": "digits_calib.npz",
        "evaluation": "digits_eval.npz",
        "label_key": "label",
        "float_accuracy": round(accuracy, 6),
        "num_eval_samples": num_eval,
        "op_types": sorted({n.op_type for n in onnx_model.graph.node}),
        "sha256": sha256(path),
        "params": int(sum(p.numel() for p in model.parameters())),
    }


def main() -> int:
    """Train, export, evaluate and write all sample artefacts."""
    t0 = time.perf_counter()
    set_determinism(SEED)
    x_tr, y_tr, x_te, y_te = load_splits()
    print(f"train {len(x_tr)}  test {len(x_te)}")

    # Calibration and evaluation data: (N, *input_shape).
    calib_idx = np.sort(np.random.default_rng(SEED).choice(len(x_tr), NUM_CALIB, replace=False))
    np.savez(HERE / "digits_calib.npz", input=x_tr[calib_idx][:, None])
    np.savez(HERE / "digits_eval.npz", input=x_te[:, None], label=y_te)

    specs: list[tuple[str, str, Callable[[], nn.Module], dict[str, Any], bool]] = [
        (
            "digits_cnn",
            "Residual CNN (Conv+BN+ReLU, skip Add, MaxPool, GlobalAveragePool, Gemm head) "
            "trained on sklearn digits; BatchNormalization kept as its own node.",
            DigitsCNN,
            {"epochs": 40, "lr": 3e-3, "weight_decay": 1e-4, "augment": random_shift},
            False,
        ),
        (
            "digits_transformer",
            "Tiny pre-LN transformer (8 row tokens, d_model 32, 2 heads, 2 blocks, "
            "explicit MatMul/Softmax attention, exact-erf GELU MLP, mean pool, Gemm head) "
            "trained on sklearn digits.",
            DigitsTransformer,
            {"epochs": 120, "lr": 3e-3, "weight_decay": 1e-2, "augment": random_shift},
            True,
        ),
    ]
    entries = []
    for name, desc, ctor, hp, fold in specs:
        torch.manual_seed(SEED)
        t1 = time.perf_counter()
        model = ctor()
        train(model, x_tr, y_tr, **hp)
        acc_torch = torch_accuracy(model, x_te, y_te)
        m = export_onnx(model, HERE / f"{name}.onnx", fold_constants=fold)
        acc_ort, logits = ort_eval(HERE / f"{name}.onnx", x_te[:, None], y_te)
        with torch.no_grad():
            diff = np.abs(model(torch.from_numpy(x_te)).numpy() - logits).max()
        print(
            f"{name}: torch acc {acc_torch:.4f}  onnxruntime acc {acc_ort:.4f}  "
            f"max|torch-ort| {diff:.2e}  "
            f"train+export {time.perf_counter() - t1:.1f}s  "
            f"size {(HERE / f'{name}.onnx').stat().st_size} B"
        )
        entries.append(build_entry(name, desc, model=model, onnx_model=m, accuracy=acc_ort, num_eval=len(y_te)))

    registry = {"schema_version": 1, "models": entries}
    (HERE / "registry.json").write_text(json.dumps(registry, indent=2) + "\n")
    print(f"done in {time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
