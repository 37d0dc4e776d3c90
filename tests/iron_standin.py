"""A minimal stand-in of the IRON python API of the pinned mlir-aie (v1.4.5, `TOOLCHAIN_PIN` in sdk/compiler/npu.py)
with the names and signatures the designs in kernels/ use, for tests on machines without the toolchain. Every
signature follows the v1.4.5 source; kernels/README.md ("IRON API of v1.4.5") lists each with its file and line.

Like the real API it refuses what v1.4.5 refuses, with the same exception types: the Runtime is
`Runtime(seq_fn, fn_args)` (it has no sequence(), fill(), drain(), start() or task_group()); transfers are
`handle.fill()` / `handle.drain()` on a producer / consumer handle, inside the sequence body only; a TaskGroup is
made inside the body and closed with `finish()`, and a transfer joins it with `group=`; a transfer's shim tile is
its handle's (`.prod(tile=)` / `.cons(tile=)`, a producer pinned once); placement is `tile=` on Worker, split, join
and forward, and resolve_program() takes no placer (SequentialPlacer is gone); Buffer replaces GlobalBuffer; an
ObjectFifo's stream walks are TensorAccessPatterns over one object (`to_stream=`, `from_stream=`) and its depth is
keyword-only; `Program(dev, rt, workers=[...])` resolves every fifo before the body runs, so a runtime handle the
body fills but the Runtime was not given has no endpoint then; mixing the default and explicit task groups is an
error; a Kernel called with the wrong number of arguments raises.

It records what a design builds instead of emitting MLIR: ObjectFifos (depth, object type, stream walks, links
through memtiles), Workers (placement, stack, arguments), Kernel calls made while the core functions are traced,
Buffers and the runtime sequence's fills / drains with their TensorAccessPatterns. `check(design, target)` then
checks what the toolchain would refuse or the hardware could not do: L1 (64 KB with the stack) and memtile
(512 KB) use, DMA channels per tile, buffer descriptors and their dimensions, kernel call signatures against the
C++ sources, and that every object a fill produces is consumed and every object a core produces is drained. A
runtime sequence records the tensor types it declares; `check_runs(module)` checks that every `aiex.run` of the
fused design's composed module passes exactly those, in count, shape and dtype (what MLIR verification of the
call would refuse; on the device a kernel would read the wrong buffer). Like IRON's own tracing, `range_` runs its
body once (the loop becomes an scf.for); the stand-in multiplies the acquisitions inside by the trip count.
Test-only: never imported by kernels/.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import re
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import get_origin

import numpy as np

KERNELS = Path(__file__).resolve().parents[1] / "kernels"


def _obj(t) -> tuple[tuple, np.dtype]:
    shape, dtype = t.__args__
    return tuple(shape), np.dtype(dtype.__args__[0])


def _nbytes(t) -> int:
    shape, dtype = _obj(t)
    return math.prod(shape) * dtype.itemsize


def _flat(args):
    """fn_args with nested lists / tuples flattened to their leaves (helpers/util.py flatten_fn_args)."""
    for a in args:
        if isinstance(a, (list, tuple)):
            yield from _flat(a)
        else:
            yield a


# ---- placement ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tile:
    col: int
    row: int

    @property
    def kind(self) -> str:
        return {0: "shim", 1: "memtile"}.get(self.row, "core")


AnyShimTile, AnyMemTile, AnyComputeTile = Tile(-1, 0), Tile(-1, 1), Tile(-1, 2)


class Device:
    shim_bds = 16   # AIE2TargetModel::getNumBDs of a shim tile, npu1 and npu2 alike (kernels/README.md)

    def __init__(self, name, cols):
        self.name, self.cols = name, cols


def NPU1():  # noqa: N802 - IRON's names
    return Device("npu1", 4)


def NPU2():  # noqa: N802
    return Device("npu2", 8)


# ---- tracing state ------------------------------------------------------------------------------------------

_MULT = [1]
_SERIAL = itertools.count()   # creation order of fifos and Workers (_drop_leftovers)


def range_(*args):
    n = range(*args)
    _MULT.append(_MULT[-1] * len(n))
    try:
        yield n.start
    finally:
        _MULT.pop()


class TensorAccessPattern:
    def __init__(self, tensor_dims, offset, sizes, strides):
        self.tensor_dims, self.offset = tuple(tensor_dims), int(offset)
        self.sizes, self.strides = [int(s) for s in sizes], [int(s) for s in strides]

    @property
    def size(self) -> int:
        return math.prod(self.sizes)

    def addresses(self) -> np.ndarray:
        idx = np.full(self.sizes, self.offset, np.int64)
        for axis, (n, s) in enumerate(zip(self.sizes, self.strides)):
            shape = [1] * len(self.sizes)
            shape[axis] = n
            idx = idx + np.arange(n).reshape(shape) * s
        return idx.reshape(-1)


def _walk(tap, what):
    """A stream walk of an ObjectFifo: a TensorAccessPattern at offset 0 over one object (objectfifo.py
    _object_walk; its size is checked when the Program resolves the fifo, _check_walk_sizes)."""
    if tap is None:
        return None
    if not isinstance(tap, TensorAccessPattern):
        raise TypeError(f"{what} takes a TensorAccessPattern, got {type(tap).__name__}")
    if tap.offset:
        raise ValueError(f"{what} {tap.sizes}/{tap.strides} has offset {tap.offset}; a stream walk starts at 0")
    return tap


def _dims(tap) -> list[tuple[int, int]]:
    return [] if tap is None else list(zip(tap.sizes, tap.strides))


# ---- object fifos -------------------------------------------------------------------------------------------

@dataclass
class Link:
    kind: str            # split | join | forward
    placement: Tile
    src: list            # fifos
    dst: list
    offsets: list = field(default_factory=list)


class RuntimeEndpoint:
    def __init__(self, tile):
        self.tile = AnyShimTile if tile is None else tile


class ObjectFifo:
    def __init__(self, obj_type, *, depth=2, name=None, to_stream=None, from_stream_per_cons=None, plio=False,
                 pad_value=0, disable_synchronization=False, repeat_count=None, delegate_tile=None, via_DMA=False,
                 init_values=None, consumer_obj_type=None, aie_stream=None, packet=False, packet_id=None):
        if depth is not None and depth < 1:
            raise ValueError(f"Default ObjectFifo depth must be > 0, but got {depth}")
        self.obj_type, self.depth, self.name = obj_type, depth, name
        self.to_stream = _walk(to_stream, "to_stream")
        self.from_stream_per_cons = _walk(from_stream_per_cons, "from_stream_per_cons")
        self._prod = None
        self.cons_handles: list[Handle] = []
        self.link_in: Link | None = None   # the link that produces into this fifo
        self.link_out: Link | None = None  # the link that consumes it
        self.serial = next(_SERIAL)
        RECORD.fifos.append(self)

    @property
    def nbytes(self) -> int:
        return _nbytes(self.obj_type)

    @property
    def elements(self) -> int:
        return math.prod(_obj(self.obj_type)[0])

    @property
    def dims_to_stream(self) -> list[tuple[int, int]]:
        return _dims(self.to_stream)

    def prod(self, depth=None, channel=None, tile=None):
        if self._prod is None:
            self._prod = Handle(self, True, depth or self.depth, tile=tile)
        elif tile is not None and self._prod.shim_tile != tile:
            raise ValueError(f"Producer handle for {self.name} already pinned to shim tile {self._prod.shim_tile}, "
                             f"cannot re-pin to {tile}.")
        return self._prod

    def cons(self, depth=None, from_stream=None, channel=None, tile=None):
        h = Handle(self, False, depth or self.depth, _walk(from_stream, "from_stream") or self.from_stream_per_cons,
                   tile=tile)
        self.cons_handles.append(h)
        return h


class Handle:
    """ObjectFifoHandle."""

    def __init__(self, fifo, is_prod, depth, from_stream=None, tile=None):
        if depth is None or depth < 1:
            raise ValueError(f"Depth must be > 0 but is {depth}")
        if is_prod and from_stream is not None:
            raise ValueError("Can only specify from_stream for cons handles")
        self.fifo, self.is_prod, self.depth, self.from_stream = fifo, is_prod, depth, from_stream
        self.shim_tile = tile
        self._endpoint = None   # a Worker, a RuntimeEndpoint or a Link
        self.count = 0          # objects acquired (times enclosing trip counts)
        self.held = 0

    @property
    def endpoint(self):
        return self._endpoint

    @endpoint.setter
    def endpoint(self, endpoint):
        if self._endpoint is not None and self._endpoint is not endpoint:
            raise ValueError(f"Endpoint already set for ObjectFifoHandle {self.fifo.name}."
                             f"{'prod' if self.is_prod else 'cons'}")
        self._endpoint = endpoint

    @property
    def dims_from_stream(self) -> list[tuple[int, int]]:
        return _dims(self.from_stream)

    def acquire(self, n):
        if n > self.depth:
            raise ValueError(f"acquire {n} > depth {self.depth} of {self.fifo.name}")
        self.held += n
        if self.held > self.depth:
            raise ValueError(f"{self.fifo.name}: {self.held} objects held, depth {self.depth}")
        self.count += n * _MULT[-1]
        if n == 1:
            return Element(self.fifo.obj_type, self.fifo.name)
        return [Element(self.fifo.obj_type, self.fifo.name) for _ in range(n)]

    def release(self, n):
        if n > self.held:
            raise ValueError(f"{self.fifo.name}: release {n} of {self.held} held")
        self.held -= n

    def fill(self, source, tap=None, wait=False, packet=None, offset_parameter=None, group=None, managed=True,
             length_parameter=None, length_unit=None):
        if not self.is_prod:
            raise ValueError("fill() is only valid on a producer ObjectFifoHandle")
        _active().transfer("fill", self, source, tap, group, offset_parameter)

    def drain(self, dest, tap=None, wait=False, packet=None, offset_parameter=None, group=None, managed=True,
              length_parameter=None, length_unit=None):
        if self.is_prod:
            raise ValueError("drain() is only valid on a consumer ObjectFifoHandle")
        _active().transfer("drain", self, dest, tap, group, offset_parameter)

    def _link(self, kind, tile, n, offsets, depths, obj_types, names, to_stream, from_stream):
        if tile is None:
            tile = AnyMemTile
        for what, given in (("depths", depths), ("obj_types", obj_types), ("names", names),
                            ("to_stream", to_stream), ("from_stream", from_stream)):
            if given is not None and len(given) != n:
                raise ValueError(f"Number of {what} does not match number of offsets")
        obj_types = obj_types or [self.fifo.obj_type] * n
        depths = depths or [self.depth] * n
        names = names or [f"{self.fifo.name}_{kind}{i}" for i in range(n)]
        to_stream = to_stream or [None] * n
        from_stream = from_stream or [None] * n
        subs = [ObjectFifo(obj_types[i], depth=depths[i], name=names[i], to_stream=to_stream[i],
                           from_stream_per_cons=None if kind == "join" else from_stream[i]) for i in range(n)]
        link = Link(kind, tile, [self.fifo] if kind != "join" else subs, subs if kind != "join" else [self.fifo],
                    list(offsets))
        RECORD.links.append(link)
        self.endpoint = link
        if kind == "join":
            self.fifo.link_in = link
            for s, walk in zip(subs, from_stream):
                s.link_out = link
                s.cons(depth=s.depth, from_stream=walk).endpoint = link
        else:
            self.fifo.link_out = link
            for s in subs:
                s.link_in = link
                s.prod().endpoint = link
        return subs

    def split(self, offsets, tile=AnyMemTile, depths=None, obj_types=None, names=None, to_stream=None,
              from_stream=None, plio=False, repeat_counts=None, pad_value=None, channels=None):
        if self.is_prod:
            raise ValueError("Cannot split() a prod ObjectFifoHandle")
        return self._link("split", tile, len(offsets), offsets, depths, obj_types, names, to_stream, from_stream)

    def join(self, offsets, tile=AnyMemTile, depths=None, obj_types=None, names=None, to_stream=None,
             from_stream=None, plio=False, repeat_counts=None):
        if not self.is_prod:
            raise ValueError("Cannot join() a cons ObjectFifoHandle")
        return self._link("join", tile, len(offsets), offsets, depths, obj_types, names, to_stream, from_stream)

    def forward(self, tile=AnyMemTile, obj_type=None, depth=None, name=None, to_stream=None, from_stream=None,
                plio=False, repeat_count=None, pad_value=0, channel=None):
        if self.is_prod:
            raise ValueError("Cannot forward a prod ObjectFifoHandle")
        return self._link("forward", tile, 1, [0], [depth] if depth else None, [obj_type] if obj_type else None,
                          [name] if name else None, [to_stream] if to_stream is not None else None,
                          [from_stream] if from_stream is not None else None)[0]


class Element:
    """An acquired object: what a kernel call receives."""

    def __init__(self, obj_type, fifo_name):
        self.obj_type, self.fifo_name = obj_type, fifo_name


# ---- workers, kernels, buffers ------------------------------------------------------------------------------

class Buffer:
    def __init__(self, type=None, initial_value=None, name=None, tile=None, use_write_rtp=False,  # noqa: A002
                 address=None, mem_bank=None):
        if type is None and initial_value is None:
            raise ValueError("Must provide either type, initial value, or both.")
        if type is None:
            type = np.ndarray[initial_value.shape, np.dtype[initial_value.dtype]]  # noqa: A001
        self.obj_type, self.initial_value, self.name, self.tile = type, initial_value, name, tile
        if initial_value is not None:
            shape, dtype = _obj(type)
            if tuple(np.shape(initial_value)) != shape or np.asarray(initial_value).dtype != dtype:
                raise ValueError(f"Buffer {name}: initial value does not match its type")


class Kernel:
    def __init__(self, name, object_file_name, arg_types=()):
        self.name, self.bin_name, self.arg_types = name, object_file_name, list(arg_types)

    def __call__(self, *args):
        if len(args) != len(self.arg_types):
            raise ValueError(f"Kernel '{self.name}' expects {len(self.arg_types)} argument(s), but {len(args)} "
                             f"were provided.")
        RECORD.calls.append((self, args, RECORD.current_worker))


class Worker:
    def __init__(self, core_fn, fn_args=None, tile=AnyComputeTile, while_true=True, stack_size=None, data_size=None,
                 trace=None, trace_events=None, dynamic_objfifo_lowering=None):
        tile = AnyComputeTile if tile is None else tile
        if tile.kind != "core":
            raise ValueError(f"Worker requires a compute tile, but got {tile}")
        if stack_size is not None and (not isinstance(stack_size, int) or isinstance(stack_size, bool)
                                       or stack_size < 1):
            raise ValueError(f"Worker stack_size must be an int >= 1, but got {stack_size!r}")
        self.core_fn, self.fn_args, self.placement = core_fn, list(fn_args or []), tile
        self.stack_size = 0x400 if stack_size is None else stack_size
        bins = {a.bin_name for a in _flat(self.fn_args) if isinstance(a, Kernel)}
        if len(bins) > 1:
            raise ValueError(f"only one binary per worker; found {bins}")
        for a in _flat(self.fn_args):
            if isinstance(a, ObjectFifo):
                raise ValueError("Cannot give an ObjectFifo directly to a worker; must give an ObjectFifoHandle "
                                 "obtained through ObjectFifo.prod() or ObjectFifo.cons()")
            if isinstance(a, Handle):
                a.endpoint = self
            if isinstance(a, Buffer) and a.tile is None:
                a.tile = tile
        self.serial = next(_SERIAL)
        RECORD.workers.append(self)

    @property
    def tile(self):
        return self.placement

    @property
    def handles(self):
        return [a for a in _flat(self.fn_args) if isinstance(a, Handle)]

    @property
    def buffers(self):
        return [a for a in _flat(self.fn_args) if isinstance(a, Buffer)]


# ---- runtime ------------------------------------------------------------------------------------------------

class RuntimeData:
    """One tensor a runtime sequence declares: its type (shape, dtype) is what every `aiex.run` of the sequence
    must pass in that place (check_runs)."""
    def __init__(self, arr_type):
        self.arr_type = arr_type
        self.shape, self.dtype = _obj(arr_type)
        self.elements = math.prod(self.shape)

    @property
    def mlir_type(self) -> str:
        return _memref(self.shape, self.dtype)


@dataclass
class Transfer:
    kind: str           # fill | drain
    handle: Handle
    data: RuntimeData
    tap: TensorAccessPattern
    placement: Tile
    task_group: object = None
    offset_parameter: object = None   # a ScratchpadParameter added to the base address at run time
    freed: bool = False               # its group finished: its buffer descriptor is free again


class ScratchpadParameter:
    """IRON's per-run 32-bit word (`aiex.scratchpad_parameter`): the host writes it before each run; a fill or
    drain given it as `offset_parameter` adds it to its buffer descriptor's base address, in elements of the
    transfer's tensor (as xdna-engine's hardware probe of mlir-aie's scratchpad_addr_offset test shows)."""
    def __init__(self, name, dtype):
        if np.dtype(dtype) != np.int32:
            raise ValueError("a scratchpad parameter used as an address offset is an int32 word")
        self.name, self.dtype = name, np.dtype(dtype)


