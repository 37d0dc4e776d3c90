"""The npu backend: a compiled Program on a Ryzen AI NPU, through XRT's Python binding (pyxrt).

What a session does on the device, in order:
- the target (npu1 / npu2) comes from the NPU's PCI id through the one table, checks.NPU_PCI_IDS;
  an unknown id is an error, never a guess;
- the program's artifact is looked up in prebuilt/manifest.json under the program's content key and its
  files are checked against their sha256 (npu_artifacts.py, which also documents the manifest);
- one hardware context and its kernel(s) per session; the instruction streams go to the device once (on
  npu1 a dispatch with runtime words then has those few words rewritten and synced before each start);
  the data lives in four arena buffers (weights, state, io, scratch: arena.py), passed to every runtime
  sequence in that order;
- weights are synced to the device once, at load; a run syncs only the byte ranges of its inputs and
  runtime parameters (to the device) and of its outputs (from it); a host op between two dispatches
  syncs only its operands;
- the dispatch steps run as the program has them: the compiler already split any whose estimate could
  exceed the driver's watchdog (sdk/compiler/watchdog.py); consecutive ones go out as one runlist;
- one process-wide lock serialises NPU work, and an flock on the device node keeps every other process,
  of any user, off the device (the NPU is single-tenant; npu_lock.py).
Every failure is a typed error with its fix. pyxrt is imported when the backend is opened, not before.
"""
from __future__ import annotations

import importlib
import itertools
import resource
import threading
import weakref
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from ..errors import (ArtifactMissing, ContextLimit, DeviceBusy, DeviceUnavailable, DispatchTimeout, InputError,
                      MemlockTooLow, ProgramError, UsageError)
from ..program import Program, Step
from . import checks, npu_artifacts, npu_insts, npu_lock, packing
from .arena import ARENAS, NPU_TARGETS, ArenaExecutable, ArenaState
from .backend import State
from .npu_artifacts import BUILD_FIX, Artifact, find_artifact

# kernel(OPCODE_TRANSACTION, instruction BO, instruction count in 32-bit WORDS, *arena BOs): opcode 3 makes
# the firmware execute the instruction stream (mlir-aie's host code; a byte count here is mlir-aie#1609)
OPCODE_TRANSACTION = 3
INSTRUCTION_ARG = 1            # the instruction BO is argument 1 of an xclbin kernel: kernel.group_id(1)
FIRST_ARENA_ARG = {"npu1": 3,  # xclbin kernel: (opcode, instructions, count, *arenas)
                   "npu2": 0}  # full-ELF kernel: the arenas are its only arguments
MAX_HOST_BUFFERS = 5           # more per kernel crashed or silently skipped a DMA (mlir-aie#3248)
CONTEXT_LIMIT = {"npu1": 6, "npu2": 16}  # hardware contexts per NPU, shared by every process
PAGE = 4096                    # BOs are pinned in whole pages
SYNC_GAP = 64                  # ranges this close are synced as one (the memory plan aligns buffers to 64 B)


# ---- target ------------------------------------------------------------------------------------------

def detect_target() -> str:
    """npu1 or npu2, from the NPU's PCI device id; no NPU or an unknown id is a DeviceUnavailable."""
    npus = checks.find_npu_pci()
    if not npus:
        raise DeviceUnavailable("no AMD NPU on the PCI bus", fix="this machine has no Ryzen AI NPU; use --device cpu")
    n = npus[0]
    if not n.target:
        known = ", ".join(f"{k:#06x} ({v})" for k, v in checks.NPU_PCI_IDS.items())
        raise DeviceUnavailable(f"AMD device {n.device_id:#06x} at {n.address} is not a known NPU (known: {known})",
                                fix="report the PCI id so it can join checks.NPU_PCI_IDS; use --device cpu meanwhile")
    return n.target


def artifacts_problem() -> str:
    """Why device="auto" must not pick the NPU even though a device node and pyxrt exist, or ""."""
    try:
        target = detect_target()
        if not npu_artifacts.artifact_keys(target):
            folders = " or ".join(map(str, npu_artifacts.prebuilt_dirs()))
            return (f"no prebuilt NPU artifacts for {target} in {folders}; "
                    f"build them with `aie-apps build MODEL --target {target}`")
    except DeviceUnavailable as e:
        return e.message
    return ""


