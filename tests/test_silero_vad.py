"""silero-vad as dictation's voice activity detector: its ONNX model on ONNX Runtime (no torch), parity with the
package's own runners, what it calls speech (LibriVox, not noise, music or a tone), streaming invariance, and the
energy VAD as the fallback (a note) or the choice (--vad energy)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import soundfile

from pipelines.dictation import (FRAME, DictationOptions, FileSource, Final, Recognizer, SileroVad, Stream, Vad,
                                 VadFallbackWarning)
from pipelines.dictation import voice_activity
from pipelines.dictation.silero_vad import CHUNK, CHUNK_SECONDS, silero_model_path
from sdk.errors import ModelNotFound, UsageError
from tests.dictation_support import RATE, librivox_clips, librivox_session

needs_silero = pytest.mark.skipif(silero_model_path() is None,
                                  reason="needs silero-vad: pip install --no-deps silero-vad")


def _frames(audio):
    n = len(audio) // FRAME
    return audio[:n * FRAME].reshape(n, FRAME)


def _music(seconds=10):
    """0.5 s chords of three harmonic notes with decaying envelopes over a click track (bench/vad.py's)."""
    rng = np.random.default_rng(0)
    t = np.arange(RATE // 2) / RATE
    chords = [0.1 * sum(np.sin(2 * np.pi * f * h * t) / h for f in 110 * 2 ** (rng.integers(0, 24, 3) / 12)
                        for h in (1, 2, 3)) * np.exp(-3 * t) for _ in range(2 * seconds)]
    music = np.concatenate(chords)
    music[::RATE // 4] += 0.5
    return music.astype(np.float32)


@needs_silero
@pytest.mark.reference
def test_probabilities_match_silero_vads_own_onnx_and_torchscript_runners(record_parity):
    """The same chunks, context and state as the package's OnnxWrapper (torch around ONNX Runtime) and its
    TorchScript model, on a LibriVox clip."""
    import torch
    from silero_vad.utils_vad import OnnxWrapper, init_jit_model

    clip, _ = soundfile.read(str(librivox_clips()[0][0]), dtype="float32")
    clip = clip[:len(clip) // CHUNK * CHUNK]
    ours = SileroVad(DictationOptions()).probabilities(clip)
    chunks = torch.from_numpy(clip).reshape(-1, CHUNK)
    wrapper = OnnxWrapper(str(silero_model_path()), force_onnx_cpu=True)
    onnx = np.array([float(wrapper(c, RATE)) for c in chunks], np.float32)
    jit = init_jit_model(str(silero_model_path().with_name("silero_vad.jit")))
    with torch.no_grad():
        torchscript = np.array([float(jit(c[None], RATE)) for c in chunks], np.float32)
    assert len(ours) == len(clip) // CHUNK and ours.max() > 0.9 and ours.min() < 0.1
    assert record_parity("silero_vad.onnx_wrapper", ours, onnx)[0] <= 1e-6
    assert record_parity("silero_vad.torchscript", ours, torchscript)[0] <= 1e-3


@needs_silero
def test_speech_is_active_and_pauses_noise_music_and_a_tone_are_not():
    audio, _, spans = librivox_session()
    active, voiced = SileroVad(DictationOptions())(_frames(audio))
    t = (np.arange(len(active)) + 0.5) * FRAME / RATE
    in_speech = np.zeros(len(active), bool)
    for start, end in spans:
        in_speech |= (t >= start) & (t < end)
    assert active[in_speech].mean() > 0.8 and voiced[in_speech].mean() > 0.8
    assert not active[~in_speech].any()       # the pauses are digital silence
    rng = np.random.default_rng(7)
    white = (0.02 * rng.standard_normal(10 * RATE)).astype(np.float32)
    tone = (0.3 * np.sign(np.sin(2 * np.pi * 140 * np.arange(5 * RATE) / RATE))).astype(np.float32)
    for name, sound in (("white noise", white), ("music", _music()), ("a 140 Hz square tone", tone)):
        active, _ = SileroVad(DictationOptions())(_frames(sound))
        assert active.mean() < 0.02, (name, active.mean())


@needs_silero
def test_blocks_of_any_size_give_the_same_decisions_and_a_look_ahead_changes_nothing():
    """Frames regroup into 512-sample chunks whatever the block size; quiet_tail (polled during a decode, as the
    audio ahead grows) runs on copies of the state and says what the VAD will say."""
    clip, _ = soundfile.read(str(librivox_clips()[4][0]), dtype="float32")
    frames = _frames(np.concatenate([clip, np.zeros(RATE, np.float32)]))
    whole = SileroVad(DictationOptions())(frames)
    vad, fresh = SileroVad(DictationOptions()), SileroVad(DictationOptions())
    parts, cut = [], len(frames) - 60
    for start in range(0, cut, 7):
        parts.append(vad(frames[start:min(start + 7, cut)]))
    fresh(frames[:cut])
    ahead = frames[cut:].reshape(-1)
    looks = [vad.quiet_tail(ahead[:n]) for n in range(CHUNK, len(ahead) + 1, 1000)] + [vad.quiet_tail(ahead)]
    assert looks[-1] == fresh.quiet_tail(ahead) >= 0.9     # remembered chunks = all run anew; the clip has ended
    parts.append(vad(frames[cut:]))
    for i in range(2):
        assert np.array_equal(np.concatenate([p[i] for p in parts]), whole[i])
    quiet_frames = len(whole[0]) - 1 - np.flatnonzero(whole[0])[-1]
    assert abs(quiet_frames * FRAME / RATE - looks[-1]) <= 2 * CHUNK_SECONDS


@needs_silero
def test_the_recognizer_with_silero_finalises_real_speech_once_per_clip():
    """Two LibriVox clips with a 1 s pause: two utterances, stamped on the words, each decoded once (the final;
    no partials asked for, and no decode started in a comma pause)."""

    class Ends:
        window_seconds = 30.0

        def __init__(self):
            self.decoded = []

        def decode_window(self, samples, *, offset=0.0, fallback=True, stop=None):
            from pipelines.asr import Segment
            self.decoded.append(offset + len(samples) / RATE)
            return [Segment(offset, offset + len(samples) / RATE, ("alpha", "bravo", "charlie")[len(self.decoded) - 1])]

    clips = [soundfile.read(str(w), dtype="float32")[0] for w, _ in librivox_clips()[3:5]]
    audio = np.concatenate([np.zeros(RATE // 2, np.float32), clips[0], np.zeros(RATE, np.float32), clips[1],
                            np.zeros(RATE, np.float32)])
    # early_final 0.2 s: at the default 0.1 s the comma pause in the first clip starts one more decode
    rec = Recognizer(model := Ends(), DictationOptions(vad="silero", partials=False, early_final=0.2))
    events = []
    for i in range(0, len(audio), 1920):
        events += rec.accept(audio[i:i + 1920])
    events += rec.finish()
    finals = [e for e in events if isinstance(e, Final)]
    second = 0.5 + len(clips[0]) / RATE + 1.0
    assert len(finals) == 2 and finals[0].end <= second - 0.8 and finals[1].start >= second - 0.05, finals
    assert finals[1].end <= second + len(clips[1]) / RATE + 0.1
    assert [f.text for f in finals] == ["alpha", "bravo"] and len(model.decoded) == 2


def test_vad_options_are_checked_and_the_old_bool_still_means_on_or_off():
    assert DictationOptions().vad == "auto"
    assert DictationOptions(vad=True).vad == "energy" and DictationOptions(vad=False).vad is None
    assert DictationOptions(vad="off").vad is None and DictationOptions(vad="energy").vad == "energy"
    with pytest.raises(UsageError, match="vad must be one of"):
        DictationOptions(vad="webrtc")
    with pytest.raises(UsageError):
        DictationOptions(silero_threshold=1.5)


def test_without_silero_vad_auto_is_the_energy_vad_with_a_note_and_silero_is_an_error(monkeypatch):
    monkeypatch.setattr(voice_activity, "silero_model_path", lambda: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vad = voice_activity.open_vad(DictationOptions(vad="auto"))
    assert isinstance(vad, Vad) and [w.category for w in caught] == [VadFallbackWarning]
    assert "pip install --no-deps silero-vad" in str(caught[0].message)
    assert isinstance(voice_activity.open_vad(DictationOptions(vad="energy")), Vad)
    stream = Stream(lambda: pytest.fail("the model was loaded"), FileSource(np.zeros(RATE), RATE),
                    DictationOptions(vad="silero"))
    with pytest.raises(ModelNotFound) as error:     # from start(), before the model loads
        stream.start()
    assert error.value.exit_code == 4 and "pip install --no-deps silero-vad" in error.value.fix


def test_cli_vad_choice(monkeypatch, tmp_path):
    """--vad energy|silero|auto|off reaches the session; a contradiction or an unknown detector is a usage
    error; without silero-vad, --vad silero is exit 4 with the install command, and auto says so once as a note."""
    from typer.testing import CliRunner
    from apps.main import app

    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    silence = tmp_path / "quiet.wav"
    soundfile.write(str(silence), np.zeros(RATE, np.float32), RATE)
    ran = []

    class Silent:                          # the CLI's model: these runs are about the VAD, not the words
        window_seconds = 30.0

        def __init__(self, *args, **kwargs):
            pass

        def decode_window(self, samples, **kwargs):
            return []
    monkeypatch.setattr("pipelines.asr.Transcriber", Silent)
    monkeypatch.setattr(Stream, "report", lambda self: ran.append(self.options.vad) or {
        "captured_s": 1.0, "finals": 0, "dropped_blocks": 0})
    for flags, expected in ((["--vad", "silero"], "silero"), ([], "auto"), (["--vad", "energy"], "energy"), (["--no-vad"], None)):
        result = CliRunner().invoke(app, ["dictate", "--file", str(silence), "--fast", *flags], env=env)
        assert result.exit_code == 0 and ran[-1] == expected, (flags, result.output)
    for flags in (["--vad", "webrtc"], ["--vad", "energy", "--no-vad"]):
        result = CliRunner().invoke(app, ["dictate", "--file", str(silence), "--fast", *flags], env=env)
        assert result.exit_code == 2, (flags, result.output)
    monkeypatch.setattr(voice_activity, "silero_model_path", lambda: None)
    result = CliRunner().invoke(app, ["dictate", "--file", str(silence), "--fast", "--vad", "silero"], env=env)
    assert result.exit_code == 4 and "pip install --no-deps silero-vad" in result.stderr, result.output
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        result = CliRunner().invoke(app, ["dictate", "--file", str(silence), "--fast", "--vad", "auto"], env=env)
    assert result.exit_code == 0 and result.stderr.count("note: silero-vad is not installed") == 1, result.output