class IronRuntimeError(Exception):
    """runtime.py IronRuntimeError: an unrecoverable state at the end of the sequence body."""


class TooManyBufferDescriptors(ValueError):
    """What aiecc's runtime-sequence BD allocator (AIEAssignRuntimeSequenceBDIDs.cpp) refuses: a 17th buffer
    descriptor live on one shim tile. Raised while the sequence body runs, at the transfer that would take it."""


_ACTIVE: list = [None]   # the sequence body being run (runtime/_context.py)


def _active() -> "_Sequence":
    if _ACTIVE[0] is None:
        raise RuntimeError("Runtime data-movement (fill/drain/write/TaskGroup) may only be used inside the function "
                           "passed to Runtime(seq_fn, fn_args).")
    return _ACTIVE[0]


class TaskGroup:
    def __init__(self, id=None):  # noqa: A002
        active = _ACTIVE[0]
        if id is None:
            if active is None:
                raise RuntimeError("TaskGroup() must be constructed within the function passed to "
                                   "Runtime(seq_fn, fn_args).")
            id = active.next_id()  # noqa: A001
        self.group_id = id
        if active is not None:
            active.open.append(self)

    def finish(self):
        _active().finish(self)


def sync_parameters():
    """`aiex.sync_scratchpad_parameters_from_host`, in the sequence body (module-level from v1.4.0)."""
    _active()


