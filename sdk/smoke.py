"""The doctor's smoke program: the smallest real NPU program (one GEMM with a bias and GELU epilogue, one
dispatch). `aie-apps build` ships its artifact for every target (model name `smoke`) so that `aie-apps doctor`
can prove a dispatch end to end (sdk.runtime.checks runs smoke_dispatch as its last check)."""
from __future__ import annotations

import time

import numpy as np

from . import ops
from .errors import DeviceUnavailable
from .graph import Graph, trace
from .session import Session

SMOKE_WEIGHTS = {"w": (64, 64), "b": (64,)}


def smoke_graph() -> Graph:
    def smoke(w, x):
        return {"y": ops.gelu(ops.linear(x, w["w"], w["b"]))}
    return trace(smoke, name="smoke", weights=SMOKE_WEIGHTS, inputs={"x": ((8, 64), "float32")})


def smoke_dispatch(target: str) -> str:
    """Run the smoke program once on the NPU and compare it with numpy; a typed error says what failed."""
    rng = np.random.default_rng(0)
    weights = {n: rng.normal(0, 0.2, s).astype(np.float32) for n, s in SMOKE_WEIGHTS.items()}
    x = rng.normal(size=(8, 64)).astype(np.float32)
    with Session([smoke_graph()], weights, device="npu", target=target) as s:
        s.counters.reset()
        start = time.perf_counter()
        y = s.run(x=x)["y"]
        ms = (time.perf_counter() - start) * 1e3
        dispatches = s.counters.dispatches
    ref = ops.gelu(ops.linear(x, weights["w"], weights["b"]))
    rel = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
    if not rel <= 1e-2:
        raise DeviceUnavailable(f"the smoke dispatch ran but its result is wrong (rel-L2 {rel:.2g} vs numpy)",
                                fix="a firmware/driver mismatch or a stale artifact: check `xrt-smi validate`, "
                                    "then rebuild with `aie-apps build smoke --target " + target + "`")
    return f"{dispatches} dispatch on {target}, rel-L2 {rel:.1e} vs numpy, {ms:.2f} ms (includes the host syncs)"
