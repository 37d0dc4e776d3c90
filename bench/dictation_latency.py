"""Dictation latency at real-time pace: the 5 LibriVox clips joined with 2 s pauses are played as a
microphone (FileSource pace="realtime"), once with partials and once without (the CLI's default off a TTY).
For each final: seconds of wall-clock audio time between the end of its utterance and its arrival.

    PYTHONPATH=. python bench/dictation_latency.py [--threads 2]

Also prints the same session on the simulated real-time clock (fast, each decode charged its wall time).
Not a test: numbers are printed, nothing is asserted.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(args.threads))

    from pipelines.asr import Transcriber
    from pipelines.dictation import DictationOptions, FileSource, Stream
    from tests.dictation_support import RATE, librivox_session, wer

    audio, reference, _ = librivox_session()
    transcriber = Transcriber("whisper-tiny.en")
    for pace in ("realtime", "simulated"):
        for partials in (True, False):
            stream = Stream(transcriber, FileSource(audio, RATE, pace=pace), DictationOptions(partials=partials))
            events = list(stream.start().events())
            finals = stream.finals
            latency = np.array([f.latency for f in finals])
            n_partials = sum(e.type == "partial" for e in events)
            print(f"{pace:9s} partials={'on ' if partials else 'off'}: finals {len(finals)}, partials {n_partials},"
                  f" decodes {stream.report()['decodes']}, WER {wer(reference, ' '.join(f.text for f in finals)):.3f};"
                  f" latency s min {latency.min():.2f} median {np.median(latency):.2f} max {latency.max():.2f}"
                  f" all {np.round(latency, 2).tolist()}", flush=True)


if __name__ == "__main__":
    main()
