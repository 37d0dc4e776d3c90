"""On-device argmax design (catalog kind `argmax`): greedy decoding picks the token on the device, so only
one int32 per row crosses to the host. Rows over the cores; a row longer than the chunk (a vocabulary)
streams piece by piece into a running (best, index) in L1. kernels/argmax/argmax.cc."""
from __future__ import annotations

import math

import numpy as np

from kernels import dataflow as df

KINDS = ("argmax",)


def build(target: str, step, buffers: dict, params: dict):
    x = df.operand(step.inputs[0], buffers[step.inputs[0]], step.attrs["views"][0])
    axis = step.attrs["head"]["attrs"].get("axis", -1)
    if axis not in (-1, x.index.ndim - 1):
        raise df.DesignError(f"argmax over axis {axis}: the kernel reduces the last axis")
    row = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    out = df.operand(step.outputs[0], buffers[step.outputs[0]])  # int32, one per row
    piece = df.row_piece(row, step.attrs["tiling"]["chunk"])
    bf, i32, x_f32 = df.tensor(piece * x.dtype.itemsize // 2), np.int32, df.is_f32(x)  # the joined object
    best_t, idx_t = df.tensor(1, np.float32), df.tensor(1, np.int32)
    fns = {"begin": ("argmax_begin", [best_t, idx_t]), "chunk": ("argmax_chunk", [bf, i32, i32, i32, best_t, idx_t]),
           "store": ("argmax_store", [idx_t, idx_t])}
    io = df.iron()

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

    s = df.Streaming(rows, row, piece, [x.rows(x.index.reshape(rows, row))], [], out.rows(out.index.reshape(rows, 1)),
                     out_row=1, out_dtype=np.dtype(np.int32),
                     state={"best": (1, np.float32, None), "index": (1, np.int32, None)})
    params.update({"chunk": step.attrs["tiling"]["chunk"]})
    return df.streaming(target, "argmax", s, fns, body, step.attrs["tiling"]["cores"], params, step)


if __name__ == "__main__":
    df.main(build)
