"""Run Deeploy's generated Generic code on the host: gcc + qdebug's own implementation of the kernels it calls.

The ``deeploy-pulp`` wheel carries Deeploy's code generator, not its C kernel library, so ``Network.c`` cannot be
linked against Deeploy's own kernels here. ``qdebug/targets/deeploy_host/`` holds a small host implementation of
exactly the integer kernels the generated Generic code calls (RequantShift, integer Conv / depth-wise Conv / Gemm /
MatMul, MaxPool), written from Deeploy's documented operator semantics with the device's int32 arithmetic, plus a
harness that streams samples through the generated input/output buffers. :func:`compile_generated` builds it
with the system C compiler (``$CC``, else ``gcc``); :func:`run_generated` runs it; :func:`check_generated`
compares its outputs, bit for bit, with the integer ONNX network (qdebug's exact integer evaluator) and with the
QDQ model on ONNX Runtime CPU. This catches what the ONNX-level check cannot: buffer layout, types, parameters,
shifts and offsets as Deeploy generated them.

Siracusa code is generated but not run: no PULP toolchain or simulator is available here.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from qdebug._cc import c_compiler
from qdebug.cancel import run_process
from qdebug.errors import DataError, TargetError
from qdebug.io import temp_dir
from qdebug.report import TargetOutputAccuracy, decode_number, encode_number
from qdebug.targets.deeploy_env import DeeployBuffer
from qdebug.targets.deeploy_movement import identity_casts

__all__ = [
    "HOST_DIR",
    "HOST_RUN_LABEL",
    "SIRACUSA_NOT_RUN",
    "HostBuild",
    "HostRun",
    "check_generated",
    "compile_generated",
    "compiler_available",
    "find_compiler",
    "integer_samples",
    "run_generated",
]

#: The kernels, the header the generated code includes, and the harness (package data).
HOST_DIR = Path(__file__).resolve().with_name("deeploy_host")
_SOURCES = ("qdebug_kernels.c", "harness.c")
#: How the manifest and the CLI name what was run.
HOST_RUN_LABEL = "Deeploy's generated code run with qdebug's host kernels"
#: Why the Siracusa code is not run.
SIRACUSA_NOT_RUN = (
    "code generation only: Siracusa code needs the PULP toolchain and a simulator (GVSoC), which are not available here"
)
SCHEMA_VERSION = 1
_INSTALL_HINT = "install it with `apt-get install gcc` (Debian/Ubuntu; `make gcc` does it), or set $CC to a C compiler"
_CTYPES = {"int8_t": np.int8, "uint8_t": np.uint8, "int16_t": np.int16, "uint16_t": np.uint16,
           "int32_t": np.int32, "uint32_t": np.uint32}  # fmt: skip
_UNDEFINED = re.compile(r"undefined reference to [`']([A-Za-z_][A-Za-z0-9_]*)'")


def find_compiler() -> list[str]:
    """The C compiler command (:func:`qdebug._cc.c_compiler`: ``$CC`` if set, else ``gcc``); a
    :class:`TargetError` naming what to install if absent."""
    cmd = c_compiler(("gcc",))
    if cmd is None:
        cc = os.environ.get("CC", "").strip() or "gcc"
        raise TargetError(f"no C compiler {cc!r} found to run Deeploy's generated code: {_INSTALL_HINT}")
    return cmd


def compiler_available() -> tuple[bool, str]:
    """(a C compiler is there, its path or what to install); never raises."""
    try:
        return True, " ".join(find_compiler())
    except TargetError as exc:
        return False, str(exc)


def _compiler_version(cc: list[str]) -> str:
    proc = subprocess.run([*cc, "--version"], capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
    return (proc.stdout.splitlines() or [" ".join(cc)])[0].strip()


@dataclass(frozen=True)
class HostBuild:
    """An executable built from one generated network: where it is, with what, and gcc's warnings about it."""

    executable: Path
    compiler: str
    seconds: float
    warnings: tuple[str, ...]


def _warnings(stderr: str) -> tuple[str, ...]:
    """gcc's warning lines, shortened to ``file:line: message`` (the generated lines are thousands of columns)."""
    found = []
    for line in stderr.splitlines():
        if ": warning: " in line:
            where, _, what = line.partition(": warning: ")
            found.append(f"{Path(where.split(':')[0]).name}:{where.split(':')[1]}: {what.strip()}")
    return tuple(found)


