"""Elementwise design (catalog kind `eltwise`): the output's rows over the cores, streamed in pieces of the
catalog's chunk. A core's per-row operands are joined in the memtile into one object per piece; operands the
same for every row (a bias-like vector) are fetched once and broadcast. One kernel call per piece:
eltwise_unary / eltwise_binary / eltwise_glu with the fused chain (kernels/eltwise/eltwise.cc)."""
from __future__ import annotations

import numpy as np

from kernels import dataflow as df

KINDS = ("eltwise",)


def build(target: str, step, buffers: dict, params: dict):
    head = step.attrs["head"]
    op = head["op"]
    n_extra = sum(1 for c in step.attrs["chain"] if c["operand"] is not None)
    n_head = len(step.inputs) - n_extra
    if op == "glu":  # the two halves of the split axis become the two head operands
        axis = head["attrs"]["axis"]
        x = df.operand(step.inputs[0], buffers[step.inputs[0]], step.attrs["views"][0])
        a_idx, b_idx = np.split(x.index, 2, axis=axis)
        halves = {f"{x.name}#a": (a_idx, x), f"{x.name}#b": (b_idx, x)}
        rows, row, per_row, shared, opmap, out = _split_glu(step, buffers, halves)
        n_head = 2
    else:
        rows, row, per_row, shared, opmap, out = df.split_operands(step, buffers)
    piece = df.row_piece(row, step.attrs["tiling"]["chunk"])
    bf, i32, f32 = df.tensor(piece), np.int32, np.float32
    rows_t, shared_t = df.tensor(len(per_row) * piece), df.tensor(max(len(shared), 1) * piece)
    if not shared:
        shared_t = rows_t
    vec_i, vec_f = df.tensor(df.MAX_CHAIN, np.int32), df.tensor(df.MAX_CHAIN, np.float32)
    if op == "glu":
        kind, fn = "glu", ("eltwise_glu", [rows_t, shared_t, bf, i32, vec_i, vec_i, i32, vec_f])
    elif df.OPCODES[op] < df.OPCODES["add"]:
        kind, fn = "unary", ("eltwise_unary", [rows_t, shared_t, bf, i32, vec_i, i32, f32, vec_i, i32, vec_f])
    else:
        kind, fn = "binary", ("eltwise_binary", [rows_t, shared_t, bf, i32, vec_i, i32, vec_i, i32, vec_f])
    opcode = df.OPCODES.get(op, 0)
    imm0 = float(head["attrs"].get("factor", 0.0))
    n_chain = len(step.attrs["chain"])
    io = df.iron()

    def body(rows_in, shared_in, y_out, chain, imm, opmap_buf, kernel, rows_per_core, npieces, passes):
        for _ in io.range_(rows_per_core * npieces):
            x = rows_in.acquire(1)
            sh = shared_in.acquire(1) if shared_in is not None else x
            y = y_out.acquire(1)
            if kind == "unary":
                kernel(x, sh, y, piece, opmap_buf, opcode, imm0, chain, n_chain, imm)
            elif kind == "binary":
                kernel(x, sh, y, piece, opmap_buf, opcode, chain, n_chain, imm)
            else:
                kernel(x, sh, y, piece, opmap_buf, chain, n_chain, imm)
            rows_in.release(1)
            if shared_in is not None:
                shared_in.release(1)
            y_out.release(1)

    s = df.Streaming(rows, row, piece, per_row, shared, out, state=df.epilogue_state(step, n_head, opmap))
    params.update({"op": op, "chunk": step.attrs["tiling"]["chunk"]})
    return df.streaming(target, "eltwise", s, {kind: fn}, body, step.attrs["tiling"]["cores"], params)


def _split_glu(step, buffers, halves):
    """split_operands for GLU: input 0 is replaced by its two halves (a, b), then the epilogue operands."""
    out = df.operand(step.outputs[0], buffers[step.outputs[0]])
    shape = out.index.shape
    rows, row = int(np.prod(shape[:-1])), shape[-1]
    per_row, shared, codes = [], [], []
    sources = [(idx, o) for idx, o in halves.values()]
    for i in range(1, len(step.inputs)):
        o = df.operand(step.inputs[i], buffers[step.inputs[i]], step.attrs["views"][i])
        sources.append((o.index, o))
    for idx, o in sources:
        idx = np.broadcast_to(idx, shape).reshape(rows, row)
        if rows > 1 and (idx == idx[:1]).all():
            codes.append(1 << 8 | len(shared))
            shared.append(o.rows(idx[0]))
        else:
            codes.append(len(per_row))
            per_row.append(o.rows(idx))
    opmap = np.array(codes + [0] * (df.MAX_CHAIN - len(codes)), np.int32)
    return rows, row, per_row, shared, opmap, out.rows(out.index.reshape(rows, row))


if __name__ == "__main__":
    df.main(build)
