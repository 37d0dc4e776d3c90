"""Operand access patterns: the element index of an operand (its view chain applied to an arange) read as an
address sequence into (size, stride) dimensions and split into buffer-descriptor-sized TensorAccessPatterns."""
from __future__ import annotations

import numpy as np

from kernels.design_error import DesignError
from kernels.step_operands import Operand


def wrapped(index: np.ndarray, total: int) -> list[np.ndarray]:
    """A 1-D `index` repeated to `total` elements (np.resize's order), as pieces that are each one affine pattern:
    the whole copies (a repeat, stride 0 outermost) and the remainder."""
    whole, rest = divmod(total, index.size)
    return ([np.broadcast_to(index, (whole, index.size))] if whole else []) + ([index[:rest]] if rest else [])


def dims_of(index: np.ndarray) -> tuple[int, list[tuple[int, int]]]:
    """(offset, [(size, stride), ...] outermost first) of the address sequence `index` (read in C order), with
    the fewest dimensions: the shape of the buffer descriptor(s) that read it. Raises when no affine pattern
    produces the sequence."""
    flat = np.asarray(index).reshape(-1)
    if flat.size == 0:
        raise DesignError("an empty transfer")
    offset, dims = int(flat[0]), []
    while flat.size > 1:
        step = int(flat[1] - flat[0])
        run = int(np.argmax(np.diff(flat) != step)) + 1 if (np.diff(flat) != step).any() else flat.size
        for size in range(run, 0, -1):  # the longest run that tiles the sequence into equal blocks
            if flat.size % size == 0 and size > 1:
                blocks = flat.reshape(-1, size)
                if (np.diff(blocks, axis=1) == step).all():
                    break
        else:
            raise DesignError("an operand view is not an affine access pattern")
        dims.append((size, step))
        flat = blocks[:, 0]
    if not dims:
        dims = [(1, 1)]
    dims.reverse()
    if dims[-1][1] != 1 and len(dims) >= 1 and np.asarray(index).shape and np.asarray(index).shape[-1] == 1:
        dims.append((1, 1))  # a run of one element per step (a scalar per piece)
    return offset, dims


def taps(io, operand_: Operand, index: np.ndarray, max_dims: int = 4) -> list:
    """TensorAccessPatterns over the operand's tensor that read `index` in order: one per buffer descriptor.
    A pattern with more dimensions than a descriptor has, that steps by 0 in any but its outermost dimension,
    or that is not affine as a whole (a shifted last tile), is split along its outermost dimension."""
    try:
        offset, dims = dims_of(index)
    except DesignError:
        if index.ndim < 2:
            raise
        return [t for run in _affine_runs(index) for t in taps(io, operand_, run, max_dims)]
    if dims[-1][1] != 1 and dims[-1][0] > 1:
        raise DesignError(f"operand {operand_.name}: its innermost access stride is {dims[-1][1]} elements; the "
                          f"DMAs move 32-bit words, so an element-granular transpose needs kernels/transpose")
    # a shim buffer descriptor steps by 0 only in its outermost dimension, the repeat (mlir-aie verifies every
    # other stride of aiex.npu.dma_memcpy_nd non-zero, a constraint of the descriptors: mlir-aie#2308), so a
    # pattern that repeats inside is split until the repeat is outermost
    if len(dims) <= max_dims and not any(s == 0 for _, s in dims[1:]):
        sizes = [1] * (4 - len(dims)) + [n for n, _ in dims]
        strides = [0] * (4 - len(dims)) + [s for _, s in dims]
        return [io.TensorAccessPattern((operand_.elements,), offset, sizes, strides)]
    if len(dims) <= max_dims and index.ndim >= 2:  # a repeat inside: runs of rows whose repeat is outermost
        return [t for run in _runs(index, lambda r: _repeats_outermost(r, max_dims))
                for t in taps(io, operand_, run, max_dims)]
    return [t for i in range(index.shape[0]) for t in taps(io, operand_, index[i], max_dims)]


def _repeats_outermost(index: np.ndarray, max_dims: int) -> bool:
    try:
        _, dims = dims_of(index)
    except DesignError:
        return False
    return len(dims) <= max_dims and not any(s == 0 for _, s in dims[1:])


def _runs(index: np.ndarray, ok) -> list[np.ndarray]:
    """Split along the first axis into consecutive runs, each as long as `ok` allows (found by bisection; a run
    of one row is taken as it is): a per-head bias repeated over each head's rows becomes one transfer per head."""
    runs, i, n = [], 0, index.shape[0]
    while i < n:
        lo, hi = i + 1, n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if ok(index[i:mid]):
                lo = mid
            else:
                hi = mid - 1
        runs.append(index[i] if lo == i + 1 else index[i:lo])
        i = lo
    return runs


def _affine_runs(index: np.ndarray) -> list[np.ndarray]:
    """Split along the first axis into the fewest consecutive runs that are each affine (edge rows clamped
    into an image break the pattern only at the edges)."""
    runs, i, n = [], 0, index.shape[0]
    while i < n:
        j = i + 1
        while j < n and _affine(index[i:j + 1]):
            j += 1
        runs.append(index[i] if j == i + 1 else index[i:j])
        i = j
    return runs


def _affine(index: np.ndarray) -> bool:
    try:
        dims_of(index)
        return True
    except DesignError:
        return False
