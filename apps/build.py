"""`aie-apps build MODEL --target npu1|npu2`: compile a model and build its NPU artifacts into prebuilt/
(kernels/build.py); MODEL `smoke` builds the program `aie-apps doctor` dispatches. Needs the pinned AIE
toolchain; without it, says what to install and exits 1."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from sdk.errors import UsageError

from .cli import app, command, out_json


@app.command("build")
@command
def build(model: Annotated[str, typer.Argument(help="checkpoint folder, model name, or smoke")],
          target: Annotated[str, typer.Option("--target", help="npu1 (Phoenix / Hawk Point) | npu2 (Strix ...)")]):
    """Build a model's NPU artifacts (xclbin + instructions on npu1, one full ELF on npu2) into prebuilt/."""
    checkout = Path(__file__).resolve().parents[1]  # a source checkout (an editable install) has kernels/ here
    if not (checkout / "kernels" / "build.py").is_file():
        raise UsageError("the kernels/ sources are not installed with this package",
                         fix="install aie-apps from a source checkout (`pip install -e .`) and build there")
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    from kernels import build as kernels_build
    entry = kernels_build.build(model, target)
    out_json({"key": entry["key"], "target": target, "files": entry["files"]})
