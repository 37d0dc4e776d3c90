"""Voice activity from silero-vad's ONNX model on ONNX Runtime, per 30 ms frame, without torch.

The `silero_vad` package imports torch when imported, so it is never imported: its ONNX file is read from the
package's data folder. The model takes 512-sample chunks at 16 kHz, each preceded by the last 64 samples of
the chunk before (zeros at first), and carries a recurrent state [2, 1, 128] from chunk to chunk; it returns
the speech probability of the chunk. As silero's own VADIterator, speech starts at `threshold` and ends below
`threshold - 0.15`, so that a talker's soft syllables do not flicker.

silero's output bridges the pauses between words and holds on ~0.15 s after the last one (bench/vad.py), but
the Recognizer starts partials in those pauses and the final's decode at the end of the words. So inside
silero's speech a frame is active only when it is also `pause_threshold_db` above the energy VAD's noise
floor: silero says whether it is speech (noise and music are not), energy says where the words pause and end.
"""
from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import numpy as np

from sdk.errors import ModelNotFound, WeightError

from .options import FRAME, SAMPLE_RATE, DictationOptions
from .vad import Vad

CHUNK = 512                     # samples per model call at 16 kHz
CONTEXT = 64                    # samples of the previous chunk fed in front of each chunk
CHUNK_SECONDS = CHUNK / SAMPLE_RATE
STATE_SHAPE = (2, 1, 128)
HYSTERESIS = 0.15               # speech ends below threshold - this (silero's neg_threshold)
INSTALL = "pip install --no-deps silero-vad"   # it declares torch, which this module does not need


def silero_model_path() -> Path | None:
    """The ONNX model inside the installed silero-vad package, or None when it is not installed."""
    spec = importlib.util.find_spec("silero_vad")   # finds the package without running its torch import
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx"
    return path if path.is_file() else None


class SileroVad:
    """silero-vad with the energy Vad's interface: `vad(frames [n, FRAME]) -> (active [n], voiced [n])`, where
    a frame is active while the talker speaks (silero, with hysteresis) and it is not a pause between words
    (energy), and voiced when its probability reaches the threshold; `quiet_tail(samples)` looks at audio
    ahead without changing the state.

    The frames' samples are regrouped into the model's 512-sample chunks; a frame takes the probability of
    the chunk that completes inside it, or the last one's (512 > 480, so at most one completes per frame)."""

    def __init__(self, options: DictationOptions, path: Path | None = None):
        import onnxruntime as ort

        path = path or silero_model_path()
        if path is None:
            raise ModelNotFound("silero-vad is not installed", fix=f"`{INSTALL}`, or use the energy VAD: --vad energy")
        session_options = ort.SessionOptions()
        session_options.intra_op_num_threads = session_options.inter_op_num_threads = 1  # tiny: threads cost more
        try:
            self._session = ort.InferenceSession(str(path), session_options, providers=["CPUExecutionProvider"])
        except Exception as e:   # onnxruntime raises its own untyped errors for unreadable models
            raise WeightError(f"cannot load the silero-vad model {path}: {e}", fix=f"reinstall it: `{INSTALL}`") from None
        names = {i.name for i in self._session.get_inputs()}
        if names != {"input", "state", "sr"}:
            raise WeightError(f"{path} is not a silero-vad v5+ model (inputs {sorted(names)})",
                              fix=f"install silero-vad 5 or newer: `{INSTALL}`")
        self.threshold = options.silero_threshold
        self._pauses = Vad(replace(options, vad_threshold_db=options.pause_threshold_db))
        self._state = np.zeros(STATE_SHAPE, np.float32)
        self._context = np.zeros(CONTEXT, np.float32)
        self._leftover = np.zeros(0, np.float32)   # samples short of a whole chunk
        self._probability = 0.0                     # of the last chunk
        self._speaking = False
        self._peek: tuple | None = None             # quiet_tail's progress over audio ahead (see there)

    def __call__(self, frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """frames [n, FRAME] -> (active [n] bool, voiced [n] bool)."""
        self._peek = None
        probabilities = np.empty(len(frames), np.float32)
        for i, frame in enumerate(frames):
            self._leftover = np.concatenate([self._leftover, frame.astype(np.float32)])
            while len(self._leftover) >= CHUNK:
                chunk, self._leftover = self._leftover[:CHUNK], self._leftover[CHUNK:]
                self._probability, self._state, self._context = self._run(chunk, self._state, self._context)
            probabilities[i] = self._probability
        speaking = np.empty(len(frames), bool)
        for i, p in enumerate(probabilities):
            self._speaking = self._next_speaking(self._speaking, p)
            speaking[i] = self._speaking
        loud, _ = self._pauses(frames) if len(frames) else (speaking, None)
        return speaking & loud, probabilities >= self.threshold

    def probabilities(self, samples: np.ndarray) -> np.ndarray:
        """Speech probability per whole 512-sample chunk of `samples`, continuing from the current state."""
        out = []
        for start in range(0, len(samples) - CHUNK + 1, CHUNK):
            p, self._state, self._context = self._run(samples[start:start + CHUNK], self._state, self._context)
            out.append(p)
        return np.array(out, np.float32)

    def quiet_tail(self, samples: np.ndarray) -> float:
        """Seconds of quiet (not speaking, or a pause) at the end of `samples` (audio that follows what the VAD
        has taken), without changing the state. A decode polls this as `samples` grows, so the chunks already
        looked at are remembered and only the new ones run."""
        pause = self._pauses.quiet_tail(samples)
        samples = np.concatenate([self._leftover, np.asarray(samples, np.float32)])
        seen, state, context, speaking, quiet = self._peek or (samples[:0], self._state, self._context, self._speaking, 0)
        done = len(seen)
        if not np.array_equal(samples[:done], seen):   # not the audio of the last look: start over
            done, state, context, speaking, quiet = 0, self._state, self._context, self._speaking, 0
        for start in range(done, len(samples) - CHUNK + 1, CHUNK):
            p, state, context = self._run(samples[start:start + CHUNK], state, context)
            speaking = self._next_speaking(speaking, p)
            quiet, done = 0 if speaking else quiet + 1, start + CHUNK
        self._peek = (samples[:done], state, context, speaking, quiet)
        return max(quiet * CHUNK_SECONDS, pause)

    def _next_speaking(self, speaking: bool, p: float) -> bool:
        return p >= self.threshold - HYSTERESIS if speaking else p >= self.threshold

    def _run(self, chunk, state, context):
        out, state = self._session.run(None, {"input": np.concatenate([context, chunk])[None], "state": state,
                                              "sr": np.array(SAMPLE_RATE, np.int64)})
        return float(out[0, 0]), state, chunk[-CONTEXT:]
