"""Live dictation: audio in, `partial` and `final` text out, while the person is still talking.

    from pipelines.asr import Transcriber
    from pipelines.dictation import Stream, Microphone

    with Stream(lambda: Transcriber("whisper-tiny.en"), Microphone("usb")) as stream:
        for event in stream.events():          # Partial / Final / State, until stop() or the source ends
            print(event)

How it works, in the order audio flows:
  source (Microphone, FileSource, or `feed()` from the app) -> resampled to 16 kHz -> RingBuffer
  -> worker thread: Recognizer = VAD (energy over an adaptive noise floor + a voicing check) that cuts
  utterances with pre-roll and hangover -> the utterance, after up to 6 s of the audio before it as left
  context (tiny models transcribe short isolated utterances worse; the context's own text is recognised
  as a repeat of the recent finals and dropped), all within one 30 s encoder window, is re-decoded every
  `partial_every` seconds (less often when decoding is slow); words two consecutive decodes agree on are
  stable (LocalAgreement-2) ->
  at the utterance end one last decode becomes the `final`. It starts after `early_final` s of quiet, before
  the hangover has confirmed the end (if the talker goes on, it was one more partial); a partial that
  started in the final pause is the final itself. Partials start in pauses for that reason: a decode cannot
  be interrupted, so the final waits for one only when the talker stops while a decode that missed the
  last words is running. Utterances longer than `commit_after` seconds are committed early at an agreed
  segment boundary and the window slides on, so long speech never overflows the encoder window.

Against Whisper's known failure modes: no text from one window is fed to the next (no prompt carry-over,
the classic source of loops); stretches the VAD calls loud but that carry no voiced frames (noise, clicks)
are never decoded; segments Whisper itself marks as non-speech are dropped; repeated n-grams are collapsed.

Audio captured before the model is ready waits in the ring buffer and is transcribed once it is (the
states are loading -> warming -> ready -> listening -> stopped). A failing microphone stops capture, the
audio already captured is still transcribed (with no `listening` if it failed before that), then the typed
error is raised; `unprocessed_audio()` returns what could not be transcribed (for instance when the model is
missing) so an app can save it.

Times in events are seconds of audio since the stream started ("audio time").
"""
from __future__ import annotations

import queue
import re
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass, field, replace
from difflib import SequenceMatcher
from pathlib import Path
from typing import Callable, Iterator, Union

import numpy as np

from sdk.errors import DeviceIOError, InputError, SdkError, UsageError

from .audio import float_samples, read_audio, to_mono

SAMPLE_RATE = 16000
FRAME = 480                   # 30 ms VAD frames
FRAME_SECONDS = FRAME / SAMPLE_RATE
SLIDE_OVERLAP = 1.0           # s of committed audio an early commit keeps in the buffer (see _commit_agreed)
WINDOW_SECONDS = 30.0         # Whisper's encoder window; other models say theirs in `window_seconds`


@dataclass(frozen=True)
class DictationOptions:
    vad: bool = True                  # off: every sample is speech; text is committed by agreement only
    vad_threshold_db: float = 10.0    # a frame is loud this far above the adaptive noise floor ...
    vad_min_db: float = -55.0         # ... and above this absolute level (dBFS)
    voicing_threshold: float = 0.45   # normalised autocorrelation at a pitch lag (70-400 Hz) = voiced frame
    min_voiced: float = 0.09          # s of voiced frames an utterance needs; less is noise, never decoded
    onset: float = 0.09               # s of consecutive loud frames that start an utterance
    preroll: float = 0.4              # s of audio kept from before the onset, so first words are not clipped
    context: float = 6.0              # s of audio before that, decoded as left context; its text is dropped
    hangover: float = 0.6             # s of quiet that ends an utterance
    early_final: float = 0.2          # s of quiet after which the final's decode starts, before the hangover
                                      # confirms the end (if speech resumes, it served as a partial)
    final_tail: float = 0.09          # s of quiet after the last loud frame a decode must have heard to serve
                                      # as the final; partials wait for such a gap, so that the last one can
    partial_every: float = 1.0        # s of new audio between partial decodes of an open utterance ...
    partial_share: float = 0.5        # ... or longer, so partials use at most this share of real time
    partials: bool = True             # off: no partial events; decodes before the utterance end happen only
                                      # for long speech (the early commit needs them), so finals come sooner
    commit_after: float = 15.0        # s of open utterance after which agreed segments become final early
    max_utterance: float = 28.0       # s; hard cut (never more than one encoder window)
    silence_timeout: float | None = None   # stop after this long without speech
    stop_delay: float = 0.3           # s a live source still captures after stop(): the last word of a push-to-talk
                                      # release and what the sound system still holds (PortAudio says 0.1 s) are kept
    max_duration: float | None = None      # stop after this much audio
    ring_seconds: float = 120.0       # audio that may wait for the worker (model loading, slow decodes)

    def __post_init__(self):
        if not 0 < self.max_utterance <= WINDOW_SECONDS:
            raise UsageError(f"max_utterance must be in (0, {WINDOW_SECONDS}] s, got {self.max_utterance}")
        if self.commit_after >= self.max_utterance:
            raise UsageError("commit_after must be shorter than max_utterance")
        for name in ("preroll", "context", "hangover", "early_final", "final_tail", "partial_every", "onset",
                     "min_voiced", "stop_delay"):
            if getattr(self, name) < 0:
                raise UsageError(f"{name} must be >= 0")
        if self.ring_seconds < 5:
            raise UsageError("ring_seconds must be at least 5")


