"""The whole-model design: one compiled sdk Program (sdk.compiler, target npu1 or npu2) as ONE device module
whose runtime sequences run every kernel of a dispatch step in order, so a whole forward pass, or a whole
decoder step, is one dispatch.

How it is put together (the temporal-fusion recipe of IRON's fusion.py / mlir-aie's aiex.configure+run):
- every kernel step of the program is built by its own design (kernels/<name>/design.py) into an
  `aie.device` with one runtime sequence over 1-D tensors of operand buffers, in the design's own order, which
  it records as params["sequence"] (the position of each among the step's operands: present inputs, then
  outputs); steps that build the same design (same kind, parameters, operand shapes and dtypes: every layer of
  a model) share one device;
- a main device holds one runtime sequence per dispatch step of the program (named after the step, "forward#0"
  -> `@forward_0`, split steps "forward#0.1" -> `@forward_0_1`: npu.sequence_name's form), whose arguments
  are the four arenas of the memory plan (weights, state, io, scratch) as byte buffers. For each kernel it
  configures the kernel's device (`aiex.configure`, skipped when the previous kernel used the same device) and
  runs its sequence (`aiex.run`) on typed views (`memref.view`) of the arenas at the operands' offsets, passing
  exactly the arguments that sequence declares, in its order (`Run.arguments`);
- weights stay in the weights arena for the life of the session and each layer's kernels stream their own
  weights from it; KV caches live in the state arena; position and valid length are io-arena buffers the
  maskgen kernel reads on the device, so the sequence never changes between steps;
- what the DMAs must address by a per-run value (the KV-cache row at the position, embedding rows by token id)
  is a scratchpad parameter (`aiex.scratchpad_parameter`, declared at module scope): a 32-bit word the host
  writes before each run, added to the descriptor's base address. The manifest's `scratchpad` says how the host
  computes each word from an io-arena buffer it writes anyway: buffer[element] x scale bytes.
npu2 builds this module as one full ELF (`aiecc --get-full-elf`); npu1, which has no full-ELF dispatch, builds
one xclbin holding every configuration plus one instruction stream per dispatch step (`--expand-load-pdis`),
one dispatch per step from one xclbin. Never run on hardware (kernels/README.md).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field

import numpy as np

from kernels import design_module, design_name
from kernels.design_error import DesignError
from sdk.program import Program
from sdk.runtime.npu_artifacts import sequence_name

ARENAS = ("weights", "state", "io", "scratch")
MLIR_TYPES = {"bfloat16": "bf16", "float32": "f32", "int32": "i32"}


@dataclass
class Run:
    """One kernel of a dispatch: its device, the step's operands (present inputs, then outputs), and the
    device's params["sequence"]: the position among them of each argument its runtime sequence declares."""
    device: str
    operands: list[tuple[str, str, int, int, str]]   # (buffer, arena, byte offset, elements, dtype)
    sequence: list[int]

    @property
    def arguments(self) -> list[tuple[str, str, int, int, str]]:
        """What `aiex.run` passes: exactly the callee's sequence arguments, in its order."""
        return [self.operands[i] for i in self.sequence]

    def types(self) -> list[str]:
        return [f"memref<{elements}x{MLIR_TYPES[dtype]}>" for _, _, _, elements, dtype in self.arguments]


