"""Build prebuilt artifacts: the graphs the pipelines load for a model (model_programs) -> sdk.compiler Program
(npu1 / npu2) -> the device program the runtime runs (sdk.compiler.watchdog.split_dispatches: dispatches split to fit the driver's watchdog) -> the fused design
(kernels/fused/design.py) -> Peano-compiled kernel objects + aiecc -> prebuilt/<target>/<key>/, recorded in
prebuilt/manifest.json through the runtime's own writer (npu.manifest_entry / npu.record_artifact).

    python -m kernels.build MODEL --target npu2        (also: aie-apps build MODEL --target npu2)

MODEL is a checkpoint folder (config.json + weights), a name sdk.hub resolves, or `smoke` (the one-GEMM program
`aie-apps doctor` dispatches, sdk.smoke.smoke_graph). The key is the compiled program's content key
(program.meta["content_key"]: kernels/** sources, steps, tilings, buffer placement, target, toolchain pin), the
key the runtime looks artifacts up by, so an artifact is rebuilt exactly when one of them changes.
Files, per the contract in sdk/runtime/npu.py: npu1 "xclbin" (final.xclbin) + "insts/DISPATCH" (insts_SEQ.bin,
one instruction stream per dispatch step); npu2 "elf" (aie.elf, one runtime sequence per dispatch step).

The toolchain is not on PyPI: without the pinned mlir-aie (IRON + aiecc) and llvm-aie (Peano) this says what
to install and exits non-zero (ToolchainMissing), before doing any work.

DMA addresses set per run (KV-cache rows, gathers: the fused design's scratchpad words) are recorded per dispatch
in the manifest's "scratchpad". npu2 adds them in the firmware (control scratchpad). npu1 has none: its designs
are built with every such transfer at its static base (the word's value 0) while the build records every fill and
drain of every runtime sequence (`static_transfers`), and after aiecc the build finds, in each dispatch's insts
file, the DDR-patch ops those transfers own (`patch_table`, sdk/runtime/npu_insts.py) and records them in
"patches"; the runtime rewrites their argplus per run.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import inspect
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sdk.compiler.hardware import TARGETS
from sdk.errors import SdkError, UsageError
from sdk.runtime.arena import ARENAS
from sdk.runtime.npu_insts import DdrPatch, InstructionStreamError, parse

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "kernels"
PREBUILT = ROOT / "prebuilt"
SMOKE = "smoke"   # the model name of `aie-apps doctor`'s one-GEMM program
# Peano target triples, and the flags mlir-aie's programming_examples/makefile-common compiles kernels with
# (PEANOWRAP2_FLAGS / PEANOWRAP2P_FLAGS: aie2p runs aie::mmul on bf16 through bfp16).
TRIPLES = {"npu1": "aie2-none-unknown-elf", "npu2": "aie2p-none-unknown-elf"}
PEANO_FLAGS = {"npu1": [], "npu2": ["-DAIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16"]}
# Output files (in prebuilt/<target>/<key>/) are named by the build, so their roles are known without a search.
NPU1_XCLBIN, NPU1_INSTS, NPU2_ELF = "final.xclbin", "insts_{sequence}.bin", "aie.elf"
# The aiecc flags of the pinned mlir-aie for each target's artifact: v1.4.5's declarative driver
# (tools/aiecc/README.md) selects outputs with --get-<artifact>, compiles cores with Peano by default (v1.4.1) and
# builds a host program only when asked (--get-host), so the Chess and host flags of older aiecc are gone.
AIECC_FLAGS = {
    "npu1": ["--get-xclbin", "--xclbin-name={folder}/" + NPU1_XCLBIN, "--get-npu-insts",
             "--npu-insts-name={folder}/" + NPU1_INSTS, "--expand-load-pdis"],
    "npu2": ["--get-full-elf", "--full-elf-name={folder}/" + NPU2_ELF],
}


class ToolchainMissing(SdkError):
    """The AIE toolchain (pinned mlir-aie + llvm-aie wheels) is not installed; the message says what to install."""
    exit_code = 1


def pin() -> dict:
    from sdk.compiler.npu import TOOLCHAIN_PIN
    return dict(TOOLCHAIN_PIN)


def install_hint() -> str:
    p = pin()
    return ("pip install mlir_aie=={m} -f https://github.com/Xilinx/mlir-aie/releases/expanded_assets/{tag} && "
            "pip install llvm-aie=={l} -f https://github.com/Xilinx/llvm-aie/releases/expanded_assets/nightly"
            ).format(m=p["mlir_aie"].lstrip("v"), tag=p["mlir_aie"], l=p["llvm_aie"])


@dataclass(frozen=True)
class Toolchain:
    aiecc: list[str]
    peano: Path
    versions: dict


def find_toolchain() -> Toolchain:
    """The pinned toolchain, or ToolchainMissing naming exactly what to install."""
    want = pin()
    found, problems = {}, []
    for dist, key in (("mlir_aie", "mlir_aie"), ("llvm-aie", "llvm_aie")):
        try:
            found[key] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"{dist} is not installed")
    for key, version in found.items():
        if version.lstrip("v") != want[key].lstrip("v"):
            problems.append(f"{key} {version} is installed; the kernels are pinned to {want[key]}")
    peano = Path(os.environ["PEANO_INSTALL_DIR"]) if os.environ.get("PEANO_INSTALL_DIR") else None
    if peano is None and "llvm_aie" in found:  # the wheel's own bin/clang++
        dist = importlib.metadata.distribution("llvm-aie")
        clang = next((f for f in dist.files or () if str(f).endswith("bin/clang++")), None)
        peano = Path(dist.locate_file(clang)).parent.parent if clang else None
        if peano is None:
            problems.append("the llvm-aie wheel has no bin/clang++")
    aiecc = shutil.which("aiecc.py") or shutil.which("aiecc")
    if "mlir_aie" in found and not aiecc:
        problems.append("the mlir_aie wheel is installed but its aiecc is not on PATH")
    if problems:
        raise ToolchainMissing("the AIE toolchain is missing: " + "; ".join(problems),
                               fix=f"{install_hint()}; then XRT with the amdxdna plugin to run the artifacts "
                                   f"(see kernels/README.md)")
    return Toolchain([aiecc], peano, {"mlir_aie": found["mlir_aie"], "llvm_aie": found["llvm_aie"]})


# ---- what to build: exactly what the pipelines load ---------------------------------------------------------------

@dataclass(frozen=True)
class ModelPrograms:
    """The one program a model runs with: its graphs as the pipeline that serves it builds them with its default
    options (every bucket), so the compiled program, and so its content key, is the one that pipeline loads."""
    model: str
    folder: Path | None
    loaded_by: str          # what loads it: CLI commands, or the Python class
    graphs: list

    def entries(self) -> list[dict]:
        """Each entry's name and the shapes of its inputs and runtime parameters."""
        return [{"entry": g.name, "inputs": {n: list(v.shape) for n, v in g.values.items()
                                            if v.kind in ("input", "param")}} for g in self.graphs]


