"""End-of-utterance settings against the dictation WER gates: for each variant, each session goes through a
Stream at fast and/or simulated pace (partials off, as the CLI off a TTY, unless a variant sets them), and per
session and pace it prints

    lost       reference words the finals drop (the deletions of a word alignment, as the joins test counts them)
    live       the finals' WER; file: the Transcriber's WER on the same audio (decoded once); live - file in points
    early      (fast pace) the finals emitted before the hangover ended (commit_quiet), of all finals (the last
               one, at the end of the audio, does not count)
    differ     each final whose words differ from what the file transcript has for the same reference words,
               with the final's raw text (where Whisper put a period at a cut shows there)

Sessions (tests/dictation_support.py): long = the 5 LibriVox clips repeated five times, joined as recorded;
short-pause = the clips once, one pause cut to 0.3 s; clauses = the clips cycled 20 times, every join cut to 0.3-0.55
s between speech (comma pauses of a real reader); flite, espeak-ng = 32 sentences with commas by 3 and 4 synthetic
voices, comma pauses 0.25-0.55 s, sentence pauses 0.5-1.4 s.

With --periods, it lists instead, for every decode of a default session (fast pace) whose text ends a sentence
(. ? !): its audio end, the quiet that really followed there (30 ms frames under -40 dBFS), the log-prob of
that last token (greedy decode steps) and the text's end: whether the period tells a sentence end from a cut at
a comma (a sentence-aware shorter hangover would need it to).

    PYTHONPATH=. python bench/dictation_hangover.py [--model whisper-tiny.en] [--paces fast,simulated]
        [--sessions long,short-pause,clauses,flite,espeak-ng] [--decode-cost 0.7] [--set vad=energy]
        [--variant "now:" --variant "short:hangover=0.4" ...] [--finals]
    PYTHONPATH=. python bench/dictation_hangover.py --periods

The variants are DictationOptions fields, parsed as bench/dictation_latency.py parses them. The load average is
printed with every line. Not a test: nothing is asserted.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.dictation_latency import load, option_value, parse_variant  # noqa: E402


def file_words_over(reference: str, text: str):
    """A function (first, last reference index) -> the words of `text` aligned to that reference span
    (insertions go with the reference word before them)."""
    from tests.dictation_support import alignment, words
    pairs, said = alignment(reference, text), words(text)

    def over(first: int, last: int) -> list[str]:
        out, inside = [], False
        for i, j in pairs:
            if i is not None:
                inside = first <= i <= last
            if inside and j is not None:
                out.append(said[j])
        return out
    return over


def differing_finals(reference: str, finals: list, file_text: str) -> list[str]:
    """One line per final whose words differ from the file transcript's words over the same reference span."""
    from tests.dictation_support import alignment, words
    live = " ".join(f.text for f in finals)
    ref_of = {j: i for i, j in alignment(reference, live) if j is not None and i is not None}
    file_over, lines, first_word = file_words_over(reference, file_text), [], 0
    for final in finals:
        own = words(final.text)
        span = [ref_of[j] for j in range(first_word, first_word + len(own)) if j in ref_of]
        first_word += len(own)
        if not span:
            lines.append(f"{final.start:7.2f}-{final.end:6.2f} live {final.text!r} | file (no reference words)")
            continue
        theirs = file_over(min(span), max(span))
        if theirs != own:
            lines.append(f"{final.start:7.2f}-{final.end:6.2f} live {final.text!r} | file {' '.join(theirs)!r}")
    return lines


def dictate(transcriber, audio, options, pace: str, decode_cost: float | None) -> list:
    from pipelines.dictation import FileSource, Final, Stream
    from tests.dictation_support import RATE
    source = FileSource(audio, RATE, pace=pace, decode_cost=decode_cost if pace == "simulated" else None)
    stream = Stream(transcriber, source, options)
    finals = [e for e in stream.start().events() if isinstance(e, Final)]
    if stream.dropped_blocks:
        print(f"    (the stream dropped {stream.dropped_blocks} blocks)")
    return finals


QUIET_DB = -40.0   # dBFS per 30 ms frame: under it, the LibriVox clips' room tone (-51..-57), not their speech


