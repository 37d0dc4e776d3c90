"""The CPU package's energy counter, read through Linux powercap (the RAPL package domains).

Each package is a zone `/sys/class/powercap/intel-rapl:N` whose `name` file says `package-N`; AMD Zen exposes
the same zones (driver intel_rapl_msr). `energy_uj` counts microjoules since boot and wraps to 0 after
`max_energy_range_uj`. It is readable by root only by default (the fix for the RAPL power side channel,
CVE-2020-8694): when it cannot be read, EnergyCounterUnavailable says why and the exact command that allows it.

    counter = PackageEnergy()            # raises EnergyCounterUnavailable
    with counter.measure() as interval:
        work()
    interval.joules, interval.seconds, interval.watts
"""
from __future__ import annotations

import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .errors import EnergyCounterUnavailable

ROOT = Path("/sys/class/powercap")
_PACKAGE_ZONE = re.compile(r"intel-rapl:\d+")  # intel-rapl:N:M are sub-domains (cores) inside package N
_PACKAGE_NAME = re.compile(r"package-\d+")
_MAX_FILE_BYTES = 64  # these files hold one decimal number

_UDEV_RULE = ('ACTION=="add", SUBSYSTEM=="powercap", KERNEL=="intel-rapl:*", '
              'RUN+="/bin/chmod o+r /sys%p/energy_uj"')


@dataclass(frozen=True)
class Domain:
    name: str           # "package-0"
    path: Path          # the zone's folder
    max_range_uj: int   # the counter wraps to 0 after this many microjoules


@dataclass
class Interval:
    """Energy and wall time between entering and leaving `PackageEnergy.measure()`."""
    joules: float = 0.0
    seconds: float = 0.0

    @property
    def watts(self) -> float:
        return self.joules / self.seconds if self.seconds > 0 else 0.0


def elapsed_uj(start: int, end: int, max_range_uj: int) -> int:
    """Microjoules from reading `start` to reading `end` of one counter, across at most one wrap to 0. The
    range is 2^32 of the firmware's energy units (about 65.5 kJ with AMD's 15.3 uJ unit: over half an hour at
    30 W), so one benchmark interval sees at most one wrap."""
    return end - start if end >= start else end + max_range_uj - start


def _read_int(path: Path, root: Path) -> int:
    try:
        with open(path, "rb") as f:
            text = f.read(_MAX_FILE_BYTES).decode("ascii", "replace").strip()
    except PermissionError:
        zones = " ".join(sorted(str(p) for p in root.glob("intel-rapl:*/energy_uj")
                                if _PACKAGE_ZONE.fullmatch(p.parent.name))) or str(path)
        raise EnergyCounterUnavailable(
            f"{path} is readable by root only (the kernel's default since the fix for the RAPL power side "
            f"channel, CVE-2020-8694)",
            fix=f"as root, allow every user to read it until the next boot: `chmod o+r {zones}`; or for good, "
                f"a udev rule: `echo '{_UDEV_RULE}' > /etc/udev/rules.d/99-energy-counter.rules && udevadm "
                f"trigger --action=add --subsystem-match=powercap`; or run the benchmark as root") from None
    except OSError as e:
        raise EnergyCounterUnavailable(f"{path} cannot be read: {e.strerror or e}",
                                       fix="this machine's firmware or hypervisor does not provide the counter; "
                                           "measure on bare metal") from None
    if not text.isdigit():
        raise EnergyCounterUnavailable(f"{path} holds {text!r}, not a count of microjoules",
                                       fix="this kernel's powercap interface is not the one documented in "
                                           "Documentation/power/powercap; measure with another tool")
    return int(text)


def package_domains(root: Path = ROOT) -> list[Domain]:
    """The package zones under `root` (one per CPU package), or EnergyCounterUnavailable."""
    fix = ("on a Ryzen (or Intel) machine load the RAPL driver as root: `modprobe intel_rapl_msr`, then "
           f"`cat {root}/intel-rapl:0/name` should print package-0; virtual machines usually have no energy counter")
    if not root.is_dir():
        raise EnergyCounterUnavailable(f"{root} does not exist (no powercap support in this kernel, or no RAPL "
                                       f"driver loaded)", fix=fix)
    domains = []
    for zone in sorted(root.iterdir()):
        name_file = zone / "name"
        if not _PACKAGE_ZONE.fullmatch(zone.name) or not name_file.is_file():
            continue
        try:
            name = name_file.read_text(errors="replace")[:_MAX_FILE_BYTES].strip()
        except OSError:
            continue
        if _PACKAGE_NAME.fullmatch(name):
            domains.append(Domain(name, zone, _read_int(zone / "max_energy_range_uj", root)))
    if not domains:
        raise EnergyCounterUnavailable(f"{root} has no RAPL package zone (intel-rapl:N named package-N)", fix=fix)
    return domains


class PackageEnergy:
    """The sum of every package's energy counter. Opening reads each counter once, so an unreadable one fails
    here and not in the middle of a measurement."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else ROOT  # read at call time, so tests can point it elsewhere
        self.domains = package_domains(self.root)
        self.read()

    def read(self) -> tuple[int, ...]:
        """Each package's counter, in microjoules."""
        return tuple(_read_int(d.path / "energy_uj", self.root) for d in self.domains)

    @contextmanager
    def measure(self) -> Iterator[Interval]:
        interval = Interval()
        start, t0 = self.read(), time.perf_counter()
        yield interval
        end, t1 = self.read(), time.perf_counter()
        interval.seconds = t1 - t0
        interval.joules = sum(elapsed_uj(a, b, d.max_range_uj) for a, b, d in zip(start, end, self.domains)) / 1e6
