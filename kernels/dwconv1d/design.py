"""Depthwise conv1d design (a catalog `conv` step with groups = channels: the conformer convolution module):
a core takes blocks of channels with their whole time axis (bf16 or fp32 rows) and their K taps as one weight
object, and writes the block's output rows. With a bias, the block's fp32 biases follow each input object on the
input stream, repeated to fill one object (two transfers when a row is odd: the whole repeats, then the part of
one more), and the kernel reads them from there. kernels/dwconv1d/dwconv1d.cc."""
from __future__ import annotations

import numpy as np

from kernels import design_cli, epilogue, per_core
from kernels.design_error import DesignError
from kernels.iron_program import iron, tensor
from kernels.step_operands import is_f32, operand
from sdk.compiler.hardware import TARGETS

KINDS = ("conv",)
X_BYTES = 12 * 1024


def build(target: str, step, buffers: dict, params: dict):
    hw = TARGETS[target]
    a = step.attrs["head"]["attrs"]
    if any(c["operand"] is not None for c in step.attrs["chain"]):
        raise DesignError("a depthwise convolution epilogue that reads an operand is not expressed")
    x = operand(step.inputs[0], buffers[step.inputs[0]], step.attrs["views"][0])
    w = operand(step.inputs[1], buffers[step.inputs[1]])
    has_bias = len(step.inputs) > 2 and step.inputs[2] is not None
    out = operand(step.outputs[0], buffers[step.outputs[0]])
    B, C, L = x.shape
    K, to = w.shape[-1], out.shape[-1]
    stride, pad = a.get("stride", 1), a.get("padding", 0)
    bias = operand(step.inputs[2], buffers[step.inputs[2]]) if has_bias else None
    x_bytes = lambda c: c * L * x.dtype.itemsize  # noqa: E731
    fits = [c for c in range(1, C + 1) if C % c == 0 and x_bytes(c) <= X_BYTES and (c * K) % 2 == 0
            and x_bytes(c) % 4 == 0 and (c * to * out.dtype.itemsize) % 4 == 0
            and (bias is None or x_bytes(c) >= c * bias.dtype.itemsize)]
    if not fits:
        raise DesignError("depthwise conv1d with a bias: its biases do not pack into whole input objects "
                          "(an odd length of bf16 rows)" if bias is not None else
                          "no block of channels is whole 32-bit words within the input object")
    cb = max(fits)
    items = [(b, j) for b in range(B) for j in range(C // cb)]
    cores = max(c for c in range(1, min(step.attrs["tiling"]["cores"], hw.columns, len(items)) + 1)
                if len(items) % c == 0)
    wi = w.index.reshape(C, K)
    x_core, w_core, y_core = [], [], []
    for c in range(cores):
        mine = items[c::cores]
        x_core.append(np.stack([x.index[b, j * cb:(j + 1) * cb] for b, j in mine]))
        w_core.append(np.stack([wi[j * cb:(j + 1) * cb] for _, j in mine]))
        y_core.append(np.stack([out.index[b, j * cb:(j + 1) * cb] for b, j in mine]))
    if bias is not None:  # each item's biases, repeated to fill one input object, follow its input object
        words = x_bytes(cb) // bias.dtype.itemsize
        repeat, rest = divmod(words, cb)   # an odd row length (T = 63, 251) leaves part of one more repeat

        def filled(block):
            pieces = (np.broadcast_to(block, (repeat, cb)),) + ((block[:rest],) if rest else ())
            return pieces if rest else pieces[0]
        b_core = [[filled(bias.index[j * cb:(j + 1) * cb]) for _, j in items[c::cores]] for c in range(cores)]
    io = iron()
    i32 = np.int32
    x_t, w_t, y_t = tensor(cb * L, x.dtype), tensor(cb * K), tensor(cb * to, out.dtype)
    b_t = tensor(1, np.float32)
    vec_i, vec_f = tensor(epilogue.MAX_CHAIN, np.int32), tensor(epilogue.MAX_CHAIN, np.float32)
    kernel = io.Kernel("dwconv1d", "dwconv1d.o", [x_t, i32, w_t, x_t if has_bias else b_t, i32, y_t, i32, i32, i32,
                                                  i32, i32, i32, i32, vec_i, i32, vec_f])
    words, imms = epilogue.encode_chain(step.attrs["chain"], 3)
    n_chain, x_f32, y_f32 = len(step.attrs["chain"]), is_f32(x), is_f32(out)

    def body(x_in, w_in, y_out, no_bias, chain, imm, conv, n_items):
        for _ in io.range_(n_items):
            xt, wt, yt = x_in.acquire(1), w_in.acquire(1), y_out.acquire(1)
            bt = x_in.acquire(1) if has_bias else no_bias  # the biases follow the input object
            conv(xt, x_f32, wt, bt, int(has_bias), yt, y_f32, cb, L, to, K, stride, pad, chain, n_chain, imm)
            x_in.release(2 if has_bias else 1)
            w_in.release(1)
            y_out.release(1)

    state = {"no_bias": (1, np.float32, None), "chain": (epilogue.MAX_CHAIN, np.int32, words),
             "imm": (epilogue.MAX_CHAIN, np.float32, imms)}
    params.update({"channels_per_call": cb, "items_per_core": len(items) // cores})
    x_stream = per_core.Stream(x, x_t, x_core, follow=(bias, b_core) if has_bias else None)
    return per_core.per_core_design(target, "dwconv1d", [x_stream, per_core.Stream(w, w_t, w_core)],
                                    per_core.Stream(out, y_t, y_core), [kernel], state, body, [len(items) // cores],
                                    params, step)


if __name__ == "__main__":
    design_cli.main(build)
