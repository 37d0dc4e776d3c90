"""`aie-apps doctor`: layered NPU checks with the fix for each; exit 0 only when the NPU is usable."""
from __future__ import annotations

from dataclasses import asdict

import typer

from sdk.runtime.checks import npu_usable, run_checks
from sdk.smoke import smoke_dispatch

from .cli import JsonOpt, app, command, out_json

MARK = {"ok": "✔", "warn": "⚠", "fail": "✖"}


@app.command("doctor")
@command
def doctor(json: JsonOpt = False):
    """Check, layer by layer, whether this machine can run models on the NPU, and how to fix what fails."""
    checks = run_checks(smoke_dispatch)
    usable = npu_usable(checks)
    if json:
        out_json({"npu_usable": usable, "checks": [asdict(c) for c in checks]})
    else:
        for c in checks:
            print(f"{MARK[c.status]} {c.name}: {c.detail}")
            if c.fix and c.status != "ok":
                print(f"    fix: {c.fix}")
        print("NPU usable" if usable else "NPU not usable: models run on the CPU (--device auto) until fixed")
    if not usable:
        raise typer.Exit(3)
