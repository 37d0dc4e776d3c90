"""The npu backend: a compiled Program on a Ryzen AI NPU, through XRT's Python binding (pyxrt).

What a session does on the device, in order:
- the target (npu1 / npu2) comes from the NPU's PCI id through the one table, checks.NPU_PCI_IDS;
  an unknown id is an error, never a guess;
- the program's artifact is looked up in prebuilt/manifest.json under the program's content key and its
  files are checked against their sha256: an xclbin plus one instruction stream per dispatch (npu1), or
  one full ELF holding every dispatch as a runtime sequence (npu2);
- one hardware context and its kernel(s) per session; the instruction streams go to the device once (on
  npu1 a dispatch with runtime words then has those few words rewritten and synced before each start);
  the data lives in four arena buffers (weights, state, io, scratch), passed to every runtime sequence
  in that order;
- weights are synced to the device once, at load; a run syncs only the byte ranges of its inputs and
  runtime parameters (to the device) and of its outputs (from it); a host op between two dispatches
  syncs only its operands;
- a dispatch whose cost-model estimate could exceed the driver's watchdog is split into consecutive
  dispatches before anything runs (`device_program`; the build splits it the same way);
- one process-wide lock serialises NPU work, and an flock on the device node keeps every other process,
  of any user, off the device (the NPU is single-tenant; npu_lock.py).
Every failure is a typed error with its fix. pyxrt is imported when the backend is opened, not before.

The manifest (this module reads and writes it: read_manifest, manifest_entry, record_artifact; kernels/build.py
and the tests' fake build both write through them):
    {"format": 1, "artifacts": {CONTENT_KEY: {"target": "npu1" | "npu2",
        "files": {ROLE: {"path": PATH relative to the manifest's folder, "sha256": HEX}},
        "kernel": "MLIR_AIE",                    # npu1: the xclbin's kernel (optional)
        "sequences": {DISPATCH: KERNEL_NAME},    # npu2: each dispatch's kernel in the ELF (optional)
        "scratchpad": {DISPATCH: {WORD: {"index", "buffer", "element", "add", "scale", "limit"}}},  # optional
        "patches": {DISPATCH: {WORD: [{"at", "base", "bytes"}]}}}}}             # npu1, with "scratchpad"
CONTENT_KEY is the compiled program's meta["content_key"] (sdk/compiler/npu.py: kernels/** sources, steps,
placement, target, toolchain pin). ROLE is "xclbin" and "insts/DISPATCH" for every dispatch step of
device_program(program) on npu1, and "elf" on npu2. DISPATCH is a dispatch step's name (`Step.op`, e.g.
"forward#0", or "forward#0.1" when split); an npu2 kernel name defaults to sequence_name(DISPATCH), e.g.
"main:forward_0".
"scratchpad" lists the per-run words a dispatch's DMAs add to their base addresses (IRON scratchpad parameters,
kernels/README.md "Runtime parameters"): before each start the host writes word = (buffer[element] + add) * scale
(an int32 io buffer it writes anyway, e.g. the position or a token id; the sum checked within 0..limit) as uint32
number `index` of the run's control scratchpad (`run.get_ctrl_scratchpad_bo()`, which pyxrt binds from XRT 2.26 on) and
syncs it. Only npu2 (full ELF) has a control scratchpad. npu1 gets the same words by patching its instruction
streams (sdk/runtime/npu_insts.py): "patches" lists, per word, the DDR-patch ops of the dispatch's insts file that
belong to the transfers the word shifts: `at` is the word index of the op's argplus, `base` its static value (the
transfer at word 0, a byte offset in its arena), `bytes` the element size of the transfer's tensor. Before each
start the host writes argplus = base + word * bytes into the dispatch's instruction BO and syncs those words; the
firmware then resolves the shifted address. An npu1 artifact with words but no patch for one of them is refused.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import itertools
import json
import os
import re
import resource
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from ..compiler import cost, layout
from ..compiler.hardware import TARGETS
from ..errors import (ArtifactMissing, ContextLimit, DeviceBusy, DeviceUnavailable, DispatchTimeout, InputError,
                      MemlockTooLow, ProgramError, UsageError)
from ..ops import OPS
from ..program import Program, Step, Usage
from . import checks, npu_insts, npu_lock
from .backend import Counters, State, check_inputs
from .emu import ARENAS, BF16, validate

# kernel(OPCODE_TRANSACTION, instruction BO, instruction count in 32-bit WORDS, *arena BOs): opcode 3 makes
# the firmware execute the instruction stream (mlir-aie's host code; a byte count here is mlir-aie#1609)
OPCODE_TRANSACTION = 3
INSTRUCTION_ARG = 1            # the instruction BO is argument 1 of an xclbin kernel: kernel.group_id(1)
FIRST_ARENA_ARG = {"npu1": 3,  # xclbin kernel: (opcode, instructions, count, *arenas)
                   "npu2": 0}  # full-ELF kernel: the arenas are its only arguments
XCLBIN_KERNEL = "MLIR_AIE"
MAX_HOST_BUFFERS = 5           # more per kernel crashed or silently skipped a DMA (mlir-aie#3248)
CONTEXT_LIMIT = {"npu1": 6, "npu2": 16}  # hardware contexts per NPU, shared by every process
WATCHDOG_S = 4.0               # amdxdna's tdr_timeout_ms allows ~4-6 s per dispatch
WATCHDOG_MARGIN = 0.5          # plan each dispatch to half of it: the cost model is an estimate
PAGE = 4096                    # BOs are pinned in whole pages
SYNC_GAP = 64                  # ranges this close are synced as one (the memory plan aligns buffers to 64 B)
PREBUILT = Path(__file__).resolve().parents[2] / "prebuilt"
MANIFEST_FORMAT = 1
BUILD_FIX = ("build them on a machine with the mlir-aie toolchain: `aie-apps build MODEL --target {target}` "
             "(see kernels/README.md), or run with --device emu / cpu")


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


# ---- artifacts ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Artifact:
    key: str
    target: str
    files: dict[str, Path]      # role -> checked file
    kernel: str = XCLBIN_KERNEL
    sequences: dict[str, str] = dataclasses.field(default_factory=dict)
    scratchpad: dict[str, dict] = dataclasses.field(default_factory=dict)   # dispatch -> {word: spec}
    patches: dict[str, dict] = dataclasses.field(default_factory=dict)      # npu1: dispatch -> {word: [site]}

    def sequence(self, dispatch: str) -> str:
        return self.sequences.get(dispatch, sequence_name(dispatch))


def sequence_name(dispatch: str) -> str:
    """The default kernel name of a dispatch in a full ELF: device "main", runtime sequence named after the
    dispatch in MLIR symbol characters ("forward#0.1" -> "main:forward_0_1")."""
    return "main:" + re.sub(r"[^A-Za-z0-9_]", "_", dispatch)


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


def prebuilt_dirs() -> list[Path]:
    """Where manifests are read: the user's own folder ($AIE_APPS_HOME/prebuilt, for artifacts copied there)
    first, then the repo's prebuilt/ (where kernels/build.py writes)."""
    from ..settings import load
    return [load().home / "prebuilt", PREBUILT]


