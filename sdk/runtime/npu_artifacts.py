"""Prebuilt NPU artifacts: where they are, the manifest that lists them, and the checked lookup a session does.

A program's artifact is found in prebuilt/manifest.json (the user's $AIE_APPS_HOME/prebuilt first, then the
repo's) under the program's content key, and its files are checked against their sha256: an xclbin plus one
instruction stream per dispatch (npu1), or one full ELF holding every dispatch as a runtime sequence (npu2).

The manifest (read_manifest, manifest_entry, record_artifact; kernels/build.py and the tests' fake build both
write through them):
    {"format": 1, "artifacts": {CONTENT_KEY: {"target": "npu1" | "npu2",
        "files": {ROLE: {"path": PATH relative to the manifest's folder, "sha256": HEX}},
        "kernel": "MLIR_AIE",                    # npu1: the xclbin's kernel (optional)
        "sequences": {DISPATCH: KERNEL_NAME},    # npu2: each dispatch's kernel in the ELF (optional)
        "scratchpad": {DISPATCH: {WORD: {"index", "buffer", "element", "add", "scale", "limit"}}},  # optional
        "patches": {DISPATCH: {WORD: [{"at", "base", "bytes"}]}}}}}             # npu1, with "scratchpad"
CONTENT_KEY is the compiled program's meta["content_key"] (sdk/compiler/npu.py: kernels/** sources, steps,
placement, target, toolchain pin). ROLE is "xclbin" and "insts/DISPATCH" for every dispatch step of the
program on npu1, and "elf" on npu2. DISPATCH is a dispatch step's name (`Step.op`, e.g. "forward#0", or
"forward#0.1" when the compiler split it for the watchdog, sdk/compiler/watchdog.py); an npu2 kernel name
defaults to sequence_name(DISPATCH), e.g. "main:forward_0".
"scratchpad" lists the per-run words a dispatch's DMAs add to their base addresses (IRON scratchpad parameters,
kernels/README.md "Runtime parameters"): before each start the host writes word = (buffer[element] + add) * scale
(an int32 io buffer it writes anyway, e.g. the position or a token id; the sum checked within 0..limit) as uint32
number `index` of the run's control scratchpad (`run.get_ctrl_scratchpad_bo()`, which pyxrt binds from XRT 2.26 on) and
syncs it. Only npu2 (full ELF) has a control scratchpad. npu1 gets the same words by patching its instruction
streams (sdk/runtime/npu_insts.py): "patches" lists, per word, the DDR-patch ops of the dispatch's insts file that
belong to the transfers the word shifts: `at` is the word index of the op's argplus, `base` its static value (the
transfer at word 0, a byte offset in its arena), `bytes` the element size of the transfer's tensor. Before each
start the host writes argplus = base + word * bytes into the dispatch's instruction BO and syncs those words; the
firmware then resolves the shifted address. An npu1 artifact with words but no patch for one of them is refused.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..errors import ArtifactMissing, ProgramError
from ..program import Program

XCLBIN_KERNEL = "MLIR_AIE"
PREBUILT = Path(__file__).resolve().parents[2] / "prebuilt"
MANIFEST_FORMAT = 1
BUILD_FIX = ("build them on a machine with the mlir-aie toolchain: `aie-apps build MODEL --target {target}` "
             "(see kernels/README.md), or run with --device emu / cpu")


# ---- artifacts ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Artifact:
    key: str
    target: str
    files: dict[str, Path]      # role -> checked file
    kernel: str = XCLBIN_KERNEL
    sequences: dict[str, str] = dataclasses.field(default_factory=dict)
    scratchpad: dict[str, dict] = dataclasses.field(default_factory=dict)   # dispatch -> {word: spec}
    patches: dict[str, dict] = dataclasses.field(default_factory=dict)      # npu1: dispatch -> {word: [site]}

    def sequence(self, dispatch: str) -> str:
        return self.sequences.get(dispatch, sequence_name(dispatch))


def sequence_name(dispatch: str) -> str:
    """The default kernel name of a dispatch in a full ELF: device "main", runtime sequence named after the
    dispatch in MLIR symbol characters ("forward#0.1" -> "main:forward_0_1")."""
    return "main:" + re.sub(r"[^A-Za-z0-9_]", "_", dispatch)


def prebuilt_dirs() -> list[Path]:
    """Where manifests are read: the user's own folder ($AIE_APPS_HOME/prebuilt, for artifacts copied there)
    first, then the repo's prebuilt/ (where kernels/build.py writes)."""
    from ..settings import load
    return [load().home / "prebuilt", PREBUILT]


