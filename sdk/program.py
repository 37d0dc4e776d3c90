"""Program: the contract between the compiler and the runtime, frozen and serialisable.

A Program is a set of named buffers (each with a usage: WEIGHTS, SCRATCH, STATE or IO) and named
entries (e.g. "forward", or "encode" and "decode_step"); an entry is an ordered list of steps over
those buffers. A `host` step runs one op from ops.py on the host; a `dispatch` step is one NPU dispatch
whose body lists the kernels it runs. Constants the compiler created travel with the program.
A kernel reads each operand through a view chain (its access pattern): reshape / transpose / slice steps,
applied by `apply_views` wherever a program is compiled or run.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from .atomic import write_atomic
from .errors import ProgramError

FORMAT_VERSION = 1


class Usage(str, Enum):
    WEIGHTS = "weights"  # uploaded once per session, read-only
    SCRATCH = "scratch"  # activations, reused between steps
    STATE = "state"      # per-stream state (KV cache), owned by a State object
    IO = "io"            # crosses to the host each run (inputs, runtime parameters, outputs)


@dataclass(frozen=True)
class Buffer:
    name: str
    shape: tuple[int, ...]
    dtype: str
    usage: Usage
    arena: str = ""     # filled by the memory planner for device targets
    offset: int = 0     # byte offset inside the arena

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def apply_views(array: np.ndarray, views) -> np.ndarray:
    """`array` seen through a view chain: ("reshape", shape), ("transpose", axes) or ("slice", axis, start,
    stop, step), in order."""
    for v in views:
        if v[0] == "reshape":
            array = array.reshape(v[1])
        elif v[0] == "transpose":
            array = np.transpose(array, v[1])
        else:
            _, axis, start, stop, step = v
            index = [slice(None)] * array.ndim
            index[axis] = slice(start, stop, step)
            array = array[tuple(index)]
    return array


@dataclass(frozen=True)
class Step:
    kind: str                      # "host" or "dispatch"
    op: str                        # an op name (host) or an artifact/kernel name (dispatch)
    inputs: tuple[str | None, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    body: tuple["Step", ...] = ()  # the kernel invocations inside a dispatch


@dataclass(frozen=True)
class Entry:
    name: str
    inputs: dict[str, str]         # input name -> IO buffer the caller fills (tensors and runtime parameters)
    outputs: dict[str, str]        # output name -> buffer
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class Program:
    target: str
    buffers: dict[str, Buffer]
    entries: dict[str, Entry]
    constants: dict[str, np.ndarray] = field(default_factory=dict, compare=False)
    meta: dict[str, Any] = field(default_factory=dict)

    def buffers_of(self, usage: Usage) -> dict[str, Buffer]:
        return {n: b for n, b in self.buffers.items() if b.usage is usage}

    def entry(self, name: str | None) -> Entry:
        if name is None:
            if len(self.entries) != 1:
                raise ProgramError(f"this program has entries {sorted(self.entries)}; name the one to run")
            return next(iter(self.entries.values()))
        if name not in self.entries:
            raise ProgramError(f"no entry {name!r} in this program; it has {sorted(self.entries)}")
        return self.entries[name]

    # -- disk round trip: program.json + constants.safetensors --
    def save(self, folder: str | Path) -> Path:
        from safetensors.numpy import save
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        doc = {
            "format": FORMAT_VERSION, "target": self.target, "meta": self.meta,
            "buffers": [{**asdict(b), "usage": b.usage.value} for b in self.buffers.values()],
            "entries": [{"name": e.name, "inputs": e.inputs, "outputs": e.outputs,
                         "steps": [_step_doc(s) for s in e.steps]} for e in self.entries.values()],
        }
        write_atomic(folder / "constants.safetensors",
                     save({k: np.ascontiguousarray(v) for k, v in self.constants.items()}))
        write_atomic(folder / "program.json", json.dumps(doc, indent=1))  # last: a program.json means complete
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> "Program":
        from safetensors.numpy import load_file
        folder = Path(folder)
        try:
            doc = json.loads((folder / "program.json").read_text())
            constants = load_file(str(folder / "constants.safetensors"))
        except (OSError, ValueError) as e:
            raise ProgramError(f"cannot read the program in {folder}: {e}",
                               fix="recompile it (delete the folder; it is rebuilt on next use)") from None
        if doc.get("format") != FORMAT_VERSION:
            raise ProgramError(f"program in {folder} has format {doc.get('format')}, expected {FORMAT_VERSION}",
                               fix="delete the folder; it is rebuilt on next use")
        buffers = {b["name"]: Buffer(b["name"], tuple(b["shape"]), b["dtype"], Usage(b["usage"]),
                                     b["arena"], b["offset"]) for b in doc["buffers"]}
        entries = {e["name"]: Entry(e["name"], dict(e["inputs"]), dict(e["outputs"]),
                                    tuple(_step_from(s) for s in e["steps"])) for e in doc["entries"]}
        return cls(doc["target"], buffers, entries, constants, doc["meta"])


def _step_doc(s: Step) -> dict:
    return {"kind": s.kind, "op": s.op, "inputs": s.inputs, "outputs": s.outputs,
            "attrs": s.attrs, "body": [_step_doc(b) for b in s.body]}


def _tuples(v):
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def _step_from(d: dict) -> Step:
    return Step(d["kind"], d["op"], tuple(d["inputs"]), tuple(d["outputs"]),
                {k: _tuples(v) for k, v in d["attrs"].items()}, tuple(_step_from(b) for b in d["body"]))
