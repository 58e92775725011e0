"""Deeploy's generated Generic code compiled with gcc against qdebug's host kernels and run (docs/deeploy.md,
"Running the generated code"). Tests needing gcc or the Deeploy environment skip with the reason, except under
``CI=true``, where they fail (``make test`` installs both)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import CliResult
from test_deeploy_env import FAILS_GENERIC, MIXED, NETWORKS, _fail_or_skip, deeploy, deeploy_env  # noqa: F401

from qdebug.errors import DataError, TargetError
from qdebug.targets.deeploy_env import DeeployBuffer, generate
from qdebug.targets.deeploy_host import (
    HOST_DIR,
    compile_generated,
    compiler_available,
    find_compiler,
    run_generated,
)

#: Deeploy's integer reference networks that generate for Generic: the acceptance set of the host kernels.
RUNNABLE = [n for n in NETWORKS if n not in FAILS_GENERIC and n not in MIXED]


@pytest.fixture
def gcc() -> str:
    """The C compiler (skip with what to install, or fail under CI=true)."""
    ok, what = compiler_available()
    if not ok:
        _fail_or_skip(what)
    return what


def _onnx_inputs(model: onnx.ModelProto) -> list[str]:
    inits = {i.name for i in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


# --------------------------------------------------------------------------- gcc only (a hand-written network)
_TOY_H = """#include <stdint.h>
#include "DeeployBasicMath.h"
void RunNetwork(uint32_t core_id, uint32_t numThreads);
void InitNetwork(uint32_t core_id, uint32_t numThreads);
extern void* DeeployNetwork_inputs[2]; extern void* DeeployNetwork_outputs[1];
static const uint32_t DeeployNetwork_num_inputs = 2; static const uint32_t DeeployNetwork_num_outputs = 1;
static const uint32_t DeeployNetwork_inputs_bytes[2] = {4, 2};
static const uint32_t DeeployNetwork_outputs_bytes[1] = {8};
"""
#: y[i] = a[i] + b[i % 2] CALL (int16): checks the byte layout of several inputs, samples and a wider output.
_TOY_C = """#include "Network.h"
void* DeeployNetwork_inputs[2]; void* DeeployNetwork_outputs[1];
void RunNetwork(uint32_t core_id, uint32_t numThreads) {
  int8_t *a = DeeployNetwork_inputs[0], *b = DeeployNetwork_inputs[1]; int16_t *y = DeeployNetwork_outputs[0];
  for (int i = 0; i < 4; ++i) y[i] = (int16_t)(a[i] + b[i % 2]) CALL;
}
void InitNetwork(uint32_t core_id, uint32_t numThreads) {
  DeeployNetwork_inputs[0] = deeploy_malloc(4); DeeployNetwork_inputs[1] = deeploy_malloc(2);
  DeeployNetwork_outputs[0] = deeploy_malloc(8);
}
"""
_TOY_IO = (
    DeeployBuffer("input", 0, "a", "int8_t", (4,), 128),
    DeeployBuffer("input", 1, "b", "int8_t", (2,), 0),
    DeeployBuffer("output", 0, "y", "int16_t", (2, 2), 0),
)


def _toy(folder: Path, call: str = "") -> Path:
    folder.mkdir()
    (folder / "Network.h").write_text(_TOY_H)
    (folder / "Network.c").write_text(_TOY_C.replace("CALL", call))
    return folder


def test_harness_streams_samples_through_the_generated_buffers(gcc: str, tmp_path: Path) -> None:
    build = compile_generated(_toy(tmp_path / "gen", "+ 0"), tmp_path)
    assert build.executable.is_file() and "gcc" in build.compiler.lower() and build.warnings == ()
    # "a" is stored with offset 128 (an unsigned input on Generic), "b" as is; three samples in one run.
    samples = [{"a": np.array([128, 129, 130, 255]), "b": np.array([0, -1])} for _ in range(3)]
    samples[2]["a"] = np.array([0, 0, 0, 0])
    got = run_generated(build, _TOY_IO, samples)
    assert len(got) == 3
    np.testing.assert_array_equal(got[0]["y"], [[0, 0], [2, 126]])
    np.testing.assert_array_equal(got[2]["y"], [[-128, -129], [-128, -129]])
    with pytest.raises(DataError, match="'a' does not fit the generated int8_t buffer"):
        run_generated(build, _TOY_IO, [{"a": np.array([0, 0, 0, 256]), "b": np.array([0, 0])}])
    with pytest.raises(DataError, match="no array for network input 'b'"):
        run_generated(build, _TOY_IO, [{"a": np.zeros(4)}])


def test_relative_folders_compile_and_run_from_anywhere(
    gcc: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Folders given relative to the caller's folder: gcc, which runs in the work folder, still finds the generated
    code, and the executable runs after the caller has moved on (its path is absolute: never a $PATH search)."""
    _toy(tmp_path / "gen", "+ 0")
    (tmp_path / "work").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    build = compile_generated("gen", "work")
    assert build.executable == tmp_path / "work" / "network" and build.executable.is_file()
    here = compile_generated(Path("gen"), ".")
    assert here.executable == tmp_path / "network"
    monkeypatch.chdir(tmp_path / "elsewhere")
    for b in (build, here):
        got = run_generated(b, _TOY_IO, [{"a": np.array([128, 129, 130, 255]), "b": np.array([0, -1])}])
        np.testing.assert_array_equal(got[0]["y"], [[0, 0], [2, 126]])


