"""An audio file (or array) as a dictation source, at real-time, fast or simulated pace."""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

from sdk.errors import UsageError

from ..audio import float_samples, read_audio, to_mono


class FileSource:
    """An audio file (or array) played as if it were a microphone.

    pace: "realtime" (blocks arrive at the pace of a clock, for demos and latency runs), "fast" (as fast as
    the worker takes them), "simulated" (as fast as possible, but the Stream keeps a virtual clock that
    advances by the audio a real microphone would have delivered while each decode ran, so event times
    and latencies are those of a real-time session on this machine).
    """

    def __init__(self, audio: str | Path | np.ndarray, sample_rate: int | None = None, *,
                 pace: str = "realtime", block_seconds: float = 0.1):
        if pace not in ("realtime", "fast", "simulated"):
            raise UsageError(f"pace must be realtime, fast or simulated, got {pace!r}")
        if isinstance(audio, np.ndarray) and sample_rate is None:
            raise UsageError("pass sample_rate with an array")
        self.audio, self.sample_rate, self.pace, self.block_seconds = audio, sample_rate, pace, block_seconds
        self.backpressure = pace != "realtime"
        self._loaded: tuple[np.ndarray, int] | None = None

    def check(self) -> None:
        """Read the audio now (run() reuses it), so that a missing or unreadable file fails before an app loads
        a model."""
        self._load()

    def _load(self) -> tuple[np.ndarray, int]:
        if self._loaded is None:
            if isinstance(self.audio, np.ndarray):
                self._loaded = to_mono(float_samples(self.audio)), int(self.sample_rate)
            else:
                audio, rate = read_audio(self.audio)
                self._loaded = to_mono(float_samples(audio, str(self.audio))), rate
        return self._loaded

    def run(self, push: Callable[[np.ndarray, int], None], stop: threading.Event) -> None:
        audio, rate = self._load()
        block = max(1, int(rate * self.block_seconds))
        t0 = time.monotonic()
        for start in range(0, len(audio), block):
            if stop.is_set():
                return
            if self.pace == "realtime":
                delay = t0 + start / rate - time.monotonic()
                if delay > 0 and stop.wait(delay):
                    return
            push(audio[start:start + block], rate)
