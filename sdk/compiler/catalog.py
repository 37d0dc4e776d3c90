"""The kernel catalog: each NPU kernel kind, which ops it runs, the tiling it uses on each target, and the
resources that tiling takes, checked against the hardware limits of hardware.py.

kernels/<kind>/ implements these kinds (an AIE C++ kernel + an IRON design per kind, parametrised by the
tiling recorded here in each kernel step of a program). Kinds:

  gemm        activation x stored weight, bf16 in, fp32 accumulate, fused epilogue (bias, activation,
              residual, scale) on the accumulator; M x N output tiles spread over the cores
  bmm         activation x activation (batched), same tiles
  conv        conv1d / conv2d as implicit GEMM (im2col through the memtile), depthwise as its own loop
  mha         attention: q k^T * scale + mask, online softmax, x v; query tiles over cores, key blocks streamed
  eltwise     elementwise chains (add, mul, GELU, SiLU, GLU, ...) streamed in row chunks
  softmax     softmax / log_softmax over the last axis, two passes over chunks when a row exceeds L1
  norm        layer_norm / rms_norm over the last axis (fp32 statistics)
  reduce      mean over axes; argmax  on-device greedy pick (row max + index)
  rope        rotary embedding; pool  max_pool2d; gather  embedding rows by index (shim DMA)
  maskgen     causal / length masks and positions from runtime parameters
  state_write cache_write / assign into the state arena at a runtime offset (DMA only)
  concat, pad, copy  data movement by DMA access patterns (no core code)
  transpose   a bf16 [b, r, c] -> [b, c, r] through the cores, for an operand whose access pattern would need an
              element-granular innermost stride (layout.route_transposes inserts it)
Ops without a kind here, integer division and integer math beyond add/sub/mul, dilated or grouped
(non-depthwise) convolutions run on the host.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ProgramError
from ..program import apply_views
from .hardware import KB, Target

# Core program size of each kind's kernel (bytes of the 16 KB program memory; DMA-only kinds run no core code)
# and the code each fused epilogue op adds. Estimates from the sizes of comparable mlir-aie aie_kernels objects.
PROGRAM_BYTES = {"gemm": 6 * KB, "bmm": 6 * KB, "conv": 7 * KB, "mha": 10 * KB, "eltwise": 2 * KB,
                 "softmax": 3 * KB, "norm": 3 * KB, "reduce": 2 * KB, "argmax": 2 * KB, "rope": 3 * KB,
                 "pool": 3 * KB, "transpose": 2 * KB, "gather": 0, "maskgen": 1 * KB, "state_write": 0, "concat": 0, "pad": 0, "copy": 0}
EPILOGUE_OP_BYTES = 512
PROLOGUE_BYTES = 1536  # a norm run on the A rows inside the GEMM
INTEGER_ELTWISE = {"add", "sub", "mul"}  # int32 vector ALU ops (index arithmetic); no integer divide on the core
DMA_ONLY = {"gather", "state_write", "concat", "pad", "copy"}
MATMUL_KINDS = {"gemm", "bmm", "conv"}


def program_bytes(kind: str, n_epilogue: int) -> int:
    return PROGRAM_BYTES.get(kind, 0) + n_epilogue * EPILOGUE_OP_BYTES


def input_streams(kind: str, head_inputs: int, epilogue_operands: int) -> int:
    """Streams a core reads: GEMMs read A and B (bias rides with B), attention q, k, v and mask."""
    base = {"gemm": 2, "bmm": 2, "conv": 2, "mha": 4}.get(kind, head_inputs)
    return base + epilogue_operands


def supports(kernel, dtype_of, shape_of) -> str:
    """"" when the NPU runs this kernel, else the reason it stays on the host."""
    node = kernel.head
    if kernel.kind == "host":
        return f"no NPU kernel for {node.op}"
    n_head = 3 if kernel.kind == "gemm" else len(node.inputs)  # runtime parameters may follow
    float_in = [dtype_of(r) == "float32" for r in kernel.inputs[:n_head] if r is not None]
    if kernel.kind == "eltwise" and not all(float_in) and node.op not in INTEGER_ELTWISE:
        return f"{node.op} on integers runs on the host"
    if kernel.kind in ("gemm", "bmm", "softmax", "norm", "reduce", "rope", "argmax", "pool", "mha") \
            and not all(float_in):
        return f"{node.op} on integers runs on the host"
    if kernel.kind == "conv":
        dilation = node.attrs.get("dilation", 1)
        if any(d != 1 for d in ((dilation,) if isinstance(dilation, int) else dilation)):
            return "dilated convolution has no NPU kernel"
        groups = node.attrs.get("groups", 1)
        if groups != 1 and groups != shape_of(kernel.inputs[0])[1]:
            return "grouped (not depthwise) convolution has no NPU kernel"
    return ""


# ---- tilings ---------------------------------------------------------------------------------------

def _up(x: int, m: int) -> int:
    return -(-x // m) * m


# Matmul precision: "bf16" (bf16 operands, fp32 accumulation) everywhere by default. AIE2P's 4x faster bfp16
# path (blocks of 8 sharing an exponent) measured rel-L2 1.8e-2 on the BERT fixture in the emulator, over
# the 1e-2 parity budget, so it is not the default; "bfp16" is honoured by the emulator and the cost model.
MATMUL_PRECISION = {"npu1": "bf16", "npu2": "bf16"}

# Split weights: a GEMM of at most this many A rows (a decoder step: one token per dispatch) stores its weight
# as two bf16 planes, hi = bf16(w) and lo = bf16(w - hi) (16 significant bits: an fp16 checkpoint exactly),
# and its kernel runs the MACs twice into the same fp32 accumulator, A.hi + A.lo. Such a GEMM is bound by
# the weight bytes it streams, not by MACs, so the second pass costs DRAM bytes (2x), not time on the MACs;
# in exchange the 2^-9 rounding of every weight stops accumulating through an autoregressive decoder: real
# Whisper tiny.en logits, rel-L2 in the emulator over 16 draws of one mel moved by +-1 ulp, median 0.013 with
# one plane and 0.0097 split (split is lower in 13 of the 16; tests/test_emu.py gives the ranges). Both AIE-ML and
# AIE2P do this with their bf16 MACs and fp32 accumulators; no fp32 vector unit is involved.
# Not a vocabulary head (N far wider than K): its rounding feeds no further layer (measured 2e-3 of the logits'
# rel-L2 for Whisper tiny.en), and it is a decoder's largest weight, whose doubled bytes would cost the most.
# kernels/gemm and kernels/gemv stream each weight tile's hi and lo planes as one object of twice the size and
# run both MAC passes (kernels/README.md); the emulator and the cost model honour it too.
SPLIT_WEIGHTS = {"npu1": True, "npu2": True}
SPLIT_WEIGHTS_MAX_ROWS, SPLIT_WEIGHTS_MAX_WIDTH = 16, 8

GEMM_TILES = [(64, 64, 32), (32, 64, 32), (32, 32, 32), (16, 32, 16), (8, 32, 8), (8, 16, 8)]


def storage_bytes(f, wide: set) -> callable:
    """Bytes per element of each operand as the memory plan will store it (memory.py): the entry's inputs,
    parameters and outputs keep the host's dtype, the residual stream and whole-word values (`wide`) stay fp32,
    every other float is bf16. The tiling counts A and C tiles by it (a pre-LN prologue's A is the fp32 residual)."""
    outputs = set(f.outputs.values())

    def bytes_of(ref) -> int:
        v = f.values[ref.value]
        if v.dtype != "float32":
            return 4
        if v.kind in ("input", "param") or ref.value in outputs or ref.value in wide:
            return 4
        return 2
    return bytes_of


def tiling(kernel, shape_of, target: Target, bytes_of=None) -> dict:
    """The tiling a kernel uses on `target` (the largest that fits), with what the limit checks need.
    `bytes_of(ref)`: an operand's stored element size (storage_bytes), bf16 when not given."""
    kind = kernel.kind
    ins = [shape_of(r) if r is not None else None for r in kernel.inputs]
    extra = sum(1 for e in kernel.chain if e["operand"] is not None)
    size = bytes_of or (lambda ref: 2)
    if kind in MATMUL_KINDS:
        M, K, N = _mkn(kernel, ins, shape_of)
        batch = _batch(kernel, ins, shape_of)
        mm, mk, mn = target.mac_shape
        from .fuse import Ref  # noqa: PLC0415 - outputs are value names, operands Refs
        run = _contiguous_run(kernel.inputs[0], shape_of, K)
        for m, k, n in GEMM_TILES:
            # fewer rows than the tile: the MAC rows times whole MAC blocks of M (the last tile shifts back to
            # end at M), at least the MAC rows (M < mm repeats its rows through the tile), as kernels/gemm does
            t = {"M": M, "K": K, "N": N, "m": m if M >= m else max(M // mm * mm, mm), "k": _depth(K, k, mk, run),
                 "n": min(n, _up(N, mn)),
                 "epilogue_operands": extra, "precision": MATMUL_PRECISION[target.name],
                 "a_bytes": size(kernel.inputs[0]), "out_bytes": max(size(Ref(o)) for o in kernel.outputs),
                 "bias": kind == "gemm" and len(kernel.inputs) > 2 and kernel.inputs[2] is not None}
            t |= {"Kp": _up(K, t["k"]), "Np": _up(N, t["n"])}
            if batch > 1:  # a bmm with one B per batch slice: its row tiles stay within a slice (kernels/gemm), so
                # a tile is at most the slice's rows rounded down to the MAC rows (the last one shifts back to end
                # at the slice's end), or the MAC rows when the slice is shorter (its rows repeat through the tile)
                t |= {"batch": batch, "m": min(t["m"], max(M // batch // mm * mm, mm))}
            if N % 2 and t["Np"] != N:
                t["out_bytes"] = 4  # an odd width padded to whole tiles is stored fp32 (memory.pad_to_tiles)
            if K % 2:
                t["a_bytes"] = 4  # rows of odd width are fp32 to be whole words (such a padded output, above)
            if (kind == "gemm" and SPLIT_WEIGHTS[target.name] and M <= SPLIT_WEIGHTS_MAX_ROWS
                    and N <= SPLIT_WEIGHTS_MAX_WIDTH * K):
                t["weight_planes"] = 2
            if "prologue" in kernel.attrs:
                t["prologue_k"] = K  # the norm needs whole A rows: their statistics, gamma and beta
            t["cores"] = min(target.cores, math.ceil(M / t["m"]) * (t["Np"] // t["n"]))
            t["vector"] = _vector(t, target)
            if fits(kind, t, target):
                return t
        return t  # nothing fits: the check names the limit
    if kind == "mha":
        q, k = ins[0], ins[1]
        Tq, Tk, d = q[-2], k[-2], q[-1]
        heads = math.prod(q[:-2])
        for tq, tk in ((32, 64), (32, 32), (16, 32), (8, 16), (4, 8)):
            t = {"Tq": Tq, "Tk": Tk, "d": d, "heads": heads, "tq": min(tq, _up(Tq, 4)), "tk": min(tk, _up(Tk, 8)),
                 "epilogue_operands": extra}
            t["cores"] = min(target.cores, heads * math.ceil(Tq / t["tq"]))
            if fits(kind, t, target):
                return t
        return t
    # streaming kinds: rows of the last axis, processed in chunks
    first = next((s for s in ins if s is not None), (1,))
    out_shape = shape_of(kernel.outputs[0])
    # the output's row (a first operand may be a scalar); an argmax streams its input's rows into one index
    row = max((first if kind == "argmax" else out_shape or first or (1,))[-1], 1)
    elems = max(math.prod(out_shape), math.prod(first), 1)
    streams_in = max(1, len([s for s in ins[:len(ins) - extra] if s is not None]))
    for chunk in (4096, 2048, 1024, 512, 256, 128, 64):
        t = {"row": row, "elements": elems, "chunk": min(chunk, _up(row, 16)), "in_streams": streams_in,
             "epilogue_operands": extra}
        t["cores"] = min(target.cores, max(1, math.ceil(elems / t["chunk"])))
        if fits(kind, t, target):
            return t
    return t


# The fp32 vectors a GEMM core holds in L1 (bias; with a norm prologue also gamma and beta) cover its column
# tiles: jt x n floats, at least K with a prologue. The catalog budgets `vector` floats for each; the GEMM design
# takes only grids within it (kernels/gemm: `Nt / cols x n <= vector`). The budget is what the widest grid that
# always exists needs (one core row, as many columns as divide Nt), at least VECTOR_FLOOR, so that small GEMMs
# keep their grids; a GEMV runs ceil(Nt / cores) tiles per core (kernels/gemv).
VECTOR_FLOOR = 256
CHAIN_BYTES = 2 * 8 * 4  # the epilogue's opcode words and immediates (kernels/epilogue.MAX_CHAIN each)
CONV_L1 = 60 * KB        # what kernels/conv2d's bands, weights, rows, accumulator and biases may take
STATE_BYTES = 256        # a streaming kernel's operand map and running statistics


def _vector(t: dict, target: Target) -> int:
    Nt = t["Np"] // t["n"]
    if t["M"] == 1:  # kernels/gemv: the bias only when there is one
        jt = -(-Nt // min(t["cores"], target.columns * target.shim_channels - 1))
        return max(jt * t["n"] if t["bias"] else 1, t.get("prologue_k", 1))
    cols = max(c for c in range(1, min(target.columns, Nt) + 1) if Nt % c == 0)
    return max(Nt // cols * t["n"], t.get("prologue_k", 1), VECTOR_FLOOR)


def _depth(K: int, k: int, mk: int, run: int = 0) -> int:
    """A tile's K depth: at most k, and a divisor of K when K is a multiple of the MAC depth, so that A's rows
    need no padding (only a GEMM output has padding to read on into: memory.pad_to_tiles); else K rounded up to
    the MAC depth. When A's rows are runs of `run` contiguous elements (read through a transpose: Parakeet's
    subsampling output, 256 channels x 10 frequencies per frame), a multiple of the run where one divides K, so
    that each K step is an affine access pattern."""
    if K % mk:
        return min(k, _up(K, mk))
    depths = [d for d in range(mk, min(k, K) + 1, mk) if K % d == 0]
    whole = [d for d in depths if run and d % run == 0]
    return max(whole or depths)


def _contiguous_run(ref, shape_of, K: int) -> int:
    """How many consecutive elements of A's rows are contiguous in its buffer (0: the whole row, or no views)."""
    views = getattr(ref, "views", ())
    if not views:
        return 0
    from .fuse import Ref  # noqa: PLC0415
    base = shape_of(Ref(ref.value))
    rows = apply_views(np.arange(math.prod(base)).reshape(base), views)
    if rows.shape[-1] != K:  # a convolution's K is its window, not A's row
        return 0
    row = rows.reshape(-1, K)[0]
    breaks = np.flatnonzero(np.diff(row) != 1)
    return int(breaks[0]) + 1 if breaks.size else 0


def _mkn(kernel, ins, shape_of):
    node = kernel.head
    if kernel.kind == "gemm":
        a = ins[0]
        K = a[-1]
        N = sum(shape_of(w)[0 if kernel.attrs["transpose_b"] else 1] for w in kernel.attrs["weights"])
        return math.prod(a[:-1]), K, N
    if kernel.kind == "bmm":
        a, b = ins[0], ins[1]
        N = b[-2] if kernel.attrs["transpose_b"] else b[-1]
        return math.prod(shape_of(kernel.outputs[0])[:-1]), a[-1], N
    w = ins[1]  # conv: implicit GEMM per group
    out = shape_of(kernel.outputs[0])
    groups = node.attrs.get("groups", 1)
    return math.prod(out) // w[0], math.prod(w[1:]), w[0] // groups


def _batch(kernel, ins, shape_of) -> int:
    """How many B operands a bmm has: one per batch slice of its output when B itself is batched (attention-like
    scores against per-head keys, the conformer's rel-pos scores), else 1 (one B shared by all of A's rows)."""
    if kernel.kind != "bmm" or math.prod(ins[1][:-2]) == 1:
        return 1
    return math.prod(shape_of(kernel.outputs[0])[:-2])


# ---- resources of a tiling, and the limit checks ----------------------------------------------------

@dataclass(frozen=True)
class Footprint:
    l1: int
    memtile: int
    in_streams: int
    out_streams: int
    core_bds: int
    memtile_bds: int
    shim_bds: int


def footprint(kind: str, t: dict, target: Target) -> Footprint:
    e = t.get("epilogue_operands", 0)
    if kind in ("gemm", "bmm"):
        # what kernels/gemm (and kernels/gemv for one row) allocate per core: double-buffered A, B (both planes
        # of split weights) and C objects, the fp32 accumulator, the fp32 vectors (bias; gamma and beta with a
        # prologue) of `vector` floats, the epilogue words; a prologue adds the row statistics, the K step
        # position and the normalised bf16 A tile. A residual rides on the A stream in A-sized objects.
        m, k, n = t["m"], t["k"], t["n"]
        ab, ob, planes = t.get("a_bytes", 2), t.get("out_bytes", 2), t.get("weight_planes", 1)
        pro = "prologue_k" in t
        vector = t.get("vector", max(n, t.get("prologue_k", 1)))
        if t.get("M") == 1:  # kernels/gemv: one row, k elements per object
            m = 1
        l1 = (2 * m * k * ab + 2 * planes * k * n * 2 + 2 * m * n * ob + m * n * 4
              + (3 if pro else 1) * vector * 4 + CHAIN_BYTES
              + ((2 * m * 4 + 4 + m * k * 2) if pro else 0))
        if t.get("M") == 1:  # the row broadcast from one memtile; W goes shim -> core
            memtile = 2 * k * ab
        else:  # per memtile at most every core row's A and C objects, and its column's B
            memtile = 2 * target.rows * m * (k * ab + n * ob) + 2 * planes * k * n * 2
        ins = input_streams(kind, 2, e) + (1 if pro else 0)
    elif kind == "conv":
        # kernels/conv2d sizes its output-channel block and band chunk within CONV_L1 (double-buffered band chunk,
        # weight block and output row, the fp32 accumulator across chunks, the core's biases); besides these it
        # holds the epilogue words and its row / chunk counters. It reads shim -> core: no memtile.
        l1 = CONV_L1 + CHAIN_BYTES + 8
        memtile = 0
        ins = input_streams(kind, 2, e)
    elif kind == "mha":
        tq, tk, d = t["tq"], t["tk"], t["d"]
        l1 = (2 * tq * d * 2 + 2 * 2 * tk * d * 2   # q tile, k and v blocks (double-buffered)
              + tq * tk * 4 + tq * tk * 2           # fp32 scores, bf16 probabilities
              + tq * d * 4 + 2 * tq * d * 2         # fp32 output accumulator, output tiles
              + 2 * tq * tk * 2 + 2 * tq * 4        # mask block, running max and sum
              + e * 2 * tq * d * 2)
        memtile = 2 * 2 * tk * d * 2 * target.rows
        ins = input_streams(kind, 4, e)
    else:
        c = t["chunk"]
        ins = input_streams(kind, t["in_streams"], e)
        # double-buffered chunks per stream (fp32 where the operand is: the residual stream, whole-word rows),
        # an fp32 working row, the epilogue words and the small state (operand map, statistics)
        l1 = (ins + 1) * 2 * c * 4 + c * 4 + CHAIN_BYTES + STATE_BYTES
        memtile = (ins + 1) * 2 * c * 4 * target.rows
        if kind in DMA_ONLY:
            l1 = 0  # no core involved: shim -> memtile -> shim
    l1 += target.stack_bytes if l1 else 0
    outs = 1
    return Footprint(l1, memtile, ins, outs, core_bds=2 * (ins + outs) if l1 else 0,
                     memtile_bds=4 * (ins + outs), shim_bds=ins + outs)


def fits(kind: str, t: dict, target: Target) -> bool:
    return not problems(kind, t, target, n_epilogue=0)


def problems(kind: str, t: dict, target: Target, *, n_epilogue: int, dims: int = 1) -> list[str]:
    f = footprint(kind, t, target)
    found = []
    if f.l1 > target.l1_bytes:
        found.append(f"needs {f.l1} bytes of core data memory (L1); the limit is {target.l1_bytes // KB} KB per "
                     f"core including the {target.stack_bytes} byte stack")
    if f.memtile > target.memtile_bytes:
        found.append(f"needs {f.memtile} bytes of memtile; the limit is {target.memtile_bytes // KB} KB per column")
    for what, used, limit in (("core", f.core_bds, target.core_bds), ("memtile", f.memtile_bds, target.memtile_bds),
                              ("shim", f.shim_bds, target.shim_bds)):
        if used > limit:
            found.append(f"needs {used} {what} buffer descriptors; the limit is {limit}")
    if f.l1 and f.in_streams > 2 * target.core_channels:
        found.append(f"reads {f.in_streams} streams; a core has {target.core_channels} input DMA channels "
                     f"(at most two streams share one by BD chaining)")
    if dims > target.memtile_dims:
        found.append(f"an operand's access pattern needs {dims} dimensions; a memtile buffer descriptor has "
                     f"{target.memtile_dims}")
    code = program_bytes(kind, n_epilogue) + (PROLOGUE_BYTES if "prologue_k" in t else 0)
    if code > target.program_bytes:
        found.append(f"needs {code} bytes of program memory; the limit is {target.program_bytes // KB} KB")
    return found


def check(step, target: Target) -> None:
    """Raise ProgramError when a kernel step of a program breaks a limit of `target`."""
    t = step.attrs["tiling"]
    found = problems(step.op, t, target, n_epilogue=len(step.attrs.get("chain", ())),
                     dims=max(step.attrs.get("dims", [1]) or [1]))
    if found:
        raise ProgramError(f"kernel {step.op} ({step.attrs.get('name', '')}) on {target.name} "
                           f"with tiling {_short(t)}: " + "; ".join(found),
                           fix="recompile the program with this SDK's compiler, which picks tilings that fit")


def _short(t: dict) -> str:
    keys = ("m", "k", "n", "tq", "tk", "d", "chunk")
    return "{" + ", ".join(f"{k}={t[k]}" for k in keys if k in t) + "}"
