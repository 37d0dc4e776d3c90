"""Typed errors. Every message says what failed, why, and what to do; `exit_code` is what the CLI returns.

Exit codes (shared by every command): 0 ok, 1 failure, 2 usage, 3 requested device unavailable,
4 model missing (or offline), 5 audio/camera/typing device error, 130 interrupted.
"""
from __future__ import annotations


class SdkError(Exception):
    exit_code = 1

    def __init__(self, message: str, *, fix: str = ""):
        self.message, self.fix = message, fix
        super().__init__(f"{message}\n  fix: {fix}" if fix else message)


class UsageError(SdkError):
    """The call itself is wrong (bad option value, wrong shape, unknown name)."""
    exit_code = 2


class DeviceUnavailable(SdkError):
    """The requested device cannot be used (no NPU, no driver, backend missing)."""
    exit_code = 3


class ModelNotFound(SdkError):
    """A model name did not resolve to files (offline, not installed, not cached)."""
    exit_code = 4


class WeightError(SdkError):
    """A checkpoint is unreadable or does not match the model (lists missing/unused/misshaped keys)."""
    exit_code = 1

    def __init__(self, message: str, *, missing=(), unused=(), misshaped=(), fix: str = ""):
        self.missing, self.unused, self.misshaped = list(missing), list(unused), list(misshaped)
        details = []
        for label, items in (("missing", self.missing), ("unused", self.unused), ("misshaped", self.misshaped)):
            if items:
                shown = ", ".join(map(str, items[:8])) + (f", ... ({len(items)} in all)" if len(items) > 8 else "")
                details.append(f"  {label}: {shown}")
        super().__init__("\n".join([message, *details]), fix=fix)


class InputError(SdkError):
    """User data is unusable (corrupt audio, bad FASTA, wrong array shape)."""
    exit_code = 1


class ProgramError(SdkError):
    """A program is malformed or breaks a hardware limit (names the kernel and the limit)."""
    exit_code = 1


class RunStopped(SdkError):
    """A run was given up midway because its caller's `stop()` said so (a live decode whose audio moved on)."""
    exit_code = 1


class DeviceIOError(SdkError):
    """A microphone, camera or typing tool is missing, busy or failed."""
    exit_code = 5


class ArtifactMissing(DeviceUnavailable):
    """No compiled NPU artifact (xclbin + instructions, or full ELF) for this program on this target."""


class ContextLimit(DeviceUnavailable):
    """The NPU has no free hardware context (6 on npu1, 16 on npu2, shared by every process)."""


class MemlockTooLow(DeviceUnavailable):
    """The locked-memory limit (RLIMIT_MEMLOCK) is below what the session's pinned device buffers need."""


class DeviceBusy(DeviceUnavailable):
    """Another program holds the NPU (it is single-tenant)."""


class DispatchTimeout(DeviceUnavailable):
    """A dispatch did not complete: the driver's watchdog stopped it, or the device reported an error."""


class EnergyCounterUnavailable(SdkError):
    """The package energy counter (Linux powercap, RAPL) is missing or unreadable; timings still work."""
    exit_code = 1