class Runtime:
    def __init__(self, seq_fn, fn_args=None, *, strict_task_groups=True):
        self.seq_fn, self.fn_args, self.strict = seq_fn, list(fn_args or []), strict_task_groups
        self.data: list[RuntimeData] = []   # one per tensor type in fn_args, in order
        self.body_args = []
        for a in self.fn_args:
            if get_origin(a) is np.ndarray:
                self.data.append(RuntimeData(a))
                self.body_args.append(self.data[-1])
            else:
                self.body_args.append(a)
        self.handles = []
        for h in _flat(self.fn_args):   # registered now: their fifos resolve before the body runs
            if isinstance(h, Handle):
                if h.endpoint is None:
                    h.endpoint = RuntimeEndpoint(h.shim_tile)
                self.handles.append(h)
        self.transfers: list[Transfer] = []
        self.live: dict = {}       # shim tile -> buffer descriptors in use now
        self.peak: dict = {}       # shim tile -> the most ever in use at once


class _Sequence:
    """The body of a Runtime while it runs (runtime.py ActiveSequence): its task groups and transfers."""

    def __init__(self, rt: Runtime, device: Device):
        self.rt, self.device, self.ids, self.open = rt, device, iter(range(1, 1 << 30)), []
        self.default = TaskGroup(0)
        self.used_default = self.used_explicit = False

    def next_id(self) -> int:
        return next(self.ids)

    def transfer(self, kind, handle, data, tap, group, offset_parameter):
        rt = self.rt
        if not any(data is d for d in rt.data):
            raise ValueError(f"{kind}: not a RuntimeData of this Runtime's fn_args")
        if offset_parameter is not None and not isinstance(offset_parameter, (ScratchpadParameter, str)):
            raise TypeError("offset_parameter must be a ScratchpadParameter")
        if tap is None:
            tap = TensorAccessPattern((data.elements,), 0, [1, 1, 1, data.elements], [0, 0, 0, 1])
        if handle.endpoint is None:
            handle.endpoint = RuntimeEndpoint(handle.shim_tile)
        if group is None:
            self.used_default, group = True, self.default
        else:
            self.used_explicit = True
        placement = handle.endpoint.tile
        rt.transfers.append(Transfer(kind, handle, data, tap, placement, group, offset_parameter))
        rt.live[placement] = rt.live.get(placement, 0) + 1  # one descriptor per transfer until its group ends
        rt.peak[placement] = max(rt.peak.get(placement, 0), rt.live[placement])
        if rt.live[placement] > self.device.shim_bds:
            _refuse_too_many_live_bds(rt.transfers[-1], rt.live[placement], self.device.shim_bds)

    def finish(self, group):
        """Frees the group's buffer descriptors (its drains awaited)."""
        if group in self.open:
            self.open.remove(group)
        for t in self.rt.transfers:
            if t.task_group is group and not t.freed:
                t.freed = True
                self.rt.live[t.placement] -= 1

    def finalize(self):
        if self.open:
            raise IronRuntimeError(f"Failed to close task groups: {', '.join(str(g.group_id) for g in self.open)}")
        if self.rt.strict and self.used_default and self.used_explicit:
            raise IronRuntimeError("Mixing explicit task groups and the default task group is prohibited. Please "
                                   "assign all tasks to a task group.")
        self.finish(self.default)


