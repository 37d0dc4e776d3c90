"""Layout: how each weight is stored in the device's weights arena (the recipes; sdk/runtime/packing.py packs them).

A GEMM's B operand is stored once in the layout its kernel reads: [K, N] (transposed from PyTorch's
[out, in] when needed), the projections it merged concatenated along N, zero-padded to multiples of the
tile (tk, tn) and laid out tile-major, [Kp/tk, Np/tn, tk, tn] in bf16, so that each DMA transfer of one
tile is contiguous. A GEMM whose tiling has weight_planes = 2 (catalog.SPLIT_WEIGHTS) stores two such
images, [2, Kp/tk, Np/tn, tk, tn]: hi = bf16(w) and lo = bf16(w - hi); its kernel accumulates A.hi + A.lo.
Its bias is concatenated and padded the same way, in fp32. Every other weight or constant is stored as it
is: matrices and tables in bf16, vectors in fp32, int32 as int32; kernels read them through their access
patterns. A DMA moves bytes and cannot convert, so a weight that a gather or a concat copies into its output
is stored in that output's dtype, and a table whose rows are an odd number of elements is stored (and
gathered) in fp32: its rows are then whole 32-bit words (`word_values`).

Before packing, the plan rewrites what a DMA could not serve at bf16 granularity: a constant pad becomes a
concat with constant blocks (`pads_as_concats`), and a bf16 operand read with an innermost stride other than 1
gets a transpose step through the cores first (`route_transposes`).

A packing is described by a recipe in the program (meta["layout"]: kind "plain", "gemm_b" or "bias", its
sources with their view chains, tile sizes, planes) and done by the runtime at load time, never per inference.
The same module works out the shapes and DMA dimensions of view chains (program.apply_views applies them).
"""
from __future__ import annotations

import functools

import numpy as np

from ..errors import UsageError
from ..program import Buffer, Usage, apply_views
from ..graph import Node, Value
from . import catalog
from .fuse import Fused, Kernel, Ref
from .hardware import Target


# ---- views: the access patterns of kernel operands ------------------------------------------------

def apply_views_shape(shape: tuple, views) -> tuple:
    probe = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), shape=shape, strides=(0,) * len(shape))
    for v in views:
        if v[0] == "reshape":  # a zero-strided probe cannot always be reshaped as a view: compute the shape
            probe = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), shape=_reshaped(probe.shape, v[1]),
                                                    strides=(0,) * len(v[1]))
        else:
            probe = apply_views(probe, [v])
    return tuple(probe.shape)


def _reshaped(shape, new):
    new = list(new)
    if -1 in new:
        new[new.index(-1)] = int(np.prod(shape)) // int(np.prod([d for d in new if d != -1]))
    return tuple(new)


def access_dims(shape: tuple, views) -> int:
    """Dimensions of the DMA access pattern that reads `shape` through `views` (contiguous runs merged)."""
    if not views:
        return 1
    return _access_dims(tuple(shape), tuple(tuple(v) for v in views))


@functools.lru_cache(maxsize=4096)  # every layer repeats the same patterns
def _access_dims(shape: tuple, views: tuple) -> int:
    size = int(np.prod(shape))
    if size > 1 << 22:  # large operands: bound it by the dimensions the views mention
        return max(len(apply_views_shape(shape, views)), 1)
    index = apply_views(np.arange(size, dtype=np.int64).reshape(shape), views)
    strides = []
    for axis, n in enumerate(index.shape):
        if n == 1:
            continue
        step = np.take(index, 1, axis=axis).flat[0] - np.take(index, 0, axis=axis).flat[0]
        strides.append((n, int(step)))
    merged: list[tuple[int, int]] = []
    for n, s in strides:  # axis i merges into i-1 when stride(i-1) == n(i) * stride(i)
        if merged and merged[-1][1] == n * s:
            merged[-1] = (merged[-1][0] * n, s)
        else:
            merged.append((n, s))
    return max(len(merged), 1)


# ---- layout plan (compile time) --------------------------------------------------------------------

