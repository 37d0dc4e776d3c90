"""The cpu backend. Two engines, chosen per entry when a program loads (`engines` records which and why):

- opencv (the default): an entry whose steps all have an ONNX form (encoders, whole forward passes) runs as
  one OpenCV dnn network, see opencv_net.py; OpenCV's engine is faster than the numpy one on every encoder
  we bench, and than ONNX Runtime on the BERT family.
- numpy: everything else (Whisper's decoder steps, which write KV caches in place; entries OpenCV cannot load
  or run; AIE_APPS_CPU_ENGINE=numpy asks for it everywhere) runs each host step with its numpy reference from
  ops.py, on all the cores it may use.

The rest of this module is the numpy engine.

Parallelism is ours, not the BLAS library's: during a run BLAS is held to one thread and the big steps
(GEMMs, attention, the multi-pass elementwise ops) are split into one piece per core, each piece the same
numpy reference on a slice. On a 2-core machine that is as fast as BLAS's own threads when the machine is
idle and several times faster when anything else runs: a BLAS thread pool spins at every small GEMM and
collapses when it does not own every core (Whisper's encoder attention: 0.1 s vs 1.5 s per layer under
load). The pieces cut rows or output columns only: no sum is split, so a piece's numbers differ from the
whole step's by float32 rounding at most (OpenBLAS picks its kernels by the operands' sizes: a 32-row slice
of a GEMM can differ from the same rows of the whole in the last bits). Decoder steps, whose GEMMs have at
most GEMV_ROWS rows, run whole on BLAS's own threads (see `_weight_streaming`).
Runs of row-local steps (a transformer layer from its O projection to the next Q/K/V) go to the workers as
one chain per block of rows, so a layer costs two hand-offs (chain, attention) rather than one per step.
The other workers are processes forked when a program loads, once every piece is bound to arrays with
fixed places (see "the static plan" below).
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import mmap
import os
import pickle
import signal
import threading
import weakref
from dataclasses import dataclass
from typing import Callable, Mapping

import cv2
import numpy as np
from threadpoolctl import ThreadpoolController

from ..errors import SdkError, UsageError
from ..ops import OPS, pair
from ..program import Program, Usage
from ..settings import CPU_ENGINES, load as load_settings
from . import opencv_net
from .backend import Counters, State, check_inputs, check_weights


GEMV_ROWS = 8  # a linear over at most this many rows is bound by reading its weight (decoder steps)
# Below these a piece costs more than it saves: handing a piece to a worker costs tens of microseconds, and
# a Whisper decoder step is ~100 small steps (splitting its 384 x 384 GEMVs doubled the step's time).
MIN_PIECE = 1 << 16      # output elements per piece
MIN_GEMM_PIECE = 1 << 20  # multiply-adds per piece of a GEMM (~15 us on one core)
MIN_GEMV_PIECE = 1 << 20  # weight elements per piece of a GEMV (a head over a pooled token) in a split entry


def linear_layout(program: Program, entries, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Weights that a `linear` step multiplies with, copied in Fortran order into memory advised for huge pages.

    Fortran order: the same [out, in] array for ops.linear, but w.T is [in, out] contiguous, which OpenBLAS
    packs and streams faster. Measured on this machine's 2 cores, one BLAS thread, weights cycling through
    memory as in a forward pass: a 64-row GEMM 0.79-0.83x the time for [1536, 384] and [3072, 768] weights,
    0.88-0.93x for square ones, 0.92-0.95x for [768, 3072] (1.02-1.04x for [384, 1536]); decoder-step GEMVs
    about 2x faster (Whisper's 51864 x 384 vocabulary projection: 14 -> 7 ms). Whole models: MiniLM 0.965,
    BERT-base 0.933.
    Huge pages: a forward pass streams every weight from memory, and with 4 KiB pages a GEMV misses the TLB
    once per 1024 multiply-adds. Paired against 4 KiB pages: Whisper tiny.en's decoder step 0.95-0.97x the
    time, MiniLM 0.99x, BERT-base 0.98-0.99x.
    Chosen once, at load, for the entries numpy runs; the copies are the session's own, so a caller should not keep the loaded weights
    beside it."""
    linear = sorted({s.inputs[1] for e in entries for s in e.steps
                     if s.op == "linear" and s.inputs[1] in weights})
    places = np.cumsum([0] + [-(-weights[name].nbytes // ALIGN) * ALIGN for name in linear])
    memory = _huge_pages(int(places[-1]))
    laid = dict(weights)
    for name, offset in zip(linear, places):
        w = weights[name]
        laid[name] = np.ndarray(w.shape, w.dtype, memory, int(offset), order="F")
        laid[name][...] = w
    return laid


HUGE_PAGE = 2 << 20


def _huge_pages(nbytes: int) -> np.ndarray:
    """nbytes of private memory from a 2 MiB boundary, advised for transparent huge pages where the system
    has them (elsewhere, or refused, it is ordinary memory)."""
    private = {"flags": mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS} if hasattr(mmap, "MAP_PRIVATE") else {}
    memory = mmap.mmap(-1, nbytes + HUGE_PAGE, **private)  # shared anonymous memory gets no huge pages
    if hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):
            memory.madvise(mmap.MADV_HUGEPAGE)
    raw = np.frombuffer(memory, np.uint8)
    start = -raw.ctypes.data % HUGE_PAGE
    return raw[start:start + nbytes]


# ---- how a step is cut into pieces ---------------------------------------------------------------
# A splitter gets the number of workers, the step's output array and its arguments, and returns a list of
# thunks, each filling its own part of the output; or None when the step is too small to be worth it. The
# thunks are made once, when a program loads, over arrays with fixed places (see `bind`), and read their
# arguments when called: so every view a splitter takes must be a view, never a copy made at that time.

Pieces = list[Callable[[], None]]


def _bounds(n: int, parts: int) -> list[tuple[int, int]]:
    edges = [i * n // parts for i in range(parts + 1)]
    return [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def _viewed(array: np.ndarray, shape) -> np.ndarray | None:
    """array.reshape(shape) if that is a view of array (None if numpy would have to copy)."""
    view = array.reshape(shape)
    return view if view.size == 0 or np.may_share_memory(view, array) else None


def _by_rows(op):
    """Ops whose output row i depends on input row i only (elementwise ops, norms, softmax over the last
    axis): cut the rows of the first argument; each piece written straight into its rows where op can."""
    def split(parts, out, x, *rest, **attrs) -> Pieces | None:
        if x.ndim < 2 or x.dtype != np.float32:
            return None
        rows, out_rows = _viewed(x, (-1, x.shape[-1])), _viewed(out, (-1, out.shape[-1]))
        if rows is None or out_rows is None:
            return None
        n = rows.shape[0]
        if n < parts or rows.size < 2 * MIN_PIECE:
            return None

        def piece(a, b):
            def run():
                _fill(out_rows[a:b], op, rows[a:b], *rest, **attrs)
            return run
        return [piece(a, b) for a, b in _bounds(n, parts)]
    return split


def _fill(out, op, *args, **attrs):
    """op's result written into `out`: straight there where op can, else copied from op's own array."""
    if op.fills_out:
        op.ref(*args, **attrs, out=out)
    else:
        out[...] = op.ref(*args, **attrs)


def _linear(parts, out, x, w, b=None) -> Pieces | None:
    """ops.linear cut into row blocks (or, for at most GEMV_ROWS rows, the weight's output rows), each block's
    GEMM written straight into its part of the output and its bias added there."""
    rows = int(np.prod(x.shape[:-1]))
    if rows > GEMV_ROWS:
        if rows < parts or rows * w.shape[0] * w.shape[1] < 2 * MIN_GEMM_PIECE:
            return None
        blocks = [(slice(a, c), slice(None)) for a, c in _bounds(rows, parts)]
    else:
        if w.size < 2 * MIN_GEMV_PIECE:
            return None
        blocks = [(slice(None), slice(c0, c1)) for c0, c1 in _bounds(w.shape[0], parts)]
    x2, out2 = _viewed(x, (rows, x.shape[-1])), _viewed(out, (rows, w.shape[0]))
    if x2 is None or out2 is None:
        return None

    def piece(r, c):
        return lambda: _linear_into(out2[r, c], x2[r], w[c], None if b is None else b[c])
    return [piece(r, c) for r, c in blocks]


def _linear_into(out, x, w, b=None):
    """ops.linear(x, w, b) for 2-D x, written into `out` (no temporary, no copy)."""
    np.matmul(x, w.T, out=out)
    if b is not None:
        out += b


def _attention(parts, out, q, k, v, mask=None, *, scale) -> Pieces | None:
    lead = out.shape[:-2]
    T, S = q.shape[-2], k.shape[-2]
    if out.size < 2 * MIN_PIECE and T * S * int(np.prod(lead)) < 2 * MIN_PIECE:
        return None
    axis = next((i for i, n in enumerate(lead) if n >= parts), None)
    args = [q, k, v] + ([] if mask is None else [mask])
    if axis is not None:  # one slice of heads (or batch) per piece
        n, nd = lead[axis], len(lead) + 2

        def cut(t, a, b):  # t's view of lead[axis] in a..b (a broadcast axis of size 1 stays whole)
            ax = axis - (nd - t.ndim)
            return t if ax < 0 or t.shape[ax] == 1 else t[(slice(None),) * ax + (slice(a, b),)]
        index = lambda a, b: (slice(None),) * axis + (slice(a, b),)  # noqa: E731
    else:  # one head: one block of query rows per piece
        n = T

        def cut(t, a, b):
            return t[..., a:b, :] if t is q or (t is mask and t.shape[-2] > 1) else t
        index = lambda a, b: (Ellipsis, slice(a, b), slice(None))  # noqa: E731
    if n < parts:
        return None

    def piece(a, b):
        def run():
            _fill(out[index(a, b)], OPS["attention"], *[cut(t, a, b) for t in args], scale=scale)
        return run
    return [piece(a, b) for a, b in _bounds(n, parts)]


def _conv2d(parts, out, x, w, b=None, *, stride=1, padding=0, groups=1, dilation=1) -> Pieces | None:
    """Cut the output rows (or, with fewer rows than workers, as in conv1d, the output columns): each piece
    zero-pads the window of the input its outputs read and convolves that, with no padding of its own."""
    (sh, sw), (ph, pw), (dh, dw) = pair(stride), pair(padding), pair(dilation)
    Ho, Wo = out.shape[2:]
    axis, n, s, d, k = (2, Ho, sh, dh, w.shape[2]) if Ho >= parts else (3, Wo, sw, dw, w.shape[3])
    if out.size * w[0].size < 2 * MIN_GEMM_PIECE or n < parts:  # multiply-adds, as for a GEMM
        return None
    pads = [(0, 0), (0, 0), (ph, ph), (pw, pw)]
    p, size = pads[axis][0], x.shape[axis]

    def piece(a, c):
        def run():
            lo, hi = a * s - p, (c - 1) * s + d * (k - 1) + 1 - p  # the window, in unpadded coordinates
            window, edge = [slice(None)] * 4, list(pads)
            window[axis], edge[axis] = slice(max(lo, 0), min(hi, size)), (max(-lo, 0), max(hi - size, 0))
            y = OPS["conv2d"].ref(np.pad(x[tuple(window)], edge), w, b, stride=stride, padding=0, groups=groups,
                                  dilation=dilation)
            out[(slice(None),) * axis + (slice(a, c),)] = y
        return run
    return [piece(a, c) for a, c in _bounds(n, parts)]


def _conv1d(parts, out, x, w, b=None, *, stride=1, padding=0, groups=1, dilation=1) -> Pieces | None:
    return _conv2d(parts, out[:, :, None, :], x[:, :, None, :], w[:, :, None, :], b, stride=(1, stride),
                   padding=(0, padding), groups=groups, dilation=(1, dilation))


def _row_softmax(op):
    rows = _by_rows(op)

    def split(parts, out, x, *, axis=-1):
        return rows(parts, out, x, axis=-1) if axis in (-1, x.ndim - 1) else None
    return split


SPLITTERS: dict[str, Callable[..., Pieces | None]] = {
    "linear": _linear,
    "attention": _attention,
    "conv2d": _conv2d,
    "conv1d": _conv1d,
    **{name: _by_rows(OPS[name]) for name in ("gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "exp")},
    **{name: _by_rows(OPS[name]) for name in ("layer_norm", "rms_norm")},
    **{name: _row_softmax(OPS[name]) for name in ("softmax", "log_softmax")},
}


def _weight_streaming(program: Program, entry) -> bool:
    """A decoder step: every GEMM has at most GEMV_ROWS rows, so the entry streams its weights from memory.
    BLAS's own threads share that bandwidth best; handing each 384 x 384 GEMV to a worker costs more than
    the GEMV (Whisper tiny.en's step: 12 ms with BLAS threads, 18-26 ms split). Such entries run as they are."""
    gemms = [s for s in entry.steps if s.op in ("linear", "matmul")]
    return bool(gemms) and all(int(np.prod(program.buffers[s.inputs[0]].shape[:-1])) <= GEMV_ROWS for s in gemms)


# ---- row chains: consecutive row-local steps run per block of rows, one hand-off for the lot ------------
# A transformer layer outside its attention is a run of steps where output row i reads row i of its inputs
# only (the O projection, residual add, norm, FFN, the next Q/K/V). Running such a run as one piece per
# worker costs one hand-off instead of one per step, and each worker's rows stay in its own cache from one
# step to the next (a GELU reads its GEMM's output rows where that GEMM wrote them).

ROW_LOCAL = {"linear", "add", "sub", "mul", "div", "scale", "gelu", "gelu_tanh", "silu", "sigmoid", "relu",
             "tanh", "exp", "layer_norm", "rms_norm"}
VIEWS = {"reshape", "transpose", "slice_axis"}  # no arithmetic: may run after the chain that they sit in


def _rows(shape) -> int:
    return int(np.prod(shape[:-1])) if len(shape) else 1


def _row_role(in_shape, out_shape) -> str | None:
    """'rows' if input row i is output row i (same shape up to leading 1s), 'vector' if every output row reads
    all of it (a vector or scalar), None otherwise. (A linear's weight and bias are 'whole'.)"""
    if _rows(in_shape) == 1:
        return "vector"
    strip = lambda s: tuple(s)[next((i for i, n in enumerate(s) if n != 1), len(s)):]  # noqa: E731
    if strip(in_shape[:-1]) == strip(out_shape[:-1]):
        return "rows"
    return None


@dataclass(frozen=True)
class Chain:
    steps: tuple           # the row-local steps, in program order
    roles: tuple           # per step, per input: "rows" | "vector" | "whole" | None (absent optional input)
    views: tuple           # view steps met on the way, run after the chain
    rows: int


def plan(program: Program, entry) -> list:
    """The entry's steps, with every run of >= 2 row-local steps over the same rows (big enough to split)
    replaced by a Chain."""
    items, chain, roles, views, met = [], [], [], [], []  # met: the run's steps and views in program order
    buffers = program.buffers

    def close():
        work = sum(_rows(buffers[s.outputs[0]].shape) * buffers[s.outputs[0]].shape[-1]
                   * (buffers[s.inputs[0]].shape[-1] if s.op == "linear" else 1) for s in chain)
        if len(chain) >= 2 and work >= 2 * MIN_GEMM_PIECE:
            items.append(Chain(tuple(chain), tuple(roles), tuple(views), _rows(buffers[chain[0].outputs[0]].shape)))
        else:
            items.extend(met)
        for pending in (chain, roles, views, met):
            pending.clear()

    made_by_view: set[str] = set()
    for step in entry.steps:
        out_shape = buffers[step.outputs[0]].shape
        step_roles = [None if i is None else "whole" if step.op == "linear" and k > 0
                      else _row_role(buffers[i].shape, out_shape) for k, i in enumerate(step.inputs)]
        joins = (step.op in ROW_LOCAL and len(out_shape) >= 2 and _rows(out_shape) > GEMV_ROWS
                 and buffers[step.outputs[0]].dtype == "float32"
                 and all(r is not None for r, i in zip(step_roles, step.inputs) if i is not None)
                 and not made_by_view & set(step.inputs)
                 and (not chain or _rows(out_shape) == _rows(buffers[chain[0].outputs[0]].shape)))
        if joins:
            chain.append(step), roles.append(tuple(step_roles)), met.append(step)
        elif chain and step.op in VIEWS:
            views.append(step), made_by_view.add(step.outputs[0]), met.append(step)
        else:
            if chain:
                close()
            made_by_view.clear()
            items.append(step)
    if chain:
        close()
    return items


def _steps_of(item) -> tuple:
    """A plan item's program steps in the order the caller runs them: a chain's steps, then its views."""
    return (*item.steps, *item.views) if isinstance(item, Chain) else (item,)


def _chain_pieces(chain: Chain, array: Callable[[str], np.ndarray], parts: int) -> Pieces | None:
    """One piece per block of rows, each running every step of `chain` over its rows; None if some argument
    or output cannot be taken as a [rows, width] view."""
    def shaped(name, role):
        x = array(name)
        return x if role == "whole" else _viewed(x, (chain.rows, x.shape[-1]) if role == "rows" else x.shape[-1:])
    args, outs = [], []
    for step, roles in zip(chain.steps, chain.roles):
        step_args = [None if name is None else shaped(name, role) for name, role in zip(step.inputs, roles)]
        out = _viewed(array(step.outputs[0]), (chain.rows, -1))
        if out is None or any(x is None for x, name in zip(step_args, step.inputs) if name is not None):
            return None
        args.append(step_args), outs.append(out)

    def piece(lo, hi):
        def run():
            for step, step_args, roles, out in zip(chain.steps, args, chain.roles, outs):
                step_args = [x[lo:hi] if role == "rows" else x for x, role in zip(step_args, roles)]
                if step.op == "linear":
                    _linear_into(out[lo:hi], *step_args)
                else:
                    _fill(out[lo:hi], OPS[step.op], *step_args, **step.attrs)
        return run
    return [piece(a, b) for a, b in _bounds(chain.rows, parts)]


# ---- the static plan: every array a worker touches has a fixed place -------------------------------------
# The workers are processes, not threads: two threads each making ~50 short numpy calls per layer fight for
# the GIL (a 64 x 1536 GELU: 0.49 ms alone, 0.8 ms beside a thread doing the same, 0.47 ms beside a process;
# MiniLM's forward pass takes 0.89-0.91 of its time with threads). So that a hand-off stays two integers,
# every piece is bound once, when the program loads, to arrays with fixed addresses: the weights (shared
# copy-on-write by the fork) and slots of one shared mapping (the arena), laid out by liveness so that a
# run's working set stays as small as with fresh arrays. Then the workers are forked. A run copies its
# inputs into their slots and its outputs out, and holds the session's lock throughout.

@dataclass(frozen=True)
class Split:
    """An item whose pieces run one per worker, piece 0 in the caller."""
    index: int
    pieces: tuple[Callable[[], None], ...]
    outputs: tuple[tuple[str, np.ndarray], ...]  # (buffer, its slot): what the run sees once the pieces ran
    then: tuple  # steps the caller runs right after (the views met inside a chain)
    steps: int   # program steps it stands for


@dataclass(frozen=True)
class Bound:
    """One entry, ready to run: its items (Split or Step) and the arrays with fixed places."""
    items: tuple
    arena: dict          # buffer -> weight, slot, or a view of either
    copied: frozenset    # slots the caller fills with its own steps' outputs, for the workers to read
    inputs: tuple = ()   # entry inputs a worker reads: copied into their slots first


@dataclass
class _Layout:
    items: list          # (item, splits)
    alias: dict          # buffer -> the buffer it views (view steps, in-place ops)
    producer: dict       # buffer -> the step that makes it
    offsets: dict        # slot buffer -> byte offset in the arena
    spans: dict          # slot buffer -> (first, last) item that touches it or a view of it
    viewed: list         # buffers workers read that are views of slots or weights, in program order
    copied: set          # slots no split item writes: the caller fills them (entry inputs, its own steps)
    size: int            # the arena's bytes


ALIGN = 64  # slot offsets: one cache line


def _layout(program: Program, entry, weights: dict, parts: int) -> _Layout:
    """Which items split, judged on stand-ins (np.empty, no memory touched) with the arena's strides; which
    buffers the workers need in the arena (a slot each, or a view of a slot or weight); and where the slots
    go, two sharing bytes only if their lives, from the first item that touches one to the last, are apart."""
    buffers = program.buffers
    per_run = set(program.buffers_of(Usage.STATE))  # the caller's State arrays: bound at run time, not here
    standin = dict(weights)

    def get(name):
        if name not in standin:
            standin[name] = np.empty(buffers[name].shape, buffers[name].dtype)
        return standin[name]
    alias, producer, items = {}, {}, []
    for item in plan(program, entry):
        steps = _steps_of(item)
        reads = {i for s in steps for i in s.inputs if i is not None}
        splits = False
        if not reads & per_run:
            if isinstance(item, Chain):
                splits = _chain_pieces(item, get, parts) is not None
            elif item.op in SPLITTERS:
                splits = SPLITTERS[item.op](parts, get(item.outputs[0]), *[None if i is None else get(i)
                                                                        for i in item.inputs], **item.attrs) is not None
        items.append((item, splits))
        for s in steps:
            out, op = s.outputs[0], OPS[s.op]
            producer[out] = s
            source = s.inputs[op.inplace] if op.inplace is not None else s.inputs[0] if s.op in VIEWS else None
            if source is None:
                continue
            if source in per_run:
                per_run.add(out)
            elif op.inplace is not None:
                alias[out], standin[out] = source, get(source)
            elif np.may_share_memory(view := op.ref(get(source), **s.attrs), get(source)):
                alias[out], standin[out] = source, view

    root = lambda b: root(alias[b]) if b in alias else b  # noqa: E731
    slots, viewed, written = set(), set(), set()

    def need(b):
        if b in weights:
            return
        if b in alias:
            viewed.add(b)
            need(alias[b])
        else:
            slots.add(b)
    for item, splits in items:
        if splits:
            steps = item.steps if isinstance(item, Chain) else (item,)
            for s in steps:
                for b in (*s.inputs, *s.outputs):
                    if b is not None:
                        need(b)
                written.update(s.outputs)
    first, last = {}, {}
    for i, (item, splits) in enumerate(items):
        steps = _steps_of(item)
        for s in steps:
            for b in (*s.inputs, *s.outputs):
                r = None if b is None else root(b)
                if r in slots:
                    first[r], last[r] = min(first.get(r, i), i), max(last.get(r, i), i)
    for b in entry.inputs.values():
        first[b] = -1
    for b in entry.outputs.values():
        if root(b) in slots:
            last[root(b)] = len(items)
    spans = {b: (first[b], last[b]) for b in slots}
    offsets, size = _place(spans, {b: buffers[b].nbytes for b in slots})
    order = {b: i for i, b in enumerate(producer)}
    return _Layout(items, alias, producer, offsets, spans, sorted(viewed, key=order.__getitem__), slots - written,
                   size)


def _place(spans: dict, nbytes: dict) -> tuple[dict, int]:
    """Byte offsets for slots living over `spans` (first, last item): each at the lowest aligned offset
    clear of every slot placed before it whose span overlaps its own; the biggest first, as they leave the
    fewest gaps. Returns the offsets and the arena's size."""
    offsets, placed, size = {}, [], 0
    for b in sorted(spans, key=lambda b: -nbytes[b]):
        (first, last), offset = spans[b], 0
        for start, end in sorted((o, e) for o, e, (f, t) in placed if f <= last and first <= t):
            if offset + nbytes[b] <= start:
                break
            offset = max(offset, -(-end // ALIGN) * ALIGN)
        offsets[b] = offset
        placed.append((offset, offset + nbytes[b], spans[b]))
        size = max(size, offset + nbytes[b])
    return offsets, size


def bind(program: Program, entry, layout: _Layout, memory: np.ndarray, weights: dict, parts: int,
         splits: list) -> Bound:
    """The entry's items over `memory` (the arena): each split item's pieces made once and appended to
    `splits` (a worker asked for split i runs its piece of splits[i])."""
    arena, inputs = dict(weights), set(entry.inputs.values())
    for b, offset in layout.offsets.items():
        buf = program.buffers[b]
        arena[b] = memory[offset:offset + buf.nbytes].view(buf.dtype).reshape(buf.shape)
    for b in layout.viewed:
        step = layout.producer[b]
        arena[b] = (arena[layout.alias[b]] if OPS[step.op].inplace is not None
                    else OPS[step.op].ref(arena[step.inputs[0]], **step.attrs))
    items = []
    for item, splits_here in layout.items:
        if not splits_here:
            items.extend(_steps_of(item))
            continue
        if isinstance(item, Chain):
            pieces, then, steps = _chain_pieces(item, arena.__getitem__, parts), item.views, item.steps
        else:
            pieces = SPLITTERS[item.op](parts, arena[item.outputs[0]],
                                        *[None if i is None else arena[i] for i in item.inputs], **item.attrs)
            then, steps = (), (item,)
        split = Split(len(splits), tuple(pieces), tuple((s.outputs[0], arena[s.outputs[0]]) for s in steps),
                      then, len(steps))
        splits.append(split)
        items.append(split)
    return Bound(tuple(items), arena, frozenset(layout.copied), tuple(b for b in layout.copied if b in inputs))


class _Worker:
    """A forked process that runs its piece of a split item when asked.

    The request (its number and the split's index), the number of the last piece finished and that piece's
    error live in a small shared mapping; the pipes only wake the other side. A Ctrl-C that lands anywhere
    in the hand-off therefore cannot lose a wake-up: the caller re-reads the numbers, and rings again."""

    REQUEST, INDEX, FINISHED, ERROR = range(4)  # int64 fields of the shared header; the pickled error after

    def __init__(self, splits: list[Split], k: int):
        self.control = mmap.mmap(-1, 1 << 16)
        self.header = np.frombuffer(self.control, np.int64, 4)
        doorbell, self.bell = os.pipe()
        self.woken, wake = os.pipe()
        try:
            self.pid = os.fork()
        except OSError:
            for fd in (doorbell, self.bell, self.woken, wake):
                os.close(fd)
            raise
        if self.pid == 0:  # the worker: never returns
            status = 1
            try:
                _serve(splits, k, self, doorbell, wake)
                status = 0
            finally:
                os._exit(status)
        os.close(doorbell), os.close(wake)

    def ask(self, index: int) -> None:
        self.header[self.INDEX] = index
        self.header[self.REQUEST] += 1  # the request is made once this store is
        self.ring()

    def ring(self) -> None:
        try:
            os.write(self.bell, b"\0")
        except BrokenPipeError:
            raise self.ended() from None

    def ended(self) -> SdkError:
        return SdkError(f"a cpu worker process (pid {self.pid}) ended during a run",
                        fix="open a new Session; if it happens again, set AIE_APPS_THREADS=1")

    def wait(self, ring: bool) -> BaseException | None:
        """Until the last request is done (ring: the request may not have rung yet); its error, if any. Safe
        to call again after a Ctrl-C cut it short."""
        if ring and self.header[self.FINISHED] != self.header[self.REQUEST]:
            self.ring()
        while self.header[self.FINISHED] != self.header[self.REQUEST]:
            if not os.read(self.woken, 1):
                raise self.ended()
        n = int(self.header[self.ERROR])
        return pickle.loads(self.control[32:32 + n]) if n else None


def _serve(splits: list[Split], k: int, worker: _Worker, doorbell: int, wake: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's: it waits for this piece, then raises
    gc.disable()  # a collection would touch, and so copy, every object inherited from the parent
    for low, high in ((3, min(doorbell, wake)), (min(doorbell, wake) + 1, max(doorbell, wake)),
                      (max(doorbell, wake) + 1, os.sysconf("SC_OPEN_MAX"))):
        os.closerange(low, high)  # others' pipes, files, a camera: this process must not hold them open
    ThreadpoolController().limit(limits=1, user_api="blas")
    header = worker.header
    while os.read(doorbell, 1):  # end of file: the session closed, or its process ended
        number = header[worker.REQUEST]
        if number == header[worker.FINISHED]:
            continue  # rung again for a request already done
        try:
            splits[int(header[worker.INDEX])].pieces[k]()
            report = b""
        except BaseException as e:  # raised in the caller
            report = _pickled(e, len(worker.control) - 32)
        worker.control[32:32 + len(report)] = report
        header[worker.ERROR] = len(report)
        header[worker.FINISHED] = number
        os.write(wake, b"\0")


def _pickled(error: BaseException, limit: int) -> bytes:
    try:
        report = pickle.dumps(error)
    except Exception:
        report = b""
    if not report or len(report) > limit:
        report = pickle.dumps(RuntimeError(f"{type(error).__name__} in a cpu worker: {str(error)[:2000]}"))
    return report


def _stop(owner: int, workers: list[_Worker]) -> None:
    if os.getpid() != owner:  # a copy of this object in a process forked from its owner: not ours to stop
        return
    for worker in workers:
        os.close(worker.bell)  # the worker reads end of file and exits
    for worker in workers:
        os.close(worker.woken)
        try:
            os.waitpid(worker.pid, 0)
        except ChildProcessError:  # already reaped by someone else
            pass


class Workers:
    """The caller and `n - 1` worker processes, forked once every split item of the program is bound."""

    def __init__(self, splits: list[Split], n: int):
        self.owner, self.procs = os.getpid(), []
        self._stop = weakref.finalize(self, _stop, self.owner, self.procs)
        try:
            for k in range(1, n if splits else 1):
                self.procs.append(_Worker(splits, k))
        except OSError as e:
            self.close()
            raise SdkError(f"cannot start the cpu backend's worker processes: {e}",
                           fix="set AIE_APPS_THREADS=1 to run on one core without them") from None

    def spread(self, split: Split) -> None:
        """Every piece of `split` run (the first here) before this returns or raises, so that no piece still
        writes into the arena when the next step, or the next run, reads it."""
        in_flight = True
        try:
            for worker in self.procs[:len(split.pieces) - 1]:
                worker.ask(split.index)
            split.pieces[0]()
            in_flight = False
        finally:
            interrupted = False
            while True:  # every worker waited for, whatever Ctrl-C cuts short; raised once they all are
                try:
                    errors = [worker.wait(ring=in_flight) for worker in self.procs]
                    break
                except KeyboardInterrupt:
                    interrupted = True
        if interrupted:
            raise KeyboardInterrupt
        error = next((e for e in errors if e is not None), None)
        if error is not None:
            raise error

    def close(self):
        self._stop()


class CpuExecutable:
    def __init__(self, program: Program, weights: Mapping[str, np.ndarray], threads: int, engine: str = "opencv"):
        bad = [s.op for e in program.entries.values() for s in e.steps if s.kind != "host"]
        if bad:
            raise ValueError(f"the cpu backend runs host steps only; this program has {bad[:3]} (target "
                             f"{program.target})")
        self.program = program
        self.threads = max(1, threads) if hasattr(os, "fork") else 1  # the other workers are forked processes
        weights = check_weights(program, weights)
        self.engines: dict[str, str] = {}  # entry -> "opencv", or "numpy: <why not opencv>"
        plans = {}
        for name, e in program.entries.items():
            how = opencv_net.plan(program, e) if engine == "opencv" else "the numpy engine was asked for"
            self.engines[name] = f"numpy: {how}" if isinstance(how, str) else "opencv"
            if not isinstance(how, str):
                plans[name] = how
        if plans:
            cv2.setNumThreads(self.threads)  # process-wide: OpenCV has one thread pool
        numpy_entries = {name: e for name, e in program.entries.items() if name not in plans}
        # all of them: networks are written from these, and numpy runs an entry whose network fails
        self.weights = linear_layout(program, numpy_entries.values(), weights)
        self.networks = opencv_net.Networks(program, plans, self.weights)
        self.counters = Counters()
        self.closed = False
        self.weight_streaming = {name for name, e in numpy_entries.items() if _weight_streaming(program, e)}
        self.lock = threading.Lock()  # a run fills the arena: threads running one session take turns
        self.blas = ThreadpoolController()
        layouts = {name: _layout(program, e, self.weights, self.threads) for name, e in numpy_entries.items()
                   if self.threads > 1 and name not in self.weight_streaming}
        self.memory = mmap.mmap(-1, max([ALIGN] + [layout.size for layout in layouts.values()]))
        splits: list[Split] = []
        self.bound = {name: bind(program, e, layouts[name], np.frombuffer(self.memory, np.uint8), self.weights,
                                 self.threads, splits) if name in layouts
                      else Bound(e.steps, {}, frozenset()) for name, e in numpy_entries.items()}
        self.workers = Workers(splits, self.threads)  # forked once every piece exists
        if len(plans) == 1:  # one network (an encoder): built now, so that the first run is not the slow one
            self._network(next(iter(plans)))

    def new_state(self) -> State:
        return State({n: np.zeros(b.shape, b.dtype) for n, b in self.program.buffers_of(Usage.STATE).items()})

    def run(self, entry: str | None, inputs: Mapping[str, np.ndarray], state: State | None = None) -> dict:
        if self.closed:  # its worker processes are gone: a run would wait for them forever
            raise UsageError("this cpu session is closed", fix="open a new Session")
        if os.getpid() != self.workers.owner:
            raise UsageError("this cpu session was opened in another process (this one was forked from it)",
                             fix="open a new Session in this process")
        program_entry = self.program.entry(entry)
        env: dict[str, np.ndarray] = {**self.weights, **check_inputs(self.program, entry, inputs)}
        if state is not None:
            env.update(state.buffers)
        if program_entry.name in self.networks.plans:
            with self.lock:
                outputs = self._run_network(program_entry.name, env)
            if outputs is not None:
                self.counters.host_ops += len(program_entry.steps)
                self.counters.runs += 1
                return {name: outputs[buf] for name, buf in program_entry.outputs.items()}
        bound = self.bound[program_entry.name]
        if program_entry.name in self.weight_streaming:
            outputs = self._steps(bound, env, program_entry)
        else:
            with self.lock, self.blas.limit(limits=1, user_api="blas"):
                outputs = self._steps(bound, env, program_entry)
        self.counters.runs += 1
        return outputs

    def _network(self, name: str) -> opencv_net.OpencvEntry | None:
        """The entry's network, or None when OpenCV cannot load it (an OpenCV build that lacks a layer): from
        then on numpy runs the entry, step by step on BLAS's threads, and `engines` says why."""
        try:
            return self.networks.get(name)
        except cv2.error as e:
            self._give_up(name, "cannot load it", e)
            return None

    def _run_network(self, name: str, env: dict) -> dict | None:
        """The entry's outputs from its network, or None when OpenCV fails (numpy runs it from then on).
        Under the lock: another thread may have given up on this network while this one waited."""
        if name not in self.networks.plans:
            return None
        net = self._network(name)
        try:
            return net.run(env) if net else None
        except cv2.error as e:  # before any state is written: numpy starts the run again from the inputs
            self._give_up(name, "failed to run it", e)
            return None

    def _give_up(self, name: str, what: str, error: Exception) -> None:
        self.engines[name] = f"numpy: OpenCV {what}: {str(error).strip().splitlines()[0]}"  # the line with the cause
        del self.networks.plans[name]
        self.networks.live.pop(name, None)
        # whole steps on BLAS's threads: no worker holds pieces of this entry
        self.bound[name] = Bound(self.program.entries[name].steps, {}, frozenset())
        self.weight_streaming.add(name)

    def _steps(self, bound: Bound, env: dict, entry) -> dict:
        for name in bound.inputs:  # entry inputs a worker reads
            np.copyto(bound.arena[name], env[name])
            env[name] = bound.arena[name]
        for item in bound.items:
            if isinstance(item, Split):
                self.workers.spread(item)
                env.update(item.outputs)
                self.counters.host_ops += item.steps
                for step in item.then:
                    self._step(step, bound, env)
            else:
                self._step(item, bound, env)
        # the caller's own arrays, never a view of state, weights, another output or the arena (which the next
        # run overwrites: so copied before the lock is let go)
        return {name: np.array(env[buf]) if self.program.buffers[buf].usage is Usage.STATE
                or not env[buf].flags.owndata else env[buf] for name, buf in entry.outputs.items()}

    def _step(self, step, bound: Bound, env: dict):
        try:
            args = [env[i] if i is not None else None for i in step.inputs]
        except KeyError as e:
            raise ValueError(f"step {step.op} reads {e}, which nothing wrote: a state buffer needs a State "
                             f"(session.new_state())") from None
        op, out = OPS[step.op], step.outputs[0]
        args = [args] if op.variadic else args
        if out in bound.copied:  # a worker reads it: made in its slot
            _fill(bound.arena[out], op, *args, **step.attrs)
            env[out] = bound.arena[out]
        else:
            env[out] = op.ref(*args, **step.attrs)
        self.counters.host_ops += 1

    def close(self):
        self.closed = True
        self.weights, self.bound, self.memory = {}, {}, None  # the arena is unmapped with its last view
        self.networks.live.clear()
        self.networks.weights = {}
        self.workers.close()


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, <malloc.h>


@functools.cache
def keep_freed_memory() -> None:
    """Have glibc keep freed blocks for the next step instead of handing them back to the kernel.

    Each step returns fresh arrays of 0.1-10 MB; by default glibc maps such blocks anew and unmaps them when
    freed, so every step first takes a page fault per 4 KiB it writes (slow in a VM): MiniLM's forward pass
    spent ~20 % of its time there. Process-wide, so done once per process; without glibc it does nothing."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "mallopt") or not hasattr(libc, "gnu_get_libc_version"):
        return
    libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)   # blocks below 32 MiB come from the heap and are reused
    libc.mallopt(M_TRIM_THRESHOLD, 256 << 20)  # the heap keeps up to 256 MiB of freed memory


class CpuBackend:
    name = "cpu"
    target = "cpu"

    def __init__(self, threads: int | None = None, engine: str | None = None):
        settings = load_settings()
        self.threads = threads or settings.threads
        self.engine = engine or settings.cpu_engine
        if self.engine not in CPU_ENGINES:
            source = "" if engine else " (from AIE_APPS_CPU_ENGINE)"
            raise UsageError(f"unknown cpu engine {self.engine!r}{source}", fix=f"use one of {', '.join(CPU_ENGINES)}")

    def load(self, program: Program, weights: Mapping[str, np.ndarray]) -> CpuExecutable:
        keep_freed_memory()
        return CpuExecutable(program, weights, self.threads, self.engine)
