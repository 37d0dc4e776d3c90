"""A kernel step's operands: the buffer each lives in and the element index of each of its elements after its
view chain (the access patterns are relative to each buffer's start), and their order in a design's runtime
sequence (the operand-order contract, kernels/README.md)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kernels.design_error import DesignError
from kernels.iron_program import BF16
from sdk.compiler import layout


@dataclass(frozen=True)
class Operand:
    """A kernel operand: the buffer it lives in and the element index (in elements of that buffer) of each
    element of the logical operand, after its view chain."""
    name: str
    elements: int          # size of the buffer in elements (the runtime-sequence tensor)
    index: np.ndarray      # logical shape, int64 offsets into the buffer
    dtype: np.dtype = BF16
    scalar: bool = False   # one value per row, broadcast along it by the kernel (index [..., 1])

    @property
    def shape(self) -> tuple:
        return self.index.shape

    def rows(self, index: np.ndarray, scalar: bool = False) -> "Operand":
        return Operand(self.name, self.elements, np.ascontiguousarray(index), self.dtype, scalar)


def operand(name: str, buffer, views=()) -> Operand:
    """`buffer` is an sdk Program Buffer (shape, device dtype: bf16, fp32 for the residual stream and weight
    vectors, int32)."""
    n = math.prod(buffer.shape)
    index = layout.apply_views(np.arange(n, dtype=np.int64).reshape(buffer.shape), views)
    return Operand(name, n, np.ascontiguousarray(index), np.dtype(buffer.dtype))


def sequence_args(step, buffers, read: dict, outs: list) -> tuple[list, dict[int, int]]:
    """A design's runtime-sequence tensors in the order the fused design passes them (kernels/fused/design.py):
    every present input of the step, then the outputs. `read` maps input index -> the Operand the design reads;
    an input it does not stream (a runtime position, which reaches the DMAs as a scratchpad word) is declared
    and left unread. Returns the tensors and the position of each input index among them."""
    seq, at = [], {}
    for i, name in enumerate(step.inputs):
        if name is not None:
            at[i] = len(seq)
            seq.append(read[i] if i in read else operand(name, buffers[name]))
    return seq + list(outs), at


def sequence_of(step, tensors) -> list[int]:
    """params["sequence"] of a design: the position, among the step's operands as the fused design passes them
    (present inputs, then outputs), of the buffer behind each tensor its runtime sequence declares, in order. A
    buffer named twice is one view of the arenas (the fused design shares a device only with the same repeats):
    each tensor takes its buffer's first place not yet taken, else its first place (GLU reads its input twice)."""
    run = [n for n in (*step.inputs, *step.outputs) if n is not None]
    stray = [t.name for t in tensors if t.name not in run]
    if stray:
        raise DesignError(f"runtime-sequence tensors {stray} are not operands of the step")
    at: list[int] = []
    for t in tensors:
        at.append(next((i for i, n in enumerate(run) if n == t.name and i not in at), run.index(t.name)))
    return at


def widened_rows(o: Operand, buffer, width: int) -> np.ndarray | None:
    """The operand's rows ([..., K], each contiguous in its buffer) read `width` >= K elements wide, on into the
    rest of their stored row: the padding the compiler's memory plan gives a GEMM output ([..., Np], read through
    a slice of its first N columns). [rows, width] indices, or None when a row would leave its stored row."""
    K = o.index.shape[-1]
    rows = o.index.reshape(-1, K)
    start = rows[:, :1]
    if not (rows == start + np.arange(K)).all() or ((start % buffer.shape[-1]) + width > buffer.shape[-1]).any():
        return None
    return start + np.arange(width)


def is_f32(o: Operand) -> int:
    return int(o.dtype == np.float32)
