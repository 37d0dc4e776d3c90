"""An audio file (or array) as a dictation source, at real-time, fast or simulated pace."""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

from sdk.errors import UsageError

from ..audio import SAMPLE_RATE, check_audio_path, float_samples, stream_audio, to_mono


class FileSource:
    """An audio file (or array) played as if it were a microphone.

    pace: "realtime" (blocks arrive at the pace of a clock, for demos and latency runs), "fast" (as fast as
    the worker takes them), "simulated" (as fast as possible, but the Stream keeps a virtual clock that
    advances by the audio a real microphone would have delivered while each decode ran, so event times
    and latencies are those of a real-time session on this machine).
    decode_cost: simulated pace only: seconds the virtual clock charges per decode instead of its wall time,
    a machine of that speed whatever the load of this one (tests of the engine's timing use it).
    """

    def __init__(self, audio: str | Path | np.ndarray, sample_rate: int | None = None, *,
                 pace: str = "realtime", block_seconds: float = 0.1, decode_cost: float | None = None):
        if pace not in ("realtime", "fast", "simulated"):
            raise UsageError(f"pace must be realtime, fast or simulated, got {pace!r}")
        if isinstance(audio, np.ndarray) and sample_rate is None:
            raise UsageError("pass sample_rate with an array")
        if decode_cost is not None and (pace != "simulated" or not decode_cost >= 0):
            raise UsageError(f"decode_cost is a simulated pace's seconds per decode (>= 0), got {decode_cost!r}"
                             f" with pace {pace!r}", fix="pass pace='simulated', or leave decode_cost out")
        self.audio, self.sample_rate, self.pace, self.block_seconds = audio, sample_rate, pace, block_seconds
        self.decode_cost = decode_cost
        self.backpressure = pace != "realtime"

    def check(self) -> None:
        """Check the audio now, so that a missing or unreadable file fails before an app loads a model: a file's
        header is read (its samples are decoded while it plays, block by block, so memory stays bounded)."""
        if isinstance(self.audio, np.ndarray):
            self._blocks()
            return
        check_audio_path(Path(self.audio))
        for block in stream_audio(self.audio, block_seconds=self.block_seconds):  # a file with no samples raises
            if len(block):
                break

    def _blocks(self):
        """(rate, an iterator of mono float32 blocks): an array as it is, a file decoded and resampled to 16 kHz
        block by block."""
        if isinstance(self.audio, np.ndarray):
            audio, rate = to_mono(float_samples(self.audio)), int(self.sample_rate)
            step = max(1, int(rate * self.block_seconds))
            return rate, (audio[i:i + step] for i in range(0, len(audio), step))
        return SAMPLE_RATE, stream_audio(self.audio, block_seconds=self.block_seconds)

    def run(self, push: Callable[[np.ndarray, int], None], stop: threading.Event) -> None:
        rate, blocks = self._blocks()
        t0, pushed = time.monotonic(), 0
        for block in blocks:
            if stop.is_set():
                return
            if self.pace == "realtime":
                delay = t0 + pushed / rate - time.monotonic()
                if delay > 0 and stop.wait(delay):
                    return
            if len(block):
                push(block, rate)
                pushed += len(block)
