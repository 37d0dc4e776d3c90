"""Dictation latency: the 5 LibriVox clips joined with 2 s pauses are played as a microphone, once with
partials and once without (the CLI's default off a TTY). For each final: seconds of audio time between the
end of its utterance's words (as its VAD heard it; "after the words' end" counts from the last loud sample
of the clip instead, which compares VADs) and its arrival, and where they went:

    quiet    audio after the last words that the final's decode waited for (the hangover, or early_final
             when the decode started before the hangover confirmed the end; negative: a click came after)
    queue    from that audio's arrival to the decode's start
    behind   (not a term of the sum) how long after the words ended an earlier decode (a partial that
             missed the end) kept the worker busy: it delays the final's decode and is part of quiet + queue
    encoder  the encoder pass(es); decoder: the decoder steps and draft passes (and their counts: a live decode
             verifies the previous decode's tokens in one pass, TranscribeOptions.verify_drafts); other: mel,
             guards, host work
    window   the encoder window(s) the final's decode ran (whisper.ENCODER_WINDOWS: e.g. encode_t1000 = 10 s;
             more than one when a short window's decode looked like a repeat loop and fell back)
    confirm  from the decode's end to the final's emission (an early decode waits for the hangover)

    PYTHONPATH=. python bench/dictation_latency.py [--model whisper-base] [--paces realtime,modeled,simulated] [--runs N]
        [--session librivox|short-pause]
        [--partials both|on|off] [--set early_final=0.3 --set vad=energy ...] [--shortest-window 30] [--step-s 0.018] [--decodes]
        [--block-s 0.1] [--variant "short:hangover=0.4,context=2" --variant "floor20:shortest_window=20" ...]
        [--variant "drafts:" --variant "steps:verify_drafts=false"]
        [--precision int8] [--encoder-s encode=0.23,encode_t2000=0.14 ...]

Variants run in the same process, interleaved per pace, on one calibration: the way to compare settings (the
keys are DictationOptions fields, and `shortest_window` and `verify_drafts`, the recognizer's TranscribeOptions
fields).

Paces: realtime = a FileSource at real-time pace in a Microphone's 50 ms blocks (--block-s), wall clock (what a user
sees, noisy on a shared machine);
modeled = the same cadence on a virtual clock that charges every decode a fixed cost per encoder pass (per
window) and decoder step (the fastest measured at start, or --encoder-s / --step-s), so variants compare
without the noise of other programs; simulated = the Stream's own simulated pace (each decode charged its wall time; summary only).
The load average is printed with every line. Not a test: nothing is asserted.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@dataclass
class Decode:
    audio_end: float       # audio time of the last sample decoded
    start: float           # stream clock (audio time) when the decode began ...
    end: float = 0.0       # ... and ended
    encoder: float = 0.0   # wall seconds
    decoder: float = 0.0
    steps: int = 0         # decoder steps (decode_step, decode_greedy) ...
    passes: list = field(default_factory=list)   # ... and the draft passes run (decode_{n} entries)
    passes_s: float = 0.0  # wall seconds of the draft passes (part of decoder)
    encodes: int = 0
    windows: list = field(default_factory=list)  # the encode entries run, in order
    wall: float = 0.0


@dataclass
class TimedTranscriber:
    """The Transcriber as the Stream sees it, recording every decode_window() call on the stream's clock and
    timing the session entries it runs (encode vs decoder steps)."""
    transcriber: object
    clock: object = None
    decodes: list = field(default_factory=list)    # of the current session
    history: list = field(default_factory=list)    # of all sessions (wall times), for calibrate()

    def __post_init__(self):
        session = self.transcriber.recognizer.session
        run = session.run

        def timed_run(entry, state, **inputs):
            started = time.perf_counter()
            out = run(entry, state, **inputs)
            took = time.perf_counter() - started
            if self.decodes:
                d = self.decodes[-1]
                if entry.startswith("encode"):
                    d.encoder += took
                    d.encodes += 1
                    d.windows.append(entry)
                elif is_draft_pass(entry):
                    d.decoder += took
                    d.passes_s += took
                    d.passes.append(entry)
                elif entry.startswith("decode"):
                    d.decoder += took
                    d.steps += 1
            return out

        session.run = timed_run

    @property
    def window_seconds(self) -> float:
        return self.transcriber.window_seconds

    @property
    def last_tokens(self):
        return self.transcriber.last_tokens

    @property
    def last_word_logprobs(self):
        return self.transcriber.last_word_logprobs

    def decode_window(self, samples, *, offset=0.0, fallback=True, stop=None, draft=(), prefix=()):
        d = Decode(audio_end=offset + len(samples) / 16000, start=self.clock())
        self.decodes.append(d)
        self.history.append(d)
        started = time.perf_counter()
        try:
            return self.transcriber.decode_window(samples, offset=offset, fallback=fallback, stop=stop, draft=draft,
                                                  prefix=prefix)
        finally:
            d.wall, d.end = time.perf_counter() - started, self.clock()


TRANSCRIBE_FIELDS = ("shortest_window", "verify_drafts")  # variant keys that are TranscribeOptions fields


def is_draft_pass(entry: str) -> bool:
    """decode_32, decode_64_t2000, ...: a draft verification pass (sdk/models/whisper.py DRAFT_PASSES)."""
    return re.fullmatch(r"decode_\d+(_t\d+)?", entry) is not None


def breakdown(final, decodes: list[Decode], hangover: float) -> dict:
    """Split one final's latency into quiet + queue + encoder + decoder + other + confirm (audio seconds)."""
    # the last decode before the final that reached about its end (clicks after the words move the end of
    # the hangover later, and a decode that started before such a click may have served as the final)
    used = [d for d in decodes if d.end <= final.at + 1e-3 and final.end - 0.3 <= d.audio_end <= final.end + hangover + 0.5]
    if not used:
        return {}
    d = used[-1]
    before = [p for p in decodes if p.start < d.start]
    behind = max(0.0, min(d.start, before[-1].end) - max(final.end, before[-1].start)) if before else 0.0
    return {"quiet": d.audio_end - final.end, "queue": d.start - d.audio_end, "behind": behind,
            "encoder": d.encoder, "decoder": d.decoder, "steps": d.steps, "passes": len(d.passes),
            "other": d.wall - d.encoder - d.decoder, "confirm": final.at - d.end, "window": "+".join(d.windows)}


