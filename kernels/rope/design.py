"""Rotary embedding design (catalog kind `rope`): rows of x (one head-dimension vector each) over the cores,
the cos / sin rows for each x row joined with it in the memtile (the access pattern repeats the [T, d]
tables over batch and heads; a table row that every x row shares is broadcast once). kernels/rope/rope.cc."""
from __future__ import annotations

import numpy as np

from kernels import design_cli, epilogue, row_streaming
from kernels.design_error import DesignError
from kernels.iron_program import iron, tensor
from kernels.step_operands import is_f32

KINDS = ("rope",)


def build(target: str, step, buffers: dict, params: dict):
    n_head = step.attrs.get("n_head", len(step.inputs))
    rows, row, per_row, shared, slots, out = row_streaming.split_operands(step, buffers)
    if row_streaming.row_piece(row, step.attrs["tiling"]["chunk"]) != row:
        raise DesignError(f"rope over rows of {row}: a head dimension must fit one chunk")
    i32 = np.int32
    rows_t = row_streaming.joined_type(per_row, row)
    shared_t = row_streaming.joined_type(shared, row, rows_t)
    opmap = row_streaming.operand_map(slots, per_row, shared, row)
    y_t, y_f32 = tensor(row, out.dtype), is_f32(out)
    vec_i, vec_f = tensor(epilogue.MAX_CHAIN, np.int32), tensor(epilogue.MAX_CHAIN, np.float32)
    fns = {"rope": ("rope_row", [rows_t, shared_t, y_t, i32, i32, vec_i, vec_i, i32, vec_f])}
    n_chain = len(step.attrs["chain"])
    io = iron()

    def body(rows_in, shared_in, y_out, chain, imm, opmap_buf, kernel, rows_per_core, npieces, passes):
        for _ in io.range_(rows_per_core):
            x = rows_in.acquire(1)
            sh = shared_in.acquire(1) if shared_in is not None else x
            y = y_out.acquire(1)
            kernel(x, sh, y, y_f32, row, opmap_buf, chain, n_chain, imm)
            rows_in.release(1)
            if shared_in is not None:
                shared_in.release(1)
            y_out.release(1)

    s = row_streaming.Streaming(rows, row, row, per_row, shared, out,
                                state=epilogue.epilogue_state(step, n_head, opmap))
    params.update({"chunk": step.attrs["tiling"]["chunk"]})
    return row_streaming.streaming(target, "rope", s, fns, body, step.attrs["tiling"]["cores"], params, step)


if __name__ == "__main__":
    design_cli.main(build)
