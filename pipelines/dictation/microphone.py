"""A microphone as a dictation source: PortAudio capture at the device's rate, with unplug and stall detection."""
from __future__ import annotations

import threading
import time
from typing import Callable

import numpy as np

from sdk.errors import DeviceIOError

from . import devices
from .devices import InputDevice


class Microphone:
    """A PortAudio input opened at the device's own sample rate (16 kHz is often refused); the Stream
    resamples. A microphone never blocks: if the worker falls behind, the ring buffer counts the loss.

    A device that vanishes is reported as unplugged: when PortAudio stops the stream, or when no block has
    come for stall_timeout s (a live stream calls back every 50 ms block; PulseAudio, moving a stream whose
    device went away to its fallback source, holds blocks back for about 2.0 s, measured: at 2 s that
    unplug would be a coin toss). The first block may be slow: PulseAudio's ALSA device took up to 1.4 s
    (measured, idle machine), so before it the wait is start_timeout.
    """

    backpressure = False

    def __init__(self, device: int | str | None = None, *, block_seconds: float = 0.05, stall_timeout: float = 1.5,
                 start_timeout: float = 5.0):
        self.device, self.block_seconds = device, block_seconds
        self.stall_timeout, self.start_timeout = stall_timeout, start_timeout
        self.overflows = 0           # blocks PortAudio reported as lost before they reached us
        self.info: InputDevice | None = None

    def check(self) -> None:
        """Raise now the error run() would raise for a missing microphone (or --input-device naming none), so
        that an app fails before it loads a model. A busy device is only found when run() opens it."""
        self.info = devices.find_input_device(self.device)

    def run(self, push: Callable[[np.ndarray, int], None], stop: threading.Event) -> None:
        sd = devices.load_sounddevice()
        self.info = info = devices.find_input_device(self.device)
        rate = int(info.default_samplerate) or 48000
        last_block: list[float | None] = [None]

        def callback(indata, frames, time_info, status):
            if status.input_overflow:
                self.overflows += 1
            last_block[0] = time.monotonic()
            push(indata.mean(axis=1, dtype=np.float32), rate)

        try:
            stream = sd.InputStream(device=info.index, samplerate=rate, channels=1, dtype="float32",
                                    blocksize=max(1, int(rate * self.block_seconds)), callback=callback)
            stream.start()
        except (sd.PortAudioError, ValueError) as e:
            raise _open_error(info, e) from None
        opened = time.monotonic()
        try:
            while not stop.wait(0.05):
                if not stream.active:
                    raise _unplugged(info, "the audio stream stopped")
                if last_block[0] is None and time.monotonic() - opened > self.start_timeout:
                    raise DeviceIOError(f"microphone {info.name!r} opened, but no audio arrived"
                                        f" in {self.start_timeout:g} s",
                                        fix="check it is enabled and not muted in the sound settings, or pick"
                                            " another with --input-device (`aie-apps dictate --list-devices`)")
                if last_block[0] is not None and time.monotonic() - last_block[0] > self.stall_timeout:
                    raise _unplugged(info, f"no audio arrived for {self.stall_timeout:g} s")
        finally:
            try:
                stream.close(ignore_errors=True)
            except Exception:  # closing a vanished device can fail again; the error that matters is raised
                pass


def _open_error(info: InputDevice, e: Exception) -> DeviceIOError:
    text = str(e)
    if "Device unavailable" in text or "busy" in text.lower() or "-9985" in text:
        return DeviceIOError(f"microphone {info.name!r} is busy: {text}",
                             fix="close the other program using it, or pick another with --input-device")
    return DeviceIOError(f"cannot open microphone {info.name!r} at {info.default_samplerate:g} Hz: {text}",
                         fix="check it is plugged in (`aie-apps dictate --list-devices`), or pick another with --input-device")


def _unplugged(info: InputDevice, why: str) -> DeviceIOError:
    return DeviceIOError(f"microphone {info.name!r} stopped delivering audio ({why}); it may have been unplugged",
                         fix="reconnect it and start again; the audio captured before this was transcribed"
                             " (and saved if --save-audio was given)")
