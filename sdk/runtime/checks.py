"""Layered NPU checks for `aie-apps doctor`, in the order a person fixes them: hardware, driver, device
node, firmware, memlock, XRT, toolchain, prebuilt artifacts, a smoke dispatch. Each check reports ok / warn /
fail with the exact fix. All but the last read sysfs, /dev and installed packages only; the smoke dispatch,
run only when the device node, XRT and this target's artifacts are there, opens the device.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

# PCI device ids of AMD NPUs (vendor 0x1022) -> our target names. One table; unknown ids are reported, never guessed.
NPU_PCI_IDS = {0x1502: "npu1", 0x17F0: "npu2"}
AMD = 0x1022
MIN_MEMLOCK = 1 << 30  # every BO is pinned; model arenas need a large memlock budget
SYSFS_PCI = Path("/sys/bus/pci/devices")
DEVICE_NODES = "/dev/accel/accel*"


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "ok" | "warn" | "fail"
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class NpuPci:
    address: str
    device_id: int
    revision: int
    target: str


def find_npu_pci(sysfs: Path | None = None) -> list[NpuPci]:
    found = []
    for dev in sorted((sysfs or SYSFS_PCI).glob("*")):
        try:
            vendor = int((dev / "vendor").read_text(), 16)
            device = int((dev / "device").read_text(), 16)
            cls = int((dev / "class").read_text(), 16)
        except (OSError, ValueError):
            continue
        # AMD signal-processing controllers (class 0x1180) are the NPU function
        if vendor == AMD and (device in NPU_PCI_IDS or cls >> 8 == 0x1180):
            rev = int((dev / "revision").read_text(), 16) if (dev / "revision").exists() else 0
            found.append(NpuPci(dev.name, device, rev, NPU_PCI_IDS.get(device, "")))
    return found


def run_checks(smoke_dispatch: Callable[[str], str]) -> list[Check]:
    """Every check, in order; `smoke_dispatch(target)` runs the last one (sdk.smoke.smoke_dispatch: it compiles,
    which the runtime does not)."""
    checks: list[Check] = []
    npus = find_npu_pci()
    if not npus:
        checks.append(Check("NPU PCI function", "fail", "no AMD NPU found on the PCI bus",
                            "this machine has no Ryzen AI NPU (Phoenix, Hawk Point, Strix, Krackan, Halo); "
                            "use --device cpu"))
    elif not npus[0].target:
        checks.append(Check("NPU PCI function", "fail", f"AMD device {npus[0].device_id:#06x} at {npus[0].address} "
                            "is not a known NPU", "report the PCI id; known ids: "
                            + ", ".join(f"{k:#06x} ({v})" for k, v in NPU_PCI_IDS.items())))
    else:
        n = npus[0]
        checks.append(Check("NPU PCI function", "ok", f"{n.target} ({n.device_id:#06x} rev {n.revision:#x}) at {n.address}"))

    if Path("/sys/module/amdxdna").exists():
        checks.append(Check("amdxdna driver", "ok", "loaded"))
    else:
        checks.append(Check("amdxdna driver", "fail", "the amdxdna kernel module is not loaded",
                            "use Linux >= 6.14 (amdxdna is in mainline) and run `sudo modprobe amdxdna`"))

    nodes = sorted(glob.glob(DEVICE_NODES))
    if not nodes:
        checks.append(Check("device node", "fail", "no /dev/accel/accel* node",
                            "load the driver (above); the node appears when amdxdna binds the NPU"))
    elif not all(os.access(n, os.R_OK | os.W_OK) for n in nodes):
        checks.append(Check("device node", "fail", f"{nodes[0]} is not readable and writable by this user",
                            "sudo usermod -aG render $USER, then log out and in again"))
    else:
        checks.append(Check("device node", "ok", ", ".join(nodes)))

    firmware = sorted(glob.glob("/lib/firmware/amdnpu/*/npu.sbin*"))
    if firmware:
        checks.append(Check("NPU firmware", "ok", firmware[0]))
    else:
        checks.append(Check("NPU firmware", "fail" if npus else "warn", "no /lib/firmware/amdnpu/*/npu.sbin",
                            "install a current linux-firmware package (it ships amdnpu/)"))

    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY or soft >= MIN_MEMLOCK:
        shown = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft >> 20} MiB"
        checks.append(Check("memlock limit", "ok", shown))
    else:
        checks.append(Check("memlock limit", "warn", f"{soft >> 10} KiB; NPU buffers are pinned and need more",
                            "add '* - memlock unlimited' to /etc/security/limits.d/99-npu.conf and log in again "
                            "(or `ulimit -l unlimited` in this shell as root)"))

    if importlib.util.find_spec("pyxrt") is not None:
        checks.append(Check("XRT (pyxrt)", "ok", "importable"))
    else:
        checks.append(Check("XRT (pyxrt)", "fail", "pyxrt is not importable",
                            "install XRT and the amdxdna plugin (xdna-driver), then `source /opt/xilinx/xrt/setup.sh`"))

    if importlib.util.find_spec("aie") is not None:
        checks.append(Check("mlir-aie toolchain", "ok", "importable (needed only to build kernels)"))
    else:
        checks.append(Check("mlir-aie toolchain", "warn", "mlir_aie is not installed (needed only to build kernels; "
                            "prebuilt artifacts run without it)", "see kernels/README.md for the pinned wheels"))

    checks += npu_runtime_checks(checks, smoke_dispatch)
    return checks


def npu_runtime_checks(before: list[Check], smoke_dispatch: Callable[[str], str]) -> list[Check]:
    """The last layer: prebuilt artifacts for this target, then one real dispatch (this one opens the device)."""
    from ..errors import SdkError
    from . import npu, npu_artifacts
    blocking = [c.name for c in before if c.status == "fail" and c.name in ("device node", "XRT (pyxrt)")]
    try:
        target = npu.detect_target()
    except SdkError as e:
        return [Check("NPU artifacts", "fail", f"not checked: {e.message}", e.fix)]
    keys = npu_artifacts.artifact_keys(target)
    if keys:
        out = [Check("NPU artifacts", "ok", f"{len(keys)} prebuilt {target} artifact(s)")]
    else:
        out = [Check("NPU artifacts", "fail", f"no prebuilt {target} artifacts in "
                     + " or ".join(str(d / "manifest.json") for d in npu_artifacts.prebuilt_dirs()),
                     npu_artifacts.BUILD_FIX.format(target=target))]
    if blocking or not keys:
        reason = ", ".join(blocking) if blocking else "NPU artifacts"
        return out + [Check("smoke dispatch", "fail", f"not run: {reason} failed",
                            "fix the failing checks above, then run `aie-apps doctor` again")]
    try:
        detail = smoke_dispatch(target)
    except SdkError as e:
        return out + [Check("smoke dispatch", "fail", e.message, e.fix)]
    return out + [Check("smoke dispatch", "ok", detail)]


def npu_usable(checks: list[Check]) -> bool:
    return all(c.status != "fail" for c in checks)
