"""Dictation faults: missing, busy, unplugged and silent microphones (PortAudio failures injected through a
stand-in sounddevice module, the only mock here), and a missing model offline. Each must raise a typed
error with a fix, and the audio captured before the failure must be transcribed or handed back."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile
import soxr

from pipelines import dictation
from pipelines.dictation import Final, Microphone, Stream, find_input_device
from sdk.errors import DeviceIOError, ModelNotFound
from tests.dictation_support import RATE, librivox_clips, wait_for, wer

pytestmark = pytest.mark.slow


class PortAudioError(Exception):
    pass


class FakePortAudio:
    """Stands in for the sounddevice module: one 48 kHz USB microphone that plays `audio` (4x faster than
    real time) and then vanishes, or fails to open with `open_error`, or never delivers a block."""

    PortAudioError = PortAudioError

    def __init__(self, audio=None, *, open_error=None, devices=True, deliver=True):
        self.audio, self.open_error, self.devices, self.deliver = audio, open_error, devices, deliver
        self.default = SimpleNamespace(device=[0, 0])

    def query_devices(self):
        if not self.devices:
            return []
        return [{"name": "Fake USB Mic: Audio (hw:1,0)", "max_input_channels": 1, "default_samplerate": 48000.0, "hostapi": 0},
                {"name": "Fake USB Mic: Audio (hw:1,0)", "max_input_channels": 1, "default_samplerate": 48000.0, "hostapi": 1},
                {"name": "HDMI out", "max_input_channels": 0, "default_samplerate": 48000.0, "hostapi": 0}]

    def query_hostapis(self):
        return [{"name": "ALSA", "default_input_device": 0}, {"name": "JACK", "default_input_device": -1}]

    def InputStream(self, *, device, samplerate, channels, dtype, blocksize, callback):
        if self.open_error:
            raise PortAudioError(self.open_error)
        return FakeInputStream(self, samplerate, blocksize, callback)


class FakeInputStream:
    def __init__(self, pa, rate, blocksize, callback):
        self.pa, self.rate, self.blocksize, self.callback = pa, rate, blocksize, callback
        self.active = False
        self._thread = threading.Thread(target=self._play, daemon=True)

    def start(self):
        self.active = True
        self._thread.start()

    def _play(self):
        status = SimpleNamespace(input_overflow=False)
        if self.pa.deliver:
            audio = self.pa.audio
            for i in range(0, len(audio), self.blocksize):
                block = audio[i:i + self.blocksize]
                if len(block) == self.blocksize:
                    self.callback(block.reshape(-1, 1), len(block), None, status)
                time.sleep(self.blocksize / self.rate / 4)
            self.active = False                       # unplugged: PortAudio stops the stream

    def close(self, ignore_errors=False):
        self.active = False


@pytest.fixture(scope="module")
def transcriber():
    from pipelines.asr import Transcriber
    return Transcriber("whisper-tiny.en")


def _inject(monkeypatch, pa):
    monkeypatch.setattr(dictation.devices, "load_sounddevice", lambda: pa)


def test_device_listing_is_deduplicated_and_selection_by_name_or_index(monkeypatch):
    _inject(monkeypatch, FakePortAudio())
    devices = dictation.list_input_devices()
    assert [d.name for d in devices] == ["Fake USB Mic: Audio (hw:1,0)"] and devices[0].is_default
    assert find_input_device("usb mic").index == 0 and find_input_device("0").index == 0
    with pytest.raises(DeviceIOError) as e:
        find_input_device("studio condenser")
    assert "Fake USB Mic" in e.value.message and "--list-devices" in e.value.fix
    with pytest.raises(DeviceIOError):
        find_input_device(2)                          # exists, but is an output


def test_no_microphone_at_all(monkeypatch, transcriber):
    _inject(monkeypatch, FakePortAudio(devices=False))
    stream = Stream(transcriber, Microphone())
    with pytest.raises(DeviceIOError) as e:   # from start() itself: no thread was started
        stream.start()
    assert not stream._threads
    assert e.value.exit_code == 5 and "no microphone" in e.value.message and e.value.fix


def test_no_listening_when_the_microphone_failed_before_the_model_was_ready(monkeypatch, transcriber):
    # a busy microphone passes start()'s check and fails when the capture thread opens it
    _inject(monkeypatch, FakePortAudio(open_error="Error opening InputStream: Device unavailable [PaErrorCode -9985]"))
    states = []

    def load():                                       # the model is ready only after capture has failed
        wait_for(lambda: stream.error, 10, "the capture error")
        return transcriber
    stream = Stream(load, Microphone(), on_state=states.append)
    stream.start()
    with pytest.raises(DeviceIOError):
        stream.wait(30)
    assert states == ["loading", "warming", "ready", "stopped"]


def test_cli_no_microphone_or_no_file_fails_before_the_model_loads(tmp_path, monkeypatch, transcriber):
    import pipelines.asr
    from typer.testing import CliRunner
    from apps.main import app

    loads = []
    monkeypatch.setattr(pipelines.asr, "Transcriber", lambda *a, **k: loads.append(a) or transcriber)
    _inject(monkeypatch, FakePortAudio(devices=False))
    env = {"AIE_APPS_HOME": str(tmp_path / "home"), "XDG_RUNTIME_DIR": str(tmp_path / "run"), "AIE_APPS_OFFLINE": "1"}
    result = CliRunner().invoke(app, ["dictate"], env=env)
    assert result.exit_code == 5 and "error: no microphone" in result.stderr, result.output
    assert "listening" not in result.stderr and not loads, result.output
    result = CliRunner().invoke(app, ["dictate", "--file", str(tmp_path / "no-such.wav")], env=env)
    assert result.exit_code == 1 and "no-such.wav does not exist" in result.stderr, result.output
    assert "listening" not in result.stderr and not loads, result.output


def test_a_missing_named_microphone_on_the_real_portaudio():
    with pytest.raises(DeviceIOError) as e:          # no injection: whatever this machine has, not this
        find_input_device("no such microphone 7f3a")
    assert e.value.fix


def test_busy_microphone(monkeypatch, transcriber):
    _inject(monkeypatch, FakePortAudio(open_error="Error opening InputStream: Device unavailable [PaErrorCode -9985]"))
    stream = Stream(transcriber, Microphone("usb")).start()
    with pytest.raises(DeviceIOError) as e:
        stream.wait(30)
    assert "busy" in e.value.message and "other program" in e.value.fix


def test_silent_microphone_is_reported(monkeypatch, transcriber):
    _inject(monkeypatch, FakePortAudio(deliver=False))
    stream = Stream(transcriber, Microphone(stall_timeout=0.5, start_timeout=0.5)).start()
    with pytest.raises(DeviceIOError) as e:
        stream.wait(30)
    assert "no audio arrived" in e.value.message


def test_unplugged_mid_stream_keeps_and_transcribes_what_was_captured(monkeypatch, transcriber, tmp_path):
    wav, reference = librivox_clips()[0]
    clip, _ = soundfile.read(str(wav), dtype="float32")
    audio48 = soxr.resample(np.concatenate([clip, np.zeros(RATE, np.float32)]), RATE, 48000).astype(np.float32)
    _inject(monkeypatch, FakePortAudio(audio48))
    saved = tmp_path / "kept.wav"
    stream = Stream(transcriber, Microphone("usb"), save_audio=saved).start()
    events = []
    with pytest.raises(DeviceIOError) as e:
        for event in stream.events():
            events.append(event)
    assert "unplugged" in e.value.message
    finals = [ev for ev in events if isinstance(ev, Final)]
    assert wer(reference, " ".join(f.text for f in finals)) <= 0.2, finals
    kept, rate = soundfile.read(str(saved), dtype="float32")
    assert rate == RATE and abs(len(kept) - len(audio48) / 3) <= 0.1 * RATE
    assert stream.dropped_blocks == 0


def test_missing_model_offline_keeps_the_audio(tmp_path):
    from pipelines.asr import Transcriber

    loading = threading.Event()

    def load():
        loading.wait(10)                              # audio arrives while the model "loads" ...
        return Transcriber("whisper-no-such-model")   # ... and then it is not there

    stream = Stream(load).start()
    speech = np.random.default_rng(0).standard_normal(2 * RATE).astype(np.float32) * 0.1
    stream.feed(speech, RATE)
    loading.set()
    with pytest.raises(ModelNotFound) as e:
        stream.wait(30)
    assert e.value.exit_code == 4 and e.value.fix
    np.testing.assert_array_equal(stream.unprocessed_audio(), speech)
    with pytest.raises(ModelNotFound):                # the app learns it at its next feed, too
        stream.feed(speech, RATE)


def test_cli_saves_the_audio_when_the_model_is_missing(tmp_path, monkeypatch):
    from typer.testing import CliRunner
    from apps.main import app
    from sdk import hub

    resolve = hub.resolve

    def slow_resolve(name, **kw):  # the lookup fails only after capture has run a while (deterministic test)
        time.sleep(0.5)
        return resolve(name, **kw)
    monkeypatch.setattr(hub, "resolve", slow_resolve)
    wav, _ = librivox_clips()[1]
    env = {"AIE_APPS_HOME": str(tmp_path / "home"), "XDG_RUNTIME_DIR": str(tmp_path / "run"), "AIE_APPS_OFFLINE": "1"}
    result = CliRunner().invoke(app, ["dictate", "--file", str(wav), "--fast", "--model", "whisper-no-such-model"], env=env)
    assert result.exit_code == 4, result.output
    saved = list((tmp_path / "home" / "recordings").glob("dictation-*.wav"))
    assert len(saved) == 1 and "saved to" in result.output
    audio, rate = soundfile.read(str(saved[0]))
    assert rate == RATE and len(audio) > 0
