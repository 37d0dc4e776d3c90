"""npu1 instruction streams: the transaction ("txn") format the firmware runs, read far enough to find and rewrite
the DDR address patches.

An npu1 artifact runs one dispatch as `kernel(3, instruction BO, word count, *arena BOs)`; the instruction BO holds
the uint32 words `aiecc --aie-generate-npu-insts` wrote (mlir-aie's `aie-translate --aie-npu-to-binary`,
lib/Targets/AIETargetNPU.cpp). That file is an aie-rt transaction (aie-rt driver/src/global/xaie_txn.h; aiebu's
transaction preprocessor walks it the same way). Every field is little-endian.

Header, 4 words (XAie_TxnHeader):
    word 0: Major | Minor << 8 | DevGen << 16 | NumRows << 24   (mlir-aie writes 0.1; DevGen 3 = npu1, 4 = npu2)
    word 1: NumCols | NumMemTileRows << 8
    word 2: NumOps, the number of operations that follow
    word 3: TxnSize, the whole stream in bytes (header included)
Every operation starts with a word whose low byte is its opcode (XAie_TxnOpcode). Two layouts exist:

version 0.1 (mlir-aie's current emitter; aie-rt's XAie_*Hdr structs, one u64 register offset per op):
    0x00 WRITE        6 words: op, 0, RegOff lo, RegOff hi, Value, Size(=24)
    0x01 BLOCKWRITE   4 + n words: op (| col << 8 | row << 16 in aie-rt), col | row << 8, RegOff, Size(bytes, all)
    0x03 MASKWRITE    7 words: op, 0, RegOff lo, RegOff hi, Value, Mask, Size(=28)
    0x04 MASKPOLL     7 words: as MASKWRITE (XAie_MaskPoll32Hdr)
    0x80 TCT (sync)   custom op: op, Size(bytes, all), payload
    0x81 DDR_PATCH   12 words: op, Size(=48), op_base (2 words), action, pad, regaddr lo/hi, argidx lo/hi,
                               argplus lo/hi (patch_op_t: u32 action, u64 regaddr, u64 argidx, u64 argplus)
    0x82..0x84        READ_REGS, RECORD_TIMER, MERGE_SYNC: custom ops, sized by their Size word
version 1.0 (aie-rt's "_opt" structs, XAie_ExportSerializedTransaction_opt; older mlir-aie emitted it):
    0x00 WRITE        3 words: op, RegOff, Value
    0x01 BLOCKWRITE   3 + n words: op, RegOff, Size(bytes, all)
    0x03 MASKWRITE    4 words: op, RegOff, Value, Mask        0x04 MASKPOLL: the same
    0x80..0x84        custom ops: op, Size(bytes, all), payload
    0x81 DDR_PATCH    6 words: op, Size(=24), regaddr, argidx (low byte), argplus lo/hi (patch_op_opt_t)
The firmware (or XRT, aiebu) resolves a DDR patch when the stream runs: it writes address(kernel argument
argidx + 3) + argplus into the buffer-descriptor register at regaddr. argidx counts the runtime sequence's
arguments (xclbin kernel arguments 0-2 are opcode, instruction BO, count), so here it is the arena index of
emu.ARENAS, and argplus is the byte offset of the transfer in its arena.

Per-run DMA addresses on npu1 (kernels/README.md, "Runtime parameters"): the build compiles every such transfer at
its static base (the word's value 0) and records which patch ops it owns; before each run the host rewrites their
argplus to base + word x element size (`set_argplus`) and syncs the instruction BO, so the firmware resolves the
shifted address. Opcodes this module cannot size (BLOCKSET, NOOP, PREEMPT, LOADPDI, ...: their numbers moved
between aie-rt versions) are refused rather than guessed: one wrong size would misread every later op.
Before transactions (2023), mlir-aie's AIETargetIPU.cpp wrote another format (a fixed 17-word prolog, opcode in the
top byte: 2 write32, 3 sync, 6 a shim BD with a DDR id and buffer offset); it has no DDR patch ops and is refused.
Written from the sources named above; never checked against a file aiecc wrote or run on hardware.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ProgramError

HEADER_WORDS = 4
WRITE, BLOCKWRITE, MASKWRITE, MASKPOLL = 0x00, 0x01, 0x03, 0x04
TCT, DDR_PATCH, READ_REGS, RECORD_TIMER, MERGE_SYNC = 0x80, 0x81, 0x82, 0x83, 0x84
CUSTOM = (TCT, DDR_PATCH, READ_REGS, RECORD_TIMER, MERGE_SYNC)
NAMES = {WRITE: "WRITE", BLOCKWRITE: "BLOCKWRITE", MASKWRITE: "MASKWRITE", MASKPOLL: "MASKPOLL", TCT: "TCT",
         DDR_PATCH: "DDR_PATCH", READ_REGS: "READ_REGS", RECORD_TIMER: "RECORD_TIMER", MERGE_SYNC: "MERGE_SYNC"}
VERSIONS = {(0, 1): "0.1", (1, 0): "1.0"}
IPU_PROLOG = 0x00000011   # first word of the older, non-transaction format (opcode in the top byte, DDR ids in BDs)
FIXED_WORDS = {"0.1": {WRITE: 6, MASKWRITE: 7, MASKPOLL: 7}, "1.0": {WRITE: 3, MASKWRITE: 4, MASKPOLL: 4}}
PATCH_WORDS = {"0.1": 12, "1.0": 6}
# where a DDR patch keeps its fields, in words from the op's first word: (regaddr, argidx, argplus low word)
PATCH_FIELDS = {"0.1": (6, 8, 10), "1.0": (2, 3, 4)}


class InstructionStreamError(ProgramError):
    """An instruction stream that is not a transaction this module can read, or whose patches do not match
    what its manifest says."""


@dataclass(frozen=True)
class DdrPatch:
    """One XAIE_IO_CUSTOM_OP_DDR_PATCH: `at` is the word index of its argplus (the low word; the high word follows),
    the word the host rewrites per run."""
    op: int          # ordinal of the op in the stream
    start: int       # word index of the op's first word
    regaddr: int     # the buffer-descriptor register the resolved address goes to
    arg: int         # argidx: the runtime sequence argument (the arena)
    plus: int        # argplus: byte offset added to that argument's address
    at: int


@dataclass(frozen=True)
class Stream:
    version: str
    dev_gen: int
    rows: int
    cols: int
    ops: tuple[tuple[int, int, int], ...]   # (opcode, first word, words) of every op, in order
    patches: tuple[DdrPatch, ...]


def parse(words, name: str = "instruction stream") -> Stream:
    """Walk a transaction stream (uint32 words) op by op; every op must fit, the op count and the byte size in the
    header must agree with what is there, and every opcode must be one this module can size."""
    w = np.asarray(words)
    if w.dtype != np.uint32 or w.ndim != 1:
        raise InstructionStreamError(f"{name}: expected a 1-D array of uint32 words, got {w.dtype} {w.shape}")
    fix = "rebuild the artifact with the pinned toolchain: `aie-apps build MODEL --target npu1`"
    if len(w) < HEADER_WORDS:
        raise InstructionStreamError(f"{name}: {len(w)} words, shorter than the 4-word transaction header", fix=fix)
    major, minor, dev_gen, rows = (int(w[0]) >> s & 0xFF for s in (0, 8, 16, 24))
    version = VERSIONS.get((major, minor))
    if version is None:
        older = " (the pre-2024 IPU instruction format of mlir-aie's AIETargetIPU.cpp: its 17-word prolog " \
                "starts with 0x00000011)" if int(w[0]) == IPU_PROLOG else ""
        raise InstructionStreamError(f"{name}: transaction version {major}.{minor}{older}; this reader knows "
                                     f"{', '.join(VERSIONS.values())}", fix=fix)
    count, size = int(w[2]), int(w[3])
    if size != 4 * len(w):
        raise InstructionStreamError(f"{name}: the header says {size} bytes, the stream has {4 * len(w)}", fix=fix)
    ops, patches, i = [], [], HEADER_WORDS
    for n in range(count):
        if i >= len(w):
            raise InstructionStreamError(f"{name}: the header announces {count} ops, the stream ends after {n}",
                                         fix=fix)
        opcode = int(w[i]) & 0xFF
        length = _op_words(w, i, opcode, version, name)
        if length < 1 or i + length > len(w):
            raise InstructionStreamError(f"{name}: op {n} ({NAMES.get(opcode, hex(opcode))}) at word {i} claims "
                                         f"{length} words; {len(w) - i} are left", fix=fix)
        if opcode == DDR_PATCH:
            if length != PATCH_WORDS[version]:
                raise InstructionStreamError(f"{name}: DDR patch op {n} at word {i} has {length} words; a "
                                             f"version-{version} patch has {PATCH_WORDS[version]}", fix=fix)
            reg, arg, plus = (i + f for f in PATCH_FIELDS[version])
            arg_value = int(w[arg]) & 0xFF if version == "1.0" else int(w[arg]) | int(w[arg + 1]) << 32
            patches.append(DdrPatch(n, i, int(w[reg]), arg_value, int(w[plus]) | int(w[plus + 1]) << 32, plus))
        ops.append((opcode, i, length))
        i += length
    if i != len(w):
        raise InstructionStreamError(f"{name}: {len(w) - i} words after the {count} ops the header announces",
                                     fix=fix)
    return Stream(version, dev_gen, rows, int(w[1]) & 0xFF, tuple(ops), tuple(patches))


def _op_words(w: np.ndarray, i: int, opcode: int, version: str, name: str) -> int:
    fixed = FIXED_WORDS[version].get(opcode)
    if fixed is not None:
        return fixed
    if opcode in CUSTOM:
        size_at = i + 1                                  # XAie_CustomOpHdr(_opt): op word, then Size in bytes
    elif opcode == BLOCKWRITE:
        size_at = i + (3 if version == "0.1" else 2)     # after the register offset
    else:
        raise InstructionStreamError(f"{name}: opcode {opcode:#x} at word {i} is not one this reader sizes "
                                     f"({', '.join(NAMES.values())}); its layout changed between aie-rt versions",
                                     fix="build without it (npu1 insts use --expand-load-pdis), or extend "
                                         "sdk/runtime/npu_insts.py from the pinned aie-rt's xaie_txn.h")
    if size_at >= len(w):
        raise InstructionStreamError(f"{name}: op {NAMES[opcode]} at word {i} ends before its size field")
    size = int(w[size_at])
    if size % 4:
        raise InstructionStreamError(f"{name}: op {NAMES[opcode]} at word {i} is {size} bytes, not whole words")
    return size // 4


def set_argplus(words: np.ndarray, at: int, value: int) -> None:
    """Rewrite one patch op's argplus (the low and high word at `at`) in place."""
    if not 0 <= value < 1 << 64:
        raise InstructionStreamError(f"argplus {value} does not fit 64 bits")
    words[at] = value & 0xFFFFFFFF
    words[at + 1] = value >> 32
