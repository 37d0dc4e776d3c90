"""The cpu backend: runs each host step with its numpy reference from ops.py."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..ops import OPS
from ..program import Program, Usage
from .backend import Counters, State, check_inputs, check_weights


GEMV_ROWS = 8  # a linear over at most this many rows is bound by reading its weight (decoder steps)


def gemv_layout(program: Program, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Weights that some `linear` step multiplies with at most GEMV_ROWS rows, stored in Fortran order: the
    same [out, in] array for ops.linear, but w.T is [in, out] contiguous, which OpenBLAS's GEMV streams about
    2x faster (Whisper's 51864 x 384 vocab projection: 14 -> 7 ms, 1 thread). Chosen once here, at load."""
    gemv = {s.inputs[1] for e in program.entries.values() for s in e.steps
            if s.op == "linear" and s.inputs[1] in weights
            and int(np.prod(program.buffers[s.inputs[0]].shape[:-1])) <= GEMV_ROWS}
    return {name: np.asfortranarray(w) if name in gemv else w for name, w in weights.items()}


class CpuExecutable:
    def __init__(self, program: Program, weights: Mapping[str, np.ndarray]):
        bad = [s.op for e in program.entries.values() for s in e.steps if s.kind != "host"]
        if bad:
            raise ValueError(f"the cpu backend runs host steps only; this program has {bad[:3]} (target "
                             f"{program.target})")
        self.program = program
        self.weights = gemv_layout(program, check_weights(program, weights))
        self.counters = Counters()

    def new_state(self) -> State:
        return State({n: np.zeros(b.shape, b.dtype) for n, b in self.program.buffers_of(Usage.STATE).items()})

    def run(self, entry: str | None, inputs: Mapping[str, np.ndarray], state: State | None = None) -> dict:
        program_entry = self.program.entry(entry)
        env: dict[str, np.ndarray] = {**self.weights, **check_inputs(self.program, entry, inputs)}
        if state is not None:
            env.update(state.buffers)
        for step in program_entry.steps:
            args = [env[i] if i is not None else None for i in step.inputs]
            op = OPS[step.op]
            if op.variadic:
                args = [args]
            try:
                env[step.outputs[0]] = op.ref(*args, **step.attrs)
            except KeyError as e:
                raise ValueError(f"step {step.op} reads {e}, which nothing wrote: "
                                 f"a state buffer needs a State (session.new_state())") from None
            self.counters.host_ops += 1
        self.counters.runs += 1
        return {name: np.array(env[buf]) if self.program.buffers[buf].usage is Usage.STATE else env[buf]
                for name, buf in program_entry.outputs.items()}

    def close(self):
        self.weights = {}


class CpuBackend:
    name = "cpu"
    target = "cpu"

    def load(self, program: Program, weights: Mapping[str, np.ndarray]) -> CpuExecutable:
        return CpuExecutable(program, weights)
