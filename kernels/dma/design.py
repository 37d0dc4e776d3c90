"""Data-movement designs (catalog kinds copy, concat, pad, state_write, gather): no core code, shim ->
memtile -> shim transfers whose access patterns do the work. copy reads its operand through its view chain;
concat writes each input into its slice of the output; assign (a state write of a whole buffer) is a copy.
Addresses known only at run time come from scratchpad parameters (scratchpad.scratchpad_parameter): cache_write
drains at its row-0 pattern plus position x row stride; gather (embedding by token id) reads each row at the
table's row 0 plus id x row stride, one word per id. Refused (kernels/README.md): pad (a constant fill)."""
from __future__ import annotations

import numpy as np

from kernels import access, design_cli, scratchpad
from kernels.design_error import DesignError
from kernels.iron_program import RuntimeEnds, iron, program, tensor
from kernels.step_operands import operand, sequence_of

KINDS = ("copy", "concat", "pad", "state_write", "gather")
OBJ_BYTES = 16 * 1024


def build(target: str, step, buffers: dict, params: dict):
    op = step.attrs["head"]["op"]
    out = operand(step.outputs[0], buffers[step.outputs[0]])
    word = None   # (buffer, element, scale, limit) of a drain offset set at run time
    if op == "copy":
        sources = [(operand(step.inputs[0], buffers[step.inputs[0]], step.attrs["views"][0]), out.index)]
    elif op == "assign":
        src = operand(step.inputs[1], buffers[step.inputs[1]], step.attrs["views"][1])
        sources = [(src.rows(np.broadcast_to(src.index, out.shape)), out.index)]
    elif op == "concat":
        axis = step.attrs["head"]["attrs"]["axis"] % out.index.ndim
        sources, at = [], 0
        for i, name in enumerate(step.inputs):
            o = operand(name, buffers[name], step.attrs["views"][i])
            n = o.shape[axis]
            sources.append((o, np.take(out.index, np.arange(at, at + n), axis=axis)))
            at += n
    elif op == "cache_write":  # inputs (cache, value, pos): the value's rows drain at the runtime position
        value = operand(step.inputs[1], buffers[step.inputs[1]], step.attrs["views"][1])
        axis = step.attrs["head"]["attrs"]["axis"] % out.index.ndim
        dst, stride, limit = scratchpad.runtime_row(out, value.index.size, [], axis)
        sources = [(value, dst.reshape(value.shape))]
        word = (step.inputs[2], 0, stride, limit)
    elif op == "embedding":  # inputs (table, ids): row ids[i] of the table is read at row 0 + ids[i] x row stride
        return _gather(target, step, buffers, params, out)
    else:
        raise DesignError(f"{op}: a constant fill is not expressed by this design")
    if any(o.dtype != out.dtype for o, _ in sources):
        raise DesignError(f"{op} between dtypes: the DMAs move bytes, not conversions")
    io = iron()
    elems = []
    for o, dst in sources:
        n = o.index.size
        piece = max(d for d in range(1, n + 1) if n % d == 0 and d * o.dtype.itemsize <= OBJ_BYTES
                    and (d * o.dtype.itemsize) % 4 == 0)
        elems.append(piece)
    operands = [o for o, _ in sources] + [out]
    fifos, ends = [], RuntimeEnds(io)
    for i, ((o, dst), piece) in enumerate(zip(sources, elems)):
        l3 = io.ObjectFifo(tensor(piece, o.dtype), depth=2, name=f"dma_in{i}")
        back = l3.cons().forward(tile=io.Tile(i % 4, 1), name=f"dma_out{i}", depth=2)
        fifos.append((ends.fill(l3, i % 4), ends.drain(back, i % 4), o, dst))
    shift = scratchpad.scratchpad_parameter(io, params, *word) if word else None

    def sequence(*args):
        if shift is not None:
            io.sync_parameters()
        for i, (into, back, o, dst) in enumerate(fifos):
            for tap in access.taps(io, o, o.index):
                into.fill(args[i], tap=tap)
            for tap in access.taps(io, out, dst):
                back.drain(args[-1], tap=tap, wait=True, offset_parameter=shift)
    params.update({"op": op, "pieces": elems, "sequence": sequence_of(step, operands)})
    return program(io, target, operands, ends, [], sequence)


def _gather(target: str, step, buffers: dict, params: dict, out):
    """Embedding rows by id: one fill per id from the table's row 0, shifted by the id's scratchpad word; the
    rows stream through one memtile to the output in order. The host computes the words from the ids, or from
    the io value they are derived from (the fused design traces that: kernels/fused/design.py _host_word)."""
    table_name, ids_name = step.inputs[0], step.inputs[1]
    table = operand(table_name, buffers[table_name], step.attrs["views"][0])
    if table.index.ndim != 2 or table.dtype != out.dtype:
        raise DesignError("gather between dtypes, or from a table that is not 2-D")
    rows, width = table.index.shape
    n_ids = int(np.prod(buffers[ids_name].shape))
    row_stride = int(table.index[1, 0] - table.index[0, 0]) if rows > 1 else 0
    if width * table.dtype.itemsize % 4:
        raise DesignError(f"a table row of {width} bf16 elements is not a whole 32-bit word: pad rows to even")
    io = iron()
    row_t = tensor(width, table.dtype)
    l3 = io.ObjectFifo(row_t, depth=2, name="gather_in")
    back = l3.cons().forward(tile=io.Tile(0, 1), name="gather_out", depth=2)
    ends = RuntimeEnds(io)
    into, out_end = ends.fill(l3, 0), ends.drain(back, 0)
    words = [scratchpad.scratchpad_parameter(io, params, ids_name, i, row_stride, rows - 1) for i in range(n_ids)]
    out_rows = out.index.reshape(n_ids, width)

    def sequence(t_arg, o_arg):
        io.sync_parameters()
        for i, word in enumerate(words):  # a task group per row: its two descriptors are freed before the next
            tg = io.TaskGroup()
            for tap in access.taps(io, table, table.index[0]):
                into.fill(t_arg, tap=tap, group=tg, offset_parameter=word)
            for tap in access.taps(io, out, out_rows[i]):
                out_end.drain(o_arg, tap=tap, group=tg, wait=True)
            tg.finish()
    params.update({"op": "embedding", "pieces": [width], "rows": n_ids,
                   "sequence": sequence_of(step, [table, out])})   # the ids reach the DMAs as words
    return program(io, target, [table, out], ends, [], sequence)


if __name__ == "__main__":
    design_cli.main(build)
