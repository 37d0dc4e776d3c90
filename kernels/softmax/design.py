"""softmax / log_softmax design (catalog kind `softmax`): rows over the cores. A row that fits the catalog's
chunk is resident while the three phases run (max, sum of exps, store); a longer row (a vocabulary) streams
through one core three times (kernels/softmax/softmax.cc)."""
from __future__ import annotations

import numpy as np

from kernels import design_cli, epilogue, row_streaming
from kernels.design_error import DesignError
from kernels.iron_program import iron, tensor
from kernels.step_operands import is_f32

KINDS = ("softmax",)


def build(target: str, step, buffers: dict, params: dict):
    n_head = step.attrs.get("n_head", len(step.inputs))
    axis = step.attrs["head"]["attrs"].get("axis", -1)
    if axis not in (-1, len(buffers[step.outputs[0]].shape) - 1):
        raise DesignError(f"softmax over axis {axis}: the kernel reduces the last axis")
    rows, row, per_row, shared, slots, out = row_streaming.split_operands(step, buffers)
    piece = row_streaming.row_piece(row, step.attrs["tiling"]["chunk"])
    log = int(step.attrs["head"]["op"] == "log_softmax")
    passes = 1 if piece == row else 3
    i32 = np.int32
    rows_t = row_streaming.joined_type(per_row, piece)
    shared_t = row_streaming.joined_type(shared, piece, rows_t)
    opmap = row_streaming.operand_map(slots, per_row, shared, piece)
    y_t, y_f32 = tensor(piece, out.dtype), is_f32(out)
    st_t = tensor(2, np.float32)
    vec_i, vec_f = tensor(epilogue.MAX_CHAIN, np.int32), tensor(epilogue.MAX_CHAIN, np.float32)
    fns = {"begin": ("softmax_begin", [st_t]), "max": ("softmax_max", [rows_t, shared_t, i32, vec_i, st_t]),
           "sum": ("softmax_sum", [rows_t, shared_t, i32, vec_i, st_t]),
           "store": ("softmax_store", [rows_t, shared_t, y_t, i32, i32, vec_i, st_t, i32, vec_i, i32, vec_f])}
    n_chain = len(step.attrs["chain"])
    io = iron()

    def body(rows_in, shared_in, y_out, st, chain, imm, opmap_buf, begin, kmax, ksum, store,
             rows_per_core, npieces, n_passes):
        def take():
            x = rows_in.acquire(1)
            return x, shared_in.acquire(1) if shared_in is not None else x

        def give():
            rows_in.release(1)
            if shared_in is not None:
                shared_in.release(1)

        for _ in io.range_(rows_per_core):
            begin(st)
            if n_passes == 1:  # the row is resident: every phase on one object
                x, sh = take()
                y = y_out.acquire(1)
                kmax(x, sh, piece, opmap_buf, st)
                ksum(x, sh, piece, opmap_buf, st)
                store(x, sh, y, y_f32, piece, opmap_buf, st, log, chain, n_chain, imm)
                give()
                y_out.release(1)
                continue
            for phase in (kmax, ksum):
                for _ in io.range_(npieces):
                    x, sh = take()
                    phase(x, sh, piece, opmap_buf, st)
                    give()
            for _ in io.range_(npieces):
                x, sh = take()
                y = y_out.acquire(1)
                store(x, sh, y, y_f32, piece, opmap_buf, st, log, chain, n_chain, imm)
                give()
                y_out.release(1)

    state = {"st": (2, np.float32, None), **epilogue.epilogue_state(step, n_head, opmap)}
    s = row_streaming.Streaming(rows, row, piece, per_row, shared, out, passes=passes, state=state)
    params.update({"chunk": step.attrs["tiling"]["chunk"], "log": log})
    return row_streaming.streaming(target, "softmax", s, fns, body, step.attrs["tiling"]["cores"], params, step)


if __name__ == "__main__":
    design_cli.main(build)
