"""A fake `pyxrt` for tests: the names the npu backend uses, behaving like XRT on an amdxdna NPU, limits and
all, and executing every dispatch with the emulator's semantics (sdk/runtime/emu.py) so that outputs are real.

What it enforces (a ContractViolation is a bug in the caller; device faults are what XRT would report):
- a BO has host memory and device memory: a kernel sees only what was synced to the device, and the host
  sees a kernel's results only after a from-device sync; reading without one returns stale data. Device
  memory starts as garbage (0xA5), so a missing to-device sync shows up in the outputs too;
- an xclbin kernel is called as kernel(3, instruction BO, instruction count in 32-bit words, *data BOs): the
  opcode must be 3, the instruction BO `cacheable` on group_id(1) and synced, the count its stream's length
  in words; data BOs are `host_only` and at least their arena's size, on the group_id of their argument for an
  xclbin kernel. A full-ELF kernel (ext.kernel) has no group_id: XRT's indexes the kernel's compute units, of
  which an ELF kernel has none (undefined behaviour), and XRT checks no BO group in that flow;
- a runlist (XRT's xrt::runlist) is made on the hw_context of its runs' kernels; a listed run cannot be started,
  and its own state() is not defined (a ContractViolation here): runlist.wait() returns nothing, or raises
  RuntimeError naming the state of the first run that did not complete;
- at most 5 host data BOs per kernel call (more crashed XRT or skipped a DMA, mlir-aie#3248);
- hardware contexts: 6 (npu1) / 16 (npu2) alive at once, counted over the whole "machine" (FAKE.contexts
  includes those of other processes, FAKE.other_contexts); the legacy device.load_xclbin fails;
- memlock: pinned bytes (whole pages) stay within FAKE.memlock, else BO allocation fails like XRT's;
- watchdog: a dispatch whose device time (the cost model's estimate: a fake has no clock) exceeds
  FAKE.watchdog_s ends in ERT_CMD_STATE_TIMEOUT and writes nothing;
- scratchpad words (an ELF dispatch whose DMAs add per-run words to their addresses, the artifact's
  "scratchpad"): the run's control scratchpad (`run.get_ctrl_scratchpad_bo()`, ELF runs only) must hold, on the
  device, word = (io[buffer][element] + add) * scale for every word, read from the io BO's device memory; a dispatch
  started without them, or with a stale or wrong word, is a ContractViolation (real DMAs would move the wrong
  rows, silently);
- npu1 instruction streams are transactions laid out as mlir-aie's AIETargetNPU.cpp writes them (version 0.1:
  per transfer a BLOCKWRITE of a shim buffer descriptor, the DDR_PATCH of its address, a WRITE to the channel's
  queue; see sdk/runtime/npu_insts.py for the format and its sources). The fake knows which patch op belongs to
  which transfer because it wrote them (`_txn`), independently of the build's matching: on a start, the stream
  on the device must equal the one the xclbin made except the argplus of per-run transfers, and each of those
  must be base + word * element size for the word the io values on the device give; anything else is a
  ContractViolation (an unsynced BO, a stale or misplaced patch, a static transfer touched). The fake aiecc
  (tests/fake_toolchain.py) writes its transactions and their patch records the same way.
Faults to inject through FAKE.faults: "device" (no device), "context" (context creation fails), "busy"
(EBUSY), "alloc" (BO allocation fails), "timeout" / "error" (the next runs end in TIMEOUT / ERROR).

Artifacts for it are written by `write_artifacts(program, root)`: a program saved next to a JSON "xclbin"
or "ELF" naming its dispatches, instruction streams that identify their dispatch, and a manifest entry written
by the runtime's own writer (npu_artifacts.manifest_entry / record_artifact), exactly where the npu backend looks.
"""
from __future__ import annotations

import enum
import itertools
import json
import types
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sdk.compiler import watchdog
from sdk.program import Program
from sdk.runtime import npu, npu_artifacts
from sdk.runtime.backend import Counters
from sdk.runtime.arena import ARENAS
from sdk.runtime.emu import EmuExecutable

PAGE = 4096
GARBAGE = 0xA5
DEVICE_NAMES = {"npu1": "RyzenAI-npu1", "npu2": "RyzenAI-npu4"}


class ContractViolation(AssertionError):
    """The caller broke XRT's contract (what real hardware answers with garbage, a hang or a crash)."""


