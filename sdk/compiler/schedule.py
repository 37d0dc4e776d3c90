"""Schedule and emit: an entry's kernels become program steps.

Consecutive NPU kernels form ONE dispatch step (its body lists the kernels in order); a host kernel ends the
dispatch before it and runs as a host step, so every host op costs a dispatch boundary and shows in the
counters. With every op on the NPU an entry is exactly one dispatch. Runtime parameters (position, valid
length) are IO buffers named in the dispatch's `params`: the device reads them each run (the scratchpad
parameters of a full-ELF dispatch), so one program serves every step without recompiling.
"""
from __future__ import annotations

from ..program import Buffer, Entry, Step
from .fuse import Fused, Kernel, Ref
from .layout import access_dims
from .memory import buffer_name
from .partition import node_flops


def emit(f: Fused, buffers: dict[str, Buffer]) -> Entry:
    def name_of(r):
        return None if r is None else (r.value if r.value in buffers else buffer_name(f, r.value))

    params = sorted(buffer_name(f, n) for n, v in f.values.items() if v.kind == "param")
    steps: list[Step] = []
    body: list[Step] = []

    def close_dispatch():
        if body:
            used = sorted({p for s in body for p in s.inputs if p in params})
            steps.append(Step("dispatch", f"{f.name}#{len([s for s in steps if s.kind == 'dispatch'])}", (), (),
                              {"params": used, "kernels": len(body)}, tuple(body)))
            body.clear()

    for i, k in enumerate(f.kernels):
        ins = tuple(name_of(r) for r in k.inputs)
        outs = tuple(name_of(Ref(v)) for v in k.outputs)
        views = [list(r.views) if r is not None else [] for r in k.inputs]
        if k.kind == "host":
            close_dispatch()
            steps.append(Step("host", k.head.op, ins, outs, {"attrs": dict(k.head.attrs), "views": views,
                                                              "reason": k.attrs["reason"]}))
            continue
        body.append(Step("kernel", k.kind, ins, outs, _kernel_attrs(f, k, views, buffers)))
    close_dispatch()
    inputs = {n: buffer_name(f, n) for n, v in f.values.items() if v.kind in ("input", "param")}
    outputs = {o: name_of(Ref(v)) for o, v in f.outputs.items()}
    return Entry(f.name, inputs, outputs, tuple(steps))


def _kernel_attrs(f: Fused, k: Kernel, views, buffers) -> dict:
    head = {"op": k.head.op, "attrs": dict(k.head.attrs)}
    attrs = {"name": k.nodes[0].output if k.nodes else k.outputs[0], "head": head, "chain": k.chain,
             "views": views, "tiling": k.attrs["tiling"], "flops": sum(node_flops(f.values, n) for n in k.nodes)}
    attrs["dims"] = [access_dims(f.values[r.value].shape, r.views) if r is not None and r.value in f.values else 1
                     for r in k.inputs]
    attrs["n_head"] = 3 if k.kind == "gemm" else len(k.head.inputs)
    if k.kind == "gemm":
        attrs["n_splits"] = list(k.attrs["n_splits"])
        for key in ("prologue", "state_writes"):
            if key in k.attrs:
                attrs[key] = k.attrs[key]
    if "stored_width" in k.attrs:  # a gemm or bmm output padded to whole tiles (memory.pad_to_tiles)
        attrs["stored_width"] = k.attrs["stored_width"]
    if "picks" in k.attrs:  # an argmax that also stores values at its index (fuse._fold_argmax_picks)
        attrs["picks"] = k.attrs["picks"]
    if "stored_perm" in k.attrs:  # an mha output stored [B, T, H, D] (memory.interleave_heads)
        attrs["stored_perm"] = k.attrs["stored_perm"]
    # bytes the kernel moves: what the cost model charges to DRAM bandwidth
    weight_bytes = sum(buffers[r.value].nbytes for r in k.inputs if r is not None and r.value in buffers
                       and buffers[r.value].arena == "weights")
    attrs["weight_bytes"] = weight_bytes
    return attrs
