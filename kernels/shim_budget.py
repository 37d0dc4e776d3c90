"""What a shim tile has to give the streams and transfers of a design: MM2S channels (two per shim; the stream
switches route across columns) and buffer descriptors (16, held by a transfer until its task group ends)."""
from __future__ import annotations

from kernels.design_error import DesignError
from sdk.compiler.hardware import Target


def fits_shim_bds(shim_cols: list[int], target: Target) -> bool:
    """Whether transfers live at once on these shim columns (one buffer descriptor each, until their task group
    ends) fit each shim's descriptors (aiecc refuses a 17th: AIE2TargetModel::getNumBDs)."""
    per_shim: dict[int, int] = {}
    for c in shim_cols:
        per_shim[c] = per_shim.get(c, 0) + 1
    return max(per_shim.values(), default=0) <= target.shim_bds


def shim_allotter(target: Target):
    """Hands out shim tiles for the streams into the array: a column's own shim first, else any with a free
    MM2S channel (the stream switches route across columns)."""
    free = {c: target.shim_channels for c in range(target.columns)}

    def take(home: int) -> int:
        for c in [home] + sorted(free, key=lambda c: (-free[c], c)):
            if free[c] > 0:
                free[c] -= 1
                return c
        raise DesignError("out of shim MM2S channels")
    return take