def read_manifests() -> list[tuple[Path, dict]]:
    """(folder, {content key: artifact entry}) of every prebuilt folder that has a manifest.json."""
    return [(folder, read_manifest(folder / "manifest.json")) for folder in prebuilt_dirs()
            if (folder / "manifest.json").is_file()]


def read_manifest(path: Path) -> dict:
    """The artifacts of one manifest.json ({} when it does not exist); a manifest of another shape is an error."""
    path = Path(path)
    if not path.exists():
        return {}
    fix = "rebuild it: `aie-apps build MODEL --target ...` (or delete it)"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ArtifactMissing(f"cannot read {path}: {e}", fix=fix)
    arts = doc.get("artifacts") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT or not isinstance(arts, dict) \
            or not all(isinstance(a, dict) and isinstance(a.get("files"), dict) for a in arts.values()):
        raise ArtifactMissing(f"{path} is not a format-{MANIFEST_FORMAT} manifest "
                              '({"format": 1, "artifacts": {CONTENT_KEY: {"target", "files": {ROLE: ...}}}})', fix=fix)
    return arts


def manifest_entry(program: Program, root: Path, files: Mapping[str, Path], **extra) -> dict:
    """The manifest entry of `program`'s artifact (program = device_program(...), as the build splits it):
    `files` maps every required role to its file under `root` (the prebuilt folder); each is recorded with its
    path relative to root and its sha256, exactly as find_artifact checks them. `extra`: kernel (npu1),
    sequences (npu2: DISPATCH -> kernel name), and anything informative (model, toolchain, ...)."""
    root = Path(root).resolve()
    want, have = required_roles(program), set(files)
    if set(want) != have:
        raise ProgramError(f"the artifact's files do not match its program: missing {sorted(set(want) - have)}, "
                           f"unexpected {sorted(have - set(want))}",
                           fix="build from npu.device_program(program), one file per required role")
    recorded = {}
    for role in want:
        path = Path(files[role]).resolve()
        if not path.is_file():
            raise ProgramError(f"artifact file {path} ({role}) was not written",
                               fix=BUILD_FIX.format(target=program.target))
        recorded[role] = {"path": path.relative_to(root).as_posix(), "sha256": _sha256(path)}
    return {**extra, "target": program.target, "files": recorded}