def plan(fused: list[Fused], target: Target, constants: dict[str, np.ndarray]) -> tuple[dict, dict]:
    """Decide the stored form of every weight the kernels read; rewrite GEMM operands to packed buffers.
    Returns (weight buffers, recipes)."""
    from .memory import residual_stream  # memory's fp32 activations decide what a DMA copies weights into

    buffers: dict[str, Buffer] = {}
    recipes: dict[str, dict] = {}

    def plain(name, value, dtype=None):
        if name not in buffers:
            dtype = dtype if dtype and value.dtype == "float32" else stored_dtype(value.shape, value.dtype)
            buffers[name] = Buffer(name, value.shape, dtype, Usage.WEIGHTS)
            recipes[name] = {"kind": "plain", "sources": [[name, []]], "shape": list(value.shape), "dtype": dtype}

    for f in fused:
        pads_as_concats(f, constants, target)
        wide = residual_stream(f)
        route_transposes(f, target)
        for k in f.kernels:
            if k.kind == "gemm":
                _pack_gemm(f, k, buffers, recipes)
            # a gather or concat copies weights into its output as they are stored: store them in its dtype
            copied = "float32" if k.outputs and (k.outputs[0] in wide or k.outputs[0] in f.outputs.values()
                                                 and f.values[k.outputs[0]].dtype == "float32") else "bfloat16"
            for i, r in enumerate(k.inputs):
                if r is not None and r.value in f.values and f.values[r.value].kind in ("weight", "const"):
                    value = f.values[r.value]  # rows of odd width that a row kernel or a mask reads: fp32 words
                    odd = (k.kind in ROW_KINDS - {"conv"} or k.kind == "mha" and i == 3) and value.shape \
                        and value.shape[-1] % 2  # (conv weights are read by taps, not as rows)
                    plain(r.value, value, copied if k.kind in ("gather", "concat") else "float32" if odd else None)
    return buffers, recipes


# ---- constant padding: a concat with constants ------------------------------------------------------------

def pads_as_concats(f: Fused, constants: dict[str, np.ndarray], target: Target) -> None:
    """A DMA cannot write a constant, but it can copy one: a pad along one axis becomes a concat (kernels/dma) of
    a constant block of the pad value (a new constant of the program, in the weights arena), the operand, and
    another block; a pad along several axes, one such concat per axis. The emulator runs them as the concats
    they are, which equal the pad."""
    kernels = []
    for k in f.kernels:
        pads = [tuple(p) for p in k.head.attrs["pads"]] if k.kind == "pad" else []
        axes = [a for a, p in enumerate(pads) if p != (0, 0)]
        if not axes:
            kernels.append(k)
            continue
        r = k.inputs[0]
        for i, axis in enumerate(axes):  # a pad along several axes: one concat per axis, through scratch values
            shape = list(apply_views_shape(f.values[r.value].shape, r.views))
            out = k.outputs[0] if i == len(axes) - 1 else f"{k.outputs[0]}.pad{axis}"
            parts = []
            for side, n in zip(("before", "after"), pads[axis]):
                if n:
                    name = f"const.{f.name}.{out}.{side}"
                    block = np.full(shape[:axis] + [n] + shape[axis + 1:], k.head.attrs.get("value", 0.0),
                                    np.float32)
                    constants[name] = block
                    f.values[name] = Value(name, block.shape, "float32", "const")
                    parts.append(Ref(name))
                if side == "before":
                    parts.append(r)
            if out != k.outputs[0]:
                shape[axis] += sum(pads[axis])
                f.values[out] = Value(out, tuple(shape), f.values[k.outputs[0]].dtype, "node")
            step = k if out == k.outputs[0] else Kernel("concat", k.head, [], [out], k.position)
            step.kind = "concat"
            step.head = Node("concat", tuple(p.value for p in parts), {"axis": axis}, out)
            step.inputs = parts
            step.attrs["tiling"] = catalog.tiling(step, lambda ref: _shape(f, ref), target)
            kernels.append(step)
            r = Ref(out)
    f.kernels = kernels


def _shape(f: Fused, ref) -> tuple:
    ref = Ref(ref) if isinstance(ref, str) else ref
    return apply_views_shape(f.values[ref.value].shape, ref.views)


# ---- element-granular transposes: through kernels/transpose --------------------------------------------------

# kinds whose designs read every operand as rows through DMA access patterns (kernels/access.taps): a bf16 operand
# whose innermost access stride is not 1 needs a transpose through a core first
ROW_READERS = {"eltwise", "softmax", "norm", "reduce", "rope", "argmax", "concat", "pad", "copy", "conv", "pool"}