@dataclass
class World:
    """The fake machine: its NPU generation, limits, faults and a log of what crossed."""
    target: str = "npu2"
    memlock: float = float("inf")
    watchdog_s: float = watchdog.WATCHDOG_S
    faults: set = field(default_factory=set)
    contexts: int = 0
    other_contexts: int = 0     # held by other processes
    pinned: int = 0
    dispatches: list = field(default_factory=list)
    timeouts: int = 0
    runlists: int = 0


FAKE = World()
_generation = [0]  # objects of a machine before reset() no longer count against the new one


def reset(**kw) -> World:
    FAKE.__init__(**kw)
    _generation[0] += 1
    return FAKE


# ---- enums, named as pyxrt names them ----------------------------------------------------------------

class xclBOSyncDirection(enum.IntEnum):
    XCL_BO_SYNC_BO_TO_DEVICE = 0
    XCL_BO_SYNC_BO_FROM_DEVICE = 1
    XCL_BO_SYNC_BO_GMIO_TO_AIE = 2
    XCL_BO_SYNC_BO_AIE_TO_GMIO = 3


class ert_cmd_state(enum.IntEnum):
    ERT_CMD_STATE_NEW = 1
    ERT_CMD_STATE_QUEUED = 2
    ERT_CMD_STATE_COMPLETED = 4
    ERT_CMD_STATE_ERROR = 5
    ERT_CMD_STATE_ABORT = 6
    ERT_CMD_STATE_SUBMITTED = 7
    ERT_CMD_STATE_TIMEOUT = 8
    ERT_CMD_STATE_NORESPONSE = 9


class xrt_info_device(enum.IntEnum):
    bdf = 0
    name = 5


TO_DEVICE = xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE
FROM_DEVICE = xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE
COMPLETED = ert_cmd_state.ERT_CMD_STATE_COMPLETED


class uuid:
    def __init__(self, text: str):
        self.text = text

    def to_string(self) -> str:
        return self.text


# ---- device, artifacts, contexts ---------------------------------------------------------------------

class device:
    def __init__(self, index=0):
        if "device" in FAKE.faults or index != 0:
            raise RuntimeError(f"No devices found (index {index})")
        self.registered: dict[str, "xclbin"] = {}

    def get_info(self, key):
        return DEVICE_NAMES[FAKE.target] if key == xrt_info_device.name else "0000:c4:00.1"

    def register_xclbin(self, xb: "xclbin") -> uuid:
        self.registered[xb.uuid.text] = xb
        return xb.uuid

    def load_xclbin(self, *_):
        raise RuntimeError("load_xclbin is not supported by the amdxdna shim: register_xclbin + hw_context")


class _Design:
    """What a fake artifact file holds: the device program and the dispatches it runs."""

    def __init__(self, path: str, kind: str):
        path = Path(path)
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise RuntimeError(f"{path}: not a valid {kind}: {e}") from None
        if doc.get("fake_pyxrt") != kind:
            raise RuntimeError(f"{path}: not a {kind}")
        self.doc = doc
        self.program = Program.load(path.parent / doc["program"])
        # npu1 transactions this fake or the fake aiecc wrote: (their words as the xclbin made them, what each patch op belongs to)
        self.streams = [(np.fromfile(path.parent / s["file"], np.uint32), s) for s in doc.get("streams", [])]
        # a dispatch is named by its step (Step.op) or, as a toolchain names it, by its MLIR sequence symbol
        self.steps = {name: s for e in self.program.entries.values() for s in e.steps if s.kind == "dispatch"
                      for name in (s.op, npu_artifacts.sequence_name(s.op))}
        self.executor = _DeviceExecutor(self.program)


class xclbin:
    class xclbinkernel:
        def __init__(self, name):
            self.name = name

        def get_name(self):
            return self.name

    def __init__(self, path: str):
        self.design = _Design(path, "xclbin")
        self.uuid = uuid(self.design.doc["uuid"])

    def get_uuid(self) -> uuid:
        return self.uuid

    def get_kernels(self):
        return [xclbin.xclbinkernel(n) for n in self.design.doc["kernels"]]


class elf:
    def __init__(self, path: str):
        self.design = _Design(path, "elf")


