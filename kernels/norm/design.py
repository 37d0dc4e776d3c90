"""layer_norm / rms_norm design (catalog kind `norm`): rows over the cores, the weight (and bias) rows
joined once in a memtile and broadcast. A row that fits the chunk is resident for all phases; a longer row
streams three times (sum, centred squares, store) through one core (kernels/norm/norm.cc)."""
from __future__ import annotations

import numpy as np

from kernels import design_cli, epilogue, row_streaming
from kernels.iron_program import iron, tensor
from kernels.step_operands import is_f32

KINDS = ("norm",)


def build(target: str, step, buffers: dict, params: dict):
    op = step.attrs["head"]["op"]
    n_head = step.attrs.get("n_head", len(step.inputs))
    has_bias = int(op == "layer_norm" and n_head > 2 and step.inputs[2] is not None)
    rows, row, per_row, shared, slots, out = row_streaming.split_operands(step, buffers)
    piece = row_streaming.row_piece(row, step.attrs["tiling"]["chunk"])
    passes = 1 if piece == row else 3
    centred = int(op == "layer_norm")
    eps = float(step.attrs["head"]["attrs"]["eps"])
    i32, f32 = np.int32, np.float32
    rows_t = row_streaming.joined_type(per_row, piece)
    shared_t = row_streaming.joined_type(shared, piece, rows_t)
    opmap = row_streaming.operand_map(slots, per_row, shared, piece)
    y_t, y_f32 = tensor(piece, out.dtype), is_f32(out)
    st_t = tensor(2, np.float32)
    vec_i, vec_f = tensor(epilogue.MAX_CHAIN, np.int32), tensor(epilogue.MAX_CHAIN, np.float32)
    fns = {"begin": ("norm_begin", [st_t]), "sum": ("norm_sum", [rows_t, shared_t, i32, vec_i, st_t]),
           "squares": ("norm_squares", [rows_t, shared_t, i32, vec_i, i32, i32, st_t]),
           "store": ("norm_store", [rows_t, shared_t, y_t, i32, i32, vec_i, i32, i32, i32, f32, st_t,
                                    vec_i, i32, vec_f])}
    n_chain = len(step.attrs["chain"])
    io = iron()

    def body(rows_in, shared_in, y_out, st, chain, imm, opmap_buf, begin, ksum, squares, store,
             rows_per_core, npieces, n_passes):
        def take():
            x = rows_in.acquire(1)
            return x, shared_in.acquire(1) if shared_in is not None else x

        def give():
            rows_in.release(1)
            if shared_in is not None:
                shared_in.release(1)

        def finish(x, sh):
            y = y_out.acquire(1)
            store(x, sh, y, y_f32, piece, opmap_buf, row, centred, has_bias, eps, st, chain, n_chain, imm)
            y_out.release(1)

        for _ in io.range_(rows_per_core):
            begin(st)
            if n_passes == 1:
                x, sh = take()
                if centred:
                    ksum(x, sh, piece, opmap_buf, st)
                squares(x, sh, piece, opmap_buf, row, centred, st)
                finish(x, sh)
                give()
                continue
            for phase in ("sum", "squares"):
                for _ in io.range_(npieces):
                    x, sh = take()
                    if phase == "sum" and centred:
                        ksum(x, sh, piece, opmap_buf, st)
                    elif phase == "squares":
                        squares(x, sh, piece, opmap_buf, row, centred, st)
                    give()
            for _ in io.range_(npieces):
                x, sh = take()
                finish(x, sh)
                give()

    state = {"st": (2, np.float32, None), **epilogue.epilogue_state(step, n_head, opmap)}
    s = row_streaming.Streaming(rows, row, piece, per_row, shared, out, passes=passes, state=state)
    params.update({"chunk": step.attrs["tiling"]["chunk"], "op": op})
    return row_streaming.streaming(target, "norm", s, fns, body, step.attrs["tiling"]["cores"], params, step)


if __name__ == "__main__":
    design_cli.main(build)