# ---- per-run words: DMA addresses set by a run's values ---------------------------------------------

def scratchpad_words(words: Mapping[str, dict], values: Mapping[str, np.ndarray]) -> dict[int, int]:
    """One dispatch's control-scratchpad words, {index: uint32} (word_values at each word's index)."""
    return {int(words[name]["index"]): value & 0xFFFFFFFF for name, value in word_values(words, values).items()}


def word_values(words: Mapping[str, dict], values: Mapping[str, np.ndarray]) -> dict[str, int]:
    """One dispatch's per-run words, {name: element offset}: each is the int32 io value buffer[element] the
    host writes this run, plus add (a position's offset i, a row offset), times scale (an element offset a DMA
    adds to its base address). A value outside 0..limit would move that DMA outside its tensor: an InputError,
    raised before anything runs."""
    table = {}
    for name, w in words.items():
        value = int(np.asarray(values[w["buffer"]]).reshape(-1)[w["element"]]) + int(w.get("add", 0))
        if not 0 <= value <= w["limit"]:
            raise InputError(f"{w['buffer']}[{w['element']}] (+ {w.get('add', 0)}) = {value} is outside "
                             f"0..{w['limit']}: the device would "
                             f"address outside a buffer ({name})",
                             fix="pass token ids within the vocabulary and positions within the cache")
        table[name] = value * int(w["scale"])
    return table


# ---- the device, shared by every session of the process -----------------------------------------------

_LOCK = threading.RLock()  # all NPU work of this process, one call at a time (the device actor)


def memlock_limit() -> float:
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return float("inf") if soft == resource.RLIM_INFINITY else float(soft)


