"""bf16 GEMM design (catalog kinds `gemm` and `bmm`): C [M, N] = A [M, K] . B [K, N] (+ bias, epilogue), with
the catalog's tile (m, k, n) and its core count.

Cores form a grid of `cols` columns x `rows` rows. Core (c, r) computes the output tiles (i, j) with
i = r mod rows and j = c mod cols, looping j, then i, then the K steps, so that
- A's row tiles are broadcast along a row of cores (every core of row r reads the same A tiles in the same
  order) and B's column tiles down a column (every core of column c reads the same B tiles);
- B comes tile by tile from the weights arena, where sdk/compiler/layout.py packed it tile-major
  [K/k, N/n, k, n] (so one tile is one contiguous read), or, for `bmm`, from the scratch arena through the
  operand's access pattern; split weights (tiling weight_planes = 2, packed [2, K/k, N/n, k, n]) send each
  tile's hi and lo planes in one B object of twice the size, which gemm_mac runs both MAC passes over;
- the memtile blocks each A / B tile into the MAC shape (R x S x T: npu1 4x8x4, npu2 8x8x8) on its way to the
  core (to_stream), and un-blocks the C tiles it joins from the column's cores on the way out;
- the bias (fp32) rides with B: each column's B stream starts with the column's bias tiles (repeated to
  whole objects), which the core keeps in L1, so a core reads two streams (A; B); gemm_store adds the bias and
  runs the chain on the fp32 accumulator before the single store (kernels/gemm/gemm.cc). Epilogues that read
  an operand tile (residual adds), norm prologues and cache-write outputs are refused (kernels/README.md).
Shim and memtile DMA channels are allotted explicitly (`_channels`), and the grid shrinks until they fit.
"""
from __future__ import annotations

import math

import numpy as np

from kernels import access, design_cli, epilogue, scratchpad, task_groups
from kernels.design_error import DesignError
from kernels.gemm.per_core_a import build_per_core_a
from kernels.gemm.tiles import (a_idx_tiles, a_rows, a_taps, blocking, blocking_transposed, even_groups, owner,
                                tile_rows, unblocking, widest)
from kernels.iron_program import STACK_BYTES, RuntimeEnds, iron, program, stream_walk, tensor
from kernels.step_operands import is_f32, operand, sequence_args
from sdk.compiler.hardware import TARGETS

KINDS = ("gemm", "bmm")


