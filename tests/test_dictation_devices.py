"""Dictation against real devices: PortAudio capture from a PulseAudio null sink while speech plays into it,
that microphone unplugged mid-sentence or suspended, no sound server at all, and the user-only control
socket. Each test starts (and stops) the daemons it needs and skips, naming the binary, only when one is
not installed.
Typing, pasting and the clipboard on real display servers are in test_dictation_outputs.py.

A busy microphone cannot be made real here: the kernel has no sound support (no /dev/snd, CONFIG_SOUND
unset), and PulseAudio sources are shared, never busy; test_dictation_faults.py injects that PortAudio error."""
from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import soundfile

from tests.dictation_support import librivox_clips, need, stop_process, wait_for, wer, words

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "apps.main", "dictate", *args]


def _env(**extra) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", AIE_APPS_OFFLINE="1", AIE_APPS_DEVICE="cpu")
    env.update(extra)
    return env


# ----------------------------------------------------------------------------------------------- microphone

def _start_pulse(tmp_path, *, fallback: bool):
    """A private PulseAudio server with a null sink `vmic` (its monitor is the microphone). With fallback,
    module-always-sink keeps a dummy sink (and source) around, as a desktop keeps other devices."""
    reason = need("pulseaudio", "paplay", "pactl")
    if reason:
        pytest.skip(reason)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = _env(XDG_RUNTIME_DIR=str(runtime))
    env.pop("PULSE_SERVER", None)
    subprocess.run(["pulseaudio", "--daemonize=yes", "--exit-idle-time=-1", "-n",
                    "--load=module-native-protocol-unix", "--load=module-null-sink sink_name=vmic",
                    *(["--load=module-always-sink"] if fallback else [])],
                   env=env, check=True, capture_output=True, timeout=30)
    pid = int(wait_for(lambda: (runtime / "pulse" / "pid").exists() and (runtime / "pulse" / "pid").read_text().strip(),
                       10, "the pulseaudio pid file"))
    return env, pid


def _stop_pulse(pid: int):
    try:
        os.kill(pid, 15)
        wait_for(lambda: not Path(f"/proc/{pid}").exists(), 10, "pulseaudio to exit")
    except ProcessLookupError:
        pass


@pytest.fixture
def pulse(tmp_path):
    env, pid = _start_pulse(tmp_path, fallback=True)
    try:
        yield env
    finally:
        _stop_pulse(pid)


@pytest.fixture
def pulse_alone(tmp_path):
    """The null sink is the only device: when it goes, nothing takes over its streams."""
    env, pid = _start_pulse(tmp_path, fallback=False)
    try:
        yield env
    finally:
        _stop_pulse(pid)


