"""`aie-apps build MODEL --target npu1|npu2`: compile exactly the program the pipelines load for MODEL with their
default options (every bucket) and build its NPU artifacts into prebuilt/ (kernels/build.py). `--list MODEL` prints
that program's entries and content keys without building; `--all` builds every model installed on this machine
(never downloading) and `smoke`, the program `aie-apps doctor` dispatches. Building needs the pinned AIE
toolchain; without it, says what to install and exits 1 (an unknown model is named first, exit 4)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from sdk.errors import SdkError, UsageError

from .cli import JsonOpt, app, command, err, out_json, report_error

TARGETS = ("npu1", "npu2")


def _kernels_build():
    checkout = Path(__file__).resolve().parents[1]  # a source checkout (an editable install) has kernels/ here
    if not (checkout / "kernels" / "build.py").is_file():
        raise UsageError("the kernels/ sources are not installed with this package",
                         fix="install aie-apps from a source checkout (`pip install -e .`) and build there")
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    from kernels import build as kernels_build
    return kernels_build


@app.command("build")
@command
def build(model: Annotated[Optional[str], typer.Argument(help="checkpoint folder, model name, or smoke")] = None,
          target: Annotated[Optional[str], typer.Option(
              "--target", help="npu1 (Phoenix / Hawk Point) | npu2 (Strix ...); --list: both by default")] = None,
          list_entries: Annotated[bool, typer.Option("--list", help="print MODEL's entries and keys; build nothing")]
          = False,
          every: Annotated[bool, typer.Option("--all", help="build every installed model (no downloads) and smoke")]
          = False,
          out: Annotated[Optional[Path], typer.Option("--out", help="prebuilt folder to write (default: the "
                                                                    "checkout's prebuilt/)")] = None,
          json: JsonOpt = False):
    """Build a model's NPU artifacts (xclbin + instructions on npu1, one full ELF on npu2) into prebuilt/."""
    if target is not None and target not in TARGETS:
        raise UsageError(f"unknown target {target!r}", fix="use --target npu1 or --target npu2")
    if every == (model is not None):
        raise UsageError("name one MODEL, or pass --all", fix="e.g. `aie-apps build whisper-tiny.en --target npu2`")
    kb = _kernels_build()
    if list_entries:
        if every:
            raise UsageError("--list takes one MODEL", fix="e.g. `aie-apps build --list whisper-tiny.en`")
        _print_listing(kb.listing(model, [target] if target else list(TARGETS)), json)
        return
    if target is None:
        raise UsageError("--target is required to build", fix="pass --target npu1 or --target npu2 (see `doctor`)")
    out = out or kb.PREBUILT
    if not every:
        entry = kb.build(model, target, out)
        out_json({"model": model, "key": entry["key"], "target": target, "files": entry["files"]})
        return
    found, missing = kb.installed_models()
    for name in missing:
        err(f"note: {name} is not installed here; skipped (`aie-apps build {name}` says how to get it)")
    toolchain = kb.find_toolchain()
    failed = 0
    for name in [kb.SMOKE, *found]:
        try:
            entry = kb.build(name, target, out, toolchain)
        except SdkError as e:
            report_error(e)
            failed += 1
            continue
        out_json({"model": name, "key": entry["key"], "target": target, "files": entry["files"]})
    if failed:
        raise typer.Exit(1)


def _print_listing(doc: dict, as_json: bool) -> None:
    if as_json:
        out_json(doc)
        return
    print(f"{doc['model']}: loaded by {doc['loaded_by']}")
    for t, key in doc["keys"].items():
        print(f"  {t} key {key} ({'built' if doc['built'][t] else 'not built'})")
    for e in doc["entries"]:
        shapes = ", ".join(f"{n} {shape}" for n, shape in e["inputs"].items())
        print(f"  {e['entry']}: {shapes}")
