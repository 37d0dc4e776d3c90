"""Batched transpose design (catalog kind `transpose`): x [b, r, c] -> y [b, c, r] in bf16 through the cores
(kernels/transpose), for the access patterns the DMAs cannot do at bf16 granularity (an innermost stride other
than 1). The compiler folds transposes into access patterns; where a row-reading kernel's bf16 operand would
need an element-granular one, sdk/compiler/layout.py (route_transposes) puts a transpose step before it: the
step reads x through the operand's views row by row and writes y contiguous, which the reader reads through a
reshape."""
from __future__ import annotations

import numpy as np

from kernels import dataflow as df
from sdk.compiler.hardware import TARGETS

KINDS = ("transpose",)
TILE_BYTES = 8 * 1024


def build(target: str, step, buffers: dict, params: dict):
    hw = TARGETS[target]
    x = df.operand(step.inputs[0], buffers[step.inputs[0]], step.attrs["views"][0])
    out = df.operand(step.outputs[0], buffers[step.outputs[0]])
    if x.dtype != df.BF16 or x.index.ndim != 3:
        raise df.DesignError("the transpose kernel moves bf16 [b, r, c] tensors")
    b, r, c = x.shape
    rt_ = max(d for d in range(1, r + 1) if r % d == 0 and d * c * 2 <= TILE_BYTES and (d % 2 == 0 or d == r))
    items = [(i, j) for i in range(b) for j in range(r // rt_)]
    cores = max(k for k in range(1, min(step.attrs["tiling"].get("cores", hw.columns), hw.columns, len(items)) + 1)
                if len(items) % k == 0)
    oi = out.index.reshape(b, c, r)
    x_core = [np.stack([x.index[i, j * rt_:(j + 1) * rt_] for i, j in items[k::cores]]) for k in range(cores)]
    y_core = [np.stack([oi[i, :, j * rt_:(j + 1) * rt_] for i, j in items[k::cores]]) for k in range(cores)]
    io = df.iron()
    i32 = np.int32
    t = df.tensor(rt_ * c)
    kernel = io.Kernel("transpose_bf16", "transpose.o", [t, t, i32, i32, i32])

    def body(x_in, y_out, k, n_items):
        for _ in io.range_(n_items):
            xt, yt = x_in.acquire(1), y_out.acquire(1)
            k(xt, yt, 1, rt_, c)
            x_in.release(1)
            y_out.release(1)

    params.update({"rows_per_call": rt_, "items_per_core": len(items) // cores})
    return df.per_core_design(target, "transpose", [df.Stream(x, t, x_core)], df.Stream(out, t, y_core), [kernel],
                              {}, body, [len(items) // cores], params, step)


if __name__ == "__main__":
    df.main(build)
