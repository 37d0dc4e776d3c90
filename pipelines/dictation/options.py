"""What a dictation session can be told: the typed options, and the audio framing they are counted in."""
from __future__ import annotations

import math
from dataclasses import dataclass

from sdk.errors import UsageError

SAMPLE_RATE = 16000
FRAME = 480                   # 30 ms VAD frames
FRAME_SECONDS = FRAME / SAMPLE_RATE
VAD_CHOICES = ("auto", "silero", "energy", None)
WINDOW_SECONDS = 30.0         # Whisper's encoder window; other models say theirs in `window_seconds`


@dataclass(frozen=True)
class DictationOptions:
    vad: str | None = "auto"          # auto: silero-vad when installed (it misses fewer words in noise and does
                                      # not start on music: bench/vad.py), else energy with one note; silero
                                      # (strict); energy; None: every sample is speech, text is committed by
                                      # agreement only
    silero_threshold: float = 0.5     # silero: speech probability that starts speech (it ends 0.15 below) ...
    pause_threshold_db: float = 3.0   # ... where frames quieter than this above the noise floor are pauses
    vad_threshold_db: float = 10.0    # a frame is loud this far above the adaptive noise floor ...
    vad_min_db: float = -55.0         # ... and above this absolute level (dBFS)
    voicing_threshold: float = 0.45   # normalised autocorrelation at a pitch lag (70-400 Hz) = voiced frame
    min_voiced: float = 0.09          # s of voiced frames an utterance needs; less is noise, never decoded
    onset: float = 0.09               # s of consecutive loud frames that start an utterance
    preroll: float = 0.4              # s of audio kept from before the onset, so first words are not clipped
    context: float = 6.0              # s of audio before that, decoded as left context; its text is dropped
    hangover: float = 0.6             # s of quiet that ends an utterance
    early_final: float = 0.09         # s of quiet after which the final's decode starts, before the hangover
                                      # confirms the end (if speech resumes, it served as a partial); at 0.09 s
                                      # (3 frames, final_tail) the finals come ~0.05 s sooner than at 0.12 s (4),
                                      # and the dictation sessions' WER is the same but for one word either way
                                      # (flite, espeak-ng: bench/dictation_hangover.py, dictation_latency.py)
    commit_quiet: float | None = 0.3  # s of quiet after which a decode that heard the end is emitted as final before
                                      # the hangover, when the model was sure of each word (commit_logprob); if
                                      # speech resumes within the hangover, the utterance goes on and later finals
                                      # hold only the words after it (transcribers with prefix= and word log-probs,
                                      # Whisper; others wait for the hangover). None: every final waits for it
    commit_logprob: float = -0.6      # the least log-prob a word of such an early final may have; an utterance
                                      # with a less sure word waits for the hangover, and if the talker goes on it
                                      # is decoded whole: a pause may be a comma, and the words a model misreads
                                      # without the audio after them are ones it is unsure of. -inf: any final
    final_tail: float = 0.09          # s of quiet after the last loud frame a decode must have heard to serve
                                      # as the final; partials wait for such a gap, so that the last one can
    partial_every: float = 1.0        # s of new audio between partial decodes of an open utterance ...
    partial_share: float = 0.5        # ... or longer, so partials use at most this share of real time
    partials: bool = True             # off: no partial events; live, decodes amid speech still run where they
                                      # make the final's draft (Whisper), else only for long speech (the early
                                      # commit needs them)
    commit_after: float = 15.0        # s of open utterance after which agreed segments become final early
    max_utterance: float = 28.0       # s; hard cut (never more than one encoder window)
    silence_timeout: float | None = None   # stop after this long without speech
    stop_delay: float = 0.3           # s a live source still captures after stop(): the last word of a push-to-talk
                                      # release and what the sound system still holds (PortAudio says 0.1 s) are kept
    max_duration: float | None = None      # stop after this much audio
    ring_seconds: float = 120.0       # audio that may wait for the worker (model loading, slow decodes)

    def __post_init__(self):
        vad = {True: "energy", False: None, "off": None}.get(self.vad, self.vad)   # the field was a bool
        if vad not in VAD_CHOICES:
            raise UsageError(f"vad must be one of auto, silero, energy or None (off), got {self.vad!r}",
                             fix="e.g. --vad energy for the energy VAD, --no-vad for none")
        object.__setattr__(self, "vad", vad)
        if not 0 < self.silero_threshold < 1:
            raise UsageError(f"silero_threshold must be in (0, 1), got {self.silero_threshold}")
        if not 0 < self.max_utterance <= WINDOW_SECONDS:
            raise UsageError(f"max_utterance must be in (0, {WINDOW_SECONDS}] s, got {self.max_utterance}")
        if self.commit_after >= self.max_utterance:
            raise UsageError("commit_after must be shorter than max_utterance")
        for name in ("preroll", "context", "hangover", "early_final", "final_tail", "partial_every", "onset",
                     "min_voiced", "stop_delay"):
            if getattr(self, name) < 0:
                raise UsageError(f"{name} must be >= 0")
        if self.commit_quiet is not None and not 0 <= self.commit_quiet:
            raise UsageError(f"commit_quiet must be >= 0 s or None, got {self.commit_quiet}")
        if not self.commit_logprob <= 0:
            raise UsageError(f"commit_logprob is a log-probability (<= 0, or -inf), got {self.commit_logprob}")
        if self.ring_seconds < 5:
            raise UsageError("ring_seconds must be at least 5")
        for name, flag in (("silence_timeout", "--silence-timeout"), ("max_duration", "--max-duration")):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise UsageError(f"{flag} must be a positive number of seconds, got {value!r}",
                                 fix=f"pass e.g. {flag} 10, or leave it out for no limit")
