"""AIE kernels (C++), their IRON designs and the build that turns them into prebuilt artifacts.

Build inputs only: nothing here is imported at inference time. `DESIGNS` maps each catalog kind
(sdk/compiler/catalog.py) to the design module that builds it; `design_module(step)` picks the module for one
kernel step of a compiled Program (a GEMM with one activation row is the decode GEMV; a depthwise conv1d has
its own kernel)."""
from __future__ import annotations

import importlib

DESIGNS = {
    "gemm": "gemm", "bmm": "gemm", "conv": "conv2d", "mha": "mha", "eltwise": "eltwise", "softmax": "softmax",
    "norm": "norm", "reduce": "reduce", "argmax": "argmax", "rope": "rope", "pool": "pool", "maskgen": "maskgen",
    "gather": "dma", "state_write": "dma", "concat": "dma", "pad": "dma", "copy": "dma",
    "transpose": "transpose",
}


def design_name(step) -> str:
    t = step.attrs["tiling"]
    if step.op == "gemm" and t["M"] == 1:
        return "gemv"
    if step.op == "conv":
        attrs = step.attrs["head"]["attrs"]
        if step.attrs["head"]["op"] == "conv1d" and attrs.get("groups", 1) > 1:
            return "dwconv1d"
    return DESIGNS[step.op]


def design_module(step):
    return importlib.import_module(f"kernels.{design_name(step)}.design")
