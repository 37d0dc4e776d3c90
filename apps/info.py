"""`aie-apps info`: versions, backends and why some are unavailable, cache paths, models found."""
from __future__ import annotations

import importlib.metadata
import platform

from sdk import __version__, hub
from sdk.errors import SdkError
from sdk.runtime import choose_device, npu_problem
from sdk.settings import load

from .cli import JsonOpt, app, command, out_json


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _backends() -> dict:
    out = {}
    for name in ("cpu", "emu", "npu"):
        try:
            choose_device(name)
            out[name] = {"available": True}
            if name == "cpu":  # from the package metadata: importing onnxruntime here would cost ~0.15 s
                out[name]["engine"] = f"onnxruntime {_version('onnxruntime')}"
        except SdkError as e:
            out[name] = {"available": False, "why": e.message}
    return out


def _models() -> dict:
    found = {}
    for name, known in hub.KNOWN.items():
        src = hub.find_installed(name)
        found[name] = ({"path": str(src.path), "origin": src.origin} if src else
                       {"path": None, "install": hub.how_to_get(name), "repo": known.hf_repo})
    return found


@app.command("info")
@command
def info(json: JsonOpt = False):
    """Show versions, which backends can run here (and why not), cache paths and installed models."""
    s = load()
    report = {
        "aie_apps": __version__, "python": platform.python_version(),
        "packages": {d: _version(d) for d in ("numpy", "tokenizers", "safetensors", "soundfile", "opencv-python")},
        "device_default": s.device, "npu": npu_problem() or "usable",
        "backends": _backends(),
        "paths": {"home": str(s.home), "models": str(s.models_dir), "compiled": str(s.compiled_dir),
                  "hf_cache": str(s.hf_cache)},
        "offline": s.offline, "models": _models(),
    }
    if json:
        out_json(report)
        return
    print(f"aie-apps {report['aie_apps']} (Python {report['python']})")
    print("packages: " + ", ".join(f"{k} {v}" for k, v in report["packages"].items()))
    for name, b in report["backends"].items():
        engine = f", engine {b['engine']}" if "engine" in b else ""
        print(f"backend {name}: " + (f"available{engine}" if b["available"] else f"unavailable ({b['why']})"))
    for k, v in report["paths"].items():
        print(f"{k}: {v}")
    print(f"offline: {report['offline']}")
    for name, m in report["models"].items():
        if m["path"]:
            print(f"model {name}: {m['path']} ({m['origin']})")
        else:
            print(f"model {name}: not installed (get it: {m['install']})")
