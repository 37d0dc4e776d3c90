"""A minimal stand-in of the IRON python API (mlir-aie, the version pinned in sdk/compiler/npu.py) with the
same names and signatures the designs in kernels/ use, for tests on machines without the toolchain.

It records what a design builds instead of emitting MLIR: ObjectFifos (depth, object type, dims, links through
memtiles), Workers (placement, stack, arguments), Kernel calls made while the core functions are traced,
GlobalBuffers and the runtime sequence's fills / drains with their TensorAccessPatterns. `check(design,
target)` then checks what the toolchain would refuse or the hardware could not do: L1 (64 KB with the stack)
and memtile (512 KB) use, DMA channels per tile, buffer descriptors and their dimensions, kernel call
signatures against the C++ sources, and that every object a fill produces is consumed and every object a core
produces is drained. A runtime sequence records the tensor types it declares; `check_runs(module)` checks that
every `aiex.run` of the fused design's composed module passes exactly those, in count, shape and dtype (what
MLIR verification of the call would refuse; on the device a kernel would read the wrong buffer). Like IRON's
own tracing, `range_` runs its body once (the loop becomes an scf.for); the
stand-in multiplies the acquisitions inside by the trip count. Test-only: never imported by kernels/.
"""
from __future__ import annotations

import contextlib
import math
import re
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

KERNELS = Path(__file__).resolve().parents[1] / "kernels"


def _obj(t) -> tuple[tuple, np.dtype]:
    shape, dtype = t.__args__
    return tuple(shape), np.dtype(dtype.__args__[0])


def _nbytes(t) -> int:
    shape, dtype = _obj(t)
    return math.prod(shape) * dtype.itemsize


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
    def __init__(self, name, cols):
        self.name, self.cols = name, cols


def NPU1():  # noqa: N802 - IRON's names
    return Device("npu1", 4)


def NPU2():  # noqa: N802
    return Device("npu2", 8)


class SequentialPlacer:
    pass


# ---- tracing state ------------------------------------------------------------------------------------------

_MULT = [1]


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


# ---- object fifos -------------------------------------------------------------------------------------------

@dataclass
class Link:
    kind: str            # split | join | forward
    placement: Tile
    src: list            # fifos
    dst: list


class ObjectFifo:
    def __init__(self, obj_type, depth=2, name=None, dims_to_stream=None, dims_from_stream_per_cons=None,
                 plio=False, pad_dimensions=None, disable_synchronization=False):
        if depth < 1:
            raise ValueError("depth must be > 0")
        self.obj_type, self.depth, self.name = obj_type, depth, name
        self.dims_to_stream = dims_to_stream or []
        self.dims_from_stream = dims_from_stream_per_cons or []
        self._prod = None
        self.cons_handles: list[Handle] = []
        self.link_in: Link | None = None   # the link that produces into this fifo
        self.link_out: Link | None = None  # the link that consumes it
        RECORD.fifos.append(self)

    @property
    def nbytes(self) -> int:
        return _nbytes(self.obj_type)

    def prod(self, depth=None):
        if self._prod is None:
            self._prod = Handle(self, True, depth or self.depth)
        return self._prod

    def cons(self, depth=None, dims_from_stream=None):
        h = Handle(self, False, depth or self.depth, dims_from_stream or self.dims_from_stream)
        self.cons_handles.append(h)
        return h


class Handle:
    def __init__(self, fifo, is_prod, depth, dims_from_stream=()):
        self.fifo, self.is_prod, self.depth = fifo, is_prod, depth
        self.dims_from_stream = list(dims_from_stream or [])
        self.endpoint = None   # Tile of a worker, "runtime", or a Link
        self.count = 0         # objects acquired (times enclosing trip counts)
        self.held = 0

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

    def _link(self, kind, placement, n, offsets, depths, obj_types, names, dims_to_stream, dims_from_stream):
        obj_types = obj_types or [self.fifo.obj_type] * n
        depths = depths or [self.depth] * n
        names = names or [f"{self.fifo.name}_{kind}{i}" for i in range(n)]
        dims_to_stream = dims_to_stream or [None] * n
        dims_from_stream = dims_from_stream or [None] * n
        subs = [ObjectFifo(obj_types[i], depths[i], names[i], dims_to_stream[i] if kind != "join" else None,
                           dims_from_stream[i]) for i in range(n)]
        if kind == "join":
            for i, s in enumerate(subs):
                s.dims_to_stream = dims_to_stream[i] or []
        link = Link(kind, placement, [self.fifo] if kind != "join" else subs, subs if kind != "join" else [self.fifo])
        link.offsets = list(offsets)
        RECORD.links.append(link)
        if kind == "join":
            self.endpoint = link
            self.fifo.link_in = link
            for s in subs:
                s.link_out = link
                s.cons_handles.append(Handle(s, False, s.depth))
                s.cons_handles[-1].endpoint = link
        else:
            self.endpoint = link
            self.fifo.link_out = link
            for s in subs:
                s.link_in = link
                s.prod().endpoint = link
        return subs

    def split(self, offsets, placement=AnyMemTile, depths=None, obj_types=None, names=None, dims_to_stream=None,
              dims_from_stream=None, plio=False):
        assert not self.is_prod, "split() needs a consumer handle"
        return self._link("split", placement, len(offsets), offsets, depths, obj_types, names, dims_to_stream,
                          dims_from_stream)

    def join(self, offsets, placement=AnyMemTile, depths=None, obj_types=None, names=None, dims_to_stream=None,
             dims_from_stream=None, plio=False):
        assert self.is_prod, "join() needs a producer handle"
        return self._link("join", placement, len(offsets), offsets, depths, obj_types, names, dims_to_stream,
                          dims_from_stream)

    def forward(self, placement=AnyMemTile, obj_type=None, depth=None, name=None, dims_to_stream=None,
                dims_from_stream=None, plio=False):
        assert not self.is_prod, "forward() needs a consumer handle"
        return self._link("forward", placement, 1, [0], [depth] if depth else None, [obj_type] if obj_type else None,
                          [name] if name else None, [dims_to_stream] if dims_to_stream else None,
                          [dims_from_stream] if dims_from_stream else None)[0]


