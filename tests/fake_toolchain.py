"""A fake AIE toolchain (test-only): Peano's `clang++` and mlir-aie's `aiecc` as small scripts that take the flags
kernels/build.py passes and write files of the right kinds and names where the real tools would, so that
kernels/build.py (and `aie-apps build`) runs for real on a machine without the toolchain.

- clang++ (Peano): checks the target triple and writes a placeholder object for each kernel source.
- aiecc: checks every flag against the list the pinned aiecc has, reads the runtime sequences out of the
  design.mlir it is given and refuses a sequence the module does not declare, then writes
  npu1: final.xclbin (a JSON file for tests/fake_pyxrt.py naming its instruction streams) and, per sequence, an
  insts file that is a version-0.1 transaction as mlir-aie's AIETargetNPU.cpp lays one out (per DMA transfer a
  shim buffer-descriptor BLOCKWRITE, the DDR_PATCH of its address, a queue WRITE), which sdk/runtime/npu_insts.py
  parses and the runtime patches per run; npu2: aie.elf (JSON naming its sequences and their scratchpad words).

Two things a real aiecc reads from the design, which the IRON stand-in (tests/iron_standin.py) does not put in its
MLIR, reach the fake through files beside design.mlir that `installed()` writes while the build runs:
- transfers.json: each sequence's DMA transfers in order (kernels/build.py's own record of the designs' fills and
  drains) and its scratchpad words, from which the fake lays out the patch ops a real aiecc would;
- program/: the device program, which tests/fake_pyxrt.py executes where real hardware runs the compiled design.
Nothing here touches an NPU or the real toolchain; every output is EMULATED.
"""
from __future__ import annotations

import contextlib
import json
import stat
import sys
import textwrap
from pathlib import Path

from kernels import build as kbuild

from . import iron_standin

ROOT = Path(__file__).resolve().parents[1]

CLANG = """
import sys
from pathlib import Path
args = sys.argv[1:]
if not any(a.startswith("--target=aie2") for a in args) or "-c" not in args or "-o" not in args:
    sys.exit(f"clang++ (fake Peano): unexpected flags {args}")
src, obj = Path(args[args.index("-c") + 1]), Path(args[args.index("-o") + 1])
if not src.is_file():
    sys.exit(f"clang++ (fake Peano): no such file {src}")
obj.write_bytes(b"\\x7fELF fake AIE object of " + src.name.encode())
"""