def record_artifact(root: Path, key: str, entry: dict) -> Path:
    """Add (or replace) the artifact `key` in root/manifest.json, written atomically; returns the manifest's path."""
    path = Path(root) / "manifest.json"
    arts = read_manifest(path)
    arts[key] = entry
    doc = {"format": MANIFEST_FORMAT, "artifacts": dict(sorted(arts.items()))}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


def artifact_keys(target: str) -> list[str]:
    return [k for _, arts in read_manifests() for k, a in arts.items() if a.get("target") == target]


def required_roles(program: Program) -> list[str]:
    if program.target == "npu2":
        return ["elf"]
    return ["xclbin"] + [f"insts/{s.op}" for e in program.entries.values() for s in e.steps if s.kind == "dispatch"]


def find_artifact(program: Program) -> Artifact:
    """The checked artifact of a device program (its content key on its target), or ArtifactMissing."""
    key, target = program.meta.get("content_key", ""), program.target
    fix = BUILD_FIX.format(target=target)
    manifests = read_manifests()
    if not manifests:
        raise ArtifactMissing(f"no prebuilt NPU artifacts: no manifest.json in {', '.join(map(str, prebuilt_dirs()))}",
                              fix=fix)
    for folder, arts in manifests:
        a = arts.get(key)
        if a is None or a.get("target") != target:
            continue
        files = {}
        for role in required_roles(program):
            entry = a.get("files", {}).get(role)
            if entry is None:
                raise ArtifactMissing(f"artifact {key} in {folder} has no {role!r} file", fix=fix)
            path = folder / entry["path"]
            if not path.is_file():
                raise ArtifactMissing(f"artifact file {path} is missing", fix=fix)
            if _sha256(path) != entry["sha256"]:
                raise ArtifactMissing(f"artifact file {path} does not match its sha256 in the manifest (corrupt or "
                                      "rebuilt without updating the manifest)", fix=fix)
            files[role] = path
        return Artifact(key, target, files, a.get("kernel", XCLBIN_KERNEL), dict(a.get("sequences", {})),
                        dict(a.get("scratchpad", {})), dict(a.get("patches", {})))
    entries = ", ".join(program.entries)
    raise ArtifactMissing(f"no {target} artifact for this program (content key {key}; entries {entries}) in "
                          f"{', '.join(str(f / 'manifest.json') for f, _ in manifests)}", fix=fix)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def artifacts_problem() -> str:
    """Why device="auto" must not pick the NPU even though a device node and pyxrt exist, or ""."""
    try:
        target = detect_target()
        if not artifact_keys(target):
            return (f"no prebuilt NPU artifacts for {target} in {' or '.join(map(str, prebuilt_dirs()))}; "
                    f"build them with `aie-apps build MODEL --target {target}`")
    except DeviceUnavailable as e:
        return e.message
    return ""


