"""Peak live shim buffer descriptors per design (issue #21: aiecc refuses a 17th on one shim tile), and the most
transfers one of its steps' runtime sequence issues (kernels/mha's MAX_TRANSFERS bounds attention's), for the
real-size builds: tests/test_real_size_builds.py's one-layer models and attention buckets, every ESM-2 bucket,
GigaAM v2's encoder buckets (attention steps only: its conv steps at 30 s take many GB to index), and the
programs `aie-apps build` makes for all-MiniLM-L6-v2 and whisper-tiny.en (those need the checkpoints offline).
Built against the IRON stand-in with its refusal lifted, so an excess prints its count instead of stopping.

    PYTHONPATH=$PWD python bench/shim_bds.py                    # everything, npu1 and npu2
    PYTHONPATH=$PWD python bench/shim_bds.py esm gigaam --designs rope,mha
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.design_error import DesignError  # noqa: E402
from sdk.compiler import compile as compile_graphs  # noqa: E402
from sdk.models import conformer, esm  # noqa: E402
from tests import iron_standin as standin  # noqa: E402
from tests.test_designs import build_step, name_of  # noqa: E402
from tests.test_real_size_builds import ESM2_8M, GIGAAM_V2, REAL, distinct_steps  # noqa: E402

LIMIT = 16
# one case per bucket, named by its attention length (GigaAM's encoder subsamples its frames 4x)
BUCKETS = {
    **{f"esm2-8m b{b}_t{t}": (lambda b=b, t=t: [esm.graph(ESM2_8M, b, t)], None)
       for b, t in ((16, 64), (8, 128), (4, 256), (2, 512), (1, 512), (1, 1024))},
    **{f"gigaam-v2 t{-(-conformer.frames_for(s) // 4)}":
       (lambda s=s: [conformer.encoder_graph(GIGAAM_V2, conformer.frames_for(s))], {"rope", "mha"})
       for s in (5, 10, 20, 30)},
}


def installed(model: str):
    from kernels.build import model_programs
    return lambda: model_programs(model).graphs


def cases() -> dict:
    found = {name: (graphs, None) for name, graphs in REAL.items()}
    found.update(BUCKETS)
    found.update({f"{m} (aie-apps build)": (installed(m), None) for m in ("all-MiniLM-L6-v2", "whisper-tiny.en")})
    return found


def measure(graphs, target: str, designs) -> tuple[dict, dict, list[str]]:
    """(design -> the most live shim descriptors of any of its steps, design -> the most transfers of any of its
    steps, lines for steps over the limit or refused)."""
    program = compile_graphs(graphs(), target)
    worst, transfers, notes = {}, {}, []
    for step in distinct_steps(program):
        design, label = name_of(step), f"{name_of(step)} {step.attrs.get('name')}"
        if designs and design not in designs:
            continue
        try:
            rec, _ = build_step(step, program, target)
        except DesignError as e:
            notes.append(f"refused {label}: {e.message[:120]}")
            continue
        peak = max(rec.runtime.peak.values(), default=0)
        worst[design] = max(worst.get(design, 0), peak)
        transfers[design] = max(transfers.get(design, 0), len(rec.runtime.transfers))
        if peak > LIMIT:
            shapes = [program.buffers[b].shape for b in step.inputs if b]
            notes.append(f"{label} {shapes}: {peak}")
    return worst, transfers, notes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("select", nargs="*", help="substrings of the case names (default: all)")
    ap.add_argument("--designs", default="", help="comma-separated designs to build (default: all)")
    a = ap.parse_args()
    standin.Device.shim_bds = 1 << 30   # count, do not refuse
    for name, (graphs, designs) in cases().items():
        if a.select and not any(s in name for s in a.select):
            continue
        designs = set(a.designs.split(",")) if a.designs else designs
        for target in ("npu1", "npu2"):
            t0 = time.time()
            try:
                worst, transfers, notes = measure(graphs, target, designs)
            except Exception as e:  # a checkpoint not on this machine
                print(f"{name} {target}: skipped ({type(e).__name__}: {str(e)[:80]})")
                continue
            print(f"{name} {target} ({time.time() - t0:.0f} s): "
                  + " ".join(f"{d}={n} ({transfers[d]} transfers)" for d, n in sorted(worst.items())), flush=True)
            for line in notes:
                print(f"    {line}", flush=True)


if __name__ == "__main__":
    main()
