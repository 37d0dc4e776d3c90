"""The arena executable: what the emu and npu backends share to run a compiled NPU program.

A program's buffers live in four arenas of bytes, passed to every dispatch in this order: weights (packed
once at load, packing.py), state (one per State object), io (inputs, runtime parameters, outputs) and scratch.
Each buffer is a typed view at its offset in its arena; kernels read operands through view chains
(program.apply_views); a packed GEMM weight is untiled back to [Kp, Np] the way its kernel reads it; a host
step runs its op's numpy reference on operands brought back from the device. Where the arenas' bytes live
(host memory, device BOs) and what crossing to the device costs is each backend's.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Mapping

import ml_dtypes
import numpy as np

from ..errors import ProgramError, UsageError
from ..ops import OPS
from ..program import Buffer, Entry, Program, Step, Usage, apply_views
from . import checks, packing
from .backend import Counters, State, check_inputs

BF16 = np.dtype(ml_dtypes.bfloat16)
ARENAS = ("weights", "state", "io", "scratch")
NPU_TARGETS = tuple(sorted(set(checks.NPU_PCI_IDS.values())))


def view(arena: np.ndarray, buf: Buffer) -> np.ndarray:
    """A buffer's typed view into its arena's bytes."""
    return arena[buf.offset:buf.offset + buf.nbytes].view(buf.dtype).reshape(buf.shape)


def validate(program: Program) -> str:
    """What running the program needs, checked before anything runs: an NPU target, every buffer inside its
    arena, host ops this SDK has, packed GEMM weights shaped as their tilings read them. Returns the target.
    (The kernels' hardware limits are the compiler's check, sdk.compiler.npu.check_limits.)"""
    if program.target not in NPU_TARGETS:
        raise ProgramError(f"this backend runs {'/'.join(NPU_TARGETS)} programs; this one is for {program.target!r}",
                           fix="compile for npu1 or npu2 (Session(device='emu'|'npu') does)")
    arenas = {b.arena for b in program.buffers.values()}
    if not arenas <= set(ARENAS):
        raise ProgramError(f"buffers use arenas {sorted(arenas)}; a program has at most {list(ARENAS)}")
    sizes = program.meta["arenas"]
    for b in program.buffers.values():
        if b.offset < 0 or b.offset + b.nbytes > sizes[b.arena]:
            raise ProgramError(f"buffer {b.name} [{b.offset}, {b.offset + b.nbytes}) lies outside its "
                               f"{b.arena} arena of {sizes[b.arena]} bytes")
    for e in program.entries.values():
        for s in e.steps:
            if s.kind == "host":
                if s.op not in OPS:
                    raise ProgramError(f"host step {s.op} is not an op of this SDK")
                continue
            for k in s.body:
                if k.op == "gemm":
                    t = k.attrs["tiling"]
                    want = (t["Kp"] // t["k"], t["Np"] // t["n"], t["k"], t["n"])
                    want = (t["weight_planes"], *want) if t.get("weight_planes", 1) > 1 else want
                    if program.buffers[k.inputs[1]].shape != want:
                        raise ProgramError(f"kernel gemm ({k.attrs['name']}): packed weight {k.inputs[1]} has "
                                           f"shape {program.buffers[k.inputs[1]].shape}, its tiling reads {want}")
    return program.target


class ArenaState(State):
    """A stream's state arena (`arena`, its host bytes); `buffers` are views into it (what reset() zeroes)."""

    def __init__(self, program: Program, arena: np.ndarray):
        self.arena = arena
        super().__init__({n: view(arena, b) for n, b in program.buffers_of(Usage.STATE).items()})


class ArenaExecutable(ABC):
    """A program over four arenas. Subclasses fill the weights arena with packing.weights_image, give
    `_arena(name)` (the host bytes of the weights, io and scratch arenas) and run the steps; the state arena is
    the running State's."""
    state_type: type[ArenaState] = ArenaState

    def __init__(self, program: Program):
        self.target = validate(program)
        self.program = program
        self.counters = Counters()
        self._state: ArenaState | None = None  # the state of the run in progress
        self._unpacked: dict[str, np.ndarray] = {}

    @abstractmethod
    def _arena(self, arena: str) -> np.ndarray:
        """The host bytes of the weights, io or scratch arena."""

    def _begin(self, entry: str | None, inputs: Mapping[str, np.ndarray], state: State | None) -> tuple[Entry, dict]:
        """The entry and its inputs by buffer name, checked; a state the entry needs and has not got, or one
        another executable made, is a UsageError."""
        e = self.program.entry(entry)
        data = check_inputs(self.program, entry, inputs)
        if state is None and any(b.arena == "state" for b in self._touched(e)):
            raise UsageError(f"entry {e.name!r} reads or writes state", fix="pass state=session.new_state()")
        if state is not None and not self._owns(state):
            raise UsageError("this state was not made by this session", fix="use session.new_state()")
        return e, data

    def _owns(self, state: State) -> bool:
        return isinstance(state, self.state_type)

    def _touched(self, e: Entry) -> list[Buffer]:
        names = [n for s in e.steps for k in (s.body or (s,)) for n in (*k.inputs, *k.outputs) if n]
        return [self.program.buffers[n] for n in names] + [self.program.buffers[b] for b in e.outputs.values()]

    # -- buffers, as the host sees their bytes --
    def _raw(self, name: str) -> np.ndarray:
        buf = self.program.buffers[name]
        if buf.arena == "state":
            if self._state is None:
                raise UsageError("this step needs a state", fix="pass state=session.new_state()")
            return view(self._state.arena, buf)
        return view(self._arena(buf.arena), buf)

    def _load(self, name: str, views=()) -> np.ndarray:
        """A buffer through a view chain, bf16 widened to float32 (a view when no widening is needed)."""
        a = apply_views(self._raw(name), views)
        return a.astype(np.float32) if a.dtype == BF16 else a

    def _store(self, name: str, value) -> None:
        raw = self._raw(name)
        raw[...] = np.asarray(value, np.float32) if raw.dtype == BF16 else np.asarray(value).astype(raw.dtype)

    def weight_matrix(self, name: str) -> np.ndarray:
        """A packed GEMM weight as the kernel reads it: tiles from the arena back to [Kp, Np] (decoded once)."""
        if name not in self._unpacked:
            self._unpacked[name] = packing.untile(self._load(name))
        return self._unpacked[name]

    @staticmethod
    def host_result(step: Step, args: list) -> np.ndarray:
        """A host step's result: its op's numpy reference on the operands (each already read through its views)."""
        op = OPS[step.op]
        return op.ref(*([args] if op.variadic else args), **step.attrs["attrs"])
