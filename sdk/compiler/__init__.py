"""The compiler: Graphs -> a Program for one target.

For the `cpu` target every node becomes one host step (the numpy reference). Device targets
(npu1, npu2) go through the NPU passes (fuse -> partition -> layout -> memory plan -> schedule -> emit),
registered in TARGET_COMPILERS by the modules that implement them.
"""
from __future__ import annotations

from typing import Callable, Sequence

from ..errors import UsageError
from ..graph import Graph
from ..ops import OPS
from ..program import Buffer, Entry, Program, Step, Usage

_USAGE = {"weight": Usage.WEIGHTS, "const": Usage.WEIGHTS, "state": Usage.STATE,
          "input": Usage.IO, "param": Usage.IO, "node": Usage.SCRATCH}


def buffer_name(graph: Graph, value: str) -> str:
    """Entry-local values (activations, inputs, runtime parameters) get the entry's name as a prefix so
    that entries never collide; weights, constants and state are shared by name across entries."""
    v = graph.values[value]
    return f"{graph.name}/{value}" if v.kind in ("node", "input", "param") else value


def lower_to_host(graphs: Sequence[Graph], target: str = "cpu") -> Program:
    """One host step per node; in-place ops write their state buffer directly."""
    buffers: dict[str, Buffer] = {}
    entries: dict[str, Entry] = {}
    constants = {}
    for g in graphs:
        if g.name in entries:
            raise UsageError(f"two graphs are named {g.name!r}; entry names must be unique")
        alias: dict[str, str] = {}  # node output -> buffer it lives in (in-place ops)
        steps = []
        for n in g.nodes:
            ins = tuple(alias.get(i, buffer_name(g, i)) if i is not None else None for i in n.inputs)
            op = OPS[n.op]
            out = ins[op.inplace] if op.inplace is not None else buffer_name(g, n.output)
            alias[n.output] = out
            steps.append(Step("host", n.op, ins, (out,), dict(n.attrs)))
        for name, v in g.values.items():
            if name in alias and alias[name] != buffer_name(g, name):
                continue  # lives in its state buffer
            bname = buffer_name(g, name)
            new = Buffer(bname, v.shape, v.dtype, _USAGE[v.kind])
            old = buffers.get(bname)
            if old is not None and (old.shape, old.dtype, old.usage) != (new.shape, new.dtype, new.usage):
                raise UsageError(f"buffer {bname!r} is declared as {old.shape} {old.dtype} and as {new.shape} "
                                 f"{new.dtype} by two graphs")
            buffers[bname] = new
        constants.update(g.constants)
        inputs = {n: buffer_name(g, n) for n, v in g.values.items() if v.kind in ("input", "param")}
        outputs = {o: alias.get(v, buffer_name(g, v)) for o, v in g.outputs.items()}
        entries[g.name] = Entry(g.name, inputs, outputs, tuple(steps))
    return Program(target, buffers, entries, constants, {"graphs": [g.name for g in graphs]})


# target name -> compile function; the NPU pipeline registers npu1/npu2 here.
TARGET_COMPILERS: dict[str, Callable[[Sequence[Graph], str], Program]] = {"cpu": lower_to_host}


def compile(graphs: Sequence[Graph], target: str = "cpu") -> Program:  # noqa: A001 - the verb is the point
    if target not in TARGET_COMPILERS:
        try:  # device targets live in their own module, loaded on first use
            from . import npu  # noqa: F401
        except ModuleNotFoundError:
            pass
    if target not in TARGET_COMPILERS:
        raise UsageError(f"no compiler for target {target!r}", fix=f"use one of {sorted(TARGET_COMPILERS)}")
    return TARGET_COMPILERS[target](graphs, target)
