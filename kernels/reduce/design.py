"""mean design (catalog kind `reduce`). Two shapes of work, both on the streaming skeleton:
- trailing axes (ResNet's global average pool, [B, C, H, W] over (2, 3)): a work item is G output values;
  its G input rows stream one per object into reduce_rows, then one store of G means;
- one outer axis (ESM's masked mean, [B, T, C] over 1): a work item is one output vector [C]; its T rows
  stream into reduce_cols, then one store. kernels/reduce/reduce.cc.
Epilogue operands with one value per work item (ESM's token-dropout rescale) ride in every input object of the
item as fp32 scalars; the store reads them from the item's last object (reduce_mean_store_operands). Operands
that vary within a work item are refused."""
from __future__ import annotations

import math

import numpy as np

from kernels import design_cli, epilogue, row_streaming
from kernels.design_error import DesignError
from kernels.iron_program import iron, tensor
from kernels.step_operands import is_f32, operand

KINDS = ("reduce",)


def build(target: str, step, buffers: dict, params: dict):
    x = operand(step.inputs[0], buffers[step.inputs[0]], step.attrs["views"][0])
    out = operand(step.outputs[0], buffers[step.outputs[0]])
    axes = step.attrs["head"]["attrs"]["axis"]
    axes = sorted({a % x.index.ndim for a in np.atleast_1d(axes)})
    nd = x.index.ndim
    chunk = step.attrs["tiling"]["chunk"]
    if axes == list(range(axes[0], nd)):      # trailing axes
        rows, row = math.prod(x.shape[:axes[0]]), math.prod(x.shape[axes[0]:])
        if row > chunk:
            raise DesignError(f"mean over {row} trailing elements: a row must fit the chunk {chunk}")
        group = max(g for g in range(1, min(rows, 64) + 1) if rows % g == 0 and (g % 2 == 0 or g == rows))
        items, piece, out_row, count, mode = rows // group, row, group, row, "rows"
        x_rows = x.index.reshape(items, group * row)
    elif len(axes) == 1:                       # one outer axis
        a = axes[0]
        outer, red, inner = math.prod(x.shape[:a]), x.shape[a], math.prod(x.shape[a + 1:])
        if inner > chunk:
            raise DesignError(f"mean over axis {a} with rows of {inner}: a row must fit the chunk {chunk}")
        items, piece, out_row, count, mode = outer, inner, inner, red, "cols"
        x_rows = x.index.reshape(outer, red * inner)
    else:
        raise DesignError(f"mean over axes {axes}: the design reduces trailing axes or one axis")
    if out_row * out.dtype.itemsize % 4 or piece * x.dtype.itemsize % 4:
        raise DesignError(f"a mean moving {out_row} values per work item is not whole 32-bit words: "
                          f"pad rows to even")
    operands = _item_operands(step, buffers, out, items, out_row)
    per_row = [x.rows(x_rows)] + operands
    opmap = row_streaming.operand_map([("row", i) for i in range(len(per_row))], per_row, [], piece) \
        if operands else None
    bf, i32, x_f32 = row_streaming.joined_type(per_row, piece), np.int32, is_f32(x)  # the joined object
    acc_t, at_t, out_t = tensor(out_row, np.float32), tensor(1, np.int32), tensor(out_row, out.dtype)
    ch = [tensor(epilogue.MAX_CHAIN, np.int32), tensor(epilogue.MAX_CHAIN, np.float32)]
    fns = {"zero": ("reduce_zero", [acc_t, i32, at_t]), "rows": ("reduce_rows", [bf, i32, acc_t, i32, i32, at_t]),
           "cols": ("reduce_cols", [bf, i32, acc_t, i32, i32]),
           "store": ("reduce_mean_store", [acc_t, out_t, i32, i32, i32, ch[0], i32, ch[1]]) if not operands else
           ("reduce_mean_store_operands", [acc_t, out_t, i32, i32, i32, ch[0], i32, ch[1], bf, ch[0]])}
    n_chain = len(step.attrs["chain"])
    io = iron()

    def body(x_fifo, _shared, y_fifo, acc, at, chain, imm, *rest):
        opmap_buf, rest = (rest[0], rest[1:]) if operands else (None, rest)
        zero, krows, kcols, store, items_per_core, npieces, passes = rest

        def piece_in(xs):
            if mode == "rows":
                krows(xs, x_f32, acc, 1, piece, at)
            else:
                kcols(xs, x_f32, acc, 1, piece)

        for _ in io.range_(items_per_core):
            zero(acc, out_row, at)
            for _ in io.range_(npieces - 1 if operands else npieces):
                xs = x_fifo.acquire(1)
                piece_in(xs)
                x_fifo.release(1)
            if operands:  # the item's last object also carries the epilogue's operands for the store
                xs = x_fifo.acquire(1)
                piece_in(xs)
            y = y_fifo.acquire(1)
            if operands:
                store(acc, y, is_f32(out), out_row, count, chain, n_chain, imm, xs, opmap_buf)
                x_fifo.release(1)
            else:
                store(acc, y, is_f32(out), out_row, count, chain, n_chain, imm)
            y_fifo.release(1)

    state = {"acc": (out_row, np.float32, None), "at": (1, np.int32, None), **epilogue.epilogue_state(step, 1, opmap)}
    s = row_streaming.Streaming(items, x_rows.shape[1], piece, per_row, [], out.rows(out.index.reshape(items, out_row)),
                                out_row=out_row, out_dtype=out.dtype, state=state)
    params.update({"chunk": chunk, "mode": mode, "group": out_row})
    return row_streaming.streaming(target, "reduce", s, fns, body, step.attrs["tiling"]["cores"], params, step)


def _item_operands(step, buffers, out, items: int, out_row: int) -> list:
    """The chain's operands (kernel inputs 1, 2, ...) as fp32 scalars, one value per work item."""
    used = sorted({c["operand"] for c in step.attrs["chain"] if c["operand"] is not None})
    if used != list(range(1, len(used) + 1)):
        raise DesignError("mean with an epilogue whose operands are not its inputs 1, 2, ...: not expressed")
    found = []
    for i in used:
        o = operand(step.inputs[i], buffers[step.inputs[i]], step.attrs["views"][i])
        idx = np.broadcast_to(o.index, out.index.shape).reshape(items, out_row)
        if not (idx == idx[:, :1]).all() or o.dtype != np.float32:
            raise DesignError("mean with an epilogue that reads an operand varying within a work item (or not "
                              "fp32): not expressed by this design")
        found.append(o.rows(idx[:, :1], scalar=True))
    return found


if __name__ == "__main__":
    design_cli.main(build)