def resolve_model(model: str):
    """(source, model_type) of a model name or folder, before anything is compiled; unknown names are ModelNotFound
    (exit 4), folders of an architecture no pipeline serves a UsageError."""
    from sdk import hub
    from sdk.weights import read_config
    source = hub.resolve(model)
    config = read_config(source.path) if (Path(source.path) / "config.json").is_file() else {}
    return source, config.get("model_type")  # none in a CTranslate2 (faster-whisper) folder


def model_programs(model: str) -> ModelPrograms:
    """The graphs the pipelines load for `model` with their default options (pipelines/*.py program_graphs: the
    same function the pipeline builds its session from). `smoke` is the doctor's program."""
    if model == SMOKE:
        from sdk.smoke import smoke_graph
        return ModelPrograms(SMOKE, None, "aie-apps doctor", [smoke_graph()])
    from sdk.models import ARCHITECTURES
    source, model_type = resolve_model(model)
    folder = Path(source.path)
    if model_type in (None, "whisper"):
        from pipelines import asr
        return ModelPrograms(model, folder, "transcribe, dictate (Transcriber)", asr.program_graphs(folder))
    if ARCHITECTURES.get(model_type) == "sdk.models.conformer":
        from pipelines import conformer_asr
        from sdk.models import conformer
        return ModelPrograms(model, folder, "transcribe, dictate (Transcriber)",
                             conformer_asr.program_graphs(conformer.load(folder)[0]))
    if model_type == "bert":
        from pipelines import text
        from sdk.models import bert
        return ModelPrograms(model, folder, "embed-text (TextEmbedder)", text.program_graphs(bert.load(folder)[0]))
    if ARCHITECTURES.get(model_type) in ("sdk.models.vit", "sdk.models.resnet", "sdk.models.clip"):
        from pipelines import vision
        from sdk.models import module_for, vit
        from sdk.weights import read_config
        config = read_config(folder)
        tower = vit if model_type == "clip" else module_for(model_type)  # CLIPForImageClassification: vit.py
        if not vision.is_zero_shot(config) and tower.Config.from_dict(config).num_labels:
            return ModelPrograms(model, folder, "classify (ImageClassifier, one frame per run)",
                                 vision.program_graphs(folder, vision.FRAME_OPTIONS))
        loaded_by = "ImageEmbedder (CLIP's zero-shot classify adds text graphs sized by its labels: not prebuilt)" \
            if model_type == "clip" else "ImageEmbedder"
        return ModelPrograms(model, folder, loaded_by, vision.program_graphs(folder, vision.VisionOptions()))
    if model_type == "esm":
        from pipelines import protein
        from sdk.models import esm
        from sdk.weights import read_config
        return ModelPrograms(model, folder, "embed (ProteinEmbedder)",
                             protein.program_graphs(esm.Config.from_dict(read_config(folder))))
    raise UsageError(f"{source.path} holds a {model_type!r} model, which no pipeline serves",
                     fix=f"build one of the architectures {', '.join(sorted(ARCHITECTURES))}, or `smoke`")


