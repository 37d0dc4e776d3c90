"""Memory plan: every buffer of the program gets an arena and a byte offset. Four arenas, four device BOs:

  weights  packed weights and constants, uploaded once per session, read-only
  state    per-stream state (KV caches), one copy per State object, resident on the device
  io       what crosses to the host each run: inputs, runtime parameters (position, length), outputs
  scratch  activations; a buffer's bytes are reused once its last reader has run (liveness), and entries
           share the arena since they never run at the same time

On the device, floating-point activations, weights and state are bf16, except the residual stream (fp32,
see residual_stream) and weight vectors (layout.py); io keeps the host's dtypes.

GEMM outputs are stored padded to whole tiles (pad_to_tiles): a buffer's shape may be wider than its value's,
and its readers read it through a `slice` view. An attention output whose readers merge its heads is stored
[B, T, H, D] (interleave_heads), so that they read plain rows.
"""
from __future__ import annotations

from ..graph import Node, Value
from ..program import Buffer, Usage
from . import catalog
from .fuse import Fused, Kernel, Ref
from .hardware import Target
from .partition import shape_of
from .layout import word_values

ALIGN = 64  # bytes; DMA transfers start on 32-bit words, tiles on cache-line-like boundaries
ARENAS = {Usage.WEIGHTS: "weights", Usage.STATE: "state", Usage.IO: "io", Usage.SCRATCH: "scratch"}


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def buffer_name(f: Fused, value: str) -> str:
    """Entry-local values are prefixed with the entry name (as on the cpu target); weights and state are shared."""
    return f"{f.name}/{value}" if f.values[value].kind in ("node", "input", "param") else value


def plan(fused: list[Fused], weights: dict[str, Buffer], target: Target) -> tuple[dict[str, Buffer], dict[str, int]]:
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
        keep = pad_to_tiles(f, target)
        pad_masks_to_chunks(f, target)
        interleave_heads(f)
        outputs = set(f.outputs.values())
        converted = host_converted_inputs(f)
        for name, v in f.values.items():
            if v.kind == "state" and name not in buffers:
                place(Buffer(name, v.shape, _device_dtype(v.dtype), Usage.STATE))
            elif v.kind in ("input", "param") or name in outputs and v.kind == "node":
                dtype = _device_dtype(v.dtype) if name in converted else v.dtype
                place(Buffer(buffer_name(f, name), v.shape, dtype, Usage.IO))
        scratch_end = _plan_scratch(f, outputs, buffers, keep)
        sizes["scratch"] = max(sizes["scratch"], scratch_end)
    return buffers, sizes


# (kind, operand index) of the kernel reads that take an operand as bf16 whatever its dtype: the value a state
# write copies into bf16 state, and an attention's q, k, v (kernels/mha reads bf16)
BF16_READS = {("state_write", 1), ("mha", 0), ("mha", 1), ("mha", 2)}


def host_converted_inputs(f: Fused) -> set[str]:
    """fp32 inputs that only bf16 reads take (Whisper's suppress table, which an assign copies into the state):
    a DMA moves bytes, not conversions, so such an input is stored in bf16 in the io arena and the host rounds it
    (nearest even) as it writes it, which is what the state or the kernel does with it anyway."""
    readers: dict[str, set] = {}
    for k in f.kernels:
        for i, r in enumerate(k.inputs):
            if r is not None:
                readers.setdefault(r.value, set()).add((k.kind, i))
    return {name for name, v in f.values.items() if v.kind == "input" and v.dtype == "float32"
            and readers.get(name) and readers[name] <= BF16_READS}


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
    wide |= word_values(f)  # and what a DMA can only move as whole fp32 words (layout.word_values)
    # an update added to the residual stream by an eltwise add of its own (DINOv2's layer-scaled projections: the
    # GEMM's one epilogue operand is the scale, fuse.py) stays fp32, as it is when the GEMM adds it
    scaled = {v for k in f.kernels if k.kind == "gemm" and any(c["operand"] is not None for c in k.chain)
              for v in k.outputs}
    for k in f.kernels:
        if k.kind == "eltwise" and k.head.op == "add" and any(r is not None and r.value in wide for r in k.inputs):
            wide.update(r.value for r in k.inputs if r is not None and r.value in scaled)
    while True:  # a concat's pieces in its output's dtype (DINOv2's register tokens, repeated per image by a concat)
        pieces = {r.value for k in f.kernels if k.kind == "concat" and k.outputs[0] in wide for r in k.inputs
                  if r is not None and f.values[r.value].kind == "node"} - wide
        if not pieces:
            break
        wide |= pieces
    return {v for v in wide if f.values[v].dtype == "float32"}


