"""The one place environment variables are read. Everything else takes a `Settings` (or its fields)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .errors import SdkError

DEVICES = ("auto", "npu", "emu", "cpu")


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Settings:
    device: str            # AIE_APPS_DEVICE, default auto
    home: Path             # AIE_APPS_HOME, default ${XDG_CACHE_HOME:-~/.cache}/aie-apps
    offline: bool          # AIE_APPS_OFFLINE or HF_HUB_OFFLINE
    offline_switches: tuple[str, ...]  # which of those two are set (errors name only those)
    hf_endpoint: str | None  # HF_ENDPOINT: the hub downloads come from (a mirror; a local server in tests)
    hf_cache: Path         # HF_HUB_CACHE, else ${HF_HOME:-~/.cache/huggingface}/hub
    runtime_dir: Path      # XDG_RUNTIME_DIR (dictation control socket), else the cache home
    session_type: str      # the desktop session: "x11", "wayland" or "tty" (XDG_SESSION_TYPE, else the displays)
    x11_display: bool      # DISPLAY is set: an X server (or XWayland) can be reached
    threads: int           # AIE_APPS_THREADS: the cpu backend's intra-op threads, default the CPUs this process may use
    display: str = ""      # DISPLAY: the X server to reach (classify checks it answers before opening a window)

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

    def cache() -> Path:  # only when a folder below was not given: then the home folder must be found
        return Path(env.get("XDG_CACHE_HOME") or _home(env) / ".cache")
    home = Path(env.get("AIE_APPS_HOME") or cache() / "aie-apps")
    hf_cache = Path(env.get("HF_HUB_CACHE") or Path(env.get("HF_HOME") or cache() / "huggingface") / "hub")
    return Settings(
        device=(env.get("AIE_APPS_DEVICE") or "auto").strip().lower(),
        home=home,
        offline=_truthy(env.get("AIE_APPS_OFFLINE")) or _truthy(env.get("HF_HUB_OFFLINE")),
        offline_switches=tuple(v for v in ("AIE_APPS_OFFLINE", "HF_HUB_OFFLINE") if _truthy(env.get(v))),
        hf_endpoint=env.get("HF_ENDPOINT") or None,
        hf_cache=hf_cache,
        runtime_dir=Path(env.get("XDG_RUNTIME_DIR") or home),
        session_type=_session_type(env),
        x11_display=bool(env.get("DISPLAY")),
        threads=_threads(env.get("AIE_APPS_THREADS")),
        display=env.get("DISPLAY") or "",
    )


def _home(env) -> Path:
    """HOME, else the passwd entry; a container run with `--user UID` may have neither."""
    if env.get("HOME"):
        return Path(env["HOME"])
    try:
        return Path.home()
    except (RuntimeError, KeyError):
        raise SdkError(f"cannot find a home folder: HOME is not set and uid {os.getuid()} has no passwd entry",
                       fix="set HOME, or XDG_CACHE_HOME (or AIE_APPS_HOME and HF_HOME) to a writable folder, e.g. "
                           "`-e HOME=/tmp/home` for a container") from None


MAX_THREADS = 1024


def _threads(value: str | None) -> int:
    if value and value.strip().isdigit() and int(value) > 0:
        if int(value) > MAX_THREADS:  # the thread pool's C call takes an int: 99999999999 crashed in it
            raise SdkError(f"AIE_APPS_THREADS={value.strip()} is more threads than can be started ({MAX_THREADS} at "
                           f"most)", fix="unset AIE_APPS_THREADS (all CPUs this process may use), or give a small number")
        return int(value)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _session_type(env) -> str:
    kind = (env.get("XDG_SESSION_TYPE") or "").lower()
    if kind in ("wayland", "x11"):
        return kind
    return "wayland" if env.get("WAYLAND_DISPLAY") else "x11" if env.get("DISPLAY") else "tty"
