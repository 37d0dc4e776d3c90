"""max_pool2d design (catalog kind `pool`: the ResNet stem), one output row per kernel call: each core takes
a set of (image, channel block) items and streams, per output row, the band of input rows it reads (clamped
at the image edges; the kernel skips those rows, knowing its row from a counter in L1). kernels/pool/pool.cc."""
from __future__ import annotations

import numpy as np

from kernels import design_cli, per_core
from kernels.iron_program import iron, tensor
from kernels.step_operands import is_f32, operand
from sdk.compiler.hardware import TARGETS

KINDS = ("pool",)
BAND_BYTES = 12 * 1024


def build(target: str, step, buffers: dict, params: dict):
    hw = TARGETS[target]
    a = step.attrs["head"]["attrs"]
    k, s, p = a["kernel"], a["stride"], a.get("padding", 0)
    x = operand(step.inputs[0], buffers[step.inputs[0]], step.attrs["views"][0])
    out = operand(step.outputs[0], buffers[step.outputs[0]])
    B, C, H, W = x.shape
    ho, wo = out.shape[2], out.shape[3]
    cb = max(c for c in range(1, C + 1) if C % c == 0 and c * k * W * x.dtype.itemsize <= BAND_BYTES)
    items = [(b, j) for b in range(B) for j in range(C // cb)]
    cores = max(c for c in range(1, min(step.attrs["tiling"]["cores"], hw.columns, len(items)) + 1)
                if len(items) % c == 0)
    bh = min(k, H)
    rows = np.clip(np.arange(ho) * s - p, 0, H - bh)[:, None] + np.arange(bh)[None]
    x_core, y_core = [], []
    for c in range(cores):
        mine = items[c::cores]
        x_core.append(np.stack([x.index[b, j * cb:(j + 1) * cb][:, rows].transpose(1, 0, 2, 3)
                                for b, j in mine]).reshape(-1, cb, bh, W))                   # one band per row
        y_core.append(np.stack([out.index[b, j * cb:(j + 1) * cb].transpose(1, 0, 2) for b, j in mine]).reshape(-1, cb, wo))
    io = iron()
    i32 = np.int32
    x_t, y_t, oy_t = tensor(cb * bh * W, x.dtype), tensor(cb * wo, out.dtype), tensor(1, np.int32)
    kernel = io.Kernel("maxpool_row", "pool.o", [x_t, i32, y_t, i32, i32, i32, i32, i32, i32, i32, i32, i32, oy_t])
    x_f32, y_f32 = is_f32(x), is_f32(out)

    def body(x_in, y_out, oy, pool, n_rows):
        for _ in io.range_(n_rows):
            xt, yt = x_in.acquire(1), y_out.acquire(1)
            pool(xt, x_f32, yt, y_f32, cb, W, k, s, p, wo, H, ho, oy)
            x_in.release(1)
            y_out.release(1)

    params.update({"channels_per_call": cb, "items_per_core": len(items) // cores})
    return per_core.per_core_design(target, "pool", [per_core.Stream(x, x_t, x_core)],
                                    per_core.Stream(out, y_t, y_core), [kernel],
                                    {"oy": (1, np.int32, np.zeros(1, np.int32))}, body,
                                    [len(items) // cores * ho], params, step)


if __name__ == "__main__":
    design_cli.main(build)
