"""The watchdog pass: every dispatch planned to finish well inside the driver's watchdog.

amdxdna stops a dispatch that runs longer than its tdr_timeout_ms (~4-6 s). A dispatch whose cost-model
estimate exceeds the budget (half the watchdog: the model is an estimate) is split into consecutive
dispatches that each fit, named "NAME.0", "NAME.1", ...; each keeps the runtime parameters its kernels read.
The pass runs last in compile_npu, after the content key (a split is decided from the same steps the key
hashes), and records what it planned in meta["watchdog"]: the driver's limit, the budget, and each dispatch's
estimate (for the runtime's error message when a device still stops one). The build makes one runtime
sequence per dispatch step of the program it is given; the runtime runs the steps as they are.
"""
from __future__ import annotations

import dataclasses

from ..errors import ProgramError
from ..program import Program, Step
from . import cost
from .hardware import TARGETS

WATCHDOG_S = 4.0        # amdxdna's tdr_timeout_ms allows ~4-6 s per dispatch
WATCHDOG_MARGIN = 0.5   # plan each dispatch to half of it


def kernel_seconds(program: Program, k: Step) -> float:
    tiling = k.attrs["tiling"]
    kc = cost.KernelCost(k.op, k.attrs["flops"], cost.dram_bytes(program, k), tiling.get("cores", 1),
                         tiling.get("precision", "bf16"))
    overhead, compute, memory = cost.kernel_us(kc, TARGETS[program.target])
    return (overhead + max(compute, memory)) / 1e6


def dispatch_seconds(program: Program, step: Step) -> float:
    """Cost-model estimate of one dispatch on the device (an estimate, not a measurement)."""
    return _fixed_seconds() + sum(kernel_seconds(program, k) for k in step.body)


def _fixed_seconds() -> float:
    return (cost.LAUNCH_US + 2 * cost.SYNC_US) / 1e6


def split_dispatches(program: Program, budget_s: float | None = None) -> Program:
    """The program with every dispatch whose estimate exceeds `budget_s` (default: half the driver's watchdog)
    split into consecutive dispatches that each fit; the content key is unchanged."""
    budget = WATCHDOG_S * WATCHDOG_MARGIN if budget_s is None else budget_s
    entries, estimates = {}, {}
    for name, e in program.entries.items():
        steps = []
        for s in e.steps:
            if s.kind == "dispatch" and dispatch_seconds(program, s) > budget:
                steps += _split(program, s, budget)
            else:
                steps.append(s)
        for s in steps:
            if s.kind == "dispatch":
                estimates[s.op] = dispatch_seconds(program, s)
        entries[name] = dataclasses.replace(e, steps=tuple(steps))
    meta = {**program.meta, "watchdog": {"driver_s": WATCHDOG_S, "budget_s": budget, "estimates_s": estimates}}
    return dataclasses.replace(program, entries=entries, meta=meta)


def _split(program: Program, s: Step, budget: float) -> list[Step]:
    fixed = _fixed_seconds()
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
    out = []
    for i, body in enumerate(chunks):
        params = [p for p in s.attrs.get("params", []) if any(p in k.inputs for k in body)]
        out.append(Step("dispatch", f"{s.op}.{i}", (), (),
                        {**s.attrs, "params": params, "kernels": len(body), "split_of": s.op}, tuple(body)))
    return out
