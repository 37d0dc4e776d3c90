"""Whisper speech recognition: one session, 30 s windows with seek, and short encoder windows for short audio.

Decoding follows OpenAI's reference `transcribe`: 30 s windows with seek (the next window starts at the last
complete segment's end timestamp), greedy decoding with Whisper's logit rules (suppress_tokens, blank
suppression at the start, timestamp pairing, non-decreasing timestamps, initial timestamp <= 1 s, a
timestamp is taken when the timestamps' summed probability beats every text token), the no-speech skip
(plus an energy gate: digitally silent windows are not decoded at all), and temperature fallback (seeded
sampling) when the compression ratio or average log-prob says a window went wrong. Windows are decoded
independently (no previous-text prompt), as transformers does by default.

Greedy steps run `decode_greedy` (filters and argmax on the device, a few scalars back); the first step of
each window and sampled steps read full logits from `decode_step` (see sdk/models/whisper.py). A live decode
given its previous decode's tokens verifies them in one `decode_{n}` pass first (pipelines/whisper_drafts.py), and
one given a forced prefix (a continued utterance's emitted tokens) feeds it the same way and decodes what follows.

Audio shorter than 30 s (a short file, the last window of a long one, a dictation utterance) may run in a short
encoder window (whisper.ENCODER_WINDOWS, the shortest that holds it with 1 s to spare), where the model's WER
gate allows it (SHORTEST_WINDOW). A short window gets one greedy pass; a decode there that looks like a repeat
loop (its token limit reached, a timestamp well past the audio), hears no speech or fails the fallback checks is
decoded again in the next longer window, and only the full window retries at higher temperatures.
One WhisperRecognizer holds one session (weights resident) and one decoding state; it serialises its callers.
"""
from __future__ import annotations

import re
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from pipelines import audio, whisper_drafts, whisper_segments
from pipelines.transcript import Segment, TranscribeOptions, Transcript
from pipelines.whisper_segments import TIME_PRECISION, last_stamp, to_last_word
from pipelines.whisper_tokenizer import WhisperTokenizer
from sdk import hub
from sdk.errors import RunStopped, UsageError
from sdk.models import whisper
from sdk.ops import NEG_INF
from sdk.session import Session
from sdk.weights import read_config, read_json_object

DEFAULT_MODEL = "whisper-tiny.en"
FRAME_SECONDS = audio.WHISPER_HOP / audio.SAMPLE_RATE  # 10 ms mel frames
TAIL_SECONDS = 1.0             # silence a short encoder window holds after the audio (of a 30 s window)
LATE_STAMP_SECONDS = 3.0       # a short window's timestamp this far past the audio's end means a loop: whisper-base
                               # puts the end of speech up to 2.3 s into the silence after it with the same text as
                               # the next window (measured on the LibriVox dictation session), a loop runs on further
STOPS_SHORT_SECONDS = 1.0      # a continuation whose last timestamp is this far before the audio's end missed words:
                               # a live decode's audio ends at most a hangover (0.6 s) after the last words
# The shortest encoder window (s) in which each model keeps its accuracy in FILE transcription, by the WER gate
# (tests/test_whisper_base.py: LibriVox and flite speech, short windows vs the full one within 0.5 points, no word
# lost at the ends; bench/whisper_windows.py measures every floor). whisper-base holds it at 5 s. tiny.en does not
# below 30 s: at every floor from 5 to 20 s it hears the LibriVox clips' "ill-disposed" as "old-sposed" (clips
# 7.0 % vs 4.2 %, +2.8 points of 71 words); at 20 s it also ends a long file's last segment past the audio's end,
# and a rule that sends such a decode to the next window makes short windows slower than the full one (up to 4
# encoder windows per clip). Models not listed run the full window only.
SHORTEST_WINDOW = {"whisper-base": 5.0}
# The same floor for live dictation (decode_window: 6 s of left context + one utterance), where a model's live gate
# allows a shorter window than its file gate: tiny.en keeps its live WER at 20 s (1.41 %, as in the full window, on
# the LibriVox session; tests/test_dictation.py), and the encoder pass takes 0.14 s there instead of 0.23 s
# (bench/dictation_latency.py, idle). Below 20 s it misreads "ill-disposed". Models not listed use SHORTEST_WINDOW.
LIVE_SHORTEST_WINDOW = {"whisper-tiny.en": 20.0}