def build(target: str, step, buffers: dict, params: dict):
    io = iron()
    hw = TARGETS[target]
    t = step.attrs["tiling"]
    M, K, N, m, k, n = t["M"], t["K"], t["N"], t["m"], t["k"], t["n"]
    R, S, T = hw.mac_shape
    if m % R or k % S or n % T:
        raise DesignError(f"tile {m}x{k}x{n} is not a multiple of the {R}x{S}x{T} MAC shape")
    batch = t.get("batch", 1)  # a bmm with one B per batch slice: each slice's Mb rows of A with its own B
    Mb = M // batch
    n_operands = sum(1 for c in step.attrs["chain"] if c["operand"] is not None)
    if n_operands > 1:
        raise DesignError("a GEMM epilogue that reads an operand tile more than once (two residuals): "
                          "a core has two input DMA channels")
    Mt, Kt, Nt = batch * math.ceil(Mb / m), t["Kp"] // k, t["Np"] // n
    planes = t.get("weight_planes", 1) if step.op == "gemm" else 1  # split weights: hi and lo per B tile
    head_inputs = step.attrs.get("n_head", 3)

    a = operand(step.inputs[0], buffers[step.inputs[0]], step.attrs["views"][0])
    b_transposed = False  # B's objects are tiles of B^T (gemm_mac_bt)
    # a bmm output of N >= n columns off the tile is not padded (memory.pad_to_tiles): its last column tile
    # shifts to end at N, its first columns computed and written twice with the same values
    shifted_cols = step.op == "bmm" and N % n != 0 and N > n and not step.attrs.get("stored_width")

    def _col0(j: int) -> int:  # the first output column of column tile j
        return min(j * n, N - n) if shifted_cols else j * n
    if step.op == "gemm":
        a_idx = a_rows(a, buffers[step.inputs[0]], K, t["Kp"], k)
        b = operand(step.inputs[1], buffers[step.inputs[1]])             # packed [planes, Kt, Nt, k, n]
        b_idx = b.index.reshape(planes, Kt, Nt, k * n).transpose(1, 2, 0, 3).reshape(1, Kt, Nt, planes * k * n)
        has_bias = step.inputs[2] is not None
        bias = operand(step.inputs[2], buffers[step.inputs[2]]) if has_bias else None
    else:
        b = operand(step.inputs[1], buffers[step.inputs[1]], step.attrs["views"][1])
        a_idx, b_idx, b_transposed = _bmm_operands(step, a, b, batch, Mb, K, N, k, n, Kt, Nt, _col0)
        has_bias, bias = False, None
    outs = [operand(o, buffers[o]) for o in step.outputs]
    if len({o.dtype for o in outs}) > 1:
        raise DesignError("merged projections whose outputs have different dtypes")
    splits = step.attrs.get("n_splits") or [N]
    if step.attrs.get("stored_width"):
        splits = [step.attrs["stored_width"]]  # padded to whole tiles by the memory plan (memory.pad_to_tiles)
    if any(x % n for x in splits) and not shifted_cols:
        raise DesignError(f"output columns {splits} are not multiples of the tile n = {n}: the output buffer "
                          f"needs padding to {t['Np']} columns")
    shift = _cache_rows(step, params, outs, splits, M)

    if n_operands or "prologue" in step.attrs or (M < R and step.op == "gemm"):
        # (M < R: the A transfers, one per K step, go in task groups so that shim buffer descriptors are reused)
        if step.op != "gemm" or (n_operands and len(outs) > 1):
            raise DesignError("an epilogue that reads an operand, on a bmm or merged projections: not expressed")
        return build_per_core_a(target, step, params, a, a_idx, b, b_idx[0], bias, outs, buffers, shift, planes)
    grid = _grid(hw, Mt // batch, Nt, t["cores"], Mb, m, widest(t))
    cols, rows, shim = grid["cols"], grid["rows"], grid["shim"]
    it, jt = Mt // rows, Nt // cols                                  # tiles per core along M and N
    # a group of row tiles (one per core row) lies within one batch slice, so a column's cores share its B
    b_slice = [il * rows * batch // Mt for il in range(it)]
    # the bias (fp32) leads each column's B stream: its jt tiles, repeated to whole B objects
    kb = planes * k                                                   # rows of one B object
    g = math.gcd(2 * jt, kb)
    bias_objects, bias_repeat = (2 * jt // g, kb // g) if has_bias else (0, 0)
    floats_per_object = kb * n // 2

    out_f32 = int(outs[0].dtype == np.float32)
    a_f32 = is_f32(a)
    a_ty, b_ty, c_ty = tensor(m * k, a.dtype), tensor(kb * n), tensor(m * n, outs[0].dtype)
    acc_ty = tensor(m * n, np.float32)
    vec_i, vec_f, i32 = tensor(epilogue.MAX_CHAIN, np.int32), tensor(epilogue.MAX_CHAIN, np.float32), np.int32
    kzero = io.Kernel("gemm_zero", "gemm.o", [acc_ty, i32, i32])
    kmac = io.Kernel("gemm_mac_bt" if b_transposed else "gemm_mac", "gemm.o",
                     [a_ty, i32, b_ty, i32, acc_ty, i32, i32, i32])
    bias_ty = tensor(max(jt * n, 1), np.float32)
    kbias = io.Kernel("gemm_bias_load", "gemm.o", [b_ty, bias_ty, i32, i32, i32, i32])
    kstore = io.Kernel("gemm_store", "gemm.o", [acc_ty, bias_ty, i32, i32, c_ty, i32, i32, i32, vec_i, i32, vec_f])
    words, imms = epilogue.encode_chain(step.attrs["chain"], head_inputs)
    n_chain = len(step.attrs["chain"])

    # A: one stream per core row, blocked in the memtile, broadcast along the row
    a_l3 = [io.ObjectFifo(a_ty, depth=2, name=f"gemm_a{r}") for r in range(rows)]
    a_l2 = [a_l3[r].cons().forward(tile=io.Tile(r % cols, 1), name=f"gemm_a{r}_l2", depth=2,
                                   to_stream=stream_walk(io, blocking(m, k, R, S), m * k)) for r in range(rows)]
    # B: one stream per core column (the bias objects first), blocked in the memtile, down the column
    b_l3 = [io.ObjectFifo(b_ty, depth=2, name=f"gemm_b{c}") for c in range(cols)]
    b_blocks = blocking_transposed(n, k, T, S) if b_transposed else blocking(kb, n, S, T)
    b_l2 = [b_l3[c].cons().forward(tile=io.Tile(c, 1), name=f"gemm_b{c}_l2", depth=2,
                                   to_stream=stream_walk(io, b_blocks, kb * n)) for c in range(cols)]
    # C: joined per column in the memtile, each core's tile un-blocked on the way to the shim
    c_l3 = [io.ObjectFifo(tensor(rows * m * n, outs[0].dtype), depth=2, name=f"gemm_c{c}",
                          to_stream=stream_walk(io, unblocking(m, n, R, T), m * n)) for c in range(cols)]
    c_l2 = [c_l3[c].prod().join([r * m * n for r in range(rows)], tile=io.Tile(c, 1),
                                obj_types=[c_ty] * rows, depths=[2] * rows,
                                names=[f"gemm_c{c}r{r}" for r in range(rows)]) for c in range(cols)]

    def body(a_in, b_in, c_out, acc, bias, chain, imm, zero, mac, load_bias, store, tiles, k_steps, b_count):
        for q in range(bias_objects):  # unrolled: a few objects, each with its constant slice of the bias
            first = q * floats_per_object
            bt = b_in.acquire(1)
            load_bias(bt, bias, first, max(0, min(floats_per_object, jt * n - first)), kb, n)
            b_in.release(1)
        for jl in range(jt):  # unrolled over column tiles: each knows its bias offset
            for _ in io.range_(tiles // jt):
                zero(acc, m, n)
                for _ in io.range_(k_steps):
                    at, bt = a_in.acquire(1), b_in.acquire(1)
                    mac(at, a_f32, bt, b_count[jl], acc, m, k, n)
                    a_in.release(1)
                    b_in.release(1)
                ct = c_out.acquire(1)
                store(acc, bias, int(has_bias), jl * n, ct, out_f32, m, n, chain, n_chain, imm)
                c_out.release(1)

    workers = []
    for c in range(cols):
        for r in range(rows):
            bufs = [io.Buffer(acc_ty, name=f"gemm_acc_c{c}r{r}"),
                    io.Buffer(bias_ty, name=f"gemm_bias_c{c}r{r}"),
                    io.Buffer(vec_i, initial_value=words, name=f"gemm_chain_c{c}r{r}"),
                    io.Buffer(vec_f, initial_value=imms, name=f"gemm_imm_c{c}r{r}")]
            # gemm_mac's weight planes, or gemm_mac_bt's columns within N, per column tile
            b_count = [min(n, N - _col0(jl * cols + c)) if b_transposed else planes for jl in range(jt)]
            workers.append(io.Worker(body, [a_l2[r].cons(), b_l2[c].cons(), c_l2[c][r].prod(), *bufs,
                                            kzero, kmac, kbias, kstore, it * jt, Kt, b_count],
                                     tile=io.Tile(c, 2 + r), stack_size=STACK_BYTES))

    operands, at = sequence_args(step, buffers, {0: a, 1: b, 2: bias}, outs)
    ends = RuntimeEnds(io)
    a_ends = [ends.fill(a_l3[r], shim[("a", r)]) for r in range(rows)]
    b_ends = [ends.fill(b_l3[c], shim[("b", c)]) for c in range(cols)]
    c_ends = [ends.drain(c_l3[c], c) for c in range(cols)]

    a_streams = [a_idx_tiles(a_idx, m, k, Kt, rows, r, it, jt, batch) for r in range(rows)]
    b_streams = []
    for c in range(cols):
        per_j = np.moveaxis(b_idx[:, :, c::cols], 2, 0)          # [jt, slices, Kt, object]
        b_streams.append(np.broadcast_to(per_j, (jt, it) + per_j.shape[2:]) if batch == 1 else per_j[:, b_slice])

    out_at = len(operands) - len(outs)  # the outputs' place among the sequence's tensors

    def part_transfers(jls, ils) -> list[task_groups.Transfer]:
        """A part's transfers in stream order: for each core row its A row tiles, for each core column its bias
        (first part only), B and C tiles (the drains awaited)."""
        found = []
        for r in range(rows):  # A row tiles i = r mod rows, for each of the core's column tiles
            found += [task_groups.Transfer(a_ends[r], shim[("a", r)], at[0], tap)
                      for tap in a_taps(io, a, a_streams[r][jls.start:jls.stop, ils.start:ils.stop], Mb)]
        for c in range(cols):
            if has_bias and jls.start == ils.start == 0:  # first the column's bias tiles, to whole B objects
                bi = np.broadcast_to(bias.index.reshape(Nt, n)[c::cols][None], (bias_repeat, jt, n))
                found += [task_groups.Transfer(b_ends[c], shim[("b", c)], at[2], tap)
                          for tap in access.taps(io, bias, bi)]
            found += [task_groups.Transfer(b_ends[c], shim[("b", c)], at[1], tap)
                      for tap in access.taps(io, b, b_streams[c][jls.start:jls.stop, ils.start:ils.stop])]
            for jl in jls:  # the column's C objects, column tile by column tile, into their output
                j = jl * cols + c
                o = owner(splits, j * n)
                lo = sum(splits[:o])
                oi = outs[o].index.reshape(-1, outs[o].shape[-1])
                tiles = np.stack([oi[tile_rows(i, m, M, rows, batch), _col0(j) - lo:_col0(j) + n - lo]
                                  for il in ils for i in [il * rows + r for r in range(rows)]])
                found += [task_groups.Transfer(c_ends[c], c, out_at + o, tap, drain=True, wait=True, offset=shift[o])
                          for tap in access.taps(io, outs[o], tiles)]
        return found

    # one part (everything in stream order, the default group) when its descriptors fit the shims; else task
    # groups of as many column tiles (then of as few row-tile groups of one column tile) as fit, so that shim
    # buffer descriptors are reused. A group's transfers feed only its own outputs: a core computes one column
    # tile over all its row tiles before the next. Grouped or not, every transfer of a part shares its group,
    # so the bias goes in the first group.
    parts = [(range(jt), range(it))]
    transfers = [part_transfers(*parts[0])]
    grouped = not task_groups.fit(transfers, hw)
    for jn, il_n in [(j, it) for j in _group_sizes(jt)] + [(1, i) for i in _group_sizes(it)]:
        if not grouped or task_groups.fit(transfers, hw):
            break
        parts = [(range(j0, min(jt, j0 + jn)), range(i0, min(it, i0 + il_n)))
                 for j0 in range(0, jt, jn) for i0 in range(0, it, il_n)]
        transfers = [part_transfers(jls, ils) for jls, ils in parts]

    def sequence(*args):
        if any(shift):
            io.sync_parameters()
        task_groups.issue(io, args, transfers, grouped=grouped)
    params.update({"sequence": list(range(len(operands))),  # the run's operands, in order
                   "m": m, "k": k, "n": n, "mac": [R, S, T], "cores": cols * rows, "columns": cols, "rows": rows,
                   "tiles_per_core": it * jt, "k_steps": Kt, "batch": batch, "b_transposed": b_transposed,
                   "shifted_columns": shifted_cols})
    return program(io, target, operands, ends, workers, sequence)


def _bmm_operands(step, a, b, batch, Mb, K, N, k, n, Kt, Nt, col0):
    """A bmm's A rows [batch x Mb, K] and B objects [slices, Kt, Nt, object]: B is an activation read through
    its access pattern, one per batch slice when the catalog says B is batched (else one for all the rows).
    B comes as [k, n] tiles of its rows when those are contiguous, else as [n, k] tiles of B^T when its columns
    are (the kernel is then gemm_mac_bt): a DMA cannot read a bf16 operand with an innermost stride other than 1.
    Column tile j covers B's columns col0(j) on (the last one shifted to end at N, when the output is not padded);
    rows of B^T past N (the output's padding to whole tiles) read its last row again; gemm_mac_bt zeroes them."""
    bk = b.index
    if step.attrs["head"]["attrs"].get("transpose_b", False) or step.attrs["head"]["op"] == "linear":
        bk = np.swapaxes(bk, -1, -2)
    if batch > 1:  # B (and A) broadcast to the output's batch slices
        lead = np.broadcast_shapes(a.index.shape[:-2], bk.shape[:-2])
        if math.prod(lead) != batch or a.index.shape[-2] != Mb:
            raise DesignError(f"bmm batch {lead} of {a.index.shape[-2]} rows against the tiling's {batch} of {Mb}")
        bk = np.broadcast_to(bk, lead + bk.shape[-2:]).reshape(batch, K, N)
        a_rows = np.broadcast_to(a.index, lead + a.index.shape[-2:]).reshape(batch * Mb, K)
    elif math.prod(bk.shape[:-2]) > 1:
        raise DesignError("bmm with a batched B that its tiling does not declare (no tiling batch): not "
                          "expressed by this design")
    else:
        bk, a_rows = bk.reshape(1, K, N), a.index.reshape(-1, K)
    if K % k:
        raise DesignError(f"bmm with K = {K} not a multiple of the tile k = {k}")
    cols = np.stack([col0(j) + np.arange(n) for j in range(Nt)])
    cols = np.minimum(cols, N - 1).reshape(-1)           # columns past N (the padding): the last one again
    if N == 1 or (np.diff(bk, axis=-1) == 1).all():       # rows of B contiguous: [k, n] tiles
        if (np.diff(cols.reshape(Nt, n), axis=-1) == 0).any():  # gemm_mac would not zero the columns past N
            raise DesignError(f"bmm with K = {K}, N = {N} not multiples of the tile {k}x{n}")
        bk = bk[..., cols]
        return a_rows, bk.reshape(-1, Kt, k, Nt, n).transpose(0, 1, 3, 2, 4).reshape(-1, Kt, Nt, k * n), False
    bt = np.swapaxes(bk, -1, -2)                          # [slices, N, K]: the rows of B^T
    if K > 1 and not (np.diff(bt, axis=-1) == 1).all():
        raise DesignError(f"operand {b.name}: neither its rows nor its columns are contiguous; an "
                          f"element-granular transpose in a bmm operand view")
    bt = bt[:, cols]                                      # rows past N: the last row again (zeroed by the kernel)
    return a_rows, bt.reshape(-1, Nt, n, Kt, k).transpose(0, 3, 1, 2, 4), True


def _cache_rows(step, params, outs, splits, M) -> list:
    """Outputs written into a KV cache at the runtime position (the step's state_writes) drain at the cache
    rows of position 0 plus the position's scratchpad word: their operands are replaced by those rows (in the
    output's [M, split] order), and the word of each is returned (None for a plain output)."""
    at = [None] * len(outs)
    for sw in step.attrs.get("state_writes", []):
        o = sw["output"]
        index, stride, limit = scratchpad.runtime_row(outs[o], M * splits[o], sw["views"], sw["axis"])
        outs[o] = outs[o].rows(index.reshape(M, splits[o]))
        at[o] = scratchpad.scratchpad_parameter(iron(), params, step.inputs[sw["pos"]], 0, stride, limit)
    return at


def _group_sizes(total: int) -> list[int]:
    """The sizes of 2, 3, ... total near-equal groups of `total` things, largest first."""
    return sorted({-(-total // g) for g in range(2, total + 1)}, reverse=True)


def _grid(hw, Mt, Nt, max_cores, M, m, widest):
    """The largest grid (cols | Nt, rows | Mt, its row-tile groups evenly spaced) within the catalog's core count
    whose streams fit the DMA channels: every stream into the array takes one shim MM2S channel (any column's shim); A row r passes
    memtile r mod cols, B of column c memtile c, and memtile c joins its column's C tiles."""
    for cores in range(min(max_cores, hw.cores), 0, -1):
        for rows in (4, 3, 2, 1):
            cols = cores // rows
            if cores % rows or Mt % rows or cols > hw.columns or Nt % cols or not even_groups(M, m, rows) \
                    or Nt // cols > widest:
                continue
            shim = _allot(hw, cols, rows)
            fits = shim is not None
            for c in range(cols):
                a_here = sum(1 for r in range(rows) if r % cols == c)
                fits &= a_here + 1 + rows <= hw.memtile_channels and a_here + 2 <= hw.memtile_channels
            if fits:
                return {"cols": cols, "rows": rows, "shim": shim}
    raise DesignError("no grid of cores fits the DMA channels for this GEMM")


def _allot(hw, cols, rows):
    """Shim column of every input stream (2 MM2S channels per shim), or None when they do not fit."""
    free = {c: hw.shim_channels for c in range(hw.columns)}
    shim = {}
    for key in [("b", c) for c in range(cols)] + [("a", r) for r in range(rows)]:
        home = key[1] % cols
        spot = next((c for c in [home] + sorted(free, key=lambda c: (-free[c], c)) if free[c] > 0), None)
        if spot is None:
            return None
        free[spot] -= 1
        shim[key] = spot
    return shim


if __name__ == "__main__":
    design_cli.main(build)