# ----------------------------------------------------------------------------------------------- events

@dataclass(frozen=True)
class Partial:
    text: str                # the whole current hypothesis of the open utterance
    stable: str              # its prefix two consecutive decodes agreed on
    at: float = 0.0          # audio time when it was emitted
    type: str = field(default="partial", init=False)


@dataclass(frozen=True)
class Final:
    text: str
    start: float             # audio time the speech started
    end: float               # audio time the speech ended
    at: float = 0.0          # audio time when it was emitted; at - end is the latency
    type: str = field(default="final", init=False)

    @property
    def latency(self) -> float:
        return self.at - self.end


@dataclass(frozen=True)
class State:
    state: str               # loading | warming | ready | listening | stopped
    type: str = field(default="state", init=False)


Event = Union[Partial, Final, State]


# ----------------------------------------------------------------------------------------------- VAD

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


# ----------------------------------------------------------------------------------------------- text guards

_WORD = re.compile(r"[\w']+")


def _norm(word: str) -> str:
    return "".join(_WORD.findall(word.lower()))


def collapse_repeats(words: list[str], *, max_ngram: int = 6) -> list[str]:
    """Whisper loops ("the the the the", "thank you. thank you. thank you."): keep one copy of any n-gram
    repeated back to back 3+ times (4+ for single words, which people do say twice or thrice)."""
    out = list(words)
    for n in range(1, max_ngram + 1):
        limit = 4 if n == 1 else 3
        i = 0
        while i + n <= len(out):
            gram = [_norm(w) for w in out[i:i + n]]
            reps = 1
            while [_norm(w) for w in out[i + reps * n:i + (reps + 1) * n]] == gram:
                reps += 1
            if reps >= limit:
                del out[i + n:i + reps * n]
            i += 1
    return out


def _looks_like_text(text: str) -> bool:
    return any(ch.isalnum() for ch in text)


def _too_compressible(text: str) -> bool:
    """The compression-ratio test Whisper itself uses for degenerate output (ratio > 2.4)."""
    raw = text.encode()
    return len(raw) > 40 and len(raw) / len(zlib.compress(raw)) > 2.4


# ----------------------------------------------------------------------------------------------- recognizer

@dataclass
class _Hypothesis:
    segments: list            # the Transcriber's Segments that survived the guards
    words: list[str]          # all their words, in order
    ends: list[int]           # cumulative word count at the end of each segment

    @classmethod
    def from_segments(cls, segments, window_end: float) -> "_Hypothesis":
        kept, words, ends, previous = [], [], [], None
        for seg in segments:
            text = seg.text.strip()
            if not _looks_like_text(text) or _norm(text) == previous or seg.start >= window_end:
                continue
            previous = _norm(text)
            kept.append(seg)
            words.extend(text.split())
            ends.append(len(words))
        collapsed = collapse_repeats(words)
        if len(collapsed) != len(words) or _too_compressible(" ".join(words)):
            # a loop was cut: segment boundaries no longer line up with the words, so this hypothesis
            # offers no early-commit points (the utterance end or the hard cut still finalises it)
            collapsed = [] if _too_compressible(" ".join(collapsed)) else collapsed
            return cls([], collapsed, [])
        return cls(kept, words, ends)

    @property
    def text(self) -> str:
        return " ".join(self.words)

    def without_prefix(self, n: int) -> "_Hypothesis":
        if n == 0:
            return self
        keep = [i for i, end in enumerate(self.ends) if end > n]
        return _Hypothesis([self.segments[i] for i in keep], self.words[n:], [self.ends[i] - n for i in keep])


def _edit_distance(a: list[str], b: list[str], same: Callable[[str, str], bool] = str.__eq__) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row[0] = row[:], i
        for j, y in enumerate(b, 1):
            row[j] = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (not same(x, y)))
    return row[-1]


def _similar(a: str, b: str) -> bool:
    """One word heard twice: equal, or spelt alike (tiny models re-transcribe "ill-disposed" as "old-sposed")."""
    return a == b or (min(len(a), len(b)) >= 4 and SequenceMatcher(None, a, b).ratio() >= 0.6)


