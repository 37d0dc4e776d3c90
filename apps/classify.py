"""`aie-apps classify`: top-k labels for camera frames, videos, images and folders.

    aie-apps classify --camera                 # camera 0, overlay window when there is a display
    aie-apps classify --camera 2 --headless --json
    aie-apps classify clip.mp4 photos/ cat.jpg --top-k 3 --threshold 0.1
    aie-apps classify rtsp://192.168.1.20:8554/cam --headless --json
    aie-apps classify --model openai/clip-vit-base-patch32 --labels "cat,dog,coffee mug" --camera

Results go to stdout (one line per frame; `--json` makes them JSON lines), notes and the end-of-run timing per
stage (capture, preprocess, infer, postprocess, display) to stderr. The window shows the top label, its
score, inference ms and a smoothed FPS; `q` or Esc closes it.
"""
from __future__ import annotations

import json
import socket
import sys
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import typer

from sdk import settings as sdk_settings
from sdk.errors import InputError, UsageError

from .cli import DeviceOpt, app, command, err, report_error, utf8_argument
from .progress import progress

WINDOW = "aie-apps classify"
IMAGE_SECONDS = 1.0  # how long the window shows each still image
STAGES = ("capture", "preprocess", "infer", "postprocess", "display")


def gui_available() -> tuple[bool, str]:
    """(usable, why not): OpenCV needs a GUI build and a display it can reach (Qt aborts the process without
    one). Only GTK3 and OpenCV's own Wayland backend talk Wayland; the others (the opencv-python wheel's Qt
    ships only the X11 plugin) need DISPLAY, which a Wayland session has only with XWayland."""
    import cv2
    gui = next((line.split(":", 1)[1].strip() for line in cv2.getBuildInformation().splitlines()
                if line.strip().startswith("GUI:")), "NONE").upper()
    if gui == "NONE":
        return False, "this OpenCV has no GUI (opencv-python-headless?); install opencv-python for the window"
    settings = sdk_settings.load()
    if not settings.has_display:
        return False, "no display (DISPLAY is not set)"
    if not settings.x11_display and gui not in ("GTK3", "WAYLAND"):
        return False, f"DISPLAY is not set and OpenCV's {gui} window needs X11 (XWayland on a Wayland desktop)"
    if settings.x11_display and gui not in ("WAYLAND",) and not x11_reachable(settings.display):
        return False, f"the X display {settings.display!r} does not answer (DISPLAY names no running X server)"
    return True, ""


def x11_reachable(display: str, timeout: float = 1.0) -> bool:
    """Whether an X server listens at DISPLAY ("[host]:N[.screen]"): Qt aborts the process when it cannot
    connect, so this is checked first. Local displays are the socket /tmp/.X11-unix/XN (or its abstract twin),
    remote ones TCP port 6000 + N."""
    host, _, rest = display.rpartition(":")
    number = rest.split(".")[0]
    if not number.isdigit():
        return False
    if host in ("", "unix") or host.startswith("/"):
        addresses = [(socket.AF_UNIX, f"/tmp/.X11-unix/X{number}"), (socket.AF_UNIX, f"\0/tmp/.X11-unix/X{number}")]
    else:
        addresses = [(socket.AF_INET, (host, 6000 + int(number)))]
    for family, address in addresses:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.settimeout(timeout)
                s.connect(address)
                return True
        except OSError:
            continue
    return False


class Stats:
    """Per-stage milliseconds over the run, and a smoothed FPS over the last 30 frames."""

    def __init__(self):
        self.ms = {s: [] for s in STAGES}
        self.stamps: deque[float] = deque(maxlen=30)
        self.started = time.perf_counter()
        self.frames = 0

    def tick(self) -> float:
        self.stamps.append(time.perf_counter())
        if len(self.stamps) < 2:
            return 0.0
        return (len(self.stamps) - 1) / (self.stamps[-1] - self.stamps[0])

    def summary(self) -> str:
        frames, wall = self.frames, time.perf_counter() - self.started
        lines = [f"{frames} frames in {wall:.2f} s ({frames / wall if wall else 0:.1f} FPS overall)"]
        for stage in STAGES:
            v = np.asarray(self.ms[stage])
            if v.size:
                lines.append(f"  {stage:<12} mean {v.mean():8.2f} ms   p50 {np.median(v):8.2f}   "
                             f"p90 {np.percentile(v, 90):8.2f}   total {v.sum() / 1e3:7.2f} s")
        return "\n".join(lines)


def draw_overlay(rgb: np.ndarray, predictions, infer_ms: float, fps: float, device: str) -> np.ndarray:
    """The frame (BGR, for imshow) with a banner: top label and score, inference ms, smoothed FPS."""
    import cv2
    bgr = cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)
    if bgr.shape[1] < 480:  # small frames: scale up so the text stays legible
        f = 480 / bgr.shape[1]
        bgr = cv2.resize(bgr, (480, int(round(bgr.shape[0] * f))), interpolation=cv2.INTER_NEAREST)
    best = f"{predictions[0].label}: {100 * predictions[0].score:.1f}%" if predictions else "no label above --threshold"
    lines = [best,
             f"infer {infer_ms:.1f} ms   FPS {fps:.1f}   {device}"]
    height = 14 + 28 * len(lines)
    banner = bgr[:height].copy()
    banner[:] = (20, 20, 20)
    bgr[:height] = cv2.addWeighted(bgr[:height], 0.3, banner, 0.7, 0)
    for i, text in enumerate(lines):
        cv2.putText(bgr, text, (10, 30 + 28 * i), cv2.FONT_HERSHEY_SIMPLEX, 0.75, (255, 255, 255), 2, cv2.LINE_AA)
    return bgr