def modeled_session(timed: TimedTranscriber, audio: np.ndarray, options, encoder_s: dict, step_s: float,
                    block_s: float):
    """The session on a virtual clock that charges each decode `encoder_s[entry]` per encoder pass (and per draft
    pass) plus `step_s` per decoder step, whatever it really took: this machine idle, independent of the load from
    other programs.
    The audio cadence is the Stream's "simulated" pace (each chunk = what a microphone delivered meanwhile, at
    least one `block_s` block)."""
    from pipelines.dictation import SAMPLE_RATE, Recognizer
    clock = [0.0]
    timed.clock, timed.decodes = (lambda: clock[0]), []
    rec = Recognizer(timed, options)
    events, fed, modeled = [], 0, None
    while fed < len(audio):
        due = min(len(audio), max(int(clock[0] * SAMPLE_RATE), fed + round(block_s * SAMPLE_RATE)))
        before = len(timed.decodes)
        new = rec.accept(audio[fed:due])
        fed = due
        clock[0] = max(clock[0], fed / SAMPLE_RATE)
        for d in timed.decodes[before:]:          # decodes of one accept() run back to back
            d.start, d.encoder = clock[0], sum(encoder_s[w] for w in d.windows)
            d.decoder = step_s * d.steps + sum(encoder_s[p] for p in d.passes)
            d.wall = d.encoder + d.decoder
            clock[0] = d.end = d.start + d.wall
            modeled = d.wall if modeled is None else 0.8 * modeled + 0.2 * d.wall
            rec.decode_seconds = modeled          # the Recognizer's average, which paces partials
        events += [replace(e, at=clock[0]) for e in new]
    events += [replace(e, at=clock[0]) for e in rec.finish()]
    return events, rec.decodes


def words_end(final, word_ends: list[float]) -> float:
    """Where the words of the clip the final ends in really end (the last sample above 0.05): a final's own
    `end` is where its VAD heard them end, so latency after it does not compare VADs."""
    return min(word_ends, key=lambda end: abs(end - final.end))


def speech_ends(audio: np.ndarray, rate: int, gap: float = 0.25) -> list[float]:
    """Where speech (samples above 0.05) stops for at least `gap` s, and its very end: the words' ends of a
    session without clip spans (the short-pause file's 0.3 s pause is one)."""
    loud = np.flatnonzero(np.abs(audio) > 0.05)
    breaks = np.flatnonzero(np.diff(loud) > gap * rate)
    return [(loud[i] + 1) / rate for i in breaks] + [(loud[-1] + 1) / rate]


