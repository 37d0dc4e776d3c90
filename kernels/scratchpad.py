"""Runtime parameters in buffer descriptors. A DMA whose address depends on a per-run value (the KV-cache row
at the position, an embedding row by token id) takes a scratchpad parameter (IRON's `ScratchpadParameter`,
`aiex.scratchpad_parameter`): a 32-bit word the host writes before each run, added to the BD's static base
address (`offset_parameter=` of a fill / drain, UPDATE_REG) in elements of the transfer's tensor (xdna-engine's
hardware probe of mlir-aie's scratchpad_addr_offset test: word 8 on an i32 tensor starts at element 8). The
static pattern is the one at value 0. The host computes each word from an int32 io-arena buffer it writes
anyway: word = value[element] * scale. The fused design gathers these specs into the manifest (`scratchpad`)
for the runtime."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from kernels.design_error import DesignError
from kernels.step_operands import Operand
from sdk.compiler import layout


def scratchpad_parameter(io: SimpleNamespace, params: dict, buffer: str, element: int, scale: int, limit: int):
    """The scratchpad word `buffer[element] * scale` (elements of the transfer's tensor); `limit` is the largest
    value the buffer may hold (the address then stays inside the tensor). Recorded in params["scratchpad"]."""
    name = "sp_" + "".join(c if c.isalnum() else "_" for c in buffer) + f"_{element}_x{scale}"
    params.setdefault("scratchpad", {})[name] = {"buffer": buffer, "element": int(element), "scale": int(scale),
                                                 "limit": int(limit)}
    return io.ScratchpadParameter(name, np.int32)


def runtime_row(cache: "Operand", n: int, views, axis: int) -> tuple[np.ndarray, int, int]:
    """Where each of the n elements of a value written into `cache` at a runtime position along `axis` lands,
    at position 0 (the drain's base), in the value's own order; plus the element stride of a position and the
    largest position that keeps the write inside the cache. `views` (the state write's, from the value to the
    cache's layout) start with a reshape, or there are none and the value has the cache slab's shape."""
    if views and views[0][0] != "reshape":
        raise DesignError("a KV-cache write whose view does not start with a reshape: not expressed")
    shape = list(cache.index.shape)
    shape[axis] = n // (math.prod(shape) // shape[axis])
    placed = layout.apply_views(np.arange(n, dtype=np.int64).reshape((n,) if views else shape), views)
    n_new = placed.shape[axis]
    slab = np.take(cache.index, np.arange(n_new), axis=axis)
    index = np.empty(n, np.int64)
    index[placed.reshape(-1)] = slab.reshape(-1)
    stride = int(np.take(cache.index, [1], axis=axis).reshape(-1)[0] - slab.reshape(-1)[0]) \
        if cache.index.shape[axis] > 1 else 0
    return index, stride, cache.index.shape[axis] - n_new
