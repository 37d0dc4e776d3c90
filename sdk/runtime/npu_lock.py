"""The cross-process NPU lock: the NPU is single-tenant, so one process at a time uses it, whoever runs it.

The lock is an flock on the device node itself (/dev/accel/accelN). Every process that uses the NPU opens
that node, whichever user runs it, so all of them contend for the one inode; flock needs no write access
(flock(2): a lock is placed whatever the mode the file was opened in), so the node is opened read-only.
Nothing is created, truncated or written: no path that another user could replace (a lock file in /tmp can be
a planted symlink to a victim's file) is ever opened for writing. The kernel drops the lock when the process
exits, however it exits. A holder is named by its pid from /proc/locks, which lists every user's flocks.
"""
from __future__ import annotations

import fcntl
import glob
import os
from pathlib import Path

from ..errors import DeviceBusy, DeviceUnavailable
from . import checks

PROC_LOCKS = Path("/proc/locks")


class NpuLock:
    """An exclusive flock on one NPU device node, held until release() (or the process's exit)."""

    def __init__(self, node: str, fd: int):
        self.node, self.fd = node, fd

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the last descriptor of an open file drops its flock
            self.fd = -1


def device_node() -> str:
    """The node pyxrt.device(0) opens: the first /dev/accel/accel* (checks.DEVICE_NODES)."""
    nodes = sorted(glob.glob(checks.DEVICE_NODES))
    if not nodes:
        raise DeviceUnavailable(f"no NPU device node ({checks.DEVICE_NODES})",
                                fix="load the amdxdna driver (`sudo modprobe amdxdna`, Linux >= 6.14); "
                                    "run `aie-apps doctor`")
    return nodes[0]


def acquire(node: str | None = None) -> NpuLock:
    """Take the NPU for this process, or DeviceBusy naming the process that holds it."""
    node = node or device_node()
    try:
        fd = os.open(node, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as e:
        raise DeviceUnavailable(f"cannot open the NPU device node {node}: {e.strerror}",
                                fix="sudo usermod -aG render $USER, then log out and in again") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = holder(fd)
        os.close(fd)
        who = f"process {pid}" if pid else "another process"
        raise DeviceBusy(f"the NPU is in use by {who} (it holds the lock on {node})",
                         fix="close the other program using the NPU (`aie-apps` or any other), or run this one with "
                             "--device cpu") from None
    return NpuLock(node, fd)


def holder(fd: int, proc_locks: Path = PROC_LOCKS) -> int | None:
    """The pid of the process holding an flock on fd's inode, from /proc/locks ("N: FLOCK ADVISORY WRITE PID
    MAJ:MIN:INODE START END", the device numbers in hex), or None when it is not listed."""
    st = os.fstat(fd)
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        lines = proc_locks.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if "->" in fields:  # a waiter, listed under the holder
            continue
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == where and fields[4].isdigit():
            return int(fields[4])
    return None