def _overlap(before: list[str], after: list[str], *, most: int = 40) -> int:
    """How many leading words of `after` re-transcribe the end of `before`: the longest k whose first k
    words end with (a spelling like) the last word of `before` and match some tail of it with at most k // 4
    word errors."""
    b = [_norm(w) for w in before[-most:]]
    a = [_norm(w) for w in after[:most]]
    if not a or not b:
        return 0
    for k in range(min(len(a), len(b) + 3), 0, -1):
        if not _similar(a[k - 1], b[-1]):
            continue
        allowed = k // 4
        for m in range(max(1, k - allowed), min(len(b), k + allowed) + 1):
            if _edit_distance(a[:k], b[-m:], same=_similar) <= allowed:
                return k
    return 0


def _agreement(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b):
        if _norm(x) != _norm(y):
            break
        n += 1
    return n


class Recognizer:
    """The streaming engine without threads: `accept(samples_16k)` -> events, `finish()` at the end.

    `transcriber` is anything with `decode_window(samples_16k, *, offset, fallback, stop) -> [Segment(start, end, text)]`
    (`stop`, when given, is polled during the decode; once it says True the decode returns None).
    One call to accept() runs at most one partial decode, so when decoding is slower than real time the
    caller simply hands over bigger chunks and partials get rarer; finals are never skipped.
    """

    def __init__(self, transcriber, options: DictationOptions = DictationOptions()):
        self.transcriber, self.options = transcriber, options
        self.vad = Vad(options)
        # the model's window bounds the utterance buffer (Whisper: 30 s; a conformer may use shorter ones)
        self._window = float(getattr(transcriber, "window_seconds", WINDOW_SECONDS))
        self._max_utterance = min(options.max_utterance, self._window - 0.5)
        self._commit_after = min(options.commit_after, self._max_utterance / 2)
        self.position = 0                    # samples consumed
        self.last_speech = 0.0               # audio time speech was last heard
        self._last_words = 0.0               # ... in a loud run at least `onset` long
        self._loud_run = 0                   # consecutive loud frames
        self.decodes = 0
        self.stopped_decodes = 0             # partials given up because the talker stopped meanwhile
        self.decode_seconds = 0.0            # running average of one decode's wall time
        # Live capture: the audio that has arrived but accept() has not taken yet (None when audio is fed at
        # a simulated pace, where that audio lies in the future). A partial amid speech watches it and stops
        # when the talker has stopped, so that the final's decode starts at once instead of behind it.
        self.unheard: Callable[[], np.ndarray] | None = None
        self._rest = np.zeros(0, np.float32)  # samples short of a whole frame
        self._preroll_frames = round(options.preroll / FRAME_SECONDS)
        self._context_frames = round(options.context / FRAME_SECONDS)
        self._past = deque(maxlen=max(1, self._preroll_frames + self._context_frames))  # audio before the utterance
        self._last_final: list[str] = []      # words of the last final, to drop them if the context repeats them
        self._onset_run: list[np.ndarray] = []
        self._onset_voiced = 0
        self._reset_utterance()

    # -- public

    @property
    def in_utterance(self) -> bool:
        return self._chunks is not None

    def accept(self, samples: np.ndarray) -> list[Event]:
        samples = np.concatenate([self._rest, np.asarray(samples, np.float32).reshape(-1)])
        n_frames = len(samples) // FRAME
        self._rest = samples[n_frames * FRAME:]
        frames = samples[:n_frames * FRAME].reshape(n_frames, FRAME)
        if self.options.vad:
            loud, voiced = self.vad(frames) if n_frames else (np.zeros(0, bool), np.zeros(0, bool))
        else:
            loud = voiced = np.ones(n_frames, bool)
        events: list[Event] = []
        for frame, is_loud, is_voiced in zip(frames, loud, voiced):
            events += self._frame(frame, bool(is_loud), bool(is_voiced))
        if not (self.in_utterance and self._enough_voice()):
            return events
        # A decode cannot be interrupted, and the final must not wait for one that missed the last words. So
        # when the talker seems to be stopping, decode at once: once the hangover confirms the end, that decode
        # is the final. Partials start in a pause (or when two intervals overdue), so that the one running
        # when the talker stops has most likely heard the end too.
        quiet = self._now() - self.last_speech if self.options.vad else 0.0
        every = max(self.options.partial_every, self.decode_seconds / max(self.options.partial_share, 1e-3))
        wanted = self.options.partials or self._duration() >= self._commit_after
        if quiet >= self.options.early_final - 1e-9:
            if not self._heard_end():
                events += self._partial()
        elif wanted and self._since_decode >= every and (
                quiet >= self.options.final_tail - 1e-9 or not self.options.vad or self._since_decode >= 3 * every):
            # A decode amid speech can never serve as the final (it did not hear the end): one greedy pass
            # without temperature retries keeps it short, so that a final is less likely to wait behind it.
            in_pause = quiet >= self.options.final_tail - 1e-9 or not self.options.vad
            events += self._partial(fallback=in_pause, stoppable=not in_pause)
        return events

    def finish(self) -> list[Event]:
        """End of audio: the open utterance (if any) becomes final."""
        if len(self._rest) and self.in_utterance:
            self._append(np.pad(self._rest, (0, FRAME - len(self._rest))))
        self._rest = np.zeros(0, np.float32)
        return self._end_utterance() if self.in_utterance else []

    # -- per frame

    def _now(self) -> float:
        return self.position / SAMPLE_RATE

    def _frame(self, frame: np.ndarray, loud: bool, voiced: bool) -> list[Event]:
        self.position += FRAME
        now = self._now()
        if not self.in_utterance:
            if not loud:
                self._past.extend(self._onset_run)
                self._onset_run, self._onset_voiced = [], 0
                self._past.append(frame)
                return []
            self._onset_run.append(frame)
            self._onset_voiced += int(voiced)
            if len(self._onset_run) * FRAME_SECONDS < self.options.onset - 1e-9:
                return []
            voiced_so_far, self._loud_run = self._onset_voiced, len(self._onset_run)
            self._begin_utterance(now - len(self._onset_run) * FRAME_SECONDS)
            self._voiced, self._onset_voiced = voiced_so_far, 0
            self.last_speech = self._last_words = now
            return []
        self._append(frame)
        self._voiced += int(voiced)
        self._loud_run = self._loud_run + 1 if loud else 0
        if loud:
            self.last_speech = now
            if self._loud_run * FRAME_SECONDS >= self.options.onset - 1e-9:
                self._last_words = now    # as long as an onset: a word, not a click or a breath
        events: list[Event] = []
        if self.options.vad and now - self.last_speech >= self.options.hangover:
            return self._end_utterance()
        if self._duration() >= self._max_utterance:
            events += self._hard_cut()
        return events

    def _begin_utterance(self, speech_start: float):
        pre = [self._past.pop() for _ in range(min(self._preroll_frames, len(self._past)))][::-1]
        self._chunks = pre + self._onset_run
        self._buffer_start = self._committed_until = speech_start - len(pre) * FRAME_SECONDS
        self._speech_start = speech_start
        self._onset_run = []
        self._since_decode = len(self._chunks) * FRAME_SECONDS

    def _reset_utterance(self):
        self._chunks: list[np.ndarray] | None = None
        self._buffer_start = self._speech_start = 0.0
        self._committed_until = 0.0               # audio time up to which finals hold the speech
        self._voiced = 0
        self._since_decode = 0.0
        self._previous: _Hypothesis | None = None
        self._agreed = 0
        self._latest: _Hypothesis | None = None   # the last decode of the current buffer ...
        self._latest_end = 0.0                    # ... and the audio time it reached

    def _append(self, frame: np.ndarray):
        self._chunks.append(frame)
        self._since_decode += FRAME_SECONDS

    def _duration(self) -> float:
        return len(self._chunks) * FRAME_SECONDS

    def _enough_voice(self) -> bool:
        return not self.options.vad or self._voiced * FRAME_SECONDS >= self.options.min_voiced - 1e-9

    def _heard_end(self) -> bool:
        """The last decode reached `final_tail` s past the last words: it holds all the speech (loud frames
        after that too short to be a word, a click or a breath, do not call for a new decode)."""
        return self._latest is not None and self._latest_end >= self._last_words + self.options.final_tail - 1e-9

    # -- decoding

    def _talker_stopped(self) -> bool:
        pending = np.concatenate([self._rest, self.unheard()])
        return len(pending) / SAMPLE_RATE >= self.options.early_final and \
            self.vad.quiet_tail(pending) >= self.options.early_final - 1e-9

    def _decode(self, fallback: bool = True, stoppable: bool = False) -> _Hypothesis | None:
        """Decode left context + the utterance buffer; keep the segments that reach into the buffer. When the
        first of them claims to start inside the context (Whisper's segment times are loose, and it may merge
        context and utterance into one segment), its leading words that re-transcribe the end of the recent
        finals are dropped (a fuzzy match: tiny models re-transcribe with small differences)."""
        room = int(self._window / FRAME_SECONDS) - len(self._chunks)
        context = list(self._past)[-min(self._context_frames, room):] if self._context_frames and room > 0 else []
        audio = np.concatenate(context + self._chunks) if self._chunks else np.zeros(FRAME, np.float32)
        offset = self._buffer_start - len(context) * FRAME_SECONDS
        # speech from the very first sample (a file, a microphone opened mid-word) has no pre-roll, and Whisper
        # drops a first word it hears without a lead-in (measured on tiny.en: "He might..." -> "might..."):
        # silence stands in for the missing pre-roll
        pad = min(self.options.preroll - (self._speech_start - offset), self._window - len(audio) / SAMPLE_RATE)
        if pad >= FRAME_SECONDS:
            audio = np.concatenate([np.zeros(round(pad * SAMPLE_RATE), np.float32), audio])
            offset -= pad
        self.decodes += 1
        self._since_decode = 0.0
        started = time.perf_counter()
        stop = self._talker_stopped if stoppable and self.unheard is not None and self.options.vad else None
        segments = self.transcriber.decode_window(audio, offset=offset, fallback=fallback, stop=stop)
        if segments is None:
            self.stopped_decodes += 1
            return None
        took = time.perf_counter() - started
        self.decode_seconds = took if not self.decode_seconds else 0.8 * self.decode_seconds + 0.2 * took
        window_end = self._buffer_start + self._duration()
        own = [seg for seg in segments if min(seg.end, window_end) > self._buffer_start + 0.3]
        hyp = _Hypothesis.from_segments(own, window_end)
        first = hyp.segments[0] if hyp.segments else None
        heard_final_audio = bool(context) or self._committed_until > self._buffer_start
        if heard_final_audio and first is not None and first.start < self._committed_until - 0.2:
            hyp = hyp.without_prefix(_overlap(self._last_final, hyp.words))
        self._latest, self._latest_end = hyp, window_end
        return hyp

    def _partial(self, fallback: bool = True, stoppable: bool = False) -> list[Event]:
        hyp = self._decode(fallback, stoppable)
        if hyp is None:
            return []
        if self._previous is not None:
            self._agreed = max(self._agreed, _agreement(self._previous.words, hyp.words))
        self._agreed = min(self._agreed, len(hyp.words))
        self._previous = hyp
        events: list[Event] = []
        if self._duration() >= self._commit_after:
            events += self._commit_agreed(hyp)
            hyp = self._previous
        if hyp is not None and hyp.words and self.options.partials:
            events.append(Partial(hyp.text, " ".join(hyp.words[:self._agreed])))
        return events

    def _commit_agreed(self, hyp: _Hypothesis) -> list[Event]:
        """Long speech: the agreed segments that ended >= 1 s before the buffer end become final, and the
        window slides past them (whisper_streaming's segment trimming), keeping SLIDE_OVERLAP s of their audio:
        Whisper's segment end is loose, and the words after it may begin before it; kept in the buffer, they
        are decoded again (and what re-transcribes the final is dropped by text), never lost."""
        buffer_end = self._buffer_start + self._duration()
        cut = None
        for i, (seg, end_word) in enumerate(zip(hyp.segments, hyp.ends)):
            if end_word > self._agreed:
                break
            if self._speech_start < seg.end <= buffer_end - 1.0:
                cut = i
        if cut is None:
            return []
        seg_end = float(hyp.segments[cut].end)
        words = hyp.words[:hyp.ends[cut]]
        final = self._final(words, self._speech_start, seg_end)
        drop = max(0, int(round((seg_end - SLIDE_OVERLAP - self._buffer_start) / FRAME_SECONDS)))
        self._past.extend(self._chunks[:drop])
        self._chunks = self._chunks[drop:]
        self._buffer_start += drop * FRAME_SECONDS
        self._speech_start = self._committed_until = seg_end
        rest = hyp.words[hyp.ends[cut]:]
        self._previous = _Hypothesis([], rest, [len(rest)]) if rest else None
        self._latest = None                       # it decoded the buffer before the slide
        self._agreed = max(0, self._agreed - len(words))
        return [final]

    def _hard_cut(self) -> list[Event]:
        """The window is full and nothing agreed: everything decoded so far becomes final."""
        hyp = self._decode() if self._enough_voice() else None
        end = self._now()
        events = [self._final(hyp.words, self._speech_start, end)] if hyp and hyp.words else []
        self._past.extend(self._chunks)
        self._chunks, self._buffer_start, self._speech_start, self._committed_until = [], end, end, end
        self._previous, self._agreed, self._voiced, self._latest = None, 0, 0, None
        return events

    def _end_utterance(self) -> list[Event]:
        events: list[Event] = []
        if self._enough_voice() and self._chunks:
            hyp = self._latest if self._heard_end() else self._decode()
            end = min(self._last_words, self._now()) if self.options.vad else self._now()   # not a click after them
            if hyp.words:
                events.append(self._final(hyp.words, self._speech_start, max(end, self._speech_start)))
        self._past.extend(self._chunks or [])
        self._reset_utterance()
        return events

    def _final(self, words: list[str], start: float, end: float) -> Final:
        self._last_final = (self._last_final + list(words))[-40:]  # the recent finals, which the context holds
        return Final(" ".join(words), start, end)