def read_manifests() -> list[tuple[Path, dict]]:
    """(folder, {content key: artifact entry}) of every prebuilt folder that has a manifest.json."""
    return [(folder, read_manifest(folder / "manifest.json")) for folder in prebuilt_dirs()
            if (folder / "manifest.json").is_file()]


def read_manifest(path: Path) -> dict:
    """The artifacts of one manifest.json ({} when it does not exist); a manifest of another shape is an error."""
    path = Path(path)
    if not path.exists():
        return {}
    fix = "rebuild it: `aie-apps build MODEL --target ...` (or delete it)"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ArtifactMissing(f"cannot read {path}: {e}", fix=fix)
    arts = doc.get("artifacts") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT or not isinstance(arts, dict) \
            or not all(isinstance(a, dict) and isinstance(a.get("files"), dict) for a in arts.values()):
        raise ArtifactMissing(f"{path} is not a format-{MANIFEST_FORMAT} manifest "
                              '({"format": 1, "artifacts": {CONTENT_KEY: {"target", "files": {ROLE: ...}}}})', fix=fix)
    return arts


def manifest_entry(program: Program, root: Path, files: Mapping[str, Path], **extra) -> dict:
    """The manifest entry of `program`'s artifact (the compiled program, dispatches as the compiler split them):
    `files` maps every required role to its file under `root` (the prebuilt folder); each is recorded with its
    path relative to root and its sha256, exactly as find_artifact checks them. `extra`: kernel (npu1),
    sequences (npu2: DISPATCH -> kernel name), and anything informative (model, toolchain, ...)."""
    root = Path(root).resolve()
    want, have = required_roles(program), set(files)
    if set(want) != have:
        raise ProgramError(f"the artifact's files do not match its program: missing {sorted(set(want) - have)}, "
                           f"unexpected {sorted(have - set(want))}",
                           fix="build from the compiled program, one file per required role")
    recorded = {}
    for role in want:
        path = Path(files[role]).resolve()
        if not path.is_file():
            raise ProgramError(f"artifact file {path} ({role}) was not written",
                               fix=BUILD_FIX.format(target=program.target))
        recorded[role] = {"path": path.relative_to(root).as_posix(), "sha256": _sha256(path)}
    return {**extra, "target": program.target, "files": recorded}


def record_artifact(root: Path, key: str, entry: dict) -> Path:
    """Add (or replace) the artifact `key` in root/manifest.json, written atomically; returns the manifest's path."""
    path = Path(root) / "manifest.json"
    arts = read_manifest(path)
    arts[key] = entry
    doc = {"format": MANIFEST_FORMAT, "artifacts": dict(sorted(arts.items()))}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


def artifact_keys(target: str) -> list[str]:
    return [k for _, arts in read_manifests() for k, a in arts.items() if a.get("target") == target]


def required_roles(program: Program) -> list[str]:
    if program.target == "npu2":
        return ["elf"]
    return ["xclbin"] + [f"insts/{s.op}" for e in program.entries.values() for s in e.steps if s.kind == "dispatch"]


def find_artifact(program: Program) -> Artifact:
    """The checked artifact of a device program (its content key on its target), or ArtifactMissing."""
    key, target = program.meta.get("content_key", ""), program.target
    fix = BUILD_FIX.format(target=target)
    manifests = read_manifests()
    if not manifests:
        raise ArtifactMissing(f"no prebuilt NPU artifacts: no manifest.json in {', '.join(map(str, prebuilt_dirs()))}",
                              fix=fix)
    for folder, arts in manifests:
        a = arts.get(key)
        if a is None or a.get("target") != target:
            continue
        files = {}
        for role in required_roles(program):
            entry = a.get("files", {}).get(role)
            if entry is None:
                raise ArtifactMissing(f"artifact {key} in {folder} has no {role!r} file", fix=fix)
            path = folder / entry["path"]
            if not path.is_file():
                raise ArtifactMissing(f"artifact file {path} is missing", fix=fix)
            if _sha256(path) != entry["sha256"]:
                raise ArtifactMissing(f"artifact file {path} does not match its sha256 in the manifest (corrupt or "
                                      "rebuilt without updating the manifest)", fix=fix)
            files[role] = path
        return Artifact(key, target, files, a.get("kernel", XCLBIN_KERNEL), dict(a.get("sequences", {})),
                        dict(a.get("scratchpad", {})), dict(a.get("patches", {})))
    entries = ", ".join(program.entries)
    raise ArtifactMissing(f"no {target} artifact for this program (content key {key}; entries {entries}) in "
                          f"{', '.join(str(f / 'manifest.json') for f, _ in manifests)}", fix=fix)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