def _parse_labels(labels: str | None) -> list[str] | None:
    if not labels:
        return None
    parsed = _read_labels(labels)
    if len(parsed) == 1:  # softmax over one label: every frame would score 100%
        a_file = not labels.startswith("@") and Path(labels).is_file()  # `--labels labels.txt`, as other tools take it
        raise UsageError(f"one label ({parsed[0]!r}): CLIP scores the labels against each other, so it would "
                         "always score 100%",
                         fix=f"to read the labels in {labels}, pass --labels @{labels}" if a_file
                         else "give two or more labels")
    return parsed


def _read_labels(labels: str) -> list[str]:
    if labels.startswith("@"):
        try:
            lines = Path(labels[1:]).read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise InputError(f"cannot read labels file {labels[1:]}: {e.strerror}", fix="one label per line") from None
        except UnicodeDecodeError as e:
            raise InputError(f"cannot read labels file {labels[1:]}: {e}",
                             fix="save it as UTF-8 text, one label per line") from None
        return [line.strip() for line in lines if line.strip()]
    labels = utf8_argument(labels, "--labels", fix="pass UTF-8 text, or @FILE with one label per line")
    return [part.strip() for part in labels.split(",") if part.strip()]


@app.command("classify")
@command
def classify(
    sources: Annotated[Optional[list[str]], typer.Argument(
        help="camera index or /dev/videoN, video file, image, folder of images, or URL (http, rtsp, ...)")] = None,
    camera: Annotated[bool, typer.Option("--camera", help="read a camera: --camera (0) or --camera IDX")] = False,
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1, help="labels per frame")] = 5,
    threshold: Annotated[float, typer.Option(
        "--threshold", min=0.0, max=1.0, help="show only labels scoring at least this (0..1)")] = 0.0,
    labels: Annotated[Optional[str], typer.Option(
        "--labels", help="CLIP zero-shot labels: comma-separated, or @file with one per line")] = None,
    jsonl: Annotated[bool, typer.Option("--json", help="JSON lines: one object per frame on stdout")] = False,
    old_jsonl: Annotated[bool, typer.Option("--jsonl", hidden=True)] = False,
    headless: Annotated[bool, typer.Option("--headless", help="no window, even when a display is available")] = False,
    list_cameras: Annotated[bool, typer.Option("--list-cameras", help="list video capture devices and exit")] = False,
    max_frames: Annotated[Optional[int], typer.Option(
        "--max-frames", min=1, help="stop after this many frames (cameras otherwise run until q / Ctrl-C)")] = None,
    max_pixels: Annotated[Optional[int], typer.Option(
        "--max-pixels", min=1, help="refuse image files declaring more pixels (width x height, read from the header "
                                    "before decoding; default 64000000 = 8000 x 8000)")] = None,
    model: Annotated[str, typer.Option("--model", help="model name or folder (ViT, ResNet, or CLIP with --labels)")]
    = "google/vit-base-patch16-224",
    device: DeviceOpt = None,
):
    """Classify camera frames, videos, images and folders; overlay window or JSON lines.
    A missing or unreadable file, folder or video is reported on stderr and skipped; the exit code is then 1."""
    from pipelines import vision

    if old_jsonl:
        err("note: --jsonl is deprecated: use --json")
        jsonl = True
    if list_cameras:
        if sources or camera:
            raise UsageError("--list-cameras lists the cameras and exits; it classifies nothing",
                             fix="run it without SOURCE and --camera, then classify the camera you picked")
        _print_cameras(vision.list_cameras(), jsonl)
        return
    specs = list(sources or [])
    if camera and not any(vision.is_camera(s) for s in specs):
        specs.append("0")  # bare --camera; `--camera 2` arrives as the SOURCE "2"
    if not specs:
        raise UsageError("nothing to classify", fix="pass a SOURCE (image, folder, video, camera index) or --camera")
    class_names = _parse_labels(labels)
    failures = []

    def on_error(e: InputError):
        failures.append(e)
        report_error(e)

    usable = []
    for spec in specs:  # before the model loads (seconds): a run with nothing to read ends at once
        try:
            vision.check_source(spec)
            usable.append(spec)
        except InputError as e:
            on_error(e)
    if not usable:
        raise typer.Exit(1)
    show = False
    if not headless:
        show, why = gui_available()
        if not show:
            err(f"note: {why}; running headless")

    options = replace(vision.FRAME_OPTIONS, top_k=top_k, threshold=threshold,
                      max_pixels=max_pixels or vision.MAX_IMAGE_PIXELS)
    clf = vision.ImageClassifier(model, labels=class_names, device=device, options=options)
    if show:
        import cv2
        cv2.namedWindow(WINDOW, cv2.WINDOW_AUTOSIZE | cv2.WINDOW_GUI_NORMAL)  # no toolbar over the frame
        cv2.moveWindow(WINDOW, 0, 0)
    stats = Stats()
    device_name = clf.session.device_effective
    try:
        with clf:
            for spec in usable:
                try:
                    source = vision.open_source(spec, on_error, max_pixels=options.max_pixels)
                except InputError as e:  # a missing or unopenable source is skipped like an unreadable image
                    on_error(e)
                    continue
                try:
                    stop = _run(source, clf, stats, max_frames, top_k, show, jsonl, device_name)
                except InputError as e:  # a stream that ended: the frames so far are out, the next source goes on
                    on_error(e)
                    stop = False
                finally:
                    source.close()
                    if source.kind == "camera":
                        err(f"note: {source.name}: {source.dropped} stale camera frames dropped")
                    elif getattr(source, "skipped", 0):
                        err(f"note: {source.name}: {source.skipped} unreadable frames skipped")
                if stop:
                    break
    finally:
        if show:
            import cv2
            cv2.destroyAllWindows()
        err(stats.summary())
        r = clf.report()
        err(f"  device: requested {r['device_requested']}, effective {r['device_effective']}"
            + (f", NPU share {r['npu_fraction']['flops']:.0%} of FLOPs" if "npu_fraction" in r else ""))
    if failures:
        raise typer.Exit(1)