# ----------------------------------------------------------------------------------------------- ring buffer

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


# ----------------------------------------------------------------------------------------------- sources

@dataclass(frozen=True)
class InputDevice:
    index: int
    name: str
    hostapi: str
    channels: int
    default_samplerate: float
    is_default: bool


def _sounddevice():
    try:
        import sounddevice
    except OSError as e:  # the PortAudio shared library is missing
        raise DeviceIOError(f"cannot load PortAudio: {e}",
                            fix="install PortAudio (Debian/Ubuntu: sudo apt install libportaudio2)") from None
    return sounddevice


def list_input_devices() -> list[InputDevice]:
    """Input-capable devices, one entry per name (the same device shows up once per host API), default marked."""
    sd = _sounddevice()
    try:
        devices, hostapis = sd.query_devices(), sd.query_hostapis()
        default_in = sd.default.device[0]
    except sd.PortAudioError as e:
        raise DeviceIOError(f"cannot list audio devices: {e}", fix="check that the sound system is running") from None
    if default_in is None or default_in < 0:
        default_in = next((h["default_input_device"] for h in hostapis if h["default_input_device"] >= 0), -1)
    found: dict[str, InputDevice] = {}
    for index, d in enumerate(devices):
        if d["max_input_channels"] <= 0:
            continue
        dev = InputDevice(index, d["name"], hostapis[d["hostapi"]]["name"], d["max_input_channels"],
                          float(d["default_samplerate"]), index == default_in)
        key = d["name"].strip().lower()
        if key not in found or (dev.is_default and not found[key].is_default):
            found[key] = dev
    return sorted(found.values(), key=lambda dev: dev.index)


