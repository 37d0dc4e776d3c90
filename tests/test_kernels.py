"""Host tests of the AIE kernels in kernels/: each kernel's scalar path (the same .cc, built by the host g++
without __AIENGINE__) runs on inputs in the layout its design streams (blocked GEMM tiles, row pieces,
joined operand objects, bands) and must match the emulator's result for the same kernel step: the goldens
come from sdk/runtime/emu.py's own kernel functions (EmuExecutable._kernel on a stand-in arena), so the
kernels and the emulator are held to one numerics spec. Never run on hardware; the AIE vector paths are only
compiled with the toolchain (kernels/README.md)."""
from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from kernels import row_streaming, step_operands
from kernels.epilogue import OPCODES, encode_chain
from sdk import ops
from sdk.compiler import layout
from sdk.runtime import packing
from sdk.program import Step
from sdk.runtime import emu

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
BF16 = np.dtype(ml_dtypes.bfloat16)
ULP = 2.0 ** -7  # one bf16 unit in the last place, relative

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs the host g++")


# ---- building and calling the scalar paths ------------------------------------------------------------------

@pytest.fixture(scope="session")
def lib(tmp_path_factory):
    """lib(name, **defines) -> ctypes library of kernels/<name>/<name>.cc, built once per session."""
    out, built = tmp_path_factory.mktemp("kernels"), {}

    def get(name, **defines):
        key = (name, tuple(sorted(defines.items())))
        if key not in built:
            so = out / f"{name}_{len(built)}.so"
            flags = [f"-D{k}={v}" for k, v in defines.items()]
            subprocess.run(["g++", "-std=c++17", "-O1", "-Wall", "-Werror", "-ffp-contract=off", "-fPIC",
                            "-shared", *flags, "-o", str(so), str(KERNELS / name / f"{name}.cc")], check=True)
            built[key] = ctypes.CDLL(str(so))
        return built[key]
    return get


def call(library, fn, *args):
    """Call a kernel: numpy arrays as pointers, python ints as int32, python floats as float."""
    conv = []
    for a in args:
        if isinstance(a, np.ndarray):
            assert a.flags.c_contiguous
            conv.append(ctypes.c_void_p(a.ctypes.data))
        elif isinstance(a, float):
            conv.append(ctypes.c_float(a))
        else:
            conv.append(ctypes.c_int32(int(a)))
    getattr(library, fn)(*conv)


# ---- the emulator as the golden ----------------------------------------------------------------------------

class Arena:
    """The smallest stand-in of EmuExecutable that its _kernel reads and writes: named buffers in their
    device dtypes (bf16 or fp32), loads through views, stores with the device rounding."""

    def __init__(self, **buffers):
        self.buffers = {n: np.array(a) for n, a in buffers.items()}
        self._unpacked = {}

    def _raw(self, name):
        return self.buffers[name]

    def _load(self, name, views=()):
        a = layout.apply_views(self.buffers[name], views)
        return a.astype(np.float32) if a.dtype == BF16 else a

    def _store(self, name, value):
        dtype = self.buffers[name].dtype if name in self.buffers else BF16
        self.buffers[name] = np.asarray(value, np.float32).astype(dtype)

    def weight_matrix(self, name):
        return emu.EmuExecutable.weight_matrix(self, name)

    def _write_cache(self, *a):
        return emu.EmuExecutable._write_cache(self, *a)

    def _state_write(self, *a):
        return emu.EmuExecutable._state_write(self, *a)


def golden(kind, op, inputs: dict, out="y", out_dtype=BF16, attrs=None, chain=(), tiling=None, n_head=None,
           **extra):
    """The emulator's result for one kernel step over `inputs` (name -> stored array)."""
    names = list(inputs)
    arena = Arena(**inputs, **{out: np.zeros(1, out_dtype)})
    step = Step("kernel", kind, tuple(names), (out,), {
        "head": {"op": op, "attrs": attrs or {}}, "chain": list(chain), "views": [[] for _ in names],
        "tiling": tiling or {}, "n_head": n_head if n_head is not None else len(names), "name": op, **extra})
    emu.EmuExecutable._kernel(arena, step)
    return arena.buffers[out].astype(np.float32)


def bf16(x):
    return np.ascontiguousarray(np.asarray(x, np.float32).astype(BF16))


def check(record_parity, label, ours, ref, exact=False):
    ours, ref = np.asarray(ours, np.float32), np.asarray(ref, np.float32)
    record_parity(label, ours, ref)
    if exact:
        np.testing.assert_array_equal(ours, ref)
    else:  # fp32 sums in another order: at most one bf16 rounding apart
        np.testing.assert_allclose(ours, ref, rtol=2 * ULP, atol=1e-6)


def rng(seed=0):
    return np.random.default_rng(seed)


def chain_of(*entries):
    """Epilogue chain entries as fuse.py writes them: ("gelu",), ("scale", f), ("add", slot, swap)."""
    out = []
    for e in entries:
        if e[0] == "scale":
            out.append({"op": "scale", "attrs": {"factor": e[1]}, "operand": None, "swap": False})
        elif len(e) == 1:
            out.append({"op": e[0], "attrs": {}, "operand": None, "swap": False})
        else:
            out.append({"op": e[0], "attrs": {}, "operand": e[1], "swap": e[2]})
    return out


# ---- numerics shared with the emulator ------------------------------------------------------------------------

def test_header_constants_match_the_emulator_and_the_designs():
    header = (KERNELS / "include" / "npu_kernel.h").read_text()
    poly = re.search(r"NPU_EXP2_POLY\[7\] = \{([^}]*)\}", header).group(1)
    coeffs = np.array([float(c.strip().rstrip("f")) for c in poly.split(",")], np.float32)
    np.testing.assert_array_equal(coeffs, emu.EXP2_POLY)
    enum = dict(re.findall(r"EPI_(\w+) = (\d+)", header))
    assert {k.lower(): int(v) for k, v in enum.items()} == OPCODES
    mask = (KERNELS / "maskgen" / "maskgen.cc").read_text()
    assert float.fromhex(re.search(r"MASK_NEG = (-0x[0-9a-fp]+)f", mask).group(1)) == float(ops.NEG_INF)


def test_bf16_rounding_is_nearest_even(lib):
    eltwise = lib("eltwise")
    x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 3.0e38, 1e-40, 0.0, -0.0, 65504.0], np.float32)
    y = np.zeros(8, BF16)
    opmap = np.array([1 << 14] + [0] * 7, np.int32)  # one fp32 operand, in the rows object
    chain, imm = np.zeros(8, np.int32), np.zeros(8, np.float32)
    call(eltwise, "eltwise_unary", x, x, y, 0, 8, opmap, OPCODES["scale"], 1.0, chain, 0, imm)
    np.testing.assert_array_equal(y.view(np.uint16), x.astype(BF16).view(np.uint16))


# ---- GEMM and GEMV -------------------------------------------------------------------------------------------

