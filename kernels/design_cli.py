"""The command line every design.py runs as a script."""
from __future__ import annotations

import argparse
import json
import sys

from sdk.compiler.hardware import TARGETS


def params_of(args: argparse.Namespace) -> dict:
    return json.loads(open(args.step).read()) if args.step else {}


def main(build_fn) -> None:
    """The command line of every design.py: `python design.py --target npu2 --step step.json > design.mlir`,
    where step.json is {"step": <kernel step of a compiled Program>, "buffers": {name: [shape, dtype]}}."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", choices=sorted(TARGETS), required=True)
    ap.add_argument("--step", required=True, help="a kernel step and its buffers, as kernels/build.py writes them")
    a = ap.parse_args()
    from sdk.program import Buffer, Step, Usage
    doc = params_of(a)
    st = doc["step"]
    step = Step(st["kind"], st["op"], tuple(st["inputs"]), tuple(st["outputs"]), st["attrs"])
    buffers = {n: Buffer(n, tuple(shape), dtype, Usage.SCRATCH) for n, (shape, dtype) in doc["buffers"].items()}
    print(build_fn(a.target, step, buffers, {}))
    sys.stdout.flush()