def find_input_device(spec: int | str | None) -> InputDevice:
    """None = the default input; an int (or digits) = that PortAudio index; text = case-insensitive substring."""
    devices = list_input_devices()
    names = ", ".join(f"{d.index}: {d.name}" for d in devices) or "none"
    list_fix = "run `aie-apps dictate --list-devices` and pass --input-device INDEX or part of a name"
    if not devices:
        raise DeviceIOError("no microphone (audio input device) found",
                            fix="plug in a microphone, or check that PulseAudio/PipeWire is running and this user may use audio")
    if spec is None or spec == "":
        return next((d for d in devices if d.is_default), devices[0])
    if isinstance(spec, int) or str(spec).strip().isdigit():
        index = int(spec)
        match = next((d for d in devices if d.index == index), None)
        if match is None:
            raise DeviceIOError(f"audio input device {index} does not exist or has no input channels (inputs: {names})",
                                fix=list_fix)
        return match
    matches = [d for d in devices if str(spec).lower() in d.name.lower()]
    if not matches:
        raise DeviceIOError(f"no audio input device matches {spec!r} (inputs: {names})", fix=list_fix)
    return matches[0]


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
        self.info = find_input_device(self.device)

    def run(self, push: Callable[[np.ndarray, int], None], stop: threading.Event) -> None:
        sd = _sounddevice()
        self.info = info = find_input_device(self.device)
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


