"""The bounded buffer between the capture thread and the worker."""
from __future__ import annotations

import threading

import numpy as np


class RingBuffer:
    """Fixed-size float32 ring between capture and the worker; never reallocates, so memory is bounded.

    A writer that must not block (an audio callback) overwrites the oldest unread audio when full and the
    loss is counted in `dropped_blocks` / `dropped_samples`; a writer that may block (a file played as
    fast as possible) waits for space instead.
    """

    def __init__(self, capacity: int):
        self._data = np.zeros(capacity, np.float32)
        self.capacity = capacity
        self.written = 0          # samples ever written
        self.read_pos = 0         # samples ever read (or dropped)
        self.dropped_blocks = 0
        self.dropped_samples = 0
        self.closed = False
        self._cond = threading.Condition()

    def write(self, samples: np.ndarray, *, block: bool) -> None:
        for start in range(0, len(samples), self.capacity // 4):
            self._write(samples[start:start + self.capacity // 4], block)

    def _write(self, x: np.ndarray, block: bool):
        with self._cond:
            if self.closed:
                return
            while block and self.written + len(x) - self.read_pos > self.capacity and not self.closed:
                self._cond.wait(0.1)
            overflow = self.written + len(x) - self.read_pos - self.capacity
            if overflow > 0:
                self.dropped_blocks += 1
                self.dropped_samples += overflow
                self.read_pos += overflow
            i = self.written % self.capacity
            first = min(len(x), self.capacity - i)
            self._data[i:i + first] = x[:first]
            self._data[:len(x) - first] = x[first:]
            self.written += len(x)
            self._cond.notify_all()

    def read(self, max_samples: int | None = None, *, min_samples: int = 1, timeout: float = 0.1) -> np.ndarray | None:
        """Up to max_samples unread samples; waits up to `timeout` for min_samples. None once closed and empty."""
        with self._cond:
            self._cond.wait_for(lambda: self.closed or self.written - self.read_pos >= min_samples, timeout)
            available = self.written - self.read_pos
            if available == 0 and self.closed:
                return None
            n = available if max_samples is None else min(available, max_samples)
            out = self._peek(n)
            self.read_pos += n
            self._cond.notify_all()
            return out

    def unread(self) -> np.ndarray:
        with self._cond:
            return self._peek(self.written - self.read_pos)

    def _peek(self, n: int) -> np.ndarray:
        idx = (self.read_pos + np.arange(n)) % self.capacity
        return self._data[idx]

    def close(self):
        with self._cond:
            self.closed = True
            self._cond.notify_all()
