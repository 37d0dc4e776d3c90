"""Whisper file transcription, two choices each judged by accuracy and time: the shortest encoder window a model
may use (pipelines.whisper_asr.SHORTEST_WINDOW) and which entries --precision int8 quantizes
(sdk.models.whisper.INT8_ENTRIES). 2 threads, one process.

    python bench/whisper_windows.py [MODEL] [floors] [int8]     # default: whisper-tiny.en, both sections
floors: per floor (30 = the full window only), file WER with timestamps (the default) on each set of speech: the
5 LibriVox clips (bench/whisper.py's), Harvard sentences by flite's slt voice (tests/dictation_support.gate_speech),
the long file of tests/test_transcribe.py (the clips twice with 4 s pauses; also how far its last segment ends
from the last speech) and the long session of the dictation tests (the clips five times as recorded, 124 s); the
windows the decodes kept; then the time of transcribing the 5 clips, every floor interleaved.
int8: the same for each set of int8 entries (none, encoder, decoder, all) at the model's own floor.
Needs Debian's pocketsphinx-testdata and flite.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from harness import SCRATCH, compare, print_table, threads

threads(2)

import numpy as np  # noqa: E402

from pipelines.asr import Transcriber, TranscribeOptions  # noqa: E402
from pipelines.audio import load_audio  # noqa: E402
from sdk.models import whisper  # noqa: E402
from tests import dictation_support as support  # noqa: E402

FLOORS = (30.0, 20.0, 15.0, 10.0, 5.0)
INT8 = {"none": (), "encoder": ("encode",), "decoder": whisper.INT8_ENTRIES, "all": ("encode", *whisper.INT8_ENTRIES)}
PAUSE = 4.0  # s between the clips of the long file, as in tests/test_transcribe.py


def open_transcriber(model: str, floor: float | None = None, int8: tuple[str, ...] = ()) -> Transcriber:
    whisper.INT8_ENTRIES = int8  # the recognizer reads it when it is made: the entries --precision int8 quantizes
    return Transcriber(model, device="cpu", options=TranscribeOptions(
        language="en", shortest_window=floor, precision="int8" if int8 else "fp32"))


def long_file() -> tuple[np.ndarray, str, float]:
    """The clips twice with pauses: (audio, reference, where the last speech ends in s)."""
    pause = np.zeros(int(PAUSE * 16000), np.float32)
    clips = support.librivox_clips()
    pieces = [x for _ in range(2) for wav, _ in clips for x in (load_audio(wav), pause)]
    reference = " ".join(ref for _ in range(2) for _, ref in clips)
    return np.concatenate(pieces), reference, (sum(map(len, pieces)) - len(pause)) / 16000


def accuracy(t: Transcriber, gate: list[tuple[Path, str]], long: tuple[np.ndarray, str, float]) -> str:
    texts, kept = [], []
    for wav, _ in gate:
        texts.append(t.transcribe(wav).text)
        kept.append(round(t.recognizer.last_window.frames / 100))  # 10 ms mel frames -> s
    n_clips = len(support.librivox_clips())
    clips = support.wer(" ".join(ref for _, ref in gate[:n_clips]), " ".join(texts[:n_clips]))
    flite = support.wer(" ".join(ref for _, ref in gate[n_clips:]), " ".join(texts[n_clips:]))
    audio, reference, speech_end = long
    result = t.transcribe(audio)
    session_audio, session_reference = support.long_session()
    session = support.wer(session_reference, t.transcribe(session_audio).text)
    return (f"WER clips {clips:.2%}, flite {flite:.2%}, long file {support.wer(reference, result.text):.2%}, "
            f"long session {session:.2%} (long file: last segment ends {result.segments[-1].end - speech_end:+.2f} s "
            f"from the speech's end, {result.duration - speech_end:.1f} s of audio after it); windows kept, s: "
            f"{sorted(kept)}")


def main():
    args = sys.argv[1:]
    model = args.pop(0) if args and args[0] not in ("floors", "int8") else "whisper-tiny.en"
    sections = args or ["floors", "int8"]
    if reason := support.need("flite"):
        sys.exit(reason)
    gate = support.gate_speech(Path(SCRATCH.name))
    long = long_file()
    clips = [load_audio(wav) for wav, _ in support.librivox_clips()]
    rounds = int(os.environ.get("ROUNDS", 3))
    choices = {}
    if "floors" in sections:
        choices["floors"] = {f"floor {f:g} s": open_transcriber(model, f) for f in FLOORS}
    if "int8" in sections:
        choices["int8"] = {f"int8 {name}": open_transcriber(model, None, entries) for name, entries in INT8.items()}
    for section, cases in choices.items():
        for name, t in cases.items():
            print(f"  {model} {name}: {accuracy(t, gate, long)}", flush=True)
        stats = compare({name: lambda t=t: [t.transcribe(a) for a in clips] for name, t in cases.items()},
                        warmup=1, min_blocks=rounds, block_s=0.0, max_s=float("inf"))
        print_table(f"{model}: the 5 LibriVox clips, whole transcription, per {section}", stats,
                    ours=next(iter(cases)), unit=1, unit_name="s")
        for t in cases.values():
            t.close()


if __name__ == "__main__":
    main()