@dataclass
class _Result:
    tokens: list[int]                 # sampled tokens, end-of-text removed (a forced prefix's included)
    avg_logprob: float                # (this, logprobs and text: of the tokens after the prefix, judged before)
    no_speech_prob: float
    temperature: float
    text: str
    logprobs: list[float]             # the log-prob of each token after the prefix, as it was chosen

    @property
    def compression_ratio(self) -> float:
        raw = self.text.encode()
        return len(raw) / len(zlib.compress(raw)) if raw else 0.0



def program_graphs(folder: Path) -> list:
    """The graphs a WhisperRecognizer of this model folder runs (its one session): what `aie-apps build` compiles."""
    cfg, _ = whisper.load(folder)
    return whisper.program_graphs(cfg, WhisperTokenizer(Path(folder), cfg.vocab_size).timestamp_begin)


class WhisperRecognizer:
    def __init__(self, model: str | hub.ModelSource = DEFAULT_MODEL, device: str | None = None,
                 options: TranscribeOptions = TranscribeOptions()):
        self.options = options
        self.source = model if isinstance(model, hub.ModelSource) else hub.resolve(model)
        folder = self.source.path
        self.cfg, weights = whisper.load(folder)
        self.tokenizer = tok = WhisperTokenizer(folder, self.cfg.vocab_size)
        self.english_only = not tok.multilingual
        if options.language and options.language not in tok.languages:
            raise UsageError(f"unknown language {options.language!r}",
                             fix=f"use one of {', '.join(sorted(tok.languages))}")
        if self.english_only and options.language not in (None, "en"):
            raise UsageError(f"{self.source.name} is an English-only model; it cannot transcribe {options.language!r}",
                             fix="use a multilingual model (e.g. whisper-base, or openai/whisper-tiny when online) or --language en")
        self.windows = whisper.windows(self.cfg, whisper.ENCODER_WINDOWS)  # shortest first, the full one last
        graphs = whisper.program_graphs(self.cfg, tok.timestamp_begin)
        drafts = whisper.draft_graphs(self.cfg) if options.verify_drafts else []
        # INT8_ENTRIES names entries of every window (a short window runs int8 as the full one does) that this
        # session may not have (the draft passes)
        int8 = {w.entry(name) for w in self.windows for name in whisper.INT8_ENTRIES}
        precision = ({g.name: "int8" for g in graphs + drafts if g.name in int8}
                     if options.precision == "int8" else options.precision)
        self.session = Session(graphs, weights, device=device, precision=precision, cpu_graphs=drafts)
        self.state = self.session.new_state()
        self.session.run("set_suppress", self.state, bias=self._suppress_table(folder))
        self._active = self.windows[-1]  # the window whose cross K/V the state holds
        self.last_window: whisper.Window | None = None  # the encoder window the last decode kept (bench reads it)
        self.last_tokens: list[int] = []  # ... and its tokens: the draft for the next decode of the same audio
        self.last_word_logprobs: list[list[float]] = []  # ... and how sure it was of each word (decode_window)
        self._lock = threading.Lock()

    # -- public API

    def transcribe(self, source: str | Path | np.ndarray, sample_rate: int | None = None, *,
                   on_progress: Callable[[float], None] | None = None) -> Transcript:
        """Transcribe a file or an array (mono or [frames, channels]; `sample_rate` defaults to 16 kHz);
        `on_progress(seconds)` is told how much of the audio is done after each window."""
        if isinstance(source, (str, Path)):  # decoded window by window: memory stays bounded for any length
            blocks = audio.stream_audio(source)
        else:
            blocks = iter([audio.load_audio(source, sample_rate)])
        hop = audio.WHISPER_HOP
        need = max(audio.WHISPER_CHUNK, self.cfg.n_frames * hop)  # samples ahead of the seek point to decode
        buffer, read, ended = np.zeros(0, np.float32), 0, False  # buffer ends at sample `read` of the audio
        segments, seek, language = [], 0, None
        with self._lock:
            while True:
                buffer = buffer[max(0, seek * hop - (read - len(buffer))):]  # from the seek point on
                while not ended and len(buffer) < need:
                    block = next(blocks, None)
                    ended = block is None
                    if not ended:
                        buffer, read = np.concatenate([buffer, block]), read + len(block)
                total_frames = read // hop if ended else seek + self.cfg.n_frames
                if seek >= total_frames:
                    break
                size = min(self.cfg.n_frames, total_frames - seek)
                found, advance, language = self._window(buffer[:audio.WHISPER_CHUNK], size, seek * FRAME_SECONDS,
                                                        language, zero_mel_past_audio=True)
                segments += found
                seek += max(advance, 1)
                if on_progress is not None:
                    on_progress(min(seek * FRAME_SECONDS, read / audio.SAMPLE_RATE))
        report = self.report()
        return Transcript(" ".join(s.text for s in segments), segments, language or "en",
                          round(read / audio.SAMPLE_RATE, 3), report["device_requested"],
                          report["device_effective"], str(source) if isinstance(source, (str, Path)) else "",
                          report)

    def decode_window(self, samples_16k: np.ndarray, *, offset: float = 0.0, fallback: bool = True,
                      stop: Callable[[], bool] | None = None, draft: Sequence[int] = (),
                      prefix: Sequence[int] = ()) -> list[Segment] | None:
        """Segments of ONE window of at most 30 s of mono 16 kHz float audio, with times in seconds from `offset` (no
        seek loop: text after the last timestamp is kept as a segment ending at the window's end). Silence gives [].
        Stable API for live dictation, which calls it on a growing buffer: it passes fallback=False for partial
        hypotheses (one greedy pass, no temperature retries) and `stop`, polled before and (cpu backend) during the
        encoder pass and before every decoder step: once it says True, the decode is given up (None; `last_tokens` then
        holds the tokens its greedy pass had, a draft all the same). `draft`: the `last_tokens` of its previous decode
        of the same audio start, which the greedy pass verifies in one decoder pass (options.verify_drafts): the same
        tokens as without it, in fewer steps. `prefix`: the `last_tokens` of an earlier decode of the same audio start
        whose words were emitted: the decode continues after its last word (what it wrote where its audio ended, the
        closing punctuation and timestamps, is decoded again, for the talker went on and the sentence may too; if that
        continuation ends over a second before the audio does, it goes on after the tokens as they are) and returns
        only the words after them (the segments, or the part of one, after them, without punctuation in place of the
        emitted one); `last_tokens` then holds the tokens it went on after + the continuation."""
        samples = audio.float_samples(samples_16k)
        if samples.ndim != 1 or len(samples) > audio.WHISPER_CHUNK:
            raise UsageError(f"decode_window takes mono audio of at most 30 s, got shape {samples.shape}",
                             fix="use transcribe() for longer audio (audio.load_audio downmixes channels)")
        if len(samples) < audio.WHISPER_HOP:
            return []
        size = len(samples) // audio.WHISPER_HOP
        with self._lock:
            found = self._window(samples, size, offset, None, keep_tail=True, fallback=fallback, stop=stop, live=True,
                                 draft=draft, prefix=list(prefix))
        return None if found is None else found[0]

    def report(self) -> dict:
        """The model and the devices (requested, effective, and why they differ)."""
        return {"model": self.source.name, "model_path": str(self.source.path), **self.session.report()}

    def close(self):
        self.session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- one window

    def _window(self, samples: np.ndarray, size: int, offset: float, language: str | None, keep_tail: bool = False,
                fallback: bool = True, stop: Callable[[], bool] | None = None,
                zero_mel_past_audio: bool = False, live: bool = False,
                draft: Sequence[int] = (), prefix: list[int] | None = None) -> tuple[list[Segment], int, str] | None:
        """Decode one window: (segments, mel frames to advance, language), or None once `stop()` is True.
        live: a dictation window (decode_window), which may run shorter encoder windows (LIVE_SHORTEST_WINDOW).
        zero_mel_past_audio: the mel after the window's audio is zeros, not silence, as OpenAI's transcribe
        (and faster-whisper) pad a file's last window; live windows (decode_window) keep the silence."""
        o = self.options
        self.last_tokens, self.last_word_logprobs = [], []
        if float(np.sqrt(np.mean(np.square(samples, dtype=np.float64)))) < o.silence_rms:
            return [], size, language or o.language or "en"
        max_tokens = int(o.tokens_per_second * len(samples) / audio.SAMPLE_RATE) + 16
        for window in self.windows_for(size, live=live):
            mel = audio.whisper_log_mel(samples, self.cfg.num_mel_bins, n_samples=window.frames * audio.WHISPER_HOP)
            if zero_mel_past_audio:
                mel[:, size:] = 0.0
            if stop is not None and stop():
                return None
            try:  # the cpu backend gives the pass up midway once stop() says so; an NPU dispatch runs to its end
                self.session.run(window.entry("encode"), self.state, mel=mel[None], stop=stop)
            except RunStopped:
                return None
            self._active = window
            language = language or o.language or ("en" if self.english_only else self._detect_language())
            # A short window gets one greedy pass; one that went wrong moves to the next window (a short audio
            # context is what makes Whisper repeat itself), and only the full window retries hotter.
            used = to_last_word(self.tokenizer, prefix or [])
            result = self._fallback_decode(language, max_tokens, fallback and window.full, stop, draft, used)
            if result is not None and used != (prefix or []) and self._stops_short(result, size):
                # continued inside the emitted decode's last segment, Whisper may close it and end before the
                # words that followed: then the continuation after the emitted tokens as they are is taken
                used = prefix
                result = self._fallback_decode(language, max_tokens, fallback and window.full, stop, draft, used)
            if result is None:
                return None
            if window.full or self._plausible(result, size * FRAME_SECONDS, max_tokens):
                break
        self.last_window, self.last_tokens = window, result.tokens
        if (o.no_speech_threshold is not None and result.no_speech_prob > o.no_speech_threshold
                and not (o.logprob_threshold is not None and result.avg_logprob > o.logprob_threshold)):
            return [], size, language
        segments, advance, self.last_word_logprobs = whisper_segments.segments(
            self.tokenizer, result.tokens, size, size * FRAME_SECONDS, offset, timestamps=o.timestamps,
            keep_tail=keep_tail, after=len(used), logprobs=result.logprobs if live else None)
        return segments, advance, language

    def windows_for(self, size: int, live: bool = False) -> list[whisper.Window]:
        """The encoder windows a decode of `size` mel frames may run in, in the order it tries them (`live`: a
        dictation window's, whose floor is LIVE_SHORTEST_WINDOW where the model has one)."""
        def frames(seconds: float) -> int:  # mel frames of `seconds` of a 30 s window, at this model's window
            return round(self.cfg.n_frames * seconds / whisper.WINDOW_SECONDS)
        o = self.options
        floors = {**SHORTEST_WINDOW, **LIVE_SHORTEST_WINDOW} if live else SHORTEST_WINDOW
        shortest = o.shortest_window if o.shortest_window is not None else floors.get(self.source.name, 30.0)
        need = max(size + frames(TAIL_SECONDS), frames(shortest))
        return [w for w in self.windows if w.full or w.frames >= need]

    def _plausible(self, result: _Result, seconds: float, max_tokens: int) -> bool:
        """A short window's greedy decode is kept unless it looks like a repeat loop or a failure: it ran into
        its token limit, a timestamp lies well past the audio's end, it heard no words (whisper-base hears none in
        robotic German at 10 s that it transcribes at 30 s: the full window decides what is silence; after a prefix,
        only the punctuation it ended with), or the fallback checks would retry it."""
        o, stamp = self.options, last_stamp(self.tokenizer, result.tokens)
        late = stamp is not None and stamp > seconds + LATE_STAMP_SECONDS
        if len(result.tokens) >= max_tokens or late:
            return False
        if not re.search(r"\w", result.text) or (o.no_speech_threshold is not None and result.no_speech_prob > o.no_speech_threshold):
            return False
        return not self._looping(result) and not self._unsure(result)

    def _stops_short(self, result: _Result, size: int) -> bool:
        """The decode's last timestamp lies more than STOPS_SHORT_SECONDS before the end of its audio."""
        stamp = last_stamp(self.tokenizer, result.tokens)
        return stamp is not None and stamp < size * FRAME_SECONDS - STOPS_SHORT_SECONDS

    def _looping(self, result: _Result) -> bool:
        o = self.options
        return o.compression_ratio_threshold is not None and result.compression_ratio > o.compression_ratio_threshold

    def _unsure(self, result: _Result) -> bool:
        o = self.options
        return o.logprob_threshold is not None and result.avg_logprob < o.logprob_threshold

    def _fallback_decode(self, language: str, max_tokens: int, fallback: bool,
                         stop: Callable[[], bool] | None, draft: Sequence[int] = (),
                         prefix: list[int] = ()) -> _Result | None:
        """Decode the encoded window after `prefix`, greedy first, hotter while the checks fail (fallback=True)."""
        o = self.options
        prompt = [self.tokenizer.sot]
        if not self.english_only:
            prompt += [self.tokenizer.languages[language],
                       self.tokenizer.transcribe if o.task == "transcribe" else self.tokenizer.translate]
        if not o.timestamps:
            prompt.append(self.tokenizer.no_timestamps)
        result, tried = None, []
        for temperature in o.temperatures if fallback else o.temperatures[:1]:
            result = self._decode(prompt, temperature, max_tokens, stop, draft, prefix)
            if result is None:
                return None
            looping = self._looping(result)
            retry = looping or self._unsure(result)
            if o.no_speech_threshold is not None and result.no_speech_prob > o.no_speech_threshold and self._unsure(result):
                retry = False  # silence, as OpenAI's transcribe judges it: the skip below decides
            if not retry:
                break
            tried.append((looping, -result.avg_logprob, len(tried), result))
        else:
            # every temperature failed a check: the likeliest decode that does not loop (as faster-whisper does),
            # not the last one, which at temperature 1.0 is often noise (whisper-base on German: "ночgutten")
            result = min(tried)[-1] if tried else result
        return result

    def _draft_passes(self) -> list[int]:
        """The draft pass lengths the active window has (cpu backend), when drafts are on."""
        entries = self.session.program.entries
        return [n for n in whisper.DRAFT_PASSES if self.options.verify_drafts
                and self._active.entry(f"decode_{n}") in entries]

    def _detect_language(self) -> str:
        logits = self.session.run(self._active.entry("decode_step"), self.state,
                                  tokens=np.array([[self.tokenizer.sot]], np.int32), pos=0)["logits"][0, 0]
        ids = np.array(list(self.tokenizer.languages.values()))
        return list(self.tokenizer.languages)[int(np.argmax(logits[ids]))]

    def _decode(self, prompt: list[int], temperature: float, max_tokens: int,
                stop: Callable[[], bool] | None = None, draft: Sequence[int] = (),
                prefix: list[int] = ()) -> _Result | None:
        """Sample at most `max_tokens` of one window's tokens (`prefix` included) at `temperature` (0 = greedy) after
        `prompt` + `prefix`; cross K/V are in state. None once `stop()` is True. A greedy decode feeds `prefix` and
        verifies `draft` (the tokens an earlier decode of nearly this audio gave; those past the prefix, when it
        starts with it) in one pass where this window has one (pipelines/whisper_drafts.py), else step by step."""
        tok, rng = self.tokenizer, np.random.default_rng(self.options.seed)
        no_speech_prob = 0.0

        def logits_at(token: int, pos: int) -> np.ndarray:
            nonlocal no_speech_prob
            logits = self.session.run(self._active.entry("decode_step"), self.state,
                                      tokens=np.array([[token]], np.int32), pos=pos)["logits"][0, 0]
            if pos == 0:  # Whisper reads the no-speech probability at <|startoftranscript|>
                no_speech_prob = _probability(logits, tok.no_speech)
            return logits

        prefix = list(prefix)
        tokens, logprobs = list(prompt) + prefix, []   # logprobs: of each choice (an end-of-text's included)
        limit = min(self.cfg.max_target_positions // 2, self.cfg.max_target_positions - len(prompt), max_tokens)
        limit -= len(prefix)
        draft = list(draft[len(prefix):]) if list(draft[:len(prefix)]) == prefix else []
        passes = self._draft_passes() if temperature == 0 and (draft or prefix) and limit > 0 else ()

        def verify(draft: list[int], cached: int = 0) -> whisper_drafts.Verified:
            """Verify `draft` in one pass after the tokens so far (the first `cached` positions already in the cache):
            the accepted tokens and greedy's next one join them."""
            nonlocal limit
            verified = whisper_drafts.verify(
                lambda inputs, pos: self.session.run(self._active.entry(f"decode_{inputs.shape[1]}"), self.state,
                                                     tokens=inputs, pos=pos)["logits"][0],
                passes, prompt, draft, limit, tok.eot,
                lambda logits, sampled: self._choose(logits, int(not sampled), self._ranges(sampled), 0.0, rng),
                forced=tokens[len(prompt):], cached=cached)
            logprobs.extend(verified.logprobs)
            tokens.extend(t for t in verified.choices if t != tok.eot)
            limit = 0 if verified.choices[-1] == tok.eot else limit - len(verified.choices)
            return verified
        if passes:  # the prefix fed and the first steps verified in one pass; greedy goes on after them
            no_speech_prob = _probability(verify(draft).no_speech_logits, tok.no_speech)
        else:
            for pos, t in enumerate(tokens[:-1]):
                logits_at(t, pos)
        checked = len(tokens) - len(prompt) - len(prefix)   # draft tokens up to here were verified
        while limit > 0:
            if stop is not None and stop():
                # given up: greedy's tokens so far are still the start of this audio's decode, a draft for the next
                self.last_tokens = tokens[len(prompt):] if temperature == 0 else []
                return None
            at = whisper_drafts.picked_up(tokens[len(prompt) + len(prefix):], draft, checked) if passes else None
            if at is not None:   # greedy left the draft and reads it again here: the rest verified in one pass
                checked = at + len(verify(draft[at:], cached=len(tokens) - 1).choices) - 1
                continue
            limit -= 1
            pos, sampled = len(tokens) - 1, tokens[len(prompt):]
            first = int(not sampled)
            ranges = self._ranges(sampled)
            if sampled and temperature == 0:   # the common case: filters + argmax on the device
                out = self.session.run(self._active.entry("decode_greedy"), self.state,
                                       tokens=np.array([[tokens[-1]]], np.int32), pos=pos, first=first,
                                       lo1=ranges[0], hi1=ranges[1], lo2=ranges[2], hi2=ranges[3])
                token, logprob = int(out["token"][0]), float(out["logprob"][0])
                if self.options.timestamps and (token >= tok.timestamp_begin or float(out["ts_total"][0]) > logprob):
                    token, logprob = tok.timestamp_begin + int(out["ts_token"][0]), float(out["ts_logprob"][0])
            else:
                token, logprob = self._choose(logits_at(tokens[-1], pos), first, ranges, temperature, rng)
            logprobs.append(logprob)
            if token == tok.eot:
                break
            tokens.append(token)
        sampled, new = tokens[len(prompt):], tokens[len(prompt) + len(prefix):]
        return _Result(sampled, sum(logprobs) / (len(new) + 1), no_speech_prob, temperature, tok.decode(new),
                       logprobs[:len(new)])

    # -- Whisper's logit rules

    def _ranges(self, sampled: list[int]) -> tuple[int, int, int, int]:
        """The allowed token ranges [lo1, hi1) (text, below timestamp_begin) and [lo2, hi2) (timestamps)."""
        tb, V = self.tokenizer.timestamp_begin, self.cfg.vocab_size
        if not self.options.timestamps:
            return 0, tb, 0, 0
        if not sampled:  # the first token is a timestamp, at most max_initial_timestamp
            return 0, 0, tb, min(V, tb + round(self.options.max_initial_timestamp / TIME_PRECISION) + 1)
        last = sampled[-1] >= tb
        penultimate = len(sampled) < 2 or sampled[-2] >= tb
        lo1, hi1, lo2, hi2 = 0, tb, tb, V
        if last and penultimate:     # a pair closed a segment: text must follow
            lo2 = hi2 = 0
        elif last:                   # a segment's end timestamp: text cannot follow (another timestamp or EOT)
            lo1 = self.tokenizer.eot
        stamps = [t for t in sampled if t >= tb]
        if stamps and hi2 > lo2:     # timestamps never decrease, and segments have nonzero length
            lo2 = min(V, stamps[-1] if last and not penultimate else stamps[-1] + 1)
        return lo1, hi1, lo2, hi2

    def _choose(self, logits, first: int, ranges, temperature: float, rng) -> tuple[int, float]:
        """The host twin of decode_greedy's filter (full logits): pick or sample a token, with its log-prob."""
        tb, (lo1, hi1, lo2, hi2) = self.tokenizer.timestamp_begin, ranges
        allowed = np.zeros(len(logits), bool)
        allowed[lo1:hi1] = True
        allowed[lo2:hi2] = True
        z = np.where(allowed, logits + self._table[first], -np.inf)
        logprobs = z - _log_sum_exp(z)
        if self.options.timestamps and _log_sum_exp(logprobs[tb:]) > logprobs[:tb].max():
            z[:tb] = -np.inf
            logprobs = z - _log_sum_exp(z)
        if temperature == 0:
            token = int(np.argmax(logprobs))
        else:
            p = np.exp((z - z.max()) / temperature)
            token = int(rng.choice(len(p), p=p / p.sum()))
        return token, float(logprobs[token])

    def _suppress_table(self, folder: Path) -> np.ndarray:
        """Row 0: the model's suppress_tokens (+ Whisper's special tokens); row 1: also blank and EOT."""
        tok = self.tokenizer
        config = read_config(folder)  # CTranslate2: suppress_ids(_begin); transformers: (begin_)suppress_tokens
        generation = folder / "generation_config.json"
        if generation.is_file():
            config |= _read_json(generation)
        suppress = self.options.suppress_tokens
        if suppress is None:
            suppress = config.get("suppress_ids", config.get("suppress_tokens")) or []
        begin = (config.get("suppress_ids_begin", config.get("begin_suppress_tokens"))
                 or [*tok.tok.encode(" ", add_special_tokens=False).ids, tok.eot])
        specials = [tok.transcribe, tok.translate, tok.sot, tok.sot_prev, tok.sot_lm, tok.no_speech]
        table = np.zeros((2, self.cfg.vocab_size), np.float32)
        table[:, [t for t in [*suppress, *specials] if t is not None and t < self.cfg.vocab_size]] = NEG_INF
        if self.options.suppress_blank:
            table[1, [t for t in begin if t < self.cfg.vocab_size]] = NEG_INF
        self._table = table
        return table


def _log_sum_exp(z: np.ndarray) -> float:
    """log(sum(exp(z))) from the max: np.logaddexp.reduce is ~30x slower over a vocabulary, and a draft pass picks
    a token on the host at every accepted position."""
    top = z.max()
    return top + np.log(np.exp(z - top).sum()) if np.isfinite(top) else top


def _probability(logits: np.ndarray, token: int) -> float:
    return float(np.exp(logits[token] - _log_sum_exp(logits)))


def _read_json(path: Path) -> dict:
    return read_json_object(path, path.name)