def test_portaudio_capture_through_pulseaudio_null_sink(pulse, tmp_path):
    wav, reference = librivox_clips()[0]
    mic_env = dict(pulse, PULSE_SOURCE="vmic.monitor")

    listing = subprocess.run(_cli("--list-devices"), env=mic_env, capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0, listing.stderr
    assert any("pulse" in line for line in listing.stdout.splitlines()), listing.stdout
    assert any(line.startswith("*") for line in listing.stdout.splitlines())   # the default is marked

    heard = tmp_path / "heard.wav"
    session = subprocess.Popen(_cli("--input-device", "PULSE", "--json", "--save-audio", str(heard),
                                    "--max-duration", "120"),
                               env=mic_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        # the recording stream is connected to the server (not necessarily ready: audio before ready is kept)
        wait_for(lambda: subprocess.run(["pactl", "list", "short", "source-outputs"], env=pulse,
                                        capture_output=True, text=True).stdout.strip(), 60, "dictate to open the microphone")
        subprocess.run(["paplay", "--device=vmic", str(wav)], env=pulse, check=True, timeout=60)
        time.sleep(1.5)
        stop = subprocess.run(_cli("stop"), env=mic_env, capture_output=True, text=True, timeout=60)
        assert stop.returncode == 0 and "stopping" in stop.stderr, stop.stderr
        out, errors = session.communicate(timeout=180)
    finally:
        stop_process(session)
    assert session.returncode == 0, errors
    finals = [json.loads(line) for line in out.splitlines() if line.strip()]
    text = " ".join(f["text"] for f in finals if f["type"] == "final")
    print(f"\n  heard through PulseAudio: {text!r} (WER {wer(reference, text):.3f})")
    assert wer(reference, text) <= 0.2, (text, errors)
    audio, rate = soundfile.read(str(heard))
    assert rate == 16000 and len(audio) / rate >= 7.0
    assert "0 dropped blocks" in errors


def _unplug_mid_sentence(env, tmp_path) -> tuple[subprocess.CompletedProcess, list[dict], Path, str, str]:
    """Dictate from vmic.monitor through PortAudio; play one sentence, pause, start a second one and unload
    the null sink (the microphone) 1.5 s into it. (the finished session, its finals, the saved audio, refs)"""
    (first, first_ref), (second, second_ref) = librivox_clips()[4], librivox_clips()[1]
    heard = tmp_path / "heard.wav"
    mic_env = dict(env, PULSE_SOURCE="vmic.monitor")
    session = subprocess.Popen(_cli("--input-device", "pulse", "--json", "--save-audio", str(heard),
                                    "--max-duration", "60"),
                               env=mic_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    player = None
    try:
        wait_for(lambda: subprocess.run(["pactl", "list", "short", "source-outputs"], env=env,
                                        capture_output=True, text=True).stdout.strip(), 60, "dictate to open the microphone")
        subprocess.run(["paplay", "--device=vmic", str(first)], env=env, check=True, timeout=60)
        time.sleep(1.5)                                   # a pause: the first sentence becomes a final
        player = subprocess.Popen(["paplay", "--device=vmic", str(second)], env=env, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        time.sleep(1.5)
        modules = subprocess.run(["pactl", "list", "short", "modules"], env=env, capture_output=True, text=True,
                                 check=True).stdout.splitlines()
        vmic = next(line.split()[0] for line in modules if "sink_name=vmic" in line)
        subprocess.run(["pactl", "unload-module", vmic], env=env, check=True, timeout=30)   # unplugged
        out, errors = session.communicate(timeout=120)
    finally:
        stop_process(session)
        if player is not None:
            stop_process(player)
    finals = [json.loads(line) for line in out.splitlines() if line.strip()]
    return subprocess.CompletedProcess(session.args, session.returncode, out, errors), finals, heard, first_ref, second_ref


def _assert_kept(run, finals, heard, first_ref, second_ref):
    """The first sentence was transcribed, the half sentence said before the unplug too, and the saved
    audio holds everything that was captured."""
    said = [w for f in finals if f["type"] == "final" for w in words(f["text"])]
    print(f"\n  finals: {[f['text'] for f in finals]}\n  {run.stderr.strip().splitlines()[-2:]}")
    n = len(words(first_ref))
    assert wer(first_ref, " ".join(said[:n])) <= 0.2, said
    assert set(said[n:]) & set(words(second_ref)[:5]), f"the words said before the unplug were lost: {said}"
    captured = float(re.search(r"([0-9.]+) s captured", run.stderr).group(1))
    audio, rate = soundfile.read(str(heard))
    assert rate == 16000 and abs(len(audio) / rate - captured) <= 0.1, (len(audio) / rate, captured)
    assert captured >= 3.0 + 1.5 + 1.0
    assert "0 dropped blocks" in run.stderr


def test_microphone_unplugged_mid_sentence(pulse_alone, tmp_path):
    """With no other device, PulseAudio kills the recording stream ("Entity killed"); PortAudio stops it."""
    run, finals, heard, first_ref, second_ref = _unplug_mid_sentence(pulse_alone, tmp_path)
    assert run.returncode == 5, run.stderr                          # DeviceIOError
    assert "stopped delivering audio (the audio stream stopped); it may have been unplugged" in run.stderr, run.stderr
    assert "fix: reconnect it and start again" in run.stderr
    _assert_kept(run, finals, heard, first_ref, second_ref)


def test_microphone_unplugged_with_a_fallback_device_stalls_then_fails(pulse, tmp_path):
    """With another (here a dummy) source around, PulseAudio moves the stream there instead: PortAudio reports
    nothing, blocks stop for about 2 s, and the stall timeout ends the session."""
    run, finals, heard, first_ref, second_ref = _unplug_mid_sentence(pulse, tmp_path)
    assert run.returncode == 5, run.stderr
    assert "stopped delivering audio (no audio arrived for 1.5 s); it may have been unplugged" in run.stderr, run.stderr
    _assert_kept(run, finals, heard, first_ref, second_ref)


def _open_microphone(env: dict, **options) -> str:
    """Run a Microphone on the real PortAudio in a fresh process (PortAudio lists devices once, when it
    starts); what it raised, as "DeviceIOError <exit code> <message> | <fix>"."""
    probe = ("import threading\n"
             "from pipelines.dictation import Microphone\n"
             "from sdk.errors import DeviceIOError\n"
             "try:\n"
             f"    Microphone('pulse', **{options!r}).run(lambda x, rate: None, threading.Event())\n"
             "except DeviceIOError as e:\n"
             "    print(type(e).__name__, e.exit_code, e.message, '|', e.fix)\n")
    run = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    print(f"\n  {run.stdout.strip()}")
    assert run.stdout, run.stderr
    return run.stdout


def test_no_sound_server_means_no_microphone(tmp_path):
    """Real PortAudio with PulseAudio down: no input device at all (its ALSA `pulse` device cannot connect)."""
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    said = _open_microphone(_env(XDG_RUNTIME_DIR=str(runtime), PULSE_SERVER=f"unix:{runtime}/no-server"))
    assert said.startswith("DeviceIOError 5 no microphone (audio input device) found"), said
    assert "PulseAudio/PipeWire is running" in said


def test_a_suspended_microphone_opens_but_stays_silent(pulse_alone):
    """A device suspended in the sound server opens fine and then delivers no block at all."""
    subprocess.run(["pactl", "suspend-sink", "vmic", "1"], env=pulse_alone, check=True, timeout=30)
    said = _open_microphone(dict(pulse_alone, PULSE_SOURCE="vmic.monitor"), start_timeout=2.0)
    assert said.startswith("DeviceIOError 5 microphone 'pulse' opened, but no audio arrived in 2 s"), said
    assert "not muted" in said


# ----------------------------------------------------------------------------------------------- control socket

def test_control_socket_is_user_only_and_answers(tmp_path):
    from apps.dictate_control import ControlServer, send
    from sdk.errors import UsageError

    path = tmp_path / "run" / "aie-apps-dictate.sock"
    got = []
    server = ControlServer(path, lambda word: got.append(word) or f"ok {word}")
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert send("cancel", path) == "ok cancel"
        assert send("stop", path) == "ok stop"
        with pytest.raises(UsageError):          # one session at a time
            ControlServer(path, lambda word: "")
    finally:
        server.close()
    assert got == ["cancel", "stop", "status"]   # the second server asked whether one runs
    assert not path.exists() and send("stop", path) is None
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))                         # a stale socket from a session that was killed
    stale.close()
    assert send("stop", path) is None and not path.exists()


def test_stop_without_a_session_fails_cleanly(tmp_path):
    from typer.testing import CliRunner
    from apps.main import app

    result = CliRunner().invoke(app, ["dictate", "stop"], env={"XDG_RUNTIME_DIR": str(tmp_path)})
    assert result.exit_code == 1
    assert "no session is running" in result.output
