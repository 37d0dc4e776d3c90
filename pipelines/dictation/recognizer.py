"""The streaming engine without threads: VAD-cut utterances, partial decodes, agreement, early commits, finals."""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .events import Event, Final, Partial
from .options import FRAME, FRAME_SECONDS, SAMPLE_RATE, WINDOW_SECONDS, DictationOptions
from .text_guards import (agreed_words, collapse_repeats, looks_like_text, norm_word, overlap_words,
                          too_compressible)
from .voice_activity import open_vad

SLIDE_OVERLAP = 1.0           # s of committed audio an early commit keeps in the buffer (see _commit_agreed)


@dataclass
class _Hypothesis:
    segments: list            # the Transcriber's Segments that survived the guards
    words: list[str]          # all their words, in order
    ends: list[int]           # cumulative word count at the end of each segment
    sure: list[float]         # how sure the model was of each word (a log-prob), [] when it did not say

    @classmethod
    def from_segments(cls, segments, window_end: float, sure: list) -> "_Hypothesis":
        """`sure`: per segment, its words' log-probs (the transcriber's `last_word_logprobs`), or None if unknown."""
        kept, words, ends, kept_sure, previous = [], [], [], [], None
        for seg, seg_sure in zip(segments, sure):
            text = seg.text.strip()
            if not looks_like_text(text) or norm_word(text) == previous or seg.start >= window_end:
                continue
            previous = norm_word(text)
            kept.append(seg)
            words.extend(text.split())
            ends.append(len(words))
            kept_sure.append(seg_sure)
        collapsed = collapse_repeats(words)
        if len(collapsed) != len(words) or too_compressible(" ".join(words)):
            # a loop was cut: segment boundaries no longer line up with the words, so this hypothesis
            # offers no early-commit points (the utterance end or the hard cut still finalises it)
            collapsed = [] if too_compressible(" ".join(collapsed)) else collapsed
            return cls([], collapsed, [], [])
        known = [] if None in kept_sure else [x for seg_sure in kept_sure for x in seg_sure]
        return cls(kept, words, ends, known if len(known) == len(words) else [])

    @property
    def text(self) -> str:
        return " ".join(self.words)

    def without_prefix(self, n: int) -> "_Hypothesis":
        if n == 0:
            return self
        keep = [i for i, end in enumerate(self.ends) if end > n]
        return _Hypothesis([self.segments[i] for i in keep], self.words[n:], [self.ends[i] - n for i in keep],
                           self.sure[n:])


