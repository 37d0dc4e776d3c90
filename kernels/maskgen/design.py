"""Masks and positions from the runtime parameters (catalog kind `maskgen`): one core reads the parameter
(position or valid length: one int32 from the io arena, filled each dispatch) and writes the mask rows, so a
decoder step or a padded bucket needs no host computation. A length mask longer than the catalog's chunk
(Whisper's vocabulary filter, 51864 wide) is written in pieces of the chunk, each told its first column; the
memory plan stores such a mask padded to whole chunks (sdk/compiler/memory.py: pad_masks_to_chunks).
kernels/maskgen/maskgen.cc."""
from __future__ import annotations

import math

import numpy as np

from kernels import access, design_cli, row_streaming
from kernels.design_error import DesignError
from kernels.iron_program import STACK_BYTES, RuntimeEnds, iron, program, tensor
from kernels.step_operands import is_f32, operand, sequence_of

KINDS = ("maskgen",)
HALF_L1 = 32 * 1024   # two output objects (double-buffered) within half of a core's 64 KB
MAX_PIECES = 64


def build(target: str, step, buffers: dict, params: dict):
    op, attrs = step.attrs["head"]["op"], step.attrs["head"]["attrs"]
    param = operand(step.inputs[0], buffers[step.inputs[0]])
    out = operand(step.outputs[0], buffers[step.outputs[0]])
    if op == "causal_cache_mask":
        rows, row = attrs["n_new"], attrs["size"]
    else:
        rows, row = 1, math.prod(out.shape)
    # one output object: the whole row, or (a length mask) pieces of the catalog's chunk
    piece = row_streaming.row_piece(row, step.attrs["tiling"]["chunk"]) if op == "length_mask" else row
    if 2 * piece * out.dtype.itemsize > HALF_L1:
        raise DesignError(f"{op} rows of {row}: two output rows exceed half of L1")
    pieces = row // piece
    if pieces > MAX_PIECES:
        raise DesignError(f"{op} of {row}: {pieces} pieces of {piece} (the design unrolls at most {MAX_PIECES})")
    if rows > 32:
        raise DesignError(f"{op} with {rows} rows: the design unrolls one call per row (at most 32)")
    io = iron()
    y_f32 = is_f32(out)
    p_ty, i32 = tensor(1, np.int32), np.int32
    row_ty = tensor(piece, out.dtype)
    fns = {"causal_cache_mask": ("mask_causal", [p_ty, row_ty, i32, i32, i32, i32]),
           "length_mask": ("mask_length", [p_ty, row_ty, i32, i32, i32]),
           "positions": ("mask_positions", [p_ty, row_ty, i32])}
    fn, types = fns[op]
    kernel = io.Kernel(fn, "maskgen.o", types)
    of_p = io.ObjectFifo(p_ty, depth=1, name="maskgen_param")
    of_y = io.ObjectFifo(row_ty, depth=2, name="maskgen_out")

    def body(p_fifo, y_fifo, k, n_rows):
        p = p_fifo.acquire(1)
        for r in range(n_rows * pieces):  # unrolled: the row (or piece) index is a constant of each call
            y = y_fifo.acquire(1)
            if op == "causal_cache_mask":
                k(p, y, y_f32, 1, row, r)
            elif op == "length_mask":
                k(p, y, y_f32, piece, r * piece)
            else:
                k(p, y, row)
            y_fifo.release(1)
        p_fifo.release(1)

    worker = io.Worker(body, [of_p.cons(), of_y.prod(), kernel, rows], tile=io.Tile(0, 2),
                       stack_size=STACK_BYTES)
    ends = RuntimeEnds(io)
    p_end, y_end = ends.fill(of_p, 0), ends.drain(of_y, 0)

    def sequence(p_arg, y_arg):
        p_end.fill(p_arg, tap=access.taps(io, param, param.index.reshape(-1)[:1])[0])
        for tap in access.taps(io, out, out.index.reshape(rows * pieces, piece)):
            y_end.drain(y_arg, tap=tap, wait=True)
    params.update({"cores": 1, "rows": rows, "row": row, "piece": piece,
                   "sequence": sequence_of(step, [param, out])})
    return program(io, target, [param, out], ends, [worker], sequence)


if __name__ == "__main__":
    design_cli.main(build)