def blocked(a, r, c):
    """Row-major [rows, cols] -> [rows/r][cols/c][r][c]: what the memtile's dims_to_stream produces."""
    rows, cols = a.shape
    return np.ascontiguousarray(a.reshape(rows // r, r, cols // c, c).transpose(0, 2, 1, 3).reshape(-1))


def unblocked(flat, rows, cols, r, c):
    return flat.reshape(rows // r, cols // c, r, c).transpose(0, 2, 1, 3).reshape(rows, cols)


@pytest.mark.parametrize("mac", [(4, 8, 4), (8, 8, 8)], ids=["npu1", "npu2"])
@pytest.mark.parametrize("epilogue", [(), (("gelu",),), (("silu",), ("scale", 0.5))], ids=["bias", "gelu", "silu"])
def test_gemm_tiles_match_emu(lib, record_parity, mac, epilogue):
    R, S, T = mac
    M, K, N, m, k, n = 16, 40, 32, 8, 16, 16   # K pads to 48 (3 K steps), N = 2 column tiles
    g = rng(1)
    x, w, b = g.normal(size=(M, K)).astype(np.float32), g.normal(size=(N, K)).astype(np.float32), g.normal(size=N).astype(np.float32)
    if not epilogue:
        x = bf16(x)  # bf16 A; the other cases read an fp32 A (the residual stream), rounded by the MACs
    Kp = 48
    recipe = {"kind": "gemm_b", "sources": [["w", []]], "transpose_b": True, "k": K, "n": [N], "tk": k, "tn": n}
    packed = packing.pack(recipe, {"w": w})                                # [Kp/k, N/n, k, n] bf16
    chain = chain_of(*epilogue)
    tiling = {"M": M, "K": K, "N": N, "m": m, "k": k, "n": n, "Kp": Kp, "Np": N, "precision": "bf16"}
    ref = golden("gemm", "linear", {"x": x, "w@packed": packed, "bias": b}, chain=chain, tiling=tiling, n_head=3)

    gemm = lib("gemm", MMUL_R=R, MMUL_S=S, MMUL_T=T)
    words, imms = encode_chain(chain, 3)
    xp = np.pad(x, ((0, 0), (0, Kp - K)))
    out = np.zeros((M, N), np.float32)
    bias = np.zeros(N, np.float32)
    # the bias arrives as whole B-sized objects: its floats, then filler, blocked like B
    obj = np.zeros(k * n * 2, np.uint8)
    obj[:N * 4] = np.frombuffer(b.tobytes(), np.uint8)
    call(gemm, "gemm_bias_load", blocked(obj.view(BF16).reshape(k, n), S, T), bias, 0, N, k, n)
    np.testing.assert_array_equal(bias, b)
    for i in range(M // m):
        for j in range(N // n):
            acc = np.zeros(m * n, np.float32)
            call(gemm, "gemm_zero", acc, m, n)
            for q in range(Kp // k):
                a_tile = blocked(xp[i * m:(i + 1) * m, q * k:(q + 1) * k], R, S)
                b_tile = blocked(packed[q, j], S, T)
                call(gemm, "gemm_mac", a_tile, int(a_tile.dtype == np.float32), b_tile, 1, acc, m, k, n)
            c = np.zeros(m * n, BF16)
            call(gemm, "gemm_store", acc, bias, 1, j * n, c, 0, m, n, words, len(chain), imms)
            out[i * m:(i + 1) * m, j * n:(j + 1) * n] = unblocked(c.astype(np.float32), m, n, R, T)
    check(record_parity, f"gemm{R}x{S}x{T}{'+' if chain else ''}{'+'.join(c['op'] for c in chain)}", out, ref)


@pytest.mark.parametrize("mac", [(4, 8, 4), (8, 8, 8)], ids=["npu1", "npu2"])
def test_gemm_residual_epilogue_matches_emu(lib, record_parity, mac):
    """linear + residual add (fp32 residual stream): the residual tile rides on the A stream as A-sized objects,
    blocked like A tiles by the memtile; gemm_store_residual reads it back out of them."""
    R, S, T = mac
    M, K, N, m, k, n = 16, 32, 32, 8, 16, 16
    g = rng(18)
    x, w, b = bf16(g.normal(size=(M, K))), g.normal(size=(N, K)).astype(np.float32), g.normal(size=N).astype(np.float32)
    res = g.normal(size=(M, N)).astype(np.float32)
    recipe = {"kind": "gemm_b", "sources": [["w", []]], "transpose_b": True, "k": K, "n": [N], "tk": k, "tn": n}
    packed = packing.pack(recipe, {"w": w})
    chain = chain_of(("add", 3, True))
    tiling = {"M": M, "K": K, "N": N, "m": m, "k": k, "n": n, "Kp": K, "Np": N, "precision": "bf16"}
    ref = golden("gemm", "linear", {"x": x, "w@packed": packed, "bias": b, "res": res}, out_dtype=np.float32,
                 chain=chain, tiling=tiling, n_head=3)
    gemm = lib("gemm", MMUL_R=R, MMUL_S=S, MMUL_T=T)
    words, imms = encode_chain(chain, 3)
    out = np.zeros((M, N), np.float32)
    a_bytes = m * k * 2
    for i in range(M // m):
        for j in range(N // n):
            acc = np.zeros(m * n, np.float32)
            call(gemm, "gemm_zero", acc, m, n)
            for q in range(K // k):
                call(gemm, "gemm_mac", blocked(x[i * m:(i + 1) * m, q * k:(q + 1) * k], R, S), 0,
                     blocked(packed[q, j], S, T), 1, acc, m, k, n)
            tile = np.ascontiguousarray(res[i * m:(i + 1) * m, j * n:(j + 1) * n]).view(np.uint8).reshape(-1)  # 2 A objs
            objs = [blocked(tile[o * a_bytes:(o + 1) * a_bytes].view(BF16).reshape(m, k), R, S) for o in range(2)]
            c = np.zeros(m * n, np.float32)
            call(gemm, "gemm_store_residual", acc, b, 1, j * n, c, 1, m, n, words, 1, imms, objs[0], objs[1], 1, 2, k)
            out[i * m:(i + 1) * m, j * n:(j + 1) * n] = unblocked(c, m, n, R, T)
    check(record_parity, f"gemm{R}x{S}x{T}+residual", out, ref)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_gemm_norm_prologue_matches_emu(lib, record_parity, op):
    """A norm fused into the GEMM that reads it: statistics over whole A rows (two passes over the A tiles),
    then each A tile normalised into bf16 and multiplied."""
    R, S, T = 4, 8, 4
    M, K, N, m, k, n = 8, 32, 16, 8, 16, 16
    g = rng(19)
    x = (g.normal(size=(M, K)) * 2 + 0.5).astype(np.float32)             # the residual stream: fp32 A
    w, b = g.normal(size=(N, K)).astype(np.float32), g.normal(size=N).astype(np.float32)
    gamma, beta = g.normal(size=K).astype(np.float32), g.normal(size=K).astype(np.float32)
    recipe = {"kind": "gemm_b", "sources": [["w", []]], "transpose_b": True, "k": K, "n": [N], "tk": k, "tn": n}
    packed = packing.pack(recipe, {"w": w})
    tiling = {"M": M, "K": K, "N": N, "m": m, "k": k, "n": n, "Kp": K, "Np": N, "precision": "bf16"}
    norm_inputs = {"gamma": gamma, "beta": beta} if op == "layer_norm" else {"gamma": gamma}
    prologue = {"op": op, "attrs": {"eps": 1e-5}, "operands": list(range(3, 3 + len(norm_inputs)))}
    ref = golden("gemm", "linear", {"x": x, "w@packed": packed, "bias": b, **norm_inputs}, chain=[],
                 tiling=tiling, n_head=3, prologue=prologue)
    gemm = lib("gemm", MMUL_R=R, MMUL_S=S, MMUL_T=T)
    centred = int(op == "layer_norm")
    st, kpos, a_norm = np.zeros(2 * m, np.float32), np.zeros(1, np.int32), np.zeros(m * k, BF16)
    chain, imm = np.zeros(8, np.int32), np.zeros(8, np.float32)
    out = np.zeros((M, N), np.float32)
    for j in range(N // n):
        tiles = [blocked(x[:, q * k:(q + 1) * k], R, S) for q in range(K // k)]
        call(gemm, "gemm_prologue_begin", st, kpos, m)
        if centred:
            for t in tiles:
                call(gemm, "gemm_prologue_sum", t, 1, st, m, k)
        for t in tiles:
            call(gemm, "gemm_prologue_squares", t, 1, st, m, k, K, centred)
        acc = np.zeros(m * n, np.float32)
        call(gemm, "gemm_zero", acc, m, n)
        for q, t in enumerate(tiles):
            bt = blocked(packed[q, j], S, T)
            if centred:
                call(gemm, "gemm_prologue_apply", t, 1, gamma, beta, centred, st, kpos, a_norm, m, k, K, centred, 1e-5)
                call(gemm, "gemm_mac", a_norm, 0, bt, 1, acc, m, k, n)
            else:  # the one call the design makes: normalise, then multiply
                call(gemm, "gemm_prologue_mac", t, 1, gamma, beta, 0, st, kpos, a_norm, bt, 1, acc, m, k, n, K, 0, 1e-5)
        c = np.zeros(m * n, BF16)
        call(gemm, "gemm_store", acc, b, 1, j * n, c, 0, m, n, chain, 0, imm)
        out[:, j * n:(j + 1) * n] = unblocked(c.astype(np.float32), m, n, R, T)
    check(record_parity, f"gemm with a {op} prologue", out, ref)


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "shifted"])
@pytest.mark.parametrize("mac", [(4, 8, 4), (8, 8, 8)], ids=["npu1", "npu2"])
def test_bmm_with_a_batched_transposed_b_matches_emu(lib, record_parity, mac, padded):
    """Rel-pos attention scores as the conformer computes them: q [1, H, T, D] @ r [1, H, D, 2T - 1], with r read
    from a [2T - 1, H x D] projection through reshape + transpose. Each head multiplies its own B, which arrives
    as [n, k] tiles of B^T (blocked [k/S][n/T][T][S] by the memtile). N = 31 columns: either the output is
    padded to 32 (memory.pad_to_tiles), the row of B^T past N repeats the last one and gemm_mac_bt zeroes it, so
    the padding column holds the epilogue of a zero accumulator as the emulator stores it; or the last column
    tile shifts to end at N (columns 15 on, written twice with the same values)."""
    R, S, T = mac
    H, Tq, D, m, k, n = 2, 16, 16, 8, 8, 16           # 2 row tiles per head, 2 K steps, 2 column tiles
    N, Np = 2 * Tq - 1, 32
    width = Np if padded else N
    g = rng(7)
    q, r = bf16(g.normal(size=(1, H, Tq, D))), bf16(g.normal(size=(N, H * D)))
    chain = chain_of(("scale", 0.25))
    tiling = {"M": H * Tq, "K": D, "N": N, "m": m, "k": k, "n": n, "Kp": D, "Np": Np, "batch": H,
              "precision": "bf16"}
    ref = golden("bmm", "matmul", {"q": q, "r": r}, out_dtype=np.float32, chain=chain, tiling=tiling, n_head=2,
                 views=[[], [("reshape", (1, N, H, D)), ("transpose", (0, 2, 3, 1))]],
                 **({"stored_width": Np} if padded else {}))
    assert ref.shape == (1, H, Tq, width)
    gemm = lib("gemm", MMUL_R=R, MMUL_S=S, MMUL_T=T)
    words, imms = encode_chain(chain, 2)
    no_bias = np.zeros(n, np.float32)
    out = np.full((1, H, Tq, width), np.nan, np.float32)
    for h in range(H):
        for i in range(Tq // m):
            for j in range(Np // n):
                col0 = j * n if padded else min(j * n, N - n)
                bt = r[np.minimum(col0 + np.arange(n), N - 1), h * D:(h + 1) * D]   # [n, K] of B^T
                acc = np.zeros(m * n, np.float32)
                call(gemm, "gemm_zero", acc, m, n)
                for s in range(D // k):
                    a_tile = blocked(q[0, h, i * m:(i + 1) * m, s * k:(s + 1) * k], R, S)
                    obj = bt[:, s * k:(s + 1) * k]
                    bt_obj = np.ascontiguousarray(obj.reshape(n // T, T, k // S, S).transpose(2, 0, 1, 3).reshape(-1))
                    call(gemm, "gemm_mac_bt", a_tile, 0, bt_obj, min(n, N - col0), acc, m, k, n)
                c = np.zeros(m * n, np.float32)
                call(gemm, "gemm_store", acc, no_bias, 0, 0, c, 1, m, n, words, len(chain), imms)
                out[0, h, i * m:(i + 1) * m, col0:col0 + n] = unblocked(c, m, n, R, T)
    if padded:
        assert (out[..., N:] == 0).all()
    check(record_parity, f"bmm{R}x{S}x{T} batched B^T {'padded' if padded else 'shifted'}", out, ref)


def test_gemv_matches_emu(lib, record_parity):
    K, N, k, n = 48, 64, 16, 32
    g = rng(2)
    x, w, b = bf16(g.normal(size=(1, K))), g.normal(size=(N, K)).astype(np.float32), g.normal(size=N).astype(np.float32)
    recipe = {"kind": "gemm_b", "sources": [["w", []]], "transpose_b": True, "k": K, "n": [N], "tk": k, "tn": n}
    packed = packing.pack(recipe, {"w": w})
    chain = chain_of(("gelu_tanh",))
    tiling = {"M": 1, "K": K, "N": N, "m": 4, "k": k, "n": n, "Kp": K, "Np": N, "precision": "bf16"}
    ref = golden("gemm", "linear", {"x": x, "w@packed": packed, "bias": b}, chain=chain, tiling=tiling, n_head=3)
    gemv = lib("gemv")
    words, imms = encode_chain(chain, 3)
    bias = np.zeros(N, np.float32)
    call(gemv, "gemv_bias_load", np.ascontiguousarray(b.view(BF16)), bias, 0, N)
    out = np.zeros(N, np.float32)
    for j in range(N // n):
        acc = np.zeros(n, np.float32)
        call(gemv, "gemv_zero", acc, n)
        for q in range(K // k):
            call(gemv, "gemv_mac", np.ascontiguousarray(x[0, q * k:(q + 1) * k]), 0,
                 np.ascontiguousarray(packed[q, j].reshape(-1)), 1, acc, k, n)
        y = np.zeros(n, BF16)
        call(gemv, "gemv_store", acc, bias, 1, j * n, y, 0, n, words, 1, imms)
        out[j * n:(j + 1) * n] = y.astype(np.float32)
    check(record_parity, "gemv+gelu_tanh", out, ref[0])


def test_gemv_residual_epilogue_matches_emu(lib, record_parity):
    K, N, k, n = 32, 32, 16, 16
    g = rng(20)
    x, w, b = bf16(g.normal(size=(1, K))), g.normal(size=(N, K)).astype(np.float32), g.normal(size=N).astype(np.float32)
    res = g.normal(size=(1, N)).astype(np.float32)
    recipe = {"kind": "gemm_b", "sources": [["w", []]], "transpose_b": True, "k": K, "n": [N], "tk": k, "tn": n}
    packed = packing.pack(recipe, {"w": w})
    chain = chain_of(("add", 3, False))
    tiling = {"M": 1, "K": K, "N": N, "m": 4, "k": k, "n": n, "Kp": K, "Np": N, "precision": "bf16"}
    ref = golden("gemm", "linear", {"x": x, "w@packed": packed, "bias": b, "res": res}, out_dtype=np.float32,
                 chain=chain, tiling=tiling, n_head=3)
    gemv = lib("gemv")
    words, imms = encode_chain(chain, 3)
    out = np.zeros(N, np.float32)
    for j in range(N // n):
        acc = np.zeros(n, np.float32)
        call(gemv, "gemv_zero", acc, n)
        for q in range(K // k):
            call(gemv, "gemv_mac", np.ascontiguousarray(x[0, q * k:(q + 1) * k]), 0,
                 np.ascontiguousarray(packed[q, j].reshape(-1)), 1, acc, k, n)
        r_obj = np.ascontiguousarray(np.tile(res[0, j * n:(j + 1) * n], k // 2))   # one W-sized object
        y = np.zeros(n, np.float32)
        call(gemv, "gemv_store_residual", acc, b, 1, j * n, y, 1, n, words, 1, imms, r_obj, 1)
        out[j * n:(j + 1) * n] = y
    check(record_parity, "gemv+residual", out, ref[0])


def split_case(seed, M, K, N, k, n):
    """A GEMM with split weights (catalog.SPLIT_WEIGHTS): the weight packed as [2, Kp/k, Np/n, k, n] bf16 hi + lo
    planes, the emulator's fp32 result for it, and its result from the hi plane alone (what the lo plane fixes)."""
    g = rng(seed)
    x, w, b = bf16(g.normal(size=(M, K))), g.normal(size=(N, K)).astype(np.float32), g.normal(size=N).astype(np.float32)
    recipe = {"kind": "gemm_b", "sources": [["w", []]], "transpose_b": True, "k": K, "n": [N], "tk": k, "tn": n,
              "planes": 2}
    packed = packing.pack(recipe, {"w": w})
    tiling = {"M": M, "K": K, "N": N, "m": 4, "k": k, "n": n, "Kp": K, "Np": N, "precision": "bf16",
              "weight_planes": 2}
    ref, hi_only = (golden("gemm", "linear", {"x": x, "w@packed": p, "bias": b}, out_dtype=np.float32, tiling=tiling,
                           n_head=3) for p in (packed, packed[0]))
    return x, b, packed, ref, hi_only


def check_split(record_parity, label, ours, ref, hi_only):
    """Both planes' products in one fp32 accumulator: the emulator's result to fp32 summation order, and far
    closer to it than the hi plane alone comes."""
    record_parity(label, ours, ref)
    tol = 1e-5 * np.abs(ref).max()
    np.testing.assert_allclose(ours, ref, rtol=0, atol=tol)
    assert np.abs(hi_only - ref).max() > 20 * tol


@pytest.mark.parametrize("mac", [(4, 8, 4), (8, 8, 8)], ids=["npu1", "npu2"])
def test_gemm_split_weights_match_emu(lib, record_parity, mac):
    """Each B object holds a tile's hi plane then its lo plane ([2k, n], blocked by the memtile as one tile);
    gemm_mac runs both MAC passes into the accumulator, and the bias rides on the doubled objects."""
    R, S, T = mac
    M, K, N, k, n = 8, 32, 32, 16, 16
    m = M
    x, b, packed, ref, hi_only = split_case(22, M, K, N, k, n)
    gemm = lib("gemm", MMUL_R=R, MMUL_S=S, MMUL_T=T)
    obj = np.zeros(2 * k * n * 2, np.uint8)
    obj[:N * 4] = np.frombuffer(b.tobytes(), np.uint8)
    bias = np.zeros(N, np.float32)
    call(gemm, "gemm_bias_load", blocked(obj.view(BF16).reshape(2 * k, n), S, T), bias, 0, N, 2 * k, n)
    np.testing.assert_array_equal(bias, b)
    chain, imm = np.zeros(8, np.int32), np.zeros(8, np.float32)
    out = np.zeros((M, N), np.float32)
    for j in range(N // n):
        acc = np.zeros(m * n, np.float32)
        call(gemm, "gemm_zero", acc, m, n)
        for q in range(K // k):
            b_obj = blocked(np.concatenate([packed[0, q, j], packed[1, q, j]]), S, T)
            call(gemm, "gemm_mac", blocked(x[:, q * k:(q + 1) * k], R, S), 0, b_obj, 2, acc, m, k, n)
        c = np.zeros(m * n, np.float32)
        call(gemm, "gemm_store", acc, bias, 1, j * n, c, 1, m, n, chain, 0, imm)
        out[:, j * n:(j + 1) * n] = unblocked(c, m, n, R, T)
    check_split(record_parity, f"gemm{R}x{S}x{T} split weights", out, ref, hi_only)


def test_gemv_split_weights_match_emu(lib, record_parity):
    """Each W object holds a tile's hi plane then its lo plane; gemv_mac runs both MAC passes."""
    K, N, k, n = 48, 64, 16, 32
    x, b, packed, ref, hi_only = split_case(23, 1, K, N, k, n)
    gemv = lib("gemv")
    chain, imm = np.zeros(8, np.int32), np.zeros(8, np.float32)
    out = np.zeros(N, np.float32)
    for j in range(N // n):
        acc = np.zeros(n, np.float32)
        call(gemv, "gemv_zero", acc, n)
        for q in range(K // k):
            w_obj = np.ascontiguousarray(packed[:, q, j].reshape(-1))
            call(gemv, "gemv_mac", np.ascontiguousarray(x[0, q * k:(q + 1) * k]), 0, w_obj, 2, acc, k, n)
        y = np.zeros(n, np.float32)
        call(gemv, "gemv_store", acc, b, 1, j * n, y, 1, n, chain, 0, imm)
        out[j * n:(j + 1) * n] = y
    check_split(record_parity, "gemv split weights", out, ref[0], hi_only[0])


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_gemv_norm_prologue_matches_emu(lib, record_parity, op):
    K, N, k, n = 32, 32, 16, 16
    g = rng(21)
    x = (g.normal(size=(1, K)) * 2 + 0.5).astype(np.float32)
    w, b = g.normal(size=(N, K)).astype(np.float32), g.normal(size=N).astype(np.float32)
    gamma, beta = g.normal(size=K).astype(np.float32), g.normal(size=K).astype(np.float32)
    recipe = {"kind": "gemm_b", "sources": [["w", []]], "transpose_b": True, "k": K, "n": [N], "tk": k, "tn": n}
    packed = packing.pack(recipe, {"w": w})
    tiling = {"M": 1, "K": K, "N": N, "m": 4, "k": k, "n": n, "Kp": K, "Np": N, "precision": "bf16"}
    norm_inputs = {"gamma": gamma, "beta": beta} if op == "layer_norm" else {"gamma": gamma}
    prologue = {"op": op, "attrs": {"eps": 1e-5}, "operands": list(range(3, 3 + len(norm_inputs)))}
    ref = golden("gemm", "linear", {"x": x, "w@packed": packed, "bias": b, **norm_inputs}, tiling=tiling, n_head=3,
                 prologue=prologue)
    gemv = lib("gemv")
    centred = int(op == "layer_norm")
    chain, imm = np.zeros(8, np.int32), np.zeros(8, np.float32)
    st, kpos, x_norm = np.zeros(2, np.float32), np.zeros(1, np.int32), np.zeros(k, BF16)
    chunks = [np.ascontiguousarray(x[0, q * k:(q + 1) * k]) for q in range(K // k)]
    out = np.zeros(N, np.float32)
    for j in range(N // n):
        call(gemv, "gemv_prologue_begin", st, kpos)
        if centred:
            for c in chunks:
                call(gemv, "gemv_prologue_sum", c, 1, st, k)
        for c in chunks:
            call(gemv, "gemv_prologue_squares", c, 1, st, k, K, centred)
        acc = np.zeros(n, np.float32)
        call(gemv, "gemv_zero", acc, n)
        for q, c in enumerate(chunks):
            call(gemv, "gemv_prologue_mac", c, 1, gamma, beta, centred, st, kpos, x_norm,
                 np.ascontiguousarray(packed[q, j].reshape(-1)), 1, acc, k, n, K, centred, 1e-5)
        y = np.zeros(n, BF16)
        call(gemv, "gemv_store", acc, b, 1, j * n, y, 0, n, chain, 0, imm)
        out[j * n:(j + 1) * n] = y.astype(np.float32)
    check(record_parity, f"gemv with a {op} prologue", out, ref[0])


# ---- streaming kernels: joined operand objects ------------------------------------------------------------

def joined(*operands):
    """The memtile-joined object of one row piece and its map codes (npu_operand): each operand's bytes in
    order, offsets in 32-bit words, bit 14 set for fp32 operands."""
    data, codes, offset = [], [], 0
    for a in operands:
        a = np.ascontiguousarray(a)
        codes.append((1 << 14 if a.dtype == np.float32 else 0) | offset // 4)
        data.append(a.view(np.uint8))
        offset += a.nbytes
    return np.ascontiguousarray(np.concatenate(data)), codes


def opmap(codes, shared_codes=()):
    return np.array(list(codes) + [1 << 15 | c for c in shared_codes] + [0] * (8 - len(codes) - len(shared_codes)),
                    np.int32)


@pytest.mark.parametrize("op", ["gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "exp", "relu"])
def test_eltwise_unary_matches_emu(lib, record_parity, op):
    x = bf16(rng(3).normal(scale=3.0, size=(4, 64)))
    ref = golden("eltwise", op, {"x": x})
    lib_ = lib("eltwise")
    out = np.zeros_like(x)
    chain, imm = np.zeros(8, np.int32), np.zeros(8, np.float32)
    for r in range(4):
        obj, codes = joined(x[r])
        y = np.zeros(64, BF16)
        call(lib_, "eltwise_unary", obj, obj, y, 0, 64, opmap(codes), OPCODES[op], 0.0, chain, 0, imm)
        out[r] = y
    check(record_parity, f"eltwise {op}", out.astype(np.float32), ref, exact=True)


def test_eltwise_binary_with_chain_and_shared_operand(lib, record_parity):
    """a + bias(shared, fp32), then the chain silu, *0.25, + residual (an fp32 residual-stream operand)."""
    g = rng(4)
    a, bias, res = bf16(g.normal(size=(3, 32))), g.normal(size=32).astype(np.float32), g.normal(size=(3, 32)).astype(np.float32)
    chain = chain_of(("silu",), ("scale", 0.25), ("add", 2, True))
    ref = golden("eltwise", "add", {"a": a, "bias": np.broadcast_to(bias, (3, 32)).copy(), "res": res},
                 out_dtype=np.float32, chain=chain, n_head=2)
    words, imms = encode_chain(chain, 2)
    k = lib("eltwise")
    out = np.zeros((3, 32), np.float32)
    for r in range(3):
        rows, codes = joined(a[r], res[r])
        shared, shared_codes = joined(bias)
        y = np.zeros(32, np.float32)
        m = np.array([codes[0], 1 << 15 | shared_codes[0], codes[1]] + [0] * 5, np.int32)  # inputs a, bias, res
        call(k, "eltwise_binary", rows, shared, y, 1, 32, m, OPCODES["add"], words, len(chain), imms)
        out[r] = y
    check(record_parity, "eltwise add+silu*0.25+res (fp32 out)", out, ref)


def test_eltwise_scalar_operand_matches_emu(lib, record_parity):
    """A per-row fp32 factor ([rows, 1], broadcast along the row): one value per piece, flagged scalar in the map."""
    g = rng(17)
    x, f = bf16(g.normal(size=(3, 32))), g.normal(size=(3, 1)).astype(np.float32)
    ref = golden("eltwise", "mul", {"x": x, "f": f})
    k = lib("eltwise")
    chain, imm = np.zeros(8, np.int32), np.zeros(8, np.float32)
    out = np.zeros((3, 32), np.float32)
    for r in range(3):
        rows, codes = joined(x[r], f[r])
        m = np.array([codes[0], codes[1] | 1 << 13] + [0] * 6, np.int32)
        y = np.zeros(32, BF16)
        call(k, "eltwise_binary", rows, rows, y, 0, 32, m, OPCODES["mul"], chain, 0, imm)
        out[r] = y.astype(np.float32)
    check(record_parity, "eltwise x * per-row scalar", out, ref, exact=True)


@pytest.mark.parametrize("op", ["add", "sub", "mul"])
def test_eltwise_int32_matches_emu(lib, op):
    g = rng(16)
    a, b = g.integers(-1000, 1000, size=(2, 16), dtype=np.int32), g.integers(-50, 50, size=16, dtype=np.int32)
    ref = golden("eltwise", op, {"a": a, "b": np.broadcast_to(b, a.shape).copy()}, out_dtype=np.int32)
    k = lib("eltwise")
    out = np.zeros((2, 16), np.int32)
    for r in range(2):
        rows, codes = joined(a[r])
        shared, scodes = joined(b)
        y = np.zeros(16, np.int32)
        call(k, "eltwise_int", rows, shared, y, 16, opmap(codes, scodes), OPCODES[op])
        out[r] = y
    np.testing.assert_array_equal(out, ref)


def test_eltwise_glu_matches_emu(lib, record_parity):
    x = bf16(rng(5).normal(size=(2, 64)))
    ref = golden("eltwise", "glu", {"x": x}, attrs={"axis": -1})
    k = lib("eltwise")
    out = np.zeros((2, 32), np.float32)
    chain, imm = np.zeros(8, np.int32), np.zeros(8, np.float32)
    for r in range(2):
        obj, codes = joined(x[r, :32], x[r, 32:])
        y = np.zeros(32, BF16)
        call(k, "eltwise_glu", obj, obj, y, 0, 32, opmap(codes), chain, 0, imm)
        out[r] = y.astype(np.float32)
    check(record_parity, "glu", out, ref, exact=True)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("piece", [96, 32], ids=["resident", "three-pass"])
def test_softmax_matches_emu(lib, record_parity, op, piece):
    x = bf16(rng(6).normal(scale=4.0, size=(3, 96)))
    ref = golden("softmax", op, {"x": x}, attrs={"axis": -1})
    k = lib("softmax")
    chain, imm = np.zeros(8, np.int32), np.zeros(8, np.float32)
    out = np.zeros((3, 96), np.float32)
    for r in range(3):
        st = np.zeros(2, np.float32)
        call(k, "softmax_begin", st)
        objs = [joined(x[r, p:p + piece]) for p in range(0, 96, piece)]
        for phase in ("softmax_max", "softmax_sum"):
            for obj, codes in objs:
                call(k, phase, obj, obj, piece, opmap(codes), st)
        for p, (obj, codes) in zip(range(0, 96, piece), objs):
            y = np.zeros(piece, BF16)
            call(k, "softmax_store", obj, obj, y, 0, piece, opmap(codes), st, int(op == "log_softmax"), chain, 0, imm)
            out[r, p:p + piece] = y.astype(np.float32)
    check(record_parity, f"{op} pieces of {piece}", out, ref)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_norm_matches_emu(lib, record_parity, op):
    g = rng(7)
    x = (g.normal(size=(4, 64)) * 3 + 1).astype(np.float32)           # the residual stream: fp32
    w, b = g.normal(size=64).astype(np.float32), g.normal(size=64).astype(np.float32)
    inputs = {"x": x, "w": w, "b": b} if op == "layer_norm" else {"x": x, "w": w}
    ref = golden("norm", op, inputs, attrs={"eps": 1e-5})
    k = lib("norm")
    chain, imm = np.zeros(8, np.int32), np.zeros(8, np.float32)
    out = np.zeros((4, 64), np.float32)
    centred, has_bias = int(op == "layer_norm"), int(op == "layer_norm")
    for r in range(4):
        st = np.zeros(2, np.float32)
        call(k, "norm_begin", st)
        pieces = []
        for p in range(0, 64, 32):  # two pieces: the three-phase path
            rows, codes = joined(x[r, p:p + 32])
            shared, scodes = joined(w[p:p + 32], *([b[p:p + 32]] if has_bias else []))
            pieces.append((rows, shared, opmap(codes, scodes)))
        if centred:
            for rows, shared, m in pieces:
                call(k, "norm_sum", rows, shared, 32, m, st)
        for rows, shared, m in pieces:
            call(k, "norm_squares", rows, shared, 32, m, 64, centred, st)
        for p, (rows, shared, m) in zip(range(0, 64, 32), pieces):
            y = np.zeros(32, BF16)
            call(k, "norm_store", rows, shared, y, 0, 32, m, 64, centred, has_bias, 1e-5, st, chain, 0, imm)
            out[r, p:p + 32] = y.astype(np.float32)
    check(record_parity, op, out, ref)


def test_rope_matches_emu(lib, record_parity):
    g = rng(8)
    T, d = 5, 16
    x = bf16(g.normal(size=(2, T, d)))
    ang = np.arange(T)[:, None] * np.exp(-np.arange(d // 2) / 4.0)[None]
    cos, sin = bf16(np.cos(np.concatenate([ang, ang], -1))), bf16(np.sin(np.concatenate([ang, ang], -1)))
    ref = golden("rope", "rotary", {"x": x, "cos": np.broadcast_to(cos, x.shape).copy(),
                                    "sin": np.broadcast_to(sin, x.shape).copy()})
    k = lib("rope")
    chain, imm = np.zeros(8, np.int32), np.zeros(8, np.float32)
    out = np.zeros(x.shape, np.float32)
    for bi in range(2):
        for t in range(T):
            obj, codes = joined(x[bi, t], cos[t], sin[t])
            y = np.zeros(d, BF16)
            call(k, "rope_row", obj, obj, y, 0, d, opmap(codes), chain, 0, imm)
            out[bi, t] = y.astype(np.float32)
    check(record_parity, "rope", out, ref, exact=True)


# ---- attention -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("Tq,Tk,tk,mask_f32,key_mask",
                         [(6, 24, 8, False, False), (1, 32, 16, False, False), (6, 21, 7, True, False),
                          (6, 24, 8, False, True), (6, 21, 7, True, True)],
                         ids=["prefill", "decode", "fp32-mask", "key-mask", "fp32-key-mask"])
def test_mha_matches_emu(lib, record_parity, Tq, Tk, tk, mask_f32, key_mask):
    """A fp32 mask (rows of odd width are stored so) rides in the key block's object as pairs of bf16 units and is
    announced by a negative mask_rows. A key mask ([B, 1, 1, Tk]: ESM-2's and GigaAM's padding) rides as one row
    of tk per block (mask_rows 1, or -1 in fp32) that the kernel broadcasts over the query rows."""
    g = rng(9)
    d, scale = 16, 0.25
    q, kk, v = bf16(g.normal(size=(1, 2, Tq, d))), bf16(g.normal(size=(1, 2, Tk, d))), bf16(g.normal(size=(1, 2, Tk, d)))
    pos = Tk - Tq - 3 if Tq > 1 else 20                                    # a causal cache mask from a position
    mask = bf16(ops.length_mask(Tk - 5, size=Tk)[None] if key_mask
                else ops.causal_cache_mask(np.int32(pos), n_new=Tq, size=Tk))
    ref = golden("mha", "attention", {"q": q, "k": kk, "v": v, "mask": mask[None, None]}, attrs={"scale": scale})
    lib_ = lib("mha")
    chain, imm = np.zeros(8, np.int32), np.zeros(8, np.float32)
    out = np.zeros((1, 2, Tq, d), np.float32)
    for h in range(2):
        st, acc = np.zeros(2 * Tq, np.float32), np.zeros(Tq * d, np.float32)
        qt = np.ascontiguousarray(q[0, h])
        call(lib_, "mha_begin", st, acc, Tq, d)
        rows = -len(mask) if mask_f32 else len(mask)
        stored = (lambda m: np.ascontiguousarray(m, np.float32).view(BF16)) if mask_f32 else (lambda m: m)  # noqa: E731
        blocks = [np.ascontiguousarray(np.concatenate([kk[0, h, j:j + tk].reshape(-1), v[0, h, j:j + tk].reshape(-1),
                                                       stored(mask[:, j:j + tk]).reshape(-1)]))
                  for j in range(0, Tk, tk)]
        for kvm in blocks:  # the memtile-joined key block: k, v, mask
            call(lib_, "mha_max", qt, kvm, st, Tq, tk, d, scale, rows)
        for kvm in blocks:
            call(lib_, "mha_sum", qt, kvm, st, Tq, tk, d, scale, rows)
        for kvm in blocks:
            call(lib_, "mha_pv", qt, kvm, st, acc, Tq, tk, d, scale, rows)
        y = np.zeros(Tq * d, BF16)
        call(lib_, "mha_store", acc, y, 0, Tq, d, chain, 0, imm)
        out[0, h] = y.astype(np.float32).reshape(Tq, d)
    check(record_parity, f"mha Tq={Tq} Tk={Tk}", out, ref)


def test_mha_shifted_last_query_tile_rewrites_identical_bytes(lib):
    """When no query tile divides Tq (ViT's 197 tokens), the design shifts the last tile back to end at Tq, and its
    first rows are computed again and drained over the previous tile's: a row's output depends on its own query
    and mask rows only, so both drains carry the same bytes (the rule the design relies on, as the GEMM's shifted
    last row tile does)."""
    g = rng(11)
    Tq, Tk, tk, tq, d, scale = 11, 16, 8, 4, 16, 0.25
    q, kk, v = bf16(g.normal(size=(Tq, d))), bf16(g.normal(size=(Tk, d))), bf16(g.normal(size=(Tk, d)))
    mask = bf16(np.where(g.random((Tq, Tk)) < 0.2, -1e4, 0.0))
    lib_ = lib("mha")
    chain, imm = np.zeros(8, np.int32), np.zeros(8, np.float32)

    def tile(s):
        st, acc = np.zeros(2 * tq, np.float32), np.zeros(tq * d, np.float32)
        qt = np.ascontiguousarray(q[s:s + tq])
        blocks = [np.ascontiguousarray(np.concatenate([kk[j:j + tk].reshape(-1), v[j:j + tk].reshape(-1),
                                                       mask[s:s + tq, j:j + tk].reshape(-1)]))
                  for j in range(0, Tk, tk)]
        call(lib_, "mha_begin", st, acc, tq, d)
        for phase in ("mha_max", "mha_sum"):
            for kvm in blocks:
                call(lib_, phase, qt, kvm, st, tq, tk, d, scale, tq)
        for kvm in blocks:
            call(lib_, "mha_pv", qt, kvm, st, acc, tq, tk, d, scale, tq)
        y = np.zeros(tq * d, BF16)
        call(lib_, "mha_store", acc, y, 0, tq, d, chain, 0, imm)
        return y.reshape(tq, d)

    starts = [min(i * tq, Tq - tq) for i in range(-(-Tq // tq))]          # 0, 4, 7: rows 7 and 8 twice
    assert starts == [0, 4, 7]
    before, shifted = tile(starts[1]), tile(starts[2])
    overlap = starts[1] + tq - starts[2]
    assert before[tq - overlap:].view(np.uint16).tobytes() == shifted[:overlap].view(np.uint16).tobytes()


# ---- reductions, masks, data movement -------------------------------------------------------------------------

def test_argmax_matches_emu(lib):
    x = bf16(rng(10).normal(size=(3, 100)))
    x[1, 7] = x[1, 77] = 50.0                                             # a tie: the first index wins
    ref = golden("argmax", "argmax", {"x": x}, out_dtype=np.int32, attrs={"axis": -1})
    k = lib("argmax")
    got = []
    for r in range(3):
        best, index, y = np.zeros(1, np.float32), np.zeros(1, np.int32), np.zeros(1, np.int32)
        call(k, "argmax_begin", best, index)
        for p in range(0, 100, 20):
            call(k, "argmax_chunk", np.ascontiguousarray(x[r, p:p + 20]), 0, 20, p, best, index)
        call(k, "argmax_store", index, y)
        got.append(int(y[0]))
    assert got == ref.astype(int).tolist()


def test_argmax_picks_match_emu(lib):
    """The greedy tail's argmax with picks (fuse._fold_argmax_picks): the index of x's best, x's value there and
    t's value there, as the emulator stores them; x and t arrive joined per piece (t from word t_word)."""
    x = rng(11).normal(size=(1, 60)).astype(np.float32)
    x[0, 13] = x[0, 41] = 9.0                                             # a tie: the first index wins
    t = rng(12).normal(size=(1, 60)).astype(np.float32)
    arena = Arena(x=x, t=t, i=np.zeros(1, np.int32), px=np.zeros((1, 1), np.float32),
                  pt=np.zeros((1, 1), np.float32))
    step = Step("kernel", "argmax", ("x", "t"), ("i", "px", "pt"), {
        "head": {"op": "argmax", "attrs": {"axis": -1}}, "chain": [], "views": [[], []], "tiling": {},
        "n_head": 1, "name": "argmax", "picks": [0, 1]})
    emu.EmuExecutable._kernel(arena, step)
    k = lib("argmax")
    best, index, picked = np.zeros(1, np.float32), np.zeros(1, np.int32), np.full(1, 7.0, np.float32)
    call(k, "argmax_begin", best, index)
    for p in range(0, 60, 15):  # pieces of 15 fp32 words: x then t
        call(k, "argmax_chunk_pick", np.concatenate([x[0, p:p + 15], t[0, p:p + 15]]), 1, 15, 1, 15, p,
             best, index, picked)
    y = np.zeros(3, np.int32)
    call(k, "argmax_store_picks", index, best, picked, y, 2, 0b10)
    assert int(y[0]) == int(arena.buffers["i"][0]) == 13
    np.testing.assert_array_equal(y[1:].view(np.float32), [arena.buffers["px"][0, 0], arena.buffers["pt"][0, 0]])
    assert arena.buffers["pt"][0, 0] == t[0, 13]


def test_mean_matches_emu(lib, record_parity):
    g = rng(11)
    x = bf16(g.normal(size=(2, 6, 3, 3)))                                 # ResNet's pool: mean over (2, 3)
    ref = golden("reduce", "mean", {"x": x}, attrs={"axis": (2, 3)})
    k = lib("reduce")
    chain, imm = np.zeros(8, np.int32), np.zeros(8, np.float32)
    rows = x.reshape(12, 9)
    acc, at, y = np.zeros(12, np.float32), np.zeros(1, np.int32), np.zeros(12, BF16)
    call(k, "reduce_zero", acc, 12, at)
    for r in range(12):
        call(k, "reduce_rows", np.ascontiguousarray(rows[r]), 0, acc, 1, 9, at)
    call(k, "reduce_mean_store", acc, y, 0, 12, 9, chain, 0, imm)
    check(record_parity, "mean over trailing axes", y.astype(np.float32).reshape(2, 6), ref)
    x2 = g.normal(size=(2, 5, 8)).astype(np.float32)                      # fp32 input, mean over axis 1
    ref2 = golden("reduce", "mean", {"x": x2}, attrs={"axis": 1, "keepdims": True})
    for b in range(2):
        acc2, at2, y2 = np.zeros(8, np.float32), np.zeros(1, np.int32), np.zeros(8, BF16)
        call(k, "reduce_zero", acc2, 8, at2)
        for t in range(5):
            call(k, "reduce_cols", np.ascontiguousarray(x2[b, t]), 1, acc2, 1, 8)
        call(k, "reduce_mean_store", acc2, y2, 0, 8, 5, chain, 0, imm)
        check(record_parity, f"mean over axis 1, batch {b}", y2.astype(np.float32), ref2[b, 0])


def test_mean_with_item_operands_matches_emu(lib, record_parity):
    """ESM's token-dropout rescale: a mean over the tokens whose chain divides by another mean and subtracts from
    and divides constants; the operands are fp32 scalars that ride in the item's last input object."""
    g = rng(13)
    x = g.uniform(size=(1, 16, 1)).astype(np.float32)                    # fp32: one value per token
    m, c, d = (np.array(v, np.float32).reshape(s) for v, s in ((0.37, (1, 1, 1)), (1.0, ()), (0.88, ())))
    chain = chain_of(("div", 1, False), ("sub", 2, True), ("div", 3, True))
    ref = golden("reduce", "mean", {"x": x, "m": m, "c": c, "d": d}, attrs={"axis": 1, "keepdims": True},
                 chain=chain, n_head=1)
    k = lib("reduce")
    words, imms = encode_chain(chain, 1)
    ops = [step_operands.Operand("x", 16, np.zeros((1, 1), np.int64), np.dtype(np.float32))] + \
        [step_operands.Operand(n, 1, np.zeros((1, 1), np.int64), np.dtype(np.float32), True) for n in "mcd"]
    opmap = row_streaming.operand_map([("row", i) for i in range(4)], ops, [], 1)
    acc, at, y = np.zeros(1, np.float32), np.zeros(1, np.int32), np.zeros(1, BF16)
    call(k, "reduce_zero", acc, 1, at)
    for t in range(16):  # each object: the token's value, then the three scalars (joined_layout)
        obj = np.array([x[0, t, 0], m.flat[0], c, d], np.float32)
        call(k, "reduce_cols", obj, 1, acc, 1, 1)
    call(k, "reduce_mean_store_operands", acc, y, 0, 1, 16, words, len(chain), imms, obj, opmap)
    check(record_parity, "mean + operand chain", y.astype(np.float32), ref.reshape(-1))


def test_masks_match_emu(lib):
    k = lib("maskgen")
    pos = np.array([5], np.int32)                                         # the io arena's int32 word
    ref = golden("maskgen", "causal_cache_mask", {"pos": pos.reshape(())}, attrs={"n_new": 3, "size": 12})
    got = np.zeros((3, 12), BF16)
    for r in range(3):
        row = np.zeros(12, BF16)
        call(k, "mask_causal", pos, row, 0, 1, 12, r)
        got[r] = row
    np.testing.assert_array_equal(got.astype(np.float32), ref)
    length = np.array([7], np.int32)
    ref = golden("maskgen", "length_mask", {"length": length.reshape(())}, out_dtype=np.float32, attrs={"size": 10})
    got = np.zeros(10, np.float32)
    call(k, "mask_length", length, got, 1, 10, 0)
    np.testing.assert_array_equal(got, ref)
    pieces = np.zeros((5, 2), np.float32)  # a long mask in pieces (kernels/maskgen/design.py), each at its column
    for j in range(5):
        call(k, "mask_length", length, pieces[j], 1, 2, 2 * j)
    np.testing.assert_array_equal(pieces.reshape(-1), ref)
    ref = golden("maskgen", "positions", {"pos": pos.reshape(())}, out_dtype=np.int32, attrs={"n": 4})
    got = np.zeros(4, np.int32)
    call(k, "mask_positions", pos, got, 4)
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("case", [dict(stride=2, padding=1, groups=1, kh=3), dict(stride=4, padding=0, groups=1, kh=4),
                                  dict(stride=1, padding=1, groups=2, kh=3)], ids=["resnet", "patch", "grouped"])
def test_conv2d_rows_match_emu(lib, record_parity, case):
    g = rng(12)
    cin, cout, H, W, kh = 4, 6, 8, 8, case["kh"]
    x = bf16(g.normal(size=(1, cin, H, W)))
    w = bf16(g.normal(size=(cout, cin // case["groups"], kh, kh)))
    b = g.normal(size=cout).astype(np.float32)
    attrs = {"stride": case["stride"], "padding": case["padding"], "groups": case["groups"]}
    ref = golden("conv", "conv2d", {"x": x, "w": w, "b": b}, attrs=attrs)
    k = lib("conv2d")
    s, p = case["stride"], case["padding"]
    ho, wo = (H + 2 * p - kh) // s + 1, (W + 2 * p - kh) // s + 1
    chain, imm = np.zeros(8, np.int32), np.zeros(8, np.float32)
    oy = np.zeros(2, np.int32)
    out = np.zeros((1, cout, ho, wo), np.float32)
    for r in range(ho):  # the band the design streams: kh rows from the first row clamped into the image
        rows = np.clip(r * s - p, 0, H - kh) + np.arange(kh)
        band = np.ascontiguousarray(x[0][:, rows, :])
        y = np.zeros(cout * wo, BF16)
        call(k, "conv2d_row", band, 0, np.ascontiguousarray(w), b, 1, 0, y, 0, cin, W, cout, case["groups"], kh, kh,
             s, p, p, wo, H, ho, oy, chain, 0, imm, band, 0, cin // case["groups"], kh, 1, wo, np.zeros(1, np.float32))
        out[0, :, r] = y.astype(np.float32).reshape(cout, wo)
    assert oy[0] == 0  # the counter wrapped after the last output row
    check(record_parity, f"conv2d {case}", out, ref)


@pytest.mark.parametrize("chunk", [(2, 3, 0), (1, 3, 0), (1, 2, 0), (1, 3, 1)],
                         ids=["channels", "channel", "rows", "fp32-in-place"])
def test_conv2d_chunked_accumulation_matches_emu(lib, record_parity, chunk):
    """A band streamed in chunks of channels (or of one channel's rows, unpadded), one call per chunk into the fp32
    accumulator (an fp32 output row is its own); the last call adds the bias and stores, as kernels/conv2d/design.py
    streams bands too big for L1."""
    g = rng(13)
    cin, cout, H, W, kh = 4, 6, 8, 8, 4 if chunk[1] == 2 else 3
    s, p = (2, 1) if chunk[1] == 3 else (4, 0)
    chunk_cin, chunk_rows, in_place = chunk
    x = bf16(g.normal(size=(1, cin, H, W)))
    w = bf16(g.normal(size=(cout, cin, kh, kh)))
    b = g.normal(size=cout).astype(np.float32)
    ref = golden("conv", "conv2d", {"x": x, "w": w, "b": b}, attrs={"stride": s, "padding": p, "groups": 1},
                 out_dtype=np.float32 if in_place else BF16)
    k = lib("conv2d")
    ho, wo = (H + 2 * p - kh) // s + 1, (W + 2 * p - kh) // s + 1
    n_chunks = (cin // chunk_cin) * (kh // chunk_rows)
    w_chunk = chunk_cin * chunk_rows * kh  # kh == chunk_rows for channel chunks
    w_chunks = w.reshape(cout, n_chunks, w_chunk).transpose(1, 0, 2)  # what the design streams per chunk
    chain, imm, oy = np.zeros(8, np.int32), np.zeros(8, np.float32), np.zeros(2, np.int32)
    acc, out = np.zeros(cout * wo, np.float32), np.zeros((1, cout, ho, wo), np.float32)
    for r in range(ho):
        rows = np.clip(r * s - p, 0, H - kh) + np.arange(kh)
        chunks = np.ascontiguousarray(x[0][:, rows, :]).reshape(n_chunks, -1)
        y = np.zeros(cout * wo, np.float32 if in_place else BF16)
        for q in range(n_chunks):
            call(k, "conv2d_row", np.ascontiguousarray(chunks[q]), 0, np.ascontiguousarray(w_chunks[q]), b, 1, 0, y,
                 in_place, cin, W, cout, 1, kh, kh, s, p, p, wo, H, ho, oy, chain, 0, imm, chunks[q], 0, chunk_cin,
                 chunk_rows, n_chunks, wo, y if in_place else acc)
            assert oy[1] == (q + 1) % n_chunks
        out[0, :, r] = y.astype(np.float32).reshape(cout, wo)
    assert oy[0] == 0
    check(record_parity, f"conv2d chunked {chunk}", out, ref)


@pytest.mark.parametrize("case", [
    dict(H=1, W=24, k=(1, 3), s=1, p=1, chunk_cin=2, wc=6, x_f32=True, y_f32=False, res=False),
    dict(H=1, W=24, k=(1, 3), s=1, p=1, chunk_cin=1, wc=8, x_f32=True, y_f32=True, res=False),
    dict(H=1, W=48, k=(1, 3), s=2, p=1, chunk_cin=2, wc=4, x_f32=False, y_f32=False, res=False),
    dict(H=12, W=16, k=(3, 3), s=2, p=1, chunk_cin=4, wc=2, x_f32=False, y_f32=True, res=True)],
    ids=["conv1d-fp32-channel-chunks", "conv1d-fp32-in-place", "conv1d-bf16-stride2", "stride2-residual"])
def test_conv2d_width_chunks_match_emu(lib, record_parity, case):
    """An output row in windows of wc columns (Whisper's first conv1d: 80 fp32 channels x 3000 frames fit no
    whole-row chunk): each window's band holds only its input columns and halo, from its first column clamped into
    the image, as kernels/conv2d/design.py streams it; the window runs its channel chunks into the fp32 accumulator
    (or the fp32 output window in place), and a residual row holds the window's columns."""
    g = rng(15)
    cin, cout, H, W, (kh, kw), s, p, wc = 4, 6, case["H"], case["W"], case["k"], case["s"], case["p"], case["wc"]
    one_d = H == 1
    x = g.normal(size=(1, cin, W) if one_d else (1, cin, H, W)).astype(np.float32)
    x = x if case["x_f32"] else bf16(x)
    w = bf16(g.normal(size=(cout, cin, kw) if one_d else (cout, cin, kh, kw)))
    b = g.normal(size=cout).astype(np.float32)
    ho, wo = (1 if one_d else (H + 2 * p - kh) // s + 1), (W + 2 * p - kw) // s + 1
    inputs, chain = {"x": x, "w": w, "b": b}, chain_of(("gelu",))
    if case["res"]:
        inputs["res"] = g.normal(size=(1, cout, ho, wo)).astype(np.float32)
        chain = chain_of(("add", 3, False), ("relu",))
    attrs = {"stride": s, "padding": p} if one_d else {"stride": s, "padding": p, "groups": 1}
    ref = golden("conv", "conv1d" if one_d else "conv2d", inputs, attrs=attrs, chain=chain, n_head=3,
                 out_dtype=np.float32 if case["y_f32"] else BF16).reshape(1, cout, ho, wo)
    k = lib("conv2d")
    words, imms = encode_chain(chain, 3)
    x4 = x.reshape(1, cin, H, W)
    chunk_cin, n_chunks, n_win = case["chunk_cin"], cin // case["chunk_cin"], wo // wc
    a = 1 if case["x_f32"] else 2  # bf16 bands start on whole words: an even column, one more column rounded up
    win = -(-((wc - 1) * s + kw + a - 1) // a) * a
    first = np.clip((np.arange(n_win) * wc * s - p) // a * a, 0, W - win)      # each window's first band column
    assert first[0] == 0 and first[-1] == W - win                              # both edge windows clamped
    w_chunks = w.reshape(cout, n_chunks, -1).transpose(1, 0, 2)                 # what the design streams per chunk
    oy, acc, out = np.zeros(2, np.int32), np.zeros(cout * wc, np.float32), np.zeros((1, cout, ho, wo), np.float32)
    in_place = case["y_f32"]
    for r in range(ho):
        rows = np.clip(r * s - p, 0, H - kh) + np.arange(kh) if not one_d else np.arange(1)
        for v in range(n_win):
            band = x4[0][:, rows][:, :, first[v]:first[v] + win]                # [cin][kh][win]
            chunks = np.ascontiguousarray(band).reshape(n_chunks, -1)
            y = np.zeros(cout * wc, np.float32 if case["y_f32"] else BF16)
            row = np.ascontiguousarray(inputs["res"][0, :, r, v * wc:(v + 1) * wc]) if case["res"] else chunks[0]
            for q in range(n_chunks):
                call(k, "conv2d_row", np.ascontiguousarray(chunks[q]), int(case["x_f32"]),
                     np.ascontiguousarray(w_chunks[q]), b, 1, 0, y, int(case["y_f32"]), cin, W, cout, 1, kh, kw, s, p,
                     0 if one_d else p, wo, H, ho, oy, words, len(chain), imms, row, int(case["res"]), chunk_cin,
                     kh, n_chunks, wc,
                     y if in_place else acc)
            assert oy[1] == (0 if v + 1 == n_win else (v + 1) * n_chunks)      # the chunks of the row's windows
            out[0, :, r, v * wc:(v + 1) * wc] = y.astype(np.float32).reshape(cout, wc)
    assert oy[0] == 0 and oy[1] == 0
    check(record_parity, f"conv2d width chunks {case}", out, ref)


def test_conv2d_whole_image_output_matches_emu(lib, record_parity):
    """Output rows of odd width in bf16 (CLIP's 7 x 7 patch grid) are not whole words: with bit 1 of y_f32 each call
    writes its row into the block's whole image [cout][ho][wo], which the design drains once per image."""
    g = rng(14)
    cin, cout, H, W, kh = 3, 4, 12, 12, 4
    x = bf16(g.normal(size=(1, cin, H, W)))
    w = bf16(g.normal(size=(cout, cin, kh, kh)))
    b = g.normal(size=cout).astype(np.float32)
    ref = golden("conv", "conv2d", {"x": x, "w": w, "b": b}, attrs={"stride": kh, "padding": 0, "groups": 1})
    k = lib("conv2d")
    ho = wo = H // kh
    chain, imm, oy = np.zeros(8, np.int32), np.zeros(8, np.float32), np.zeros(2, np.int32)
    y = np.zeros(cout * ho * wo, BF16)
    for r in range(ho):
        band = np.ascontiguousarray(x[0][:, r * kh:(r + 1) * kh, :])
        call(k, "conv2d_row", band, 0, np.ascontiguousarray(w), b, 1, 0, y, 2, cin, W, cout, 1, kh, kh, kh, 0, 0, wo, H,
             ho, oy, chain, 0, imm, band, 0, cin, kh, 1, wo, np.zeros(1, np.float32))
    check(record_parity, "conv2d whole-image output", y.astype(np.float32).reshape(1, cout, ho, wo), ref)


def test_conv2d_residual_epilogue_matches_emu(lib, record_parity):
    """conv + residual add + relu (a ResNet block's second conv): the residual row arrives after each band."""
    g = rng(22)
    cin, cout, H, W = 4, 4, 6, 6
    x, w = bf16(g.normal(size=(1, cin, H, W))), bf16(g.normal(size=(cout, cin, 3, 3)))
    b, res = g.normal(size=cout).astype(np.float32), g.normal(size=(1, cout, H, W)).astype(np.float32)
    chain = chain_of(("add", 3, False), ("relu",))
    attrs = {"stride": 1, "padding": 1, "groups": 1}
    ref = golden("conv", "conv2d", {"x": x, "w": w, "b": b, "res": res}, out_dtype=np.float32, attrs=attrs,
                 chain=chain, n_head=3)
    k = lib("conv2d")
    words, imms = encode_chain(chain, 3)
    oy, out = np.zeros(2, np.int32), np.zeros((1, cout, H, W), np.float32)
    for r in range(H):
        band = np.ascontiguousarray(x[0][:, np.clip(r - 1, 0, H - 3) + np.arange(3), :])
        row = np.ascontiguousarray(res[0, :, r, :])                        # [cout][wo], the residual row
        y = np.zeros(cout * W, np.float32)
        call(k, "conv2d_row", band, 0, np.ascontiguousarray(w), b, 1, 0, y, 1, cin, W, cout, 1, 3, 3, 1, 1, 1, W, H, H,
             oy, words, len(chain), imms, row, 1, cin, 3, 1, W, np.zeros(1, np.float32))
        out[0, :, r] = y.reshape(cout, W)
    check(record_parity, "conv2d + residual + relu", out, ref)


@pytest.mark.parametrize("mode", ["per_row", "per_channel"])
def test_conv2d_factor_epilogue_matches_emu(lib, record_parity, mode):
    """A grouped (depthwise) conv times a factor with one value per output row (the conformer's time mask,
    r_f32 bit 2) or per output channel (bit 1), then relu: the factor rides after each band as one value or one
    value per channel."""
    g = rng(23)
    cin = cout = 4
    H, W = 6, 6
    x, w = bf16(g.normal(size=(1, cin, H, W))), bf16(g.normal(size=(cout, 1, 3, 3)))
    b = g.normal(size=cout).astype(np.float32)
    shape = (1, 1, H, 1) if mode == "per_row" else (1, cout, 1, 1)
    factor = g.normal(size=shape).astype(np.float32)
    chain = chain_of(("mul", 3, False), ("relu",))
    attrs = {"stride": 1, "padding": 1, "groups": cout}
    ref = golden("conv", "conv2d", {"x": x, "w": w, "b": b, "s": factor}, attrs=attrs, chain=chain, n_head=3)
    k = lib("conv2d")
    words, imms = encode_chain(chain, 3)
    oy, out = np.zeros(2, np.int32), np.zeros((1, cout, H, W), np.float32)
    for r in range(H):
        band = np.ascontiguousarray(x[0][:, np.clip(r - 1, 0, H - 3) + np.arange(3), :])
        obj = np.ascontiguousarray(factor[0, 0, r, :1] if mode == "per_row" else factor[0, :, 0, 0])
        y = np.zeros(cout * W, BF16)
        call(k, "conv2d_row", band, 0, np.ascontiguousarray(w), b, 1, 0, y, 0, cin, W, cout, cout, 3, 3, 1, 1, 1, W, H, H,
             oy, words, len(chain), imms, obj, 1 | (4 if mode == "per_row" else 2), 1, 3, 1, W,
             np.zeros(1, np.float32))
        out[0, :, r] = y.astype(np.float32).reshape(cout, W)
    check(record_parity, f"conv2d depthwise x {mode} factor + relu", out, ref)


def test_dwconv1d_matches_emu(lib, record_parity):
    g = rng(13)
    C, L, K = 8, 20, 5
    x = g.normal(size=(1, C, L)).astype(np.float32)                       # fp32: the residual stream
    w, b = bf16(g.normal(size=(C, 1, K))), g.normal(size=C).astype(np.float32)
    ref = golden("conv", "conv1d", {"x": x, "w": w, "b": b}, attrs={"stride": 1, "padding": 2, "groups": C})
    k = lib("dwconv1d")
    chain, imm = np.zeros(8, np.int32), np.zeros(8, np.float32)
    y = np.zeros(C * L, BF16)
    call(k, "dwconv1d", np.ascontiguousarray(x[0]), 1, np.ascontiguousarray(w[:, 0]), b, 1, y, 0, C, L, L, K, 1, 2,
         chain, 0, imm)
    check(record_parity, "depthwise conv1d", y.astype(np.float32).reshape(1, C, L), ref)


def test_maxpool_matches_emu(lib):
    x = bf16(rng(14).normal(size=(1, 3, 7, 7)))
    ref = golden("pool", "max_pool2d", {"x": x}, attrs={"kernel": 3, "stride": 2, "padding": 1})
    k = lib("pool")
    oy = np.zeros(2, np.int32)
    out = np.zeros(ref.shape, np.float32)
    for r in range(ref.shape[2]):
        rows = np.clip(r * 2 - 1, 0, 7 - 3) + np.arange(3)
        y = np.zeros(3 * ref.shape[3], BF16)
        call(k, "maxpool_row", np.ascontiguousarray(x[0][:, rows, :]), 0, y, 0, 3, 7, 3, 2, 1, ref.shape[3], 7,
             ref.shape[2], oy)
        out[0, :, r] = y.astype(np.float32).reshape(3, -1)
    np.testing.assert_array_equal(out, ref)


def test_transpose_matches_emu_views(lib):
    x = bf16(rng(15).normal(size=(3, 8, 16)))
    ref = Arena(x=x)._load("x", [("transpose", (0, 2, 1))])              # what the emulator reads through the view
    y = np.zeros((3, 16, 8), BF16)
    call(lib("transpose"), "transpose_bf16", x, y, 3, 8, 16)
    np.testing.assert_array_equal(y.astype(np.float32), ref)
    x32 = rng(16).normal(size=(3, 8, 15)).astype(np.float32)           # fp32 rows of odd width, into bf16
    y = np.zeros((3, 15, 8), BF16)
    call(lib("transpose"), "transpose_f32_bf16", x32, y, 3, 8, 15)
    np.testing.assert_array_equal(y.view(np.uint16), x32.transpose(0, 2, 1).astype(BF16).view(np.uint16))
    y32 = np.zeros((3, 15, 8), np.float32)                              # fp32 into fp32: an entry input's
    call(lib("transpose"), "transpose_f32", x32, y32, 3, 8, 15)          # transpose into an fp32 output, exact
    np.testing.assert_array_equal(y32, x32.transpose(0, 2, 1))
