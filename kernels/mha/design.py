"""Multi-head attention design (catalog kind `mha`), prefill and decode against a KV cache alike: a work item
is one (head, query tile); a core holds its q tile and streams the head's key blocks three times (max, sum of
exps, probabilities x V; kernels/mha/mha.cc), each block's k, v and mask rows joined in the memtile into one
object, so a core reads two streams (q; k+v+mask). A key-padding mask, the same for every query row, is one
row per block that the kernel broadcasts. Decode is a query tile of one row over the cache, whose
unwritten tail the causal-cache mask hides. Each core's four input streams take two shims, so at most
columns / 2 cores run (attention at these sizes is bandwidth-bound). An output stored [B, T, H, D] (step attrs
stored_perm, sdk/compiler/memory.interleave_heads) takes each item's tq rows of d strided by H * d."""
from __future__ import annotations

import math

import numpy as np

from kernels import access, design_cli, epilogue, shim_budget, task_groups
from kernels.design_error import DesignError
from kernels.iron_program import BF16, STACK_BYTES, RuntimeEnds, iron, program, tensor
from kernels.step_operands import is_f32, operand, sequence_of
from sdk.compiler.hardware import TARGETS

KINDS = ("mha",)
# transfers one sequence may issue: a practical bound, not the array's: each is a descriptor write and a queue
# push in the instruction stream (tens of bytes), so this is several MB of instructions per run
MAX_TRANSFERS = 1 << 17


