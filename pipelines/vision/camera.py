"""Live frames from a camera (or a live stream URL), newest first, and the cameras this machine has."""
from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

from sdk.errors import DeviceIOError, InputError

from .files import Frame


class Camera:
    """A live camera (or live stream URL): a grabber thread reads continuously and keeps only the newest frame,
    so a slow model sees the present, not a queue of old frames. MJPG is requested (720p30 on many webcams
    needs it) and the driver buffer is set to 1. Missing, busy or silent cameras raise DeviceIOError; nothing
    blocks for longer than the timeouts."""
    kind = "camera"

    def __init__(self, device: int | str, *, width: int = 0, height: int = 0, first_frame_timeout: float = 5.0,
                 frame_timeout: float = 2.0, open_capture: Callable | None = None):
        import cv2
        self.device = device
        self.stream = isinstance(device, str) and is_url(device)  # a live stream's faults are not a camera's
        self.name = device if self.stream else f"camera:{device}"
        path = Path(f"/dev/video{device}") if isinstance(device, int) else Path(device)
        if open_capture is None:
            check_camera_node(path)
            open_capture = cv2.VideoCapture
        self.cap = open_capture(device if isinstance(device, int) else str(device))
        if not self.cap.isOpened():
            raise DeviceIOError(f"cannot open {self.name} ({path}): it is busy or not a capture device",
                                fix="close other programs using the camera (lsof " + str(path) + "), check "
                                    "permissions (the video group), or pick another with --list-cameras")
        self.cap.set(cv2.CAP_PROP_FOURCC, cv2.VideoWriter_fourcc(*"MJPG"))
        self.cap.set(cv2.CAP_PROP_BUFFERSIZE, 1)
        if width and height:
            self.cap.set(cv2.CAP_PROP_FRAME_WIDTH, width)
            self.cap.set(cv2.CAP_PROP_FRAME_HEIGHT, height)
        self.first_frame_timeout, self.frame_timeout = first_frame_timeout, frame_timeout
        self.dropped = 0          # frames the grabber replaced before anyone took them
        self._latest = None       # (sequence number, seconds, BGR image)
        self._error: str | None = None
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._opened = time.perf_counter()
        self._thread = threading.Thread(target=self._grab, name=f"grabber-{device}", daemon=True)
        self._thread.start()

    def _grab(self):
        seq, failures = 0, 0
        while not self._stop.is_set():
            ok, image = self.cap.read()
            with self._cond:
                if ok and image is not None:
                    failures = 0
                    if self._latest is not None and self._latest[0] == seq:
                        self.dropped += 1
                    seq += 1
                    self._latest = (seq, time.perf_counter() - self._opened, image)
                    self._cond.notify_all()
                else:
                    failures += 1
                    if failures >= 30:  # about a second of failed reads at 30 fps: the camera went away
                        self._error = (f"{self.name} stopped delivering frames (unplugged, taken by another "
                                       "program, or the stream ended)")
                        self._cond.notify_all()
                        return
            if not ok:
                time.sleep(0.03)

    def __iter__(self) -> Iterator[Frame]:
        import cv2
        taken, index = 0, 0
        while not self._stop.is_set():
            t0 = time.perf_counter()
            timeout = self.first_frame_timeout if index == 0 else self.frame_timeout
            with self._cond:
                ready = self._cond.wait_for(lambda: self._error or (self._latest and self._latest[0] > taken),
                                            timeout=timeout)
                # a stream that ends is a source that ended (skipped like an unreadable file), not a device fault
                fault = InputError if self.stream else DeviceIOError
                if self._error:
                    raise fault(self._error, fix="check that the stream is still up, and run again"
                                if self.stream else "reconnect the camera and run again")
                if not ready:
                    raise fault(f"{self.name} delivered no frame within {timeout:g} s (busy or stalled)",
                                fix="check the stream in a video player" if self.stream
                                else "close other programs using the camera, or pick another one")
                taken, seconds, image = self._latest
            yield Frame(index, seconds, cv2.cvtColor(image, cv2.COLOR_BGR2RGB), self.name,
                        (time.perf_counter() - t0) * 1e3)
            index += 1

    def close(self):
        self._stop.set()
        self._thread.join(timeout=2.0)
        if not self._thread.is_alive():  # never release under a read that is still blocked
            self.cap.release()


def _camera_fix() -> str:
    found = [c["path"] for c in list_cameras(probe=False)]
    return (f"cameras present: {', '.join(found)}" if found else "no /dev/video* devices: connect a camera "
            "(and check `dmesg` for the uvcvideo driver)") + "; see `aie-apps classify --list-cameras`"


def list_cameras(probe: bool = True) -> list[dict]:
    """Video4Linux capture nodes: index, path, driver name, and (probe=True) whether a frame can be read."""
    cameras = []
    for path in sorted(Path("/dev").glob("video*"), key=lambda p: int(p.name[5:]) if p.name[5:].isdigit() else 0):
        if not path.name[5:].isdigit():
            continue
        name_file = Path("/sys/class/video4linux") / path.name / "name"
        entry = {"index": int(path.name[5:]), "path": str(path),
                 "name": name_file.read_text().strip() if name_file.exists() else ""}
        if probe:
            import cv2
            cap = cv2.VideoCapture(entry["index"])
            entry["usable"] = bool(cap.isOpened() and cap.read()[0])
            if entry["usable"]:
                entry["size"] = [int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))]
            cap.release()
        cameras.append(entry)
    return cameras


def check_camera_node(path: Path) -> None:
    if not path.exists():
        raise DeviceIOError(f"no camera at {path}", fix=_camera_fix())


def is_url(spec: str) -> bool:
    """A SOURCE that names a URL (http, rtsp, ...): a live one is read like a camera."""
    return re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", spec) is not None
