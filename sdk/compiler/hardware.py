"""What the compiler knows about each NPU target: the array, its memories and DMA limits, its speed.

Sources: mlir-aie AIETargetModel.h (memories, BDs, channels, dimensions), the amdxdna driver DPM tables
(clocks), AMD AM020 and "Hello XDNA" (MACs per cycle), xdna-engine's roofline notes (DRAM bandwidth seen by
the NPU). Only numbers that a limit check or the cost model uses live here.
"""
from __future__ import annotations

from dataclasses import dataclass

KB = 1024


@dataclass(frozen=True)
class Target:
    name: str
    columns: int                 # usable columns, 4 compute cores each
    rows: int = 4
    l1_bytes: int = 64 * KB      # data memory per core, stack included
    stack_bytes: int = 1 * KB    # what the core's stack takes out of L1 (IRON's default stack size)
    program_bytes: int = 16 * KB  # program memory per core
    memtile_bytes: int = 512 * KB  # per column
    core_channels: int = 2       # DMA channels in each direction
    memtile_channels: int = 6
    shim_channels: int = 2
    core_bds: int = 16
    memtile_bds: int = 48
    shim_bds: int = 16
    core_dims: int = 3           # dimensions of one buffer-descriptor access pattern
    memtile_dims: int = 4
    shim_dims: int = 3
    clock_hz: float = 1.6e9
    bf16_macs: int = 128         # native bf16 MACs per cycle per core
    bfp16_macs: int = 0          # bfp16 (block floating point) MACs per cycle per core; 0 = not available
    mac_shape: tuple[int, int, int] = (4, 8, 4)  # (m, k, n) of one MAC instruction: tiles are multiples
    dram_bytes_per_s: float = 52.7e9
    full_elf: bool = False       # whole program as one ELF dispatch (npu2) or one xclbin per step (npu1)

    @property
    def cores(self) -> int:
        return self.columns * self.rows


TARGETS = {
    # Phoenix / Hawk Point (AIE-ML): 4 usable columns; bf16 4x8x4 MAC; no full-ELF dispatch.
    # DRAM bandwidth seen by the NPU is not published for npu1; the npu2 figure is used (say so in reports).
    "npu1": Target("npu1", columns=4, clock_hz=1.6e9, mac_shape=(4, 8, 4)),
    # Strix / Krackan / Halo (AIE2P): 8 columns; bf16 at ~128 MACs/cycle, or through bfp16 at 512 (8x8x8).
    "npu2": Target("npu2", columns=8, clock_hz=1.8e9, bfp16_macs=512, mac_shape=(8, 8, 8), full_elf=True),
}
