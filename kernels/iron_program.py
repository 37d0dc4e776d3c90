"""The IRON side of every design in kernels/, written against the IRON API of the pinned mlir-aie v1.4.5
(`TOOLCHAIN_PIN` in sdk/compiler/npu.py; kernels/README.md lists the signatures used): the lazy import of the
API (importing kernels/ never needs mlir-aie), the runtime ends of a design's fifos and the Program over one 1-D
tensor per operand buffer (inputs in kernel order, then the output; bf16, or int32 for integer buffers), v1.4
style: each fifo's runtime end bound once to its shim tile and given to `Runtime(seq_fn, fn_args)`, whose body
fills and drains through those handles. The fused design (kernels/fused/design.py) runs these sequences over
typed views of the four arenas at each buffer's offset."""
from __future__ import annotations

from types import SimpleNamespace

import ml_dtypes
import numpy as np

from kernels.design_error import DesignError

BF16 = np.dtype(ml_dtypes.bfloat16)
STACK_BYTES = 0x400  # per core; the catalog reserves the same (hardware.Target.stack_bytes)


def iron() -> SimpleNamespace:
    """The IRON API of the pinned mlir-aie. Imported on use, so that the rest of kernels/ (and the tests, with
    tests/iron_standin.py installed) work without the toolchain."""
    try:
        from aie.helpers.taplib import TensorAccessPattern
        from aie.iron import Buffer, Kernel, ObjectFifo, Program, Runtime, ScratchpadParameter, TaskGroup, Worker
        from aie.iron.controlflow import range_
        from aie.iron.device import NPU1, NPU2, Tile
        from aie.iron.runtime import sync_parameters
    except ImportError as e:
        raise DesignError(f"the IRON python API (mlir-aie) is not importable: {e}",
                          fix="install the pinned mlir_aie wheel (see kernels/README.md)") from None
    return SimpleNamespace(TensorAccessPattern=TensorAccessPattern, Buffer=Buffer, Kernel=Kernel,
                           ObjectFifo=ObjectFifo, Program=Program, Runtime=Runtime, TaskGroup=TaskGroup,
                           Worker=Worker, range_=range_, NPU1=NPU1, NPU2=NPU2, Tile=Tile,
                           ScratchpadParameter=ScratchpadParameter, sync_parameters=sync_parameters)


class RuntimeEnds:
    """The runtime ends of a design's fifos. A transfer takes its shim tile from its handle (`.prod(tile=)` /
    `.cons(tile=)`, one per fifo), and every handle the sequence body moves data through is given to the Runtime
    with the tensors, so that the Program resolves each fifo with both its ends known before the body runs
    (mlir-aie PR #3387, v1.4.0). Bind every transfer's fifo before `program()`; the body looks the handles up."""

    def __init__(self, io: SimpleNamespace):
        self.io, self.ends = io, {}

    def fill(self, fifo, col: int):
        return self._end(fifo, col, True)

    def drain(self, fifo, col: int):
        return self._end(fifo, col, False)

    def _end(self, fifo, col: int, is_prod: bool):
        key = (id(fifo), is_prod)
        if key not in self.ends:
            tile = self.io.Tile(col, 0)
            self.ends[key] = (col, fifo.prod(tile=tile) if is_prod else fifo.cons(tile=tile))
        bound, handle = self.ends[key]
        if bound != col:
            raise DesignError(f"fifo {fifo.name}: its runtime end is on shim {bound}, a transfer wants shim {col}",
                              fix="move each fifo's transfers through one shim tile")
        return handle

    @property
    def handles(self) -> list:
        return [h for _, h in self.ends.values()]


def program(io: SimpleNamespace, target_name: str, operands: list, ends: RuntimeEnds, workers: list, body):
    """The IRON program of a design: a runtime sequence over one 1-D tensor per operand (the order the fused
    design passes them), whose body `body(*tensors)` issues the transfers through `ends`."""
    def sequence(*args):
        body(*args[:len(operands)])
    rt = io.Runtime(sequence, [*(tensor(o.elements, o.dtype) for o in operands), ends.handles])
    return io.Program(device(io, target_name), rt, workers=workers).resolve_program()


def stream_walk(io: SimpleNamespace, dims: list[tuple[int, int]], elements: int):
    """An ObjectFifo stream walk (`to_stream` / `from_stream`: a TensorAccessPattern at offset 0 over one object
    of `elements`) from (size, stride) dimensions, outermost first."""
    return io.TensorAccessPattern((elements,), 0, [n for n, _ in dims], [s for _, s in dims])


def device(io: SimpleNamespace, target: str):
    return io.NPU1() if target == "npu1" else io.NPU2()


def tensor(n: int, dtype=BF16) -> type:
    return np.ndarray[(int(n),), np.dtype[dtype]]
