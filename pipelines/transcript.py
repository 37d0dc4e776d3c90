"""What transcription takes and gives, shared by every ASR family: options, timed segments, transcripts."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from sdk.errors import UsageError


class Segment(NamedTuple):
    start: float  # seconds
    end: float
    text: str


@dataclass(frozen=True)
class TranscribeOptions:
    language: str | None = None       # e.g. "en", "de"; None detects it (multilingual models); .en models: English
    task: str = "transcribe"          # or "translate" (into English; multilingual models only)
    timestamps: bool = True           # segment timestamps (needed for seek over long audio)
    temperatures: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # fallback schedule, greedy first
    compression_ratio_threshold: float | None = 2.4  # above: too repetitive, retry hotter
    logprob_threshold: float | None = -1.0            # average log-prob below: retry hotter
    no_speech_threshold: float | None = 0.6           # no-speech prob above (and log-prob low): skip window
    silence_rms: float = 3e-4         # windows quieter than this (about -70 dBFS RMS) are silence, not decoded:
                                      # on digital silence Whisper confidently hallucinates ("you", "Thank you.")
    suppress_blank: bool = True       # no blank / end-of-text as the first sampled token
    suppress_tokens: tuple[int, ...] | None = None    # None: the model's own list (non-speech symbols)
    max_initial_timestamp: float = 1.0
    tokens_per_second: float = 10.0   # sampled tokens allowed per second of audio (+ 16): about twice fast speech
                                      # with timestamps; bounds a looping decode of a short window
    seed: int = 0                     # for sampling at temperature > 0
    precision: str = "fp32"           # cpu backend: "int8" runs the entries whisper.INT8_ENTRIES names with int8
                                      # weights (the entries its WER gate allows), the rest fp32
    shortest_window: float | None = None  # s: audio shorter than 30 s runs in the shortest encoder window of at
                                      # least this length that holds it (whisper.ENCODER_WINDOWS); 30: always the
                                      # full window; None: the model's own (SHORTEST_WINDOW)
    verify_drafts: bool = True        # live decodes check the previous decode's tokens in one decoder pass (cpu
                                      # backend): the same tokens as step by step, in fewer steps

    def __post_init__(self):
        if self.task not in ("transcribe", "translate"):
            raise UsageError(f"unknown task {self.task!r}", fix="use transcribe or translate")
        if self.precision not in ("fp32", "int8"):
            raise UsageError(f"unknown precision {self.precision!r}", fix="use fp32 or int8")
        if self.shortest_window is not None and not 0 < self.shortest_window < float("inf"):
            raise UsageError(f"shortest_window must be a positive number of seconds, got {self.shortest_window!r}",
                             fix="e.g. 5 (whisper-base's own floor), or 30 for the full window only; leave it unset for the model's own")
        if not self.temperatures or min(self.temperatures) < 0:
            raise UsageError(f"temperatures must be a non-empty tuple of values >= 0, got {self.temperatures!r}",
                             fix="e.g. (0.0,) for greedy only, or the default (0.0, 0.2, ..., 1.0)")


@dataclass(frozen=True)
class Transcript:
    text: str
    segments: list[Segment]
    language: str
    duration: float                   # seconds of audio
    device_requested: str
    device_effective: str
    source: str = ""                  # the file name, when transcribing a file
    report: dict = field(default_factory=dict, compare=False)

