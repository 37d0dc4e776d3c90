"""Speech recognition: files, arrays and live audio -> text with timed segments.

    from sdk import Transcriber
    t = Transcriber()                              # whisper-tiny.en, device auto
    print(t.transcribe("talk.wav").text)
    t.start(Microphone()); for event in t.events(): ...   # live (pipelines/dictation/)

`Transcriber` serves every ASR family: Whisper (pipelines/whisper_asr.py) and the conformers (Parakeet, GigaAM:
pipelines/conformer_asr.py), chosen from the checkpoint's config.json.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from pipelines import audio
from pipelines.transcript import Segment, TranscribeOptions, Transcript
from pipelines.whisper_asr import DEFAULT_MODEL, WhisperRecognizer, program_graphs
from sdk import hub
from sdk.errors import UsageError
from sdk.weights import read_config

__all__ = ["DEFAULT_MODEL", "Segment", "TranscribeOptions", "Transcript", "Transcriber", "WhisperRecognizer",
           "program_graphs"]

CONFORMER_TYPES = ("parakeet_ctc", "parakeet_tdt", "parakeet_rnnt", "gigaam")


class Transcriber:
    """Speech to text with any supported model: Whisper (default), Parakeet, GigaAM.

    Files and arrays go through `transcribe()`; live audio through `start(source)` / `feed()` / `events()` /
    `stop()`, with `on_partial` / `on_final` / `on_state` callbacks (set them before `start`)."""
    on_partial = on_final = on_state = None

    def __init__(self, model: str = DEFAULT_MODEL, device: str | None = None,
                 options: TranscribeOptions = TranscribeOptions()):
        source = hub.resolve(model)
        model_type = read_config(source.path).get("model_type")  # none in a CTranslate2 (faster-whisper) folder
        if model_type in CONFORMER_TYPES:
            if options.precision != "fp32":  # no accuracy gate has passed for them yet
                raise UsageError(f"{source.path.name} runs in fp32 only", fix="drop --precision, or use a Whisper model")
            if options.language is not None or options.task != "transcribe":  # not to be ignored silently
                raise UsageError(f"{source.path.name} transcribes the language it was trained on: it takes no "
                                 "language and cannot translate", fix="drop --language/--task, or use a Whisper model")
            from pipelines.conformer_asr import ConformerRecognizer
            self.recognizer = ConformerRecognizer(source.path, device=device)
        elif model_type in (None, "whisper"):
            self.recognizer = WhisperRecognizer(source, device, options)
        else:
            raise UsageError(f"{source.path} holds a {model_type!r} model, not a speech model",
                             fix="pass a Whisper, Parakeet or GigaAM model (e.g. whisper-tiny.en or a folder)")
        self._stream = None

    @property
    def window_seconds(self) -> float:
        """The longest audio one decode_window() call takes (live dictation sizes its windows by it)."""
        return float(getattr(self.recognizer, "window_seconds", audio.WHISPER_CHUNK / audio.SAMPLE_RATE))

    def transcribe(self, source: str | Path | np.ndarray, sample_rate: int | None = None, *,
                   on_progress: Callable[[float], None] | None = None) -> Transcript:
        """Transcribe a file or an array (mono or [frames, channels]; `sample_rate` defaults to 16 kHz);
        `on_progress(seconds)` is told how much of the audio is done (per window for Whisper)."""
        if isinstance(self.recognizer, WhisperRecognizer):
            return self.recognizer.transcribe(source, sample_rate, on_progress=on_progress)
        # a file is decoded block by block, as Whisper's path does: memory stays bounded for any length
        blocks = (audio.stream_audio(source) if isinstance(source, (str, Path))
                  else [audio.load_audio(source, sample_rate)])
        segments, seconds = self.recognizer.transcribe_blocks(blocks, on_progress=on_progress)
        report = self.report()
        return Transcript(" ".join(s.text for s in segments), segments, "", round(seconds, 3),
                          report["device_requested"], report["device_effective"],
                          str(source) if isinstance(source, (str, Path)) else "", report)

    def decode_window(self, samples_16k: np.ndarray, *, offset: float = 0.0, fallback: bool = True,
                      stop: Callable[[], bool] | None = None, draft: Sequence[int] = (),
                      prefix: Sequence[int] = ()) -> list[Segment] | None:
        """Segments of one window of at most `window_seconds` of mono 16 kHz audio (see WhisperRecognizer;
        `draft` and `prefix`, Whisper's only: the `last_tokens` of the previous decode of the same audio start, and
        of the decode whose text was emitted, which this one continues)."""
        if draft or prefix:
            return self.recognizer.decode_window(samples_16k, offset=offset, fallback=fallback, stop=stop, draft=draft,
                                                 prefix=prefix)
        return self.recognizer.decode_window(samples_16k, offset=offset, fallback=fallback, stop=stop)

    @property
    def last_tokens(self) -> list[int] | None:
        """The token ids of the last decode_window() (a draft for the next one), None for models without drafts."""
        return getattr(self.recognizer, "last_tokens", None)

    @property
    def last_word_logprobs(self) -> list[list[float]] | None:
        """How sure the model was of each word the last decode_window() returned: per segment, per word of its text
        (split on whitespace), the lowest log-prob greedy gave a token of it; None for models that do not say."""
        return getattr(self.recognizer, "last_word_logprobs", None)

    def report(self) -> dict:
        return self.recognizer.report()

    # -- live audio (pipelines/dictation/ does the work; dictation never imports this module)

    def start(self, source=None, options=None, *, save_audio=None):
        """Start transcribing `source` (a Microphone, a FileSource, or None to `feed()` audio yourself)."""
        from pipelines.dictation import DictationOptions, Stream
        if self._stream is not None:
            raise UsageError("this Transcriber is already streaming", fix="call stop() first")
        self._stream = Stream(self, source, options or DictationOptions(), on_partial=self.on_partial,
                              on_final=self.on_final, on_state=self.on_state, save_audio=save_audio).start()
        return self._stream

    def feed(self, samples: np.ndarray, sample_rate: int, *, block: bool = True) -> None:
        """Push audio you captured yourself (any rate; resampled). Starts a stream on first use."""
        audio.check_sample_rate(sample_rate)
        if self._stream is None:
            self.start()
        self._stream.feed(samples, sample_rate, block=block)

    def events(self):
        """Partial, Final and State events of the running stream, in order (a blocking iterator)."""
        if self._stream is None:
            raise UsageError("nothing is streaming", fix="call start() or feed() first")
        return self._stream.events()

    def stop(self, *, cancel: bool = False):
        """Stop the stream; pending audio is transcribed unless cancel=True. Returns the stream's report."""
        if self._stream is None:
            raise UsageError("nothing is streaming", fix="call start() or feed() first")
        stream, self._stream = self._stream, None
        return stream.stop(cancel=cancel)

    def close(self):
        if self._stream is not None:
            self.stop(cancel=True)
        self.recognizer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