def compile_generated(codegen_dir: str | Path, work_dir: str | Path) -> HostBuild:
    """Compile ``codegen_dir/Network.c`` with qdebug's host kernels and harness into ``work_dir/network``.

    Built with ``-fwrapv`` (int32 arithmetic wraps as on the device). A kernel the generated code calls that the
    host library lacks is a :class:`TargetError` naming it; so is any other compile error (with gcc's message).
    """
    cc = find_compiler()
    # gcc runs in work_dir, so a path relative to the caller's folder would name another file there; the
    # executable's path must hold a folder too, or running it would search $PATH.
    src, work = Path(codegen_dir).absolute(), Path(work_dir).absolute()
    if not (src / "Network.c").is_file() or not (src / "Network.h").is_file():
        raise TargetError(f"{src}: no generated Network.c / Network.h to compile")
    exe = work / "network"
    cmd = [*cc, "-std=gnu11", "-O2", "-fwrapv", "-I", str(HOST_DIR), "-I", str(src), str(src / "Network.c"),
           *(str(HOST_DIR / s) for s in _SOURCES), "-o", str(exe), "-lm"]  # fmt: skip
    t0 = time.perf_counter()
    proc = run_process(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=work)  # cancellable
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        missing = sorted(set(_UNDEFINED.findall(proc.stderr)))
        if missing:
            raise TargetError(
                f"the generated code in {src} calls kernel(s) qdebug's host library does not implement: "
                f"{', '.join(missing)} (qdebug/targets/deeploy_host/)"
            )
        errors = [ln for ln in proc.stderr.splitlines() if "error" in ln][:5]
        raise TargetError(f"compiling {src / 'Network.c'} failed ({Path(cc[0]).name}): " + " | ".join(errors))
    return HostBuild(exe, _compiler_version(cc), seconds, _warnings(proc.stderr))


def _dtype(buf: DeeployBuffer) -> np.dtype[Any]:
    """The little-endian numpy type of a generated buffer; a non-integer one is a :class:`TargetError`."""
    if buf.ctype not in _CTYPES:
        raise TargetError(
            f"the network's {buf.role} {buf.name!r} is a {buf.ctype} buffer: qdebug's host kernels run integer networks"
        )
    return np.dtype(_CTYPES[buf.ctype]).newbyteorder("<")


def _to_buffer(buf: DeeployBuffer, value: np.ndarray, sample: int) -> bytes:
    """The bytes of one generated input buffer: the ONNX value minus the buffer's offset, in its C type."""
    dtype = _dtype(buf)
    stored = np.asarray(value, np.int64).reshape(-1) - buf.offset
    if stored.size != int(np.prod(buf.shape)):
        raise DataError(f"sample {sample}: input {buf.name!r} has {stored.size} values, the network takes {buf.shape}")
    info = np.iinfo(dtype)
    if stored.size and (stored.min() < info.min or stored.max() > info.max):
        raise DataError(f"sample {sample}: input {buf.name!r} does not fit the generated {buf.ctype} buffer")
    return stored.astype(dtype).tobytes()