def route_transposes(f: Fused, target: Target) -> None:
    """A DMA moves 32-bit words, so it cannot read a bf16 operand with an innermost stride other than 1 (a
    transpose folded into the access pattern). Such an operand of a row-reading kernel is read instead from a
    transpose kernel's output (catalog kind `transpose`, kernels/transpose): x [b, r, c], read row by row
    through the operand's views, becomes y [b, c, r] in a new scratch value, which the consumer reads through a
    reshape; an fp32 value (`wide`: a conv output of odd width) is read in fp32 and transposed into bf16, or into
    fp32 where the reader needs whole words (a copy into an fp32 entry output). An fp32 entry input read through
    such a view is routed the same way: a transpose step inside the entry's one dispatch, where a host-side
    permutation would give the io arena a second layout that every backend and reader would have to know.
    Each distinct (value, views) is transposed once, before its first reader."""
    routed: dict[tuple, str] = {}
    kernels = []
    for k in f.kernels:
        if k.kind in ROW_READERS:
            for i, r in enumerate(k.inputs):
                if r is None or r.value not in f.values or not _routable(f.values[r.value]):
                    continue
                split = _transpose_split(f.values[r.value].shape, r.views)
                if split is None:
                    continue
                key = (r.value, tuple(r.views))
                if key not in routed:
                    routed[key] = _transpose_kernel(f, r, split, k.position, target, kernels)
                k.inputs[i] = Ref(routed[key], (("reshape", apply_views_shape(f.values[r.value].shape, r.views)),))
        kernels.append(k)
    f.kernels = kernels


def _routable(value: Value) -> bool:
    """An activation, or an fp32 entry input (the transpose kernel reads bf16 or fp32, not int32)."""
    return value.kind == "node" or value.kind == "input" and value.dtype == "float32"


def _transpose_split(shape: tuple, views) -> tuple | None:
    """(b, c, r) such that the operand, viewed as [b, c, r], is the transpose of an [b, r, c] read whose
    innermost stride is 1; None when the operand's innermost stride is already 1 (or nothing fits)."""
    if not views or int(np.prod(shape)) > 1 << 22:
        return None
    index = apply_views(np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape), views)
    F = index.shape
    if len(F) == 0 or F[-1] < 2 or (np.diff(index, axis=-1) == 1).all():
        return None
    for m in range(len(F) - 1, 0, -1):   # r: the trailing axes from m (a permutation may merge several: y [8, 2, 3]
        r = int(np.prod(F[m:]))           # = x [2, 3, 8] by (2, 0, 1) is the transpose of x as [6, 8])
        for j in range(m - 1, -1, -1):
            c = int(np.prod(F[j:m]))
            b = int(np.prod(F)) // (c * r)
            if c < 2:
                continue
            x = index.reshape(b, c, r).transpose(0, 2, 1)
            if (np.diff(x, axis=-1) == 1).all():
                return b, c, r
    return None


def _transpose_kernel(f: Fused, r: Ref, split: tuple, position: int, target: Target, kernels: list) -> str:
    b, c, rows = split
    name = f"{r.value}@T{len([v for v in f.values if v.startswith(r.value + '@T')])}"
    f.values[name] = Value(name, (b, c, rows), f.values[r.value].dtype, "node")
    perm = (0, 2, 1)
    x = Ref(r.value, tuple(r.views) + (("reshape", (b, c, rows)), ("transpose", perm)))
    k = Kernel("transpose", Node("transpose", (r.value,), {"perm": perm}, name), [x], [name], position)
    k.attrs["tiling"] = catalog.tiling(k, lambda ref: _shape(f, ref), target)
    kernels.append(k)
    return name


# kinds that stream rows and take a value per row as one word the kernel repeats (kernels/row_streaming.split_operands)
ROW_KINDS = {"eltwise", "conv", "norm", "softmax", "rope", "reduce", "pool"}