def test_a_kernel_the_host_library_lacks_is_named(gcc: str, tmp_path: Path) -> None:
    gen = _toy(tmp_path / "gen", "+ Softmax_s8_s8_unknown()")
    (gen / "Network.h").write_text(_TOY_H + "int Softmax_s8_s8_unknown(void);\n")
    with pytest.raises(TargetError, match="does not implement: Softmax_s8_s8_unknown"):
        compile_generated(gen, tmp_path)
    assert not (tmp_path / "network").exists()


def test_missing_compiler_names_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CC", "no-such-cc-qdebug")
    with pytest.raises(TargetError, match=r"apt-get install gcc"):
        find_compiler()
    ok, why = compiler_available()
    assert not ok and "no-such-cc-qdebug" in why
    with pytest.raises(TargetError, match="apt-get install gcc"):
        compile_generated(tmp_path, tmp_path)


def test_host_sources_are_package_data() -> None:
    assert {p.name for p in HOST_DIR.iterdir()} >= {"DeeployBasicMath.h", "qdebug_kernels.c", "harness.c"}


# --------------------------------------------------------------------------- gcc + Deeploy: acceptance
@pytest.mark.parametrize("name", RUNNABLE)
def test_reference_networks_run_bit_exact(
    name: str,
    gcc: str,
    deeploy: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Deeploy's own reference networks, generated for Generic and run with qdebug's kernels, reproduce Deeploy's
    golden outputs exactly (the acceptance test of the host kernels and the harness)."""
    folder = Path(__file__).parent / "data" / "deeploy_reference" / name
    res = generate(folder, tmp_path / "gen", "Generic")
    assert res.ok, res.error
    model = onnx.load(str(folder / "network.onnx"))
    with np.load(folder / "inputs.npz") as z:
        sample = dict(zip(_onnx_inputs(model), (z[k] for k in z.files), strict=False))
    with np.load(folder / "outputs.npz") as z:
        golden = [z[k] for k in z.files]
    build = compile_generated(tmp_path / "gen", tmp_path)
    got = run_generated(build, res.io, [sample])[0]
    for out, ref in zip(model.graph.output, golden, strict=True):
        np.testing.assert_array_equal(got[out.name].reshape(-1), ref.reshape(-1).astype(np.int64), err_msg=out.name)


# --------------------------------------------------------------------------- the transformer kernels (gcc only)
_ROWS, _L = 3, 8
_TR_H = f"""#include "DeeployBasicMath.h"
void RunNetwork(uint32_t core_id, uint32_t numThreads);
void InitNetwork(uint32_t core_id, uint32_t numThreads);
extern void* DeeployNetwork_inputs[1]; extern void* DeeployNetwork_outputs[3];
static const uint32_t DeeployNetwork_num_inputs = 1; static const uint32_t DeeployNetwork_num_outputs = 3;
static const uint32_t DeeployNetwork_inputs_bytes[1] = {{{_ROWS * _L}}};
static const uint32_t DeeployNetwork_outputs_bytes[3] = {{{_ROWS * _L}, {_ROWS * _L}, {_ROWS * _L}}};
"""
#: iLayerNorm, iSoftmax and RequantizediGELU on one int8 input, with the argument lists Deeploy's templates emit.
_TR_C = f"""#include "Network.h"
void* DeeployNetwork_inputs[1]; void* DeeployNetwork_outputs[3];
static int32_t w[{_L}] = {{64, 80, 96, 112, 128, 144, 160, 176}};
static int32_t b[{_L}] = {{-300, -200, -100, 0, 100, 200, 300, 400}};
static int32_t mul = 3, add = -40, shift = 7;
void RunNetwork(uint32_t core_id, uint32_t numThreads) {{
  int8_t *x = DeeployNetwork_inputs[0];
  Layernorm_s8_s8(x, DeeployNetwork_outputs[0], w, b, 0, {_ROWS * _L}, {_L}, 3);
  Softmax_s8_s8(x, DeeployNetwork_outputs[1], {_ROWS * _L}, {_L}, 1000, 23, 300000, 12, 256);
  RQGELU_s8_s8(x, DeeployNetwork_outputs[2], {_ROWS * _L}, -20, 400, 0, 0, &mul, &add, &shift);
}}
void InitNetwork(uint32_t core_id, uint32_t numThreads) {{
  DeeployNetwork_inputs[0] = deeploy_malloc({_ROWS * _L});
  for (int i = 0; i < 3; ++i) DeeployNetwork_outputs[i] = deeploy_malloc({_ROWS * _L});
}}
"""


def _wrap(v: int, bits: int, signed: bool = True) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if signed and v >= 1 << (bits - 1) else v


def _cdiv(a: int, b: int) -> int:
    """C's integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _layernorm(row: list[int]) -> list[int]:
    w, b = [64, 80, 96, 112, 128, 144, 160, 176], [-300, -200, -100, 0, 100, 200, 300, 400]
    mean = _cdiv(sum(row), len(row))
    var = sum(_wrap(x - mean, 16) ** 2 for x in row) // len(row) + 1
    std = int(np.floor(np.sqrt(var)))
    std -= std * std > var
    return [_wrap((_cdiv((x - mean) * w[j], std) + b[j]) >> 3, 8) for j, x in enumerate(row)]


def _softmax(row: list[int]) -> list[int]:
    top, ys = max(row), []
    for x in row:
        diff = x - top
        z = min(max(_wrap(-_cdiv(diff, 12), 8), 0), 31)
        r = diff + z * 12
        ys.append(((_wrap(1000 * (r + 23) ** 2, 32) + 300000) % 2**64 >> z) % 2**32)
    total = sum(ys) % 2**32
    return [_wrap((y * 255 % 2**32) // total - 128, 8) for y in ys]


def _gelu(row: list[int]) -> list[int]:
    out = []
    for x in row:
        sign = (x > 0) - (x < 0)
        d = min(abs(x), 20) - 20
        y = x * ((400 + sign * (400 - d * d)) >> 1)
        out.append(min(max(((y * 3 - 40 + 64) >> 7), -128), 127))
    return out


def test_transformer_kernels_follow_their_definitions(gcc: str, tmp_path: Path) -> None:
    """iLayerNorm, iSoftmax and RequantizediGELU against a plain-Python reading of their integer definitions
    (docs/deeploy.md, "Running the generated code"), extremes included."""
    gen = tmp_path / "gen"
    gen.mkdir()
    (gen / "Network.h").write_text(_TR_H)
    (gen / "Network.c").write_text(_TR_C)
    build = compile_generated(gen, tmp_path)
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (_ROWS, _L))
    x[0, :2], x[1] = (-128, 127), np.arange(-60, 60, 15)
    io = (
        DeeployBuffer("input", 0, "x", "int8_t", (_ROWS, _L)),
        *(DeeployBuffer("output", i, n, "int8_t", (_ROWS, _L)) for i, n in enumerate(("ln", "softmax", "gelu"))),
    )
    got = run_generated(build, io, [{"x": x}])[0]
    rows = [list(map(int, r)) for r in x]
    np.testing.assert_array_equal(got["ln"], [_layernorm(r) for r in rows])
    np.testing.assert_array_equal(got["softmax"], [_softmax(r) for r in rows])
    np.testing.assert_array_equal(got["gelu"], [_gelu(r) for r in rows])


def test_a_build_without_compiler_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """In a build, a missing C compiler is a warning naming what to install; the manifest says the code was not
    run (and the compiled top-1 stays unknown)."""
    from qdebug.targets.deeploy import _host_run

    monkeypatch.setenv("CC", "no-such-cc-qdebug")
    entry, warning = _host_run(tmp_path, {"io": []}, tmp_path / "model.qdq.onnx", [{}])
    assert entry["ran"] is False and "apt-get install gcc" in entry["error"]
    assert entry["label"] == "Deeploy's generated code run with qdebug's host kernels"
    assert warning is not None and warning.startswith("the generated Generic code was not run: no C compiler")


# --------------------------------------------------------------------------- the Generic form (gcc + Deeploy)
def _wide_rqs_add_network() -> onnx.ModelProto:
    """x, y int8 [1,2,2,2] → each scaled exactly by RequantShift(div=1, n_levels=2^32) (int32) → Add →
    RequantShift(div=2^4) → int8: the int32 RequantShift pattern Deeploy's Generic platform miscompiles."""
    from onnx import TensorProto, helper, numpy_helper

    def rqs(src: str, mul: int, add: int, dst: str, div: int, levels: int) -> onnx.NodeProto:
        attrs = {k: numpy_helper.from_array(np.array([v], np.float32)) for k, v in
                 (("div", div), ("n_levels", levels), ("signed", 1))}  # fmt: skip
        return helper.make_node("RequantShift", [src, f"{dst}_m", f"{dst}_a"], [dst], name=f"{dst}_rq", **attrs)

    consts = {"xs_m": 300, "xs_a": -600, "ys_m": 500, "ys_a": 0, "out_m": 1, "out_a": 1000}
    nodes = [rqs("x", 300, -600, "xs", 1, 2**32), rqs("y", 500, 0, "ys", 1, 2**32)]
    nodes += [helper.make_node("Add", ["xs", "ys"], ["acc"], name="add"), rqs("acc", 1, 1000, "out", 2**4, 256)]
    shape = [1, 2, 2, 2]
    g = helper.make_graph(
        nodes,
        "wide_rqs_add",
        [helper.make_tensor_value_info(n, TensorProto.INT8, shape) for n in ("x", "y")],
        [helper.make_tensor_value_info("out", TensorProto.INT8, shape)],
        [numpy_helper.from_array(np.array(v, np.int32), k) for k, v in consts.items()],
        value_info=[helper.make_tensor_value_info(n, TensorProto.INT32, shape) for n in ("xs", "ys", "acc")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_generic_form_fixes_what_generic_miscompiles(
    gcc: str,
    deeploy: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Deeploy accepts int32 RequantShifts on Generic but types them int8 (its Generic RequantShift is int8-only):
    the generated code computes garbage, which gcc's overflow warnings and the run both show. The Generic form
    (integer Mul, the add folded into the output requantization) computes the integer network exactly."""
    from qdebug.targets.deeploy_export import evaluate_integer
    from qdebug.targets.deeploy_generic import generic_form

    model = _wide_rqs_add_network()
    rng = np.random.default_rng(0)
    samples = [{"x": rng.integers(-128, 128, (1, 2, 2, 2)), "y": rng.integers(-128, 128, (1, 2, 2, 2))} for _ in "ab"]
    exact = [evaluate_integer(model, s)["out"] for s in samples]
    fixed, rewritten = generic_form(model)
    assert rewritten == 2 and [n.op_type for n in fixed.graph.node] == ["Mul", "Mul", "Add", "RequantShift"]
    results = {}
    for name, net in (("as_is", model), ("generic", fixed)):
        onnx.save(net, str(tmp_path / f"{name}.onnx"))
        res = generate(tmp_path / f"{name}.onnx", tmp_path / name, "Generic")
        assert res.ok and res.integer_only, res.error  # Deeploy accepts both without a word
        build = compile_generated(tmp_path / name, tmp_path)
        got = run_generated(build, res.io, samples)
        results[name] = (all(np.array_equal(g["out"], e) for g, e in zip(got, exact, strict=True)), build.warnings)
    assert results["generic"] == (True, ())
    assert results["as_is"][0] is False and any("overflow in conversion" in w for w in results["as_is"][1])
    assert generic_form(fixed)[1] == 0  # idempotent: nothing left to rewrite


def test_a_build_fills_the_output_sqnr_table_from_the_host_run(
    deeploy: Path,  # noqa: F811
    gcc: str,
    run_cli: Callable[..., CliResult],
    tmp_path: Path,
) -> None:
    """The Generic code ran on the debug samples: its outputs, dequantized with the output grids, fill 'target vs
    float' and 'target vs CPU-QDQ' (the table says the target is the Generic code on the host), in the manifest as
    the target's accuracy; a manifest without a host run gives no target accuracy (the columns stay '-')."""
    from conftest import SAMPLE_MODELS

    from qdebug.build_manifest import BuildManifest
    from qdebug.targets.base import Compiled
    from qdebug.targets.deeploy import HOST_TARGET_LABEL, DeeployTarget

    out = tmp_path / "out"
    res = run_cli(
        "build", "--float-model", SAMPLE_MODELS / "digits_cnn.onnx", "--target", "deeploy", "--precision", "int8",
        "--calib", SAMPLE_MODELS / "digits_calib.npz", "-o", out,
    )  # fmt: skip
    assert res.code == 0, res.stderr
    assert f"Output SQNR (dB) on 32 samples (target: {HOST_TARGET_LABEL})" in res.out, res.out
    m = BuildManifest.load(out / "manifest.json")
    acc = m.target_accuracy
    assert acc is not None and acc.target == "deeploy" and acc.device == HOST_TARGET_LABEL and acc.num_samples == 32
    [o] = acc.outputs
    [cpu] = m.cpu_qdq_vs_float
    # The generated code is bit-exact to the integer network, which is bit-exact to the CPU QDQ model here.
    assert o.target_vs_cpu_db == math.inf and o.target_vs_float_db is not None and cpu.sqnr_db is not None
    assert o.target_vs_float_db == pytest.approx(cpu.sqnr_db, abs=0.01) and o.cpu_vs_float_db == o.target_vs_float_db
    row = next(line for line in res.out.splitlines() if line.startswith("logits"))
    assert row.split()[1:] == [f"{cpu.sqnr_db:.2f}", f"{o.target_vs_float_db:.2f}", "inf"], row
    not_run = Compiled(m.compile, manifest={"deeploy": {"run": {"Generic": {"ran": False, "error": "no gcc"}}}})
    assert DeeployTarget().check(None, not_run) is None  # type: ignore[arg-type]
