"""The skeleton of the convolution-like designs (conv2d, pool, dwconv1d, transpose): one core per column reading
from its own shim, transfers in task groups so that buffer descriptors are reused."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernels.access import taps
from kernels.design_error import DesignError
from kernels.iron_program import STACK_BYTES, RuntimeEnds, iron, program, tensor
from kernels.step_operands import Operand, sequence_of
from kernels.task_groups import Transfer, issue
from sdk.compiler.hardware import TARGETS


@dataclass
class Stream:
    """One input (or the output) of a per-core design: the operand, its object type, and for each core the
    element index of everything it moves, in order; `lead` is what comes first on the same fifo from another
    operand (a bias ahead of the weights), as (operand, index per core)."""
    operand: Operand
    obj_type: type
    per_core: list[np.ndarray]
    lead: tuple | None = None
    # (operand, index per core): one object after each item (a residual row); an item's index may be a tuple of
    # index arrays, moved one after another into that object
    follow: tuple | None = None


def per_core_design(target_name: str, name: str, inputs: list[Stream], output: Stream, kernels: list,
                    state: dict, body, args: list, params: dict, step):
    """Cores that each read their inputs straight from the shims (no memtile) and write their output back:
    cores <= columns, so that every core has its own shim channels."""
    io = iron()
    target = TARGETS[target_name]
    cores = len(output.per_core)
    if cores > target.columns or len(inputs) > target.shim_channels:
        raise DesignError(f"{cores} cores with {len(inputs)} inputs each exceed the shims' channels")
    operands = [s.operand for s in inputs] + [s.lead[0] for s in inputs if s.lead] \
        + [s.follow[0] for s in inputs if s.follow] + [output.operand]
    workers, transfers = [], []
    for c in range(cores):
        ins = [io.ObjectFifo(s.obj_type, depth=2, name=f"{name}_in{i}_c{c}") for i, s in enumerate(inputs)]
        out = io.ObjectFifo(output.obj_type, depth=2, name=f"{name}_out_c{c}")
        bufs = [io.Buffer(tensor(n, dt), name=f"{name}_{k}_c{c}", initial_value=init)
                for k, (n, dt, init) in state.items()]
        workers.append(io.Worker(body, [f.cons() for f in ins] + [out.prod()] + bufs + kernels + list(args),
                                 tile=io.Tile(c, 2), stack_size=STACK_BYTES))
        lead = len(inputs)
        for f, st in zip(ins, inputs):
            if st.lead:
                transfers.append(("fill", f, lead, st.lead[1][c], c))
                lead += 1
        follow = len(inputs) + sum(1 for st in inputs if st.lead)
        for i, (f, st) in enumerate(zip(ins, inputs)):
            if st.follow:  # item by item: the main object, then the following one
                transfers.append(("fill_pair", f, (i, follow), (st.per_core[c], st.follow[1][c]), c))
                follow += 1
            else:
                transfers.append(("fill", f, i, st.per_core[c], c))
        transfers.append(("drain", out, len(operands) - 1, output.per_core[c], c))
    # Streams with one object per output object go in task groups small enough that each shim's buffer
    # descriptors are reused (a group's drains are awaited and its descriptors freed before the next group);
    # the others (resident weights) stay in one group open for the whole sequence.
    n_items = output.per_core[0].shape[0]
    paced = [t for t in transfers if t[0] == "fill_pair" or t[3].shape[0] == n_items]
    steady = [t for t in transfers if t[0] != "fill_pair" and t[3].shape[0] != n_items]
    steady_bds = max([sum(len(taps(io, operands[i], idx)) for _, _, i, idx, c2 in steady if c2 == c)
                      for c in range(cores)] or [0])
    def bds(t, lo, hi):
        kind, _, i, idx, _ = t
        if kind == "fill_pair":
            return sum(len(taps(io, operands[i[0]], idx[0][j])) + sum(len(taps(io, operands[i[1]], p))
                                                                      for p in _pieces(idx[1][j]))
                       for j in range(lo, min(hi, n_items)))
        return len(taps(io, operands[i], idx[lo:hi]))

    group = n_items
    while group > 1 and steady_bds + sum(bds(t, 0, group) for t in paced if t[4] == 0) > target.shim_bds:
        group = (group + 1) // 2
    ends = RuntimeEnds(io)
    for kind, fifo, _, _, c in transfers:
        (ends.drain if kind == "drain" else ends.fill)(fifo, c)

    def records(batch, lo=None, hi=None) -> list[Transfer]:
        """The transfers of `batch`, items lo..hi of its paced streams (all of a resident one); drains awaited."""
        found = []
        for kind, fifo, i, idx, c in batch:
            if kind == "fill_pair":
                found += [Transfer(ends.fill(fifo, c), c, i[which], tap)
                          for j in range(lo, min(hi, n_items)) for which in (0, 1)
                          for piece in _pieces(idx[which][j]) for tap in taps(io, operands[i[which]], piece)]
                continue
            for tap in taps(io, operands[i], idx if lo is None else idx[lo:hi]):
                if kind == "fill":
                    found.append(Transfer(ends.fill(fifo, c), c, i, tap))
                else:
                    found.append(Transfer(ends.drain(fifo, c), c, i, tap, drain=True, wait=True))
        return found

    resident = records(steady)
    groups = [records(paced, lo, lo + group) for lo in range(0, n_items, group)]

    def sequence(*rt_args):
        issue(io, rt_args, groups, resident=resident)
    params.update({"cores": cores, "items_per_group": group, "sequence": sequence_of(step, operands)})
    return program(io, target_name, operands, ends, workers, sequence)


def _pieces(index) -> tuple:
    return index if isinstance(index, tuple) else (index,)
