"""Issue #26 items 11 and 13: long audio is decoded and resampled window by window (bounded memory, the same
transcript), and `feed()` refuses sample rates that are not positive integers."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import soundfile

from pipelines.audio import load_audio, resample, stream_audio
from sdk.errors import InputError, UsageError

ROOT = Path(__file__).resolve().parents[1]
WAV = Path("/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0930.wav")
needs_clip = pytest.mark.skipif(not WAV.exists(), reason="needs Debian pocketsphinx-testdata")


def _stereo_48k(tmp_path: Path, seconds: float | None = None) -> Path:
    speech = load_audio(WAV)
    if seconds:
        speech = np.resize(speech, int(seconds * 16000))
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "stereo48k.wav"
    up = resample(speech, 16000, 48000)
    soundfile.write(str(path), np.stack([up, 0.5 * up], axis=1), 48000, subtype="PCM_16")
    return path


@needs_clip
def test_streamed_blocks_match_the_whole_file_resampled_at_once(tmp_path):
    path = _stereo_48k(tmp_path)
    whole = load_audio(path)
    blocks = list(stream_audio(path, block_seconds=1.0))
    streamed = np.concatenate(blocks)
    assert len(blocks) > 3 and abs(len(streamed) - len(whole)) <= 1
    n = min(len(whole), len(streamed))
    assert np.abs(streamed[:n] - whole[:n]).max() < 1e-3


def test_streaming_refuses_what_read_audio_refuses(tmp_path):
    (tmp_path / "junk.wav").write_bytes(b"RIFF" + bytes(100))
    with pytest.raises(InputError, match="cannot read"):
        list(stream_audio(tmp_path / "junk.wav"))
    with pytest.raises(InputError, match="not a regular file"):
        list(stream_audio(Path("/dev/zero")))
    soundfile.write(str(tmp_path / "empty.wav"), np.zeros(0, np.float32), 16000)
    with pytest.raises(InputError, match="has no samples"):
        list(stream_audio(tmp_path / "empty.wav"))


@needs_clip
def test_streaming_a_long_file_keeps_memory_bounded(tmp_path):
    """Three minutes of 48 kHz stereo (69 MB as float32) streamed in a subprocess: the peak grows by far less."""
    path = _stereo_48k(tmp_path, seconds=180)
    code = textwrap.dedent(f"""
        import resource
        from pipelines.audio import stream_audio
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        n = sum(len(b) for b in stream_audio({str(path)!r}, block_seconds=10))
        print(n, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    samples, grown_kib = map(int, r.stdout.split())
    assert abs(samples - 180 * 16000) <= 1 and grown_kib < 30 * 1024, r.stdout


@needs_clip
def test_transcribing_a_path_streams_and_gives_the_text_of_the_array(tmp_path):
    from pipelines.asr import Transcriber
    path = _stereo_48k(tmp_path)
    with Transcriber("whisper-tiny.en", device="cpu") as t:
        from_path, from_array = t.transcribe(path), t.transcribe(load_audio(path))
        with pytest.raises(UsageError, match="sample_rate must be a positive integer"):
            t.feed(np.zeros(160, np.float32), True)
    assert from_path.text == from_array.text and from_path.text.startswith("He might even")
    assert abs(from_path.duration - from_array.duration) < 1e-3


@pytest.mark.parametrize("rate", [0, -16000, "16000", None, True, 16000.5, float("nan")])
def test_feed_refuses_sample_rates_that_are_not_positive_integers(rate):
    from pipelines.asr import Transcriber
    t = Transcriber.__new__(Transcriber)  # the check runs before any model work
    t._stream = None
    with pytest.raises(UsageError, match="sample_rate must be a positive integer"):
        t.feed(np.zeros(160, np.float32), rate)


CONFORMER = ROOT / "tests" / "fixtures" / "conformer" / "parakeet_ctc"


@needs_clip
def test_a_conformer_transcribes_a_path_block_by_block(tmp_path):
    """Parakeet / GigaAM read a file as Whisper does: decoded, resampled and recognised block by block."""
    from pipelines.asr import Transcriber
    path = _stereo_48k(tmp_path, seconds=70)
    done = []
    with Transcriber(str(CONFORMER), device="cpu") as t:
        from_path = t.transcribe(path, on_progress=done.append)
        from_array = t.transcribe(load_audio(path))
    assert len(done) == 15 and done == sorted(done) and abs(done[-1] - 70) < 1e-3  # 5 s blocks, as they arrive
    assert from_path.text == from_array.text and from_path.text
    assert abs(from_path.duration - 70) < 1e-3


def _noise_48k_stereo(path: Path, seconds: int) -> Path:
    rng = np.random.default_rng(0)
    with soundfile.SoundFile(str(path), "w", 48000, 2, subtype="PCM_16") as f:
        for _ in range(seconds // 60):
            f.write((rng.standard_normal((48000 * 60, 2)) * 0.05).astype(np.float32))
    return path


def test_a_conformer_keeps_memory_bounded_on_a_long_file(tmp_path):
    """5 then 15 minutes of 48 kHz stereo: read whole, the longer file raised the peak by two copies of the
    extra 10 minutes as 16 kHz float32 (+92 MB measured, 77 MB of audio); streamed, the peak stays (+22 MB)."""
    short, long = _noise_48k_stereo(tmp_path / "5min.wav", 300), _noise_48k_stereo(tmp_path / "15min.wav", 900)
    code = textwrap.dedent(f"""
        import resource
        from pipelines.asr import Transcriber
        with Transcriber({str(CONFORMER)!r}, device="cpu") as t:
            t.transcribe({str(short)!r})
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            seconds = t.transcribe({str(long)!r}).duration
        print(seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    seconds, grown_kib = r.stdout.split()
    assert abs(float(seconds) - 900) < 1e-3 and int(grown_kib) < 45 * 1024, (r.stdout, r.stderr[-2000:])
