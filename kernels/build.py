"""Build prebuilt artifacts: a model's graphs -> sdk.compiler Program (npu1 / npu2) -> the fused design
(kernels/fused/design.py) -> Peano-compiled kernel objects + aiecc -> prebuilt/<target>/<key>/, recorded in
prebuilt/manifest.json (content key, files with sha256, toolchain versions, sequences, arenas, parameters).

    python -m kernels.build MODEL --target npu2        (also: aie-apps build MODEL --target npu2)

MODEL is a checkpoint folder (config.json + weights) or a name sdk.hub resolves. The content key hashes the
design sources (kernels/**), the compiled program's own content key (its steps, tilings and buffer placement),
the target and the toolchain pin, so an artifact is rebuilt exactly when one of them changes.

The toolchain is not on PyPI: without the pinned mlir-aie (IRON + aiecc) and llvm-aie (Peano) this says what
to install and exits non-zero (ToolchainMissing), before doing any work.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from sdk.compiler.hardware import TARGETS
from sdk.errors import SdkError, UsageError

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "kernels"
PREBUILT = ROOT / "prebuilt"
MANIFEST_FORMAT = 1
# Peano target triples and the aiecc flags of the pinned mlir-aie for each target's artifact.
TRIPLES = {"npu1": "aie2-none-unknown-elf", "npu2": "aie2p-none-unknown-elf"}
AIECC_FLAGS = {
    "npu1": ["--aie-generate-xclbin", "--xclbin-name=final.xclbin", "--aie-generate-npu-insts",
             "--npu-insts-name=insts_{sequence}.bin", "--expand-load-pdis"],
    "npu2": ["--aie-generate-full-elf", "--full-elf-name=aie.elf"],
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


# ---- what to build ---------------------------------------------------------------------------------------------

def model_graphs(model: str):
    """The graphs a model is built at: its checkpoint's config, the model file's graph functions at the shapes
    the pipelines use by default (one batch; text 128 tokens, proteins 256, ASR windows as the model file says)."""
    from sdk import hub
    from sdk.models import module_for
    from sdk.weights import read_config
    source = hub.resolve(model)
    config = read_config(source.path)
    module = module_for(config.get("model_type", ""))
    cfg = module.Config.from_dict(config)
    name = module.__name__.rsplit(".", 1)[-1]
    if name == "whisper":
        return module.graphs(cfg)
    if name == "conformer":
        return [module.encoder_graph(cfg, 1000), *module.decoder_graphs(cfg)]
    if name == "clip":
        return [module.image_graph(cfg, 1), module.text_graph(cfg, 1)]
    if name in ("vit", "resnet"):
        return [module.graph(cfg, 1)]
    return [module.graph(cfg, 1, 256 if name == "esm" else 128)]


def design_sources_hash() -> str:
    h = hashlib.sha256()
    for path in sorted(KERNELS.rglob("*")):
        if path.suffix in (".cc", ".h", ".py") and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(KERNELS)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def content_key(program, target: str) -> str:
    doc = {"sources": design_sources_hash(), "program": program.meta["content_key"], "target": target,
           "toolchain": pin()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


# ---- the build ---------------------------------------------------------------------------------------------------

def build(model: str, target: str, out: Path = PREBUILT, toolchain: Toolchain | None = None) -> dict:
    """Build one model for one target into out/<target>/<key>/ and record it in out/manifest.json."""
    if target not in TARGETS:
        raise UsageError(f"unknown target {target!r}", fix=f"use one of {sorted(TARGETS)}")
    toolchain = toolchain or find_toolchain()          # first: without it nothing below can run
    from kernels.fused import design as fused_design
    from sdk.compiler import compile as compile_graphs
    program = compile_graphs(model_graphs(model), target)
    key = content_key(program, target)
    folder = out / target / key
    folder.mkdir(parents=True, exist_ok=True)
    fused = fused_design.build(program, target)
    (folder / "design.mlir").write_text(fused.mlir())
    objects = compile_kernels(fused, target, toolchain, folder / "obj")
    run_aiecc(fused, target, toolchain, folder, objects)
    files = {p.name: sha256(p) for p in sorted(folder.iterdir()) if p.is_file()}
    entry = {"key": key, "model": model, "target": target, "program_key": program.meta["content_key"],
             "files": files, "toolchain": toolchain.versions, **fused.manifest()}
    record(out / "manifest.json", entry)
    return entry


def compile_kernels(fused, target: str, toolchain: Toolchain, work: Path) -> list[Path]:
    """One object per kernel source the design uses, named as the designs link them (<name>.o)."""
    work.mkdir(parents=True, exist_ok=True)
    mac = "-DMMUL_R={}".format(TARGETS[target].mac_shape[0]), "-DMMUL_S={}".format(TARGETS[target].mac_shape[1]), \
        "-DMMUL_T={}".format(TARGETS[target].mac_shape[2])
    objects = []
    for name in sorted({p["design"] for p in fused.parameters.values()}):
        src = KERNELS / name / f"{name}.cc"
        obj = work / f"{name}.o"
        run([str(toolchain.peano / "bin" / "clang++"), f"--target={TRIPLES[target]}", "-O2", "-std=c++20",
             "-DNDEBUG", "-ffp-contract=off", *mac, "-c", str(src), "-o", str(obj)])
        objects.append(obj)
    return objects


def run_aiecc(fused, target: str, toolchain: Toolchain, folder: Path, objects: list[Path]) -> None:
    help_text = subprocess.run([*toolchain.aiecc, "--help"], capture_output=True, text=True).stdout
    flags = AIECC_FLAGS[target]
    for flag in flags:
        if flag.split("=")[0] not in help_text:
            raise ToolchainMissing(f"this aiecc has no {flag.split('=')[0]}",
                                   fix=f"install the pinned toolchain: {install_hint()}")
    base = [*toolchain.aiecc, "--no-xchesscc", "--no-xbridge", f"--peano={toolchain.peano}", "--no-compile-host",
            f"--tmpdir={folder / 'aiecc'}"]
    if target == "npu2":
        run([*base, *flags, str(folder / "design.mlir")], cwd=folder / "obj")
        return
    for sequence in fused.sequences:  # npu1: one xclbin, one instruction stream per dispatch step
        seq_flags = [f.format(sequence=sequence) for f in flags]
        run([*base, *seq_flags, f"--sequence-name={sequence}", str(folder / "design.mlir")], cwd=folder / "obj")


def run(cmd: list[str], cwd: Path | None = None) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise SdkError(f"{Path(cmd[0]).name} failed ({done.returncode}): {done.stderr.strip()[-2000:]}",
                       fix="the toolchain version must be the pinned one; see kernels/README.md")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def empty_manifest() -> dict:
    return {"format": MANIFEST_FORMAT, "toolchain": pin(), "artifacts": []}


def record(path: Path, entry: dict) -> None:
    """Add (or replace, by model and target) one artifact in the manifest, written atomically."""
    doc = json.loads(path.read_text()) if path.exists() else empty_manifest()
    doc["artifacts"] = [a for a in doc["artifacts"] if (a["model"], a["target"]) != (entry["model"], entry["target"])]
    doc["artifacts"].append(entry)
    doc["toolchain"] = pin()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.build", description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="checkpoint folder or model name")
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
    print(json.dumps({"key": entry["key"], "files": entry["files"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