def _refuse_too_many_live_bds(t: Transfer, live: int, limit: int):
    tile = t.placement
    raise TooManyBufferDescriptors(
        f"Too many simultaneously active buffer descriptors on tile ({tile.col},{tile.row}), which supports up to "
        f"{limit}: the {t.kind} of {t.handle.fifo.name} (sizes {t.tap.sizes}, strides {t.tap.strides}) would be "
        f"live descriptor {live}; put transfers in task groups that finish (their drains awaited) to free them")


class Program:
    def __init__(self, device, rt, workers=None):
        self.device, self.rt, self.workers = device, rt, list(workers or [])

    def resolve_program(self, device_name="main"):
        """Resolve every fifo (both ends known), trace every worker's core function once, then run the sequence
        body, as v1.4.5's Program does; returns the record."""
        global RECORD
        _drop_leftovers(self)
        strays = [w for w in RECORD.workers if not any(w is x for x in self.workers)]
        if strays:
            raise ValueError(f"{len(strays)} Workers were made but not given to Program(workers=[...])")
        for f in RECORD.fifos:
            if f._prod is None or f._prod.endpoint is None:
                raise ValueError(f"Prod endpoint not set for ObjectFifo {f.name}")
            if not f.cons_handles or any(c.endpoint is None for c in f.cons_handles):
                raise ValueError(f"Cons endpoint not set for ObjectFifo {f.name}")
            _check_walk_sizes(f)
        for w in self.workers:
            RECORD.current_worker = w
            for h in w.handles:
                h.count = h.held = 0
            w.core_fn(*w.fn_args)
            RECORD.current_worker = None
        seq = _Sequence(self.rt, self.device)
        _ACTIVE[0] = seq
        try:
            self.rt.seq_fn(*self.rt.body_args)
            seq.finalize()
        finally:
            _ACTIVE[0] = None
        RECORD.device, RECORD.runtime = self.device, self.rt
        done, RECORD = RECORD.snapshot(), Record()   # the next design (the fused build makes many) starts empty
        return done


