"""GEMV design for decode (a catalog `gemm` step with one activation row, M = 1): memory-bound, so the design
spreads the weight's column tiles over as many cores as the shim channels feed. The activation row is fetched
once and broadcast from a memtile to every core; each core streams its own packed weight tiles (the same
tile-major copy prefill's GEMM reads, straight from the weights arena: no blocking), preceded by its bias
tiles (fp32, kept in L1), and writes its output tiles back directly. Split weights (tiling weight_planes = 2,
packed [2, Kp/k, Np/n, k, n]) send each tile's hi and lo planes in one W object of twice the size, which gemv_mac
runs both MAC passes over. kernels/gemv/gemv.cc."""
from __future__ import annotations

import math

import numpy as np

from kernels import access, design_cli, epilogue, scratchpad, shim_budget
from kernels.design_error import DesignError
from kernels.iron_program import STACK_BYTES, RuntimeEnds, iron, program, tensor
from kernels.step_operands import is_f32, operand, sequence_args, widened_rows
from sdk.compiler.hardware import TARGETS

KINDS = ("gemm",)


def build(target: str, step, buffers: dict, params: dict):
    hw = TARGETS[target]
    t = step.attrs["tiling"]
    K, N, k, n = t["K"], t["N"], t["k"], t["n"]
    slots = [c["operand"] for c in step.attrs["chain"] if c["operand"] is not None]
    if len(slots) > 1:
        raise DesignError("GEMV with an epilogue that reads two operands: not expressed by this design")
    Kt, Nt = t["Kp"] // k, t["Np"] // n
    planes = t.get("weight_planes", 1)  # split weights: hi and lo per W tile
    x = operand(step.inputs[0], buffers[step.inputs[0]], step.attrs["views"][0])
    w = operand(step.inputs[1], buffers[step.inputs[1]])
    has_bias = step.inputs[2] is not None
    bias = operand(step.inputs[2], buffers[step.inputs[2]]) if has_bias else None
    outs = [operand(o, buffers[o]) for o in step.outputs]
    splits = step.attrs.get("n_splits") or [N]
    io = iron()
    at = [None] * len(outs)   # an output into a KV cache drains at its row 0 plus the position's scratchpad word
    for sw in step.attrs.get("state_writes", []):
        o = sw["output"]
        index, stride, limit = scratchpad.runtime_row(outs[o], splits[o], sw["views"], sw["axis"])
        outs[o] = outs[o].rows(index)
        at[o] = scratchpad.scratchpad_parameter(io, params, step.inputs[sw["pos"]], 0, stride, limit)
    if step.attrs.get("stored_width"):
        splits = [step.attrs["stored_width"]]  # padded to whole tiles by the memory plan (memory.pad_to_tiles)
    if any(s % n for s in splits):
        raise DesignError(f"output columns {splits} are not multiples of the tile n = {n}")
    # K not a multiple of k: the row reads on into its padding (a padded GEMM output), against the weight's
    # zero rows; else it repeats its last 32-bit word (a transfer of its own: a DMA repeats only in its outermost
    # dimension), which must leave whole words
    wide = widened_rows(x, buffers[step.inputs[0]], Kt * k) if Kt * k > K else None
    if K % k and wide is None and x.dtype.itemsize * (K % k) % 4:
        raise DesignError(f"K = {K} leaves a partial tile that is not whole words")
    limit = min(t["cores"], hw.columns * hw.shim_channels - 1, hw.columns * hw.shim_channels)
    jt = -(-Nt // limit)                # column tiles per core: as few as the cores allow
    cores = -(-Nt // jt)                # and as few cores as that takes
    kb = planes * k                     # rows of one W object
    g = math.gcd(2 * jt, kb)
    bias_objects, bias_repeat = (2 * jt // g, kb // g) if has_bias else (0, 0)
    floats_per_object = kb * n // 2
    x_f32, y_f32 = is_f32(x), is_f32(outs[0])
    r = operand(step.inputs[slots[0]], buffers[step.inputs[slots[0]]], step.attrs["views"][slots[0]]) \
        if slots else None
    if r is not None and (len(outs) > 1 or (2 * kb * n) % (n * r.dtype.itemsize)):
        raise DesignError("GEMV with an epilogue that reads an operand, on merged projections or odd tiles")
    r_repeat = 2 * kb * n // (n * r.dtype.itemsize) if r is not None else 0
    pro = step.attrs.get("prologue")
    gb = [operand(step.inputs[i], buffers[step.inputs[i]], step.attrs["views"][i]) for i in pro["operands"]] \
        if pro else []
    if pro and (Kt * k != K or any(o.dtype != np.float32 for o in gb)):
        raise DesignError("GEMV with a norm prologue over a padded K or non-fp32 weights: not expressed")
    centred, has_beta = int(bool(pro) and pro["op"] == "layer_norm"), int(len(gb) > 1)
    eps = float(pro["attrs"]["eps"]) if pro else 0.0
    x_passes = 1 + (1 if pro else 0) + centred            # the row streams once per statistic, then the K loop

    i32 = np.int32
    x_t, w_t, y_t = tensor(k, x.dtype), tensor(kb * n), tensor(n, outs[0].dtype)
    acc_t = tensor(n, np.float32)
    bias_t = kvec_t = tensor(max(jt * n if has_bias else 1, K if pro else 1), np.float32)  # gemv_bias_load fills all
    st_t, kpos_t, xn_t = tensor(2, np.float32), tensor(1, np.int32), tensor(k)
    vec_i, vec_f = tensor(epilogue.MAX_CHAIN, np.int32), tensor(epilogue.MAX_CHAIN, np.float32)
    kernels = [io.Kernel("gemv_zero", "gemv.o", [acc_t, i32]),
               io.Kernel("gemv_mac", "gemv.o", [x_t, i32, w_t, i32, acc_t, i32, i32]),
               io.Kernel("gemv_bias_load", "gemv.o", [w_t, bias_t, i32, i32]),
               io.Kernel("gemv_store", "gemv.o", [acc_t, bias_t, i32, i32, y_t, i32, i32, vec_i, i32, vec_f]),
               io.Kernel("gemv_store_residual", "gemv.o", [acc_t, bias_t, i32, i32, y_t, i32, i32, vec_i, i32, vec_f,
                                                           w_t, i32]),
               io.Kernel("gemv_prologue_begin", "gemv.o", [st_t, kpos_t]),
               io.Kernel("gemv_prologue_sum", "gemv.o", [x_t, i32, st_t, i32]),
               io.Kernel("gemv_prologue_squares", "gemv.o", [x_t, i32, st_t, i32, i32, i32]),
               io.Kernel("gemv_prologue_mac", "gemv.o", [x_t, i32, kvec_t, kvec_t, i32, st_t, kpos_t, xn_t, w_t, i32,
                                                        acc_t, i32, i32, i32, i32, np.float32])]
    vec_objects = [math.ceil(K / floats_per_object) for _ in gb]
    words, imms = epilogue.encode_chain(step.attrs["chain"], 3)
    n_chain = len(step.attrs["chain"])

    def body(x_in, w_in, y_out, acc, bias_buf, chain, imm, gamma, beta, st, kpos, x_norm, zero, mac, load_bias,
             store, store_res, begin, ksum, squares, pro_mac, k_steps):
        for q in range(bias_objects):
            first = q * floats_per_object
            wt = w_in.acquire(1)
            load_bias(wt, bias_buf, first, max(0, min(floats_per_object, jt * n - first)))
            w_in.release(1)
        for dst, count in zip((gamma, beta), vec_objects):
            for q in range(count):
                wt = w_in.acquire(1)
                load_bias(wt, dst, q * floats_per_object, min(floats_per_object, K - q * floats_per_object))
                w_in.release(1)
        for jl in range(jt):  # unrolled: each column tile knows its bias offset
            zero(acc, n)
            if pro:
                begin(st, kpos)
                for stat in ((ksum,) if centred else ()) + (squares,):
                    for _ in io.range_(k_steps):
                        xt = x_in.acquire(1)
                        if stat is ksum:
                            ksum(xt, x_f32, st, k)
                        else:
                            squares(xt, x_f32, st, k, K, centred)
                        x_in.release(1)
            for _ in io.range_(k_steps):
                xt, wt = x_in.acquire(1), w_in.acquire(1)
                if pro:
                    pro_mac(xt, x_f32, gamma, beta, has_beta, st, kpos, x_norm, wt, planes, acc, k, n, K, centred, eps)
                else:
                    mac(xt, x_f32, wt, planes, acc, k, n)
                x_in.release(1)
                w_in.release(1)
            y = y_out.acquire(1)
            if r is not None:  # the residual slice follows the tile's weights on the W stream
                rt_obj = w_in.acquire(1)
                store_res(acc, bias_buf, int(has_bias), jl * n, y, y_f32, n, chain, n_chain, imm, rt_obj,
                          is_f32(r))
                w_in.release(1)
            else:
                store(acc, bias_buf, int(has_bias), jl * n, y, y_f32, n, chain, n_chain, imm)
            y_out.release(1)

    take = shim_budget.shim_allotter(hw)
    read = {0: x, 1: w, 2: bias, **({slots[0]: r} if r is not None else {}),
            **(dict(zip(pro["operands"], gb)) if pro else {})}
    operands, pos_of = sequence_args(step, buffers, read, outs)   # input index -> runtime tensor
    x_l3 = io.ObjectFifo(x_t, depth=2, name="gemv_x")
    x_bc = x_l3.cons().forward(tile=io.Tile(0, 1), name="gemv_x_bc", depth=2)
    x_shim = take(0)
    workers, fills, drains = [], [], []
    xi = x.index.reshape(-1) if wide is None else wide.reshape(-1)
    if xi.size < Kt * k:  # the K padding multiplies B's zero rows: any x values do
        per_word = 4 // x.dtype.itemsize
        tail = np.broadcast_to(xi[-per_word:], ((Kt * k - K) // per_word, per_word))
        x_reads = [xi, tail] * (jt * x_passes)   # per column tile: stats, then K loop
    else:
        x_reads = [np.broadcast_to(xi.reshape(Kt, k)[None], (jt, x_passes, Kt, k))]
    wi = w.index.reshape(planes, Kt, Nt, k * n).transpose(1, 2, 0, 3).reshape(Kt, Nt, kb * n)
    for c in range(cores):
        col, row = c % hw.columns, 2 + c // hw.columns
        w_fifo = io.ObjectFifo(w_t, depth=2, name=f"gemv_w{c}")
        y_fifo = io.ObjectFifo(y_t, depth=2, name=f"gemv_y{c}")
        bufs = [io.Buffer(acc_t, name=f"gemv_acc{c}"), io.Buffer(bias_t, name=f"gemv_bias{c}"),
                io.Buffer(vec_i, initial_value=words, name=f"gemv_chain{c}"),
                io.Buffer(vec_f, initial_value=imms, name=f"gemv_imm{c}")]
        bufs += ([io.Buffer(kvec_t, name=f"gemv_gamma{c}"), io.Buffer(kvec_t, name=f"gemv_beta{c}"),
                  io.Buffer(st_t, name=f"gemv_st{c}"), io.Buffer(kpos_t, name=f"gemv_kpos{c}"),
                  io.Buffer(xn_t, name=f"gemv_xnorm{c}")] if pro else [None] * 5)
        workers.append(io.Worker(body, [x_bc.cons(), w_fifo.cons(), y_fifo.prod(), *bufs, *kernels, Kt],
                                 tile=io.Tile(col, row), stack_size=STACK_BYTES))
        shim = take(col)
        # core c's column tiles: jt consecutive ones (within one output of merged projections where their widths
        # allow: one drain); the last core, past Nt, shifts back to end at Nt and recomputes the tiles it shares
        # with the core before (written again, same values), so that its tiles stay evenly spaced: one transfer
        # for its bias and weights, not one per repeat of a clamped tile
        first = min(c * jt, Nt - jt)
        mine = list(range(first, first + jt))
        if has_bias:
            bi = np.broadcast_to(bias.index.reshape(Nt, n)[mine][None], (bias_repeat, jt, n))
            fills.append((w_fifo, pos_of[2], bi, shim))
        for g_i, (vec, count) in enumerate(zip(gb, vec_objects)):  # gamma, beta: K floats as whole objects
            for piece in access.wrapped(vec.index, count * floats_per_object):
                fills.append((w_fifo, pos_of[pro["operands"][g_i]], piece, shim))
        if r is None:
            fills.append((w_fifo, 1, wi[:, mine].transpose(1, 0, 2), shim))
        else:  # per column tile: its weights, then its residual slice repeated to one W object
            for j in mine:
                fills.append((w_fifo, 1, wi[:, j], shim))
                fills.append((w_fifo, pos_of[slots[0]], np.broadcast_to(r.index.reshape(-1)[j * n:(j + 1) * n],
                                                                          (r_repeat, n)), shim))
        owner = [int(np.searchsorted(np.cumsum(splits), j * n, side="right")) for j in mine]
        for o in sorted(set(owner)):  # one drain per output: the core's tiles of it, in order
            lo = sum(splits[:o])
            drains.append((y_fifo, o, np.stack([outs[o].index.reshape(-1)[j * n - lo:(j + 1) * n - lo]
                                                for j, oj in zip(mine, owner) if oj == o]), col))

    ends = RuntimeEnds(io)
    x_end = ends.fill(x_l3, x_shim)
    fills = [(ends.fill(fifo, shim), i, idx) for fifo, i, idx, shim in fills]
    drains = [(ends.drain(fifo, col), o, idx) for fifo, o, idx, col in drains]

    def sequence(*args):
        if any(a is not None for a in at):
            io.sync_parameters()
        for tap in (t for part in x_reads for t in access.taps(io, x, part)):  # the broadcast row, x_passes times
            x_end.fill(args[0], tap=tap)                                     # per column tile
        for end, i, idx in fills:
            for tap in access.taps(io, operands[i], idx):
                end.fill(args[i], tap=tap)
        for end, o, idx in drains:
            for tap in access.taps(io, outs[o], idx):
                end.drain(args[len(operands) - len(outs) + o], tap=tap, wait=True, offset_parameter=at[o])
    params.update({"sequence": list(range(len(operands))),  # the run's operands, in order
                   "k": k, "n": n, "cores": cores, "tiles_per_core": jt, "k_steps": Kt})
    return program(io, target, operands, ends, workers, sequence)


if __name__ == "__main__":
    design_cli.main(build)
