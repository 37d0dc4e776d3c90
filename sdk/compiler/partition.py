"""Partition: which kernels the NPU runs and which stay on the host, and the NPU's share of the work.

A kernel the catalog does not support is split back into its graph nodes, each a host step (the numpy
reference of the op). The report counts graph nodes (views included, they are DMA patterns) and FLOPs.
"""
from __future__ import annotations

import math

from . import catalog
from .fuse import Fused, Kernel, Ref
from .layout import apply_views_shape


def shape_of(f: Fused):
    def shape(r):
        if isinstance(r, str):
            return f.values[r].shape
        return apply_views_shape(f.values[r.value].shape, r.views)
    return shape


def partition(f: Fused) -> dict:
    """Split unsupported kernels into host steps (in place); return this graph's op and FLOP counts."""
    shape = shape_of(f)
    dtype = lambda r: f.values[r.value].dtype  # noqa: E731
    kept: list[Kernel] = []
    host_ops, npu_nodes, npu_flops = [], 0, 0
    for k in f.kernels:
        reason = catalog.supports(k, dtype, shape)
        if not reason:
            kept.append(k)
            npu_nodes += len(k.nodes)
            npu_flops += sum(node_flops(f.values, n) for n in k.nodes)
            continue
        for n in k.nodes:  # back to one host step per node, each at its own place in the graph
            host_ops.append(n.op)
            ins = [_ref_of(f, v) for v in n.inputs]
            out = f.alias.get(n.output, n.output)
            kept.append(Kernel("host", n, ins, [out], _position(f, n), nodes=[n], attrs={"reason": reason}))
    kept.sort(key=lambda k: k.position)
    f.kernels = kept
    all_nodes = [n for k in f.kernels for n in k.nodes]
    views = f.view_nodes
    return {"nodes": len(all_nodes) + views, "npu_nodes": npu_nodes + views,
            "flops": sum(node_flops(f.values, n) for n in all_nodes), "npu_flops": npu_flops,
            "host_ops": host_ops}


def _ref_of(f: Fused, value):
    if value is None:
        return None
    value = f.alias.get(value, value)
    return f.views.get(value, Ref(value))


def _position(f: Fused, node) -> int:
    return f.positions[node.output]


def node_flops(values, n) -> int:
    """Multiply-adds x2 of the matmul-like nodes (the bulk of the work); other ops count one per element."""
    out = values[n.output].shape
    size = math.prod(out)
    if n.op == "linear":
        return 2 * size * values[n.inputs[1]].shape[1]
    if n.op == "matmul":
        return 2 * size * values[n.inputs[0]].shape[-1]
    if n.op == "attention":
        q, k = values[n.inputs[0]].shape, values[n.inputs[1]].shape
        return 4 * math.prod(q[:-1]) * k[-2] * q[-1]
    if n.op in ("conv1d", "conv2d"):
        return 2 * size * math.prod(values[n.inputs[1]].shape[1:])
    return size


def fraction(stats: list[dict]) -> dict:
    nodes = sum(s["nodes"] for s in stats)
    flops = sum(s["flops"] for s in stats)
    return {"ops": round(sum(s["npu_nodes"] for s in stats) / max(nodes, 1), 4),
            "flops": round(sum(s["npu_flops"] for s in stats) / max(flops, 1), 4),
            "host_ops": sorted({op for s in stats for op in s["host_ops"]})}