def period_logprobs(transcriber, name: str, audio, options) -> None:
    """Print each decode of a fast-paced Recognizer over `audio` whose text ends a sentence: audio end, quiet
    that followed, the log-prob of its last text token (read from the decoder steps' outputs)."""
    from pipelines.dictation import FRAME, Recognizer
    whisper = transcriber.recognizer
    run, steps = whisper.session.run, []

    def recording_run(entry, state, **inputs):
        out = run(entry, state, **inputs)
        if "token" in out and "logprob" in out:      # a fused greedy step: the argmax text token and its log-prob
            steps.append((int(out["token"][0]), float(out["logprob"][0]), float(out.get("ts_total", [-np.inf])[0])))
        return out

    class Recording:
        window_seconds = transcriber.window_seconds

        def decode_window(self, samples, *, offset=0.0, fallback=True, stop=None):
            steps.clear()
            segments = transcriber.decode_window(samples, offset=offset, fallback=fallback, stop=stop)
            text = " ".join(s.text.strip() for s in segments or [])
            # the step chose the text token where timestamps did not outweigh it (as the decoder rules)
            chosen = [lp for token, lp, ts in steps if token < whisper.tokenizer.timestamp_begin and ts <= lp]
            if text.rstrip().endswith((".", "?", "!")) and chosen:
                end = offset + len(samples) / 16000
                frame = int(end / 0.03)
                after = np.flatnonzero(loud[frame:])
                before = np.flatnonzero(loud[:frame])
                quiet = ((frame + after[0]) if len(after) else len(loud)) * 0.03 - (before[-1] + 1) * 0.03
                print(f"    {name} decode to {end:6.2f} s: quiet there {quiet:.2f} s, last token log-prob"
                      f" {chosen[-1]:6.3f}: ...{text[-40:]!r}")
            return segments

    frames = audio[:len(audio) // 480 * 480].reshape(-1, 480)
    loud = 10 * np.log10(np.mean(frames ** 2, axis=1) + 1e-12) > QUIET_DB
    whisper.session.run = recording_run
    try:
        rec = Recognizer(Recording(), options)
        for i in range(0, len(audio), 4 * FRAME):      # the fast pace's cadence
            rec.accept(audio[i:i + 4 * FRAME])
        rec.finish()
    finally:
        whisper.session.run = run


def session(name: str):
    """(audio, reference) of a session named in --sessions."""
    import tempfile

    from tests import dictation_support as support
    if name in ("flite", "espeak-ng"):
        missing = support.need(name)
        if missing:
            raise SystemExit(f"session {name} {missing}")
        with tempfile.TemporaryDirectory() as folder:
            return support.comma_session(name, Path(folder))
    makers = {"long": support.long_session, "short-pause": support.short_pause_session,
              "clauses": support.clause_session}
    if name not in makers:
        raise SystemExit(f"unknown session {name!r}: use long, short-pause, clauses, flite or espeak-ng")
    return makers[name]()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="whisper-tiny.en", help="ASR model name or folder")
    parser.add_argument("--paces", default="fast,simulated", help="comma-separated: fast, simulated")
    parser.add_argument("--sessions", default="long,short-pause",
                        help="comma-separated: long, short-pause, clauses, flite, espeak-ng (see above)")
    parser.add_argument("--decode-cost", type=float, default=None,
                        help="simulated pace: seconds charged per decode (default: its wall time)")
    parser.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE",
                        help="a DictationOptions field for every variant, e.g. --set vad=energy (repeatable)")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL:OPTION=VALUE,...",
                        help="a setting to compare, on top of --set (repeatable; none: --set alone)")
    parser.add_argument("--finals", action="store_true", help="also print every final's text")
    parser.add_argument("--periods", action="store_true",
                        help="instead: the log-prob of each sentence-ending decode's last token, with the quiet after it")
    args = parser.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(args.threads))

    from pipelines.asr import Transcriber
    from pipelines.dictation import DictationOptions
    from tests.dictation_support import deleted_words, long_session, short_pause_session, wer

    transcriber = Transcriber(args.model)
    overrides = {k: option_value(v) for k, v in (item.split("=", 1) for item in args.set)}
    variants = [parse_variant(text, overrides) for text in args.variant] or [("", overrides)]
    if args.periods:
        for name, (audio, _) in (("long", long_session()), ("short-pause", short_pause_session())):
            period_logprobs(transcriber, name, audio, DictationOptions(**{"partials": False, **overrides}))
            print(f"  [{load()}]", flush=True)
        return
    sessions = []
    for name in args.sessions.split(","):
        audio, reference = session(name)
        file_text = transcriber.transcribe(audio).text
        sessions.append((name, audio, reference, file_text, wer(reference, file_text)))
        print(f"{name}: {len(audio) / 16000:.1f} s, file WER {100 * sessions[-1][4]:.2f}  [{load()}]", flush=True)
    for label, setting in variants:
        options = DictationOptions(**{"partials": False, **setting})
        for pace in args.paces.split(","):
            for name, audio, reference, file_text, file_wer in sessions:
                finals = dictate(transcriber, audio, options, pace, args.decode_cost)
                live = " ".join(f.text for f in finals)
                lost, live_wer = deleted_words(reference, live), wer(reference, live)
                early = sum(f.latency < options.hangover - 1e-6 and f.at < len(audio) / 16000 - 1e-6 for f in finals)
                early = f", early {early}" if pace == "fast" else ""
                print(f"{label or 'defaults'} {pace} {name}: finals {len(finals)}{early}, lost {len(lost)}"
                      f"{' ' + str(lost) if lost else ''}, live WER {100 * live_wer:.2f}, file {100 * file_wer:.2f},"
                      f" live - file {100 * (live_wer - file_wer):+.2f}  [{load()}]", flush=True)
                for line in (f"{f.start:7.2f}-{f.end:6.2f} {f.text!r}" for f in finals) if args.finals else ():
                    print("    final " + line)
                for line in differing_finals(reference, finals, file_text):
                    print("    differ " + line, flush=True)


if __name__ == "__main__":
    main()
