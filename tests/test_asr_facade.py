"""One Transcriber for every ASR family: Whisper and the conformers through transcribe(), decode_window(),
and the live API (start / feed / events / stop) that pipelines/dictation/ implements."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from apps.main import app
from pipelines.asr import TranscribeOptions, Transcriber, WhisperRecognizer
from pipelines.conformer_asr import ConformerRecognizer
from pipelines.dictation import Final, FileSource
from sdk.errors import InputError, UsageError

from .conftest import FIXTURES

CLIP = Path("/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0870.wav")
PARAKEET = FIXTURES / "conformer" / "parakeet_ctc"
noise = np.random.default_rng(0).standard_normal(16000 * 3).astype(np.float32) * 0.3


def test_a_model_of_another_family_is_named_not_loaded_as_whisper():
    runner = CliRunner()
    with pytest.raises(UsageError, match="holds a 'esm' model, not a speech model"):
        Transcriber(str(FIXTURES / "esm"), device="cpu")
    r = runner.invoke(app, ["transcribe", str(CLIP), "--model", str(FIXTURES / "esm")])
    assert r.exit_code == 2 and "holds a 'esm' model" in r.stderr and "whisper" in r.stderr


def test_conformer_checkpoints_get_the_conformer_recognizer():
    with Transcriber(str(PARAKEET), device="cpu") as t, ConformerRecognizer(PARAKEET, device="cpu") as direct:
        assert isinstance(t.recognizer, ConformerRecognizer)
        result = t.transcribe(noise)
        assert result.segments == direct.transcribe(noise)  # the facade adds nothing to the decoding
        assert result.text == " ".join(s.text for s in result.segments)
        assert (result.device_requested, result.device_effective, result.duration) == ("cpu", "cpu", 3.0)
        assert t.decode_window(noise) == direct.decode_window(noise)
        assert t.window_seconds == direct.window_seconds


@pytest.mark.parametrize("options", [TranscribeOptions(language="en"), TranscribeOptions(task="translate")])
def test_a_conformer_model_refuses_whisper_decoding_options(options):
    with pytest.raises(UsageError, match="takes no language and cannot translate"):  # they were ignored
        Transcriber(str(PARAKEET), device="cpu", options=options)


def test_transcribe_cli_takes_a_conformer_model(tmp_path):
    import soundfile
    wav = tmp_path / "noise.wav"
    soundfile.write(wav, noise, 16000)
    r = CliRunner().invoke(app, ["transcribe", str(wav), "--model", str(PARAKEET), "--device", "cpu",
                                 "--format", "json"])
    assert r.exit_code == 0, r.stderr
    assert '"text"' in r.stdout


@pytest.fixture(scope="module")
def whisper():
    with Transcriber("whisper-tiny.en", device="cpu") as t:
        yield t


def test_whisper_is_the_default_family(whisper):
    assert isinstance(whisper.recognizer, WhisperRecognizer) and whisper.window_seconds == 30.0


def test_whisper_window_scales_pcm_and_refuses_what_is_not_audio(whisper):
    pcm = (noise * 10000).astype(np.int16)  # was decoded unscaled
    assert whisper.decode_window(pcm) == whisper.decode_window(pcm / np.float32(32768))
    for bad in ("talk.wav", None):
        with pytest.raises(InputError, match="has dtype"):
            whisper.decode_window(bad)
    with pytest.raises(UsageError, match="mono audio of at most 30 s"):
        whisper.decode_window(np.stack([noise, noise]))
    with pytest.raises(InputError, match="NaN or infinite"):  # used to decode as '!!!!'
        whisper.decode_window(np.full(16000, np.nan, np.float32))
    with pytest.raises(UsageError, match="temperatures"):
        TranscribeOptions(temperatures=())
    with pytest.raises(UsageError, match="unknown task 'translit'"):  # with the options, before any model loads
        TranscribeOptions(task="translit")


@pytest.mark.skipif(not CLIP.exists(), reason="needs Debian's pocketsphinx-testdata")
def test_live_api_streams_a_file_as_a_microphone(whisper):
    finals = []
    whisper.on_final = finals.append
    try:
        whisper.start(FileSource(CLIP, pace="fast"))
        events = list(whisper.events())  # ends when the file has been played and transcribed
        stopped = whisper.stop()
    finally:
        whisper.on_final = None
    got = [e for e in events if isinstance(e, Final)]
    assert got and got == finals == stopped
    text = " ".join(e.text for e in got).lower()
    assert "dashwood" in text and "prudently" in text
    with pytest.raises(UsageError):
        whisper.events()  # the stream ended with the source; nothing is streaming now


@pytest.mark.skipif(not CLIP.exists(), reason="needs Debian's pocketsphinx-testdata")
def test_feed_starts_a_stream_and_stop_returns_what_was_said(whisper):
    import soundfile
    audio, rate = soundfile.read(CLIP, dtype="float32")
    for start in range(0, len(audio), rate // 10):
        whisper.feed(audio[start:start + rate // 10], rate)
    whisper.feed(np.zeros(rate * 2, np.float32), rate)
    finals = whisper.stop()
    assert "dashwood" in " ".join(f.text for f in finals).lower()
    with pytest.raises(UsageError):
        whisper.stop()
