"""The control socket of a running dictation session: `dictate stop|cancel|toggle` (from a desktop key
binding) reach it over a user-only unix socket in $XDG_RUNTIME_DIR; nothing here grabs global hotkeys."""
from __future__ import annotations

import os
import socket
import stat
import sys
import threading
from pathlib import Path

from sdk import settings as sdk_settings
from sdk.errors import DeviceIOError, UsageError

from .cli import err

SOCKET_NAME = "aie-apps-dictate.sock"
SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes on Linux, the last one a NUL
_SOCKET_FIX = "set XDG_RUNTIME_DIR to a short folder only you can write (normally /run/user/$(id -u))"


def socket_path(settings=None) -> Path:
    settings = settings or sdk_settings.load()
    return check_socket_path(settings.runtime_dir / SOCKET_NAME)


def check_socket_path(path: Path) -> Path:
    """`path` if a control socket can live there: short enough for AF_UNIX, in a folder (not a file), and not
    a folder or a non-socket file itself; else the error that says which and what to do."""
    if len(os.fsencode(path)) > SOCKET_PATH_MAX:
        raise UsageError(f"the control socket path {path} is {len(os.fsencode(path))} bytes, longer than a unix "
                         f"socket path can be ({SOCKET_PATH_MAX})", fix=_SOCKET_FIX)
    if path.parent.exists() and not path.parent.is_dir():
        raise UsageError(f"the control socket's folder {path.parent} is a file, not a folder", fix=_SOCKET_FIX)
    if path.is_dir():
        raise UsageError(f"the control socket path {path} is a folder", fix=f"move {path} away, or {_SOCKET_FIX}")
    if path.exists() and not stat.S_ISSOCK(path.lstat().st_mode):
        raise UsageError(f"{path} is a {'symlink' if path.is_symlink() else 'regular file'}, not a dictation "
                         f"control socket; it is left alone", fix=f"move {path} away, or {_SOCKET_FIX}")
    return path


def send(command_word: str, path: Path | None = None) -> str | None:
    """Send a command to the running session; None when none is running (a stale socket is removed; nothing
    else at that path is ever deleted)."""
    path = check_socket_path(path or socket_path())
    if not path.exists():
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        try:
            s.connect(str(path))
        except ConnectionRefusedError:  # a socket nobody listens on: left by a session that was killed
            path.unlink(missing_ok=True)
            return None
        except FileNotFoundError:
            return None
        except OSError as e:
            raise UsageError(f"cannot reach the dictation session at {path}: {e.strerror or e}",
                             fix=f"check the permissions of {path.parent}, or {_SOCKET_FIX}") from None
        try:
            s.sendall(command_word.encode() + b"\n")
            reply = s.recv(1024)
        except TimeoutError:
            raise DeviceIOError(f"the dictation session at {path} did not answer within 5 s",
                                fix="it may be hung: end it with `kill <pid>` (it saves what it captured)") from None
        except OSError as e:
            raise DeviceIOError(f"the dictation session at {path} closed the connection: {e.strerror or e}",
                                fix="run the command again; if it keeps failing, restart the session") from None
        return reply.decode("utf-8", errors="replace").strip()


class ControlServer:
    """Accepts `stop`, `cancel`, `toggle`, `start`, `status` from the same user over a 0600 unix socket."""

    def __init__(self, path: Path, handle):
        self.path, self.handle = path, handle
        if send("status", path) is not None:
            raise UsageError(f"a dictation session is already running (socket {path})",
                             fix="stop it with `aie-apps dictate stop`, or use `aie-apps dictate toggle`")
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            path.unlink(missing_ok=True)  # a stale socket (send() above found nobody listening)
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            old = os.umask(0o177)  # the socket is created 0600: only this user may control dictation
            try:
                self.sock.bind(str(path))
            finally:
                os.umask(old)
            os.chmod(path, 0o600)
        except OSError as e:
            raise UsageError(f"cannot create the control socket {path}: {e.strerror or e}", fix=_SOCKET_FIX) from None
        self.sock.listen(4)
        self.sock.settimeout(0.2)
        self._closed = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="dictation-control", daemon=True)
        self.thread.start()

    def _serve(self):
        while not self._closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            with conn:
                try:
                    self._answer(conn)
                except Exception as e:  # this thread must outlive any client: the session stays controllable
                    err(f"dictation: dropped a control message ({type(e).__name__}: {e})")

    def _answer(self, conn: socket.socket) -> None:
        """One request: a command word of at most 64 bytes; whatever else arrives gets an answer or is dropped."""
        conn.settimeout(2)  # a client that sends nothing holds the server for at most this long
        try:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            if int.from_bytes(creds[4:8], sys.byteorder) != os.getuid():
                conn.sendall(b"refused\n")
                return
            raw = conn.recv(64)
            word = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            conn.sendall(b"unknown command (not UTF-8)\n")
            return
        except OSError:  # gone, or silent past the timeout
            return
        reply = self.handle(word) if word.isprintable() else f"unknown command {word!r}"
        try:
            conn.sendall((reply + "\n").encode("utf-8", errors="replace"))
        except OSError:
            pass

    def close(self):
        self._closed.set()
        self.thread.join(2)
        self.sock.close()
        self.path.unlink(missing_ok=True)
