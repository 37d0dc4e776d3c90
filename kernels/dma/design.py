"""Data-movement designs (catalog kinds copy, concat, pad, state_write, gather): no core code, shim ->
memtile -> shim transfers whose access patterns do the work. copy reads its operand through its view chain;
concat writes each input into its slice of the output; assign (a state write of a whole buffer) is a copy.
What needs addresses only known at run time is refused and listed in kernels/README.md: cache_write at the
position parameter (a scratchpad-parameter drain offset), gather by token id (data-dependent addresses), and
pad (a constant fill)."""
from __future__ import annotations

import numpy as np

from kernels import dataflow as df

KINDS = ("copy", "concat", "pad", "state_write", "gather")
OBJ_BYTES = 16 * 1024


def build(target: str, step, buffers: dict, params: dict):
    op = step.attrs["head"]["op"]
    out = df.operand(step.outputs[0], buffers[step.outputs[0]])
    if op == "copy":
        sources = [(df.operand(step.inputs[0], buffers[step.inputs[0]], step.attrs["views"][0]), out.index)]
    elif op == "assign":
        src = df.operand(step.inputs[1], buffers[step.inputs[1]], step.attrs["views"][1])
        sources = [(src.rows(np.broadcast_to(src.index, out.shape)), out.index)]
    elif op == "concat":
        axis = step.attrs["head"]["attrs"]["axis"] % out.index.ndim
        sources, at = [], 0
        for i, name in enumerate(step.inputs):
            o = df.operand(name, buffers[name], step.attrs["views"][i])
            n = o.shape[axis]
            sources.append((o, np.take(out.index, np.arange(at, at + n), axis=axis)))
            at += n
    elif op == "cache_write":
        raise df.DesignError("cache_write at the position parameter needs a drain offset set at run time "
                             "(a scratchpad parameter); not expressed by this design")
    elif op == "embedding":
        raise df.DesignError("gather by token id needs data-dependent DMA addresses; not expressed by this design")
    else:
        raise df.DesignError(f"{op}: a constant fill is not expressed by this design")
    if any(o.dtype != out.dtype for o, _ in sources):
        raise df.DesignError(f"{op} between dtypes: the DMAs move bytes, not conversions")
    io = df.iron()
    elems = []
    for o, dst in sources:
        n = o.index.size
        piece = max(d for d in range(1, n + 1) if n % d == 0 and d * o.dtype.itemsize <= OBJ_BYTES
                    and (d * o.dtype.itemsize) % 4 == 0)
        elems.append(piece)
    operands = [o for o, _ in sources] + [out]
    rt = io.Runtime()
    fifos = []
    for i, ((o, dst), piece) in enumerate(zip(sources, elems)):
        l3 = io.ObjectFifo(df.tensor(piece, o.dtype), depth=2, name=f"dma_in{i}")
        back = l3.cons().forward(placement=io.Tile(i % 4, 1), name=f"dma_out{i}", depth=2)
        fifos.append((l3, back, o, dst, piece, i % 4))
    with rt.sequence(*[df.tensor(o.elements, o.dtype) for o in operands]) as args:
        for i, (l3, back, o, dst, piece, col) in enumerate(fifos):
            for tap in df.taps(io, o, o.index):
                rt.fill(l3.prod(), args[i], tap=tap, placement=io.Tile(col, 0))
            for tap in df.taps(io, out, dst):
                rt.drain(back.cons(), args[-1], tap=tap, placement=io.Tile(col, 0), wait=True)
    params.update({"op": op, "pieces": elems})
    return io.Program(df.device(io, target), rt).resolve_program(io.SequentialPlacer())


if __name__ == "__main__":
    df.main(build)
