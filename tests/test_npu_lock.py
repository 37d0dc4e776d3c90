"""The cross-process NPU lock (sdk/runtime/npu_lock.py) against another local user: a planted symlink gets
nothing written through it, and another user's process holding the device node read-only keeps us off the NPU.
The other user is `nobody`, entered with setpriv when this runs as root; otherwise a second process of this
user stands in for it (the lock does not depend on who holds it)."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sdk.errors import DeviceBusy
from sdk.runtime import npu_lock

AS_OTHER_USER = os.geteuid() == 0 and shutil.which("setpriv") is not None
NOBODY = 65534
HOLDER = """import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print(os.getpid(), flush=True)
sys.stdin.read()
"""


def as_other_user(argv: list[str]) -> list[str]:
    if not AS_OTHER_USER:
        return argv
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]


@pytest.fixture
def shared_dir():
    """A folder like /tmp: sticky and writable by every user (pytest's tmp_path is private to this one)."""
    path = Path(tempfile.mkdtemp(prefix="aie-apps-lock-test-"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def node(shared_dir):
    """A stand-in for /dev/accel/accel0, readable by everyone: a character device when this process may make
    one (the null device's numbers), else a regular file (flock treats both the same)."""
    path = shared_dir / "accel0"
    try:
        os.mknod(path, stat.S_IFCHR | 0o644, os.makedev(1, 3))
    except PermissionError:
        path.touch(0o644)
    return str(path)


def test_a_planted_symlink_gets_nothing_written_through_it(shared_dir, node, monkeypatch):
    victim = shared_dir / "victim.txt"
    victim.write_text("the victim's data\n")
    plant = "import os, sys\nfor p in sys.argv[2:]: os.symlink(sys.argv[1], p)"
    links = [shared_dir / "aie-apps-npu.lock", shared_dir / "aie-apps" / "npu.lock"]
    (shared_dir / "aie-apps").mkdir(mode=0o777)
    (shared_dir / "aie-apps").chmod(0o777)
    subprocess.run(as_other_user([sys.executable, "-c", plant, str(victim), *map(str, links)]), check=True)
    monkeypatch.setenv("TMPDIR", str(shared_dir))      # every place a lock file could be looked for
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(shared_dir))
    monkeypatch.setattr(tempfile, "tempdir", str(shared_dir))
    before = sorted(p.name for p in shared_dir.rglob("*"))
    lock = npu_lock.acquire(node)
    try:
        assert victim.read_text() == "the victim's data\n"
        assert sorted(p.name for p in shared_dir.rglob("*")) == before  # nothing created either
        assert os.readlink(links[0]) == str(victim)
    finally:
        lock.release()
    assert victim.read_text() == "the victim's data\n"


def test_another_users_process_holding_the_node_read_only_keeps_us_off(node):
    holder = subprocess.Popen(as_other_user([sys.executable, "-c", HOLDER, node]), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        pid = int(holder.stdout.readline())
        if AS_OTHER_USER:
            assert os.stat(f"/proc/{pid}").st_uid == NOBODY
        with pytest.raises(DeviceBusy, match=f"in use by process {pid} .*{node}") as e:
            npu_lock.acquire(node)
        assert "--device cpu" in e.value.fix
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)
    lock = npu_lock.acquire(node)  # the holder is gone: its flock went with it
    lock.release()


def test_the_lock_is_the_process_until_released(node):
    first = npu_lock.acquire(node)
    with pytest.raises(DeviceBusy, match=f"process {os.getpid()}"):  # a second open file of the node: refused
        npu_lock.acquire(node)
    first.release()
    first.release()  # twice is harmless
    npu_lock.acquire(node).release()


def test_holder_is_read_from_proc_locks_skipping_waiters(tmp_path, node):
    fd = os.open(node, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        locks = tmp_path / "locks"
        locks.write_text(f"1: POSIX  ADVISORY  WRITE 11 {where} 0 EOF\n"
                         f"2: FLOCK  ADVISORY  WRITE 22 00:01:{st.st_ino + 1} 0 EOF\n"
                         f"3: FLOCK  ADVISORY  WRITE 33 {where} 0 EOF\n"
                         f"3: -> FLOCK  ADVISORY  WRITE 44 {where} 0 EOF\n")
        assert npu_lock.holder(fd, locks) == 33
        assert npu_lock.holder(fd, tmp_path / "absent") is None
    finally:
        os.close(fd)