class hw_context:
    def __init__(self, dev: device, what):
        if "context" in FAKE.faults:
            raise RuntimeError("DRM_IOCTL_AMDXDNA_CREATE_HWCTX IOCTL failed (err=-22): Invalid argument")
        if "busy" in FAKE.faults:
            raise RuntimeError("DRM_IOCTL_AMDXDNA_CREATE_HWCTX IOCTL failed (err=-16): Device or resource busy")
        if FAKE.contexts + FAKE.other_contexts >= npu.CONTEXT_LIMIT[FAKE.target]:
            raise RuntimeError("DRM_IOCTL_AMDXDNA_CREATE_HWCTX IOCTL failed (err=-28): No space left on device")
        if isinstance(what, uuid):
            if what.text not in dev.registered:
                raise RuntimeError(f"xclbin {what.text} is not registered with the device")
            self.design, self.kind = dev.registered[what.text].design, "xclbin"
        elif isinstance(what, elf):
            self.design, self.kind = what.design, "elf"
        else:
            raise TypeError(f"hw_context(device, {type(what).__name__}) is not a pyxrt overload")
        FAKE.contexts += 1
        weakref.finalize(self, _context_gone, _generation[0])


def _context_gone(generation):
    if generation == _generation[0]:
        FAKE.contexts -= 1


# ---- buffers -----------------------------------------------------------------------------------------