def pad_to_tiles(f: Fused, target: Target) -> set[str]:
    """Store each GEMM (or bmm) output whose width N is not a multiple of its tile n as [..., Np] (Np: whole
    tiles), so that the kernel drains whole tiles; every reader reads the value through a `slice` view of its
    first N columns. The padding columns hold what the kernel computes there: its epilogue of a zero accumulator
    (the packed weight and bias are zero past N; a bmm's kernel zeroes B past N), finite, so a GEMM whose K is
    not a multiple of its tile k may read such a row on to Kp against its weight's zero rows (kernels/gemm reads
    them; the emulator pads with zeros, the same sum). An entry output keeps its shape: the GEMM stores a padded
    scratch value in the output's dtype and a copy kernel moves the slice into the io buffer. Merged projections,
    cache writes and epilogues that read an operand are not padded (their designs refuse them), nor is a bmm
    output wider than one tile: kernels/gemm shifts its last column tile to end at N (columns written twice with
    the same values). Returns the scratch values kept in their dtype: the padded entry outputs, and values of
    odd width (in fp32 their rows are whole 32-bit words)."""
    outputs, keep = set(f.outputs.values()), set()
    for k in [k for k in f.kernels if k.kind in ("gemm", "bmm")]:
        t = k.attrs["tiling"]
        if t["Np"] == t["N"] or len(k.outputs) != 1 or "state_writes" in k.attrs \
                or any(c["operand"] is not None for c in k.chain):
            continue
        value = f.values[k.outputs[0]]
        if value.kind != "node" or value.shape[-1] != t["N"]:
            continue
        if k.kind == "bmm" and t["N"] > t["n"]:  # the last column tile shifts instead (kernels/gemm)
            if t["N"] % 2 and value.dtype == "float32":
                keep.add(value.name)  # rows of an odd number of bf16 elements are not whole 32-bit words
            continue
        shape = (*value.shape[:-1], t["Np"])
        cut = ("slice", len(shape) - 1, 0, t["N"], 1)
        stored = value.name
        k.attrs["stored_width"] = t["Np"]
        if t["N"] % 2 and value.dtype == "float32":
            keep.add(stored)  # rows of an odd number of bf16 elements are not whole 32-bit words for the readers
        if value.name in outputs:
            stored = f"{value.name}.padded"
            keep.add(stored)
            k.outputs = [stored]
            copy = Kernel("copy", Node("copy", (stored,), {}, value.name), [Ref(stored, (cut,))], [value.name],
                          k.position)
            f.values[stored] = Value(stored, shape, value.dtype, "node")
            copy.attrs["tiling"] = catalog.tiling(copy, shape_of(f), target)
            f.kernels.insert(f.kernels.index(k) + 1, copy)
        else:
            f.values[stored] = Value(stored, shape, value.dtype, value.kind)
        for reader in f.kernels:
            reader.inputs = [Ref(stored, (cut, *r.views)) if r is not None and r.value == value.name else r
                             for r in reader.inputs]
    return keep


def pad_masks_to_chunks(f: Fused, target: Target) -> None:
    """Store a length mask wider than its tiling's chunk, when the chunk does not divide it (Whisper's vocabulary
    filter: 51864 columns, no even divisor between 24 and 2161), as whole chunks: kernels/maskgen writes it in
    pieces of the chunk, objects of one size. The kernel computes the padded mask (length_mask of the padded
    size: its first columns are the mask) and every reader reads it through a `slice` of the real width."""
    outputs = set(f.outputs.values())
    for k in f.kernels:
        if k.kind != "maskgen" or k.head.op != "length_mask":
            continue
        size, chunk = k.head.attrs["size"], k.attrs["tiling"]["chunk"]
        value = f.values[k.outputs[0]]
        if size <= chunk or size % chunk == 0 or value.kind != "node" or value.name in outputs:
            continue
        padded = -(-size // chunk) * chunk
        k.head = Node(k.head.op, k.head.inputs, {**k.head.attrs, "size": padded}, k.head.output)
        f.values[value.name] = Value(value.name, (padded,), value.dtype, "node")
        cut = ("slice", 0, 0, size, 1)
        for reader in f.kernels:
            if reader is not k:
                reader.inputs = [Ref(r.value, (cut, *r.views)) if r is not None and r.value == value.name else r
                                 for r in reader.inputs]
        k.attrs["tiling"] = catalog.tiling(k, shape_of(f), target)


MERGE_HEADS = ("transpose", (0, 2, 1, 3))


def interleave_heads(f: Fused) -> None:
    """Store an attention output [B, H, T, D] as [B, T, H, D] (heads interleaved per token) when every reader
    merges its heads (transpose (0, 2, 1, 3), then reshape to [B, T, H * D]): the out-projection then reads
    plain rows, whose row tiles may cross a sequence's end (CLIP text's 77 tokens) in one transfer each. The
    `mha` drains each (head, query tile) as tq rows of d strided by H * D (attrs stored_perm); the emulator
    stores the same transpose (emu._mha). The readers' merge of the heads is then the stored order: they drop it."""
    readers = {}
    for k in f.kernels:
        for r in k.inputs:
            if r is not None:
                readers.setdefault(r.value, []).append(r)
    outputs = set(f.outputs.values()) | set(f.alias)
    for k in [k for k in f.kernels if k.kind == "mha" and len(k.outputs) == 1]:
        value = f.values[k.outputs[0]]
        refs = readers.get(value.name, [])
        if value.kind != "node" or len(value.shape) != 4 or value.name in outputs or not refs \
                or any(not r.views or r.views[0] != MERGE_HEADS for r in refs) \
                or any(c["operand"] is not None for c in k.chain):
            continue
        B, H, T, D = value.shape
        f.values[value.name] = Value(value.name, (B, T, H, D), value.dtype, value.kind)
        k.attrs["stored_perm"] = list(MERGE_HEADS[1])
        for reader in f.kernels:
            reader.inputs = [Ref(r.value, r.views[1:]) if r is not None and r.value == value.name else r
                             for r in reader.inputs]


def _plan_scratch(f: Fused, outputs: set[str], buffers: dict[str, Buffer], keep: set[str]) -> int:
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
    wide = residual_stream(f) | keep
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
