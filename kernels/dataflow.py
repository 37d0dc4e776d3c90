"""How the designs in kernels/ place kernels on tiles and move data, written against the IRON API of the pinned
mlir-aie v1.4.5 (`TOOLCHAIN_PIN` in sdk/compiler/npu.py; kernels/README.md lists the signatures used).

Every design builds the program of ONE kernel step of a compiled sdk Program (its kind, tiling, epilogue chain
and operand access patterns, as sdk/compiler emits them). Its runtime sequence takes one 1-D tensor per operand
buffer (inputs in kernel order, then the output; bf16, or int32 for integer buffers). The fused design
(kernels/fused/design.py) runs these sequences over typed views of the four arenas at each buffer's offset,
so the access patterns here are relative to each buffer's start.

Shared here, used by every design:
- `iron()`: the IRON names, imported lazily (importing kernels/ never needs mlir-aie);
- `RuntimeEnds` and `program()`: the runtime side of a design, v1.4 style: each fifo's runtime end bound once to
  its shim tile and given to `Runtime(seq_fn, fn_args)`, whose body fills and drains through those handles;
- the epilogue chain encoding the kernels' `npu_epilogue` reads (kernels/include/npu_kernel.h);
- operand access patterns: the element index of each operand (its view chain applied to an arange), read as
  an address sequence into (size, stride) dimensions and split into buffer-descriptor-sized
  TensorAccessPatterns (dims_of, taps);
- `streaming()`: the skeleton of the row-streaming kernels (eltwise, softmax, norm, rope, argmax, reduce):
  rows split over cores within the DMA channel budget, each core's per-row operands joined into one object in
  its column's memtile, the shared ones joined once and broadcast, outputs joined per column;
- `per_core_design()`: the skeleton of the convolution-like kernels (conv2d, pool, dwconv1d, transpose): one
  core per column reading from its own shim, transfers in task groups so buffer descriptors are reused.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace

import ml_dtypes
import numpy as np

from sdk.compiler import layout
from sdk.compiler.hardware import TARGETS, Target
from sdk.errors import SdkError

BF16 = np.dtype(ml_dtypes.bfloat16)
STACK_BYTES = 0x400  # per core; the catalog reserves the same (hardware.Target.stack_bytes)


class DesignError(SdkError):
    """A kernel step that a design cannot express on the array (names the kernel and the reason)."""


def iron() -> SimpleNamespace:
    """The IRON API of the pinned mlir-aie. Imported on use, so that the rest of kernels/ (and the tests, with
    tests/iron_standin.py installed) work without the toolchain."""
    try:
        from aie.helpers.taplib import TensorAccessPattern
        from aie.iron import Buffer, Kernel, ObjectFifo, Program, Runtime, ScratchpadParameter, TaskGroup, Worker
        from aie.iron.controlflow import range_
        from aie.iron.device import NPU1, NPU2, Tile
        from aie.iron.runtime import sync_parameters
    except ImportError as e:
        raise DesignError(f"the IRON python API (mlir-aie) is not importable: {e}",
                          fix="install the pinned mlir_aie wheel (see kernels/README.md)") from None
    return SimpleNamespace(TensorAccessPattern=TensorAccessPattern, Buffer=Buffer, Kernel=Kernel,
                           ObjectFifo=ObjectFifo, Program=Program, Runtime=Runtime, TaskGroup=TaskGroup,
                           Worker=Worker, range_=range_, NPU1=NPU1, NPU2=NPU2, Tile=Tile,
                           ScratchpadParameter=ScratchpadParameter, sync_parameters=sync_parameters)


class RuntimeEnds:
    """The runtime ends of a design's fifos. A transfer takes its shim tile from its handle (`.prod(tile=)` /
    `.cons(tile=)`, one per fifo), and every handle the sequence body moves data through is given to the Runtime
    with the tensors, so that the Program resolves each fifo with both its ends known before the body runs
    (mlir-aie PR #3387, v1.4.0). Bind every transfer's fifo before `program()`; the body looks the handles up."""

    def __init__(self, io: SimpleNamespace):
        self.io, self.ends = io, {}

    def fill(self, fifo, col: int):
        return self._end(fifo, col, True)

    def drain(self, fifo, col: int):
        return self._end(fifo, col, False)

    def _end(self, fifo, col: int, is_prod: bool):
        key = (id(fifo), is_prod)
        if key not in self.ends:
            tile = self.io.Tile(col, 0)
            self.ends[key] = (col, fifo.prod(tile=tile) if is_prod else fifo.cons(tile=tile))
        bound, handle = self.ends[key]
        if bound != col:
            raise DesignError(f"fifo {fifo.name}: its runtime end is on shim {bound}, a transfer wants shim {col}",
                              fix="move each fifo's transfers through one shim tile")
        return handle

    @property
    def handles(self) -> list:
        return [h for _, h in self.ends.values()]


def fits_shim_bds(shim_cols: list[int], target: Target) -> bool:
    """Whether transfers live at once on these shim columns (one buffer descriptor each, until their task group
    ends) fit each shim's descriptors (aiecc refuses a 17th: AIE2TargetModel::getNumBDs)."""
    per_shim: dict[int, int] = {}
    for c in shim_cols:
        per_shim[c] = per_shim.get(c, 0) + 1
    return max(per_shim.values(), default=0) <= target.shim_bds


def program(io: SimpleNamespace, target_name: str, operands: list, ends: RuntimeEnds, workers: list, body):
    """The IRON program of a design: a runtime sequence over one 1-D tensor per operand (the order the fused
    design passes them), whose body `body(*tensors)` issues the transfers through `ends`."""
    def sequence(*args):
        body(*args[:len(operands)])
    rt = io.Runtime(sequence, [*(tensor(o.elements, o.dtype) for o in operands), ends.handles])
    return io.Program(device(io, target_name), rt, workers=workers).resolve_program()


# ---- runtime parameters in buffer descriptors -----------------------------------------------------------------
# A DMA whose address depends on a per-run value (the KV-cache row at the position, an embedding row by token id)
# takes a scratchpad parameter (IRON's `ScratchpadParameter`, `aiex.scratchpad_parameter`): a 32-bit word the
# host writes before each run, added to the BD's static base address (`offset_parameter=` of a fill / drain,
# UPDATE_REG) in elements of the transfer's tensor (xdna-engine's hardware probe of mlir-aie's
# scratchpad_addr_offset test: word 8 on an i32 tensor starts at element 8). The static pattern is the one at
# value 0. The host computes each word from an int32 io-arena buffer it writes anyway: word = value[element] *
# scale. The fused design gathers these specs into the manifest (`scratchpad`) for the runtime.

def scratchpad_parameter(io: SimpleNamespace, params: dict, buffer: str, element: int, scale: int, limit: int):
    """The scratchpad word `buffer[element] * scale` (elements of the transfer's tensor); `limit` is the largest
    value the buffer may hold (the address then stays inside the tensor). Recorded in params["scratchpad"]."""
    name = "sp_" + "".join(c if c.isalnum() else "_" for c in buffer) + f"_{element}_x{scale}"
    params.setdefault("scratchpad", {})[name] = {"buffer": buffer, "element": int(element), "scale": int(scale),
                                                 "limit": int(limit)}
    return io.ScratchpadParameter(name, np.int32)


def runtime_row(cache: "Operand", n: int, views, axis: int) -> tuple[np.ndarray, int, int]:
    """Where each of the n elements of a value written into `cache` at a runtime position along `axis` lands,
    at position 0 (the drain's base), in the value's own order; plus the element stride of a position and the
    largest position that keeps the write inside the cache. `views` (the state write's, from the value to the
    cache's layout) start with a reshape, or there are none and the value has the cache slab's shape."""
    if views and views[0][0] != "reshape":
        raise DesignError("a KV-cache write whose view does not start with a reshape: not expressed")
    shape = list(cache.index.shape)
    shape[axis] = n // (math.prod(shape) // shape[axis])
    placed = layout.apply_views(np.arange(n, dtype=np.int64).reshape((n,) if views else shape), views)
    n_new = placed.shape[axis]
    slab = np.take(cache.index, np.arange(n_new), axis=axis)
    index = np.empty(n, np.int64)
    index[placed.reshape(-1)] = slab.reshape(-1)
    stride = int(np.take(cache.index, [1], axis=axis).reshape(-1)[0] - slab.reshape(-1)[0]) \
        if cache.index.shape[axis] > 1 else 0
    return index, stride, cache.index.shape[axis] - n_new


def stream_walk(io: SimpleNamespace, dims: list[tuple[int, int]], elements: int):
    """An ObjectFifo stream walk (`to_stream` / `from_stream`: a TensorAccessPattern at offset 0 over one object
    of `elements`) from (size, stride) dimensions, outermost first."""
    return io.TensorAccessPattern((elements,), 0, [n for n, _ in dims], [s for _, s in dims])


def device(io: SimpleNamespace, target: str):
    return io.NPU1() if target == "npu1" else io.NPU2()


def tensor(n: int, dtype=BF16) -> type:
    return np.ndarray[(int(n),), np.dtype[dtype]]


# ---- the fused epilogue (kernels/include/npu_kernel.h: NpuEpilogueOp) -----------------------------------

OPCODES = {"gelu": 1, "gelu_tanh": 2, "sigmoid": 3, "silu": 4, "relu": 5, "tanh": 6, "exp": 7, "scale": 8,
           "add": 16, "sub": 17, "mul": 18, "div": 19}
MAX_CHAIN = 8


def encode_chain(chain, n_head_inputs: int) -> tuple[np.ndarray, np.ndarray]:
    """(int32 words, float32 immediates), MAX_CHAIN long; a word is opcode | slot << 8 | swap << 12, where slot
    counts the epilogue operands (kernel input n_head_inputs + slot)."""
    if len(chain) > MAX_CHAIN:
        raise DesignError(f"an epilogue of {len(chain)} ops; the kernels take at most {MAX_CHAIN}")
    words, imms = np.zeros(MAX_CHAIN, np.int32), np.zeros(MAX_CHAIN, np.float32)
    for i, c in enumerate(chain):
        slot = 0 if c["operand"] is None else c["operand"] - n_head_inputs
        words[i] = OPCODES[c["op"]] | slot << 8 | int(bool(c["swap"])) << 12
        imms[i] = c["attrs"].get("factor", 0.0)
    return words, imms


# ---- operands and their access patterns ------------------------------------------------------------------

@dataclass(frozen=True)
class Operand:
    """A kernel operand: the buffer it lives in and the element index (in elements of that buffer) of each
    element of the logical operand, after its view chain."""
    name: str
    elements: int          # size of the buffer in elements (the runtime-sequence tensor)
    index: np.ndarray      # logical shape, int64 offsets into the buffer
    dtype: np.dtype = BF16
    scalar: bool = False   # one value per row, broadcast along it by the kernel (index [..., 1])

    @property
    def shape(self) -> tuple:
        return self.index.shape

    def rows(self, index: np.ndarray, scalar: bool = False) -> "Operand":
        return Operand(self.name, self.elements, np.ascontiguousarray(index), self.dtype, scalar)


def operand(name: str, buffer, views=()) -> Operand:
    """`buffer` is an sdk Program Buffer (shape, device dtype: bf16, fp32 for the residual stream and weight
    vectors, int32)."""
    n = math.prod(buffer.shape)
    index = layout.apply_views(np.arange(n, dtype=np.int64).reshape(buffer.shape), views)
    return Operand(name, n, np.ascontiguousarray(index), np.dtype(buffer.dtype))


def sequence_args(step, buffers, read: dict, outs: list) -> tuple[list, dict[int, int]]:
    """A design's runtime-sequence tensors in the order the fused design passes them (kernels/fused/design.py):
    every present input of the step, then the outputs. `read` maps input index -> the Operand the design reads;
    an input it does not stream (a runtime position, which reaches the DMAs as a scratchpad word) is declared
    and left unread. Returns the tensors and the position of each input index among them."""
    seq, at = [], {}
    for i, name in enumerate(step.inputs):
        if name is not None:
            at[i] = len(seq)
            seq.append(read[i] if i in read else operand(name, buffers[name]))
    return seq + list(outs), at


def sequence_of(step, tensors) -> list[int]:
    """params["sequence"] of a design: the position, among the step's operands as the fused design passes them
    (present inputs, then outputs), of the buffer behind each tensor its runtime sequence declares, in order. A
    buffer named twice is one view of the arenas (the fused design shares a device only with the same repeats):
    each tensor takes its buffer's first place not yet taken, else its first place (GLU reads its input twice)."""
    run = [n for n in (*step.inputs, *step.outputs) if n is not None]
    stray = [t.name for t in tensors if t.name not in run]
    if stray:
        raise DesignError(f"runtime-sequence tensors {stray} are not operands of the step")
    at: list[int] = []
    for t in tensors:
        at.append(next((i for i, n in enumerate(run) if n == t.name and i not in at), run.index(t.name)))
    return at


def wrapped(index: np.ndarray, total: int) -> list[np.ndarray]:
    """A 1-D `index` repeated to `total` elements (np.resize's order), as pieces that are each one affine pattern:
    the whole copies (a repeat, stride 0 outermost) and the remainder."""
    whole, rest = divmod(total, index.size)
    return ([np.broadcast_to(index, (whole, index.size))] if whole else []) + ([index[:rest]] if rest else [])


def widened_rows(o: Operand, buffer, width: int) -> np.ndarray | None:
    """The operand's rows ([..., K], each contiguous in its buffer) read `width` >= K elements wide, on into the
    rest of their stored row: the padding the compiler's memory plan gives a GEMM output ([..., Np], read through
    a slice of its first N columns). [rows, width] indices, or None when a row would leave its stored row."""
    K = o.index.shape[-1]
    rows = o.index.reshape(-1, K)
    start = rows[:, :1]
    if not (rows == start + np.arange(K)).all() or ((start % buffer.shape[-1]) + width > buffer.shape[-1]).any():
        return None
    return start + np.arange(width)


def is_f32(o: Operand) -> int:
    return int(o.dtype == np.float32)


def dims_of(index: np.ndarray) -> tuple[int, list[tuple[int, int]]]:
    """(offset, [(size, stride), ...] outermost first) of the address sequence `index` (read in C order), with
    the fewest dimensions: the shape of the buffer descriptor(s) that read it. Raises when no affine pattern
    produces the sequence."""
    flat = np.asarray(index).reshape(-1)
    if flat.size == 0:
        raise DesignError("an empty transfer")
    offset, dims = int(flat[0]), []
    while flat.size > 1:
        step = int(flat[1] - flat[0])
        run = int(np.argmax(np.diff(flat) != step)) + 1 if (np.diff(flat) != step).any() else flat.size
        for size in range(run, 0, -1):  # the longest run that tiles the sequence into equal blocks
            if flat.size % size == 0 and size > 1:
                blocks = flat.reshape(-1, size)
                if (np.diff(blocks, axis=1) == step).all():
                    break
        else:
            raise DesignError("an operand view is not an affine access pattern")
        dims.append((size, step))
        flat = blocks[:, 0]
    if not dims:
        dims = [(1, 1)]
    dims.reverse()
    if dims[-1][1] != 1 and len(dims) >= 1 and np.asarray(index).shape and np.asarray(index).shape[-1] == 1:
        dims.append((1, 1))  # a run of one element per step (a scalar per piece)
    return offset, dims


def taps(io, operand_: Operand, index: np.ndarray, max_dims: int = 4) -> list:
    """TensorAccessPatterns over the operand's tensor that read `index` in order: one per buffer descriptor.
    A pattern with more dimensions than a descriptor has, that steps by 0 in any but its outermost dimension,
    or that is not affine as a whole (a shifted last tile), is split along its outermost dimension."""
    try:
        offset, dims = dims_of(index)
    except DesignError:
        if index.ndim < 2:
            raise
        return [t for run in _affine_runs(index) for t in taps(io, operand_, run, max_dims)]
    if dims[-1][1] != 1 and dims[-1][0] > 1:
        raise DesignError(f"operand {operand_.name}: its innermost access stride is {dims[-1][1]} elements; the "
                          f"DMAs move 32-bit words, so an element-granular transpose needs kernels/transpose")
    # a shim buffer descriptor steps by 0 only in its outermost dimension, the repeat (mlir-aie verifies every
    # other stride of aiex.npu.dma_memcpy_nd non-zero, a constraint of the descriptors: mlir-aie#2308), so a
    # pattern that repeats inside is split until the repeat is outermost
    if len(dims) <= max_dims and not any(s == 0 for _, s in dims[1:]):
        sizes = [1] * (4 - len(dims)) + [n for n, _ in dims]
        strides = [0] * (4 - len(dims)) + [s for _, s in dims]
        return [io.TensorAccessPattern((operand_.elements,), offset, sizes, strides)]
    if len(dims) <= max_dims and index.ndim >= 2:  # a repeat inside: runs of rows whose repeat is outermost
        return [t for run in _runs(index, lambda r: _repeats_outermost(r, max_dims))
                for t in taps(io, operand_, run, max_dims)]
    return [t for i in range(index.shape[0]) for t in taps(io, operand_, index[i], max_dims)]


def _repeats_outermost(index: np.ndarray, max_dims: int) -> bool:
    try:
        _, dims = dims_of(index)
    except DesignError:
        return False
    return len(dims) <= max_dims and not any(s == 0 for _, s in dims[1:])


def _runs(index: np.ndarray, ok) -> list[np.ndarray]:
    """Split along the first axis into consecutive runs, each as long as `ok` allows (found by bisection; a run
    of one row is taken as it is): a per-head bias repeated over each head's rows becomes one transfer per head."""
    runs, i, n = [], 0, index.shape[0]
    while i < n:
        lo, hi = i + 1, n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if ok(index[i:mid]):
                lo = mid
            else:
                hi = mid - 1
        runs.append(index[i] if lo == i + 1 else index[i:lo])
        i = lo
    return runs


def _affine_runs(index: np.ndarray) -> list[np.ndarray]:
    """Split along the first axis into the fewest consecutive runs that are each affine (edge rows clamped
    into an image break the pattern only at the edges)."""
    runs, i, n = [], 0, index.shape[0]
    while i < n:
        j = i + 1
        while j < n and _affine(index[i:j + 1]):
            j += 1
        runs.append(index[i] if j == i + 1 else index[i:j])
        i = j
    return runs


def _affine(index: np.ndarray) -> bool:
    try:
        dims_of(index)
        return True
    except DesignError:
        return False


# ---- one core per work list: the convolution-like designs ---------------------------------------------------

@dataclass
class Stream:
    """One input (or the output) of a per-core design: the operand, its object type, and for each core the
    element index of everything it moves, in order; `lead` is what comes first on the same fifo from another
    operand (a bias ahead of the weights), as (operand, index per core)."""
    operand: Operand
    obj_type: type
    per_core: list[np.ndarray]
    lead: tuple | None = None
    # (operand, index per core): one object after each item (a residual row); an item's index may be a tuple of
    # index arrays, moved one after another into that object
    follow: tuple | None = None


def per_core_design(target_name: str, name: str, inputs: list[Stream], output: Stream, kernels: list,
                    state: dict, body, args: list, params: dict, step):
    """Cores that each read their inputs straight from the shims (no memtile) and write their output back:
    cores <= columns, so that every core has its own shim channels."""
    io = iron()
    target = TARGETS[target_name]
    cores = len(output.per_core)
    if cores > target.columns or len(inputs) > target.shim_channels:
        raise DesignError(f"{cores} cores with {len(inputs)} inputs each exceed the shims' channels")
    operands = [s.operand for s in inputs] + [s.lead[0] for s in inputs if s.lead] \
        + [s.follow[0] for s in inputs if s.follow] + [output.operand]
    workers, transfers = [], []
    for c in range(cores):
        ins = [io.ObjectFifo(s.obj_type, depth=2, name=f"{name}_in{i}_c{c}") for i, s in enumerate(inputs)]
        out = io.ObjectFifo(output.obj_type, depth=2, name=f"{name}_out_c{c}")
        bufs = [io.Buffer(tensor(n, dt), name=f"{name}_{k}_c{c}", initial_value=init)
                for k, (n, dt, init) in state.items()]
        workers.append(io.Worker(body, [f.cons() for f in ins] + [out.prod()] + bufs + kernels + list(args),
                                 tile=io.Tile(c, 2), stack_size=STACK_BYTES))
        lead = len(inputs)
        for f, st in zip(ins, inputs):
            if st.lead:
                transfers.append(("fill", f, lead, st.lead[1][c], c))
                lead += 1
        follow = len(inputs) + sum(1 for st in inputs if st.lead)
        for i, (f, st) in enumerate(zip(ins, inputs)):
            if st.follow:  # item by item: the main object, then the following one
                transfers.append(("fill_pair", f, (i, follow), (st.per_core[c], st.follow[1][c]), c))
                follow += 1
            else:
                transfers.append(("fill", f, i, st.per_core[c], c))
        transfers.append(("drain", out, len(operands) - 1, output.per_core[c], c))
    # Work items go in task groups small enough that each shim's buffer descriptors are reused: a group's fills
    # and drains are issued, its drains awaited, and its descriptors freed before the next group.
    # Streams with one object per output object go in task groups small enough that each shim's buffer
    # descriptors are reused (a group's drains are awaited and its descriptors freed before the next group);
    # the others (resident weights) stay in one group open for the whole sequence.
    n_items = output.per_core[0].shape[0]
    paced = [t for t in transfers if t[0] == "fill_pair" or t[3].shape[0] == n_items]
    steady = [t for t in transfers if t[0] != "fill_pair" and t[3].shape[0] != n_items]
    steady_bds = max([sum(len(taps(io, operands[i], idx)) for _, _, i, idx, c2 in steady if c2 == c)
                      for c in range(cores)] or [0])
    def bds(t, lo, hi):
        kind, _, i, idx, _ = t
        if kind == "fill_pair":
            return sum(len(taps(io, operands[i[0]], idx[0][j])) + sum(len(taps(io, operands[i[1]], p))
                                                                      for p in _pieces(idx[1][j]))
                       for j in range(lo, min(hi, n_items)))
        return len(taps(io, operands[i], idx[lo:hi]))

    group = n_items
    while group > 1 and steady_bds + sum(bds(t, 0, group) for t in paced if t[4] == 0) > target.shim_bds:
        group = (group + 1) // 2
    ends = RuntimeEnds(io)
    for kind, fifo, _, _, c in transfers:
        (ends.drain if kind == "drain" else ends.fill)(fifo, c)

    def issue(rt_args, batch, tg, lo=None, hi=None):
        for kind, fifo, i, idx, c in batch:
            if kind == "fill_pair":
                for j in range(lo, min(hi, n_items)):
                    for which in (0, 1):
                        for piece in _pieces(idx[which][j]):
                            for tap in taps(io, operands[i[which]], piece):
                                ends.fill(fifo, c).fill(rt_args[i[which]], tap=tap, group=tg)
                continue
            for tap in taps(io, operands[i], idx if lo is None else idx[lo:hi]):
                if kind == "fill":
                    ends.fill(fifo, c).fill(rt_args[i], tap=tap, group=tg)
                else:
                    ends.drain(fifo, c).drain(rt_args[i], tap=tap, group=tg, wait=True)

    def sequence(*rt_args):
        resident = io.TaskGroup()
        issue(rt_args, steady, resident)
        for lo in range(0, n_items, group):
            tg = io.TaskGroup()
            issue(rt_args, paced, tg, lo, lo + group)
            tg.finish()
        resident.finish()
    params.update({"cores": cores, "items_per_group": group, "sequence": sequence_of(step, operands)})
    return program(io, target_name, operands, ends, workers, sequence)


def _pieces(index) -> tuple:
    return index if isinstance(index, tuple) else (index,)


# ---- the row-streaming skeleton ----------------------------------------------------------------------------

@dataclass
class Streaming:
    """A row-streaming kernel step: operands and output as [rows, row] (per-row streams) or [row] (shared)."""
    rows: int
    row: int
    piece: int                   # elements per object: the row, or a divisor of it when it exceeds the chunk
    per_row: list[Operand]       # index arrays [rows, row]
    shared: list[Operand]        # index arrays [row]
    out: Operand                 # index array [rows, out_row]
    passes: int = 1              # times each row streams through the core (phases of a long row)
    out_row: int = 0             # output elements per row when they differ from the row (argmax, reduce)
    out_dtype: np.dtype = BF16
    state: dict = field(default_factory=dict)  # name -> (n, dtype, initial value or None): per-core L1 buffers


def row_piece(row: int, chunk: int, words: bool = False) -> int:
    """Elements per transfer: the whole row when it fits the catalog's chunk, else the largest even divisor of
    the row not above the chunk (objects have one size; the last transfer of a row must not spill). Rows of
    fp32 words (`words`) may split at any divisor."""
    if row <= chunk:
        return row
    for d in range(chunk, 1, -1) if words else range(chunk - chunk % 2, 1, -2):
        if row % d == 0:
            return d
    raise DesignError(f"a row of {row} elements has no even divisor below the chunk {chunk}: pad rows to even")


def plan_streaming(target: Target, rows: int, n_per_row: int, n_shared: int, max_cores: int) -> tuple[int, int]:
    """(columns, cores per column): the most cores, at most the catalog's, that divide the rows and fit the DMA
    channels. Per core, its per-row streams are joined in its column's memtile into one object (one core input
    channel), the shared streams are joined once and broadcast (the other); outputs are joined per column.
    Every stream into the array takes one shim MM2S channel, on any column's shim."""
    for cores in range(min(max_cores, target.cores, rows), 0, -1):
        if rows % cores:
            continue
        for per_col in (4, 2, 1):
            cols = cores // per_col
            if cores % per_col or cols > target.columns:
                continue
            shared_here = n_shared if n_shared else 0
            s2mm = per_col * n_per_row + per_col + shared_here
            mm2s = per_col + 1 + (1 if n_shared else 0)
            shim = cores * n_per_row + n_shared
            if s2mm <= target.memtile_channels and mm2s <= target.memtile_channels \
                    and shim <= target.shim_channels * target.columns:
                return cols, per_col
    raise DesignError(f"no placement for {n_per_row} per-row and {n_shared} shared streams within the channels")


def shim_allotter(target: Target):
    """Hands out shim tiles for the streams into the array: a column's own shim first, else any with a free
    MM2S channel (the stream switches route across columns)."""
    free = {c: target.shim_channels for c in range(target.columns)}

    def take(home: int) -> int:
        for c in [home] + sorted(free, key=lambda c: (-free[c], c)):
            if free[c] > 0:
                free[c] -= 1
                return c
        raise DesignError("out of shim MM2S channels")
    return take


def streaming(target_name: str, name: str, s: Streaming, kernel_fns: dict, body, max_cores: int, params: dict,
              step):
    """Build the IRON program of a streaming step. `body(rows_in, shared_in, y_out, *state buffers, *kernels,
    rows_per_core, npieces, passes)` is the core function of one worker (IRON traces it once per core);
    shared_in is None without shared operands. Every input object is acquired in every pass of a row; the
    output only in the last."""
    io = iron()
    target = TARGETS[target_name]
    P, S = len(s.per_row), len(s.shared)
    cols, per_col = plan_streaming(target, s.rows, P, S, max_cores if s.passes == 1 else 1)
    cores = cols * per_col
    rows_per_core = s.rows // cores
    npieces = s.row // s.piece
    out_row = s.out_row or s.row
    out_piece = out_row if s.out_row else s.piece
    out_dtype = s.out_dtype if s.out_row else s.out.dtype
    out_ty = tensor(out_piece, out_dtype)
    kernels = [io.Kernel(fn, f"{name}.o", types) for fn, types in kernel_fns.values()]
    take = shim_allotter(target)

    fills, workers, drains = [], [], []
    shared_fifo = None
    if S:
        offsets, units = joined_layout(s.shared, s.piece)
        shared_fifo = io.ObjectFifo(tensor(units), depth=2, name=f"{name}_shared")
        parts = shared_fifo.prod().join(offsets, tile=io.Tile(0, 1),
                                        obj_types=[tensor(1 if o.scalar else s.piece, o.dtype) for o in s.shared],
                                        depths=[2] * S, names=[f"{name}_shared{i}" for i in range(S)])
        for i, f in enumerate(parts):
            o = s.shared[i]
            per = o.index.reshape(1, 1) if o.scalar else o.index.reshape(npieces, s.piece)
            idx = np.broadcast_to(per, (rows_per_core * s.passes, npieces, per.shape[1]))
            fills.append((f, len(s.per_row) + i, idx, take(0)))
    for c in range(cols):
        joined = io.ObjectFifo(tensor(per_col * out_piece, out_dtype), depth=2, name=f"{name}_out_c{c}")
        outs = joined.prod().join([r * out_piece for r in range(per_col)], tile=io.Tile(c, 1),
                                  obj_types=[out_ty] * per_col, depths=[2] * per_col,
                                  names=[f"{name}_out_c{c}r{r}" for r in range(per_col)])
        out_rows = []
        for r in range(per_col):
            q = c * per_col + r
            lo, hi = q * rows_per_core, (q + 1) * rows_per_core
            offsets, units = joined_layout(s.per_row, s.piece)
            rows_fifo = io.ObjectFifo(tensor(units), depth=2, name=f"{name}_rows_c{c}r{r}")
            parts = rows_fifo.prod().join(offsets, tile=io.Tile(c, 1),
                                          obj_types=[tensor(1 if o.scalar else s.piece, o.dtype) for o in s.per_row],
                                          depths=[2] * P, names=[f"{name}_in{i}_c{c}r{r}" for i in range(P)])
            for i, f in enumerate(parts):
                o = s.per_row[i]
                if o.scalar:  # the row's one value, once per piece
                    idx = np.broadcast_to(o.index[lo:hi].reshape(rows_per_core, 1, 1, 1),
                                          (rows_per_core, s.passes, npieces, 1))
                else:
                    idx = np.broadcast_to(o.index[lo:hi].reshape(rows_per_core, 1, npieces, s.piece),
                                          (rows_per_core, s.passes, npieces, s.piece))
                fills.append((f, i, idx, take(c)))
            out_rows.append(s.out.index[lo:hi].reshape(-1, out_piece))
            bufs = [io.Buffer(tensor(n, dt), name=f"{name}_{k}_c{c}r{r}", initial_value=init)
                    for k, (n, dt, init) in s.state.items()]
            handles = [rows_fifo.cons(), shared_fifo.cons() if S else None, outs[r].prod()]
            args = [h for h in handles if h is not None] if S else [handles[0], handles[2]]
            workers.append(io.Worker(_with_shared(body, S), args + bufs + kernels + [rows_per_core, npieces, s.passes],
                                     tile=io.Tile(c, 2 + r), stack_size=STACK_BYTES))
        drains.append((joined, np.stack(out_rows, axis=1), c))   # [objects, core, out_piece]

    operands = [*s.per_row, *s.shared, s.out]
    ends = RuntimeEnds(io)
    for f, _, _, shim_col in fills:
        ends.fill(f, shim_col)
    for joined, _, c in drains:
        ends.drain(joined, c)

    def rows_transfers(lo: int, hi: int) -> list:
        """Rows lo..hi of every core, in stream order: (fifo, operand, tap, shim column, is a drain)."""
        found = []
        for f, i, idx, shim_col in fills:  # a shared operand's index repeats per row and pass
            part = idx[lo * s.passes:hi * s.passes] if i >= P else idx[lo:hi]
            found += [(f, i, tap, shim_col, False) for tap in taps(io, operands[i], part)]
        for joined, idx, c in drains:
            per_row_objects = idx.shape[0] // rows_per_core
            found += [(joined, len(operands) - 1, tap, c, True)
                      for tap in taps(io, s.out, idx[lo * per_row_objects:hi * per_row_objects])]
        return found

    # every row's transfers at once when their descriptors fit the shims; else rows in task groups, each
    # group's drains awaited and its descriptors freed before the next (a core's rows are independent)
    rows_per_group = rows_per_core
    plan = [rows_transfers(0, rows_per_core)]
    while rows_per_group > 1 and not all(fits_shim_bds([t[3] for t in p], target) for p in plan):
        rows_per_group = (rows_per_group + 1) // 2
        plan = [rows_transfers(lo, min(rows_per_core, lo + rows_per_group))
                for lo in range(0, rows_per_core, rows_per_group)]

    def sequence(*args):
        for part in plan:
            tg = io.TaskGroup() if len(plan) > 1 else None
            for f, i, tap, shim_col, is_drain in part:
                if is_drain:
                    ends.drain(f, shim_col).drain(args[i], tap=tap, group=tg, wait=True)
                else:
                    ends.fill(f, shim_col).fill(args[i], tap=tap, group=tg)
            if tg is not None:
                tg.finish()
    params.update({"cores": cores, "columns": cols, "rows_per_core": rows_per_core, "rows_per_group": rows_per_group,
                   "piece": s.piece, "passes": s.passes, "sequence": sequence_of(step, operands)})
    return program(io, target_name, operands, ends, workers, sequence)


def joined_layout(operands: list[Operand], piece: int) -> tuple[list[int], int]:
    """Offsets (bf16 units) of each operand's piece in a memtile-joined object, and the object's size."""
    offsets, at = [], 0
    for o in operands:
        offsets.append(at)
        at += (1 if o.scalar else piece) * o.dtype.itemsize // 2
    return offsets, at


def operand_map(slots: list, per_row: list[Operand], shared: list[Operand], piece: int) -> np.ndarray:
    """map[i] = shared << 15 | fp32 << 14 | word offset of kernel input i in its joined object (npu_operand)."""
    words = {"row": [o // 2 for o in joined_layout(per_row, piece)[0]],
             "shared": [o // 2 for o in joined_layout(shared, piece)[0]]}
    codes = []
    for kind, pos in slots:
        o = (per_row if kind == "row" else shared)[pos]
        codes.append((kind == "shared") << 15 | is_f32(o) << 14 | int(o.scalar) << 13 | words[kind][pos])
    return np.array(codes + [0] * (MAX_CHAIN - len(codes)), np.int32)


def joined_type(operands: list[Operand], piece: int, fallback=None):
    return tensor(joined_layout(operands, piece)[1]) if operands else fallback


def _with_shared(body, n_shared: int):
    """Without shared operands the kernel's `shared` argument is the rows object (never read)."""
    if n_shared:
        return body

    def core(rows_in, y_out, *rest):
        return body(rows_in, None, y_out, *rest)
    return core


def split_operands(step, buffers, sources=None) -> tuple[int, int, list, list, list, Operand]:
    """(rows, row, per-row operands, shared operands, slots, output) of a streaming step whose output has the
    logical shape of its operands; slots[i] = ("row" | "shared", position) of the i-th present kernel input
    (head inputs, then epilogue operands). `sources` replaces the inputs' index arrays (GLU's halves)."""
    out = operand(step.outputs[0], buffers[step.outputs[0]])
    shape = out.index.shape
    row = shape[-1]
    rows = math.prod(shape[:-1])
    out = out.rows(out.index.reshape(rows, row))
    if sources is None:
        sources = [operand(n, buffers[n], step.attrs["views"][i]) for i, n in enumerate(step.inputs) if n is not None]
    per_row, shared, slots = [], [], []
    for o in sources:
        idx = np.broadcast_to(o.index, shape).reshape(rows, row)
        scalar = row > 1 and bool((idx == idx[:, :1]).all())  # one value along each row: the kernel repeats it
        if scalar:
            if o.dtype.itemsize != 4:
                raise DesignError(f"operand {o.name}: a {o.dtype} value broadcast along the row is not a whole "
                                  f"32-bit word (the DMAs cannot repeat an element; innermost stride 0)")
            idx = idx[:, :1]
        if rows > 1 and (idx == idx[:1]).all():
            slots.append(("shared", len(shared)))
            shared.append(o.rows(idx[0], scalar))
        else:
            slots.append(("row", len(per_row)))
            per_row.append(o.rows(idx, scalar))
    return rows, row, per_row, shared, slots, out


def epilogue_state(step, n_head_inputs: int, operand_map: np.ndarray | None = None) -> dict:
    words, imms = encode_chain(step.attrs["chain"], n_head_inputs)
    state = {"chain": (MAX_CHAIN, np.int32, words), "imm": (MAX_CHAIN, np.float32, imms)}
    if operand_map is not None:
        state["map"] = (MAX_CHAIN, np.int32, operand_map)
    return state


def params_of(args: argparse.Namespace) -> dict:
    return json.loads(open(args.step).read()) if args.step else {}


def main(build_fn) -> None:
    """The command line of every design.py: `python design.py --target npu2 --step step.json > design.mlir`,
    where step.json is {"step": <kernel step of a compiled Program>, "buffers": {name: [shape, dtype]}}."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", choices=sorted(TARGETS), required=True)
    ap.add_argument("--step", required=True, help="a kernel step and its buffers, as kernels/build.py writes them")
    a = ap.parse_args()
    from sdk.program import Buffer, Step, Usage
    doc = params_of(a)
    st = doc["step"]
    step = Step(st["kind"], st["op"], tuple(st["inputs"]), tuple(st["outputs"]), st["attrs"])
    buffers = {n: Buffer(n, tuple(shape), dtype, Usage.SCRATCH) for n, (shape, dtype) in doc["buffers"].items()}
    print(build_fn(a.target, step, buffers, {}))
    sys.stdout.flush()