def _drop_leftovers(program: Program) -> None:
    """Forget what an earlier design recorded and abandoned by refusing (a DesignError raised after it made fifos
    or Workers, before or while its Program resolved): that refusal is the error its caller reports, and v1.4.5
    resolves only what a Program reaches. Designs are built one after another, so this Program's objects begin
    with the earliest fifo or Worker it reaches (its Workers, their fifos, its runtime's fifos); a Worker made
    after that and not given to Program is still this design's mistake, and still refused."""
    reached = [*program.workers, *(h.fifo for w in program.workers for h in w.handles),
               *(h.fifo for h in program.rt.handles)]
    if not reached:
        return
    start = min(o.serial for o in reached)
    RECORD.fifos = [f for f in RECORD.fifos if f.serial >= start]
    RECORD.workers = [w for w in RECORD.workers if w.serial >= start]
    RECORD.links = [link for link in RECORD.links if all(f.serial >= start for f in link.src)]
    RECORD.calls = [c for c in RECORD.calls if c[2] is None or c[2].serial >= start]


def _check_walk_sizes(f: ObjectFifo) -> None:
    """objectfifo.py _check_walk_sizes: a walk covers one transfer: the object, or for a join's output or a
    split's input each input's / output's segment."""
    def segments(link):
        big = link.dst[0] if link.kind == "join" else link.src[0]
        ends = [*link.offsets[1:], big.elements]
        return [e - s for s, e in zip(link.offsets, ends)]

    walks = [("to_stream", f.to_stream, f.link_in if f.link_in is not None and f.link_in.kind == "join" else None)]
    walks += [("from_stream", c.from_stream, f.link_out if f.link_out is not None and f.link_out.kind == "split"
               else None) for c in f.cons_handles]
    for what, tap, link in walks:
        if tap is None:
            continue
        sizes = segments(link) if link is not None else [f.elements]
        numel = math.prod(tap.tensor_dims)
        if any(numel != s for s in sizes):
            raise ValueError(f"{f.name} {what} walks a tensor of shape {tap.tensor_dims}, but each transfer moves "
                             f"{sizes[0]} elements")


# ---- the record and installing the stand-in -----------------------------------------------------------------

@dataclass
class Record:
    fifos: list = field(default_factory=list)
    links: list = field(default_factory=list)
    workers: list = field(default_factory=list)
    calls: list = field(default_factory=list)
    device: object = None
    runtime: object = None
    current_worker: object = None

    def snapshot(self) -> "Record":
        return Record(self.fifos, self.links, self.workers, self.calls, self.device, self.runtime)

    def __str__(self) -> str:
        """A module in the shape IRON prints (device, runtime sequence), for the fused design's composition."""
        args = ", ".join(f"%arg{i}: {d.mlir_type}" for i, d in enumerate(self.runtime.data))
        return (f"module {{\n  aie.device({self.device.name}) {{\n"
                f"    // {len(self.workers)} workers, {len(self.fifos)} object fifos\n"
                f"    aiex.runtime_sequence({args}) {{\n    }}\n  }}\n}}\n")


RECORD = Record()


