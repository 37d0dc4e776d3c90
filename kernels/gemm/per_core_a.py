"""The GEMM design for steps whose A tiles each core needs for itself (kernels/gemm/design.py hands them over):
a residual add in the epilogue, a norm prologue, or fewer rows than the MAC shape (M < R), whose A transfers,
one per K step, go in task groups so that shim buffer descriptors are reused."""
from __future__ import annotations

import math

import numpy as np

from kernels import access, epilogue, shim_budget, task_groups
from kernels.design_error import DesignError
from kernels.gemm.tiles import a_taps, blocking, even_groups, owner, tile_rows, unblocking, widest
from kernels.iron_program import STACK_BYTES, RuntimeEnds, iron, program, stream_walk, tensor
from kernels.step_operands import is_f32, operand, sequence_args
from sdk.compiler.hardware import TARGETS


def build_per_core_a(target, step, params, a, a_idx, b, b_idx, bias, outs, buffers, shift, planes):
    """GEMM with a residual add and / or a norm prologue: each core gets its own A stream (split per column in
    the memtile instead of broadcast along a core row). With a prologue the A row tiles stream once more per
    statistic before the K loop, and gamma / beta lead the B stream (after the bias) into L1; with a residual,
    after the K steps of each output tile the residual tile follows on the A stream as A-sized objects, read
    back by gemm_store_residual. A core still reads two streams."""
    io = iron()
    hw = TARGETS[target]
    t = step.attrs["tiling"]
    M, K, N, m, k, n = t["M"], t["K"], t["N"], t["m"], t["k"], t["n"]
    R, S, T = hw.mac_shape
    Mt, Kt, Nt = math.ceil(M / m), t["Kp"] // k, t["Np"] // n
    out = outs[0]
    slot = next((c["operand"] for c in step.attrs["chain"] if c["operand"] is not None), None)
    res_objs, per_obj, r = 0, 0, None
    if slot is not None:
        r = operand(step.inputs[slot], buffers[step.inputs[slot]], step.attrs["views"][slot])
        if r.dtype.itemsize < a.dtype.itemsize:
            raise DesignError("a bf16 residual beside an fp32 A: not expressed")
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
            raise DesignError(f"a residual tile of {r_bytes} bytes does not pack into A objects of {a_bytes}")
    pro = step.attrs.get("prologue")
    gb = [operand(step.inputs[i], buffers[step.inputs[i]], step.attrs["views"][i]) for i in pro["operands"]] \
        if pro else []
    centred = int(bool(pro) and pro["op"] == "layer_norm")
    has_beta = int(len(gb) > 1)
    eps = float(pro["attrs"]["eps"]) if pro else 0.0
    if any(o.dtype != np.float32 for o in gb):
        raise DesignError("norm prologue weights that are not fp32 vectors")
    if pro and t["Kp"] != K:
        raise DesignError(f"a norm prologue over K = {K} padded to {t['Kp']}: the statistics would read the "
                          f"padding; needs a padded activation buffer and a masked sum")
    a_passes = 1 + (1 if pro else 0) + centred              # the A tiles stream once per statistic, then the K loop
    has_bias = bias is not None
    take = shim_budget.shim_allotter(hw)
    grid = None
    for cores in range(min(t["cores"], hw.cores), 0, -1):
        for rows in (4, 3, 2, 1):
            cols = cores // rows
            if cores % rows == 0 and Mt % rows == 0 and cols <= hw.columns and Nt % cols == 0 \
                    and 2 * cols <= hw.shim_channels * hw.columns and even_groups(M, m, rows) \
                    and Nt // cols <= widest(t):
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
    a_f32, out_f32, r_f32 = is_f32(a), is_f32(out), (is_f32(r) if r is not None else 0)
    vec_objects = [math.ceil(K / floats_per_object) for _ in gb]  # gamma (and beta) after the bias on B
    a_ty, b_ty, c_ty = tensor(m * k, a.dtype), tensor(kb * n), tensor(m * n, out.dtype)
    acc_ty = tensor(m * n, np.float32)
    vec_i, vec_f, i32 = tensor(epilogue.MAX_CHAIN, np.int32), tensor(epilogue.MAX_CHAIN, np.float32), np.int32
    # bias, gamma and beta share one L1 vector type: gemm_bias_load loads all three (one MLIR signature)
    bias_ty = kvec_ty = tensor(max(jt * n, K if pro else 1), np.float32)
    st_ty, kpos_ty, an_ty = tensor(2 * m, np.float32), tensor(1, np.int32), tensor(m * k)
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
    words, imms = epilogue.encode_chain(step.attrs["chain"], step.attrs.get("n_head", 3))
    n_chain = len(step.attrs["chain"])

    a_l3 = [io.ObjectFifo(tensor(rows * m * k, a.dtype), depth=2, name=f"gemm_a_c{c}") for c in range(cols)]
    a_l2 = [a_l3[c].cons().split([q * m * k for q in range(rows)], tile=io.Tile(c, 1), obj_types=[a_ty] * rows,
                                 depths=[2] * rows, to_stream=[stream_walk(io, blocking(m, k, R, S), m * k)] * rows,
                                 names=[f"gemm_a_c{c}r{q}" for q in range(rows)]) for c in range(cols)]
    b_l3 = [io.ObjectFifo(b_ty, depth=2, name=f"gemm_b{c}") for c in range(cols)]
    b_l2 = [b_l3[c].cons().forward(tile=io.Tile(c, 1), name=f"gemm_b{c}_l2", depth=2,
                                   to_stream=stream_walk(io, blocking(kb, n, S, T), kb * n)) for c in range(cols)]
    c_l3 = [io.ObjectFifo(tensor(rows * m * n, out.dtype), depth=2, name=f"gemm_c{c}",
                          to_stream=stream_walk(io, unblocking(m, n, R, T), m * n)) for c in range(cols)]
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
                                     stack_size=STACK_BYTES))
    shims = {c: (take(c), take(c)) for c in range(cols)}           # (A + residual, B + bias) per column
    read = {0: a, 1: b, 2: bias, **({slot: r} if r is not None else {}),
            **(dict(zip(pro["operands"], gb)) if pro else {})}
    operands, at = sequence_args(step, buffers, read, outs)
    splits = step.attrs.get("n_splits") or [N]
    ends = RuntimeEnds(io)
    a_ends = [ends.fill(a_l3[c], shims[c][0]) for c in range(cols)]
    b_ends = [ends.fill(b_l3[c], shims[c][1]) for c in range(cols)]
    c_ends = [ends.drain(c_l3[c], c) for c in range(cols)]

    out_at = len(operands) - len(outs)  # the outputs' place among the sequence's tensors

    def a_fill(c: int, arg: int, tap) -> task_groups.Transfer:  # A and the residual: the column's A stream
        return task_groups.Transfer(a_ends[c], shims[c][0], arg, tap)

    def b_fill(c: int, arg: int, tap) -> task_groups.Transfer:  # B, bias, gamma and beta: its B stream
        return task_groups.Transfer(b_ends[c], shims[c][1], arg, tap)

    def resident_transfers() -> list[task_groups.Transfer]:
        """Each column's bias, gamma and beta, on its B stream, live for the whole sequence."""
        found = []
        for c in range(cols):
            if has_bias:
                bi = np.broadcast_to(bias.index.reshape(Nt, n)[c::cols][None], (bias_repeat, jt, n))
                found += [b_fill(c, at[2], tap) for tap in access.taps(io, bias, bi)]
            for i, vec, count in zip(pro["operands"] if pro else [], gb, vec_objects):  # gamma, beta: K floats
                found += [b_fill(c, at[i], tap) for piece in access.wrapped(vec.index, count * floats_per_object)
                          for tap in access.taps(io, vec, piece)]
        return found

    def group_transfers(jl: int, ils: range, qs: slice, last: bool) -> list[task_groups.Transfer]:
        """The B, A (and residual) tiles of column tile jl, row tiles ils and K steps qs; the drains (awaited)
        with the last K steps, and without them each fifo's last fill awaited."""
        found = []
        for c in range(cols):
            j = jl * cols + c
            bt = np.broadcast_to(b_idx[qs, j][None], (len(ils), len(range(Kt)[qs]), kb * n))
            found += [b_fill(c, at[1], tap) for tap in access.taps(io, b, bt)]
            for il in ils:
                row_sets = [tile_rows(il * rows + q, m, M, rows) for q in range(rows)]
                a_t = np.stack([a_idx[rs].reshape(m, Kt, k).transpose(1, 0, 2) for rs in row_sets], axis=1)
                a_t = np.broadcast_to(a_t[None], (a_passes,) + a_t.shape)[:, qs]  # [pass, Kt, core, m, k]
                found += [a_fill(c, at[0], tap) for tap in a_taps(io, a, a_t, M)]
                if not res_objs or not last:
                    continue
                tiles = np.stack([r_idx[rs, j * n:(j + 1) * n] for rs in row_sets])  # [core, m, n]
                fill = np.resize(np.arange(m), res_objs * per_obj // n)            # rows, wrapping
                ri = tiles[:, fill].reshape(rows, res_objs, per_obj // n, n).transpose(1, 0, 2, 3)
                found += [a_fill(c, at[slot], tap) for tap in access.taps(io, r, ri)]
            if not last:
                continue
            o = owner(splits, j * n)
            lo = sum(splits[:o])
            oi = outs[o].index.reshape(-1, outs[o].shape[-1])
            tiles = np.stack([oi[tile_rows(il * rows + q, m, M, rows), j * n - lo:(j + 1) * n - lo]
                              for il in ils for q in range(rows)])
            found += [task_groups.Transfer(c_ends[c], c, out_at + o, tap, drain=True, wait=True, offset=shift[o])
                      for tap in access.taps(io, outs[o], tiles)]
        return found if last else task_groups.awaiting_last_fills(found)

    def plan(group_il: int, k_group: int) -> list:
        return [group_transfers(jl, range(il0, min(it, il0 + group_il)), slice(q0, min(Kt, q0 + k_group)),
                                q0 + k_group >= Kt)
                for jl in range(jt) for il0 in range(0, it, group_il) for q0 in range(0, Kt, k_group)]

    # row tiles, then K steps, per task group: as many as fit beside the resident transfers (several fifos may
    # share a shim: A, B and C of a column when the channels allow); the residual and drains go with the last
    # K steps. K steps split only with M < R rows repeating through each tile, where each is its own A transfer
    # (a_taps); a prologue's statistics passes need every K step of a tile before its MACs.
    resident = resident_transfers()
    group_il, k_group = it, Kt
    groups = plan(group_il, k_group)
    while not task_groups.fit(groups, hw, resident) and (group_il > 1 or (k_group > 1 and M < m and not pro)):
        if group_il > 1:
            group_il = (group_il + 1) // 2
        else:
            k_group = (k_group + 1) // 2
        groups = plan(group_il, k_group)

    def sequence(*args):
        if any(shift):
            io.sync_parameters()
        task_groups.issue(io, args, groups, resident=resident)
    params.update({"sequence": list(range(len(operands))),  # the run's operands, in order
                   "m": m, "k": k, "n": n, "mac": [R, S, T], "cores": cols * rows, "columns": cols, "rows": rows,
                   "tiles_per_core": it * jt, "k_steps": Kt, "residual_objects": res_objs,
                   "prologue": pro["op"] if pro else None})
    return program(io, target, operands, ends, workers, sequence)
