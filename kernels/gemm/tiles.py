"""GEMM tiles (kernels/gemm/design.py and per_core_a.py): the rows and columns each output tile covers, the
stream walks that block a tile into the MAC shape and back, and the transfers that read A's tiles."""
from __future__ import annotations

import math

import numpy as np

from kernels import access
from kernels.design_error import DesignError
from kernels.step_operands import widened_rows


def blocking(rows: int, cols: int, r: int, c: int) -> list[tuple[int, int]]:
    """The stream walk (size, stride) that reads a row-major [rows, cols] tile in the kernel's blocked order
    [rows/r][cols/c][r][c]."""
    return [(rows // r, r * cols), (cols // c, c), (r, cols), (c, 1)]


def blocking_transposed(n: int, k: int, t: int, s: int) -> list[tuple[int, int]]:
    """The stream walk that reads a row-major [n, k] tile of B^T as [k/s][n/t][t][s]: B's blocks in gemm_mac's
    order, each one transposed (t x s), which gemm_mac_bt transposes back in registers."""
    return [(k // s, s), (n // t, t * k), (t, k), (s, 1)]


def unblocking(rows: int, cols: int, r: int, c: int) -> list[tuple[int, int]]:
    """The stream walk that reads a blocked [rows/r][cols/c][r][c] tile back in row-major order. On a join's
    output it walks each joined tile in turn (v1.4.5: a join output's to_stream is over one input's object)."""
    return [(rows // r, r * cols), (r, c), (cols // c, r * c), (c, 1)]


def a_idx_tiles(a_idx, m, k, Kt, rows, r, it, jt, batch=1):
    """A's stream for core row r: for each of its row tiles, the K steps, repeated for each column tile.
    `a_idx` is [M, Kt * k] (rows read on into their padding, see a_rows)."""
    M = a_idx.shape[0]
    tiles = np.stack([a_idx[tile_rows(i, m, M, rows, batch)] for i in range(r, rows * it, rows)])  # [it, m, Kp]
    tiles = tiles.reshape(it, m, Kt, k).transpose(0, 2, 1, 3)                          # [it, Kt, m, k]
    return np.broadcast_to(tiles[None], (jt, it, Kt, m, k))


def tile_rows(i: int, m: int, M: int, rows: int = 1, batch: int = 1) -> np.ndarray:
    """The A rows of row tile i, which are the output rows it drains to. Tiles go in groups of `rows` (one per
    core row); the last group is shifted up to end at M as a whole, so that its tiles stay evenly spaced (one
    transfer), their rows recomputed and written twice with the same values; when M is shorter than a group,
    the last tile alone. With fewer rows than the MAC shape (M < m = R, a projection of a few pooled rows) the M
    rows repeat through the tile: each is computed m / M times and written over with the same values, so no
    buffer needs padding rows. A bmm with one B per batch slice tiles each slice's M / batch rows so."""
    if batch > 1:
        Mb = M // batch
        s, i = divmod(i, math.ceil(Mb / m))
        return s * Mb + tile_rows(i, m, Mb, rows)
    if M < m:
        return np.arange(m) % M
    if M >= rows * m:
        start = min((i // rows) * rows * m, M - rows * m) + (i % rows) * m
    else:
        start = min(i * m, M - m)
    return np.arange(start, start + m)


def even_groups(M: int, m: int, rows: int) -> bool:
    """Whether every group of `rows` row tiles is evenly spaced (tile_rows), so that one transfer per K loop
    reads it: no shift, or a last group that shifts as a whole, or one tile per group."""
    return rows == 1 or M % m == 0 or M >= rows * m or M < m


def a_taps(io, a, index: np.ndarray, M: int) -> list:
    """The transfers that read A's tiles `index` [..., m, k]. With M < m rows repeating through each tile, a tile
    is its own transfer, [m / M repeats, M rows, k], so that the repeat (stride 0) is the outermost dimension:
    the only one a shim buffer descriptor can step by 0 (a tile whose m is not a multiple of M splits into runs
    of distinct rows)."""
    m, k = index.shape[-2:]
    if M >= m:
        return access.taps(io, a, index)
    tiles = index.reshape(-1, m, k)
    return [t for tile in tiles for t in access.taps(io, a, tile.reshape(m // M, M, k) if m % M == 0 else tile)]


def a_rows(a, buffer, K: int, Kp: int, k: int) -> np.ndarray:
    """A's element indices as [M, Kp]. When K is not a multiple of the tile k, each row reads on into its
    padding, which the memory plan gives a GEMM output (sdk/compiler/memory.py: pad_to_tiles); what is there is
    finite and meets the packed weight's zero rows."""
    if Kp == K:
        return a.index.reshape(-1, K)
    wide = widened_rows(a, buffer, Kp)
    if wide is None:
        raise DesignError(f"K = {K} is not a multiple of the tile k = {k}, and A's rows are not padded to "
                          f"{Kp}: needs a padded activation buffer")
    return wide


def owner(splits, col: int) -> int:
    """Which output (of merged projections) holds output column `col`."""
    return int(np.searchsorted(np.cumsum(splits), col, side="right"))


def widest(t) -> int:
    """Column tiles a core may take: its fp32 vectors (bias, gamma, beta) hold that many tiles' floats, within
    the catalog's L1 budget (catalog._vector)."""
    return max(1, t.get("vector", t["Np"]) // t["n"])
