"""Cost model: an ESTIMATE of the latency of one run of a program entry on npu1 / npu2. Not a measurement.

    time = per dispatch: launch + host syncs
         + per kernel:   on-chip overhead between ops + max(compute, DRAM traffic)
         + per host op:  a round trip (sync out, numpy, sync in) and the dispatch it splits

Numbers and sources:
- launch of a dispatch inside an open hardware context: 32-50 us (IRON decode_costs_npu2.json); we use 40.
- host sync of a small buffer: ~0.02 ms per token all told in xdna-engine's fused decoder; we use 10 us each.
- on-chip overhead per op inside one fused dispatch: xdna-engine's fused Whisper-small decoder spends 47.95 ms
  on 612 ops (51 per layer x 12), 78 us per op including its data movement. Reconfiguring inside one ELF is
  ~38 us (IRON); the rest (drain, locks, BD setup) is calibrated: 36 us, so that the same 612 ops with their
  weight traffic reproduce ~53 ms/token (test_compiler checks within 25%).
- npu1 has no full-ELF dispatch: each kernel is its own in-context dispatch from one xclbin (runlist), so a
  kernel also pays the launch.
- DRAM bandwidth seen by the NPU: 52.7 GB/s measured read on Krackan (xdna-engine); not published for npu1,
  the same figure is assumed.
- compute: cores x MACs/cycle x clock (hardware.py), at 50% efficiency (bf16 GEMMs achieve 5-15 of ~15 TFLOPS
  on npu2 in xdna-engine's measurements).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
import numpy as np

from ..program import Program
from .hardware import TARGETS, Target
from .layout import apply_views_shape

LAUNCH_US = 40.0
SYNC_US = 10.0
RECONFIGURE_US = 38.0
DRAIN_US = 36.0  # calibrated (see above)
HOST_OP_US = 50.0  # numpy on a small tensor plus the Python around it
EFFICIENCY = 0.5


@dataclass(frozen=True)
class KernelCost:
    kind: str
    flops: int
    dram_bytes: int      # weights streamed + activations read and written
    cores: int
    precision: str = "bf16"


@dataclass(frozen=True)
class Estimate:
    target: str
    entry: str
    ms: float
    dispatches: int
    kernels: int
    host_ops: int
    overhead_ms: float   # launches, syncs, on-chip overhead between ops, host round trips
    compute_ms: float    # kernels bound by compute
    memory_ms: float     # kernels bound by DRAM traffic
    dram_mb: float

    def as_dict(self) -> dict:
        return {**asdict(self), "label": "estimate (cost model), not a measurement"}


def kernel_us(k: KernelCost, hw: Target) -> tuple[float, float, float]:
    """(overhead, compute, memory) microseconds of one kernel; the kernel takes overhead + max(compute, memory)."""
    overhead = RECONFIGURE_US + DRAIN_US + (0.0 if hw.full_elf else LAUNCH_US)
    macs = hw.bfp16_macs if k.precision == "bfp16" and hw.bfp16_macs else hw.bf16_macs
    compute = (k.flops / 2) / (max(k.cores, 1) * macs * hw.clock_hz * EFFICIENCY) * 1e6
    memory = k.dram_bytes / hw.dram_bytes_per_s * 1e6
    return overhead, compute, memory


def estimate_kernels(kernels: list[KernelCost], hw: Target, *, dispatches: int = 1, syncs: int = 2,
                     host_ops: int = 0, entry: str = "") -> Estimate:
    overhead = dispatches * LAUNCH_US + syncs * SYNC_US + host_ops * (HOST_OP_US + 2 * SYNC_US)
    compute = memory = 0.0
    for k in kernels:
        o, c, m = kernel_us(k, hw)
        overhead += o
        if c >= m:
            compute += c
        else:
            memory += m
    total = overhead + compute + memory
    return Estimate(hw.name, entry, round(total / 1e3, 3), dispatches, len(kernels), host_ops,
                    round(overhead / 1e3, 3), round(compute / 1e3, 3), round(memory / 1e3, 3),
                    round(sum(k.dram_bytes for k in kernels) / 1e6, 2))


def estimate(program: Program, entry: str | None = None, target: str | None = None) -> Estimate:
    """One run of `entry` of a compiled program, on `target` (default: the program's)."""
    hw = TARGETS[target or program.target]
    e = program.entry(entry)
    kernels, host_ops = [], 0
    for step in e.steps:
        if step.kind == "host":
            host_ops += 1
            continue
        for k in step.body:
            moved = dram_bytes(program, k)
            passes = k.attrs["tiling"].get("weight_planes", 1)  # split weights: one MAC pass per plane
            kernels.append(KernelCost(k.op, k.attrs["flops"] * passes, moved, k.attrs["tiling"].get("cores", 1),
                                      k.attrs["tiling"].get("precision", "bf16")))
    dispatches = sum(1 for s in e.steps if s.kind == "dispatch")
    return estimate_kernels(kernels, hw, dispatches=dispatches, syncs=2, host_ops=host_ops, entry=e.name)


def dram_bytes(program: Program, k) -> int:
    """Bytes one kernel moves between DRAM and the array: operands as their access patterns read them
    (a gather reads only its rows, a cache write only the new entries), and its outputs."""
    out = sum(program.buffers[n].nbytes for n in k.outputs)
    total = out
    for i, (name, views) in enumerate(zip(k.inputs, k.attrs["views"])):
        if name is None or (k.op == "state_write" and i == 0):
            continue
        buf = program.buffers[name]
        if k.op == "gather" and i == 0:
            total += out
        else:
            total += math.prod(apply_views_shape(buf.shape, views)) * np.dtype(buf.dtype).itemsize
    return total


# ---- the calibration point ----------------------------------------------------------------------------

def xdna_engine_whisper_small_decoder(target: str = "npu2") -> Estimate:
    """xdna-engine's fused Whisper-small decoder step as our cost model sees it: 12 layers x 51 ops, each
    layer streaming its weights (self-attention Q,K,V,O; cross-attention Q,O; FC1, FC2: 8.26 M bf16 params)
    and reading its KV caches (448 self positions, 1500 cross positions), then the lm_head (768 x 51865).
    Published: ~53 ms/token on Krackan (npu2)."""
    d, ffn, vocab, layers, ops_per_layer = 768, 3072, 51865, 12, 51
    layer_weights = (4 * d * d + 2 * d * d + 2 * d * ffn) * 2
    layer_cache = (2 * 448 * d + 2 * 1500 * d) * 2
    per_op = KernelCost("op", 2 * (layer_weights // 2) // ops_per_layer, (layer_weights + layer_cache) // ops_per_layer,
                        cores=32 if target == "npu2" else 16)
    lm_head = KernelCost("gemm", 2 * d * vocab, d * vocab * 2, cores=32 if target == "npu2" else 16)
    return estimate_kernels([per_op] * (layers * ops_per_layer) + [lm_head], TARGETS[target],
                            entry="xdna-engine whisper-small decoder step")
