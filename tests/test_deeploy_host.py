"""Deeploy's generated Generic code compiled with gcc against qdebug's host kernels and run (docs/deeploy.md,
"Running the generated code"). Tests needing gcc or the Deeploy environment skip with the reason, except under
``CI=true``, where they fail (``make test`` installs both)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
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