def installed_models() -> tuple[list[str], list[str]]:
    """(models found on this machine without the network, the others): every short name sdk.hub knows and each
    pipeline's default model. `aie-apps build --all` builds the first list and `smoke`; it never downloads."""
    from dataclasses import replace

    from pipelines import asr, protein, text, vision
    from sdk import hub, settings
    from sdk.errors import ModelNotFound
    names = dict.fromkeys([*hub.KNOWN, asr.DEFAULT_MODEL, text.DEFAULT_MODEL, vision.DEFAULT_CLASSIFIER,
                           vision.DEFAULT_EMBEDDER, protein.DEFAULT_MODEL])
    offline = replace(settings.load(), offline=True)
    found, missing = {}, []
    for name in names:
        try:
            found.setdefault(hub.resolve(name, settings=offline).path, name)  # one build per folder
        except ModelNotFound:
            missing.append(name)
    return list(found.values()), missing


# ---- the build ---------------------------------------------------------------------------------------------------

def build(model: str, target: str, out: Path = PREBUILT, toolchain: Toolchain | None = None) -> dict:
    """Build one model (or `smoke`) for one target into out/<target>/<key>/ and record it in out/manifest.json;
    returns {"key", **its manifest entry}."""
    if target not in TARGETS:
        raise UsageError(f"unknown target {target!r}", fix=f"use one of {sorted(TARGETS)}")
    if model != SMOKE:
        resolve_model(model)                            # an unknown model is named before a missing toolchain
    toolchain = toolchain or find_toolchain()          # then: without it nothing below can run
    from sdk.compiler import compile as compile_graphs
    return build_program(compile_graphs(model_programs(model).graphs, target), model, out, toolchain)


def build_program(program, model: str, out: Path, toolchain: Toolchain, budget_s: float | None = None) -> dict:
    """Build a compiled program's artifact as the npu backend loads it: from device_program(program, budget_s)
    (the backend's budget; default half the watchdog), under program.meta["content_key"]."""
    from kernels.fused import design as fused_design
    from sdk.compiler import watchdog
    from sdk.runtime import npu_artifacts as npu
    target, key = program.target, program.meta["content_key"]
    device = watchdog.split_dispatches(program, budget_s)
    dispatches = [s.op for e in device.entries.values() for s in e.steps if s.kind == "dispatch"]
    folder = out / target / key
    folder.mkdir(parents=True, exist_ok=True)
    fused, sites = fused_build(device, target)
    (folder / "design.mlir").write_text(fused.mlir())
    objects = compile_kernels(fused, target, toolchain, folder / "obj")
    symbols = {d: fused_design.sequence_symbol(d) for d in dispatches}
    run_aiecc(fused, target, toolchain, folder, objects, list(symbols.values()))
    if target == "npu1":
        files = {"xclbin": folder / NPU1_XCLBIN, **{f"insts/{d}": folder / NPU1_INSTS.format(sequence=s)
                                                    for d, s in symbols.items()}}
        names = {"kernel": npu.XCLBIN_KERNEL}
        words = {d: fused.words(s) for d, s in symbols.items() if fused.words(s)}
        if words:
            names["scratchpad"] = words
            names["patches"] = {d: patch_table(sites[symbols[d]], insts_patches(files[f"insts/{d}"]), words[d], d)
                                for d in words}
    else:
        files = {"elf": folder / NPU2_ELF}
        names = {"sequences": {d: f"main:{s}" for d, s in symbols.items()},
                 "scratchpad": {d: fused.words(s) for d, s in symbols.items() if fused.words(s)}}
    entry = npu.manifest_entry(device, out, files, **names, model=model, toolchain=toolchain.versions,
                               design=fused.manifest())
    npu.record_artifact(out, key, entry)
    return {"key": key, **entry}