@dataclass
class FusedDesign:
    target: str
    devices: dict[str, str] = field(default_factory=dict)           # device name -> its MLIR module text
    parameters: dict[str, dict] = field(default_factory=dict)       # device name -> design parameters
    sequences: dict[str, list[Run]] = field(default_factory=dict)   # sequence_symbol(dispatch) -> kernels in order
    arenas: dict[str, int] = field(default_factory=dict)
    params: dict[str, list] = field(default_factory=dict)           # entry -> runtime parameter buffers
    scratchpad: dict[str, dict] = field(default_factory=dict)       # word name -> {buffer, element, scale, limit}

    def mlir(self) -> str:
        """The module aiecc compiles: every kernel device, then the main device with one sequence per dispatch."""
        parts = ["module {"]
        for name in self.scratchpad if self.target != "npu1" else ():  # hoisted to module scope, as IRON's
            parts.append(f"  aiex.scratchpad_parameter @{name} : i32")    # fusion does; the host writes them per run
        # npu1 has no scratchpad: kernels/build.py builds those transfers at their static base and the host patches
        # the instruction streams per run (sdk/runtime/npu_insts.py)
        for name, text in self.devices.items():
            parts.append(_named(text, name))
        dev = "npu1" if self.target == "npu1" else "npu2"
        parts.append(f"  aie.device({dev}) @main {{")
        sig = ", ".join(f"%{a}: memref<{max(self.arenas[a], 4)}xi8>" for a in ARENAS)
        for seq, runs in self.sequences.items():
            parts.append(f"    aie.runtime_sequence @{seq}({sig}) {{")
            current = None
            for i, run in enumerate(runs):
                if run.device != current:
                    if current is not None:
                        parts.append("      }")
                    parts.append(f"      aiex.configure @{run.device} {{")
                    current = run.device
                names, types = [], run.types()
                for j, ((_, arena, offset, _, _), t) in enumerate(zip(run.arguments, types)):
                    parts.append(f"        %o{i}_{j} = arith.constant {offset} : index")
                    parts.append(f"        %v{i}_{j} = memref.view %{arena}[%o{i}_{j}][] : "
                                 f"memref<{max(self.arenas[arena], 4)}xi8> to {t}")
                    names.append(f"%v{i}_{j}")
                parts.append(f"        aiex.run @sequence({', '.join(names)}) : ({', '.join(types)})")
            if current is not None:
                parts.append("      }")
            parts.append("    }")
        parts += ["  }", "}"]
        return "\n".join(parts) + "\n"

    def words(self, sequence: str) -> dict[str, dict]:
        """The scratchpad words one sequence's DMAs read, each with its index in the control scratchpad: the
        order of the module-scope declarations (to be checked against aiecc's parameter file on the first real
        build)."""
        used = {n for run in self.sequences[sequence] for n in self.parameters[run.device].get("scratchpad", {})}
        return {n: {**word, "index": i} for i, (n, word) in enumerate(self.scratchpad.items()) if n in used}

    def manifest(self) -> dict:
        """What the runtime needs besides the artifact: sequences per entry, arena sizes, parameter buffers."""
        return {"target": self.target, "arenas": self.arenas, "params": self.params, "scratchpad": self.scratchpad,
                "sequences": {s: [r.device for r in runs] for s, runs in self.sequences.items()},
                "devices": self.parameters}


def build(program: Program, target: str | None = None) -> FusedDesign:
    """The fused design of a compiled Program. Raises DesignError naming every kernel no design expresses."""
    target = target or program.target
    if target != program.target:
        raise DesignError(f"the program was compiled for {program.target}, not {target}")
    fused = FusedDesign(target, arenas={a: int(program.meta["arenas"].get(a, 0)) for a in ARENAS})
    keys: dict[str, str] = {}
    refused = []
    for entry in program.entries.values():
        fused.params[entry.name] = sorted({p for s in entry.steps if s.kind == "dispatch"
                                           for p in s.attrs.get("params", [])})
        for step in entry.steps:
            if step.kind != "dispatch":
                continue
            runs = []
            for k in step.body:
                try:
                    device = _device_for(fused, keys, k, program, target)
                except DesignError as e:
                    refused.append(f"{k.op} {k.attrs.get('name', '')}: {e.message}")
                    continue
                runs.append(run_of(program, k, device, fused.parameters[device]))
            fused.sequences[sequence_symbol(step.op)] = runs
    for name, word in fused.scratchpad.items():
        try:
            fused.scratchpad[name] = _host_word(program, word)
        except DesignError as e:
            refused.append(f"scratchpad word {name}: {e.message}")
    if refused:
        raise DesignError(f"{len(refused)} kernel steps have no design that expresses them: "
                          + "; ".join(refused[:8]) + ("; ..." if len(refused) > 8 else ""),
                          fix="see the list of what the designs refuse in kernels/README.md")
    return fused


def run_of(program: Program, k, device: str, params: dict) -> Run:
    """Kernel step k on its device: the step's operands as placed in the arenas, passed in the order the
    device's runtime sequence declares them (`params`: what its design recorded, with params["sequence"])."""
    sequence = params.get("sequence")
    if sequence is None:
        raise DesignError(f"design {design_name(k)} records no params['sequence'] (the position among the "
                          "step's operands of each argument of its runtime sequence)")
    return Run(device, [_placed(program, n) for n in (*k.inputs, *k.outputs) if n is not None], list(sequence))


