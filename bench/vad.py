"""Voice activity: our energy + voicing VAD against silero-vad (pipelines/dictation/silero_vad.py: its ONNX model
on ONNX Runtime, as dictation runs it) as utterance detectors, on speech, speech in noise, synthetic music and
silence.

    PYTHONPATH=. python bench/vad.py

Both detectors feed the same utterance rules (onset 0.09 s of active frames, hangover 0.6 s, min_voiced s of
voiced frames, as the Recognizer decodes only those), from the same 30 ms frames. Per material:
    false   utterances that overlap no clip (widened by 0.3 s): each costs a decode, and on Whisper a chance
            of hallucinated text
    missed  clips no utterance overlaps
    clipped clips whose first word starts before utterance onset - preroll (DictationOptions'): the first word is cut
    delay   median onset delay after the first word's start (s)
    tail    median of (the utterance's last active frame - the last word's end) (s): the end of speech is
            confirmed `hangover` s after that frame, and the final's decode starts `early_final` s after it;
            negative: the detector went quiet before the last word had ended
Then the cost: CPU seconds (process time) each detector spends per second of audio, on the speech material in
the Recognizer's 0.12 s blocks, the two detectors interleaved over several rounds, medians.
Not a test: nothing is asserted. The load average is printed.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RATE = 16000


def silero_frames(audio: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """What the Recognizer sees from pipelines/dictation/silero_vad.py (silero's ONNX model on ONNX Runtime):
    (active with hysteresis, voiced = probability >= threshold) per 30 ms frame."""
    from pipelines.dictation import FRAME, DictationOptions, SileroVad
    n = len(audio) // FRAME
    active, voiced = SileroVad(DictationOptions())(audio[:n * FRAME].reshape(n, FRAME))
    return active, voiced, FRAME / RATE


def energy_frames(audio: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    from pipelines.dictation import FRAME, DictationOptions, Vad
    n = len(audio) // FRAME
    loud, voiced = Vad(DictationOptions())(audio[:n * FRAME].reshape(n, FRAME))
    return loud, voiced, FRAME / RATE


def utterances(active: np.ndarray, voiced: np.ndarray, step: float, *, onset=0.09, hangover=0.6, min_voiced=0.09):
    """[(start s, end s)] from per-frame decisions, with the Recognizer's onset / hangover / min_voiced rules."""
    out, run, start, quiet, voice = [], 0, None, 0, 0
    for i, (a, v) in enumerate(zip(active, voiced)):
        if start is None:
            run = run + 1 if a else 0
            if run * step >= onset - 1e-9:
                start, quiet, voice = (i + 1 - run) * step, 0, int(np.sum(voiced[i + 1 - run:i + 1]))
            continue
        voice += int(v)
        quiet = 0 if a else quiet + 1
        if quiet * step >= hangover - 1e-9:
            if voice * step >= min_voiced - 1e-9:
                out.append((start, (i + 1 - quiet) * step))
            start, run = None, 0
    if start is not None and voice * step >= min_voiced - 1e-9:
        out.append((start, len(active) * step))
    return out


def materials():
    """{name: (audio, [(first word s, last word's end s)] or [])}."""
    import soundfile
    from tests.dictation_support import librivox_clips
    rng = np.random.default_rng(0)
    parts, spans, t = [np.zeros(RATE, np.float32)], [], 1.0
    for wav, _ in librivox_clips():
        clip, _ = soundfile.read(str(wav), dtype="float32")
        loud = np.flatnonzero(np.abs(clip) > 0.05)
        spans.append((t + loud[0] / RATE, t + (loud[-1] + 1) / RATE))
        parts += [clip, np.zeros(2 * RATE, np.float32)]
        t += len(clip) / RATE + 2
    speech = np.concatenate(parts)
    rms = np.sqrt(np.mean(speech[np.abs(speech) > 0.02] ** 2))
    white = rng.standard_normal(len(speech)).astype(np.float32)
    brown = np.cumsum(rng.standard_normal(len(speech)))
    brown -= np.convolve(brown, np.ones(801) / 801, "same")
    out = {"speech": (speech, spans)}
    for name, noise in (("speech+white 10dB", white), ("speech+brown 10dB", brown.astype(np.float32))):
        noise = noise / np.sqrt(np.mean(noise ** 2)) * rms / 10 ** 0.5
        out[name] = ((speech + noise).astype(np.float32), spans)
    # synthetic music: 0.5 s chords of three harmonic notes with decaying envelopes, over a click track
    n, chords = 30 * RATE, []
    tt = np.arange(RATE // 2) / RATE
    for k in range(60):
        notes = 110 * 2 ** (rng.integers(0, 24, 3) / 12)
        tone = sum(np.sin(2 * np.pi * f * h * tt) / h for f in notes for h in (1, 2, 3))
        chords.append(0.1 * tone * np.exp(-3 * tt))
    music = np.concatenate(chords)[:n]
    music[::RATE // 4] += 0.5
    out["music (synthetic)"] = (music.astype(np.float32), [])
    hiss = np.r_[np.zeros(10 * RATE), 0.0005 * rng.standard_normal(20 * RATE)]
    out["silence + faint hiss"] = (hiss.astype(np.float32), [])
    return out


def score(found, spans, preroll: float):
    false = sum(all(s > e + 0.3 or end < a - 0.3 for a, e in spans) for s, end in found)
    missed = clipped = 0
    delays, tails = [], []
    for first, end in spans:
        hit = [(s, e) for s, e in found if s < end and e > first]
        if not hit:
            missed += 1
            continue
        delays.append(hit[0][0] - first)
        tails.append(hit[-1][1] - end)
        clipped += hit[0][0] - preroll > first + 0.02
    median = (lambda x: float(np.median(x)) if x else float("nan"))
    return false, missed, clipped, median(delays), median(tails)


def cpu_per_audio_second(make_vad, audio: np.ndarray, block: int = 1920) -> float:
    """CPU seconds one detector spends per second of `audio`, fed in `block`-sample pieces (FileSource's)."""
    from pipelines.dictation import FRAME
    vad, pieces = make_vad(), audio[:len(audio) // block * block].reshape(-1, block // FRAME, FRAME)
    started = time.process_time()
    for piece in pieces:
        vad(piece)
    return (time.process_time() - started) / (len(audio) / RATE)


def main():
    from pipelines.dictation import DictationOptions
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"{'material':22} {'detector':8} {'utts':>5} {'false':>5} {'missed':>6} {'clipped':>7} {'delay s':>8} {'tail s':>7}")
    for name, (audio, spans) in materials().items():
        for detector, frames in (("energy", energy_frames), ("silero", silero_frames)):
            found = utterances(*frames(audio))
            false, missed, clipped, delay, tail = score(found, spans, DictationOptions().preroll)
            print(f"{name:22} {detector:8} {len(found):5d} {false:5d} {missed:6d} {clipped:7d} {delay:8.3f} {tail:7.3f}")
    from pipelines.dictation import SileroVad, Vad
    speech = materials()["speech"][0]
    speech = speech[:len(speech) // 1920 * 1920]
    costs = {"energy": [], "silero": []}
    for _ in range(5):
        for detector, make in (("energy", lambda: Vad(DictationOptions())), ("silero", lambda: SileroVad(DictationOptions()))):
            costs[detector].append(cpu_per_audio_second(make, speech))
    print(f"cost over {len(speech) / RATE:.1f} s of speech, 5 interleaved rounds, median CPU ms per s of audio:",
          ", ".join(f"{d} {1000 * np.median(c):.2f}" for d, c in costs.items()),
          f"(silero/energy {np.median(costs['silero']) / np.median(costs['energy']):.1f}x);"
          f" load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
