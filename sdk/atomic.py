"""Atomic file writes: every output of the SDK and the CLI goes through here.

The data goes to a temporary file in the target's own folder (so the rename cannot cross file systems), is
flushed to disk, and is renamed over the target. A reader sees the old file or the new one, never a part of
one; when writing fails (a full disk, a vanished folder) the old file is left as it was and the temporary
file is removed. A symlink at the target is kept and the file it points at is replaced. Ctrl-C during a write
(in the main thread) takes effect once the file is in place.

    write_atomic(path, text)                 # str (UTF-8) or bytes
    with atomic_open(path, "wb") as f:       # for writers that stream (np.savez, soundfile)
        np.savez(f, ...)
"""
from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
from pathlib import Path
from typing import IO, Iterator


def _mode_for(target: Path) -> int:
    """The permissions a new file would get (an existing target keeps its own)."""
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


@contextlib.contextmanager
def _interrupt_after():
    """Holds a Ctrl-C that arrives inside the block and raises it at the end: a writer's own cleanup (zipfile's,
    under np.savez) otherwise turns the KeyboardInterrupt into an unrelated error and a traceback."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:  # a handler of the caller's own
        yield
        return
    held = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if held:
        raise KeyboardInterrupt


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "wb", *, encoding: str | None = "utf-8") -> Iterator[IO]:
    """A file object for `path` whose content replaces `path` only when the block ends without an error.
    Raises OSError (the target unchanged) when the folder is not writable or the disk is full."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes whole files: mode 'w' or 'wb', got {mode!r}")
    target = Path(os.path.realpath(path))  # through a symlink: the link stays, the file it names is replaced
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with _interrupt_after():
            with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
                os.fchmod(f.fileno(), _mode_for(target))
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Replace `path` with `data` (str is written as UTF-8) atomically; returns the path."""
    with atomic_open(path, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)
