"""Draft verification (pipelines/whisper_drafts.py): what a draft pass costs and what it saves, and that it changes
no token. Per model: Transcriber startup with and without the draft entries; ms per decode_greedy step vs the
decode_32 / decode_64 passes (20 s and full window); then dictation sessions on a simulated clock with a fixed cost
per decode (so both settings decode the same audio at the same moments) with verify_drafts on and off: decoder
steps + draft passes, and how many decodes' token sequences differ (must be 0). The load average is printed with
every line. Not a test: nothing is asserted.

    PYTHONPATH=. python bench/whisper_drafts.py [--model whisper-tiny.en] [--files session,long,short-pause]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.dictation_latency import load  # noqa: E402


def startup(model: str, runs: int = 4) -> None:
    from pipelines.asr import Transcriber, TranscribeOptions
    times = {False: [], True: []}
    for _ in range(runs):
        for verify in times:
            started = time.perf_counter()
            with Transcriber(model, device="cpu", options=TranscribeOptions(verify_drafts=verify)) as t:
                times[verify].append(time.perf_counter() - started)
                entries = len(t.recognizer.session.program.entries)
            print(f"startup verify_drafts={verify}: {times[verify][-1]:.2f} s, {entries} entries  [{load()}]",
                  flush=True)
    for verify, t in times.items():
        print(f"startup verify_drafts={verify}: fastest {min(t):.2f} s, median {np.median(t):.2f} s")


def entry_ms(recognizer) -> None:
    tb, vocab = recognizer.tokenizer.timestamp_begin, recognizer.cfg.vocab_size
    for window in (w for w in recognizer.windows if w.frames == 2000 or w.full):
        mel = np.zeros((1, recognizer.cfg.num_mel_bins, window.frames), np.float32)
        recognizer.session.run(window.entry("encode"), recognizer.state, mel=mel)
        runs = {"decode_greedy": dict(tokens=np.zeros((1, 1), np.int32), pos=10, first=0, lo1=0, hi1=tb, lo2=tb,
                                      hi2=vocab),
                **{f"decode_{n}": dict(tokens=np.zeros((1, n), np.int32), pos=0) for n in (32, 64)}}
        for name, inputs in runs.items():
            took = []
            for _ in range(20):
                started = time.perf_counter()
                recognizer.session.run(window.entry(name), recognizer.state, **inputs)
                took.append(1000 * (time.perf_counter() - started))
            print(f"{window.entry(name)}: fastest {min(took):.1f} ms, median {np.median(took):.1f} ms  [{load()}]",
                  flush=True)


def sessions(transcriber, files: list[str]) -> None:
    from pipelines.dictation import DictationOptions, FileSource, Final, Stream
    from tests.dictation_support import RATE, librivox_session, long_session, short_pause_session
    audio = {"session": lambda: librivox_session()[0], "long": lambda: long_session()[0],
             "short-pause": lambda: short_pause_session()[0]}
    recognizer = transcriber.recognizer
    base, decode_window, run = recognizer.options, recognizer.decode_window, recognizer.session.run
    decodes, entries = [], []

    def logged(samples, **kwargs):
        out = decode_window(samples, **kwargs)
        decodes.append((bool(kwargs.get("draft")), list(recognizer.last_tokens)))
        return out

    def counted(entry, state=None, **inputs):
        entries.append(entry)
        return run(entry, state, **inputs)
    recognizer.decode_window, recognizer.session.run = logged, counted
    for name in files:
        samples = audio[name]()
        for partials in (True, False):
            runs = {}
            for verify in (True, False):
                recognizer.options = replace(base, verify_drafts=verify)
                decodes.clear()
                entries.clear()
                source = FileSource(samples, RATE, pace="simulated", decode_cost=0.45)
                events = list(Stream(transcriber, source, DictationOptions(partials=partials)).start().events())
                steps = sum(e.startswith(("decode_step", "decode_greedy")) for e in entries)
                passes = sum(e.startswith("decode_") and not e.startswith(("decode_step", "decode_greedy"))
                             for e in entries)
                runs[verify] = (list(decodes), [e.text for e in events if isinstance(e, Final)], steps, passes)
            (on, finals_on, steps_on, passes_on), (off, finals_off, steps_off, _) = runs[True], runs[False]
            differ = sum(a[1] != b[1] for a, b in zip(on, off)) + abs(len(on) - len(off))
            drafted = sum(d for d, _ in on)
            print(f"{name} partials={'on ' if partials else 'off'}: decodes {len(on)} (with a draft {drafted}),"
                  f" token sequences that differ {differ}, finals equal {finals_on == finals_off}; decoder steps"
                  f" {steps_on} + {passes_on} draft passes vs {steps_off} without drafts  [{load()}]", flush=True)
    recognizer.options = base


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="whisper-tiny.en")
    parser.add_argument("--files", default="session,long,short-pause",
                        help="comma-separated: session (the LibriVox clips with 2 s pauses), long (the clips five"
                             " times as recorded), short-pause (one pause cut to 0.3 s)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(args.threads))
    from pipelines.asr import Transcriber
    print(f"{args.model}  [{load()}]", flush=True)
    startup(args.model)
    transcriber = Transcriber(args.model, device="cpu")
    entry_ms(transcriber.recognizer)
    sessions(transcriber, [f for f in args.files.split(",") if f])


if __name__ == "__main__":
    main()
