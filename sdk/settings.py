"""The one place environment variables are read. Everything else takes a `Settings` (or its fields)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEVICES = ("auto", "npu", "emu", "cpu")


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Settings:
    device: str            # AIE_APPS_DEVICE, default auto
    home: Path             # AIE_APPS_HOME, default ${XDG_CACHE_HOME:-~/.cache}/aie-apps
    offline: bool          # AIE_APPS_OFFLINE or HF_HUB_OFFLINE
    hf_cache: Path         # HF_HUB_CACHE, else ${HF_HOME:-~/.cache/huggingface}/hub
    runtime_dir: Path      # XDG_RUNTIME_DIR (dictation control socket), else the cache home
    session_type: str      # the desktop session: "x11", "wayland" or "tty" (XDG_SESSION_TYPE, else the displays)
    x11_display: bool      # DISPLAY is set: an X server (or XWayland) can be reached
    threads: int           # AIE_APPS_THREADS: the cpu backend's intra-op threads, default the CPUs this process may use

    @property
    def has_display(self) -> bool:
        return self.session_type != "tty"

    @property
    def models_dir(self) -> Path:
        return self.home / "models"

    @property
    def compiled_dir(self) -> Path:
        return self.home / "compiled"


def load(environ=None) -> Settings:
    env = os.environ if environ is None else environ
    cache = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    home = Path(env.get("AIE_APPS_HOME") or cache / "aie-apps")
    hf_home = Path(env.get("HF_HOME") or cache / "huggingface")
    return Settings(
        device=(env.get("AIE_APPS_DEVICE") or "auto").strip().lower(),
        home=home,
        offline=_truthy(env.get("AIE_APPS_OFFLINE")) or _truthy(env.get("HF_HUB_OFFLINE")),
        hf_cache=Path(env.get("HF_HUB_CACHE") or hf_home / "hub"),
        runtime_dir=Path(env.get("XDG_RUNTIME_DIR") or home),
        session_type=_session_type(env),
        x11_display=bool(env.get("DISPLAY")),
        threads=_threads(env.get("AIE_APPS_THREADS")),
    )


def _threads(value: str | None) -> int:
    if value and value.strip().isdigit() and int(value) > 0:
        return int(value)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _session_type(env) -> str:
    kind = (env.get("XDG_SESSION_TYPE") or "").lower()
    if kind in ("wayland", "x11"):
        return kind
    return "wayland" if env.get("WAYLAND_DISPLAY") else "x11" if env.get("DISPLAY") else "tty"
