"""A live dictation session: capture thread -> ring buffer -> worker thread running the Recognizer."""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from sdk.errors import DeviceIOError, InputError, SdkError, UsageError

from ..audio import float_samples
from .events import Event, Final, Partial, State
from .options import FRAME, SAMPLE_RATE, WINDOW_SECONDS, DictationOptions
from .recognizer import Recognizer
from .ring_buffer import RingBuffer
from .voice_activity import check_vad, vad_name


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
        check_vad(self.options)  # as a missing silero-vad
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
                "decodes": self.recognizer.decodes if self.recognizer else 0, "finals": len(self.finals),
                "vad_requested": self.options.vad or "off",
                "vad_effective": vad_name(self.recognizer.vad) if self.recognizer else None}

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
            cost = getattr(self.source, "decode_cost", None) if simulated else None
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
                if cost is not None:
                    rec.decode_seconds = cost  # the modeled machine's decode time paces partials, not the wall time
                started, decodes = time.perf_counter(), rec.decodes
                events = rec.accept(chunk)
                if simulated:
                    spent = time.perf_counter() - started if cost is None else (rec.decodes - decodes) * cost
                    self.sim_clock = max(self.sim_clock, self.processed / SAMPLE_RATE) + spent
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
        model warmed up (warm_up); an instance the app passed is taken as loaded and warm."""
        if not (isinstance(self._transcriber, type) or not hasattr(self._transcriber, "decode_window")):
            self._set_state("ready")
            return self._transcriber, 0.0
        self._set_state("loading")
        transcriber = self._transcriber()
        self._set_state("warming")
        warm = warm_up(transcriber, self.options)
        self._set_state("ready")
        return transcriber, warm

    def _limits_reached(self, rec: Recognizer) -> bool:
        now = self.processed / SAMPLE_RATE
        if self.options.max_duration is not None and now >= self.options.max_duration:
            return True
        if self.options.silence_timeout is not None and not rec.in_utterance:
            return now - rec.last_speech >= self.options.silence_timeout
        return False


# A typical utterance (s), for the warm-up's decode with left context: the LibriVox clips' sentences take 2-7 s.
TYPICAL_UTTERANCE = 3.0


def warm_up(transcriber, options: DictationOptions) -> float:
    """Pay the first-call costs of a session's decodes before it listens, and return the seconds a decode with left
    context took (it paces the first partials). Two decodes of faint noise (digital silence is not decoded at all:
    Whisper's energy gate): one as short as a first utterance, which has no left context, and one as long as a
    later utterance with its context; a transcriber with short encoder windows builds each one's sessions at its
    first run (whisper-base int8's first final in a cold window took ~0.2 s longer)."""
    longest = getattr(transcriber, "window_seconds", WINDOW_SECONDS) - 1.0
    seconds = (1.0, options.context + options.preroll + TYPICAL_UTTERANCE)
    lengths = [round(min(s, longest) * SAMPLE_RATE) for s in seconds]
    hiss = 0.003 * np.random.default_rng(0).standard_normal(max(lengths)).astype(np.float32)
    took = 0.0
    for n in lengths:
        started = time.perf_counter()
        transcriber.decode_window(hiss[:n])
        took = time.perf_counter() - started
    return took
