"""Elementwise design (catalog kind `eltwise`, float chains and int32 add / sub / mul): the output's rows over
the cores, streamed in pieces of the catalog's chunk. A core's per-row operands are joined in the memtile into one object per piece; operands the
same for every row (a bias-like vector) are fetched once and broadcast. One kernel call per piece:
eltwise_unary / eltwise_binary / eltwise_glu with the fused chain (kernels/eltwise/eltwise.cc)."""
from __future__ import annotations

import numpy as np

from kernels import design_cli, epilogue, row_streaming
from kernels.design_error import DesignError
from kernels.iron_program import iron, tensor
from kernels.step_operands import is_f32, operand

KINDS = ("eltwise",)


def build(target: str, step, buffers: dict, params: dict):
    head = step.attrs["head"]
    op = head["op"]
    n_head = step.attrs.get("n_head", len(step.inputs))
    sources = None
    if op == "glu":  # the two halves of the split axis become the two head operands
        x = operand(step.inputs[0], buffers[step.inputs[0]], step.attrs["views"][0])
        halves = np.split(x.index, 2, axis=head["attrs"]["axis"])
        sources = [x.rows(h) for h in halves] + [operand(n, buffers[n], step.attrs["views"][i])
                                                 for i, n in enumerate(step.inputs) if i >= 1 and n is not None]
        n_head = 2
    rows, row, per_row, shared, slots, out = row_streaming.split_operands(step, buffers, sources)
    piece = row_streaming.row_piece(row, step.attrs["tiling"]["chunk"])
    opmap = row_streaming.operand_map(slots, per_row, shared, piece)
    i32, f32 = np.int32, np.float32
    rows_t = row_streaming.joined_type(per_row, piece)
    shared_t = row_streaming.joined_type(shared, piece, rows_t)
    y_t, y_f32 = tensor(piece, out.dtype), is_f32(out)
    vec_i, vec_f = tensor(epilogue.MAX_CHAIN, np.int32), tensor(epilogue.MAX_CHAIN, np.float32)
    if out.dtype == np.int32:
        if op not in ("add", "sub", "mul") or step.attrs["chain"]:
            raise DesignError(f"integer {op}: the kernel does int32 add / sub / mul without a chain")
        kind, fn = "int", ("eltwise_int", [rows_t, shared_t, y_t, i32, vec_i, i32])
    elif op == "glu":
        kind, fn = "glu", ("eltwise_glu", [rows_t, shared_t, y_t, i32, i32, vec_i, vec_i, i32, vec_f])
    elif epilogue.OPCODES[op] < epilogue.OPCODES["add"]:
        kind, fn = "unary", ("eltwise_unary", [rows_t, shared_t, y_t, i32, i32, vec_i, i32, f32, vec_i, i32, vec_f])
    else:
        kind, fn = "binary", ("eltwise_binary", [rows_t, shared_t, y_t, i32, i32, vec_i, i32, vec_i, i32, vec_f])
    opcode = epilogue.OPCODES.get(op, 0)
    imm0 = float(head["attrs"].get("factor", 0.0))
    n_chain = len(step.attrs["chain"])
    io = iron()

    def body(rows_in, shared_in, y_out, chain, imm, opmap_buf, kernel, rows_per_core, npieces, passes):
        for _ in io.range_(rows_per_core * npieces):
            x = rows_in.acquire(1)
            sh = shared_in.acquire(1) if shared_in is not None else x
            y = y_out.acquire(1)
            if kind == "int":
                kernel(x, sh, y, piece, opmap_buf, opcode)
            elif kind == "unary":
                kernel(x, sh, y, y_f32, piece, opmap_buf, opcode, imm0, chain, n_chain, imm)
            elif kind == "binary":
                kernel(x, sh, y, y_f32, piece, opmap_buf, opcode, chain, n_chain, imm)
            else:
                kernel(x, sh, y, y_f32, piece, opmap_buf, chain, n_chain, imm)
            rows_in.release(1)
            if shared_in is not None:
                shared_in.release(1)
            y_out.release(1)

    s = row_streaming.Streaming(rows, row, piece, per_row, shared, out,
                                state=epilogue.epilogue_state(step, n_head, opmap))
    params.update({"op": op, "chunk": step.attrs["tiling"]["chunk"]})
    return row_streaming.streaming(target, "eltwise", s, {kind: fn}, body, step.attrs["tiling"]["cores"], params, step)


if __name__ == "__main__":
    design_cli.main(build)