def word_values(f: Fused) -> set[str]:
    """Activations stored in fp32 because a DMA moves whole 32-bit words and can neither repeat nor split a bf16
    element (the memory plan keeps these in fp32, next to the residual stream):
    - a value a streaming kernel reads as one value per row (a per-row factor broadcast along the innermost
      axis, innermost stride 0): one fp32 word per row, which the kernel repeats;
    - rows gathered from a table whose rows are an odd number of elements (the table is stored in fp32 too);
    - a mean whose work item stores an odd number of values (kernels/reduce);
    - a concat along the row of pieces of odd width, and its inputs;
    - rows of an odd number of elements that a row-streaming kernel reads or writes, and an attention mask's:
      CLIP's 77-token masks, ResNet's 7 x 7 maps (not those a transpose or an attention's q / k / v moves:
      those kernels read bf16; nor what a DMA-only kind copies into a bf16 output);
    - a value a row-streaming kernel (not a conv or pool: those read bands) or an argmax reads through a view
      as contiguous rows of odd width or from an odd element (`_odd_rows`);
    - what a concat or copy moves into an fp32 entry output, and a concat with an fp32 piece in the io arena
      with its other pieces."""
    words = set()
    bf16_only = {v for k in f.kernels if k.kind == "transpose" for v in k.outputs}   # (it reads fp32 or bf16)
    bf16_only |= {r.value for k in f.kernels if k.kind == "mha" for r in k.inputs[:3] if r is not None}
    # a DMA copies bytes into its output's dtype: bf16, or the host's fp32 for an entry output (the TDT
    # predictor's h and c, concatenated from its layers' rows straight into the io arena)
    outputs = set(f.outputs.values())
    into_io = {r.value for k in f.kernels if k.kind in ("concat", "copy") and k.outputs[0] in outputs
               and f.values[k.outputs[0]].dtype == "float32" for r in k.inputs
               if r is not None and f.values[r.value].kind == "node"}
    # and a concat with a piece in the io arena (DINOv2's head input: the final hidden state, an entry output, next
    # to the patches' mean) moves whole fp32 rows: its output and other pieces are fp32 too
    io_fp32 = outputs | {n for n, v in f.values.items() if v.kind == "input"}
    from_io = {v for k in f.kernels if k.kind == "concat" and any(
        r is not None and r.value in io_fp32 and f.values[r.value].dtype == "float32" for r in k.inputs)
        for v in [*k.outputs, *(r.value for r in k.inputs if r is not None)] if f.values[v].kind == "node"}
    words |= into_io | from_io
    bf16_only |= {r.value for k in f.kernels if k.kind in ("concat", "copy", "gather", "state_write")
                  for r in k.inputs if r is not None} - into_io - from_io
    for k in f.kernels:
        rows = list(k.inputs[3:4]) if k.kind == "mha" else list(k.inputs) if k.kind in ROW_KINDS else []
        # a depthwise conv1d (kernels/dwconv1d) writes blocks of an even number of channels' whole rows: whole
        # words in bf16 at any row length (the conformer's odd 5 s / 20 s buckets)
        writes_rows = k.kind in ROW_KINDS and not (k.head.op == "conv1d" and k.head.attrs.get("groups", 1) > 1)
        # (an element-granular read goes through kernels/transpose instead: route_transposes)
        touched = [r.value for r in rows if r is not None and not (f.values[r.value].kind == "node" and
                                                                   _transpose_split(f.values[r.value].shape, r.views))]
        touched += list(k.outputs) if writes_rows else []
        for v in touched:
            value = f.values.get(v)
            if value is not None and value.kind == "node" and value.shape and value.shape[-1] % 2 \
                    and v not in bf16_only:
                words.add(v)
    for k in f.kernels:
        if k.kind in ROW_KINDS - {"conv", "pool"} | {"argmax"}:
            for r in k.inputs:
                if r is not None and r.views and r.value not in bf16_only and _odd_rows(f, r):
                    words.add(r.value)
        if not k.outputs or k.outputs[0] not in f.values:
            continue
        out = f.values[k.outputs[0]].shape
        if k.kind in ROW_KINDS and out and out[-1] > 1:
            for r in k.inputs:
                if r is not None and f.values[r.value].kind == "node":
                    shape = apply_views_shape(f.values[r.value].shape, r.views)
                    if shape and shape[-1] == 1:
                        words.add(r.value)
        if k.kind == "argmax":
            words.update(v for v in k.outputs[1:] if f.values[v].dtype == "float32")  # picks: one word each
        if k.kind == "gather" and f.values[k.inputs[0].value].shape[-1] % 2:
            words.add(k.outputs[0])
        if k.kind == "concat" and k.head.attrs["axis"] % len(out) == len(out) - 1 \
                and any(_shape(f, r)[-1] % 2 for r in k.inputs if r is not None):
            # pieces of odd width along the row: whole words only in fp32 (a constant pad's concat, too)
            words.add(k.outputs[0])
            words.update(r.value for r in k.inputs if r is not None and f.values[r.value].kind == "node")
        if k.kind == "reduce" and k.head.op == "mean" and _mean_item(f, k) % 2:
            words.add(k.outputs[0])
    return words


