"""Device selection, decided here and nowhere else.

`auto` takes the NPU when it is usable (device node, driver, pyxrt, artifacts for this target) and
otherwise the CPU, with ONE warning per process saying why. `npu` and `emu` are strict: when they cannot
be used they raise DeviceUnavailable (exit code 3). Importing this module never touches hardware.
"""
from __future__ import annotations

import glob
import importlib
import importlib.util
import warnings
from dataclasses import dataclass

from ..errors import DeviceUnavailable, UsageError
from ..settings import DEVICES

_BACKEND_MODULES = {"cpu": ("sdk.runtime.cpu", "CpuBackend"),
                    "emu": ("sdk.runtime.emu", "EmuBackend"),
                    "npu": ("sdk.runtime.npu", "NpuBackend")}


class FallbackWarning(UserWarning):
    """An "auto" choice took its documented fallback (the CLI shows it as a note); the message says why."""


class DeviceFallbackWarning(FallbackWarning):
    """device="auto" chose the CPU; the message says why."""


@dataclass(frozen=True)
class DeviceChoice:
    requested: str
    effective: str
    reason: str = ""  # why `effective` differs from what was asked (empty when it does not)


def npu_problem() -> str:
    """Why the NPU backend cannot be used on this machine, or "" when it can (no hardware is opened)."""
    from . import checks
    if not glob.glob(checks.DEVICE_NODES):
        return "no NPU device node (/dev/accel/accel*): no Ryzen AI NPU, or the amdxdna driver is not loaded"
    if importlib.util.find_spec("pyxrt") is None:
        return "pyxrt is not importable: install XRT with the amdxdna plugin and source its setup.sh"
    if importlib.util.find_spec("sdk.runtime.npu") is None:
        return "this build of aie-apps has no npu backend"
    from .npu import artifacts_problem  # the target from its PCI id, and artifacts built for it
    return artifacts_problem()


_warned = False


def choose_device(requested: str | None = None) -> DeviceChoice:
    from ..settings import load
    source = "" if requested else " (from AIE_APPS_DEVICE)"
    requested = (requested or load().device).lower()
    if requested not in DEVICES:
        raise UsageError(f"unknown device {requested!r}{source}", fix=f"use one of {', '.join(DEVICES)}")
    if requested == "cpu":
        return DeviceChoice("cpu", "cpu")
    if requested == "emu":
        if importlib.util.find_spec("sdk.runtime.emu") is None:
            raise DeviceUnavailable("the emu backend is not part of this build", fix="use --device cpu")
        return DeviceChoice("emu", "emu")
    problem = npu_problem()
    if requested == "npu":
        if problem:
            raise DeviceUnavailable(f"the NPU cannot be used: {problem}",
                                    fix="run `aie-apps doctor` for the full check, or use --device cpu")
        return DeviceChoice("npu", "npu")
    if not problem:
        return DeviceChoice("auto", "npu")
    return fall_back(problem)


def fall_back(reason: str) -> DeviceChoice:
    """device="auto" cannot use the NPU (found here, or when the session opened it): the CPU, with ONE
    warning per process saying why."""
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"running on the CPU: {reason}", DeviceFallbackWarning, stacklevel=3)
    return DeviceChoice("auto", "cpu", reason)


def open_backend(effective: str, **options):
    module, cls = _BACKEND_MODULES[effective]
    return getattr(importlib.import_module(module), cls)(**options)