def _host_word(program: Program, word: dict) -> dict:
    """A scratchpad word as the host computes it: (io[buffer][element] + add) x scale. Indices the host writes
    are used as they are; indices a kernel derives from them by a known rule are traced back to the io value:
    maskgen's positions(pos, n) (pos + i) and an add of an int32 constant (CLIP's eos index + row offset)."""
    name = word["buffer"]
    if program.buffers[name].arena == "io":
        return {**word, "add": word.get("add", 0)}
    producers = [k for e in program.entries.values() for s in e.steps if s.kind == "dispatch" for k in s.body
                 if name in k.outputs]
    k = producers[0] if len(producers) == 1 else None
    head = k.attrs["head"] if k is not None else {}
    io_inputs = [n for n in (k.inputs if k is not None else ()) if n and program.buffers[n].arena == "io"]
    if head.get("op") == "positions" and io_inputs:
        return {**word, "buffer": io_inputs[0], "element": 0, "add": word["element"]}
    if head.get("op") == "add" and not k.attrs.get("chain") and len(io_inputs) == 1:
        other = next(n for n in k.inputs if n != io_inputs[0])
        const = program.constants.get(other)
        if const is not None and const.shape == tuple(program.buffers[io_inputs[0]].shape):
            return {**word, "buffer": io_inputs[0], "add": int(np.asarray(const).reshape(-1)[word["element"]])}
    raise DesignError(f"gather by indices the device computes ({name}) by a rule the host cannot follow: "
                      "data-dependent DMA addresses")


def _device_for(fused: FusedDesign, keys: dict, k, program: Program, target: str) -> str:
    operands = [n for n in (*k.inputs, *k.outputs) if n is not None]
    doc = {"design": design_name(k), "target": target, "op": k.op,
           "attrs": {a: k.attrs[a] for a in ("head", "chain", "tiling", "views", "n_splits", "n_head", "state_writes")
                     if a in k.attrs},
           "operands": [(list(program.buffers[n].shape), program.buffers[n].dtype) for n in operands],
           "inputs": [n is not None for n in k.inputs],
           # scratchpad words are named after the int32 buffers they come from: share a device only with the same
           "indices": [n for n in operands if program.buffers[n].dtype == "int32"],
           # a design's params["sequence"] finds its tensors among the operands by buffer: share a device only
           # with the same buffers repeated at the same places (x * x, a state written in place)
           "repeats": [operands.index(n) for n in operands]}
    key = hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:12]
    if key not in keys:
        params: dict = {}
        module = design_module(k).build(target, k, program.buffers, params)
        name = f"{design_name(k)}_{key}"
        keys[key] = name
        fused.devices[name] = str(module)
        fused.parameters[name] = {"design": design_name(k), "kind": k.op, **_plain(params)}
    fused.scratchpad.update(fused.parameters[keys[key]].get("scratchpad", {}))
    return keys[key]


def _placed(program: Program, name: str) -> tuple:
    b = program.buffers[name]
    return (name, b.arena, b.offset, int(np.prod(b.shape, dtype=np.int64)), b.dtype)


def _named(text: str, name: str) -> str:
    """A design's module with its device named @name and its runtime sequence @sequence (what aiex.run calls)."""
    body = re.sub(r"^\s*module\s*(attributes\s*\{[^}]*\}\s*)?\{", "", text.strip(), count=1)
    body = body[:body.rstrip().rfind("}")]
    body = re.sub(r"aie\.device\((\w+)\)\s*\{", lambda m: f"aie.device({m.group(1)}) @{name} {{", body, count=1)
    return re.sub(r"(aiex?\.runtime_sequence)\s*(@\w+)?\s*\(", r"\1 @sequence(", body, count=1)


def sequence_symbol(dispatch: str) -> str:
    """The runtime sequence of a dispatch step in the main device: the runtime's kernel name for it
    (sdk.runtime.npu_artifacts.sequence_name, "forward#0.1" -> "main:forward_0_1") without the device."""
    return sequence_name(dispatch).split(":", 1)[1]


def _plain(params: dict) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in params.items()}