# ---- the watchdog: dispatches planned to fit it --------------------------------------------------------

def kernel_seconds(program: Program, k: Step) -> float:
    tiling = k.attrs["tiling"]
    kc = cost.KernelCost(k.op, k.attrs["flops"], cost.dram_bytes(program, k), tiling.get("cores", 1),
                         tiling.get("precision", "bf16"))
    overhead, compute, memory = cost.kernel_us(kc, TARGETS[program.target])
    return (overhead + max(compute, memory)) / 1e6


def dispatch_seconds(program: Program, step: Step) -> float:
    """Cost-model estimate of one dispatch on the device (an estimate, not a measurement)."""
    fixed = (cost.LAUNCH_US + 2 * cost.SYNC_US) / 1e6
    return fixed + sum(kernel_seconds(program, k) for k in step.body)


def device_program(program: Program, budget_s: float | None = None) -> Program:
    """The program as the device runs it: every dispatch whose estimate exceeds `budget_s` (default: half
    the driver's watchdog) split into consecutive dispatches that each fit, named "NAME.0", "NAME.1", ...
    The build makes one runtime sequence per dispatch step of this program; the content key is unchanged."""
    budget = WATCHDOG_S * WATCHDOG_MARGIN if budget_s is None else budget_s
    fixed = (cost.LAUNCH_US + 2 * cost.SYNC_US) / 1e6
    entries = {}
    for name, e in program.entries.items():
        steps = []
        for s in e.steps:
            if s.kind != "dispatch" or dispatch_seconds(program, s) <= budget:
                steps.append(s)
                continue
            chunks, chunk, used = [], [], fixed
            for k in s.body:
                t = kernel_seconds(program, k)
                if fixed + t > budget:
                    raise ProgramError(f"kernel {k.op} ({k.attrs.get('name')}) of {s.op} is estimated at {t:.2f} s, "
                                       f"over the {budget:.2f} s planned per dispatch (watchdog ~{WATCHDOG_S} s)",
                                       fix="use a smaller shape bucket, or raise amdxdna's tdr_timeout_ms")
                if chunk and used + t > budget:
                    chunks.append(chunk)
                    chunk, used = [], fixed
                chunk.append(k)
                used += t
            chunks.append(chunk)
            for i, body in enumerate(chunks):
                params = [p for p in s.attrs.get("params", []) if any(p in k.inputs for k in body)]
                steps.append(Step("dispatch", f"{s.op}.{i}", (), (),
                                  {**s.attrs, "params": params, "kernels": len(body), "split_of": s.op}, tuple(body)))
        entries[name] = dataclasses.replace(e, steps=tuple(steps))
    return dataclasses.replace(program, entries=entries)


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

class NpuState(State):
    """A stream's state arena in its own device BO; the host copy goes to the device before the next run
    after it was created or reset, and stays on the device otherwise."""

    def __init__(self, exe: "NpuExecutable"):
        size = exe.program.meta["arenas"]["state"]
        self.bo, self.host = exe._alloc(size, "state")
        self.owner = weakref.ref(exe)
        self.dirty = True
        self.host[:] = 0
        super().__init__({n: _view(self.host, b) for n, b in exe.program.buffers_of(Usage.STATE).items()})

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