class Recognizer:
    """The streaming engine without threads: `accept(samples_16k)` -> events, `finish()` at the end.

    `transcriber` is anything with `decode_window(samples_16k, *, offset, fallback, stop) -> [Segment(start, end, text)]`
    (`stop`, when given, is polled during the decode; once it says True the decode returns None). One that also has
    `last_tokens` (Whisper) takes `draft=` and `prefix=` (tokens to continue after) as well, and one that also says
    how sure it was of each word (`last_word_logprobs`: per segment, per word, a log-prob) has its sure finals emitted
    at `commit_quiet`, before the hangover; a resumed talker continues the same utterance (see _commit_heard).
    One call to accept() runs at most one partial decode, so when decoding is slower than real time the
    caller simply hands over bigger chunks and partials get rarer; finals are never skipped.
    """

    def __init__(self, transcriber, options: DictationOptions = DictationOptions()):
        self.transcriber, self.options = transcriber, options
        self.vad = open_vad(options) if options.vad else None   # the energy VAD or silero-vad (options.vad)
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
        # when the talker has stopped, and the final's decode in a pause stops when the talker goes on, so that
        # the final's decode starts at once instead of behind a decode that missed the end.
        self.unheard: Callable[[], np.ndarray] | None = None
        self._rest = np.zeros(0, np.float32)  # samples short of a whole frame
        self._preroll_frames = round(options.preroll / FRAME_SECONDS)
        self._context_frames = round(options.context / FRAME_SECONDS)
        self._past = deque(maxlen=max(1, self._preroll_frames + self._context_frames))  # audio before the utterance
        self._last_final: list[str] = []      # words of the last final, to drop them if the context repeats them
        self._draft: tuple[float | None, list[int]] = (None, [])  # the last decode's audio start and tokens
        self._continues = getattr(transcriber, "last_tokens", None) is not None   # takes draft= and prefix=
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
        if not (self.in_utterance and self._enough_voice()) or any(isinstance(e, Final) for e in events):
            return events   # a final goes out now, not after a decode (the next call runs it)
        # The final must not wait for a decode that missed the last words. So when the talker seems to be stopping,
        # decode at once: once the hangover confirms the end, that decode is the final; live, it gives way if the
        # talker goes on (then it cannot be the final, and the final must not wait for it). Live, a decode amid
        # speech gives way as soon as the talker stops (on the cpu backend its encoder pass too), so one runs every
        # interval: its tokens are the final's draft (Whisper), so it runs with partials off too. At a simulated
        # pace nothing gives way: partials start in a pause (or when two intervals overdue), so that the one
        # running when the talker stops has most likely heard the end too.
        quiet = self._now() - self.last_speech if self.options.vad else 0.0
        # counted from the last words once it is quiet: a click or a breath after them (loud for less than an onset)
        # does not put the final's decode off
        ended = self._now() - self._last_words if quiet > 0 else quiet
        every = max(self.options.partial_every, self.decode_seconds / max(self.options.partial_share, 1e-3))
        gives_way = self.unheard is not None and bool(self.options.vad)
        wanted = self.options.partials or self._duration() >= self._commit_after or (gives_way and self._continues)
        if ended >= self.options.early_final - 1e-9:
            if not self._heard_end():
                events += self._partial(stop_when=self._talker_resumed)
        elif wanted and self._since_decode >= every and (quiet >= self.options.final_tail - 1e-9 or gives_way
                                                         or not self.options.vad or self._since_decode >= 3 * every):
            # A decode amid speech can never serve as the final (it did not hear the end): one greedy pass
            # without temperature retries keeps it short, so that a final is less likely to wait behind it.
            in_pause = quiet >= self.options.final_tail - 1e-9 or not self.options.vad
            events += self._partial(fallback=in_pause, stop_when=None if in_pause else self._talker_stopped)
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
                if self._next_start is None:          # the talker resumed after an emitted final
                    self._next_start = now - self._loud_run * FRAME_SECONDS
        events: list[Event] = []
        if self.options.vad and now - self.last_speech >= self.options.hangover:
            return self._end_utterance()
        commit = self.options.commit_quiet
        if (commit is not None and self._continues and self.options.vad and now - self.last_speech >= commit - 1e-9
                and self._latest is not None and self._latest.words and self._heard_end() and self._sure()):
            return self._commit_heard()
        if self._duration() >= self._max_utterance:
            events += self._hard_cut()
        return events

    def _begin_utterance(self, speech_start: float):
        pre = [self._past.pop() for _ in range(min(self._preroll_frames, len(self._past)))][::-1]
        self._chunks = pre + self._onset_run
        self._buffer_start = self._committed_until = speech_start - len(pre) * FRAME_SECONDS
        self._speech_start = self._next_start = speech_start
        self._onset_run = []
        self._since_decode = len(self._chunks) * FRAME_SECONDS

    def _reset_utterance(self):
        self._chunks: list[np.ndarray] | None = None
        self._buffer_start = self._speech_start = 0.0
        self._next_start: float | None = 0.0      # where the next final's speech starts (None: not heard yet)
        self._committed_until = 0.0               # audio time up to which finals hold the speech
        self._prefix: tuple[float, list[int]] | None = None   # the emitted decode's audio start and tokens
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

    def _sure(self) -> bool:
        """The model was sure of every word of the last decode (each at least `commit_logprob`), so it is unlikely
        to read them otherwise if the talker goes on: the words it misreads without the audio after them are ones
        it is unsure of. A transcriber that does not say is never sure."""
        sure = self._latest.sure
        return bool(sure) and min(sure) >= self.options.commit_logprob - 1e-9

    # -- decoding

    def _pending(self) -> np.ndarray:
        """The live audio a running decode has not heard: what accept() holds back and what has not reached it."""
        return np.concatenate([self._rest, self.unheard()])

    def _talker_stopped(self) -> bool:
        pending = self._pending()
        return len(pending) / SAMPLE_RATE >= self.options.early_final and \
            self.vad.quiet_tail(pending) >= self.options.early_final - 1e-9

    def _talker_resumed(self) -> bool:
        """The audio that arrived since a decode in a pause began is not all quiet, up to an onset or more before its
        quiet end: the pause was not the end (a word said and ended while the encoder ran counts too)."""
        pending = self._pending()
        return len(pending) / SAMPLE_RATE - self.vad.quiet_tail(pending) >= self.options.onset - 1e-9

    def _window_audio(self) -> tuple[np.ndarray, float, list]:
        """Left context + the utterance buffer (+ silence for a missing pre-roll): (audio, its audio start, context)."""
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
        return audio, offset, context

    def _decode(self, fallback: bool = True, stop_when: Callable[[], bool] | None = None) -> _Hypothesis | None:
        """Decode left context + the utterance buffer; keep the segments that reach into the buffer. When the
        first of them claims to start inside the context (Whisper's segment times are loose, and it may merge
        context and utterance into one segment), its leading words that re-transcribe the end of the recent
        finals are dropped (a fuzzy match: tiny models re-transcribe with small differences). After a final of
        this utterance was emitted, the decode continues after that decode's tokens, and only its new words count.
        `stop_when`, live, is polled during the decode: once it says True the decode is given up (None)."""
        audio, offset, context = self._window_audio()
        if self._prefix is not None and self._prefix[0] != offset:
            # the window no longer starts where the emitted decode's did (a long utterance's context shrank), so its
            # tokens cannot continue here: the emitted words become committed audio, as an early commit's are
            self._slide(self._committed_until)
            audio, offset, context = self._window_audio()
        self.decodes += 1
        self._since_decode = 0.0
        started = time.perf_counter()
        stop = stop_when if self.unheard is not None and self.options.vad else None   # it watches live audio
        # the previous decode from the same audio start is a draft the transcriber verifies in one pass
        draft = {"draft": self._draft[1]} if self._continues and self._draft[0] == offset else {}
        if self._prefix is not None:
            draft["prefix"] = self._prefix[1]
        segments = self.transcriber.decode_window(audio, offset=offset, fallback=fallback, stop=stop, **draft)
        if self._continues and (segments is not None or self.transcriber.last_tokens):  # a given-up one's too
            self._draft = (offset, list(self.transcriber.last_tokens))
        if segments is None:
            self.stopped_decodes += 1
            return None
        took = time.perf_counter() - started
        self.decode_seconds = took if not self.decode_seconds else 0.8 * self.decode_seconds + 0.2 * took
        window_end = self._buffer_start + self._duration()
        sure = getattr(self.transcriber, "last_word_logprobs", None) or [None] * len(segments)
        own = [(seg, s) for seg, s in zip(segments, sure) if min(seg.end, window_end) > self._buffer_start + 0.3]
        hyp = _Hypothesis.from_segments([seg for seg, _ in own], window_end, [s for _, s in own])
        first = hyp.segments[0] if hyp.segments else None
        heard_final_audio = bool(context) or self._committed_until > self._buffer_start
        if self._prefix is None and heard_final_audio and first is not None and first.start < self._committed_until - 0.2:
            hyp = hyp.without_prefix(overlap_words(self._last_final, hyp.words))
        self._latest, self._latest_end = hyp, window_end
        return hyp

    def _partial(self, fallback: bool = True, stop_when: Callable[[], bool] | None = None) -> list[Event]:
        hyp = self._decode(fallback, stop_when)
        if hyp is None:
            return []
        if self._previous is not None:
            self._agreed = max(self._agreed, agreed_words(self._previous.words, hyp.words))
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
        final = self._final(words, self._start(), seg_end)
        self._slide(seg_end)
        self._next_start = seg_end
        rest = hyp.words[hyp.ends[cut]:]
        self._previous = _Hypothesis([], rest, [len(rest)], hyp.sure[hyp.ends[cut]:]) if rest else None
        self._agreed = max(0, self._agreed - len(words))
        return [final]

    def _slide(self, committed: float):
        """Finals hold the speech up to `committed`: the buffer keeps SLIDE_OVERLAP s before it, the rest goes to
        the past (left context), and decodes start afresh from there (no prefix)."""
        drop = max(0, int(round((committed - SLIDE_OVERLAP - self._buffer_start) / FRAME_SECONDS)))
        self._past.extend(self._chunks[:drop])
        self._chunks = self._chunks[drop:]
        self._buffer_start += drop * FRAME_SECONDS
        self._speech_start = self._committed_until = committed
        self._latest, self._prefix = None, None   # they decoded the buffer before the slide

    def _commit_heard(self) -> list[Event]:
        """`commit_quiet` s of quiet, and the last decode heard the end and was sure of its words: they become
        final now, before the hangover confirms the end. The utterance stays open: if the talker resumes before the
        hangover, the next decodes hear the whole utterance as before and continue after that decode's tokens (a
        forced prefix), so the next final holds only the words after them: nothing emitted is revised or decoded
        apart from the rest (a shorter hangover splits utterances at comma pauses, and their halves decoded apart
        read worse)."""
        end = min(self._last_words, self._now())
        final = self._final(self._latest.words, self._start(), max(end, self._start()))
        self._prefix = self._draft                # the tokens of the decode `_latest` came from
        self._committed_until = end
        self._latest = _Hypothesis([], [], [], [])   # it still heard the end; its words are out
        self._previous, self._agreed, self._next_start = None, 0, None
        return [final]

    def _start(self) -> float:
        """Where the next final's speech starts: after an emitted final, where the talker resumed (or, if no word
        was heard since, where the emitted final ended)."""
        return self._next_start if self._next_start is not None else self._committed_until

    def _hard_cut(self) -> list[Event]:
        """The window is full and nothing agreed: everything decoded so far becomes final."""
        hyp = self._decode() if self._enough_voice() else None
        end = self._now()
        events = [self._final(hyp.words, self._start(), end)] if hyp and hyp.words else []
        self._past.extend(self._chunks)
        self._chunks, self._buffer_start, self._speech_start, self._committed_until = [], end, end, end
        self._previous, self._agreed, self._voiced, self._latest = None, 0, 0, None
        self._next_start, self._prefix = end, None
        return events

    def _end_utterance(self) -> list[Event]:
        events: list[Event] = []
        if self._enough_voice() and self._chunks:
            hyp = self._latest if self._heard_end() else self._decode()
            end = min(self._last_words, self._now()) if self.options.vad else self._now()   # not a click after them
            if hyp.words:
                events.append(self._final(hyp.words, self._start(), max(end, self._start())))
        self._past.extend(self._chunks or [])
        self._reset_utterance()
        return events

    def _final(self, words: list[str], start: float, end: float) -> Final:
        self._last_final = (self._last_final + list(words))[-40:]  # the recent finals, which the context holds
        return Final(" ".join(words), start, end)