def run_generated(
    build: HostBuild, io: Sequence[DeeployBuffer], samples: Sequence[Mapping[str, np.ndarray]], timeout_s: float = 600
) -> list[dict[str, np.ndarray]]:
    """Feed ``samples`` (the integer network's input values by ONNX input name) through the built network.

    Returns per sample the outputs by ONNX output name, as the integer network's values (int64: the generated
    buffer plus its offset), shaped as the generated buffers.
    """
    ins = sorted((b for b in io if b.role == "input"), key=lambda b: b.index)
    outs = sorted((b for b in io if b.role == "output"), key=lambda b: b.index)
    if not ins or not outs:
        raise TargetError("Deeploy did not describe the network's input/output buffers; cannot run it")
    with temp_dir(prefix="qdebug-deeploy-run-") as tmp:
        in_path, out_path = Path(tmp) / "inputs.bin", Path(tmp) / "outputs.bin"
        with open(in_path, "wb") as fh:
            for i, sample in enumerate(samples):
                for b in ins:
                    if b.name not in sample:
                        raise DataError(f"sample {i}: no array for network input {b.name!r} (has {sorted(sample)})")
                    fh.write(_to_buffer(b, sample[b.name], i))
        cmd = [str(build.executable), str(in_path), str(out_path), str(len(samples))]
        try:
            proc = run_process(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:  # run() has killed it
            raise TargetError(f"the compiled Deeploy network did not finish within {timeout_s:g} s") from exc
        if proc.returncode != 0:
            raise TargetError(
                f"the compiled Deeploy network failed (exit code {proc.returncode}): {proc.stderr.strip()[-400:]}"
            )
        raw = out_path.read_bytes()
    return _split_outputs(raw, outs, len(samples))


def _split_outputs(raw: bytes, outs: Sequence[DeeployBuffer], n: int) -> list[dict[str, np.ndarray]]:
    dtypes = [_dtype(b) for b in outs]
    sizes = [int(np.prod(b.shape)) * d.itemsize for b, d in zip(outs, dtypes, strict=True)]
    if len(raw) != n * sum(sizes):
        raise TargetError(f"the compiled Deeploy network wrote {len(raw)} bytes, expected {n * sum(sizes)}")
    results, pos = [], 0
    for _ in range(n):
        sample: dict[str, np.ndarray] = {}
        for b, d, size in zip(outs, dtypes, sizes, strict=True):
            values = np.frombuffer(raw[pos : pos + size], d).astype(np.int64) + b.offset
            sample[b.name] = values.reshape(b.shape)
            pos += size
        results.append(sample)
    return results


# --------------------------------------------------------------------------------------- the comparison
def _q_params(qdq: onnx.ModelProto) -> tuple[dict[str, tuple[float, int]], dict[str, tuple[float, int]]]:
    """(graph input → its QuantizeLinear's (scale, zero point), graph output → its DequantizeLinear's)."""
    from qdebug.graph_index import constant_values, decode_constant
    from qdebug.model_io import is_dq, is_q

    consts = constant_values(qdq)

    def param(node: onnx.NodeProto) -> tuple[float, int]:
        scale = float(decode_constant(consts[node.input[1]]).reshape(-1)[0])
        zp = int(decode_constant(consts[node.input[2]]).reshape(-1)[0]) if len(node.input) > 2 else 0
        return scale, zp

    names_in = {i.name for i in qdq.graph.input}
    names_out = {o.name for o in qdq.graph.output}
    same = identity_casts(qdq)  # a graph input cast to its own type, then quantized (the export drops the Cast)
    cast_of = {n.output[0]: n.input[0] for n in qdq.graph.node if n.op_type == "Cast" and n.output[0] in same}
    ins = {cast_of.get(n.input[0], n.input[0]): param(n) for n in qdq.graph.node
           if is_q(n) and cast_of.get(n.input[0], n.input[0]) in names_in}  # fmt: skip
    outs = {n.output[0]: param(n) for n in qdq.graph.node if is_dq(n) and n.output[0] in names_out}
    return ins, outs


def _stored_offset(network: onnx.ModelProto, name: str) -> int:
    """How the integer network stores a quantized tensor: uint8 tensors hold ``q + 128`` (zero point −128)."""
    for vi in (*network.graph.input, *network.graph.output):
        if vi.name == name:
            return 128 if vi.type.tensor_type.elem_type == onnx.TensorProto.UINT8 else 0
    raise TargetError(f"the integer network has no input or output {name!r}")


def integer_samples(
    qdq: onnx.ModelProto, network: onnx.ModelProto, samples: Iterable[Mapping[str, np.ndarray]]
) -> list[dict[str, np.ndarray]]:
    """Float samples → the integer network's input values: quantized with the QDQ model's input
    QuantizeLinear (round half to even, as ORT), stored as the network stores them."""
    params, _ = _q_params(qdq)
    out = []
    for i, sample in enumerate(samples):
        q: dict[str, np.ndarray] = {}
        for name, (scale, zp) in params.items():
            if name not in sample:
                raise DataError(f"sample {i}: no array for input {name!r} (has {sorted(sample)})")
            x = np.asarray(sample[name], np.float64)
            qv = np.clip(np.rint(x / scale) + zp, -128, 127).astype(np.int64)
            q[name] = qv + _stored_offset(network, name)
        out.append(q)
    return out


@dataclass(frozen=True)
class HostRun:
    """What running the generated Generic code gave on the debug samples.

    ``equal_fraction_vs_integer_onnx`` / ``max_diff_vs_integer_onnx``: against qdebug's exact integer evaluation of
    the exported ``network.onnx`` (what the generated code must compute: anything but 100 % / 0 is a code
    generation, kernel or buffer-layout error). ``equal_fraction_vs_qdq`` / ``max_lsb_vs_qdq``: against the QDQ
    model on ONNX Runtime CPU, on the output's quantization grid (the export's own bit-exactness target).
    """

    label: str
    platform: str
    num_samples: int
    equal_fraction_vs_integer_onnx: float
    max_diff_vs_integer_onnx: int
    equal_fraction_vs_qdq: float
    max_lsb_vs_qdq: int
    compiler: str
    compile_seconds: float
    run_seconds: float
    compiler_warnings: tuple[str, ...] = ()
    #: per output, the run's outputs dequantized with the output grids vs the float model and the CPU-QDQ model
    #: (empty: no float model was given)
    outputs: tuple[TargetOutputAccuracy, ...] = ()

    @property
    def bit_exact(self) -> bool:
        """The generated code computes exactly the integer network."""
        return self.equal_fraction_vs_integer_onnx == 1.0 and self.max_diff_vs_integer_onnx == 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``schema_version``."""
        d = asdict(self)
        d["compiler_warnings"] = list(self.compiler_warnings)
        # +inf (an output equal to the CPU-QDQ model's) as the string "inf", as the debug report writes it
        d["outputs"] = [{k: v if k == "output_name" else encode_number(v) for k, v in o.items()} for o in d["outputs"]]
        d["bit_exact"] = self.bit_exact
        d["schema_version"] = SCHEMA_VERSION
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HostRun:
        """Inverse of :meth:`to_dict`."""
        kw = {k: v for k, v in d.items() if k not in ("schema_version", "bit_exact", "ran")}
        kw["compiler_warnings"] = tuple(kw.get("compiler_warnings", ()))
        kw["outputs"] = tuple(
            TargetOutputAccuracy(
                str(o["output_name"]),
                *(decode_number(o[k]) for k in ("target_vs_float_db", "cpu_vs_float_db", "target_vs_cpu_db")),
            )
            for o in kw.get("outputs", ())
        )
        return cls(**kw)


def _qdq_reference(qdq: onnx.ModelProto, network: onnx.ModelProto, stored: Sequence[Mapping[str, np.ndarray]]) -> Any:
    """Per sample, the QDQ model's outputs on ORT CPU (optimizations off): on the output grid ``q`` (int64), and
    as ORT gave them (float)."""
    from qdebug.ort import make_session

    ins, outs = _q_params(qdq)
    sess: Any = make_session(qdq, ("CPUExecutionProvider",))
    names = [o.name for o in sess.get_outputs()]
    for sample in stored:
        feeds = {}
        for k, (scale, zp) in ins.items():
            feeds[k] = (scale * (sample[k] - _stored_offset(network, k) - zp)).astype(np.float32)
        ref = dict(zip(names, sess.run(None, feeds), strict=True))
        yield {k: np.clip(np.rint(ref[k].astype(np.float64) / s) + z, -128, 127).astype(np.int64)
               for k, (s, z) in outs.items()}, ref  # fmt: skip


def _tally(pairs: Iterable[tuple[np.ndarray, np.ndarray]]) -> tuple[float, int]:
    equal = total = worst = 0
    for a, b in pairs:
        diff = np.abs(np.asarray(a, np.int64).reshape(-1) - np.asarray(b, np.int64).reshape(-1))
        equal += int((diff == 0).sum())
        total += diff.size
        worst = max(worst, int(diff.max(initial=0)))
    return (equal / total if total else 1.0), worst


def check_generated(
    network_dir: str | Path,
    codegen_dir: str | Path,
    io: Sequence[DeeployBuffer],
    qdq_model: str | Path | onnx.ModelProto,
    samples: Sequence[Mapping[str, np.ndarray]],
    platform: str = "Generic",
    float_model: str | Path | None = None,
) -> HostRun:
    """Compile and run the generated code of ``codegen_dir`` on the float ``samples`` and compare its outputs with
    the integer network ``network_dir/network.onnx`` (exact integer evaluation) and with the QDQ model on ORT;
    with ``float_model``, also each output's SQNR vs float and vs CPU-QDQ (:attr:`HostRun.outputs`)."""
    from qdebug.model_io import load_model
    from qdebug.targets.deeploy_evaluate import evaluate_integer

    find_compiler()  # before any work: no compiler is the one failure a user fixes by installing something
    network = load_model(Path(network_dir) / "network.onnx", "Deeploy integer network")
    qdq = qdq_model if isinstance(qdq_model, onnx.ModelProto) else load_model(qdq_model, "QDQ model")
    stored = integer_samples(qdq, network, samples)
    if not stored:
        raise DataError("no samples to run the generated code on")
    with temp_dir(prefix="qdebug-deeploy-cc-") as work:
        build = compile_generated(codegen_dir, work)
        t0 = time.perf_counter()
        got = run_generated(build, io, stored)
        run_s = time.perf_counter() - t0
    names = [o.name for o in network.graph.output]
    exact = [evaluate_integer(network, s) for s in stored]
    eq_int, worst_int = _tally((g[k], e[k]) for g, e in zip(got, exact, strict=True) for k in names)
    offsets = {k: _stored_offset(network, k) for k in names}
    refs = list(_qdq_reference(qdq, network, stored))
    eq_q, worst_q = _tally((g[k] - offsets[k], r[k]) for g, (r, _) in zip(got, refs, strict=True) for k in names)
    grids = {k: (s, z + offsets[k]) for k, (s, z) in _q_params(qdq)[1].items()}
    real = [{k: grids[k][0] * (g[k] - grids[k][1]) for k in names} for g in got]
    outputs = () if float_model is None else _output_sqnr(float_model, samples, real, [f for _, f in refs])
    return HostRun(
        label=HOST_RUN_LABEL,
        platform=platform,
        num_samples=len(stored),
        equal_fraction_vs_integer_onnx=eq_int,
        max_diff_vs_integer_onnx=worst_int,
        equal_fraction_vs_qdq=eq_q,
        max_lsb_vs_qdq=worst_q,
        compiler=build.compiler,
        compile_seconds=round(build.seconds, 4),
        run_seconds=round(run_s, 4),
        compiler_warnings=build.warnings,
        outputs=outputs,
    )


def _output_sqnr(
    float_model: str | Path,
    samples: Sequence[Mapping[str, np.ndarray]],
    target: Sequence[Mapping[str, np.ndarray]],
    cpu: Sequence[Mapping[str, np.ndarray]],
) -> tuple[TargetOutputAccuracy, ...]:
    """Per output over all samples (streaming sums, the one SQNR rule of :class:`~qdebug.metrics.ErrorSums`): the
    target's dequantized outputs vs the float model's and vs the CPU-QDQ model's, and CPU-QDQ vs float."""
    from qdebug.metrics import ErrorSums, reduce_pair
    from qdebug.model_io import load_model
    from qdebug.ort import make_session

    sess: Any = make_session(load_model(float_model, "float model"), ("CPUExecutionProvider",))
    feeds = [i.name for i in sess.get_inputs()]
    names = list(target[0]) if target else []
    sums = {k: [ErrorSums(), ErrorSums(), ErrorSums()] for k in names}
    for sample, t, c in zip(samples, target, cpu, strict=True):
        ref = dict(
            zip([o.name for o in sess.get_outputs()], sess.run(None, {k: sample[k] for k in feeds}), strict=True)
        )
        for k in names:
            if k not in ref:
                raise TargetError(f"the float model has no output {k!r} (the integer network's output)")
            f, tk, ck = np.asarray(ref[k]), np.asarray(t[k], np.float64).reshape(np.shape(ref[k])), np.asarray(c[k])
            pairs = ((f, tk), (f, ck), (ck, tk))
            sums[k] = [s.merge(reduce_pair(a, b)) for s, (a, b) in zip(sums[k], pairs, strict=True)]
    return tuple(TargetOutputAccuracy(k, s[0].sqnr[0], s[1].sqnr[0], s[2].sqnr[0]) for k, s in sums.items())


def run_top1(
    network_dir: Path, codegen: Mapping[str, Any], qdq_model: str | Path, eval_data: Path, label_key: str
) -> float:
    """Top-1 of the generated code (``codegen``: the manifest's ``deeploy.codegen.<platform>`` entry, paths relative
    to ``network_dir``'s parent) over a labelled ``.npz``: argmax of the first network output vs the labels."""
    from qdebug.data import open_data, read_labels
    from qdebug.model_io import input_specs, load_model

    qdq = load_model(qdq_model, "QDQ model")
    network = load_model(network_dir / "network.onnx", "Deeploy integer network")
    source = open_data(eval_data, input_specs(qdq), ignore=(label_key,))
    labels = read_labels(eval_data, label_key, len(source))
    stored = integer_samples(qdq, network, source)
    io = [DeeployBuffer.from_dict(b) for b in codegen["io"]]
    first = network.graph.output[0].name
    with temp_dir(prefix="qdebug-deeploy-cc-") as work:
        build = compile_generated(network_dir.parent / codegen["dir"], work)
        got = run_generated(build, io, stored)
    hits = sum(int(np.argmax(g[first].reshape(-1))) == int(labels[i]) for i, g in enumerate(got))
    return hits / len(stored)
