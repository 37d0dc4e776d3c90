"""The NPU compiler: Graphs -> one Program for npu1 or npu2, through the passes in run order:

  fuse       graph nodes -> kernels (epilogues, merged projections, views as access patterns)   fuse.py
  partition  NPU kernels vs host steps, and the NPU share of ops and FLOPs                      partition.py
  tile       each kernel's tiling for the target, checked against the hardware limits           catalog.py
  layout     stored form of every weight (bf16, tile-major, padded), packed at load time        layout.py
  memory     four arenas (weights, state, io, scratch), offsets, scratch reused by liveness      memory.py
  schedule   one dispatch per entry run when every op is on the NPU; emit the Program           schedule.py
  watchdog   a dispatch estimated over half the driver's watchdog split into several            watchdog.py

The program is the contract with the emu and npu backends and with kernels/:
- buffers: each with an arena (weights | state | io | scratch) and a byte offset; dtypes as stored on the
  device (bf16 activations, fp32 residual stream and weight vectors, packed bf16 GEMM weights).
- entry steps: `dispatch` (one NPU dispatch; attrs: params = runtime-parameter IO buffers it reads, kernels,
  split_of when the watchdog pass split it;
  body = kernel steps in order) or `host` (one op from ops.py; attrs: attrs, views, reason).
- kernel step: op = catalog kind; inputs / outputs = buffer names (None for an absent operand); attrs:
  name, head {op, attrs} (the graph op the kernel is built around), n_head (head operands come first),
  chain (epilogue ops: {op, attrs, operand index or None, swap}), views (per input: the access pattern,
  a list of reshape / transpose / slice), dims (DMA dimensions per input), tiling (catalog.py), flops,
  weight_bytes; GEMMs also n_splits (outputs' widths), prologue {op, attrs, operands} (a norm of A),
  state_writes [{output, axis, views, pos}] (an output stored into a cache at a runtime position),
  stored_width (Np: the output buffer is padded to whole tiles, its readers slice it; memory.pad_to_tiles);
  an argmax may have picks (for each output after the index, the input whose value at the index it stores).
- meta: layout (packing recipe per weights buffer, see layout.py; sdk/runtime/packing.py builds the arena),
  source_shapes, arenas (bytes per arena), npu_fraction, toolchain, content_key (kernels/ sources + steps +
  placement + target + toolchain pin: what prebuilt artifacts are stored under), watchdog (the dispatch
  budget and each dispatch's estimate, watchdog.py).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import UsageError
from ..graph import Graph
from ..program import Program
from . import TARGET_COMPILERS, catalog, layout, memory, schedule, watchdog
from .fuse import fuse
from .hardware import TARGETS
from .partition import fraction, partition, shape_of

# The toolchain the kernels of kernels/ are built with (kernels/build.py pins and installs it); part of every
# artifact's content key. mlir-aie v1.4.5, the current release, whose IRON API the designs are written in; Peano
# is the llvm-aie nightly of its utils/peano-requirements.txt. Evidence: kernels/README.md, "Pinned toolchain".
TOOLCHAIN_PIN = {"mlir_aie": "v1.4.5", "llvm_aie": "22.0.0.2026090701+3e93bf7b"}


def compile_npu(graphs: Sequence[Graph], target: str) -> Program:
    hw = TARGETS[target]
    names = [g.name for g in graphs]
    if len(set(names)) != len(names):
        raise UsageError(f"two graphs share a name in {names}; entry names must be unique")
    fused, stats = [], []
    for g in graphs:
        f = fuse(g, hw)
        stats.append(partition(f))
        shape, stored = shape_of(f), catalog.storage_bytes(f, memory.residual_stream(f))
        for k in f.kernels:
            if k.kind != "host":
                k.attrs["tiling"] = catalog.tiling(k, shape, hw, stored)
        fused.append(f)
    constants = {n: a for g in graphs for n, a in g.constants.items()}
    weight_buffers, recipes = layout.plan(fused, hw, constants)
    buffers, arenas = memory.plan(fused, weight_buffers, hw)
    entries = {f.name: schedule.emit(f, buffers) for f in fused}
    source_shapes = {s[0]: list(np.shape(constants[s[0]]) if s[0] in constants else _source_shape(graphs, s[0]))
                     for r in recipes.values() for s in r["sources"] if s}  # layout may add constants (pads)
    meta = {"graphs": names, "layout": recipes, "source_shapes": source_shapes, "arenas": arenas,
            "npu_fraction": fraction(stats), "toolchain": TOOLCHAIN_PIN}
    program = Program(target, buffers, entries, constants, meta)
    check_limits(program)
    meta["content_key"] = content_key(program)
    return watchdog.split_dispatches(program)


def check_limits(program: Program) -> None:
    """Every kernel of the program within its target's limits, or a ProgramError naming the kernel and the
    limit (a tiling that cannot fit is a compiler bug or an impossible op). The runtime trusts a compiled
    program's kernels: this is where they are checked."""
    hw = TARGETS[program.target]
    for e in program.entries.values():
        for s in e.steps:
            for k in s.body:
                catalog.check(k, hw)


def _source_shape(graphs, name):
    for g in graphs:
        if name in g.values:
            return g.values[name].shape
    raise KeyError(name)


KERNELS_DIR = Path(__file__).resolve().parents[2] / "kernels"


def design_sources() -> str:
    """sha256 of every source a build reads under kernels/ (each kernel's .cc, its design, the shared include/
    and modules such as access.py, the fused design, the build itself), relative paths included: a kernel's
    design may live in another kind's folder, so the whole tree is hashed. Reading bytes is not importing: sdk
    never imports kernels."""
    h = hashlib.sha256()
    for path in sorted(KERNELS_DIR.rglob("*")):
        if path.is_file() and path.suffix in (".cc", ".h", ".py") and "__pycache__" not in path.parts:
            h.update(path.relative_to(KERNELS_DIR).as_posix().encode() + b"\0")
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:16]


def content_key(program: Program) -> str:
    """Hash of everything an artifact depends on: the kernel sources (kernels/**), the steps with their tilings,
    buffer placement, target and toolchain pin. prebuilt/manifest.json stores artifacts under this key."""
    doc = {"target": program.target, "toolchain": TOOLCHAIN_PIN, "designs": design_sources(),
           "buffers": sorted((b.name, b.shape, b.dtype, b.arena, b.offset) for b in program.buffers.values()),
           "entries": {n: [schedule_doc(s) for s in e.steps] for n, e in program.entries.items()}}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def schedule_doc(step) -> dict:
    return {"kind": step.kind, "op": step.op, "inputs": step.inputs, "outputs": step.outputs, "attrs": step.attrs,
            "body": [schedule_doc(b) for b in step.body]}


TARGET_COMPILERS["npu1"] = compile_npu
TARGET_COMPILERS["npu2"] = compile_npu