def _pages(n: int) -> int:
    return max(PAGE, -(-n // PAGE) * PAGE)


class _Device:
    """pyxrt.device(0), the cross-process NPU lock (npu_lock), and what this process holds on the NPU."""
    current: "_Device | None" = None

    def __init__(self, pyxrt):
        self.lock = npu_lock.acquire()
        try:
            self.handle = pyxrt.device(0)
        except Exception as e:
            self.lock.release()
            raise DeviceUnavailable(f"XRT cannot open the NPU: {e}",
                                    fix="run `aie-apps doctor`; check the amdxdna driver, firmware and "
                                        "`xrt-smi examine`") from None
        self.users = 0
        self.contexts = 0
        self.pinned = 0

    @classmethod
    def acquire(cls, pyxrt) -> "_Device":
        if cls.current is None:
            cls.current = cls(pyxrt)
        cls.current.users += 1
        return cls.current

    def release(self):
        self.users -= 1
        if self.users == 0 and _Device.current is self:
            _Device.current = None
            self.handle = None
            self.lock.release()


# ---- the backend --------------------------------------------------------------------------------------

class NpuState(ArenaState):
    """A stream's state arena in its own device BO; the host copy goes to the device before the next run
    after it was created or reset, and stays on the device otherwise."""

    def __init__(self, exe: "NpuExecutable"):
        self.bo, arena = exe._alloc(exe.program.meta["arenas"]["state"], "state")
        self.owner = weakref.ref(exe)
        self.dirty = True
        arena[:] = 0
        super().__init__(exe.program, arena)

    def reset(self):
        super().reset()
        self.dirty = True


def _check_patches(words: np.ndarray, sites: Mapping[str, list], path: Path) -> None:
    """Every recorded patch site is the argplus of a DDR patch op of the stream, holding its static base: a
    manifest and an insts file that disagree would send a DMA to the wrong address, silently."""
    try:
        patches = {p.at: p for p in npu_insts.parse(words, path.name).patches}
    except npu_insts.InstructionStreamError as e:
        raise ArtifactMissing(e.message, fix=BUILD_FIX.format(target="npu1")) from None
    for word, places in sites.items():
        for p in places:
            op = patches.get(p["at"])
            if op is None or op.plus != p["base"] or p["bytes"] not in (1, 2, 4, 8):
                found = "no DDR patch's argplus" if op is None else f"argplus {op.plus}, element size {p['bytes']}"
                raise ArtifactMissing(f"{path.name}: the manifest patches word {p['at']} for {word} with base "
                                      f"{p['base']}; the stream has {found} there",
                                      fix=BUILD_FIX.format(target="npu1"))


class NpuExecutable(ArenaExecutable):
    state_type = NpuState

    def __init__(self, backend: "NpuBackend", program: Program, weights: Mapping[str, np.ndarray]):
        if program.target != backend.target:
            raise ProgramError(f"this program was compiled for {program.target}; the NPU here is {backend.target}",
                               fix=f"compile for {backend.target} (Session(device='npu') does)")
        if "watchdog" not in program.meta:
            raise ProgramError("this program's dispatches were not planned for the driver's watchdog",
                               fix="compile it with this SDK's compiler (sdk.compiler.compile), which does")
        super().__init__(program)
        image = packing.weights_image(program, weights)  # checks the weights before the device is touched
        self.pyxrt = backend.pyxrt
        self._watchdog = program.meta["watchdog"]
        self._wait_ms = int(2 * self._watchdog["driver_s"] * 1000)  # the driver's watchdog fires first
        artifact = find_artifact(program)
        self._scratchpad = {d: words for d, words in artifact.scratchpad.items() if words}
        self._patches = {d: artifact.patches.get(d, {}) for d in self._scratchpad} if self.target == "npu1" else {}
        for d, words in self._scratchpad.items() if self.target == "npu1" else ():
            missing = sorted(set(words) - set(self._patches[d]))
            if missing:
                raise ArtifactMissing(f"the npu1 artifact {artifact.key} sets DMA addresses per run in {d} but "
                                      f"records no instruction patch for {', '.join(missing)} (built before npu1 "
                                      "instruction patching?)", fix=BUILD_FIX.format(target="npu1"))
        self._bos: dict[str, object] = {}
        self._host: dict[str, np.ndarray] = {}
        self._pinned = 0
        self._context = None
        self._closed = False
        with _LOCK:
            self._dev = _Device.acquire(self.pyxrt)
            try:
                self._open(artifact, image)
            except BaseException:
                self._release()
                raise

    # -- load --
    def _open(self, artifact: Artifact, image: np.ndarray):
        x, sizes = self.pyxrt, self.program.meta["arenas"]
        streams = {s.op: np.fromfile(artifact.files[f"insts/{s.op}"], dtype=np.uint32) for s in self._dispatches()} \
            if self.target == "npu1" else {}
        for name, sites in self._patches.items():
            _check_patches(streams[name], sites, artifact.files[f"insts/{name}"])
        # weights, io, scratch, the no-state placeholder, one stream's state, the instruction streams
        need = sum(_pages(sizes[a]) for a in ("weights", "io", "scratch")) + PAGE \
            + (_pages(sizes["state"]) if sizes["state"] else 0) + sum(_pages(w.nbytes) for w in streams.values())
        limit = memlock_limit()
        if self._dev.pinned + need > limit:
            raise MemlockTooLow(f"this session pins {need / 2**20:.1f} MiB of device buffers (this process already "
                                f"{self._dev.pinned / 2**20:.1f} MiB); the memlock limit is {limit / 2**20:.1f} MiB",
                                fix="add '* - memlock unlimited' to /etc/security/limits.d/99-npu.conf and log in "
                                    "again (check with `ulimit -l`)")
        self._create_context(artifact)
        # a full-ELF kernel has no xclbin connectivity: XRT's group_id would index its empty CU list (undefined
        # behaviour) and never checks a BO's group, so its BOs take group 0, as mlir-aie's full-ELF host code does
        first = FIRST_ARENA_ARG[self.target]
        self._groups = [self.kernel.group_id(first + i) if self.target == "npu1" else 0 for i in range(len(ARENAS))]
        for arena in ("weights", "io", "scratch"):
            self._bos[arena], self._host[arena] = self._alloc(sizes[arena], arena)
        self._no_state, _ = self._alloc(0, "state")  # bound when a run needs no state
        self._insts, self._insts_host = {}, {}
        for name, words in streams.items():  # the instruction streams go to the device once
            bo = self._bo(words.nbytes, x.bo.cacheable, self.kernel.group_id(INSTRUCTION_ARG))
            bo.write(words.view(np.uint8), 0)
            bo.sync(x.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE)
            self._insts[name] = (bo, len(words))  # the count is in 32-bit words, never bytes
            if name in self._patches:  # rewritten per run: the host view of the BO
                self._insts_host[name] = np.frombuffer(bo.map(), np.uint32)[:len(words)]
        # the one weight upload of the session
        self._host["weights"][:image.nbytes] = image
        self._sync("weights", x.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, [(0, image.nbytes)])
        self.counters.weight_bytes_to_device += image.nbytes

    def _dispatches(self):
        return [s for e in self.program.entries.values() for s in e.steps if s.kind == "dispatch"]

    def _create_context(self, artifact: Artifact):
        x = self.pyxrt
        try:
            if self.target == "npu1":
                xclbin = x.xclbin(str(artifact.files["xclbin"]))
                self._dev.handle.register_xclbin(xclbin)
                self._context = x.hw_context(self._dev.handle, xclbin.get_uuid())
            else:
                self._context = x.hw_context(self._dev.handle, x.elf(str(artifact.files["elf"])))
        except RuntimeError as e:
            raise self._context_error(e) from None
        self._dev.contexts += 1
        try:
            if self.target == "npu1":
                self.kernel = x.kernel(self._context, artifact.kernel)
                self.kernels = {}
            else:
                self.kernel = None
                self.kernels = {s.op: x.ext.kernel(self._context, artifact.sequence(s.op)) for s in self._dispatches()}
        except RuntimeError as e:
            raise ArtifactMissing(f"the {self.target} artifact {artifact.key} lacks a kernel this program runs: {e}",
                                  fix=BUILD_FIX.format(target=self.target)) from None

    def _context_error(self, e: Exception) -> DeviceUnavailable:
        text, limit = str(e), CONTEXT_LIMIT[self.target]
        if self._dev.contexts >= limit:
            return ContextLimit(f"no free NPU hardware context: {self.target} has {limit} and this process holds "
                                f"{self._dev.contexts} ({text})",
                                fix="close sessions you no longer need (Session.close / `with Session(...)`), or "
                                    "load fewer models at once")
        if "no space" in text.lower() or "err=-28" in text:
            return ContextLimit(f"no free NPU hardware context: other programs hold the {self.target}'s {limit} "
                                f"({text})", fix="close other programs using the NPU (see `xrt-smi examine`), or "
                                                 "use --device cpu")
        if "busy" in text.lower() or "err=-16" in text:
            return DeviceBusy(f"the NPU refused a hardware context: {text}",
                              fix="another program holds the NPU's contexts: close it, or use --device cpu")
        return DeviceUnavailable(f"cannot create an NPU hardware context: {text}",
                                 fix="run `aie-apps doctor`; a firmware/driver mismatch shows here (check "
                                     "`xrt-smi validate`); other programs may hold all "
                                     f"{limit} contexts of the {self.target}")

    def _kernel_for(self, dispatch: str):
        return self.kernel if self.target == "npu1" else self.kernels[dispatch]

    def _bo(self, nbytes: int, flags, group):
        size = _pages(nbytes)
        try:
            bo = self.pyxrt.bo(self._dev.handle, size, flags, group)
        except RuntimeError as e:
            limit = memlock_limit()
            if self._dev.pinned + size > limit:
                raise MemlockTooLow(f"allocating {size / 2**20:.1f} MiB of device buffer failed ({e}); this process "
                                    f"pins {self._dev.pinned / 2**20:.1f} MiB against a {limit / 2**20:.1f} MiB limit",
                                    fix="add '* - memlock unlimited' to /etc/security/limits.d/99-npu.conf and log "
                                        "in again") from None
            raise DeviceUnavailable(f"allocating {size / 2**20:.1f} MiB of NPU buffer failed: {e}",
                                    fix="close other programs using the NPU; check `ulimit -l` and `aie-apps doctor`") \
                from None
        self._dev.pinned += size
        self._pinned += size
        return bo

    def _alloc(self, nbytes: int, arena: str):
        bo = self._bo(nbytes, self.pyxrt.bo.host_only, self._groups[ARENAS.index(arena)])
        return bo, np.frombuffer(bo.map(), np.uint8)

    # -- protocol --
    def new_state(self) -> NpuState:
        with _LOCK:
            self._check_open()
            return NpuState(self)

    def run(self, entry: str | None, inputs: Mapping[str, np.ndarray], state: State | None = None,
            stop: Callable[[], bool] | None = None) -> dict:
        e, data = self._begin(entry, inputs, state)
        for s in e.steps:  # a word out of range would move a DMA outside its tensor: refused before anything runs
            scratchpad_words(self._scratchpad.get(s.op, {}), data)
        to_dev = self.pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE
        with _LOCK:
            self._check_open()
            self._state, self._values = state, data
            try:
                if state is not None and state.dirty:  # a new or reset state: its zeros go to the device once
                    self._sync("state", to_dev, [(0, self.program.meta["arenas"]["state"])])
                    state.dirty = False
                ranges = []
                for name, array in data.items():  # inputs and runtime parameters: only their bytes
                    self._store(name, array)
                    ranges.append((self.program.buffers[name].offset, array.nbytes))
                self._sync("io", to_dev, ranges)
                for kind, steps in itertools.groupby(e.steps, key=lambda s: s.kind):
                    if kind == "dispatch":
                        self._dispatch(tuple(steps))
                    else:
                        for step in steps:
                            self._host(step)
                out = {name: self._fetch(buf) for name, buf in e.outputs.items()}
            finally:
                self._state = None
        self.counters.runs += 1
        return out

    def close(self):
        with _LOCK:
            if not self._closed:
                self._closed = True
                self._release()

    def _release(self):
        self.kernel = None
        self.kernels = {}
        self._insts, self._insts_host, self._bos, self._host, self._no_state = {}, {}, {}, {}, None
        if self._context is not None:
            self._context = None
            self._dev.contexts -= 1
        self._dev.pinned -= self._pinned
        self._pinned = 0
        self._dev.release()

    def _check_open(self):
        if self._closed:
            raise UsageError("this npu session is closed", fix="open a new Session")

    def _owns(self, state: State) -> bool:
        return isinstance(state, NpuState) and state.owner() is self

    # -- memory --
    def _arena(self, arena: str) -> np.ndarray:
        return self._host[arena]

    def _bo_of(self, arena: str):
        if arena == "state":
            if self._state is None:
                raise UsageError("this step needs a state", fix="pass state=session.new_state()")
            return self._state.bo
        return self._bos[arena]

    def _sync(self, arena: str, direction, ranges) -> None:
        """Sync byte ranges of one arena, merging neighbours (the memory plan pads buffers to 64 B)."""
        bo = self._bo_of(arena)
        to_device = direction == self.pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE
        merged: list[list[int]] = []
        for start, n in sorted(r for r in ranges if r[1] > 0):
            if merged and start <= merged[-1][1] + SYNC_GAP:
                merged[-1][1] = max(merged[-1][1], start + n)
            else:
                merged.append([start, start + n])
        for start, end in merged:
            bo.sync(direction, end - start, start)
            self.counters.syncs += 1
            if to_device:
                self.counters.bytes_to_device += end - start
            else:
                self.counters.bytes_from_device += end - start

    def _fetch(self, name: str, views=()) -> np.ndarray:
        """A buffer's value from the device: sync its bytes back, then read them (bf16 widened to float32)."""
        buf = self.program.buffers[name]
        if buf.arena != "weights":  # weights are read-only: the host copy is what was uploaded
            self._sync(buf.arena, self.pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE, [(buf.offset, buf.nbytes)])
        return np.array(self._load(name, views))

    # -- steps --
    def _dispatch(self, group: tuple[Step, ...]) -> None:
        """Consecutive dispatches: one kernel call, or (a step split for the watchdog) one runlist, an
        ordered batch submitted at once inside the session's context."""
        x = self.pyxrt
        bos = [self._bos["weights"], self._state.bo if self._state is not None else self._no_state,
               self._bos["io"], self._bos["scratch"]]
        assert len(bos) <= MAX_HOST_BUFFERS
        for step in group:  # npu1: the per-run addresses go into the instruction streams before anything starts
            self._patch_insts(step)
        try:
            if len(group) == 1 and (group[0].op not in self._scratchpad or self.target == "npu1"):
                runs = [self._kernel_for(group[0].op)(*self._args(group[0], bos))]  # calling a kernel starts it
                states = [runs[0].wait(self._wait_ms)]  # the driver's watchdog fires first
            elif len(group) == 1:
                runs = [self._run(group[0], bos)]
                runs[0].start()
                states = [runs[0].wait(self._wait_ms)]
            else:  # XRT leaves a listed run's own state undefined: wait() raises on the first one that failed
                batch = x.runlist(self._context)
                for step in group:
                    batch.add(self._run(step, bos))
                batch.execute()
                batch.wait()
                states = [x.ert_cmd_state.ERT_CMD_STATE_COMPLETED] * len(group)
        except RuntimeError as e:
            ops = group[0].op if len(group) == 1 else f"{group[0].op} .. {group[-1].op}"
            raise DispatchTimeout(f"dispatch {ops} failed to run: {e}", fix=self._dispatch_fix()) from None
        self.counters.dispatches += len(group)
        for step, state in zip(group, states):
            if state != x.ert_cmd_state.ERT_CMD_STATE_COMPLETED:
                estimate = self._watchdog["estimates_s"].get(step.op, float("nan"))
                why = ("the driver's watchdog stopped it" if state == x.ert_cmd_state.ERT_CMD_STATE_TIMEOUT
                       else "the device reported a failure")
                raise DispatchTimeout(f"dispatch {step.op} ended in {getattr(state, 'name', state)}: {why} "
                                      f"(estimated {estimate * 1e3:.1f} ms; the watchdog allows "
                                      f"~{self._watchdog['driver_s']:.0f} s)",
                                      fix=self._dispatch_fix())

    def _args(self, step: Step, bos: list) -> list:
        if self.target == "npu1":
            insts, words = self._insts[step.op]
            return [OPCODE_TRANSACTION, insts, words, *bos]
        return bos

    def _patch_insts(self, step: Step) -> None:
        """npu1: each per-run word into the argplus of the DDR patches of the transfers it shifts (base + word x
        element size), then those words of the instruction BO to the device."""
        sites = self._patches.get(step.op)
        if not sites:
            return
        values = word_values(self._scratchpad[step.op], self._values)
        host, at = self._insts_host[step.op], []
        for word, places in sites.items():
            for p in places:
                npu_insts.set_argplus(host, p["at"], int(p["base"]) + values[word] * int(p["bytes"]))
                at.append(p["at"])
        start, end = 4 * min(at), 4 * (max(at) + 2)
        self._insts[step.op][0].sync(self.pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, end - start, start)
        self.counters.syncs += 1
        self.counters.bytes_to_device += end - start

    def _run(self, step: Step, bos: list):
        """A run of one dispatch: its arguments bound and (npu2) its scratchpad words written and synced."""
        x = self.pyxrt
        run = x.run(self._kernel_for(step.op))
        for index, arg in enumerate(self._args(step, bos)):
            run.set_arg(index, arg)
        words = scratchpad_words(self._scratchpad.get(step.op, {}), self._values) if self.target == "npu2" else {}
        if words:
            pad = run.get_ctrl_scratchpad_bo()
            table = np.frombuffer(pad.map(), np.uint32)
            for index, word in words.items():
                table[index] = word
            pad.sync(x.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE)
        return run

    @staticmethod
    def _dispatch_fix() -> str:
        return ("retry once; if it repeats, run `aie-apps doctor` and `xrt-smi validate` (a firmware/driver "
                "mismatch aborts commands), use a smaller shape bucket, or run with --device cpu")

    def _host(self, step: Step) -> None:
        """A host op between dispatches: only its operands come back, only its result goes out."""
        args = [self._fetch(n, v) if n is not None else None for n, v in zip(step.inputs, step.attrs["views"])]
        out = self.program.buffers[step.outputs[0]]
        self._store(out.name, self.host_result(step, args))
        self._sync(out.arena, self.pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, [(out.offset, out.nbytes)])
        self.counters.host_ops += 1


class NpuBackend:
    name = "npu"

    def __init__(self, target: str | None = None):
        self.target = target or detect_target()
        if self.target not in NPU_TARGETS:
            raise UsageError(f"unknown NPU target {self.target!r}", fix=f"use one of {list(NPU_TARGETS)}")
        try:
            self.pyxrt = importlib.import_module("pyxrt")
        except ImportError as e:
            raise DeviceUnavailable(f"pyxrt is not importable ({e})",
                                    fix="install XRT with the amdxdna plugin and `source /opt/xilinx/xrt/setup.sh`") \
                from None

    def load(self, program: Program, weights: Mapping[str, np.ndarray]) -> NpuExecutable:
        return NpuExecutable(self, program, weights)