# ----------------------------------------------------------------------------------------------- stream

class Stream:
    """A live dictation session: capture thread (optional source) -> ring buffer -> worker thread.

    transcriber: a loaded Transcriber (states ready -> listening -> stopped), or a zero-argument callable
        returning one: then capture starts first and the model loads and warms up meanwhile (states loading
        -> warming -> ready -> listening -> stopped), and nothing said during loading is lost.
    source: Microphone(...), FileSource(...), or None when the app calls feed(). start() checks it: a missing
        microphone or unreadable file raises there (a busy microphone only when capture opens it).
    Callbacks on_partial(Partial), on_final(Final), on_state(str) run on the worker thread; events() yields
    the same events (and State changes) to one consumer.
    """

    def __init__(self, transcriber, source=None, options: DictationOptions = DictationOptions(), *,
                 on_partial: Callable[[Partial], None] | None = None,
                 on_final: Callable[[Final], None] | None = None,
                 on_state: Callable[[str], None] | None = None,
                 save_audio: str | Path | None = None):
        self._transcriber = transcriber
        self.source, self.options = source, options
        self.on_partial, self.on_final, self.on_state = on_partial, on_final, on_state
        self.save_audio = Path(save_audio) if save_audio else None
        self.ring = RingBuffer(int(options.ring_seconds * SAMPLE_RATE))
        self.state = "stopped"
        self.finals: list[Final] = []
        self.error: SdkError | None = None
        self.recognizer: Recognizer | None = None
        self._events: queue.Queue = queue.Queue(maxsize=10_000)  # bounded: an app may use callbacks only
        self._stop = threading.Event()
        self._stop_timer: threading.Timer | None = None
        self._cancel = False
        self._resamplers: dict[int, object] = {}
        self._feed_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._recording = None
        self.processed = 0        # samples the recognizer has consumed
        self.sim_clock = 0.0      # virtual audio-time clock of a "simulated" FileSource
        self._wall_start: float | None = None

    # -- lifecycle

    def start(self) -> "Stream":
        if self._threads:
            raise UsageError("this Stream was already started; make a new one")
        if self.source is not None:
            self.source.check()  # a missing microphone or file is raised here, not later on the capture thread
        if self.save_audio is not None:
            import soundfile
            try:
                self._recording = soundfile.SoundFile(str(self.save_audio), "w", SAMPLE_RATE, 1, "PCM_16")
            except (OSError, RuntimeError, soundfile.LibsndfileError) as e:
                raise InputError(f"cannot write {self.save_audio}: {e}", fix="pass a writable .wav path") from None
        worker = threading.Thread(target=self._work, name="dictation-worker", daemon=True)
        self._threads.append(worker)
        if self.source is not None:
            self._threads.append(threading.Thread(target=self._capture, name="dictation-capture", daemon=True))
        for t in self._threads[1:]:
            t.start()                      # capture first: audio said while the model loads is kept
        worker.start()
        return self

    def feed(self, samples: np.ndarray, sample_rate: int, *, block: bool = True) -> None:
        """Push audio (any rate, mono or [n, channels]). block=False from real-time callbacks: when the
        buffer is full the oldest unread audio is dropped and counted instead of waiting. Raises the
        session's error once it has failed (the audio fed before that is in unprocessed_audio())."""
        if self.error is not None:
            raise self.error
        if self.ring.closed:
            raise UsageError("this dictation stream has stopped; feed a new Stream")
        self._push(float_samples(samples, "the fed audio"), sample_rate, block)

    def _push(self, samples: np.ndarray, sample_rate: int, block: bool) -> None:
        samples = np.asarray(samples, np.float32)  # the sources' blocks are float already (checked once)
        if self._wall_start is None:  # the wall-clock moment audio time 0 was captured
            self._wall_start = time.monotonic() - len(samples) / sample_rate
        if samples.ndim == 2:
            samples = samples.mean(axis=1)
        if samples.ndim != 1:
            raise InputError(f"feed() takes [n] or [n, channels] samples, got shape {samples.shape}")
        if sample_rate != SAMPLE_RATE:
            with self._feed_lock:
                if sample_rate not in self._resamplers:
                    import soxr
                    self._resamplers[sample_rate] = soxr.ResampleStream(sample_rate, SAMPLE_RATE, 1, dtype="float32")
                samples = self._resamplers[sample_rate].resample_chunk(samples)
        self.ring.write(samples, block=block)

    def stop(self, *, cancel: bool = False, timeout: float | None = None) -> list[Final]:
        """Stop capturing (see request_stop); unless cancel, transcribe what was captured. Returns all finals;
        raises the session's error, if any (its audio was transcribed when possible, see unprocessed_audio())."""
        self.request_stop(cancel=cancel)
        return self.wait(timeout)

    def request_stop(self, *, cancel: bool = False) -> None:
        """stop() without waiting (safe from callbacks and other threads). A live source (a microphone, a file at
        real-time pace) captures `stop_delay` s more first, unless cancelling."""
        self._cancel = self._cancel or cancel
        live = self.source is not None and not self.source.backpressure and self._threads
        if live and not cancel and self.options.stop_delay > 0 and not self._stop.is_set():
            if self._stop_timer is None:
                self._stop_timer = threading.Timer(self.options.stop_delay, self._stop.set)
                self._stop_timer.daemon = True
                self._stop_timer.start()
            return
        self._stop.set()
        if self.source is None or not self._threads:
            self.ring.close()

    def wait(self, timeout: float | None = None) -> list[Final]:
        """Wait until the session ends by itself (source exhausted, silence timeout, max duration, stop)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if self.error is not None:
            raise self.error
        return list(self.finals)

    def events(self) -> Iterator[Event]:
        """Partial, Final and State events until the session has stopped; then raises its error, if any."""
        while True:
            event = self._events.get()
            if event is None:
                break
            yield event
        if self.error is not None:
            raise self.error

    def __enter__(self) -> "Stream":
        return self.start()

    def __exit__(self, *exc):
        try:
            self.stop(cancel=exc[0] is not None)
        except SdkError:
            if exc[0] is None:
                raise

    # -- reports

    @property
    def dropped_blocks(self) -> int:
        return self.ring.dropped_blocks + getattr(self.source, "overflows", 0)

    @property
    def captured_seconds(self) -> float:
        return self.ring.written / SAMPLE_RATE

    def unprocessed_audio(self) -> np.ndarray:
        """16 kHz audio captured but not transcribed (e.g. the model failed to load); save it with soundfile."""
        return self.ring.unread()

    def report(self) -> dict:
        return {"state": self.state, "captured_s": round(self.captured_seconds, 3),
                "processed_s": round(self.processed / SAMPLE_RATE, 3), "dropped_blocks": self.dropped_blocks,
                "dropped_s": round(self.ring.dropped_samples / SAMPLE_RATE, 3),
                "decodes": self.recognizer.decodes if self.recognizer else 0, "finals": len(self.finals)}

    # -- threads

    def _capture(self):
        try:
            self.source.run(lambda x, rate: self._push(x, rate, self.source.backpressure), self._stop)
        except SdkError as e:
            self.error = e
        except Exception as e:  # a bug or an unexpected driver failure: still typed, audio still kept
            self.error = DeviceIOError(f"audio capture failed: {type(e).__name__}: {e}",
                                       fix="check the audio device; the audio captured so far was kept")
        finally:
            self.ring.close()

    def _put(self, event: Event | None):
        """Queue for events(); when nobody reads them, the oldest are dropped (callbacks still see all)."""
        while True:
            try:
                self._events.put_nowait(event)
                return
            except queue.Full:
                try:
                    self._events.get_nowait()
                except queue.Empty:
                    pass

    def _set_state(self, state: str):
        self.state = state
        self._put(State(state))
        if self.on_state:
            self.on_state(state)

    def _emit(self, events: list[Event], at: float):
        for event in events:
            event = replace(event, at=round(at, 3))
            if isinstance(event, Final):
                self.finals.append(event)
                if self.on_final:
                    self.on_final(event)
            elif self.on_partial:
                self.on_partial(event)
            self._put(event)

    def _work(self):
        try:
            transcriber, decode_seconds = self._load()
            self.recognizer = rec = Recognizer(transcriber, self.options)
            rec.decode_seconds = decode_seconds
            pace = getattr(self.source, "pace", None)
            if pace not in ("simulated", "fast"):
                rec.unheard = self.ring.unread
            if self.error is None:   # a capture that failed already hears nobody; what it got is still transcribed
                self._set_state("listening")
            simulated, fast = pace == "simulated", pace == "fast"
            step = FRAME * 4
            while True:
                if self._cancel:
                    break
                if simulated:  # take exactly the audio a live microphone would have delivered by now
                    due = max(int(self.sim_clock * SAMPLE_RATE), self.processed + step) - self.processed
                    chunk = self.ring.read(due, min_samples=due, timeout=0.5)
                elif fast:     # the cadence of a live session on an infinitely fast machine
                    chunk = self.ring.read(step, min_samples=step, timeout=0.5)
                else:          # live: everything that arrived (bigger chunks when decoding lags)
                    chunk = self.ring.read(timeout=0.1)
                if chunk is None:
                    break
                if not len(chunk):
                    continue
                if self._recording is not None:
                    self._recording.write(chunk)
                self.processed += len(chunk)
                started = time.perf_counter()
                events = rec.accept(chunk)
                if simulated:
                    self.sim_clock = max(self.sim_clock, self.processed / SAMPLE_RATE) + time.perf_counter() - started
                self._emit(events, self._clock(pace))
                if self._limits_reached(rec):   # what waits in the ring (a fast file has plenty) is past the limit
                    self._stop.set()
                    self.ring.close()
                    break
            if not self._cancel:
                self._emit(rec.finish(), self._clock(pace))
        except SdkError as e:
            self.error = self.error or e
        except Exception as e:
            self.error = self.error or SdkError(f"dictation failed: {type(e).__name__}: {e}",
                                                fix="this is a bug; the captured audio is in unprocessed_audio()")
        finally:
            self._stop.set()
            self.ring.close()
            if self._recording is not None:
                self._recording.write(self.ring.unread())
                self._recording.close()
            self._set_state("stopped")
            self._put(None)

    def _clock(self, pace: str | None) -> float:
        """Audio time "now", for stamping events: live, the wall time since capture began (which keeps
        running after a real-time file ends); for a simulated file the virtual clock; for a fast file what
        has been consumed (so latency = algorithmic latency)."""
        if pace == "simulated":
            return self.sim_clock
        if pace == "fast":
            return self.processed / SAMPLE_RATE
        wall = time.monotonic() - self._wall_start if self._wall_start is not None else 0.0
        return max(self.ring.written / SAMPLE_RATE, wall)

    def _load(self) -> tuple[object, float]:
        """(transcriber, seconds one decode takes). A factory is called here (states loading, warming) and the
        model warmed on one decode (of faint noise); an instance the app passed is taken as loaded and warm."""
        if not (isinstance(self._transcriber, type) or not hasattr(self._transcriber, "decode_window")):
            self._set_state("ready")
            return self._transcriber, 0.0
        self._set_state("loading")
        transcriber = self._transcriber()
        self._set_state("warming")
        started = time.perf_counter()
        # first-call costs are paid before "ready", and the time of one decode paces the first partials; faint
        # noise, because digital silence is not decoded at all (Whisper's energy gate)
        hiss = 0.003 * np.random.default_rng(0).standard_normal(SAMPLE_RATE).astype(np.float32)
        transcriber.decode_window(hiss)
        warm = time.perf_counter() - started
        self._set_state("ready")
        return transcriber, warm

    def _limits_reached(self, rec: Recognizer) -> bool:
        now = self.processed / SAMPLE_RATE
        if self.options.max_duration is not None and now >= self.options.max_duration:
            return True
        if self.options.silence_timeout is not None and not rec.in_utterance:
            return now - rec.last_speech >= self.options.silence_timeout
        return False