def build(target: str, step, buffers: dict, params: dict):
    hw = TARGETS[target]
    t = step.attrs["tiling"]
    if any(c["operand"] is not None for c in step.attrs["chain"]):
        raise DesignError("attention with an epilogue that reads an operand: not expressed by this design")
    q = operand(step.inputs[0], buffers[step.inputs[0]], step.attrs["views"][0])
    k = operand(step.inputs[1], buffers[step.inputs[1]], step.attrs["views"][1])
    v = operand(step.inputs[2], buffers[step.inputs[2]], step.attrs["views"][2])
    has_mask = len(step.inputs) > 3 and step.inputs[3] is not None
    mask = operand(step.inputs[3], buffers[step.inputs[3]], step.attrs["views"][3]) if has_mask else None
    for o in (q, k, v):
        if o.dtype != BF16:
            raise DesignError(f"attention operand {o.name} is {o.dtype}; the kernel reads bf16")
    # a mask is bf16, or fp32 when its rows are an odd number of elements (the compiler stores it so: whole
    # 32-bit words for the DMAs; the kernel reads it by a negative mask_rows)
    mask_f32 = has_mask and is_f32(mask)
    if has_mask and not mask_f32 and mask.dtype != BF16:
        raise DesignError(f"attention mask {mask.name} is {mask.dtype}; the kernel reads bf16 or fp32")
    Tq, Tk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    tq = _query_tile(Tq, min(t["tq"], Tq))
    # a key block of tk rows: a bf16 mask's rows of tk elements are whole words when tk is even
    fits = [x for x in range(1, min(t["tk"], Tk) + 1) if Tk % x == 0 and (x % 2 == 0 or x == Tk or d % 2 == 0)]
    tk = max([x for x in fits if x % 2 == 0] if has_mask and not mask_f32 and Tk % 2 == 0 else fits)
    # a key mask (its index broadcast along the query rows: ESM-2's and GigaAM's key padding) goes as one row of
    # tk per key block, which the kernel broadcasts over the tile (mask_rows 1): an item's mask for all passes is
    # then one repeated run of Tk, not a transfer per (pass, key block)
    heads = math.prod(q.shape[:-2])
    mi = np.broadcast_to(mask.index, q.shape[:-1] + (Tk,)).reshape(heads, Tq, Tk) if has_mask else None
    m_rows = 1 if has_mask and (mi == mi[:, :1]).all() else tq
    if has_mask and not mask_f32 and (m_rows * tk) % 2:
        raise DesignError(f"a mask block of {m_rows} x {tk} bf16 is not whole 32-bit words: pad rows to even")
    q_tiles = math.ceil(Tq / tq)
    starts = [min(i * tq, Tq - tq) for i in range(q_tiles)]     # the last tile shifts back: rows written twice
    items = heads * q_tiles
    shims = hw.columns * hw.shim_channels
    streams = 3 + has_mask
    cores = max(c for c in range(1, min(t["cores"], hw.columns, shims // streams, items) + 1) if items % c == 0)
    per_core = items // cores
    blocks = Tk // tk

    qi = q.index.reshape(heads, Tq, d)
    ki, vi = k.index.reshape(heads, Tk, d), v.index.reshape(heads, Tk, d)
    out = operand(step.outputs[0], buffers[step.outputs[0]])
    oi = out.index.reshape(heads, Tq, d)
    if "stored_perm" in step.attrs:  # stored [B, T, H, D] (memory.interleave_heads): a tile is tq rows strided H * d
        B, H = q.shape[0], heads // q.shape[0]
        oi = out.index.reshape(B, Tq, H, d).transpose(0, 2, 1, 3).reshape(heads, Tq, d)
        params["batch"] = B
    y_f32 = is_f32(out)

    io = iron()
    i32, f32 = np.int32, np.float32
    kvm_units = 2 * tk * d + (m_rows * tk * (2 if mask_f32 else 1) if has_mask else 0)  # in bf16 units
    q_t, kvm_t, y_t = tensor(tq * d), tensor(kvm_units), tensor(tq * d, out.dtype)
    st_t, acc_t = tensor(2 * tq, np.float32), tensor(tq * d, np.float32)
    vec_i, vec_f = tensor(epilogue.MAX_CHAIN, np.int32), tensor(epilogue.MAX_CHAIN, np.float32)
    kernels = [io.Kernel("mha_begin", "mha.o", [st_t, acc_t, i32, i32]),
               io.Kernel("mha_max", "mha.o", [q_t, kvm_t, st_t, i32, i32, i32, f32, i32]),
               io.Kernel("mha_sum", "mha.o", [q_t, kvm_t, st_t, i32, i32, i32, f32, i32]),
               io.Kernel("mha_pv", "mha.o", [q_t, kvm_t, st_t, acc_t, i32, i32, i32, f32, i32]),
               io.Kernel("mha_store", "mha.o", [acc_t, y_t, i32, i32, i32, vec_i, i32, vec_f])]
    words, imms = epilogue.encode_chain(step.attrs["chain"], len(step.inputs))
    scale, n_chain = float(step.attrs["head"]["attrs"]["scale"]), len(step.attrs["chain"])
    mask_rows = m_rows * has_mask * (-1 if mask_f32 else 1)

    def body(q_in, kvm_in, y_out, st, acc, chain, imm, begin, kmax, ksum, pv, store, n_items, n_blocks):
        for _ in io.range_(n_items):
            qt = q_in.acquire(1)
            begin(st, acc, tq, d)
            for phase in (kmax, ksum):
                for _ in io.range_(n_blocks):
                    kv = kvm_in.acquire(1)
                    phase(qt, kv, st, tq, tk, d, scale, mask_rows)
                    kvm_in.release(1)
            for _ in io.range_(n_blocks):
                kv = kvm_in.acquire(1)
                pv(qt, kv, st, acc, tq, tk, d, scale, mask_rows)
                kvm_in.release(1)
            y = y_out.acquire(1)
            store(acc, y, y_f32, tq, d, chain, n_chain, imm)
            y_out.release(1)
            q_in.release(1)

    take = shim_budget.shim_allotter(hw)
    workers, fills, drains = [], [], []
    passes = 3
    for c in range(cores):
        mem, lo = io.Tile(c, 1), c * per_core
        my = [(it // q_tiles, starts[it % q_tiles]) for it in range(lo, lo + per_core)]   # (head, first row)
        q_l3 = io.ObjectFifo(q_t, depth=2, name=f"mha_q{c}")
        q_l2 = q_l3.cons().forward(tile=mem, name=f"mha_q{c}_l2", depth=1)
        kvm = io.ObjectFifo(kvm_t, depth=2, name=f"mha_kvm{c}")
        parts = kvm.prod().join([0, tk * d] + ([2 * tk * d] if has_mask else []), tile=mem,
                                obj_types=[tensor(tk * d)] * 2
                                + ([tensor(m_rows * tk, mask.dtype)] if has_mask else []),
                                depths=[2] * (2 + has_mask),
                                names=[f"mha_k{c}", f"mha_v{c}"] + [f"mha_m{c}"] * has_mask)
        y_l2 = io.ObjectFifo(y_t, depth=2, name=f"mha_y{c}")
        y_l3 = y_l2.cons().forward(tile=mem, name=f"mha_y{c}_l3", depth=2)
        bufs = [io.Buffer(st_t, name=f"mha_st{c}"), io.Buffer(acc_t, name=f"mha_acc{c}"),
                io.Buffer(vec_i, initial_value=words, name=f"mha_chain{c}"),
                io.Buffer(vec_f, initial_value=imms, name=f"mha_imm{c}")]
        workers.append(io.Worker(body, [q_l2.cons(), kvm.cons(), y_l2.prod(), *bufs, *kernels, per_core, blocks],
                                 tile=io.Tile(c, 2), stack_size=STACK_BYTES))
        key_rows = lambda a, h: np.broadcast_to(  # noqa: E731
            a[h].reshape(blocks, tk, d)[None], (passes, blocks, tk, d))
        fills.append((q_l3, 0, np.stack([qi[h, s:s + tq] for h, s in my]), take(c)))
        fills.append((parts[0], 1, np.stack([key_rows(ki, h) for h, _ in my]), take(c)))
        fills.append((parts[1], 2, np.stack([key_rows(vi, h) for h, _ in my]), take(c)))
        if has_mask:
            mrows = [np.broadcast_to(mi[h, s:s + m_rows].reshape(m_rows, blocks, tk).transpose(1, 0, 2)[None],
                                     (passes, blocks, m_rows, tk)) for h, s in my]
            fills.append((parts[2], 3, np.stack(mrows), take(c)))
        drains.append((y_l3, np.stack([oi[h, s:s + tq] for h, s in my]), c))

    operands = [q, k, v] + ([mask] if has_mask else []) + [out]
    ends = RuntimeEnds(io)
    fills = [(ends.fill(fifo, shim), shim, i, idx) for fifo, i, idx, shim in fills]
    drains = [(ends.drain(fifo, c), c, idx) for fifo, idx, c in drains]
    units = passes * blocks  # an item's key blocks, pass after pass

    def item_group(item: int, lo: int, hi: int) -> list[task_groups.Transfer]:
        """Key blocks lo..hi of one work item on every core, its q tile with the first blocks and its output with
        the last. A group that ends before the output awaits every fifo's last fill, so that freeing its
        descriptors frees none still moving data."""
        found = []
        for end, shim, i, idx in fills:
            if i == 0 and lo > 0:
                continue
            part = idx[item] if i == 0 else idx[item].reshape((units,) + idx.shape[3:])[lo:hi]
            found += [task_groups.Transfer(end, shim, i, tap) for tap in access.taps(io, operands[i], part)]
        if hi < units:
            return task_groups.awaiting_last_fills(found)
        for end, c, idx in drains:
            found += [task_groups.Transfer(end, c, len(operands) - 1, tap, drain=True, wait=True)
                      for tap in access.taps(io, out, idx[item])]
        return found

    # one task group per work item (on every core at once), or per few of its key blocks when an item's
    # transfers exceed a shim's descriptors (a pattern that one descriptor's four dimensions cannot hold, with its
    # repeat outermost, splits into many)
    def fits(groups) -> bool:
        return task_groups.fit(groups, hw)

    def plan_of(items, size: int) -> list:
        return [item_group(item, lo, min(units, lo + size)) for item in items for lo in range(0, units, size)]

    # the first and last items (the last one's query tile shifted back) settle the size
    blocks_per_group = units
    while blocks_per_group > 1 and not fits(plan_of({0, per_core - 1}, blocks_per_group)):
        blocks_per_group = (blocks_per_group + 1) // 2
    transfers = per_core * sum(len(g) for g in plan_of({0}, blocks_per_group))
    if transfers > MAX_TRANSFERS:
        raise DesignError(f"attention over {Tk} keys in blocks of {tk}: about {transfers} transfers (more than "
                          f"{MAX_TRANSFERS}) to fit the shims' {hw.shim_bds} buffer descriptors",
                          fix="pad the keys to a length with a larger divisor and mask the tail")
    plan = plan_of(range(per_core), blocks_per_group)

    def sequence(*args):
        task_groups.issue(io, args, plan)

    params.update({"tq": tq, "tk": tk, "d": d, "mask_rows": mask_rows, "heads": heads, "cores": cores,
                   "items_per_core": per_core, "blocks_per_group": blocks_per_group,
                   "sequence": sequence_of(step, operands)})
    return program(io, target, operands, ends, workers, sequence)


def _query_tile(Tq: int, tq: int) -> int:
    """The query tile: a divisor of Tq of at least half the catalog's tile when there is one (Whisper's 1500
    frames: 30), so that no tile overlaps another; else the catalog's, the last tile shifted back to end at Tq,
    its overlapping rows computed again and written twice with the same values (ViT's 197 tokens, a prime)."""
    return max((x for x in range(max(1, tq // 2), tq + 1) if Tq % x == 0), default=tq)


if __name__ == "__main__":
    design_cli.main(build)