def _run(source, clf, stats: Stats, max_frames, top_k, show, jsonl, device_name) -> bool:
    """Classify every frame of one source; returns whether to stop (q / Esc / window closed / --max-frames)."""
    pace = show and source.kind == "video" and getattr(source, "fps", 0) > 0  # play files at their own rate
    start = time.perf_counter()
    total = len(source.paths) if source.kind == "images" else getattr(source, "frame_count", 0) or None
    with progress(f"classifying {source.name}", total=total, unit="frames",
                  enabled=not jsonl and not show and source.kind in ("images", "video")) as update:
        return _frames(source, clf, stats, max_frames, top_k, show, jsonl, device_name, pace, start, update)


def _frames(source, clf, stats: Stats, max_frames, top_k, show, jsonl, device_name, pace, start, update) -> bool:
    import cv2
    for done, frame in enumerate(source, 1):
        stats.ms["capture"].append(frame.capture_ms)
        t0 = time.perf_counter()
        pixels = clf.preprocess(frame.image)[None]
        t1 = time.perf_counter()
        probs = clf.infer(pixels)
        t2 = time.perf_counter()
        predictions = clf.top_k(probs, top_k)[0]
        t3 = time.perf_counter()
        infer_ms = (t2 - t1) * 1e3
        for stage, ms in (("preprocess", t1 - t0), ("infer", t2 - t1), ("postprocess", t3 - t2)):
            stats.ms[stage].append(ms * 1e3)
        fps = stats.tick()
        _emit(frame, predictions, (t3 - t0) * 1e3, infer_ms, device_name, jsonl)
        stats.frames += 1
        update(done)
        if show:
            cv2.imshow(WINDOW, draw_overlay(frame.image, predictions, infer_ms, fps, device_name))
            stats.ms["display"].append((time.perf_counter() - t3) * 1e3)  # drawing + imshow; pacing excluded
            wait_ms = 1
            if source.kind == "images":
                wait_ms = int(IMAGE_SECONDS * 1e3)
            elif pace:
                wait_ms = max(1, int((start + frame.index / source.fps - time.perf_counter()) * 1e3))
            key = cv2.waitKey(wait_ms) & 0xFF
            if key in (ord("q"), 27) or cv2.getWindowProperty(WINDOW, cv2.WND_PROP_VISIBLE) < 1:
                return True
        if max_frames and stats.frames >= max_frames:
            return True
    return False


def _emit(frame, predictions, latency_ms: float, infer_ms: float, device: str, jsonl: bool):
    if jsonl:
        print(json.dumps({"source": frame.source, "frame": frame.index, "time": round(frame.time, 4),
                          "top_k": [{"label": p.label, "score": round(p.score, 6), "index": p.index}
                                    for p in predictions],
                          "latency_ms": round(latency_ms, 3), "infer_ms": round(infer_ms, 3), "device": device}),
              flush=True)
    else:
        best = "  ".join(f"{p.label} {p.score:.3f}" for p in predictions) or "no label above --threshold"
        print(f"{frame.source} #{frame.index}: {best}  ({latency_ms:.1f} ms)", flush=True)


def _print_cameras(cameras: list[dict], jsonl: bool):
    if not cameras:
        err("no cameras found (no /dev/video* capture devices)")
        return
    for c in cameras:
        if jsonl:
            print(json.dumps(c))
        else:
            size = "x".join(map(str, c.get("size", []))) or "-"
            state = "ok" if c.get("usable") else "not readable (busy, or a metadata node)"
            print(f"{c['index']}\t{c['path']}\t{c['name']}\t{size}\t{state}")
    sys.stdout.flush()