AIECC = """
import hashlib, json, re, struct, sys
from pathlib import Path
FLAGS = ["--peano", "--tmpdir", "--get-xclbin", "--xclbin-name", "--get-npu-insts", "--npu-insts-name",
         "--expand-load-pdis", "--sequence-name", "--get-full-elf", "--full-elf-name"]   # mlir-aie v1.4.5's
args = sys.argv[1:]
if args == ["--help"]:
    print("usage: aiecc (fake)\\n" + "\\n".join(FLAGS))
    sys.exit(0)
opts = dict(a[2:].split("=", 1) if "=" in a else (a[2:], True) for a in args[:-1])
unknown = [o for o in opts if "--" + o not in FLAGS]
if unknown or "peano" not in opts or not Path(opts["peano"]).is_dir():
    sys.exit(f"aiecc (fake): bad flags {args}")
design = Path(args[-1])
mlir = design.read_text()
main = mlir[mlir.index("@main"):]
sequences = re.findall(r"aie\\.runtime_sequence @(\\w+)\\(%weights", main)
if not sequences:
    sys.exit("aiecc (fake): no runtime sequence in @main")
transfers = json.loads((design.parent / "transfers.json").read_text())
if set(transfers) != set(sequences):
    sys.exit(f"aiecc (fake): transfers.json names {sorted(transfers)}, the design {sorted(sequences)}")
if "get-full-elf" in opts:
    doc = {"fake_pyxrt": "elf", "program": "program", "sequences": {f"main:{s}": f"main:{s}" for s in sequences},
           "scratchpad": {f"main:{s}": t["words"] for s, t in transfers.items() if t["words"]}}
    Path(opts["full-elf-name"]).write_text(json.dumps(doc))
    sys.exit(0)
seq = opts.get("sequence-name")
if seq not in sequences:
    sys.exit(f"aiecc (fake): no runtime sequence @{seq} in the design (has {sequences})")

# a version-0.1 transaction (sdk/runtime/npu_insts.py has the layout and its sources)
SHIM_BD, SHIM_QUEUE = 0x1D000, 0x1D214
ops = [[0x00, 0, 0x1D220, 0, sequences.index(seq), 24]]   # a register write that tells the sequences apart
at, patches = 4 + 6, []
for i, (arg, plus, size, word) in enumerate(transfers[seq]["sites"]):
    col, bd = i % 4, i % 16
    reg = col << 25 | SHIM_BD + 32 * bd
    ops.append([0x01, col, reg, 4 * 12, 16 * (i + 1)] + [0] * 7)
    at += 12
    ops.append([0x81, 48, 0, 0, 0, 0, reg + 4, 0, arg, 0, plus & 0xFFFFFFFF, plus >> 32])
    patches.append({"at": at + 10, "base": plus, "bytes": size, "word": word})
    at += 12
    ops.append([0x00, 0, col << 25 | SHIM_QUEUE, 0, bd, 24])
    at += 6
ops.append([0x80, 16, 1, 0x01010000])
body = [w for op in ops for w in op]
words = [0 | 1 << 8 | 3 << 16 | 6 << 24, 5 | 1 << 8, len(ops), 4 * (4 + len(body))] + body
insts = Path(opts["npu-insts-name"])
insts.write_bytes(struct.pack(f"<{len(words)}I", *words))
xclbin = Path(opts["xclbin-name"])
doc = json.loads(xclbin.read_text()) if xclbin.exists() else {
    "fake_pyxrt": "xclbin", "uuid": hashlib.sha256(mlir.encode()).hexdigest()[:32], "kernels": ["MLIR_AIE"],
    "program": "program", "streams": []}
doc["streams"].append({"dispatch": f"main:{seq}", "file": insts.name, "patches": patches,
                       "words": transfers[seq]["words"]})
xclbin.write_text(json.dumps(doc))
"""


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def make(root: Path) -> kbuild.Toolchain:
    """The fake clang++ and aiecc under root, as kernels/build.py's Toolchain (at the pinned versions)."""
    _script(root / "peano" / "bin" / "clang++", CLANG)
    aiecc = _script(root / "mlir_aie" / "bin" / "aiecc.py", AIECC)
    return kbuild.Toolchain([str(aiecc)], root / "peano", dict(kbuild.pin()))


@contextlib.contextmanager
def installed(root: Path, monkeypatch):
    """For the duration: kernels/build.py finds the fake toolchain (as find_toolchain() would the real one), and each
    build runs with IRON as the stand-in, hands the fake aiecc its transfers.json and leaves the device program
    beside the artifact for tests/fake_pyxrt.py."""
    toolchain = make(root)
    monkeypatch.setattr(kbuild, "find_toolchain", lambda: toolchain)
    fused_build, run_aiecc, build_program = kbuild.fused_build, kbuild.run_aiecc, kbuild.build_program
    built: dict = {}

    def recording_fused_build(device, target):
        built["fused"], built["sites"] = fused_build(device, target)
        return built["fused"], built["sites"]

    def aiecc_with_transfers(fused, target, toolchain, folder, objects, sequences):
        sites = built["sites"] or {}
        doc = {s: {"words": fused.words(s), "sites": [[x.arg, x.plus, x.bytes, x.word] for x in sites.get(s, ())]}
               for s in fused.sequences}
        (Path(folder) / "transfers.json").write_text(json.dumps(doc))
        run_aiecc(fused, target, toolchain, folder, objects, sequences)

    def build_program_keeping_the_program(program, model, out, toolchain, budget_s=None):
        from sdk.compiler import watchdog
        with iron_standin.installed():
            entry = build_program(program, model, out, toolchain, budget_s)
        watchdog.split_dispatches(program, budget_s).save(Path(out) / program.target / entry["key"] / "program")
        return entry

    monkeypatch.setattr(kbuild, "fused_build", recording_fused_build)
    monkeypatch.setattr(kbuild, "run_aiecc", aiecc_with_transfers)
    monkeypatch.setattr(kbuild, "build_program", build_program_keeping_the_program)
    yield toolchain
