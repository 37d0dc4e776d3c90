"""Memory plan: every buffer of the program gets an arena and a byte offset. Four arenas, four device BOs:

  weights  packed weights and constants, uploaded once per session, read-only
  state    per-stream state (KV caches), one copy per State object, resident on the device
  io       what crosses to the host each run: inputs, runtime parameters (position, length), outputs
  scratch  activations; a buffer's bytes are reused once its last reader has run (liveness), and entries
           share the arena since they never run at the same time

On the device, floating-point activations, weights and state are bf16, except the residual stream (fp32,
see residual_stream) and weight vectors (layout.py); io keeps the host's dtypes.
"""
from __future__ import annotations

from ..program import Buffer, Usage
from .fuse import Fused

ALIGN = 64  # bytes; DMA transfers start on 32-bit words, tiles on cache-line-like boundaries
ARENAS = {Usage.WEIGHTS: "weights", Usage.STATE: "state", Usage.IO: "io", Usage.SCRATCH: "scratch"}


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def buffer_name(f: Fused, value: str) -> str:
    """Entry-local values are prefixed with the entry name (as on the cpu target); weights and state are shared."""
    return f"{f.name}/{value}" if f.values[value].kind in ("node", "input", "param") else value


def plan(fused: list[Fused], weights: dict[str, Buffer]) -> tuple[dict[str, Buffer], dict[str, int]]:
    """All buffers with (arena, offset) filled, and the size of each arena in bytes."""
    buffers: dict[str, Buffer] = {}
    sizes = {a: 0 for a in ARENAS.values()}

    def place(buf: Buffer, offset: int | None = None) -> Buffer:
        arena = ARENAS[buf.usage]
        if offset is None:
            offset = sizes[arena]
        sizes[arena] = max(sizes[arena], _align(offset + buf.nbytes))
        placed = Buffer(buf.name, buf.shape, buf.dtype, buf.usage, arena, offset)
        buffers[buf.name] = placed
        return placed

    for buf in weights.values():
        place(buf)
    for f in fused:
        outputs = set(f.outputs.values())
        for name, v in f.values.items():
            if v.kind == "state" and name not in buffers:
                place(Buffer(name, v.shape, _device_dtype(v.dtype), Usage.STATE))
            elif v.kind in ("input", "param") or name in outputs and v.kind == "node":
                place(Buffer(buffer_name(f, name), v.shape, v.dtype, Usage.IO))
        scratch_end = _plan_scratch(f, outputs, buffers)
        sizes["scratch"] = max(sizes["scratch"], scratch_end)
    return buffers, sizes


def _device_dtype(dtype: str) -> str:
    return "bfloat16" if dtype == "float32" else dtype


def residual_stream(f: Fused) -> set[str]:
    """Activations kept in fp32: what norms read and what residual adds add back. The residual stream
    carries each layer's small updates on top of large values; in bf16 those updates lose their low bits
    at every layer, while everything else is bf16."""
    wide = set()
    for k in f.kernels:
        if k.kind == "norm" or "prologue" in k.attrs:
            wide.add(k.inputs[0].value)
        for c in k.chain:
            if c["op"] == "add" and c["operand"] is not None:
                wide.add(k.inputs[c["operand"]].value)
    return {v for v in wide if f.values[v].dtype == "float32"}


def _plan_scratch(f: Fused, outputs: set[str], buffers: dict[str, Buffer]) -> int:
    """First-fit placement of the entry's activations by live range [first write, last read]."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, k in enumerate(f.kernels):
        for r in k.inputs:
            if r is not None and r.value in first:
                last[r.value] = i
        for v in k.outputs:
            if f.values[v].kind == "node" and v not in outputs:
                first.setdefault(v, i)
                last.setdefault(v, i)
    wide = residual_stream(f)
    live: list[tuple[int, int, int]] = []  # (offset, end, last use)
    end_of_arena = 0
    for v in sorted(first, key=lambda v: first[v]):
        value = f.values[v]
        dtype = value.dtype if v in wide else _device_dtype(value.dtype)
        buf = Buffer(buffer_name(f, v), value.shape, dtype, Usage.SCRATCH)
        live = [(o, e, u) for o, e, u in live if u >= first[v]]  # free what is dead before this write
        offset = 0
        for o, e, _ in sorted(live):
            if offset + buf.nbytes <= o:
                break
            offset = max(offset, _align(e))
        buffers[buf.name] = Buffer(buf.name, buf.shape, buf.dtype, Usage.SCRATCH, "scratch", offset)
        live.append((offset, offset + buf.nbytes, last[v]))
        end_of_arena = max(end_of_arena, _align(offset + buf.nbytes))
    return end_of_arena