def _odd_rows(f: Fused, r) -> bool:
    """A node value read through views as rows of an odd number of elements, or from an odd element (Whisper's
    timestamp log-probs: the slice from timestamp_begin = 50363 of the vocabulary): in bf16 such rows do not
    start or end on a 32-bit word."""
    value = f.values.get(r.value)
    if value is None or value.kind != "node" or not value.shape or int(np.prod(value.shape)) > 1 << 22:
        return False
    index = apply_views(np.arange(int(np.prod(value.shape)), dtype=np.int64).reshape(value.shape), r.views)
    if index.size < 2 or index.ndim == 0 or not (np.diff(index, axis=-1) == 1).all():
        return False   # element-granular reads go through kernels/transpose instead (route_transposes)
    return index.shape[-1] % 2 == 1 or index.reshape(-1)[0] % 2 == 1


def _mean_item(f: Fused, k) -> int:
    """Values one work item of kernels/reduce stores: the group of trailing-axes means, or one output row."""
    shape = apply_views_shape(f.values[k.inputs[0].value].shape, k.inputs[0].views)
    axes = sorted({a % len(shape) for a in np.atleast_1d(k.head.attrs["axis"])})
    if axes == list(range(axes[0], len(shape))):
        rows = int(np.prod(shape[:axes[0]]))
        return 2 if rows % 2 == 0 else rows
    return int(np.prod(shape[axes[-1] + 1:]))


def stored_dtype(shape: tuple, dtype: str) -> str:
    """Matrices and tables are bf16; vectors (biases, norm scales and shifts) and scalars stay fp32: a kernel
    reads them once into registers, and rounding a LayerNorm scale to bf16 would bias every output it scales."""
    if dtype != "float32":
        return dtype
    return "float32" if len(shape) <= 1 else "bfloat16"


def _pack_gemm(f: Fused, k, buffers, recipes):
    t = k.attrs["tiling"]
    weights, biases = k.attrs["weights"], k.attrs["biases"]
    ns = [apply_views_shape(f.values[w.value].shape, w.views)[0 if k.attrs["transpose_b"] else 1] for w in weights]
    tag = "+".join(w.value for w in weights[:1]) + (f"+{len(weights) - 1}" if len(weights) > 1 else "")
    planes = t.get("weight_planes", 1)  # the same weight may be read split (decode rows) and whole (prefill)
    name = f"{tag}@gemm{t['k']}x{t['n']}" + (f"x{planes}planes" if planes > 1 else "")
    recipe = {"kind": "gemm_b", "sources": [[w.value, list(w.views)] for w in weights],
              "transpose_b": k.attrs["transpose_b"], "k": t["K"], "n": ns, "tk": t["k"], "tn": t["n"]}
    shape = (t["Kp"] // t["k"], t["Np"] // t["n"], t["k"], t["n"])
    if planes > 1:
        recipe["planes"] = planes
        shape = (planes, *shape)
    _add(buffers, recipes, name, shape, recipe)
    bias_name = None
    if any(b is not None for b in biases):
        bias_name = f"{tag}@bias{t['Np']}"
        recipe = {"kind": "bias", "sources": [[b.value, list(b.views)] if b is not None else None for b in biases],
                  "n": ns, "np": t["Np"]}
        _add(buffers, recipes, bias_name, (t["Np"],), recipe, "float32")
    k.attrs["n_splits"] = ns
    k.inputs[1] = Ref(name)
    k.inputs[2] = Ref(bias_name) if bias_name else None


def _add(buffers, recipes, name, shape, recipe, dtype="bfloat16"):
    if name in recipes and recipes[name] != recipe:
        raise UsageError(f"weight {name.split('@')[0]} is read with two different shapes by the graphs of one "
                         f"program", fix="compile graphs of one model together, and different models apart")
    buffers[name] = Buffer(name, tuple(shape), dtype, Usage.WEIGHTS)
    recipes[name] = recipe
