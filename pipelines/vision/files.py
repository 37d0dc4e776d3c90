"""Frames from image files and video files, in order."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from sdk.errors import InputError

from .image_file import MAX_IMAGE_PIXELS, read_image


@dataclass
class Frame:
    index: int          # position in its source (0-based)
    time: float         # seconds: stream timestamp for video, since opening for a camera, 0 for images
    image: np.ndarray   # RGB uint8 [H, W, 3]
    source: str         # path, or camera:N
    capture_ms: float   # time spent reading/decoding (or waiting for) this frame


class ImageFiles:
    """Image files (a folder expands to its images, sorted by name). An unreadable file raises InputError
    when reached, or, given `on_error`, is reported there and skipped; so is one declaring more than
    `max_pixels` pixels."""
    kind = "images"

    def __init__(self, paths: Sequence[Path], on_error: Callable[[InputError], None] | None = None, *,
                 max_pixels: int = MAX_IMAGE_PIXELS):
        self.paths, self.on_error, self.max_pixels = list(paths), on_error, max_pixels
        self.name = str(self.paths[0]) if len(self.paths) == 1 else f"{len(self.paths)} images"

    def __iter__(self) -> Iterator[Frame]:
        for index, path in enumerate(self.paths):
            t0 = time.perf_counter()
            try:
                image = read_image(path, max_pixels=self.max_pixels)
            except InputError as e:
                if self.on_error is None:
                    raise
                self.on_error(e)
                continue
            yield Frame(index, 0.0, image, str(path), (time.perf_counter() - t0) * 1e3)

    def close(self):
        pass


class VideoFile:
    """Frames of a video file in order; ends cleanly at the end of the stream. A few unreadable frames in a
    row are skipped (counted in `skipped`); more than `max_bad` in a row ends the video early. `capture` is
    an already opened one (a video file on a server)."""
    kind = "video"

    def __init__(self, path: Path | str, max_bad: int = 5, capture=None):
        import cv2
        self.max_bad, self.skipped = max_bad, 0
        self.name = str(path)
        if capture is None:
            if not Path(path).is_file():
                raise InputError(f"no such video file: {path}", fix="check the path")
            capture = cv2.VideoCapture(str(path))
            if not capture.isOpened():
                raise InputError(f"cannot open {path} as a video (unsupported or corrupt)",
                                 fix="pass a video OpenCV's FFmpeg can decode (mp4, avi, mkv, webm)")
        self.cap = capture
        self.fps = self.cap.get(cv2.CAP_PROP_FPS) or 0.0
        self.frame_count = int(self.cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0)

    def __iter__(self) -> Iterator[Frame]:
        import cv2
        index, bad = 0, 0
        while True:
            t0 = time.perf_counter()
            ok, image = self.cap.read()
            if not ok or image is None:  # the end, or a frame the decoder could not read (already consumed)
                if self.frame_count and index + self.skipped + bad >= self.frame_count or bad + 1 >= self.max_bad:
                    if self.frame_count > index + self.skipped:  # the file promised frames it did not deliver
                        self.skipped += min(bad + 1, self.frame_count - index - self.skipped)
                    return
                bad += 1
                continue
            self.skipped, bad = self.skipped + bad, 0
            seconds = self.cap.get(cv2.CAP_PROP_POS_MSEC) / 1e3
            yield Frame(index, seconds, cv2.cvtColor(image, cv2.COLOR_BGR2RGB), self.name,
                        (time.perf_counter() - t0) * 1e3)
            index += 1

    def close(self):
        self.cap.release()
