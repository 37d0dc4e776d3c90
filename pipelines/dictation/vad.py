"""Voice activity from energy and voicing, per 30 ms frame, without a model."""
from __future__ import annotations

from collections import deque

import numpy as np

from .options import FRAME, FRAME_SECONDS, SAMPLE_RATE, DictationOptions


class Vad:
    """Dependency-free voice activity: per 30 ms frame, `loud` (energy vs an adaptive floor) and `voiced`.

    The floor is the 10th percentile of the last 5 s of frame energies: speech always has gaps, so the
    floor follows the room, not the talker. It starts at `vad_min_db`, so the first seconds of a noisy
    room look loud; that is harmless because an utterance without voiced frames is never decoded.
    Voicing is the peak of the normalised autocorrelation of the differentiated frame at pitch lags:
    vowels are periodic, noise (white, pink, brown after differencing) is not.
    """

    HISTORY = 166  # frames = 5 s

    def __init__(self, options: DictationOptions):
        self.options = options
        self._energies = deque([options.vad_min_db] * self.HISTORY, maxlen=self.HISTORY)
        lags = np.arange(SAMPLE_RATE // 400, SAMPLE_RATE // 70 + 1)
        self._lags = lags
        self._unbias = (FRAME - 1) / (FRAME - 1 - lags)

    def __call__(self, frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """frames [n, FRAME] -> (loud [n] bool, voiced [n] bool)."""
        energy_db = _energy_db(frames)
        loud = np.empty(len(frames), bool)
        for i, e in enumerate(energy_db):
            loud[i] = e > self._threshold()
            self._energies.append(e)
        diff = np.diff(frames, axis=1)
        spectrum = np.fft.rfft(diff, 2 * diff.shape[1], axis=1)
        autocorr = np.fft.irfft(np.abs(spectrum) ** 2, axis=1)
        r0 = np.maximum(autocorr[:, :1], 1e-12)
        voicing = (autocorr[:, self._lags] / r0 * self._unbias).max(axis=1)
        return loud, loud & (voicing > self.options.voicing_threshold)

    def quiet_tail(self, samples: np.ndarray) -> float:
        """Seconds of quiet frames at the end of `samples`, against the current floor (which this does not
        update: a look at audio that has arrived but that the engine has not taken yet)."""
        n = len(samples) // FRAME
        loud = _energy_db(samples[len(samples) - n * FRAME:].reshape(n, FRAME)) > self._threshold()
        return (n - 1 - int(np.flatnonzero(loud)[-1]) if loud.any() else n) * FRAME_SECONDS

    def _threshold(self) -> float:
        floor = np.partition(np.fromiter(self._energies, float, self.HISTORY), self.HISTORY // 10)[self.HISTORY // 10]
        return max(floor + self.options.vad_threshold_db, self.options.vad_min_db)


def _energy_db(frames: np.ndarray) -> np.ndarray:
    centred = frames - frames.mean(axis=1, keepdims=True)
    return 10 * np.log10(np.mean(centred ** 2, axis=1) + 1e-12)