def fused_build(device, target: str):
    """The fused design of a device program, and on npu1 the transfers, in order, of each of its sequences that
    has per-run words ({sequence symbol: [Site]}; None on npu2)."""
    from kernels.fused import design as fused_design
    if target != "npu1":
        return fused_design.build(device, target), None
    with static_transfers() as log:
        fused = fused_design.build(device, target)
    return fused, transfer_sites(fused, log, [s for s in fused.sequences if fused.words(s)])


# ---- npu1: per-run DMA addresses through the instruction streams -------------------------------------------------

@dataclass(frozen=True)
class Site:
    """One fill or drain of a runtime sequence as its DDR-patch op addresses it: argidx (the arena) and argplus (the
    transfer's static byte offset in it), the element size of its tensor, and the word that shifts it per run."""
    arg: int
    plus: int
    bytes: int
    word: str | None
    what: str


@contextlib.contextmanager
def static_transfers():
    """While the fused design builds for npu1: every design's runtime sequence has its fills and drains recorded
    ({"data", "transfers": [(tensor argument, tap offset in elements, word or None, kind)]} per Runtime, in the
    order they are built) and built at their static base: `offset_parameter` is dropped and `sync_parameters()`
    issues nothing, since npu1 has no scratchpad (the host patches the instruction stream). The IRON Runtime and
    ObjectFifoHandle are wrapped for the duration (the real ones, or tests/iron_standin.py's): a Runtime's body,
    its seq_fn, runs when its Program resolves, and moves data through the handles' fill / drain (v1.4.0)."""
    from kernels.iron_program import iron
    iron()   # the toolchain's DesignError when IRON is not importable
    from aie.iron import Runtime, RuntimeData
    from aie.iron.dataflow.objectfifo import ObjectFifoHandle
    runtime_module = sys.modules["aie.iron.runtime"]
    saved = {"__init__": Runtime.__init__, "fill": ObjectFifoHandle.fill, "drain": ObjectFifoHandle.drain,
             "sync_parameters": runtime_module.sync_parameters}
    log: list[dict] = []
    current: list[dict] = []   # the entry of the sequence body running now

    def init(self, seq_fn, fn_args=None, **kwargs):
        entry = {"data": (), "transfers": []}
        log.append(entry)

        def body(*args):
            entry["data"] = tuple(a for a in args if isinstance(a, RuntimeData))
            current.append(entry)
            try:
                seq_fn(*args)
            finally:
                current.pop()
        saved["__init__"](self, body, fn_args, **kwargs)

    def wrap(kind):
        original = saved[kind]
        signature = inspect.signature(original)
        tensor = list(signature.parameters)[1]   # (self, source | dest, tap, ...)

        def transfer(self, *args, **kwargs):
            bound = signature.bind(self, *args, **kwargs)
            a = bound.arguments
            shift = a.get("offset_parameter")
            if shift is not None:
                a["offset_parameter"] = None
            entry = current[-1]
            index = next(i for i, d in enumerate(entry["data"]) if d is a[tensor])
            tap = a.get("tap")
            entry["transfers"].append((index, int(tap.offset) if tap is not None else 0,
                                       shift.name if shift is not None else None, kind))
            return original(*bound.args, **bound.kwargs)
        return transfer

    try:
        Runtime.__init__ = init
        ObjectFifoHandle.fill, ObjectFifoHandle.drain = wrap("fill"), wrap("drain")
        runtime_module.sync_parameters = lambda: None
        yield log
    finally:
        Runtime.__init__ = saved["__init__"]
        ObjectFifoHandle.fill, ObjectFifoHandle.drain = saved["fill"], saved["drain"]
        runtime_module.sync_parameters = saved["sync_parameters"]