@contextlib.contextmanager
def installed():
    """Put the stand-in in sys.modules as `aie.iron`, `aie.iron.device`, ... for the duration."""
    global RECORD
    runtime = {"Runtime": Runtime, "TaskGroup": TaskGroup, "RuntimeData": RuntimeData}
    dataflow = {"ObjectFifo": ObjectFifo, "ObjectFifoHandle": Handle}
    names = {
        "aie": {}, "aie.iron": {"Worker": Worker, "Program": Program, "Kernel": Kernel, "Buffer": Buffer,
                                "ScratchpadParameter": ScratchpadParameter, **runtime, **dataflow},
        "aie.iron.runtime": {**runtime, "sync_parameters": sync_parameters},
        "aie.iron.dataflow": dataflow, "aie.iron.dataflow.objectfifo": dataflow,
        "aie.iron.device": {"NPU1": NPU1, "NPU2": NPU2, "Tile": Tile, "AnyShimTile": AnyShimTile,
                            "AnyMemTile": AnyMemTile, "AnyComputeTile": AnyComputeTile},
        "aie.iron.controlflow": {"range_": range_},
        "aie.helpers": {}, "aie.helpers.taplib": {"TensorAccessPattern": TensorAccessPattern},
    }
    saved = {n: sys.modules.get(n) for n in names}
    for n, attrs in names.items():
        m = types.ModuleType(n)
        m.__dict__.update(attrs)
        sys.modules[n] = m
    RECORD = Record()
    try:
        yield
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m


def fresh() -> None:
    global RECORD
    RECORD = Record()


# ---- checks -------------------------------------------------------------------------------------------------

_MLIR_TYPES = {"bfloat16": "bf16", "float32": "f32", "int32": "i32"}
_MEMREF = re.compile(r"memref<((?:\d+x)+)(\w+)>")


def _memref(shape, dtype) -> str:
    return f"memref<{'x'.join(str(int(n)) for n in shape)}x{_MLIR_TYPES[np.dtype(dtype).name]}>"


class SequenceMismatch(ValueError):
    """An `aiex.run` whose arguments differ from what the called runtime sequence declares (count, shape, dtype):
    on the device its kernel would read or write the wrong buffer."""


def check_run(rec: Record, types: list[str], what: str = "") -> None:
    """A run of this design's runtime sequence with arguments of these MLIR types (as the fused design writes
    them, `memref<NxT>`): they must match the declared tensors one by one, in count, shape and dtype."""
    declared = [d.mlir_type for d in rec.runtime.data]
    passed = [_memref(*_parse_memref(t)) for t in types]
    if passed != declared:
        bad = [f"argument {i}: passes {p}, declared {d}" for i, (p, d) in enumerate(zip(passed, declared)) if p != d]
        raise SequenceMismatch(f"{what or 'a run'} passes {len(passed)} arguments to a sequence of {len(declared)}"
                               + (": " + "; ".join(bad) if bad else ""))


def _parse_memref(t: str) -> tuple[tuple, np.dtype]:
    m = _MEMREF.fullmatch(t.strip())
    if m is None:
        raise SequenceMismatch(f"{t!r} is not a memref type")
    names = {v: k for k, v in _MLIR_TYPES.items()}
    return tuple(int(n) for n in m.group(1).rstrip("x").split("x")), np.dtype(names[m.group(2)])


def check_runs(module: str) -> int:
    """The composed module (kernels/fused/design.py): every `aiex.run` inside `aiex.configure @device` must pass
    exactly what that device's runtime sequence declares. Raises SequenceMismatch naming every run that does
    not; returns how many runs were checked."""
    declared, device, configured, runs, bad = {}, None, None, 0, []
    for line in module.splitlines():
        if m := re.search(r"aie\.device\(\w+\)\s*@(\w+)", line):
            device = m.group(1)
        elif m := re.search(r"aiex?\.runtime_sequence\s*@sequence\((.*)\)\s*\{", line):
            declared[device] = _MEMREF.findall(m.group(1))
        elif m := re.search(r"aiex\.configure\s*@(\w+)", line):
            configured = m.group(1)
        elif m := re.search(r"aiex\.run\s*@sequence\((.*)\)\s*:\s*\((.*)\)", line):
            runs += 1
            passed = _MEMREF.findall(m.group(2))
            if configured not in declared:
                bad.append(f"run {runs}: device @{configured} has no runtime sequence")
            elif passed != declared[configured]:
                show = lambda ts: ", ".join(f"memref<{s}{t}>" for s, t in ts)  # noqa: E731
                bad.append(f"run {runs} on @{configured}: passes ({show(passed)}), its sequence declares "
                           f"({show(declared[configured])})")
    if bad:
        raise SequenceMismatch(f"{len(bad)} of {runs} runs differ from their sequence: " + "; ".join(bad[:5]))
    return runs

_SIG = re.compile(r"NPU_KERNEL\s+void\s+(\w+)\s*\(([^)]*)\)", re.S)


def kernel_signatures(bin_name: str) -> dict[str, list[str]]:
    """{function: [C parameter types]} of kernels/<name>/<name>.cc, for the object file bin_name."""
    name = bin_name.removesuffix(".o")
    src = (KERNELS / name / f"{name}.cc").read_text()
    out = {}
    for fn, params in _SIG.findall(src):
        types_ = []
        for p in params.split(","):
            m = re.match(r"^(.*?)(\w+)\s*$", p.strip())
            types_.append(" ".join(m.group(1).replace("const", "").split()).replace(" *", "*"))
        out[fn] = types_
    return out


def _c_type_ok(c_type: str, py_type) -> bool:
    if c_type.endswith("*"):
        return hasattr(py_type, "__args__")
    return {"int32_t": np.int32, "float": np.float32}.get(c_type) is py_type