class bo:
    class flags(enum.IntEnum):
        normal = 0
        cacheable = 1
        device_only = 2
        host_only = 3
        p2p = 4
        svm = 5

    normal, cacheable, device_only, host_only, p2p, svm = flags

    _ids = itertools.count()

    def __init__(self, owner, size, flags_or_offset, group=None):
        self.id = next(bo._ids)
        self.syncs: list[tuple] = []
        if isinstance(owner, bo):  # sub-buffer: a window of its parent's memory
            offset = int(flags_or_offset)
            if offset + size > owner.size():
                raise RuntimeError("sub-buffer exceeds its parent")
            self.host, self.device = owner.host[offset:offset + size], owner.device[offset:offset + size]
            self.flag, self.group = owner.flag, owner.group
            return
        if not isinstance(owner, (device, hw_context)):
            raise TypeError("bo(device | hw_context, size, flags, group)")
        if "alloc" in FAKE.faults:
            raise RuntimeError("failed to allocate buffer object: Cannot allocate memory")
        pinned = -(-int(size) // PAGE) * PAGE
        if FAKE.pinned + pinned > FAKE.memlock:
            raise RuntimeError(f"failed to pin {pinned} bytes: Cannot allocate memory (RLIMIT_MEMLOCK)")
        FAKE.pinned += pinned
        weakref.finalize(self, _unpin, pinned, _generation[0])
        self.flag, self.group = bo.flags(flags_or_offset), int(group)
        self.host = np.zeros(int(size), np.uint8)
        self.device = np.full(int(size), GARBAGE, np.uint8)

    def size(self) -> int:
        return self.host.nbytes

    def address(self) -> int:
        return 0x4000_0000 + self.id * PAGE

    def map(self) -> memoryview:
        return memoryview(self.host)

    def write(self, data, seek: int) -> None:
        raw = np.frombuffer(memoryview(data).cast("B"), np.uint8)
        self._check(seek, raw.nbytes)
        self.host[seek:seek + raw.nbytes] = raw

    def read(self, size: int, skip: int) -> np.ndarray:
        self._check(skip, size)
        return self.host[skip:skip + size].view(np.int8).copy()

    def sync(self, direction, *window) -> None:
        if len(window) not in (0, 2):  # pyxrt binds sync(direction) and sync(direction, size, offset) only
            raise TypeError("sync(): incompatible function arguments")
        direction = xclBOSyncDirection(direction)
        size, offset = (int(window[0]), int(window[1])) if window else (self.size(), 0)
        self._check(offset, size)
        if direction == TO_DEVICE:
            self.device[offset:offset + size] = self.host[offset:offset + size]
        elif direction == FROM_DEVICE:
            self.host[offset:offset + size] = self.device[offset:offset + size]
        else:
            raise ContractViolation(f"{direction.name} is for GMIO, not NPU buffers")
        self.syncs.append((direction, offset, size))

    def _check(self, offset, size):
        if offset < 0 or size < 0 or offset + size > self.size():
            raise RuntimeError(f"range [{offset}, {offset + size}) outside a BO of {self.size()} bytes")


def _unpin(n, generation):
    if generation == _generation[0]:
        FAKE.pinned -= n


# ---- kernels and runs --------------------------------------------------------------------------------

class run:
    def __init__(self, k=None, state=ert_cmd_state.ERT_CMD_STATE_NEW):
        self.kernel, self._state, self.args, self._pad, self.listed = k, state, {}, None, False

    def set_arg(self, index: int, value) -> None:
        self.args[index] = value

    def get_ctrl_scratchpad_bo(self) -> "bo":
        """The run's control scratchpad (XRT >= 2.26): only a full-ELF kernel whose design declares words has one."""
        words = getattr(self.kernel, "words", None)
        if not words:
            raise RuntimeError("the run's ELF has no control scratchpad")
        if self._pad is None:
            self._pad = bo(self.kernel.ctx, 4 * (1 + max(w["index"] for w in words.values())), bo.host_only, 0)
        return self._pad

    def start(self) -> None:
        if self.listed:
            raise RuntimeError("Run object belongs to a runlist and cannot be explicitly started")
        self._launch()

    def _launch(self) -> None:
        self._state = self.kernel._execute([self.args[i] for i in sorted(self.args)], self._pad)._state

    def wait(self, timeout_ms: int = 0) -> ert_cmd_state:
        return self.state()

    def wait2(self, timeout_ms: int | None = None):
        if self.state() != COMPLETED:
            raise RuntimeError(f"command failed: {self._state.name}")
        return self._state

    def state(self) -> ert_cmd_state:
        if self.listed:
            raise ContractViolation("a run in a runlist has no defined state of its own (XRT's xrt::runlist::add); "
                                    "runlist.wait() raises on the first run that did not complete")
        return self._state


class kernel:
    """An xclbin kernel: (opcode, instructions, word count, *data BOs)."""
    FIRST_DATA = npu.FIRST_ARENA_ARG["npu1"]

    def __init__(self, ctx: hw_context, name: str):
        if ctx.kind != "xclbin" or name not in ctx.design.doc["kernels"]:
            raise RuntimeError(f"No such kernel {name!r} in the context's xclbin")
        self.ctx = ctx

    def group_id(self, index: int) -> int:
        return int(index)  # one memory group per argument, so a BO on the wrong argument is caught

    def __call__(self, *args) -> run:
        return self._execute(list(args))

    def _execute(self, args, pad=None) -> run:
        if len(args) < 3:
            raise ContractViolation("an xclbin kernel takes (opcode, instruction BO, word count, *data BOs)")
        opcode, insts, words, data = args[0], args[1], args[2], args[3:]
        if opcode != 3:
            raise ContractViolation(f"opcode {opcode}: NPU instruction streams run with opcode 3")
        if not isinstance(insts, bo) or insts.flag != bo.cacheable or insts.group != self.group_id(1):
            raise ContractViolation("the instruction BO must be a cacheable BO on kernel.group_id(1)")
        stream = insts.device.view(np.uint32)
        length = int(stream[3]) // 4   # a transaction: its header's byte size
        if words != length:
            unit = "bytes" if words == 4 * length else "a wrong count"
            raise ContractViolation(f"instruction count {words} is {unit}; the stream has {length} 32-bit words")
        dispatch = _check_txn(self.ctx.design, stream[:words], data)
        return _dispatch(self.ctx.design, dispatch, data, self.group_id, self.FIRST_DATA)


class _ext:
    class kernel(kernel):
        """A full-ELF kernel (one runtime sequence of the ELF): its arguments are the data BOs only."""
        FIRST_DATA = npu.FIRST_ARENA_ARG["npu2"]

        def __init__(self, ctx: hw_context, name: str):
            if ctx.kind != "elf" or name not in ctx.design.doc["sequences"]:
                raise RuntimeError(f"No kernel {name!r} in the context's ELF")
            self.ctx, self.dispatch = ctx, ctx.design.doc["sequences"][name]
            self.words = ctx.design.doc.get("scratchpad", {}).get(self.dispatch, {})

        def group_id(self, index: int) -> int:
            raise ContractViolation("group_id of a full-ELF kernel: XRT reads the first of its compute units, and "
                                    "an ELF kernel has none (undefined behaviour); its BOs need no group")

        def _execute(self, args, pad=None) -> run:
            if self.words:
                _check_words(self.ctx.design, self.dispatch, self.words, pad, args)
            return _dispatch(self.ctx.design, self.dispatch, args, None, self.FIRST_DATA)


ext = types.SimpleNamespace(kernel=_ext.kernel)


class runlist:
    def __init__(self, ctx: hw_context):
        self.ctx, self.runs, self.failed = ctx, [], None

    def add(self, r: run) -> None:
        if r.listed:
            raise RuntimeError("Run object is already part of a runlist")
        if r.kernel.ctx is not self.ctx:
            raise RuntimeError("The run's kernel was not created in the runlist's hw_context")
        r.listed = True
        self.runs.append(r)

    def execute(self) -> None:
        FAKE.runlists += 1
        self.failed = None
        for r in self.runs:
            r._launch()
            if r._state != COMPLETED:  # the later runs are aborted
                self.failed = r._state
                break

    def wait(self) -> None:
        if self.failed is not None:
            raise RuntimeError(f"runlist failed execution ({self.failed.name})")


def _check_txn(design: _Design, stream: np.ndarray, data: list) -> str:
    """The dispatch whose transaction is on the device, its per-run argplus checked against the io values there."""
    for made, entry in design.streams:
        if len(made) != len(stream):
            continue
        shifted = [t for t in entry["patches"] if t["word"]]
        same = np.ones(len(made), bool)
        same[[t["at"] for t in shifted]] = False
        if not np.array_equal(stream[same], made[same]):
            continue
        io = data[ARENAS.index("io")].device if len(data) == len(ARENAS) else None
        for t in shifted:
            w = entry["words"][t["word"]]
            want = t["base"] + _word(design, w, io) * w["scale"] * t["bytes"]
            if int(stream[t["at"]]) != want:
                raise ContractViolation(f"{entry['dispatch']}: the DDR patch of a transfer {t['word']} shifts has "
                                        f"argplus {int(stream[t['at']])} on the device (word {t['at']}); "
                                        f"{w['buffer']}[{w['element']}] makes it {want}: patched and synced?")
        return entry["dispatch"]
    raise ContractViolation("the instruction stream on the device is not one the xclbin made (was the instruction "
                            "BO synced to the device? was a static transfer's patch op changed?)")


def _word(design: _Design, w: dict, io) -> int:
    """(io[buffer][element] + add), read from the io BO's device memory."""
    b = design.program.buffers[w["buffer"]]
    return int(io[b.offset:b.offset + 4 * int(np.prod(b.shape, dtype=np.int64))].view(np.int32)[w["element"]]) \
        + int(w.get("add", 0))


def _check_words(design: _Design, dispatch: str, words: dict, pad, data: list) -> None:
    """The scratchpad a dispatch's DMAs read, on the device, against the io values on the device."""
    if pad is None:
        raise ContractViolation(f"dispatch {dispatch} adds {len(words)} scratchpad words to its DMA addresses, but "
                                "the run was started without them (run.get_ctrl_scratchpad_bo(), write, sync)")
    table = pad.device.view(np.uint32)
    io = data[ARENAS.index("io")].device if len(data) == len(ARENAS) else None
    for name, w in words.items():
        value = _word(design, w, io)
        want = (value * w["scale"]) & 0xFFFFFFFF
        if table[w["index"]] != want:
            raise ContractViolation(f"scratchpad word {name} (index {w['index']}) is {int(table[w['index']])} on the "
                                    f"device; {w['buffer']}[{w['element']}] = {value} makes it {want}: written "
                                    "and synced before the start?")


def _dispatch(design: _Design, name: str, data: list, group_id, first: int) -> run:
    if len(data) > npu.MAX_HOST_BUFFERS:
        raise ContractViolation(f"{len(data)} host BOs in one kernel call; more than {npu.MAX_HOST_BUFFERS} "
                                "crashed XRT or skipped a DMA (mlir-aie#3248)")
    if len(data) != len(ARENAS):
        raise ContractViolation(f"the runtime sequence takes {len(ARENAS)} arenas {ARENAS}, got {len(data)} BOs")
    sizes = design.program.meta["arenas"]
    for i, (arena, b) in enumerate(zip(ARENAS, data)):
        grouped = group_id is not None
        if not isinstance(b, bo) or b.flag != bo.host_only or (grouped and b.group != group_id(first + i)):
            on = f" on group_id({first + i})" if grouped else ""
            raise ContractViolation(f"argument {first + i} ({arena}) must be a host_only BO{on}")
        if b.size() < sizes[arena]:
            raise ContractViolation(f"the {arena} BO has {b.size()} bytes; the program's {arena} arena needs "
                                    f"{sizes[arena]}")
    if "timeout" in FAKE.faults:
        return run(state=ert_cmd_state.ERT_CMD_STATE_TIMEOUT)
    if "error" in FAKE.faults:
        return run(state=ert_cmd_state.ERT_CMD_STATE_ERROR)
    step = design.steps[name]
    if watchdog.dispatch_seconds(design.program, step) > FAKE.watchdog_s:
        FAKE.timeouts += 1
        return run(state=ert_cmd_state.ERT_CMD_STATE_TIMEOUT)
    design.executor.dispatch(step, {a: b.device for a, b in zip(ARENAS, data)})
    FAKE.dispatches.append(step.op)
    return run(state=COMPLETED)


class _DeviceExecutor(EmuExecutable):
    """The emulator's kernels, reading and writing the BOs' device memory instead of its own arenas."""

    def __init__(self, program: Program):  # no upload: the device memory is the BOs'
        self.program, self.counters, self._unpacked = program, Counters(), {}
        self.arenas, self._state = {}, None

    def dispatch(self, step, memory: dict[str, np.ndarray]) -> None:
        self.arenas = {a: memory[a] for a in ("weights", "io", "scratch")}
        self._state = types.SimpleNamespace(arena=memory["state"])
        self._unpacked = {}  # weights are read from the device as they are now
        for k in step.body:
            self._kernel(k)


# ---- fake artifacts, where the backend looks for real ones ---------------------------------------------

def write_artifacts(program: Program, root: Path, budget_s: float | None = None,
                    scratchpad: dict | None = None, sites: dict | None = None) -> str:
    """Build `program`'s artifact for its target into root (a prebuilt/ folder) and list it in
    root/manifest.json; returns the content key. `scratchpad`: {dispatch: {word: spec}}, as a build records it.
    npu1: `sites` ({dispatch: [kernels.build.Site]}, the fused design's transfers as kernels.build.fused_build
    records them) lay out each dispatch's transaction, one patch op per transfer; without them every kernel
    operand is one static transfer. The manifest's "patches" come from kernels.build.patch_table on the files
    written, as the real build finds them."""
    from kernels import build as kbuild
    dp = watchdog.split_dispatches(program, budget_s)
    key, target = program.meta["content_key"], program.target
    folder = Path(root) / target / key
    dp.save(folder / "program")
    dispatches = [s for e in dp.entries.values() for s in e.steps if s.kind == "dispatch"]
    files, extra = {}, {"scratchpad": scratchpad} if scratchpad else {}
    if target == "npu1":
        streams = []
        for i, s in enumerate(dispatches):
            words, patches = _txn((sites or {}).get(s.op) or _operand_sites(dp, s))
            path = folder / f"insts_{i}.bin"
            words.tofile(path)
            files[f"insts/{s.op}"] = path
            streams.append({"dispatch": s.op, "file": path.name, "patches": patches,
                            "words": (scratchpad or {}).get(s.op, {})})
        doc = {"fake_pyxrt": "xclbin", "uuid": key, "kernels": [npu_artifacts.XCLBIN_KERNEL], "program": "program",
               "streams": streams}
        (folder / "design.xclbin").write_text(json.dumps(doc))
        files["xclbin"] = folder / "design.xclbin"
        if scratchpad:
            extra["patches"] = {d: kbuild.patch_table(sites[d], kbuild.insts_patches(files[f"insts/{d}"]), words, d)
                                for d, words in scratchpad.items()}
    else:
        doc = {"fake_pyxrt": "elf", "program": "program", "scratchpad": scratchpad or {},
               "sequences": {npu_artifacts.sequence_name(s.op): s.op for s in dispatches}}
        (folder / "design.elf").write_text(json.dumps(doc))
        files["elf"] = folder / "design.elf"
    npu_artifacts.record_artifact(root, key, npu_artifacts.manifest_entry(dp, root, files, **extra))
    return key


# a version-0.1 transaction, laid out as mlir-aie's lib/Targets/AIETargetNPU.cpp writes one (aie-rt xaie_txn.h)
TXN_WRITE, TXN_BLOCKWRITE, TXN_MASKWRITE, TXN_TCT, TXN_DDR_PATCH = 0x00, 0x01, 0x03, 0x80, 0x81
SHIM_BD, SHIM_BD_WORDS, SHIM_QUEUE = 0x1D000, 8, 0x1D214  # AIE-ML shim DMA: BD0's registers, a channel's queue


def _txn(sites) -> tuple[np.ndarray, list[dict]]:
    """(words, one record per DDR patch: the word index of its argplus, its static base, element size, word)."""
    ops, patches, at = [[TXN_MASKWRITE, 0, 0x1D220, 0, 0, 0x1, 28]], [], 4 + 7
    for i, s in enumerate(sites):
        col, bd = i % 4, i % 16
        reg = col << 25 | SHIM_BD + 4 * SHIM_BD_WORDS * bd
        bd_words = [0] * SHIM_BD_WORDS
        bd_words[0] = 16 * (i + 1)  # a transfer length; the address words (1, 2) stay 0: the patch supplies them
        ops.append([TXN_BLOCKWRITE, col, reg, 4 * (4 + SHIM_BD_WORDS)] + bd_words)
        at += 4 + SHIM_BD_WORDS
        ops.append([TXN_DDR_PATCH, 48, 0, 0, 0, 0, reg + 4, 0, s.arg, 0, s.plus & 0xFFFFFFFF, s.plus >> 32])
        patches.append({"at": at + 10, "base": s.plus, "bytes": s.bytes, "word": s.word})
        at += 12
        ops.append([TXN_WRITE, 0, col << 25 | SHIM_QUEUE, 0, bd, 24])
        at += 6
    ops.append([TXN_TCT, 16, 0x00000001, 0x01010000])   # wait for the last drain
    body = [w for op in ops for w in op]
    header = [0 | 1 << 8 | 3 << 16 | 6 << 24, 5 | 1 << 8, len(ops), 4 * (4 + len(body))]
    return np.array(header + body, np.uint32), patches


def _operand_sites(program: Program, step) -> list:
    """Without the design's transfers: each kernel operand read or written once, from its start."""
    from kernels.build import Site
    sizes = {"bfloat16": 2, "float32": 4, "int32": 4}
    return [Site(ARENAS.index(b.arena), b.offset, sizes[b.dtype], None, f"{k.op} {n}")
            for k in step.body for n in (*k.inputs, *k.outputs) if n for b in [program.buffers[n]]]


# ---- a fake Ryzen AI laptop around the fake pyxrt -------------------------------------------------------------

PCI_IDS = {"npu1": "0x1502", "npu2": "0x17f0"}   # Phoenix, Strix (sdk/runtime/checks.py NPU_PCI_IDS)


def install_machine(root: Path, monkeypatch) -> Path:
    """Make this process see a Ryzen AI machine under `root`: the NPU's device node (whose flock is the NPU lock),
    this module as pyxrt, prebuilt/ under root, memlock as the fake pins it. The PCI function comes with
    `plug(root, target)`. Returns the prebuilt/ folder."""
    import sys
    from sdk import runtime
    from sdk.runtime import checks
    monkeypatch.setitem(sys.modules, "pyxrt", sys.modules[__name__])
    monkeypatch.setattr(checks, "SYSFS_PCI", root / "sys")
    monkeypatch.setattr(checks, "DEVICE_NODES", str(root / "accel*"))
    monkeypatch.setattr(npu_artifacts, "prebuilt_dirs", lambda: [root / "prebuilt"])
    monkeypatch.setattr(npu, "memlock_limit", lambda: FAKE.memlock)
    monkeypatch.setattr(runtime, "_warned", False)
    root.mkdir(parents=True, exist_ok=True)
    (root / "accel0").touch()
    return root / "prebuilt"


def plug(root: Path, target: str, device_id: str | None = None) -> None:
    """The NPU's PCI function in the fake sysfs, as amdxdna's device of that generation shows it."""
    dev = root / "sys" / "0000:c4:00.1"
    dev.mkdir(parents=True, exist_ok=True)
    for f, v in {"vendor": "0x1022", "device": device_id or PCI_IDS[target], "class": "0x118000",
                 "revision": "0x10"}.items():
        (dev / f).write_text(v + "\n")
