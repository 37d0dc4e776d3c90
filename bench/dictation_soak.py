"""Dictation soak: 20 minutes of simulated microphone audio through a live Stream (fast mode), whisper-tiny.en.

    PYTHONPATH=. python bench/dictation_soak.py [--minutes 20] [--threads 2]

The audio repeats the 5 LibriVox clips (2 s pauses) followed by 10 s of noise at a random level and 5 s of
silence. Reports resident memory (RSS) after warm-up and as the session progresses (a leak shows as growth
between the quarter marks), the dropped-block counter, decodes, finals and WER against the clips' text.
Not a test: numbers are printed, nothing is asserted.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def soak_audio(minutes: float, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    from tests.dictation_support import RATE, librivox_session

    session, reference, _ = librivox_session()
    rng = np.random.default_rng(seed)
    parts, refs, total = [], [], 0
    while total < minutes * 60 * RATE:
        noise = (rng.uniform(0.002, 0.05) * rng.standard_normal(10 * RATE)).astype(np.float32)
        for part in (session, noise, np.zeros(5 * RATE, np.float32)):
            parts.append(part)
            total += len(part)
        refs.append(reference)
    return np.concatenate(parts), refs   # whole passes: at least `minutes`


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(args.threads))

    from pipelines.asr import Transcriber
    from pipelines.dictation import FileSource, Stream
    from tests.dictation_support import RATE, wer

    audio, refs = soak_audio(args.minutes)
    print(f"soak: {len(audio) / RATE / 60:.1f} min of audio ({len(refs)} passes of the LibriVox session + noise + silence)")
    transcriber = Transcriber("whisper-tiny.en")
    marks, samples = {}, []
    stream = Stream(transcriber, FileSource(audio, RATE, pace="fast"))
    done = threading.Event()

    def watch():
        while not done.wait(1.0):
            progress = stream.processed / len(audio)
            samples.append((progress, rss_mb()))

    started = time.perf_counter()
    stream.start()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    for event in stream.events():
        if event.type == "state" and event.state == "listening":
            marks["listening"] = rss_mb()
    done.set()
    watcher.join()
    wall = time.perf_counter() - started
    report = stream.report()

    def at(fraction):
        return next((mb for p, mb in samples if p >= fraction), samples[-1][1] if samples else float("nan"))

    quarter = {f: at(f) for f in (0.25, 0.5, 0.75, 1.0)}
    text = " ".join(f.text for f in stream.finals)
    print(f"wall {wall:.0f} s for {len(audio) / RATE:.0f} s of audio ({len(audio) / RATE / wall:.2f}x real time)")
    print(f"finals {report['finals']}, decodes {report['decodes']}, dropped blocks {report['dropped_blocks']}"
          f" ({report['dropped_s']} s), processed {report['processed_s']} s of {report['captured_s']} s captured")
    print(f"RSS MB: after warm-up {marks.get('listening', float('nan')):.1f}; at 25/50/75/100%: "
          + " / ".join(f"{mb:.1f}" for mb in quarter.values())
          + f"; peak {max(mb for _, mb in samples):.1f}; growth 25%->100% {quarter[1.0] - quarter[0.25]:+.1f}")
    print(f"WER of the finals against the clips' text: {wer(' '.join(refs), text):.3f}")


if __name__ == "__main__":
    main()