def check(rec: Record, target) -> list[str]:
    """Everything the design breaks, as messages (empty when it fits)."""
    found = []
    found += _check_calls(rec)
    found += _check_memory(rec, target)
    found += _check_channels_and_bds(rec, target)
    found += _check_flow(rec)
    return found


def _check_calls(rec):
    found = []
    declared: dict[str, list] = {}
    for kernel, _, _ in rec.calls:  # an MLIR function has one signature
        first = declared.setdefault(kernel.name, kernel.arg_types)
        if [str(t) for t in first] != [str(t) for t in kernel.arg_types]:
            found.append(f"{kernel.name} is declared with two different signatures")
    for kernel, args, worker in rec.calls:
        sigs = kernel_signatures(kernel.bin_name)
        if kernel.name not in sigs:
            found.append(f"{kernel.name} is not defined in {kernel.bin_name.removesuffix('.o')}.cc")
            continue
        c = sigs[kernel.name]
        if len(c) != len(kernel.arg_types):
            found.append(f"{kernel.name}: {len(kernel.arg_types)} arg types, the C function takes {len(c)}")
        for i, (a, t, ct) in enumerate(zip(args, kernel.arg_types, c)):
            if not _c_type_ok(ct, t):
                found.append(f"{kernel.name} argument {i}: declared {t}, C type {ct}")
            if isinstance(a, (Element, Buffer)):
                if _obj(a.obj_type) != _obj(t):
                    found.append(f"{kernel.name} argument {i}: passes {_obj(a.obj_type)}, declared {_obj(t)}")
            elif isinstance(a, (bool, int, np.integer)):
                if t is not np.int32:
                    found.append(f"{kernel.name} argument {i}: an int for {t}")
            elif isinstance(a, float):
                if t is not np.float32:
                    found.append(f"{kernel.name} argument {i}: a float for {t}")
            else:
                found.append(f"{kernel.name} argument {i}: {type(a).__name__} is not a kernel argument")
    return found


def l1_use(rec) -> dict:
    """Bytes of L1 each core tile allocates: its stack, every fifo object it holds (depth x object) and its
    Buffers."""
    l1: dict[Tile, int] = {}
    for w in rec.workers:
        used = w.stack_size + sum(h.depth * h.fifo.nbytes for h in w.handles) + sum(_nbytes(b.obj_type)
                                                                                    for b in w.buffers)
        l1[w.placement] = l1.get(w.placement, 0) + used
    return l1


def memtile_use(rec) -> dict:
    """Bytes each memtile allocates for the links placed on it (depth x the linked large object)."""
    mem: dict[Tile, int] = {}
    for link in rec.links:
        big = link.src[0] if link.kind != "join" else link.dst[0]
        depth = max(h.depth for h in big.cons_handles) if link.kind != "join" else big.prod().depth
        mem[link.placement] = mem.get(link.placement, 0) + depth * big.nbytes
    return mem


def _check_memory(rec, target):
    found = []
    for tile, used in l1_use(rec).items():
        if used > target.l1_bytes:
            found.append(f"core {tile}: {used} bytes of L1 (with stack) > {target.l1_bytes}")
    for tile, used in memtile_use(rec).items():
        if used > target.memtile_bytes:
            found.append(f"memtile {tile}: {used} bytes > {target.memtile_bytes}")
    return found