def _view(arena: np.ndarray, buf) -> np.ndarray:
    return arena[buf.offset:buf.offset + buf.nbytes].view(buf.dtype).reshape(buf.shape)


class NpuExecutable:
    def __init__(self, backend: "NpuBackend", program: Program, weights: Mapping[str, np.ndarray]):
        if program.target != backend.target:
            raise ProgramError(f"this program was compiled for {program.target}; the NPU here is {backend.target}",
                               fix=f"compile for {backend.target} (Session(device='npu') does)")
        validate(program)
        self.program = program
        self.device = device_program(program, backend.budget_s)
        self.counters = Counters()
        self.pyxrt, self.target = backend.pyxrt, backend.target
        artifact = find_artifact(self.device)
        self._scratchpad = {d: words for d, words in artifact.scratchpad.items() if words}
        self._patches = {d: artifact.patches.get(d, {}) for d in self._scratchpad} if self.target == "npu1" else {}
        for d, words in self._scratchpad.items() if self.target == "npu1" else ():
            missing = sorted(set(words) - set(self._patches[d]))
            if missing:
                raise ArtifactMissing(f"the npu1 artifact {artifact.key} sets DMA addresses per run in {d} but "
                                      f"records no instruction patch for {', '.join(missing)} (built before npu1 "
                                      "instruction patching?)", fix=BUILD_FIX.format(target="npu1"))
        image = layout.weights_image(program, weights)  # checks the weights before the device is touched
        self._bos: dict[str, object] = {}
        self._host: dict[str, np.ndarray] = {}
        self._pinned = 0
        self._context = None
        self._state: NpuState | None = None  # the state of the run in progress
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
        return [s for e in self.device.entries.values() for s in e.steps if s.kind == "dispatch"]

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

    def run(self, entry: str | None, inputs: Mapping[str, np.ndarray], state: State | None = None) -> dict:
        e = self.device.entry(entry)
        data = check_inputs(self.program, entry, inputs)
        for s in e.steps:  # a word out of range would move a DMA outside its tensor: refused before anything runs
            scratchpad_words(self._scratchpad.get(s.op, {}), data)
        if state is None and any(b.arena == "state" for b in self._touched(e)):
            raise UsageError(f"entry {e.name!r} reads or writes state", fix="pass state=session.new_state()")
        if state is not None and (not isinstance(state, NpuState) or state.owner() is not self):
            raise UsageError("this state was not made by this npu session", fix="use session.new_state()")
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
                            self._host_step(step)
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

    # -- memory --
    def _touched(self, e):
        names = [n for s in e.steps for k in (s.body or (s,)) for n in (*k.inputs, *k.outputs) if n]
        return [self.program.buffers[n] for n in names] + [self.program.buffers[b] for b in e.outputs.values()]

    def _arena(self, arena: str):
        """(bo, host view) of an arena, the state arena being the current run's State."""
        if arena == "state":
            if self._state is None:
                raise UsageError("this step needs a state", fix="pass state=session.new_state()")
            return self._state.bo, self._state.host
        return self._bos[arena], self._host[arena]

    def _raw(self, name: str) -> np.ndarray:
        buf = self.program.buffers[name]
        return _view(self._arena(buf.arena)[1], buf)

    def _store(self, name: str, value) -> None:
        raw = self._raw(name)
        raw[...] = np.asarray(value, np.float32) if raw.dtype == BF16 else np.asarray(value).astype(raw.dtype)

    def _sync(self, arena: str, direction, ranges) -> None:
        """Sync byte ranges of one arena, merging neighbours (the memory plan pads buffers to 64 B)."""
        bo = self._arena(arena)[0]
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
        a = np.array(layout.apply_views(self._raw(name), views))
        return a.astype(np.float32) if a.dtype == BF16 else a

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
                states = [runs[0].wait(int(2 * WATCHDOG_S * 1000))]  # the driver's watchdog fires first
            elif len(group) == 1:
                runs = [self._run(group[0], bos)]
                runs[0].start()
                states = [runs[0].wait(int(2 * WATCHDOG_S * 1000))]
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
                estimate = dispatch_seconds(self.program, step)
                why = ("the driver's watchdog stopped it" if state == x.ert_cmd_state.ERT_CMD_STATE_TIMEOUT
                       else "the device reported a failure")
                raise DispatchTimeout(f"dispatch {step.op} ended in {getattr(state, 'name', state)}: {why} "
                                      f"(estimated {estimate * 1e3:.1f} ms; the watchdog allows ~{WATCHDOG_S:.0f} s)",
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

    def _host_step(self, step: Step) -> None:
        """A host op between dispatches: only its operands come back, only its result goes out."""
        args = [self._fetch(n, v) if n is not None else None for n, v in zip(step.inputs, step.attrs["views"])]
        op = OPS[step.op]
        result = op.ref(*([args] if op.variadic else args), **step.attrs["attrs"])
        out = self.program.buffers[step.outputs[0]]
        self._store(out.name, result)
        self._sync(out.arena, self.pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, [(out.offset, out.nbytes)])
        self.counters.host_ops += 1


class NpuBackend:
    name = "npu"

    def __init__(self, target: str | None = None, *, budget_s: float | None = None):
        self.target = target or detect_target()
        if self.target not in TARGETS:
            raise UsageError(f"unknown NPU target {self.target!r}", fix=f"use one of {sorted(TARGETS)}")
        self.budget_s = budget_s
        try:
            self.pyxrt = importlib.import_module("pyxrt")
        except ImportError as e:
            raise DeviceUnavailable(f"pyxrt is not importable ({e})",
                                    fix="install XRT with the amdxdna plugin and `source /opt/xilinx/xrt/setup.sh`") \
                from None

    def load(self, program: Program, weights: Mapping[str, np.ndarray]) -> NpuExecutable:
        return NpuExecutable(self, program, weights)


# ---- the doctor's last check ---------------------------------------------------------------------------

SMOKE_WEIGHTS = {"w": (64, 64), "b": (64,)}


def smoke_graph():
    """The smallest real program: one GEMM with a bias and GELU epilogue, one dispatch. The build ships its
    artifact for every target so that `aie-apps doctor` can prove a dispatch end to end."""
    from .. import ops
    from ..graph import trace

    def smoke(w, x):
        return {"y": ops.gelu(ops.linear(x, w["w"], w["b"]))}
    return trace(smoke, name="smoke", weights=SMOKE_WEIGHTS, inputs={"x": ((8, 64), "float32")})


def smoke_dispatch(target: str) -> str:
    """Run the smoke program once on the NPU and compare it with numpy; a typed error says what failed."""
    import time

    from .. import compiler, ops
    rng = np.random.default_rng(0)
    weights = {n: rng.normal(0, 0.2, s).astype(np.float32) for n, s in SMOKE_WEIGHTS.items()}
    x = rng.normal(size=(8, 64)).astype(np.float32)
    program = compiler.compile([smoke_graph()], target)
    exe = NpuBackend(target).load(program, weights)
    try:
        start = time.perf_counter()
        y = exe.run(None, {"x": x})["y"]
        ms = (time.perf_counter() - start) * 1e3
        dispatches = exe.counters.dispatches
    finally:
        exe.close()
    ref = ops.gelu(ops.linear(x, weights["w"], weights["b"]))
    rel = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
    if not rel <= 1e-2:
        raise DeviceUnavailable(f"the smoke dispatch ran but its result is wrong (rel-L2 {rel:.2g} vs numpy)",
                                fix="a firmware/driver mismatch or a stale artifact: check `xrt-smi validate`, "
                                    "then rebuild with `aie-apps build smoke --target " + target + "`")
    return f"{dispatches} dispatch on {target}, rel-L2 {rel:.1e} vs numpy, {ms:.2f} ms (includes the host syncs)"
