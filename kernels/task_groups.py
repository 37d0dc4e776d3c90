"""A runtime sequence's transfers in task groups: each group's fills and drains issued, its awaited transfers
waited for, and its buffer descriptors freed before the next (aiecc refuses a 17th live on one shim tile), so
that a long sequence reuses them. A design plans its groups (how it shrinks them until they fit differs per
design) as lists of `Transfer` records, checks them with `fit()` and issues them with `issue()`."""
from __future__ import annotations

from dataclasses import dataclass, replace
from types import SimpleNamespace

from kernels.shim_budget import fits_shim_bds
from sdk.compiler.hardware import Target


@dataclass(frozen=True)
class Transfer:
    """One fill or drain: through `end` (a fifo's runtime handle, RuntimeEnds), of the runtime sequence's tensor
    at position `arg`, read or written by `tap`, holding a buffer descriptor of the shim on column `shim`. A
    drain or fill with `wait` is awaited before its group's descriptors are freed; `offset` is a scratchpad
    parameter added to its base address."""
    end: object
    shim: int
    arg: int
    tap: object
    drain: bool = False
    wait: bool = False
    offset: object = None


def fit(groups: list[list[Transfer]], target: Target, resident: list[Transfer] = ()) -> bool:
    """Whether every group's transfers, beside the resident ones (live for the whole sequence), fit each shim's
    buffer descriptors."""
    return all(fits_shim_bds([t.shim for t in [*resident, *g]], target) for g in groups)


def awaiting_last_fills(group: list[Transfer]) -> list[Transfer]:
    """The group with each fifo's last fill awaited: a group that drains nothing would otherwise free the
    descriptors of fills whose data still moves."""
    last = {id(t.end): n for n, t in enumerate(group) if not t.drain}
    return [replace(t, wait=True) if last.get(id(t.end)) == n else t for n, t in enumerate(group)]


def issue(io: SimpleNamespace, args, groups: list[list[Transfer]], resident: list[Transfer] | None = None,
          grouped: bool = True) -> None:
    """Issue `groups` in order, each in a TaskGroup finished before the next, inside a runtime sequence body
    (`args`: its tensors); `resident` transfers go first in a group of their own that stays open to the end.
    Not `grouped` (one group whose descriptors fit): every transfer in the default group, since v1.4.5 refuses
    a sequence that mixes the default group with explicit ones (strict_task_groups)."""
    held = io.TaskGroup() if resident is not None else None
    _issue(args, resident or [], held)
    for g in groups:
        tg = io.TaskGroup() if grouped else None
        _issue(args, g, tg)
        if tg is not None:
            tg.finish()
    if held is not None:
        held.finish()


def _issue(args, transfers: list[Transfer], group) -> None:
    for t in transfers:
        move = t.end.drain if t.drain else t.end.fill
        move(args[t.arg], tap=t.tap, group=group, wait=t.wait, offset_parameter=t.offset)
