"""The backend protocol: what cpu, emu and npu each provide, and the counters every one reports."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable, Mapping, Protocol

import numpy as np

from ..errors import InputError, WeightError
from ..program import Program, Usage


@dataclass
class Counters:
    """Per-executable totals; `reset()` between measurements. Host-only backends count host_ops only."""
    runs: int = 0
    dispatches: int = 0
    host_ops: int = 0
    syncs: int = 0
    bytes_to_device: int = 0
    bytes_from_device: int = 0
    weight_bytes_to_device: int = 0  # must stay 0 after load

    def reset(self):
        for f in fields(self):
            setattr(self, f.name, 0)

    def snapshot(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class State:
    """Per-stream state (e.g. KV cache): the STATE buffers of one program, owned by the caller."""

    def __init__(self, buffers: dict[str, np.ndarray]):
        self.buffers = buffers

    def reset(self):
        for b in self.buffers.values():
            b[...] = 0


class Executable(Protocol):
    program: Program
    counters: Counters

    def new_state(self) -> State: ...
    def run(self, entry: str | None, inputs: Mapping[str, np.ndarray], state: State | None = None,
            stop: Callable[[], bool] | None = None) -> dict:
        """`stop`: where the backend can give a run up midway (cpu), it polls it while the run goes on and raises
        RunStopped once it says True; an NPU dispatch (npu, and emu, its model) runs to its end."""
    def close(self) -> None: ...


class Backend(Protocol):
    name: str
    target: str  # the compile target this backend runs

    def load(self, program: Program, weights: Mapping[str, np.ndarray]) -> Executable: ...


def check_weights(program: Program, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The program's WEIGHTS buffers from `weights` (constants included), shapes checked, float32."""
    out, missing, misshaped = {}, [], []
    for name, buf in program.buffers_of(Usage.WEIGHTS).items():
        array = program.constants.get(name) if name in program.constants else weights.get(name)
        if array is None:
            missing.append(name)
        elif tuple(array.shape) != buf.shape:
            misshaped.append(f"{name} {tuple(array.shape)} != {buf.shape}")
        else:
            out[name] = np.ascontiguousarray(array, dtype=buf.dtype)
    if missing or misshaped:
        raise WeightError("the weights do not fit the program", missing=missing, misshaped=misshaped,
                          fix="load the checkpoint through the model's load function, which maps and checks names")
    return out


def check_inputs(program: Program, entry_name: str | None, inputs: Mapping[str, np.ndarray]) -> dict:
    """The entry's IO inputs keyed by buffer name, converted to their dtypes; a wrong name or shape is an
    InputError."""
    entry = program.entry(entry_name)
    unknown = set(inputs) - set(entry.inputs)
    missing = [n for n in entry.inputs if n not in inputs]
    if unknown or missing:
        raise InputError(f"entry {entry.name!r} takes inputs {list(entry.inputs)}; "
                         f"missing {missing}, unknown {sorted(unknown)}")
    out = {}
    for n, buffer in entry.inputs.items():
        buf = program.buffers[buffer]
        a = np.asarray(inputs[n])
        if a.shape != buf.shape:
            raise InputError(f"input {n!r} has shape {a.shape}; this program was compiled for {buf.shape}",
                             fix="pad or bucket the input to the compiled shape")
        out[buffer] = np.asarray(a, dtype=buf.dtype, order="C")  # keeps 0-d parameters 0-d
    return out