class Element:
    """An acquired object: what a kernel call receives."""

    def __init__(self, obj_type, fifo_name):
        self.obj_type, self.fifo_name = obj_type, fifo_name


# ---- workers, kernels, buffers ------------------------------------------------------------------------------

class GlobalBuffer:
    def __init__(self, type=None, initial_value=None, name=None, placement=None, use_write_rtp=False):  # noqa: A002
        if type is None:
            type = np.ndarray[initial_value.shape, np.dtype[initial_value.dtype]]
        self.obj_type, self.initial_value, self.name = type, initial_value, name
        if initial_value is not None:
            shape, dtype = _obj(type)
            assert tuple(np.shape(initial_value)) == shape and np.asarray(initial_value).dtype == dtype, \
                f"GlobalBuffer {name}: initial value does not match its type"


class Kernel:
    def __init__(self, name, bin_name, arg_types=()):
        self.name, self.bin_name, self.arg_types = name, bin_name, list(arg_types)

    def __call__(self, *args):
        RECORD.calls.append((self, args, RECORD.current_worker))


class Worker:
    def __init__(self, core_fn, fn_args=(), placement=None, while_true=True, stack_size=None):
        self.core_fn, self.fn_args, self.placement = core_fn, list(fn_args), placement
        self.stack_size = 0x400 if stack_size is None else stack_size
        bins = {a.bin_name for a in fn_args if isinstance(a, Kernel)}
        if len(bins) > 1:
            raise ValueError(f"only one binary per worker; found {bins}")
        for a in fn_args:
            if isinstance(a, ObjectFifo):
                raise ValueError("give a worker ObjectFifoHandles, not ObjectFifos")
            if isinstance(a, Handle):
                if a.endpoint is not None and a.endpoint is not self:
                    raise ValueError(f"handle of {a.fifo.name} already has an endpoint")
                a.endpoint = self
        RECORD.workers.append(self)

    @property
    def handles(self):
        return [a for a in self.fn_args if isinstance(a, Handle)]

    @property
    def buffers(self):
        return [a for a in self.fn_args if isinstance(a, GlobalBuffer)]


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


class TaskGroup:
    pass


class ScratchpadParameter:
    """IRON's per-run 32-bit word (`aiex.scratchpad_parameter`): the host writes it before each run; a fill or
    drain given it as `offset_parameter` adds it to its buffer descriptor's base address, in elements of the
    transfer's tensor (as xdna-engine's hardware probe of mlir-aie's scratchpad_addr_offset test shows)."""
    def __init__(self, name, dtype=np.int32):
        if np.dtype(dtype) != np.int32:
            raise ValueError("a scratchpad parameter used as an address offset is an int32 word")
        self.name, self.dtype = name, np.dtype(dtype)


