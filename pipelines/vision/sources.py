"""A SOURCE argument (camera index, /dev/videoN, video file, image file, folder of images, URL) -> frames."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from sdk.errors import InputError

from .camera import Camera, check_camera_node, is_url
from .files import ImageFiles, VideoFile
from .image_file import MAX_IMAGE_PIXELS

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}
VIDEO_SUFFIXES = {".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v", ".mpg", ".mpeg", ".wmv", ".gif"}


def check_source(spec: str) -> None:
    """Raise the InputError open_source would for a missing file or a folder without images (cheap, and opens
    nothing: an app can check all its sources before it loads a model). A camera's device node must exist
    (DeviceIOError); whether it opens, and URLs, are found when opened."""
    if is_camera(spec):
        check_camera_node(Path(f"/dev/video{spec}") if spec.isdigit() else Path(spec))
        return
    if is_url(spec):
        return
    path = Path(spec).expanduser()
    if path.is_dir():
        _folder_images(path)
    elif not path.exists():
        raise InputError(f"no such file or folder: {spec}", fix="check the path, or pass a camera index")


def is_camera(spec: str) -> bool:
    """A SOURCE that names a camera: an index or /dev/videoN."""
    return spec.isdigit() or spec.startswith("/dev/video")


STREAM_TIMEOUT_MS = 10_000  # opening a URL, and each read from it: an unresponsive server cannot hang the run


def _open_url(url: str):
    """A video file on a server plays in order (VideoFile); a live stream, which has no frame count, is read
    like a camera, newest frame only."""
    import cv2
    cap = cv2.VideoCapture(url, cv2.CAP_FFMPEG, [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, STREAM_TIMEOUT_MS,
                                                 cv2.CAP_PROP_READ_TIMEOUT_MSEC, STREAM_TIMEOUT_MS])
    if not cap.isOpened():
        raise InputError(f"cannot open {url} (unreachable, or not a video or stream FFmpeg can read)",
                         fix="check the address, and that the server is up and the stream plays in a video player")
    if cap.get(cv2.CAP_PROP_FRAME_COUNT) > 0:
        return VideoFile(url, capture=cap)
    return Camera(url, open_capture=lambda _: cap)


def _folder_images(path: Path) -> list[Path]:
    images = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not images:
        raise InputError(f"no images in folder {path}", fix=f"add {', '.join(sorted(IMAGE_SUFFIXES))} files")
    return images


def open_source(spec: str, on_error: Callable[[InputError], None] | None = None, *,
                max_pixels: int = MAX_IMAGE_PIXELS):
    """A SOURCE argument -> ImageFiles, VideoFile or Camera: a camera index or /dev/videoN, a video file,
    an image file, a folder of images, or a URL (http, rtsp, ...: a video file on a server, or a live stream).
    Image files declaring more than `max_pixels` pixels are refused like unreadable ones."""
    if is_camera(spec):
        return Camera(int(spec) if spec.isdigit() else spec)
    if is_url(spec):
        return _open_url(spec)
    path = Path(spec).expanduser()
    if path.is_dir():
        return ImageFiles(_folder_images(path), on_error, max_pixels=max_pixels)
    check_source(spec)
    if path.suffix.lower() in VIDEO_SUFFIXES:
        return VideoFile(path)
    return ImageFiles([path], on_error, max_pixels=max_pixels)
