"""Session: compiled graphs loaded on one backend, with the weights resident for its whole life.

    with Session([graph], weights, device="auto") as s:
        out = s.run(ids=ids, mask=mask)["output"]

Per-stream state (KV caches) lives in State objects from `new_state()`, never in the session, so one
session serves many streams. Every session knows the device asked for and the one it got.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from . import compiler
from .graph import Graph
from .errors import DeviceUnavailable, UsageError
from .runtime import DeviceChoice, choose_device, fall_back, open_backend
from .runtime.backend import Counters, State


class Session:
    def __init__(self, graphs: Sequence[Graph], weights: Mapping[str, np.ndarray], *, device: str | None = None,
                 target: str | None = None, precision: str | Mapping[str, str] = "fp32",
                 cpu_graphs: Sequence[Graph] = ()):
        """precision: the cpu backend's "fp32" (default) or "int8" (int8 weights, ONNX Runtime's quantized
        matmuls), for every entry or per entry name; the NPU backends run their own compiled precisions.
        cpu_graphs: entries only the cpu backend gets (ones the NPU compiler cannot tile); the program the other
        backends compile stays what `aie-apps build` lists. Callers look for them in `program.entries`."""
        self.precision, self._cpu_graphs = precision, list(cpu_graphs)
        self.choice: DeviceChoice = choose_device(device)
        try:
            self._open(graphs, weights, target)
        except DeviceUnavailable as e:  # auto chose the NPU but it failed to open (no artifact for this model, ...)
            if (self.choice.requested, self.choice.effective) != ("auto", "npu"):
                raise
            self.choice = fall_back(e.message)
            self._open(graphs, weights, None)

    def _open(self, graphs, weights, target):
        if self.choice.effective != "cpu" and self.precision != "fp32":
            raise UsageError(f"precision {self.precision!r} is a cpu backend option; the {self.choice.effective} "
                             f"backend runs the precisions its program was compiled for",
                             fix="use --device cpu with --precision int8, or drop --precision")
        options = {"precision": self.precision} if self.choice.effective == "cpu" else {}
        self.backend = open_backend(self.choice.effective, **options)
        cpu_only = self._cpu_graphs if self.choice.effective == "cpu" else []
        self.program = compiler.compile([*graphs, *cpu_only], target or self.backend.target)
        self._exe = self.backend.load(self.program, weights)

    @property
    def device_requested(self) -> str:
        return self.choice.requested

    @property
    def device_effective(self) -> str:
        return self.choice.effective

    @property
    def counters(self) -> Counters:
        return self._exe.counters

    def new_state(self) -> State:
        return self._exe.new_state()

    def run(self, entry: str | None = None, state: State | None = None, *, stop: Callable[[], bool] | None = None,
            **inputs) -> dict[str, np.ndarray]:
        """`stop`: polled during the run where the backend can give it up (cpu), which then raises RunStopped."""
        return self._exe.run(entry, inputs, state, stop)

    def report(self) -> dict:
        """What every result carries: devices, and for npu/emu the NPU share of the work."""
        out = {"device_requested": self.device_requested, "device_effective": self.device_effective}
        if self.choice.reason:
            out["fallback_reason"] = self.choice.reason
        if "npu_fraction" in self.program.meta:
            out["npu_fraction"] = self.program.meta["npu_fraction"]
        return out

    def close(self):
        self._exe.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