def _check_channels_and_bds(rec, target):
    found = []
    s2mm: dict[Tile, int] = {}
    mm2s: dict[Tile, int] = {}
    bds: dict[Tile, int] = {}

    def add(d, tile, n=1):
        d[tile] = d.get(tile, 0) + n

    for w in rec.workers:
        for h in w.handles:
            add(mm2s if h.is_prod else s2mm, w.placement)
            add(bds, w.placement, h.depth)
            dims = h.dims_from_stream if not h.is_prod else []
            if len(dims) > target.core_dims:
                found.append(f"core {w.placement}: {h.fifo.name} from_stream has {len(dims)} dims")
            if any(n > 1 and s == 0 for n, s in dims):
                found.append(f"core {w.placement}: {h.fifo.name} from_stream steps by 0")
    for link in rec.links:
        add(s2mm, link.placement, len(link.src))
        add(mm2s, link.placement, len(link.dst))
        add(bds, link.placement, sum(f.depth for f in (*link.src, *link.dst)))
        for f in (*link.src, *link.dst):
            if len(f.dims_to_stream) > target.memtile_dims:
                found.append(f"memtile {link.placement}: {f.name} to_stream has {len(f.dims_to_stream)} dims")
            if any(n > 1 and s == 0 for n, s in f.dims_to_stream):  # no repeat dimension in a memtile pattern
                found.append(f"memtile {link.placement}: {f.name} to_stream steps by 0")
    seen, shims = set(), {}
    for t in rec.runtime.transfers:
        if t.placement.row != 0 or t.placement.col < 0:
            found.append(f"{t.kind} of {t.handle.fifo.name} is not placed on a shim tile")
        shims.setdefault((t.kind, t.handle.fifo.name), set()).add(t.placement)
        key = (t.placement, t.kind, id(t.handle.fifo))
        if key not in seen:
            seen.add(key)
            add(mm2s if t.kind == "fill" else s2mm, t.placement)
        live = [(n, s) for n, s in zip(t.tap.sizes, t.tap.strides) if n > 1]
        if len(live) > target.shim_dims + 1:  # three dimensions plus the repeat count
            found.append(f"shim {t.placement}: a {t.kind} of {t.handle.fifo.name} has {len(live)} dimensions")
        if any(s == 0 for _, s in live[1:]):  # only the repeat steps by 0 (mlir-aie#2308: a BD constraint)
            found.append(f"shim {t.placement}: a {t.kind} of {t.handle.fifo.name} steps by 0 inside its pattern "
                         f"(sizes {t.tap.sizes}, strides {t.tap.strides}); only the outermost dimension may repeat")
        if t.tap.sizes[-1] > 1 and t.tap.strides[-1] != 1:  # the innermost dimension is the contiguous run
            found.append(f"shim {t.placement}: innermost stride {t.tap.strides[-1]} (DMAs move contiguous words)")
        if t.tap.sizes[-1] * t.data.dtype.itemsize % 4:
            found.append(f"shim {t.placement}: {t.kind} of {t.handle.fifo.name} moves rows of "
                         f"{t.tap.sizes[-1] * t.data.dtype.itemsize} bytes, not whole 32-bit words")
    # a fifo's runtime end is one shim DMA allocation (aie.shim_dma_allocation, named after the fifo): a second
    # runtime consumer on another shim is dropped as a duplicate (runtime.py _dedup_runtime_consumers)
    for (kind, fifo), tiles in shims.items():
        if len(tiles) > 1:
            found.append(f"{kind}s of {fifo} on {len(tiles)} shim tiles; its runtime end is bound to one")
    for tile, peak in rec.runtime.peak.items():  # descriptors in use at once (task groups free theirs)
        add(bds, tile, peak)
    limits = {"core": (target.core_channels, target.core_bds), "memtile": (target.memtile_channels,
                                                                          target.memtile_bds),
              "shim": (target.shim_channels, target.shim_bds)}
    for d, what in ((s2mm, "S2MM (input)"), (mm2s, "MM2S (output)")):
        for tile, n in d.items():
            if n > limits[tile.kind][0]:
                found.append(f"{tile.kind} {tile}: {n} {what} channels > {limits[tile.kind][0]}")
    for tile, n in bds.items():
        if n > limits[tile.kind][1]:
            found.append(f"{tile.kind} {tile}: {n} buffer descriptors > {limits[tile.kind][1]}")
    cols = {w.placement.col for w in rec.workers} | {t.placement.col for t in rec.runtime.transfers}
    if cols and max(cols) >= target.columns:
        found.append(f"uses column {max(cols)}; {target.name} has {target.columns}")
    return found


def _objects(f: ObjectFifo) -> int | None:
    """Objects that flow through fifo f over one run, from what feeds it (fills, links)."""
    fills = [t for t in RECORD_RT.transfers if t.kind == "fill" and t.handle.fifo is f]
    if fills:  # counted in bytes: a fill may read a tensor of another element type (an fp32 bias into bf16)
        return sum(t.tap.size * t.data.dtype.itemsize for t in fills) / f.nbytes
    if f.link_in is not None:
        return _objects(f.link_in.src[0]) if f.link_in.kind != "join" else _produced(f.link_in.src[0])
    return _produced(f)


def _produced(f: ObjectFifo) -> int | None:
    h = f._prod
    if h is not None and isinstance(h.endpoint, Worker):
        return h.count
    return None


RECORD_RT = None


def _check_flow(rec):
    """Every fifo's consumers take exactly what its producer puts in; drains take everything produced."""
    global RECORD_RT
    RECORD_RT = rec.runtime
    found = []
    for f in rec.fifos:
        n = _objects(f)
        if n is None:
            continue
        if n != int(n):
            found.append(f"{f.name}: fills carry {n} objects (not whole objects)")
            continue
        for h in f.cons_handles:
            if isinstance(h.endpoint, Worker) and h.count != n:
                found.append(f"{f.name}: a core takes {h.count} objects of the {int(n)} that arrive")
        drains = [t for t in rec.runtime.transfers if t.kind == "drain" and t.handle.fifo is f]
        if drains:
            taken = sum(t.tap.size * t.data.dtype.itemsize for t in drains)
            if taken != n * f.nbytes:
                found.append(f"{f.name}: drains take {taken} bytes of the {int(n * f.nbytes)} produced")
    for link in rec.links:
        if link.kind == "join":
            counts = {_produced(s) for s in link.src}
            if len(counts) > 1:
                found.append(f"join into {link.dst[0].name}: its producers make {sorted(counts)} objects")
    return found


def written(rec: Record, data_index: int, words: dict | None = None) -> np.ndarray:
    """How many times each element of runtime tensor `data_index` is written by the drains, with the scratchpad
    parameters at `words` (name -> value in elements; absent = 0, the static base)."""
    data = rec.runtime.data[data_index]
    hits = np.zeros(data.elements, np.int64)
    for t in rec.runtime.transfers:
        if t.kind == "drain" and t.data is data:
            np.add.at(hits, t.tap.addresses() + shifted(t, words), 1)
    return hits


def shifted(t: Transfer, words: dict | None) -> int:
    """A transfer's run-time shift in elements: its offset parameter's word."""
    if t.offset_parameter is None:
        return 0
    return int((words or {}).get(t.offset_parameter.name, 0))


def read(rec: Record, data_index: int, words: dict | None = None) -> np.ndarray:
    """The element addresses the fills read from runtime tensor `data_index`, in order, at `words`."""
    data = rec.runtime.data[data_index]
    return np.concatenate([t.tap.addresses() + shifted(t, words) for t in rec.runtime.transfers
                           if t.kind == "fill" and t.data is data] or [np.zeros(0, np.int64)])
