"""The fused epilogue chain as the kernels' `npu_epilogue` reads it (kernels/include/npu_kernel.h:
NpuEpilogueOp): opcode words and immediates, and the per-core L1 state that carries them."""
from __future__ import annotations

import numpy as np

from kernels.design_error import DesignError

OPCODES = {"gelu": 1, "gelu_tanh": 2, "sigmoid": 3, "silu": 4, "relu": 5, "tanh": 6, "exp": 7, "scale": 8,
           "add": 16, "sub": 17, "mul": 18, "div": 19}
MAX_CHAIN = 8


def encode_chain(chain, n_head_inputs: int) -> tuple[np.ndarray, np.ndarray]:
    """(int32 words, float32 immediates), MAX_CHAIN long; a word is opcode | slot << 8 | swap << 12, where slot
    counts the epilogue operands (kernel input n_head_inputs + slot)."""
    if len(chain) > MAX_CHAIN:
        raise DesignError(f"an epilogue of {len(chain)} ops; the kernels take at most {MAX_CHAIN}")
    words, imms = np.zeros(MAX_CHAIN, np.int32), np.zeros(MAX_CHAIN, np.float32)
    for i, c in enumerate(chain):
        slot = 0 if c["operand"] is None else c["operand"] - n_head_inputs
        words[i] = OPCODES[c["op"]] | slot << 8 | int(bool(c["swap"])) << 12
        imms[i] = c["attrs"].get("factor", 0.0)
    return words, imms


def epilogue_state(step, n_head_inputs: int, operand_map: np.ndarray | None = None) -> dict:
    words, imms = encode_chain(step.attrs["chain"], n_head_inputs)
    state = {"chain": (MAX_CHAIN, np.int32, words), "imm": (MAX_CHAIN, np.float32, imms)}
    if operand_map is not None:
        state["map"] = (MAX_CHAIN, np.int32, operand_map)
    return state
