"""Audio in: typed errors for bad files and arrays, downmix and resampling, mel filter banks, and Whisper's
log-mel against transformers' WhisperFeatureExtractor (committed golden, and live under `reference`)."""
from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from pipelines.audio import (SAMPLE_RATE, TruncatedAudioWarning, hann_window, load_audio, mel_filters,
                             power_spectrum, read_audio, resample, whisper_log_mel)
from sdk.errors import InputError, UsageError

from .conftest import FIXTURES

MEL = FIXTURES / "whisper" / "mel.npz"


def _speech() -> np.ndarray:
    return np.load(MEL)["speech"].astype(np.float32) / 32768


def test_whisper_log_mel_matches_feature_extractor(record_parity):
    golden = np.load(MEL)
    ours = whisper_log_mel(load_audio(golden["speech"]))
    assert record_parity("whisper.log_mel", ours, golden["mel"])[0] <= 1e-4


@pytest.mark.reference
def test_whisper_log_mel_live(record_parity):
    from transformers import WhisperFeatureExtractor
    x = np.random.default_rng(0).standard_normal(40000).astype(np.float32) * 0.1
    ref = WhisperFeatureExtractor(feature_size=128)(x, sampling_rate=16000, return_tensors="np").input_features[0]
    assert record_parity("whisper.log_mel128", whisper_log_mel(x, 128), ref)[0] <= 1e-4


def test_power_spectrum_is_parseval_consistent():
    """A sine's power lands in its bin; a window shorter than n_fft is centred like torch.stft."""
    t = np.arange(4000) / SAMPLE_RATE
    x = np.sin(2 * np.pi * 1000 * t)
    p = power_spectrum(x, n_fft=400, hop=160, window=hann_window(400))
    assert p.shape == (4000 // 160 + 1, 201) and int(np.argmax(p[10])) == 25  # 1000 Hz / 40 Hz per bin
    q = power_spectrum(x, n_fft=512, hop=160, window=hann_window(400))
    assert q.shape[1] == 257 and abs(int(np.argmax(q[10])) - 32) <= 0


def test_mel_filters_shapes_and_norms():
    slaney = mel_filters(sample_rate=16000, n_fft=400, n_mels=80, fmax=8000)
    htk = mel_filters(sample_rate=16000, n_fft=512, n_mels=64, scale="htk", norm=None)
    assert slaney.shape == (80, 201) and htk.shape == (64, 257)
    assert np.isclose(htk.max(), 1.0, atol=0.05) and (slaney >= 0).all()
    # Slaney norm gives each filter (nearly) the same area in Hz
    areas = slaney.sum(axis=1) * (16000 / 400)
    assert np.allclose(areas[5:], areas[5:].mean(), rtol=0.15)


def test_downmix_and_resample(tmp_path):
    speech = _speech()
    stereo44 = np.stack([resample(speech, 16000, 44100)] * 2, axis=1)
    sf.write(tmp_path / "s.wav", stereo44, 44100)
    back = load_audio(tmp_path / "s.wav")
    assert abs(len(back) - len(speech)) <= 2
    n = min(len(back), len(speech))
    assert np.corrcoef(back[:n], speech[:n])[0, 1] > 0.99
    eight = load_audio(resample(speech, 16000, 8000), 8000)
    assert abs(len(eight) - len(speech)) <= 2
    ints = load_audio((speech * 32767).astype(np.int16))
    assert np.abs(ints - speech).max() < 1e-3
    unsigned = load_audio((speech * 127 + 128).round().astype(np.uint8))  # 8-bit WAV PCM: centred on 128
    assert np.abs(unsigned - speech).max() < 1e-2


@pytest.mark.parametrize("content, match", [(b"", "empty"), (b"not audio at all\n" * 50, "cannot read"),
                                            (b"RIFF\x24\x00\x00\x00WAVEfmt ", "cannot read")])
def test_bad_files_are_input_errors(tmp_path, content, match):
    path = tmp_path / "bad.wav"
    path.write_bytes(content)
    with pytest.raises(InputError, match=match) as e:
        load_audio(path)
    if content:  # a .wav we cannot read is a bad file, not a format to convert
        assert "truncated or corrupt" in e.value.fix


def test_a_truncated_wav_warns_and_keeps_what_is_there(tmp_path, recwarn):
    """libsndfile reads a cut-off WAV without complaint; its header still declares the full length."""
    speech = _speech()[:2 * SAMPLE_RATE]
    sf.write(tmp_path / "full.wav", speech, SAMPLE_RATE, subtype="PCM_16")
    data = (tmp_path / "full.wav").read_bytes()
    (tmp_path / "cut.wav").write_bytes(data[:len(data) // 2])
    with pytest.warns(TruncatedAudioWarning) as caught:
        samples, rate = read_audio(tmp_path / "cut.wav")
    (w,) = caught
    message = str(w.message)
    assert str(tmp_path / "cut.wav") in message and "looks truncated" in message
    assert "declares 2.0 s" in message and "only 1.0 s are present" in message
    assert rate == SAMPLE_RATE and len(samples) == (len(data) // 2 - 44) // 2  # every whole frame present is kept
    assert np.abs(samples - speech[:len(samples)]).max() < 1e-4
    load_audio(tmp_path / "full.wav")
    assert not recwarn.list  # the complete file: no warning


def test_a_wav_streamed_without_a_length_is_not_called_truncated(tmp_path, recwarn):
    """Written to a pipe, sox/arecord/ffmpeg leave a placeholder size: the file holds all of its audio."""
    sf.write(tmp_path / "piped.wav", _speech()[:SAMPLE_RATE], SAMPLE_RATE, subtype="PCM_16")
    data = bytearray((tmp_path / "piped.wav").read_bytes())
    data[40:44] = (0xFFFFFFFF).to_bytes(4, "little")  # the data chunk's size (after the 36-byte header and "data")
    (tmp_path / "piped.wav").write_bytes(bytes(data))
    assert len(load_audio(tmp_path / "piped.wav")) == SAMPLE_RATE
    assert not recwarn.list


def test_an_unreadable_file_of_another_format_says_to_convert(tmp_path):
    path = tmp_path / "talk.m4a"
    path.write_bytes(b"\x00\x00\x00\x20ftypM4A " + bytes(200))
    with pytest.raises(InputError, match="cannot read") as e:
        load_audio(path)
    assert "sox" in e.value.fix


def test_missing_file_and_empty_array(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_audio(tmp_path / "nope.wav")
    with pytest.raises(InputError, match="is a folder, not an audio file"):
        load_audio(tmp_path)
    (tmp_path / "empty.wav").touch()
    with pytest.raises(InputError, match="empty"):
        load_audio(tmp_path / "empty.wav")
    with pytest.raises(InputError, match="no samples"):
        load_audio(np.zeros(0, np.float32))
    with pytest.raises(InputError, match="NaN"):
        load_audio(np.full(100, np.nan, np.float32))
    with pytest.raises(InputError, match="frames"):
        load_audio(np.zeros((2, 3, 4), np.float32))
    with pytest.raises(InputError, match=r"looks like \[channels, frames\]") as e:
        load_audio(np.zeros((2, SAMPLE_RATE), np.float32))
    assert "samples.T" in e.value.fix
    assert load_audio(np.zeros((SAMPLE_RATE, 2), np.float32)).shape == (SAMPLE_RATE,)
    for rate in (0, -8000, "16000", 16000.5):
        with pytest.raises(UsageError, match="sample_rate must be a positive integer"):
            load_audio(np.zeros(100, np.float32), rate)
