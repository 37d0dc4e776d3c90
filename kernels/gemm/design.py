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

from kernels import dataflow as df
from sdk.compiler.hardware import TARGETS

KINDS = ("gemm", "bmm")


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


def build(target: str, step, buffers: dict, params: dict):
    io = df.iron()
    hw = TARGETS[target]
    t = step.attrs["tiling"]
    M, K, N, m, k, n = t["M"], t["K"], t["N"], t["m"], t["k"], t["n"]
    R, S, T = hw.mac_shape
    if m % R or k % S or n % T:
        raise df.DesignError(f"tile {m}x{k}x{n} is not a multiple of the {R}x{S}x{T} MAC shape")
    batch = t.get("batch", 1)  # a bmm with one B per batch slice: each slice's Mb rows of A with its own B
    Mb = M // batch
    n_operands = sum(1 for c in step.attrs["chain"] if c["operand"] is not None)
    if n_operands > 1:
        raise df.DesignError("a GEMM epilogue that reads an operand tile more than once (two residuals): "
                             "a core has two input DMA channels")
    Mt, Kt, Nt = batch * math.ceil(Mb / m), t["Kp"] // k, t["Np"] // n
    planes = t.get("weight_planes", 1) if step.op == "gemm" else 1  # split weights: hi and lo per B tile
    head_inputs = step.attrs.get("n_head", 3)

    a = df.operand(step.inputs[0], buffers[step.inputs[0]], step.attrs["views"][0])
    b_transposed = False  # B's objects are tiles of B^T (gemm_mac_bt)
    # a bmm output of N >= n columns off the tile is not padded (memory.pad_to_tiles): its last column tile
    # shifts to end at N, its first columns computed and written twice with the same values
    shifted_cols = step.op == "bmm" and N % n != 0 and N > n and not step.attrs.get("stored_width")

    def _col0(j: int) -> int:  # the first output column of column tile j
        return min(j * n, N - n) if shifted_cols else j * n
    if step.op == "gemm":
        a_idx = _a_rows(a, buffers[step.inputs[0]], K, t["Kp"], k)
        b = df.operand(step.inputs[1], buffers[step.inputs[1]])             # packed [planes, Kt, Nt, k, n]
        b_idx = b.index.reshape(planes, Kt, Nt, k * n).transpose(1, 2, 0, 3).reshape(1, Kt, Nt, planes * k * n)
        has_bias = step.inputs[2] is not None
        bias = df.operand(step.inputs[2], buffers[step.inputs[2]]) if has_bias else None
    else:
        b = df.operand(step.inputs[1], buffers[step.inputs[1]], step.attrs["views"][1])
        a_idx, b_idx, b_transposed = _bmm_operands(step, a, b, batch, Mb, K, N, k, n, Kt, Nt, _col0)
        has_bias, bias = False, None
    outs = [df.operand(o, buffers[o]) for o in step.outputs]
    if len({o.dtype for o in outs}) > 1:
        raise df.DesignError("merged projections whose outputs have different dtypes")
    splits = step.attrs.get("n_splits") or [N]
    if step.attrs.get("stored_width"):
        splits = [step.attrs["stored_width"]]  # padded to whole tiles by the memory plan (memory.pad_to_tiles)
    if any(x % n for x in splits) and not shifted_cols:
        raise df.DesignError(f"output columns {splits} are not multiples of the tile n = {n}: the output buffer "
                             f"needs padding to {t['Np']} columns")
    shift = _cache_rows(step, params, outs, splits, M)

    if n_operands or "prologue" in step.attrs or (M < R and step.op == "gemm"):
        # (M < R: the A transfers, one per K step, go in task groups so that shim buffer descriptors are reused)
        if step.op != "gemm" or (n_operands and len(outs) > 1):
            raise df.DesignError("an epilogue that reads an operand, on a bmm or merged projections: not expressed")
        return _build_per_core_a(target, step, params, a, a_idx, b, b_idx[0], bias, outs, buffers, shift, planes)
    grid = _grid(hw, Mt // batch, Nt, t["cores"], Mb, m, _widest(t))
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
    a_f32 = df.is_f32(a)
    a_ty, b_ty, c_ty = df.tensor(m * k, a.dtype), df.tensor(kb * n), df.tensor(m * n, outs[0].dtype)
    acc_ty = df.tensor(m * n, np.float32)
    vec_i, vec_f, i32 = df.tensor(df.MAX_CHAIN, np.int32), df.tensor(df.MAX_CHAIN, np.float32), np.int32
    kzero = io.Kernel("gemm_zero", "gemm.o", [acc_ty, i32, i32])
    kmac = io.Kernel("gemm_mac_bt" if b_transposed else "gemm_mac", "gemm.o",
                     [a_ty, i32, b_ty, i32, acc_ty, i32, i32, i32])
    bias_ty = df.tensor(max(jt * n, 1), np.float32)
    kbias = io.Kernel("gemm_bias_load", "gemm.o", [b_ty, bias_ty, i32, i32, i32, i32])
    kstore = io.Kernel("gemm_store", "gemm.o", [acc_ty, bias_ty, i32, i32, c_ty, i32, i32, i32, vec_i, i32, vec_f])
    words, imms = df.encode_chain(step.attrs["chain"], head_inputs)
    n_chain = len(step.attrs["chain"])

    # A: one stream per core row, blocked in the memtile, broadcast along the row
    a_l3 = [io.ObjectFifo(a_ty, depth=2, name=f"gemm_a{r}") for r in range(rows)]
    a_l2 = [a_l3[r].cons().forward(tile=io.Tile(r % cols, 1), name=f"gemm_a{r}_l2", depth=2,
                                   to_stream=df.stream_walk(io, blocking(m, k, R, S), m * k)) for r in range(rows)]
    # B: one stream per core column (the bias objects first), blocked in the memtile, down the column
    b_l3 = [io.ObjectFifo(b_ty, depth=2, name=f"gemm_b{c}") for c in range(cols)]
    b_blocks = blocking_transposed(n, k, T, S) if b_transposed else blocking(kb, n, S, T)
    b_l2 = [b_l3[c].cons().forward(tile=io.Tile(c, 1), name=f"gemm_b{c}_l2", depth=2,
                                   to_stream=df.stream_walk(io, b_blocks, kb * n)) for c in range(cols)]
    # C: joined per column in the memtile, each core's tile un-blocked on the way to the shim
    c_l3 = [io.ObjectFifo(df.tensor(rows * m * n, outs[0].dtype), depth=2, name=f"gemm_c{c}",
                          to_stream=df.stream_walk(io, unblocking(m, n, R, T), m * n)) for c in range(cols)]
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
                                     tile=io.Tile(c, 2 + r), stack_size=df.STACK_BYTES))

    operands, at = df.sequence_args(step, buffers, {0: a, 1: b, 2: bias}, outs)
    ends = df.RuntimeEnds(io)
    a_ends = [ends.fill(a_l3[r], shim[("a", r)]) for r in range(rows)]
    b_ends = [ends.fill(b_l3[c], shim[("b", c)]) for c in range(cols)]
    c_ends = [ends.drain(c_l3[c], c) for c in range(cols)]

    a_streams = [a_idx_tiles(a_idx, m, k, Kt, rows, r, it, jt, batch) for r in range(rows)]
    b_streams = []
    for c in range(cols):
        per_j = np.moveaxis(b_idx[:, :, c::cols], 2, 0)          # [jt, slices, Kt, object]
        b_streams.append(np.broadcast_to(per_j, (jt, it) + per_j.shape[2:]) if batch == 1 else per_j[:, b_slice])

    def part_transfers(jls, ils) -> list:
        """A part's transfers in stream order, (slot, tap, output) with slot "a" r, "b" c, "bias" c or "c" c:
        for each core row its A row tiles, for each core column its bias (first part only), B and C tiles."""
        found = []
        for r in range(rows):  # A row tiles i = r mod rows, for each of the core's column tiles
            found += [(("a", r), tap, None)
                      for tap in _a_taps(io, a, a_streams[r][jls.start:jls.stop, ils.start:ils.stop], Mb)]
        for c in range(cols):
            if has_bias and jls.start == ils.start == 0:  # first the column's bias tiles, to whole B objects
                bi = np.broadcast_to(bias.index.reshape(Nt, n)[c::cols][None], (bias_repeat, jt, n))
                found += [(("bias", c), tap, None) for tap in df.taps(io, bias, bi)]
            found += [(("b", c), tap, None)
                      for tap in df.taps(io, b, b_streams[c][jls.start:jls.stop, ils.start:ils.stop])]
            for jl in jls:  # the column's C objects, column tile by column tile, into their output
                j = jl * cols + c
                o = _owner(splits, j * n)
                lo = sum(splits[:o])
                oi = outs[o].index.reshape(-1, outs[o].shape[-1])
                tiles = np.stack([oi[tile_rows(i, m, M, rows, batch), _col0(j) - lo:_col0(j) + n - lo]
                                  for il in ils for i in [il * rows + r for r in range(rows)]])
                found += [(("c", c), tap, o) for tap in df.taps(io, outs[o], tiles)]
        return found

    def fits(part) -> bool:
        return df.fits_shim_bds([c if kind == "c" else shim[("a", c) if kind == "a" else ("b", c)]
                                 for (kind, c), _, _ in part], hw)

    # one part (everything in stream order, the default group) when its descriptors fit the shims; else task
    # groups of as many column tiles (then of as few row-tile groups of one column tile) as fit, so that shim
    # buffer descriptors are reused. A group's transfers feed only its own outputs: a core computes one column
    # tile over all its row tiles before the next.
    parts = [(range(jt), range(it))]
    transfers = [part_transfers(*parts[0])]
    grouped = not fits(transfers[0])
    for jn, il_n in [(j, it) for j in _group_sizes(jt)] + [(1, i) for i in _group_sizes(it)]:
        if not grouped or all(fits(part) for part in transfers):
            break
        parts = [(range(j0, min(jt, j0 + jn)), range(i0, min(it, i0 + il_n)))
                 for j0 in range(0, jt, jn) for i0 in range(0, it, il_n)]
        transfers = [part_transfers(jls, ils) for jls, ils in parts]
    ends_of = {**{("a", r): a_ends[r] for r in range(rows)}, **{("b", c): b_ends[c] for c in range(cols)},
               **{("bias", c): b_ends[c] for c in range(cols)}, **{("c", c): c_ends[c] for c in range(cols)}}

    def sequence(*args):
        out_args = args[len(args) - len(outs):]
        data = {"a": args[at[0]], "b": args[at[1]], "bias": args[at[2]] if has_bias else None}
        if any(shift):
            io.sync_parameters()
        for part in transfers:
            # grouped or not, every transfer of a part shares its group: v1.4.5 refuses a sequence that mixes
            # the default group with explicit ones (strict_task_groups), so the bias goes in the first group
            tg = io.TaskGroup() if grouped else None
            for slot, tap, o in part:
                if slot[0] == "c":
                    ends_of[slot].drain(out_args[o], tap=tap, group=tg, wait=True, offset_parameter=shift[o])
                else:
                    ends_of[slot].fill(data[slot[0]], tap=tap, group=tg)
            if grouped:
                tg.finish()
    params.update({"sequence": list(range(len(operands))),  # the run's operands, in order
                   "m": m, "k": k, "n": n, "mac": [R, S, T], "cores": cols * rows, "columns": cols, "rows": rows,
                   "tiles_per_core": it * jt, "k_steps": Kt, "batch": batch, "b_transposed": b_transposed,
                   "shifted_columns": shifted_cols})
    return df.program(io, target, operands, ends, workers, sequence)


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
            raise df.DesignError(f"bmm batch {lead} of {a.index.shape[-2]} rows against the tiling's {batch} of {Mb}")
        bk = np.broadcast_to(bk, lead + bk.shape[-2:]).reshape(batch, K, N)
        a_rows = np.broadcast_to(a.index, lead + a.index.shape[-2:]).reshape(batch * Mb, K)
    elif math.prod(bk.shape[:-2]) > 1:
        raise df.DesignError("bmm with a batched B that its tiling does not declare (no tiling batch): not "
                             "expressed by this design")
    else:
        bk, a_rows = bk.reshape(1, K, N), a.index.reshape(-1, K)
    if K % k:
        raise df.DesignError(f"bmm with K = {K} not a multiple of the tile k = {k}")
    cols = np.stack([col0(j) + np.arange(n) for j in range(Nt)])
    cols = np.minimum(cols, N - 1).reshape(-1)           # columns past N (the padding): the last one again
    if N == 1 or (np.diff(bk, axis=-1) == 1).all():       # rows of B contiguous: [k, n] tiles
        if (np.diff(cols.reshape(Nt, n), axis=-1) == 0).any():  # gemm_mac would not zero the columns past N
            raise df.DesignError(f"bmm with K = {K}, N = {N} not multiples of the tile {k}x{n}")
        bk = bk[..., cols]
        return a_rows, bk.reshape(-1, Kt, k, Nt, n).transpose(0, 1, 3, 2, 4).reshape(-1, Kt, Nt, k * n), False
    bt = np.swapaxes(bk, -1, -2)                          # [slices, N, K]: the rows of B^T
    if K > 1 and not (np.diff(bt, axis=-1) == 1).all():
        raise df.DesignError(f"operand {b.name}: neither its rows nor its columns are contiguous; an "
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
        index, stride, limit = df.runtime_row(outs[o], M * splits[o], sw["views"], sw["axis"])
        outs[o] = outs[o].rows(index.reshape(M, splits[o]))
        at[o] = df.scratchpad_parameter(df.iron(), params, step.inputs[sw["pos"]], 0, stride, limit)
    return at


def _build_per_core_a(target, step, params, a, a_idx, b, b_idx, bias, outs, buffers, shift, planes):
    """GEMM with a residual add and / or a norm prologue: each core gets its own A stream (split per column in
    the memtile instead of broadcast along a core row). With a prologue the A row tiles stream once more per
    statistic before the K loop, and gamma / beta lead the B stream (after the bias) into L1; with a residual,
    after the K steps of each output tile the residual tile follows on the A stream as A-sized objects, read
    back by gemm_store_residual. A core still reads two streams."""
    io = df.iron()
    hw = TARGETS[target]
    t = step.attrs["tiling"]
    M, K, N, m, k, n = t["M"], t["K"], t["N"], t["m"], t["k"], t["n"]
    R, S, T = hw.mac_shape
    Mt, Kt, Nt = math.ceil(M / m), t["Kp"] // k, t["Np"] // n
    out = outs[0]
    slot = next((c["operand"] for c in step.attrs["chain"] if c["operand"] is not None), None)
    res_objs, per_obj, r = 0, 0, None
    if slot is not None:
        r = df.operand(step.inputs[slot], buffers[step.inputs[slot]], step.attrs["views"][slot])
        if r.dtype.itemsize < a.dtype.itemsize:
            raise df.DesignError("a bf16 residual beside an fp32 A: not expressed")
        if r.index.ndim == 1:   # one value per column (DINOv2's layer scale), the same for every row
            r_idx = np.broadcast_to(r.index, (M, N))
        else:
            r_idx = np.broadcast_to(r.index, tuple(r.index.shape[:-2]) + (r.index.shape[-2], N)).reshape(M, N) \
                if r.index.size != M * N else r.index.reshape(M, N)
        # the tile's elements in order fill A-sized objects (per_obj residual elements, whole rows of n), the
        # last one topped up with the tile's first rows again; gemm_residual reads them in that order
        a_bytes, r_bytes = m * k * a.dtype.itemsize, m * n * r.dtype.itemsize
        per_obj = a_bytes // r.dtype.itemsize
        res_objs = -(-r_bytes // a_bytes)
        if a_bytes % r.dtype.itemsize or per_obj % n or res_objs > 2:
            raise df.DesignError(f"a residual tile of {r_bytes} bytes does not pack into A objects of {a_bytes}")
    pro = step.attrs.get("prologue")
    gb = [df.operand(step.inputs[i], buffers[step.inputs[i]], step.attrs["views"][i]) for i in pro["operands"]] \
        if pro else []
    centred = int(bool(pro) and pro["op"] == "layer_norm")
    has_beta = int(len(gb) > 1)
    eps = float(pro["attrs"]["eps"]) if pro else 0.0
    if any(o.dtype != np.float32 for o in gb):
        raise df.DesignError("norm prologue weights that are not fp32 vectors")
    if pro and t["Kp"] != K:
        raise df.DesignError(f"a norm prologue over K = {K} padded to {t['Kp']}: the statistics would read the "
                             f"padding; needs a padded activation buffer and a masked sum")
    a_passes = 1 + (1 if pro else 0) + centred              # the A tiles stream once per statistic, then the K loop
    has_bias = bias is not None
    take = df.shim_allotter(hw)
    grid = None
    for cores in range(min(t["cores"], hw.cores), 0, -1):
        for rows in (4, 3, 2, 1):
            cols = cores // rows
            if cores % rows == 0 and Mt % rows == 0 and cols <= hw.columns and Nt % cols == 0 \
                    and 2 * cols <= hw.shim_channels * hw.columns and even_groups(M, m, rows) \
                    and Nt // cols <= _widest(t):
                grid = (cols, rows)
                break
        if grid:
            break
    cols, rows = grid
    it, jt = Mt // rows, Nt // cols
    kb = planes * k                                                   # rows of one B object
    g = math.gcd(2 * jt, kb)
    bias_objects, bias_repeat = (2 * jt // g, kb // g) if has_bias else (0, 0)
    floats_per_object = kb * n // 2
    a_f32, out_f32, r_f32 = df.is_f32(a), df.is_f32(out), (df.is_f32(r) if r is not None else 0)
    vec_objects = [math.ceil(K / floats_per_object) for _ in gb]  # gamma (and beta) after the bias on B
    a_ty, b_ty, c_ty = df.tensor(m * k, a.dtype), df.tensor(kb * n), df.tensor(m * n, out.dtype)
    acc_ty = df.tensor(m * n, np.float32)
    vec_i, vec_f, i32 = df.tensor(df.MAX_CHAIN, np.int32), df.tensor(df.MAX_CHAIN, np.float32), np.int32
    # bias, gamma and beta share one L1 vector type: gemm_bias_load loads all three (one MLIR signature)
    bias_ty = kvec_ty = df.tensor(max(jt * n, K if pro else 1), np.float32)
    st_ty, kpos_ty, an_ty = df.tensor(2 * m, np.float32), df.tensor(1, np.int32), df.tensor(m * k)
    kernels = [io.Kernel("gemm_zero", "gemm.o", [acc_ty, i32, i32]),
               io.Kernel("gemm_mac", "gemm.o", [a_ty, i32, b_ty, i32, acc_ty, i32, i32, i32]),
               io.Kernel("gemm_bias_load", "gemm.o", [b_ty, bias_ty, i32, i32, i32, i32]),
               io.Kernel("gemm_store_residual", "gemm.o", [acc_ty, bias_ty, i32, i32, c_ty, i32, i32, i32, vec_i,
                                                           i32, vec_f, a_ty, a_ty, i32, i32, i32]),
               io.Kernel("gemm_store", "gemm.o", [acc_ty, bias_ty, i32, i32, c_ty, i32, i32, i32, vec_i, i32, vec_f]),
               io.Kernel("gemm_prologue_begin", "gemm.o", [st_ty, kpos_ty, i32]),
               io.Kernel("gemm_prologue_sum", "gemm.o", [a_ty, i32, st_ty, i32, i32]),
               io.Kernel("gemm_prologue_squares", "gemm.o", [a_ty, i32, st_ty, i32, i32, i32, i32]),
               io.Kernel("gemm_prologue_mac", "gemm.o", [a_ty, i32, kvec_ty, kvec_ty, i32, st_ty, kpos_ty, an_ty, b_ty,
                                                        i32, acc_ty, i32, i32, i32, i32, i32, np.float32])]
    words, imms = df.encode_chain(step.attrs["chain"], step.attrs.get("n_head", 3))
    n_chain = len(step.attrs["chain"])

    a_l3 = [io.ObjectFifo(df.tensor(rows * m * k, a.dtype), depth=2, name=f"gemm_a_c{c}") for c in range(cols)]
    a_l2 = [a_l3[c].cons().split([q * m * k for q in range(rows)], tile=io.Tile(c, 1), obj_types=[a_ty] * rows,
                                 depths=[2] * rows, to_stream=[df.stream_walk(io, blocking(m, k, R, S), m * k)] * rows,
                                 names=[f"gemm_a_c{c}r{q}" for q in range(rows)]) for c in range(cols)]
    b_l3 = [io.ObjectFifo(b_ty, depth=2, name=f"gemm_b{c}") for c in range(cols)]
    b_l2 = [b_l3[c].cons().forward(tile=io.Tile(c, 1), name=f"gemm_b{c}_l2", depth=2,
                                   to_stream=df.stream_walk(io, blocking(kb, n, S, T), kb * n)) for c in range(cols)]
    c_l3 = [io.ObjectFifo(df.tensor(rows * m * n, out.dtype), depth=2, name=f"gemm_c{c}",
                          to_stream=df.stream_walk(io, unblocking(m, n, R, T), m * n)) for c in range(cols)]
    c_l2 = [c_l3[c].prod().join([q * m * n for q in range(rows)], tile=io.Tile(c, 1), obj_types=[c_ty] * rows,
                                depths=[2] * rows, names=[f"gemm_c{c}r{q}" for q in range(rows)]) for c in range(cols)]

    def body(a_in, b_in, c_out, acc, bias_buf, chain, imm, gamma, beta, st, kpos, a_norm, zero, mac, load_vec,
             store_res, store, begin, ksum, squares, pro_mac, tiles, k_steps):
        load_bias = load_vec
        for q in range(bias_objects):
            first = q * floats_per_object
            bt = b_in.acquire(1)
            load_bias(bt, bias_buf, first, max(0, min(floats_per_object, jt * n - first)), kb, n)
            b_in.release(1)
        for dst, count in zip((gamma, beta), vec_objects):
            for q in range(count):
                bt = b_in.acquire(1)
                load_vec(bt, dst, q * floats_per_object, min(floats_per_object, K - q * floats_per_object), kb, n)
                b_in.release(1)
        for jl in range(jt):
            for _ in io.range_(tiles // jt):
                zero(acc, m, n)
                if pro:
                    begin(st, kpos, m)
                    for stat in ((ksum,) if centred else ()) + (squares,):
                        for _ in io.range_(k_steps):
                            at = a_in.acquire(1)
                            if stat is ksum:
                                ksum(at, a_f32, st, m, k)
                            else:
                                squares(at, a_f32, st, m, k, K, centred)
                            a_in.release(1)
                for _ in io.range_(k_steps):
                    at, bt = a_in.acquire(1), b_in.acquire(1)
                    if pro:
                        pro_mac(at, a_f32, gamma, beta, has_beta, st, kpos, a_norm, bt, planes, acc, m, k, n, K, centred,
                                eps)
                    else:
                        mac(at, a_f32, bt, planes, acc, m, k, n)
                    a_in.release(1)
                    b_in.release(1)
                ct = c_out.acquire(1)
                if res_objs:
                    res = a_in.acquire(res_objs)  # one object, or an indexable pair
                    r0, r1 = (res[0], res[1]) if res_objs == 2 else (res, res)
                    store_res(acc, bias_buf, int(has_bias), jl * n, ct, out_f32, m, n, chain, n_chain, imm, r0, r1,
                              r_f32, a.dtype.itemsize, k)
                    a_in.release(res_objs)
                else:
                    store(acc, bias_buf, int(has_bias), jl * n, ct, out_f32, m, n, chain, n_chain, imm)
                c_out.release(1)

    workers = []
    for c in range(cols):
        for q in range(rows):
            bufs = [io.Buffer(acc_ty, name=f"gemm_acc_c{c}r{q}"), io.Buffer(bias_ty, name=f"gemm_bias_c{c}r{q}"),
                    io.Buffer(vec_i, initial_value=words, name=f"gemm_chain_c{c}r{q}"),
                    io.Buffer(vec_f, initial_value=imms, name=f"gemm_imm_c{c}r{q}")]
            if pro:  # the norm's gamma / beta for the whole K, its statistics, the normalised A tile
                bufs += [io.Buffer(kvec_ty, name=f"gemm_gamma_c{c}r{q}"), io.Buffer(kvec_ty, name=f"gemm_beta_c{c}r{q}"),
                         io.Buffer(st_ty, name=f"gemm_st_c{c}r{q}"), io.Buffer(kpos_ty, name=f"gemm_kpos_c{c}r{q}"),
                         io.Buffer(an_ty, name=f"gemm_anorm_c{c}r{q}")]
            else:
                bufs += [None] * 5
            workers.append(io.Worker(body, [a_l2[c][q].cons(), b_l2[c].cons(), c_l2[c][q].prod(), *bufs,
                                            *kernels, it * jt, Kt], tile=io.Tile(c, 2 + q),
                                     stack_size=df.STACK_BYTES))
    shims = {c: (take(c), take(c)) for c in range(cols)}           # (A + residual, B + bias) per column
    read = {0: a, 1: b, 2: bias, **({slot: r} if r is not None else {}),
            **(dict(zip(pro["operands"], gb)) if pro else {})}
    operands, at = df.sequence_args(step, buffers, read, outs)
    splits = step.attrs.get("n_splits") or [N]
    ends = df.RuntimeEnds(io)
    a_ends = [ends.fill(a_l3[c], shims[c][0]) for c in range(cols)]
    b_ends = [ends.fill(b_l3[c], shims[c][1]) for c in range(cols)]
    c_ends = [ends.drain(c_l3[c], c) for c in range(cols)]

    ends_of = {**{("a", c): (a_ends[c], shims[c][0]) for c in range(cols)},
               **{("b", c): (b_ends[c], shims[c][1]) for c in range(cols)},
               **{("c", c): (c_ends[c], c) for c in range(cols)}}

    def resident_transfers() -> list:
        """Each column's bias, gamma and beta, on its B stream, live for the whole sequence: (slot, data, tap)."""
        found = []
        for c in range(cols):
            if has_bias:
                bi = np.broadcast_to(bias.index.reshape(Nt, n)[c::cols][None], (bias_repeat, jt, n))
                found += [(("b", c), "bias", tap) for tap in df.taps(io, bias, bi)]
            for v, (vec, count) in enumerate(zip(gb, vec_objects)):  # gamma, beta: K floats, whole objects
                found += [(("b", c), ("gb", v), t) for piece in df.wrapped(vec.index, count * floats_per_object)
                          for t in df.taps(io, vec, piece)]
        return found

    def group_transfers(jl: int, ils: range, qs: slice, last: bool) -> list:
        """The B, A (and residual) tiles of column tile jl, row tiles ils and K steps qs; the drains with the
        last K steps: (slot, data, tap)."""
        found = []
        for c in range(cols):
            j = jl * cols + c
            bt = np.broadcast_to(b_idx[qs, j][None], (len(ils), len(range(Kt)[qs]), kb * n))
            found += [(("b", c), "b", tap) for tap in df.taps(io, b, bt)]
            for il in ils:
                row_sets = [tile_rows(il * rows + q, m, M, rows) for q in range(rows)]
                a_t = np.stack([a_idx[rs].reshape(m, Kt, k).transpose(1, 0, 2) for rs in row_sets], axis=1)
                a_t = np.broadcast_to(a_t[None], (a_passes,) + a_t.shape)[:, qs]  # [pass, Kt, core, m, k]
                found += [(("a", c), "a", tap) for tap in _a_taps(io, a, a_t, M)]
                if not res_objs or not last:
                    continue
                tiles = np.stack([r_idx[rs, j * n:(j + 1) * n] for rs in row_sets])  # [core, m, n]
                fill = np.resize(np.arange(m), res_objs * per_obj // n)            # rows, wrapping
                ri = tiles[:, fill].reshape(rows, res_objs, per_obj // n, n).transpose(1, 0, 2, 3)
                found += [(("a", c), "r", tap) for tap in df.taps(io, r, ri)]
            if not last:
                continue
            o = _owner(splits, j * n)
            lo = sum(splits[:o])
            oi = outs[o].index.reshape(-1, outs[o].shape[-1])
            tiles = np.stack([oi[tile_rows(il * rows + q, m, M, rows), j * n - lo:(j + 1) * n - lo]
                              for il in ils for q in range(rows)])
            found += [(("c", c), ("out", o), tap) for tap in df.taps(io, outs[o], tiles)]
        return found

    def plan(group_il: int, k_group: int) -> list:
        return [group_transfers(jl, range(il0, min(it, il0 + group_il)), slice(q0, min(Kt, q0 + k_group)),
                                q0 + k_group >= Kt)
                for jl in range(jt) for il0 in range(0, it, group_il) for q0 in range(0, Kt, k_group)]

    def fits(groups) -> bool:  # the resident group's descriptors stay live beside each group's, on the same shims
        return all(df.fits_shim_bds([ends_of[where][1] for where, _, _ in resident + g], hw) for g in groups)

    # row tiles, then K steps, per task group: as many as fit beside the resident transfers (several fifos may
    # share a shim: A, B and C of a column when the channels allow); the residual and drains go with the last
    # K steps. K steps split only with M < R rows repeating through each tile, where each is its own A transfer
    # (_a_taps); a prologue's statistics passes need every K step of a tile before its MACs.
    resident = resident_transfers()
    group_il, k_group = it, Kt
    groups = plan(group_il, k_group)
    while not fits(groups) and (group_il > 1 or (k_group > 1 and M < m and not pro)):
        if group_il > 1:
            group_il = (group_il + 1) // 2
        else:
            k_group = (k_group + 1) // 2
        groups = plan(group_il, k_group)

    def sequence(*args):
        data = {"a": args[at[0]], "b": args[at[1]], "r": args[at[slot]] if r is not None else None,
                "bias": args[at[2]] if has_bias else None,
                **{("gb", v): args[at[i]] for v, i in enumerate(pro["operands"] if pro else [])},
                **{("out", o): args[len(args) - len(outs) + o] for o in range(len(outs))}}
        if any(shift):
            io.sync_parameters()
        resident_group = io.TaskGroup()
        for (kind, c), key, tap in resident:
            ends_of[(kind, c)][0].fill(data[key], tap=tap, group=resident_group)
        for g in groups:
            tg = io.TaskGroup()
            for (kind, c), key, tap in g:
                if kind == "c":
                    ends_of[(kind, c)][0].drain(data[key], tap=tap, group=tg, wait=True, offset_parameter=shift[key[1]])
                else:
                    ends_of[(kind, c)][0].fill(data[key], tap=tap, group=tg)
            tg.finish()
        resident_group.finish()
    params.update({"sequence": list(range(len(operands))),  # the run's operands, in order
                   "m": m, "k": k, "n": n, "mac": [R, S, T], "cores": cols * rows, "columns": cols, "rows": rows,
                   "tiles_per_core": it * jt, "k_steps": Kt, "residual_objects": res_objs,
                   "prologue": pro["op"] if pro else None})
    return df.program(io, target, operands, ends, workers, sequence)


def a_idx_tiles(a_idx, m, k, Kt, rows, r, it, jt, batch=1):
    """A's stream for core row r: for each of its row tiles, the K steps, repeated for each column tile.
    `a_idx` is [M, Kt * k] (rows read on into their padding, see _a_rows)."""
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


def _a_taps(io, a, index: np.ndarray, M: int) -> list:
    """The transfers that read A's tiles `index` [..., m, k]. With M < m rows repeating through each tile, a tile
    is its own transfer, [m / M repeats, M rows, k], so that the repeat (stride 0) is the outermost dimension:
    the only one a shim buffer descriptor can step by 0 (a tile whose m is not a multiple of M splits into runs
    of distinct rows)."""
    m, k = index.shape[-2:]
    if M >= m:
        return df.taps(io, a, index)
    tiles = index.reshape(-1, m, k)
    return [t for tile in tiles for t in df.taps(io, a, tile.reshape(m // M, M, k) if m % M == 0 else tile)]


def _a_rows(a, buffer, K: int, Kp: int, k: int) -> np.ndarray:
    """A's element indices as [M, Kp]. When K is not a multiple of the tile k, each row reads on into its
    padding, which the memory plan gives a GEMM output (sdk/compiler/memory.py: pad_to_tiles); what is there is
    finite and meets the packed weight's zero rows."""
    if Kp == K:
        return a.index.reshape(-1, K)
    wide = df.widened_rows(a, buffer, Kp)
    if wide is None:
        raise df.DesignError(f"K = {K} is not a multiple of the tile k = {k}, and A's rows are not padded to "
                             f"{Kp}: needs a padded activation buffer")
    return wide


def _group_sizes(total: int) -> list[int]:
    """The sizes of 2, 3, ... total near-equal groups of `total` things, largest first."""
    return sorted({-(-total // g) for g in range(2, total + 1)}, reverse=True)


def _owner(splits, col: int) -> int:
    """Which output (of merged projections) holds output column `col`."""
    return int(np.searchsorted(np.cumsum(splits), col, side="right"))


def _widest(t) -> int:
    """Column tiles a core may take: its fp32 vectors (bias, gamma, beta) hold that many tiles' floats, within
    the catalog's L1 budget (catalog._vector)."""
    return max(1, t.get("vector", t["Np"]) // t["n"])


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
    raise df.DesignError("no grid of cores fits the DMA channels for this GEMM")


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
    df.main(build)
