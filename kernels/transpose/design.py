"""Batched transpose design (catalog kind `transpose`): x [b, r, c] -> y [b, c, r] in bf16 (x in bf16, or fp32:
a conv output of odd width), or fp32 -> fp32 (an fp32 entry input copied into an fp32 entry output), through the
cores (kernels/transpose), for the access patterns the DMAs cannot do at bf16 granularity (an innermost stride
other than 1). The compiler folds transposes into access patterns; where a row-reading kernel's operand would
need an element-granular one, sdk/compiler/layout.py (route_transposes) puts a transpose step before it: the
step reads x through the operand's views row by row and writes y contiguous, which the reader reads through a
reshape."""
from __future__ import annotations

import numpy as np

from kernels import design_cli, per_core
from kernels.design_error import DesignError
from kernels.iron_program import BF16, iron, tensor
from kernels.step_operands import operand
from sdk.compiler.hardware import TARGETS

KINDS = ("transpose",)
TILE_BYTES = 8 * 1024


def build(target: str, step, buffers: dict, params: dict):
    hw = TARGETS[target]
    x = operand(step.inputs[0], buffers[step.inputs[0]], step.attrs["views"][0])
    out = operand(step.outputs[0], buffers[step.outputs[0]])
    if x.dtype not in (BF16, np.float32) or out.dtype not in (BF16, x.dtype) or x.index.ndim != 3:
        raise DesignError("the transpose kernel moves bf16 or fp32 [b, r, c] tensors into bf16, or fp32 into fp32")
    b, r, c = x.shape
    oi = out.index.reshape(b, c, r)
    # A tile of rt_ rows x all c columns writes rt_-long runs of each output row: whole 32-bit words when rt_ is
    # even (or the whole row). When no such tile fits (r odd and too long: the conformer's 20 s bucket, r = 251),
    # a tile of all r rows x cc columns writes cc whole output rows, one contiguous run of cc x r elements: whole
    # words when cc is even. Either way the tile divides the tensor and every transfer moves whole words.
    size = x.dtype.itemsize   # an fp32 tile holds half the elements
    rows = [d for d in range(1, r + 1) if r % d == 0 and d * c * size <= TILE_BYTES and (d % 2 == 0 or d == r)]
    cols = [d for d in range(2, c + 1, 2) if c % d == 0 and r * d * size <= TILE_BYTES]
    if rows:
        rt_, ct_ = max(rows), c
        items = [(i, j * rt_, 0) for i in range(b) for j in range(r // rt_)]
    elif cols:
        rt_, ct_ = r, max(cols)
        items = [(i, 0, j * ct_) for i in range(b) for j in range(c // ct_)]
    else:
        raise DesignError(f"transpose of bf16 [{b}, {r}, {c}]: no tile of {TILE_BYTES} bytes moves whole 32-bit "
                          "words (an even number of rows, or all rows and an even number of columns)")
    cores = max(k for k in range(1, min(step.attrs["tiling"].get("cores", hw.columns), hw.columns, len(items)) + 1)
                if len(items) % k == 0)
    x_core = [np.stack([x.index[i, j:j + rt_, q:q + ct_] for i, j, q in items[k::cores]]) for k in range(cores)]
    y_core = [np.stack([oi[i, q:q + ct_, j:j + rt_] for i, j, q in items[k::cores]]) for k in range(cores)]
    io = iron()
    i32 = np.int32
    t, t_x = tensor(rt_ * ct_, out.dtype), tensor(rt_ * ct_, x.dtype)
    symbol = {(2, 2): "transpose_bf16", (4, 2): "transpose_f32_bf16", (4, 4): "transpose_f32"}[size, out.dtype.itemsize]
    kernel = io.Kernel(symbol, "transpose.o", [t_x, t, i32, i32, i32])

    def body(x_in, y_out, k, n_items):
        for _ in io.range_(n_items):
            xt, yt = x_in.acquire(1), y_out.acquire(1)
            k(xt, yt, 1, rt_, ct_)
            x_in.release(1)
            y_out.release(1)

    params.update({"rows_per_call": rt_, "columns_per_call": ct_, "items_per_core": len(items) // cores})
    return per_core.per_core_design(target, "transpose", [per_core.Stream(x, t_x, x_core)],
                                    per_core.Stream(out, t, y_core), [kernel], {}, body, [len(items) // cores],
                                    params, step)


if __name__ == "__main__":
    design_cli.main(build)