def transfer_sites(fused, log: list[dict], symbols: list[str]) -> dict[str, list[Site]]:
    """The transfers of these sequences in order, placed: each design's recorded transfers at the operands of each
    run of that design (a device serves every layer; the layers' operands sit at different offsets)."""
    if len(log) != len(fused.devices):
        raise InstructionStreamError(f"{len(log)} runtime sequences were built for {len(fused.devices)} designs; "
                                     "cannot tell which transfers belong to which design",
                                     fix="one Runtime per design build (kernels/<name>/design.py)")
    per_device = dict(zip(fused.devices, log))
    sites = {}
    for symbol in symbols:
        placed = []
        for run in fused.sequences[symbol]:
            entry = per_device[run.device]
            order = fused.parameters[run.device].get("sequence")   # positions in the run's operands
            if order is None:
                raise InstructionStreamError(f"{run.device}: its design records no params['sequence'], so its "
                                             f"transfers cannot be placed among the run's operands")
            operands = [run.operands[i] for i in order]
            for index, offset, word, kind in entry["transfers"]:
                buffer, arena, byte_offset, _, dtype = operands[index]
                size = np.dtype(_DTYPES[dtype]).itemsize
                placed.append(Site(ARENAS.index(arena), byte_offset + offset * size, size, word,
                                   f"{kind} of {buffer} ({run.device})"))
        sites[symbol] = placed
    return sites


_DTYPES = {"bfloat16": np.uint16, "float32": np.float32, "int32": np.int32}


def insts_patches(path: Path) -> tuple[DdrPatch, ...]:
    return parse(np.fromfile(path, dtype=np.uint32), Path(path).name).patches


def patch_table(sites: list[Site], patches: tuple[DdrPatch, ...], words, dispatch: str) -> dict[str, list[dict]]:
    """Which DDR-patch ops of a dispatch's insts each per-run word owns: {word: [{"at", "base", "bytes"}]} (the
    manifest's "patches"). One patch op per transfer in the sequence's order is matched one to one. Otherwise
    each op is matched by (argidx, argplus); an op no transfer explains, or a key shared by transfers of
    different words (or of a word and a static transfer: the KV-cache write at row 0 and the attention read of
    row 0), is ambiguous and refused."""
    if [(s.arg, s.plus) for s in sites] == [(p.arg, p.plus) for p in patches]:
        pairs = list(zip(sites, patches))
    else:
        owners: dict[tuple, list[Site]] = {}
        for s in sites:
            owners.setdefault((s.arg, s.plus), []).append(s)
        pairs = []
        for p in patches:
            mine = owners.get((p.arg, p.plus))
            if not mine:
                raise InstructionStreamError(
                    f"{dispatch}: DDR patch op {p.op} (argidx {p.arg}, argplus {p.plus}) matches no transfer of the "
                    f"design, and the ops do not follow the {len(sites)} transfers one to one",
                    fix="check how this toolchain lowers fills and drains (one buffer descriptor each?)")
            if len({(s.word, s.bytes) for s in mine}) > 1 and any(s.word for s in mine):
                raise InstructionStreamError(
                    f"{dispatch}: DDR patch op {p.op} (argidx {p.arg}, argplus {p.plus}) is ambiguous: "
                    + "; ".join(f"{s.what} ({s.word or 'static'})" for s in mine),
                    fix="the ops do not follow the design's transfers in order, so a per-run address cannot be "
                        "told from a static one; build this model for npu2, or run it with --device emu / cpu")
            pairs.append((mine[0], p))
    table: dict[str, list[dict]] = {}
    for s, p in pairs:
        if s.word is not None:
            table.setdefault(s.word, []).append({"at": p.at, "base": p.plus, "bytes": s.bytes})
    missing = sorted(set(words) - set(table))
    if missing:
        raise InstructionStreamError(f"{dispatch}: no DDR patch op for the transfers of {', '.join(missing)}",
                                     fix="check that the designs pass offset_parameter for every declared word")
    return table