def load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def option_value(text: str):
    """A --set value: true, false, none, a number, or else the text itself (--set vad=energy)."""
    words = {"true": True, "false": False, "none": None}
    if text.lower() in words:
        return words[text.lower()]
    try:
        return float(text)
    except ValueError:
        return text


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="whisper-tiny.en", help="ASR model name or folder, e.g. whisper-base")
    parser.add_argument("--paces", default="realtime,modeled,simulated",
                        help="comma-separated: realtime (wall clock), modeled (idle-machine cost model), simulated")
    parser.add_argument("--runs", type=int, default=1, help="real-time sessions per setting")
    parser.add_argument("--session", choices=("librivox", "short-pause"), default="librivox",
                        help="the clips 2 s apart, or tests' short-pause file (one pause of 0.3 s between speech)")
    parser.add_argument("--partials", choices=("both", "on", "off"), default="both")
    parser.add_argument("--step-s", type=float, default=None,
                        help="modeled seconds per decoder step (default: the fastest measured at start)")
    parser.add_argument("--encoder-s", default="", metavar="ENTRY=SECONDS,...",
                        help="modeled seconds per pass of these encoder entries (e.g. costs measured on an idle"
                             " machine: encode=0.23,encode_t2000=0.14); the others are calibrated")
    parser.add_argument("--shortest-window", type=float, default=None, metavar="SECONDS",
                        help="TranscribeOptions.shortest_window (default: the model's own; 30 = always the full window)")
    parser.add_argument("--precision", choices=("fp32", "int8"), default="fp32",
                        help="TranscribeOptions.precision (cpu backend; int8 = whisper.INT8_ENTRIES with int8 weights)")
    parser.add_argument("--block-s", type=float, default=0.05,
                        help="the audio arrives in blocks this long: a Microphone's (its PortAudio callback every 50 ms);"
                             " FileSource's own default is 0.1 s")
    parser.add_argument("--decodes", action="store_true", help="also list every decode (audio end, start, end)")
    parser.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE",
                        help="a DictationOptions field, e.g. --set early_final=0.3 (repeatable)")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL:OPTION=VALUE,...",
                        help="a setting to compare, on top of --set (repeatable; none: --set alone)")
    args = parser.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(args.threads))

    from pipelines.asr import Transcriber, TranscribeOptions
    from pipelines.dictation import DictationOptions, FileSource, Stream
    from pipelines.dictation.stream import warm_up
    from tests.dictation_support import RATE, librivox_session, short_pause_session, wer

    if args.session == "librivox":
        audio, reference, spans = librivox_session()
        word_ends = [start + (np.flatnonzero(np.abs(audio[int(start * RATE):int(end * RATE)]) > 0.05)[-1] + 1) / RATE
                     for start, end in spans]
    else:
        audio, reference = short_pause_session()
        word_ends = speech_ends(audio, RATE)
    timed = TimedTranscriber(Transcriber(args.model, options=TranscribeOptions(shortest_window=args.shortest_window,
                                                                         precision=args.precision)))
    warm_up(timed.transcriber, DictationOptions())  # as a Stream that loads its model warms it (the sessions' first runs)
    encoder_s = None
    overrides = {k: option_value(v) for k, v in (item.split("=", 1) for item in args.set)}
    variants = [parse_variant(text, overrides) for text in args.variant] or [("", overrides)]
    recognizer_options = timed.transcriber.recognizer.options
    settings = {"both": (True, False), "on": (True,), "off": (False,)}[args.partials]
    paces = [p for p in args.paces.split(",") for _ in range(args.runs if p == "realtime" else 1)]
    from pipelines.dictation.voice_activity import open_vad, vad_name
    chosen = DictationOptions(**{k: v for k, v in overrides.items() if k not in TRANSCRIBE_FIELDS})
    print(f"{load()}; session {args.session}; options {overrides or 'defaults'}; vad {vad_name(open_vad(chosen) if chosen.vad else None)};"
          f" shortest encoder window {args.shortest_window or 'the model default'}; precision {args.precision}", flush=True)
    for pace, partials, (name, setting) in [(p, on, v) for p in sorted(paces, key=lambda p: p == "modeled")
                                           for on in settings for v in variants]:  # calibrate on the others too
        timed.transcriber.recognizer.options = replace(recognizer_options, **{
            "shortest_window": args.shortest_window, **{k: v for k, v in setting.items() if k in TRANSCRIBE_FIELDS}})
        options = DictationOptions(**{"partials": partials,
                                      **{k: v for k, v in setting.items() if k not in TRANSCRIBE_FIELDS}})
        if pace == "modeled":
            if encoder_s is None:
                encoder_s, step = calibrate(timed, audio)
                encoder_s |= {k: float(v) for k, v in (i.split("=", 1) for i in args.encoder_s.split(",") if i)}
                args.step_s = step if args.step_s is None else args.step_s
            step_s = args.step_s
            events, decodes = modeled_session(timed, audio, options, encoder_s, step_s, args.block_s)
            stopped = 0   # a modeled session has no audio ahead to watch
            label = (f"modeled (passes {', '.join(f'{k} {v:.2f} s' for k, v in sorted(encoder_s.items()))}"
                     f" + {1000 * step_s:.0f} ms/step)")
        else:
            stream = Stream(timed, FileSource(audio, RATE, pace=pace, block_seconds=args.block_s), options)
            timed.clock, timed.decodes = (lambda s=stream, p=pace: s._clock(p)), []
            events = list(stream.start().events())
            decodes, label = stream.report()["decodes"], pace
            stopped = stream.recognizer.stopped_decodes
        finals = [e for e in events if e.type == "final"]
        latency = np.array([f.latency for f in finals])
        after_words = np.array([f.at - words_end(f, word_ends) for f in finals])
        n_partials = sum(e.type == "partial" for e in events)
        print(f"{name + ': ' if name else ''}{label} partials={'on ' if partials else 'off'}: finals {len(finals)},"
              f" partials {n_partials},"
              f" decodes {decodes} (given up {stopped}), WER {wer(reference, ' '.join(f.text for f in finals)):.3f};"
              f" latency s min {latency.min():.2f} median {np.median(latency):.2f} max {latency.max():.2f}"
              f" all {np.round(latency, 2).tolist()}; over 2.5 s: {int(np.sum(latency > 2.5))}; after the words'"
              f" end: median {np.median(after_words):.2f} max {after_words.max():.2f}  [{load()}]", flush=True)
        if pace == "simulated":
            continue   # the simulated clock does not advance during a decode: no breakdown
        if args.decodes:
            print("    decodes (audio end -> start..end): " + ", ".join(
                f"{d.audio_end:.2f}->{d.start:.2f}..{d.end:.2f}" for d in timed.decodes))
        for i, final in enumerate(finals):
            parts = breakdown(final, timed.decodes, options.hangover)
            print(f"    final {i}: {final.latency:.2f} s = " + " + ".join(
                f"{k} {v:.2f}" for k, v in parts.items() if k not in ("behind", "steps", "passes", "window"))
                + f"  (behind a running decode {parts.get('behind', 0):.2f}, {parts.get('steps', 0)} decoder steps"
                  f" + {parts.get('passes', 0)} draft passes,"
                  f" window {parts.get('window', '-')})",
                flush=True)


