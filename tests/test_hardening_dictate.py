"""Issue #26 items 1 and 12: the dictation control socket survives hostile payloads from the same user, and
every environment or path problem of `dictate` is a typed error (never a traceback, never a deleted file)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from apps.dictate_control import ControlServer, check_socket_path, send
from apps.main import app
from sdk.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
WAV = Path("/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0930.wav")


def _raw(path: Path, payload: bytes, *, close_early: bool = False) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(path))
        if payload:
            s.sendall(payload)
        if close_early:
            return b""
        try:
            return s.recv(1024)
        except (socket.timeout, ConnectionResetError):
            return b""


HOSTILE = [b"\xff\xfe\xfd\n", b"", b"\x00\x00stop\n", b"stop" * 4096, "stöp\n".encode(), b"\r\n\r\n",
           b"status\x1b[2J\n", bytes(range(256)), b"\xc3"]


def test_hostile_payloads_get_an_answer_or_are_dropped_and_the_server_lives(tmp_path):
    path = tmp_path / "aie-apps-dictate.sock"
    got = []
    server = ControlServer(path, lambda word: got.append(word) or f"ok {word}")
    try:
        for payload in HOSTILE:
            reply = _raw(path, payload)
            assert reply == b"" or reply.endswith(b"\n"), (payload, reply)
        _raw(path, b"stop", close_early=True)  # a client that leaves before the answer
        silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # one that never sends: held for at most 2 s
        silent.connect(str(path))
        t0 = time.monotonic()
        assert send("stop", path) == "ok stop" and time.monotonic() - t0 < 4.5
        silent.close()
        assert server.thread.is_alive()
    finally:
        server.close()
    assert "stop" in got and all(w.isprintable() for w in got)


def test_a_handler_that_raises_does_not_kill_the_control_thread(tmp_path, capsys):
    path = tmp_path / "aie-apps-dictate.sock"
    calls = []

    def handle(word):
        calls.append(word)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return "ok"
    server = ControlServer(path, handle)
    try:
        assert _raw(path, b"stop\n") == b""
        assert send("stop", path) == "ok"
    finally:
        server.close()
    assert "dropped a control message (RuntimeError: boom)" in capsys.readouterr().err


def _dictate(*args, env):
    return CliRunner().invoke(app, ["dictate", *args], env=env)


def test_stop_leaves_a_regular_file_at_the_socket_path_alone(tmp_path):
    (tmp_path / "aie-apps-dictate.sock").write_text("my notes")
    r = _dictate("stop", env={"XDG_RUNTIME_DIR": str(tmp_path)})
    assert r.exit_code == 2 and "not a dictation control socket" in r.stderr and "fix:" in r.stderr
    assert (tmp_path / "aie-apps-dictate.sock").read_text() == "my notes"


@pytest.mark.parametrize("case", ["a file", "too long", "socket is a folder", "unwritable", "unreadable"])
def test_runtime_dir_problems_are_typed_errors(tmp_path, case):
    runtime = tmp_path / "run"
    if case == "a file":
        runtime.write_text("")
    elif case == "too long":
        runtime = tmp_path / ("x" * 120)
    elif case == "socket is a folder":
        (runtime / "aie-apps-dictate.sock").mkdir(parents=True)
    else:
        runtime.mkdir()
        if os.getuid() == 0:
            pytest.skip("root reads and writes any folder")
        runtime.chmod(0o500 if case == "unwritable" else 0o000)
    for args in (["stop"], ["--file", str(WAV), "--fast"]):
        r = _dictate(*args, env={"XDG_RUNTIME_DIR": str(runtime)})
        assert r.exit_code in (1, 2), r.output
        assert "fix:" in r.stderr and not isinstance(r.exception, (OSError, ValueError)), r.stderr


def test_socket_path_checks_directly(tmp_path):
    with pytest.raises(UsageError, match="longer than a unix socket path"):
        check_socket_path(tmp_path / ("y" * 110) / "s.sock")
    (tmp_path / "f").write_text("")
    with pytest.raises(UsageError, match="is a file, not a folder"):
        check_socket_path(tmp_path / "f" / "s.sock")
    assert check_socket_path(tmp_path / "s.sock") == tmp_path / "s.sock"


def test_save_audio_into_a_folder_is_a_usage_error(tmp_path):
    r = _dictate("--file", str(WAV), "--fast", "--save-audio", str(tmp_path), env={"XDG_RUNTIME_DIR": str(tmp_path)})
    assert r.exit_code == 2 and "is a folder" in r.stderr and "fix:" in r.stderr


def test_an_output_whose_folder_cannot_be_made_is_refused_before_listening(tmp_path, monkeypatch):
    def load(*a, **k):
        raise AssertionError("the model was loaded although the output could be refused first")
    monkeypatch.setattr("pipelines.asr.Transcriber", load)
    (tmp_path / "a-file").write_text("")
    r = _dictate("--file", str(WAV), "--fast", "-o", str(tmp_path / "a-file" / "notes" / "d.txt"),
                 env={"XDG_RUNTIME_DIR": str(tmp_path)})
    assert r.exit_code == 2 and "cannot create the folder" in r.stderr and "fix:" in r.stderr, r.stderr


@pytest.mark.skipif(not WAV.exists(), reason="needs Debian pocketsphinx-testdata")
def test_a_transcript_that_cannot_be_written_goes_to_stderr_and_the_exit_says_so(tmp_path):
    out = tmp_path / "d.txt"
    out.symlink_to(tmp_path / "gone" / "d.txt")  # passes the checks up front, fails when written
    r = _dictate("--file", str(WAV), "--fast", "--device", "cpu", "-o", str(out),
                 env={"XDG_RUNTIME_DIR": str(tmp_path), "HF_HUB_OFFLINE": "1"})
    assert r.exit_code == 1 and f"cannot write {out}" in r.stderr, r.stderr
    text = r.stderr.split("the session's text follows\n", 1)[1]
    assert text.strip() and text.split("\n")[0] in r.stdout  # the finals, printed as they came, and kept


@pytest.mark.skipif(not WAV.exists(), reason="needs Debian pocketsphinx-testdata")
def test_sigterm_ends_a_session_like_ctrl_c(tmp_path):
    """A real process: after SIGTERM the socket is gone and the summary is printed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_RUNTIME_DIR": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    p = subprocess.Popen([sys.executable, "-m", "apps.main", "dictate", "--file", str(WAV), "--device", "cpu",
                          "--no-vad"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sock = tmp_path / "aie-apps-dictate.sock"
    try:
        deadline = time.monotonic() + 120
        while not sock.exists() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.1)
        assert sock.exists(), p.stderr.read() if p.poll() is not None else "no socket"
        time.sleep(0.5)
        p.send_signal(signal.SIGTERM)
        out, errors = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert "captured," in errors and "Traceback" not in errors, errors
    assert not sock.exists()