class Runtime:
    def __init__(self, strict_task_groups=True):
        self.data, self.transfers, self.started, self.open_groups = [], [], [], 0
        self.live: dict = {}       # shim tile -> buffer descriptors in use now
        self.peak: dict = {}       # shim tile -> the most ever in use at once
        self.synced = False        # sync_parameters() issued in the sequence

    @contextlib.contextmanager
    def sequence(self, *types):
        self.data = [RuntimeData(t) for t in types]
        RECORD.active_runtime = self
        try:
            yield self.data[0] if len(self.data) == 1 else tuple(self.data)
        finally:
            RECORD.active_runtime = None
        if self.open_groups:
            raise ValueError("task groups left open")

    def task_group(self):
        self.open_groups += 1
        return TaskGroup()

    def sync_parameters(self):
        """`aiex.sync_scratchpad_parameters_from_host`, before the first transfer that reads a parameter. A
        Runtime method in the pinned v1.3.4 (module-level `aie.iron.sync_parameters()` from v1.4.0, PR #3387)."""
        if RECORD.active_runtime is not self:
            raise ValueError("sync_parameters() outside this runtime's sequence")
        self.synced = True

    def finish_task_group(self, tg):
        """Frees the group's buffer descriptors (its drains awaited)."""
        self.open_groups -= 1
        for t in self.transfers:
            if t.task_group is tg:
                self.live[t.placement] -= 1

    def start(self, *workers):
        self.started += workers

    def _transfer(self, kind, handle, data, tap, task_group, placement, offset_parameter=None):
        if data not in self.data:
            raise ValueError("not a RuntimeData of this sequence")
        if offset_parameter is not None and not isinstance(offset_parameter, ScratchpadParameter):
            raise TypeError("offset_parameter must be a ScratchpadParameter")
        if offset_parameter is not None and not self.synced:
            raise ValueError(f"{kind} reads scratchpad parameter {offset_parameter.name} before sync_parameters()")
        if tap is None:
            tap = TensorAccessPattern((data.elements,), 0, [1, 1, 1, data.elements], [0, 0, 0, 1])
        handle.endpoint = "runtime"
        self.transfers.append(Transfer(kind, handle, data, tap, placement, task_group, offset_parameter))
        self.live[placement] = self.live.get(placement, 0) + 1  # one descriptor per transfer until freed
        self.peak[placement] = max(self.peak.get(placement, 0), self.live[placement])

    def fill(self, in_fifo, source, tap=None, task_group=None, wait=False, placement=AnyShimTile,
             offset_parameter=None):
        assert in_fifo.is_prod
        self._transfer("fill", in_fifo, source, tap, task_group, placement, offset_parameter)

    def drain(self, out_fifo, dest, tap=None, task_group=None, wait=False, placement=AnyShimTile,
              offset_parameter=None):
        assert not out_fifo.is_prod
        self._transfer("drain", out_fifo, dest, tap, task_group, placement, offset_parameter)


class Program:
    def __init__(self, device, rt):
        self.device, self.rt = device, rt

    def resolve_program(self, placer=None):
        """Trace every worker's core function once, as IRON does, and return the record."""
        for w in RECORD.workers:
            RECORD.current_worker = w
            for h in w.handles:
                h.count = h.held = 0
            w.core_fn(*w.fn_args)
            RECORD.current_worker = None
        RECORD.device, RECORD.runtime = self.device, self.rt
        return RECORD.snapshot()


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
    active_runtime: object = None

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
    names = {
        "aie": {}, "aie.iron": {"ObjectFifo": ObjectFifo, "Worker": Worker, "Runtime": Runtime, "Program": Program,
                                "Kernel": Kernel, "GlobalBuffer": GlobalBuffer,
                                "ScratchpadParameter": ScratchpadParameter},
        "aie.iron.device": {"NPU1": NPU1, "NPU2": NPU2, "Tile": Tile, "AnyShimTile": AnyShimTile,
                            "AnyMemTile": AnyMemTile, "AnyComputeTile": AnyComputeTile},
        "aie.iron.placers": {"SequentialPlacer": SequentialPlacer},
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
        if len(args) != len(kernel.arg_types):
            found.append(f"{kernel.name} called with {len(args)} arguments, declared {len(kernel.arg_types)}")
            continue
        for i, (a, t, ct) in enumerate(zip(args, kernel.arg_types, c)):
            if not _c_type_ok(ct, t):
                found.append(f"{kernel.name} argument {i}: declared {t}, C type {ct}")
            if isinstance(a, (Element, GlobalBuffer)):
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
    GlobalBuffers."""
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
                found.append(f"core {w.placement}: {h.fifo.name} dims_from_stream has {len(dims)} dims")
            if any(n > 1 and s == 0 for n, s in dims):
                found.append(f"core {w.placement}: {h.fifo.name} dims_from_stream steps by 0")
    for link in rec.links:
        add(s2mm, link.placement, len(link.src))
        add(mm2s, link.placement, len(link.dst))
        add(bds, link.placement, sum(f.depth for f in (*link.src, *link.dst)))
        for f in (*link.src, *link.dst):
            if len(f.dims_to_stream) > target.memtile_dims:
                found.append(f"memtile {link.placement}: {f.name} dims_to_stream has {len(f.dims_to_stream)} dims")
            if any(n > 1 and s == 0 for n, s in f.dims_to_stream):  # no repeat dimension in a memtile pattern
                found.append(f"memtile {link.placement}: {f.name} dims_to_stream steps by 0")
    seen = set()
    for t in rec.runtime.transfers:
        if t.placement.row != 0 or t.placement.col < 0:
            found.append(f"{t.kind} of {t.handle.fifo.name} is not placed on a shim tile")
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
