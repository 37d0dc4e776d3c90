"""The skeleton of the row-streaming designs (eltwise, softmax, norm, rope, argmax, reduce): rows split over cores
within the DMA channel budget, each core's per-row operands joined into one object in its column's memtile, the
shared ones joined once and broadcast, outputs joined per column."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kernels.access import taps
from kernels.design_error import DesignError
from kernels.epilogue import MAX_CHAIN
from kernels.iron_program import BF16, STACK_BYTES, RuntimeEnds, iron, program, tensor
from kernels.shim_budget import shim_allotter
from kernels.step_operands import Operand, is_f32, operand, sequence_of
from kernels.task_groups import Transfer, fit, issue
from sdk.compiler.hardware import TARGETS, Target


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

    def rows_transfers(lo: int, hi: int) -> list[Transfer]:
        """Rows lo..hi of every core, in stream order; the drains awaited."""
        found = []
        for f, i, idx, shim_col in fills:  # a shared operand's index repeats per row and pass
            part = idx[lo * s.passes:hi * s.passes] if i >= P else idx[lo:hi]
            found += [Transfer(ends.fill(f, shim_col), shim_col, i, tap) for tap in taps(io, operands[i], part)]
        for joined, idx, c in drains:
            per_row_objects = idx.shape[0] // rows_per_core
            found += [Transfer(ends.drain(joined, c), c, len(operands) - 1, tap, drain=True, wait=True)
                      for tap in taps(io, s.out, idx[lo * per_row_objects:hi * per_row_objects])]
        return found

    # every row's transfers at once when their descriptors fit the shims; else rows in task groups, each
    # group's drains awaited and its descriptors freed before the next (a core's rows are independent)
    rows_per_group = rows_per_core
    plan = [rows_transfers(0, rows_per_core)]
    while rows_per_group > 1 and not fit(plan, target):
        rows_per_group = (rows_per_group + 1) // 2
        plan = [rows_transfers(lo, min(rows_per_core, lo + rows_per_group))
                for lo in range(0, rows_per_core, rows_per_group)]

    def sequence(*args):
        issue(io, args, plan, grouped=len(plan) > 1)
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