def parse_variant(text: str, base: dict) -> tuple[str, dict]:
    """"label:key=value,key=value" -> (label, base with those overrides)."""
    label, _, settings = text.partition(":")
    pairs = [item.split("=", 1) for item in settings.split(",") if item.strip()]
    if any(len(pair) != 2 for pair in pairs):
        raise SystemExit(f"--variant {text!r}: expected LABEL:OPTION=VALUE,...")
    return label, {**base, **{k.strip(): option_value(v.strip()) for k, v in pairs}}


def calibrate(timed: TimedTranscriber, audio: np.ndarray) -> tuple[dict, float]:
    """The fastest of three passes of each encoder window and of ten of each draft pass entry, and the fastest
    decoder step (per decode) of five more decodes and all so far: the idle machine, as near as a shared one can
    tell (other programs only ever make them slower)."""
    from pipelines.audio import whisper_log_mel
    recognizer = timed.transcriber.recognizer
    timed.clock, timed.decodes, encoder = (lambda: 0.0), [], {}
    for window in recognizer.windows:
        mel = whisper_log_mel(audio[:8 * 16000], recognizer.cfg.num_mel_bins, n_samples=window.frames * 160)[None]
        for _ in range(3):
            started = time.perf_counter()
            recognizer.session.run(window.entry("encode"), recognizer.state, mel=mel)
            took = time.perf_counter() - started
            encoder[window.entry("encode")] = min(encoder.get(window.entry("encode"), took), took)
    for entry in filter(is_draft_pass, recognizer.session.program.entries):
        n = int(entry.split("_")[1])
        for _ in range(10):  # a pass is short: the fastest of more runs is nearer the idle machine
            started = time.perf_counter()
            recognizer.session.run(entry, recognizer.state, tokens=np.zeros((1, n), np.int32), pos=0)
            took = time.perf_counter() - started
            encoder[entry] = min(encoder.get(entry, took), took)
    for _ in range(5):
        timed.decode_window(audio[:8 * 16000])
    return encoder, min((d.decoder - d.passes_s) / d.steps for d in timed.history if d.steps)


if __name__ == "__main__":
    main()
