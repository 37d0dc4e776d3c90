"""On-device argmax design (catalog kind `argmax`): greedy decoding picks the token on the device, so only
one int32 per row crosses to the host. Rows over the cores; a row longer than the chunk (a vocabulary)
streams piece by piece into a running (best, index) in L1. An argmax with picks (sdk/compiler/fuse.py:
_fold_argmax_picks) also stores the value at the index of its own row and of at most one other row t streamed
beside it (joined per piece in the memtile): one core, one object of 32-bit words out, split in the memtile to
the index and each picked value. kernels/argmax/argmax.cc."""
from __future__ import annotations

import math

import numpy as np

from kernels import access, design_cli, row_streaming
from kernels.design_error import DesignError
from kernels.iron_program import STACK_BYTES, RuntimeEnds, iron, program, tensor
from kernels.step_operands import is_f32, operand, sequence_of

KINDS = ("argmax",)


def build(target: str, step, buffers: dict, params: dict):
    x = operand(step.inputs[0], buffers[step.inputs[0]], step.attrs["views"][0])
    axis = step.attrs["head"]["attrs"].get("axis", -1)
    if axis not in (-1, x.index.ndim - 1):
        raise DesignError(f"argmax over axis {axis}: the kernel reduces the last axis")
    row = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    if "picks" in step.attrs:
        return _with_picks(target, step, buffers, params, x, rows, row)
    out = operand(step.outputs[0], buffers[step.outputs[0]])  # int32, one per row
    piece = row_streaming.row_piece(row, step.attrs["tiling"]["chunk"], is_f32(x))
    bf, i32, x_f32 = tensor(piece * x.dtype.itemsize // 2), np.int32, is_f32(x)  # the joined object
    best_t, idx_t = tensor(1, np.float32), tensor(1, np.int32)
    fns = {"begin": ("argmax_begin", [best_t, idx_t]), "chunk": ("argmax_chunk", [bf, i32, i32, i32, best_t, idx_t]),
           "store": ("argmax_store", [idx_t, idx_t])}
    io = iron()

    def body(x_fifo, _shared, y_fifo, best, index, begin, chunk, store, rows_per_core, npieces, passes):
        for _ in io.range_(rows_per_core):
            begin(best, index)
            for j in range(npieces):  # unrolled: each piece's column offset is a constant
                xs = x_fifo.acquire(1)
                chunk(xs, x_f32, piece, j * piece, best, index)
                x_fifo.release(1)
            y = y_fifo.acquire(1)
            store(index, y)
            y_fifo.release(1)

    s = row_streaming.Streaming(rows, row, piece, [x.rows(x.index.reshape(rows, row))], [],
                                out.rows(out.index.reshape(rows, 1)), out_row=1, out_dtype=np.dtype(np.int32),
                                state={"best": (1, np.float32, None), "index": (1, np.int32, None)})
    params.update({"chunk": step.attrs["tiling"]["chunk"]})
    return row_streaming.streaming(target, "argmax", s, fns, body, step.attrs["tiling"]["cores"], params, step)


def _with_picks(target: str, step, buffers: dict, params: dict, x, rows: int, row: int):
    picks = step.attrs["picks"]
    others = sorted(set(picks) - {0})
    if rows != 1 or len(others) > 1:
        raise DesignError(f"argmax with picks over {rows} rows of {len(others)} other rows: the design picks "
                          "from one row (a decoder step) and at most one other row")
    t = operand(step.inputs[others[0]], buffers[step.inputs[others[0]]], step.attrs["views"][others[0]]) \
        if others else x
    t = t.rows(t.index.reshape(1, row)) if others else t
    outs = [operand(n, buffers[n]) for n in step.outputs]
    if any(o.dtype != np.float32 or o.index.size != 1 for o in outs[1:]):
        raise DesignError("argmax picks are stored as one fp32 word each (sdk/compiler/layout.py word_values)")
    ins = [x.rows(x.index.reshape(1, row))] + ([t] if others else [])
    piece = row_streaming.row_piece(row, step.attrs["tiling"]["chunk"], all(is_f32(o) for o in ins))
    npieces = row // piece
    offsets, units = row_streaming.joined_layout(ins, piece)
    t_word = offsets[-1] // 2
    io = iron()
    joined_t = tensor(units)
    best_t, idx_t = tensor(1, np.float32), tensor(1, np.int32)
    out_t = tensor(2 * len(outs))   # 32-bit words: the index, then each pick
    i32 = np.int32
    kernels = [io.Kernel("argmax_begin", "argmax.o", [best_t, idx_t]),
               io.Kernel("argmax_chunk_pick", "argmax.o", [joined_t, i32, i32, i32, i32, i32, best_t, idx_t, best_t]),
               io.Kernel("argmax_store_picks", "argmax.o", [idx_t, best_t, best_t, out_t, i32, i32])]
    from_t = sum(1 << j for j, i in enumerate(picks) if i != 0)
    x_f32, t_f32 = is_f32(x), is_f32(t)

    def body(x_fifo, y_fifo, best, index, picked, begin, chunk, store):
        begin(best, index)
        for j in range(npieces):  # unrolled: each piece's column offset is a constant
            xs = x_fifo.acquire(1)
            chunk(xs, x_f32, t_word, t_f32, piece, j * piece, best, index, picked)
            x_fifo.release(1)
        y = y_fifo.acquire(1)
        store(index, best, picked, y, len(picks), from_t)
        y_fifo.release(1)

    rows_fifo = io.ObjectFifo(joined_t, depth=2, name="argmax_rows")
    parts = rows_fifo.prod().join(offsets, tile=io.Tile(0, 1), obj_types=[tensor(piece, o.dtype) for o in ins],
                                  depths=[2] * len(ins), names=[f"argmax_in{i}" for i in range(len(ins))])
    out_fifo = io.ObjectFifo(out_t, depth=2, name="argmax_out")
    out_types = [tensor(1, o.dtype) for o in outs]
    pieces_out = out_fifo.cons().split([2 * j for j in range(len(outs))], tile=io.Tile(0, 1), obj_types=out_types,
                                       depths=[2] * len(outs), names=[f"argmax_out{j}" for j in range(len(outs))])
    state = [io.Buffer(best_t, name="argmax_best"), io.Buffer(idx_t, name="argmax_index"),
             io.Buffer(best_t, name="argmax_picked", initial_value=np.zeros(1, np.float32))]
    worker = io.Worker(body, [rows_fifo.cons(), out_fifo.prod(), *state, *kernels], tile=io.Tile(0, 2),
                       stack_size=STACK_BYTES)
    ends = RuntimeEnds(io)
    fills = [(ends.fill(f, i), o) for i, (f, o) in enumerate(zip(parts, ins))]   # one shim per input stream
    drains = [(ends.drain(f, j // 2), o) for j, (f, o) in enumerate(zip(pieces_out, outs))]   # 2 S2MM per shim

    def sequence(*args):
        for i, (end, o) in enumerate(fills):
            for tap in access.taps(io, o, o.index.reshape(npieces, piece)):
                end.fill(args[i], tap=tap)
        for j, (end, o) in enumerate(drains):
            for tap in access.taps(io, o, o.index.reshape(1, 1)):
                end.drain(args[len(ins) + j], tap=tap, wait=True)
    params.update({"chunk": step.attrs["tiling"]["chunk"], "cores": 1, "piece": piece, "picks": list(picks),
                   "sequence": sequence_of(step, [*ins, *outs])})
    return program(io, target, [*ins, *outs], ends, [worker], sequence)


if __name__ == "__main__":
    design_cli.main(build)