def compile_kernels(fused, target: str, toolchain: Toolchain, work: Path) -> list[Path]:
    """One object per kernel source the design uses, named as the designs link them (<name>.o). A design with no
    <name>.cc (dma: shim and memtile DMAs only) has no core code to compile."""
    work.mkdir(parents=True, exist_ok=True)
    mac = "-DMMUL_R={}".format(TARGETS[target].mac_shape[0]), "-DMMUL_S={}".format(TARGETS[target].mac_shape[1]), \
        "-DMMUL_T={}".format(TARGETS[target].mac_shape[2])
    try:   # the AIE API headers (aie_api/aie.hpp) ship in the mlir_aie wheel's include/
        headers = ["-I", str(importlib.metadata.distribution("mlir_aie").locate_file("mlir_aie/include"))]
    except importlib.metadata.PackageNotFoundError:
        headers = []
    objects = []
    for name in sorted({p["design"] for p in fused.parameters.values()}):
        src = KERNELS / name / f"{name}.cc"
        if not src.is_file():
            continue
        obj = work / f"{name}.o"
        run([str(toolchain.peano / "bin" / "clang++"), f"--target={TRIPLES[target]}", "-O2", "-std=c++20",
             "-Wno-parentheses", "-Wno-attributes", "-Wno-macro-redefined", "-DNDEBUG", "-ffp-contract=off",
             *PEANO_FLAGS[target], *headers, *mac, "-c", str(src), "-o", str(obj)])
        objects.append(obj)
    return objects


def run_aiecc(fused, target: str, toolchain: Toolchain, folder: Path, objects: list[Path],
              sequences: list[str]) -> None:
    """aiecc on design.mlir (run in obj/, where the designs' link_with finds the kernel objects): npu2 one full
    ELF; npu1 one xclbin plus one instruction stream per runtime sequence (one per dispatch step)."""
    help_text = subprocess.run([*toolchain.aiecc, "--help"], capture_output=True, text=True).stdout
    flags = AIECC_FLAGS[target]
    base = [*toolchain.aiecc, f"--peano={toolchain.peano}", f"--tmpdir={folder / 'aiecc'}"]
    for flag in [*base[len(toolchain.aiecc):], *flags, *(["--sequence-name"] if target == "npu1" else [])]:
        # --help lists the --get=<name> selector; its --get-<artifact> shorthands are documented, not listed
        name = "--get" if flag.startswith("--get-") else flag.split("=")[0]
        if name not in help_text:
            raise ToolchainMissing(f"this aiecc has no {name}", fix=f"install the pinned toolchain: {install_hint()}")
    if target == "npu2":
        run([*base, *[f.format(folder=folder) for f in flags], str(folder / "design.mlir")], cwd=folder / "obj")
        return
    for sequence in sequences:
        seq_flags = [f.format(folder=folder, sequence=sequence) for f in flags]
        run([*base, *seq_flags, f"--sequence-name={sequence}", str(folder / "design.mlir")], cwd=folder / "obj")


def run(cmd: list[str], cwd: Path | None = None) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise SdkError(f"{Path(cmd[0]).name} failed ({done.returncode}): {done.stderr.strip()[-2000:]}",
                       fix="the toolchain version must be the pinned one; see kernels/README.md")


def listing(model: str, targets: list[str]) -> dict:
    """What `aie-apps build --list MODEL` prints: who loads the program, its content key per target (and whether
    prebuilt/ already has it), and every entry with its input shapes."""
    from sdk.compiler import compile as compile_graphs
    from sdk.runtime import npu_artifacts as npu
    programs = model_programs(model)
    keys = {t: compile_graphs(programs.graphs, t).meta["content_key"] for t in targets}
    built = {k for _, artifacts in npu.read_manifests() for k in artifacts}
    return {"model": model, "folder": str(programs.folder) if programs.folder else None,
            "loaded_by": programs.loaded_by, "keys": keys, "built": {t: k in built for t, k in keys.items()},
            "entries": programs.entries()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.build", description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="checkpoint folder, model name, or `smoke` (the doctor's one-GEMM program)")
    ap.add_argument("--target", choices=sorted(TARGETS), required=True)
    ap.add_argument("--out", type=Path, default=PREBUILT)
    a = ap.parse_args(argv)
    try:
        entry = build(a.model, a.target, a.out)
    except SdkError as e:
        print(f"error: {e.message}", file=sys.stderr)
        if e.fix:
            print(f"  fix: {e.fix}", file=sys.stderr)
        return e.exit_code
    print(json.dumps({"key": entry["key"], "target": entry["target"], "files": entry["files"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
