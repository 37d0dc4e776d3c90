"""`aie-apps dictate`: talk, and text appears on stdout, as JSON lines, typed into the focused window,
pasted, or on the clipboard.

    aie-apps dictate                          # microphone -> stdout (live partial line on a TTY)
    aie-apps dictate --to type                # type finals into the focused window (never presses Enter)
    aie-apps dictate -o paste --paste-keys ctrl+shift+v   # via the clipboard, into a terminal
    aie-apps dictate --file talk.wav --fast   # a file played as the microphone
    aie-apps dictate toggle                   # start a session, or stop the running one (bind this to a key)

A running session listens on a user-only unix socket in $XDG_RUNTIME_DIR, so `dictate stop|cancel|toggle`
from a desktop key binding controls it; nothing here grabs global hotkeys.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from sdk import settings as sdk_settings
from sdk.atomic import atomic_open
from sdk.errors import DeviceIOError, SdkError, UsageError

from .cli import DeviceOpt, app, command, err, out_json

SOCKET_NAME = "aie-apps-dictate.sock"


class Output(str, Enum):
    stdout = "stdout"
    jsonl = "jsonl"
    type = "type"
    paste = "paste"
    clipboard = "clipboard"


class Action(str, Enum):
    start = "start"
    stop = "stop"
    toggle = "toggle"
    cancel = "cancel"


# ----------------------------------------------------------------------------------------------- text sinks

TYPERS = {  # tool -> argv that types TEXT without a trailing Enter
    # a character missing from the X keymap (é, —) goes through a spare key remapped for it, and a busy window
    # can miss that remap (seen once under load in the tests); --to paste has no such race
    "xdotool": lambda text: ["xdotool", "type", "--clearmodifiers", "--delay", "4", "--", text],
    # wtype uploads a new keymap on every run; typing at once, the focused client may read the first key
    # before that keymap (foot under sway lost the first character in 4 of 6 runs), so it waits 50 ms first
    "wtype": lambda text: ["wtype", "-s", "50", "--", text],
    "ydotool": lambda text: ["ydotool", "type", "--", text],
    "dotool": None,  # reads commands on stdin
}
PREFERENCE = {"x11": ("xdotool", "ydotool", "dotool"), "wayland": ("wtype", "ydotool", "dotool"),
              "tty": ("ydotool", "dotool")}
INSTALL = {"xdotool": "sudo apt install xdotool", "wtype": "sudo apt install wtype",
           "ydotool": "sudo apt install ydotool (and run ydotoold)", "dotool": "install dotool (git.sr.ht/~geb/dotool)",
           "xclip": "sudo apt install xclip", "wl-copy": "sudo apt install wl-clipboard"}
NEEDS = {  # what each tool needs from the session when it is installed but fails
    "xdotool": "an X server: DISPLAY must name it (on Wayland use --typer wtype)",
    "wtype": "a Wayland compositor with the virtual-keyboard protocol (sway, Hyprland, river; GNOME has none):"
             " WAYLAND_DISPLAY must name it",
    "ydotool": "write access to /dev/uinput (the uinput kernel module; see ydotool's README for the udev rule),"
               " and from version 1.0 its daemon ydotoold running",
    "dotool": "write access to /dev/uinput (the uinput kernel module; see dotool's README for the udev rule)",
    "xclip": "an X server: DISPLAY must name it", "xsel": "an X server: DISPLAY must name it",
    "wl-copy": "a Wayland compositor: WAYLAND_DISPLAY must name it",
}


def choose_typer(requested: str = "auto", session: str | None = None) -> str:
    session = session or sdk_settings.load().session_type
    if requested != "auto":
        if requested not in TYPERS:
            raise UsageError(f"unknown typing tool {requested!r}", fix=f"use one of auto, {', '.join(TYPERS)}")
        if not shutil.which(requested):
            raise DeviceIOError(f"typing tool {requested} is not installed", fix=INSTALL[requested])
        return requested
    for tool in PREFERENCE[session]:
        if shutil.which(tool):
            return tool
    wanted = PREFERENCE[session][0]
    raise DeviceIOError(f"no typing tool for a {session} session (looked for {', '.join(PREFERENCE[session])})",
                        fix=INSTALL[wanted])


def _run_tool(argv: list[str], *, stdin: str | None = None) -> None:
    # output goes to a file, not a pipe: clipboard tools (xclip, wl-copy) leave a child serving the selection
    # that would hold a pipe open until the timeout; stdout too, where ydotool 1.x writes its errors
    fix = f"{argv[0]} needs {NEEDS[argv[0]]}" if argv[0] in NEEDS else f"check that {argv[0]} works in this session"
    with tempfile.TemporaryFile("w+") as errors:
        try:
            done = subprocess.run(argv, input=stdin, text=True, stdout=errors, stderr=errors, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise DeviceIOError(f"{argv[0]} failed: {e}", fix=fix) from None
        errors.seek(0)
        message = errors.read().strip()[:300]
    if done.returncode != 0:
        raise DeviceIOError(f"{argv[0]} failed (exit {done.returncode}): {message}", fix=fix)


def _one_line(text: str) -> str:
    """Dictation never presses Enter: line breaks (typed, or inside pasted text) become spaces."""
    return re.sub(r"[\r\n\t\v\f]+", " ", text)


def type_text(text: str, tool: str) -> None:
    """Type text into the focused window (never an Enter)."""
    text = _one_line(text)
    if not text.strip():
        return
    if tool == "dotool":
        _run_tool(["dotool"], stdin=f"type {text}\n")
    else:
        _run_tool(TYPERS[tool](text))


def _clipboard_tools(session: str) -> tuple[list[str], list[str]]:
    """(copy argv, paste-out argv) for this session."""
    if session == "wayland" and shutil.which("wl-copy"):
        return ["wl-copy"], ["wl-paste", "--no-newline"]
    if shutil.which("xclip"):
        return ["xclip", "-selection", "clipboard"], ["xclip", "-selection", "clipboard", "-o"]
    if shutil.which("xsel"):
        return ["xsel", "--clipboard", "--input"], ["xsel", "--clipboard", "--output"]
    tool = "wl-copy" if session == "wayland" else "xclip"
    raise DeviceIOError(f"no clipboard tool found for a {session} session", fix=INSTALL[tool])


MODIFIERS = ("ctrl", "shift", "alt", "super")
# Linux input event codes, for ydotool 1.x
KEYCODES = {"ctrl": 29, "shift": 42, "alt": 56, "super": 125, "insert": 110,
            **{c: 16 + i for i, c in enumerate("qwertyuiop")}, **{c: 30 + i for i, c in enumerate("asdfghjkl")},
            **{c: 44 + i for i, c in enumerate("zxcvbnm")}}


def _ydotool_takes_codes() -> bool:
    """ydotool 1.x takes key codes (`29:1` press, `29:0` release) and answers --version; 0.1.x (Debian 12)
    takes names (`ctrl+v`), reads "29:1" as the key 2, and has no --version."""
    try:
        return subprocess.run(["ydotool", "--version"], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return True


def paste_keys(chord: str, tool: str) -> tuple[list[str], str | None]:
    """(argv, stdin) pressing a chord such as ctrl+v, ctrl+shift+v (terminals) or shift+Insert with `tool`."""
    *mods, key = [part.strip().lower() for part in chord.split("+")]
    if not key or any(m not in MODIFIERS for m in mods) or key not in KEYCODES:
        raise UsageError(f"cannot press paste keys {chord!r}",
                         fix="use modifiers (ctrl, shift, alt, super) and a letter or Insert, e.g. ctrl+v,"
                             " ctrl+shift+v (terminals) or shift+Insert")
    key = {"insert": "Insert"}.get(key, key)   # X keysym names are case-sensitive
    if tool == "xdotool":
        return ["xdotool", "key", "--clearmodifiers", "+".join(mods + [key])], None
    if tool == "wtype":   # the same 50 ms keymap wait as when typing (else the chord can arrive without ctrl)
        wtype_mod = {"super": "logo"}
        return (["wtype", "-s", "50"] + [a for m in mods for a in ("-M", wtype_mod.get(m, m))] + ["-k", key]
                + [a for m in reversed(mods) for a in ("-m", wtype_mod.get(m, m))]), None
    if tool == "ydotool":
        if not _ydotool_takes_codes():
            return ["ydotool", "key", "+".join(mods + [key])], None
        codes = [KEYCODES[k.lower()] for k in mods + [key]]
        return ["ydotool", "key", *[f"{c}:1" for c in codes], *[f"{c}:0" for c in reversed(codes)]], None
    return ["dotool"], f"key {'+'.join(mods + [key])}\n"


DELIVERY = {Output.type: "typing the text", Output.paste: "pasting the text",
            Output.clipboard: "copying the text to the clipboard"}


class Sink:
    """Where finals (and, on a TTY, partials) go."""

    def __init__(self, output: Output, *, partials: bool | None, typer_tool: str = "auto",
                 paste_chord: str = "ctrl+v"):
        self.output = output
        self.tty = output == Output.stdout and sys.stdout.isatty()
        if partials and output != Output.jsonl and not self.tty:
            # a partial is rewritten in place on a terminal; a pipe, a typed window or the clipboard get finals only
            raise UsageError(f"--partials shows partial text on a terminal or as --json events, not with"
                             f" --to {output.value}" + (" on a pipe or file" if output == Output.stdout else ""),
                             fix="use --json to get partial events, or leave out --partials")
        self.partials = self.tty if partials is None else partials
        self.session = sdk_settings.load().session_type
        self.tool = choose_typer(typer_tool, self.session) if output in (Output.type, Output.paste) else None
        self.clip = _clipboard_tools(self.session) if output in (Output.paste, Output.clipboard) else None
        self.paste_keys = paste_keys(paste_chord, self.tool) if output == Output.paste else None
        self.finals: list[str] = []   # everything finalised this session (the clipboard output holds it)
        self.failed: SdkError | None = None   # set when the typing or clipboard tool fails; finals then go to stdout
        self._line = False

    def partial(self, event) -> None:
        if not self.partials:
            return
        if self.output == Output.jsonl:
            self._json(event)
        elif self.output == Output.stdout and self.tty:
            sys.stdout.write("\r\033[K" + event.text[-(shutil.get_terminal_size().columns - 1):])
            sys.stdout.flush()
            self._line = True

    def final(self, event) -> None:
        self.finals.append(event.text)
        if self.failed is not None:
            print(event.text, flush=True)
            return
        try:
            self._deliver(event)
        except SdkError as e:
            # the text must not be lost with the tool: all of it goes to stdout (a tool may have typed part of
            # the failing final, and stdout is then the one complete copy); the caller stops the session
            self.failed = e
            delivered = len(self.finals) - 1
            err(f"dictation: {DELIVERY[self.output]} failed (the error follows at the end); stopping, and writing"
                f" this session's text to stdout instead"
                + (f" (the first {'line' if delivered == 1 else f'{delivered} lines'} had been delivered)"
                   if delivered else ""))
            for text in self.finals:
                print(text, flush=True)

    def _deliver(self, event) -> None:
        if self.output == Output.jsonl:
            self._json(event)
        elif self.output == Output.stdout:
            sys.stdout.write(("\r\033[K" if self._line else "") + event.text + "\n")
            sys.stdout.flush()
            self._line = False
        elif self.output == Output.type:
            type_text(event.text + " ", self.tool)
        elif self.output == Output.paste:
            self._paste(event.text + " ")
        elif self.output == Output.clipboard:
            _run_tool(self.clip[0], stdin=" ".join(self.finals))

    def _paste(self, text: str):
        """Clipboard <- text, press the paste keys, then give the clipboard back what it held (if it held text)."""
        copy, read_back = self.clip
        try:
            held = subprocess.run(read_back, capture_output=True, text=True, timeout=5)
            previous = held.stdout if held.returncode == 0 else None   # an empty clipboard is not restored as ""
        except (OSError, subprocess.TimeoutExpired):
            previous = None
        _run_tool(copy, stdin=_one_line(text))
        argv, stdin = self.paste_keys
        try:
            _run_tool(argv, stdin=stdin)
        finally:  # also when the keys fail: what the user had copied is theirs, not ours to replace
            if previous is not None:
                time.sleep(0.2)  # let the target read the clipboard before it is restored
                _run_tool(copy, stdin=previous)

    def _json(self, event) -> None:
        d = {"type": event.type, "text": event.text}
        if event.type == "final":
            d.update(start=round(event.start, 3), end=round(event.end, 3), latency=round(event.latency, 3))
        else:
            d.update(stable=event.stable)
        d["at"] = event.at
        print(json.dumps(d, ensure_ascii=False), flush=True)

    def close(self):
        if self._line:
            sys.stdout.write("\r\033[K")
            sys.stdout.flush()


# ----------------------------------------------------------------------------------------------- control socket

SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes on Linux, the last one a NUL
_SOCKET_FIX = "set XDG_RUNTIME_DIR to a short folder only you can write (normally /run/user/$(id -u))"


def socket_path(settings=None) -> Path:
    settings = settings or sdk_settings.load()
    return check_socket_path(settings.runtime_dir / SOCKET_NAME)


def check_socket_path(path: Path) -> Path:
    """`path` if a control socket can live there: short enough for AF_UNIX, in a folder (not a file), and not
    a folder or a non-socket file itself; else the error that says which and what to do."""
    if len(os.fsencode(path)) > SOCKET_PATH_MAX:
        raise UsageError(f"the control socket path {path} is {len(os.fsencode(path))} bytes, longer than a unix "
                         f"socket path can be ({SOCKET_PATH_MAX})", fix=_SOCKET_FIX)
    if path.parent.exists() and not path.parent.is_dir():
        raise UsageError(f"the control socket's folder {path.parent} is a file, not a folder", fix=_SOCKET_FIX)
    if path.is_dir():
        raise UsageError(f"the control socket path {path} is a folder", fix=f"move {path} away, or {_SOCKET_FIX}")
    if path.exists() and not stat.S_ISSOCK(path.lstat().st_mode):
        raise UsageError(f"{path} is a {'symlink' if path.is_symlink() else 'regular file'}, not a dictation "
                         f"control socket; it is left alone", fix=f"move {path} away, or {_SOCKET_FIX}")
    return path


def send(command_word: str, path: Path | None = None) -> str | None:
    """Send a command to the running session; None when none is running (a stale socket is removed; nothing
    else at that path is ever deleted)."""
    path = check_socket_path(path or socket_path())
    if not path.exists():
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        try:
            s.connect(str(path))
        except ConnectionRefusedError:  # a socket nobody listens on: left by a session that was killed
            path.unlink(missing_ok=True)
            return None
        except FileNotFoundError:
            return None
        except OSError as e:
            raise UsageError(f"cannot reach the dictation session at {path}: {e.strerror or e}",
                             fix=f"check the permissions of {path.parent}, or {_SOCKET_FIX}") from None
        try:
            s.sendall(command_word.encode() + b"\n")
            reply = s.recv(1024)
        except TimeoutError:
            raise DeviceIOError(f"the dictation session at {path} did not answer within 5 s",
                                fix="it may be hung: end it with `kill <pid>` (it saves what it captured)") from None
        except OSError as e:
            raise DeviceIOError(f"the dictation session at {path} closed the connection: {e.strerror or e}",
                                fix="run the command again; if it keeps failing, restart the session") from None
        return reply.decode("utf-8", errors="replace").strip()


class ControlServer:
    """Accepts `stop`, `cancel`, `toggle`, `start`, `status` from the same user over a 0600 unix socket."""

    def __init__(self, path: Path, handle):
        self.path, self.handle = path, handle
        if send("status", path) is not None:
            raise UsageError(f"a dictation session is already running (socket {path})",
                             fix="stop it with `aie-apps dictate stop`, or use `aie-apps dictate toggle`")
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            path.unlink(missing_ok=True)  # a stale socket (send() above found nobody listening)
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            old = os.umask(0o177)  # the socket is created 0600: only this user may control dictation
            try:
                self.sock.bind(str(path))
            finally:
                os.umask(old)
            os.chmod(path, 0o600)
        except OSError as e:
            raise UsageError(f"cannot create the control socket {path}: {e.strerror or e}", fix=_SOCKET_FIX) from None
        self.sock.listen(4)
        self.sock.settimeout(0.2)
        self._closed = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="dictation-control", daemon=True)
        self.thread.start()

    def _serve(self):
        while not self._closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            with conn:
                try:
                    self._answer(conn)
                except Exception as e:  # this thread must outlive any client: the session stays controllable
                    err(f"dictation: dropped a control message ({type(e).__name__}: {e})")

    def _answer(self, conn: socket.socket) -> None:
        """One request: a command word of at most 64 bytes; whatever else arrives gets an answer or is dropped."""
        conn.settimeout(2)  # a client that sends nothing holds the server for at most this long
        try:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            if int.from_bytes(creds[4:8], sys.byteorder) != os.getuid():
                conn.sendall(b"refused\n")
                return
            raw = conn.recv(64)
            word = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            conn.sendall(b"unknown command (not UTF-8)\n")
            return
        except OSError:  # gone, or silent past the timeout
            return
        reply = self.handle(word) if word.isprintable() else f"unknown command {word!r}"
        try:
            conn.sendall((reply + "\n").encode("utf-8", errors="replace"))
        except OSError:
            pass

    def close(self):
        self._closed.set()
        self.thread.join(2)
        self.sock.close()
        self.path.unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------------- command

def _print_devices(as_json: bool):
    from pipelines.dictation import list_input_devices

    devices = list_input_devices()
    if as_json:
        out_json([d.__dict__ for d in devices])
        return
    if not devices:
        err("no audio input devices found")
    for d in devices:
        mark = "*" if d.is_default else " "
        print(f"{mark} {d.index:>3}  {d.name}  ({d.hostapi}, {d.channels} ch, {d.default_samplerate:g} Hz)")


def _save_unprocessed(stream, settings) -> Path | None:
    import soundfile

    audio = stream.unprocessed_audio()
    if len(audio) < 1600:
        return None
    folder = settings.home / "recordings"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / time.strftime("dictation-%Y%m%d-%H%M%S.wav")
    with atomic_open(path, "wb") as f:
        soundfile.write(f, audio, 16000, format="WAV")
    return path


@app.command("dictate")
@command
def dictate(
    action: Annotated[Optional[Action], typer.Argument(help="control a running session: start | stop | toggle | cancel")] = None,
    to: Annotated[Optional[Output], typer.Option(
        "--to", help="where finals go: stdout | type | paste | clipboard (jsonl: --json)")] = None,
    json_events: Annotated[bool, typer.Option("--json", help="JSON lines on stdout: one event per final (and partial)"
                                                            "; with --list-devices: one JSON object")] = False,
    output: Annotated[Optional[str], typer.Option(
        "--output", "-o", help="also write the session's text here when it ends (a file; folders are created)")] = None,
    partials: Annotated[Optional[bool], typer.Option("--partials/--no-partials", help="show partial text (default: on a TTY only)")] = None,
    typer_tool: Annotated[str, typer.Option("--typer", help="typing tool: auto | xdotool | wtype | ydotool | dotool")] = "auto",
    paste_chord: Annotated[str, typer.Option("--paste-keys", help="with --to paste: ctrl+v | ctrl+shift+v (terminals) | shift+Insert")] = "ctrl+v",
    model: Annotated[str, typer.Option("--model", help="ASR model name or folder")] = "whisper-tiny.en",
    language: Annotated[Optional[str], typer.Option(
        "--language", help="Whisper: the spoken language, e.g. en, de (default: detected per utterance)")] = None,
    task: Annotated[str, typer.Option("--task", help="Whisper: transcribe, or translate (into English)")] = "transcribe",
    input_device: Annotated[Optional[str], typer.Option("--input-device", help="microphone: index or part of its name")] = None,
    list_devices: Annotated[bool, typer.Option("--list-devices", help="list microphones and exit")] = False,
    file: Annotated[Optional[Path], typer.Option("--file", help="play this audio file as the microphone")] = None,
    fast: Annotated[bool, typer.Option("--fast", help="with --file: as fast as possible, not real time")] = False,
    vad: Annotated[bool, typer.Option("--vad/--no-vad", help="voice activity detection (on by default)")] = True,
    silence_timeout: Annotated[Optional[float], typer.Option("--silence-timeout", help="stop after this many seconds without speech")] = None,
    max_duration: Annotated[Optional[float], typer.Option("--max-duration", help="stop after this many seconds of audio")] = None,
    save_audio: Annotated[Optional[Path], typer.Option("--save-audio", help="also write the captured audio (16 kHz WAV) here")] = None,
    device: DeviceOpt = None,
):
    """Live dictation from the microphone (or a file played as one)."""
    settings = sdk_settings.load()
    if list_devices:
        return _print_devices(json_events)
    mode, transcript = _delivery(to, json_events, output)
    if action in (Action.stop, Action.cancel, Action.toggle):
        reply = send(action.value if action != Action.toggle else "stop")
        if reply is not None:
            err(f"dictation: {reply}")
            return
        if action != Action.toggle:
            err("dictation: no session is running")
            raise typer.Exit(1)
    elif action == Action.start and send("status") is not None:
        err("dictation: a session is already running")
        return
    if fast and file is None:
        raise UsageError("--fast needs --file")
    if save_audio is not None and (save_audio.is_dir() or not save_audio.parent.is_dir()):
        why = "is a folder" if save_audio.is_dir() else f"is in a folder that does not exist ({save_audio.parent})"
        raise UsageError(f"--save-audio {save_audio} {why}", fix="pass a .wav file path in an existing folder, "
                                                               f"e.g. --save-audio {save_audio / 'take.wav' if save_audio.is_dir() else 'take.wav'}")
    from pipelines.asr import TranscribeOptions
    decoding = TranscribeOptions(language=language, task=task)
    _run_session(settings, output=mode, transcript=transcript, partials=partials, typer_tool=typer_tool, paste_chord=paste_chord,
                 model=model, decoding=decoding, input_device=input_device, file=file, fast=fast, vad=vad,
                 silence_timeout=silence_timeout, max_duration=max_duration, save_audio=save_audio, device=device)


def _delivery(to: Output | None, json_events: bool, output: str | None) -> tuple[Output, Path | None]:
    """(where finals go, the file the session's text is written to). `--output MODE` was the delivery before
    `--to` and `--json`; it still works this release, with a note."""
    if output in {o.value for o in Output}:
        err(f"note: `--output {output}` is deprecated: use " + ("`--json`" if output == "jsonl" else f"`--to {output}`"))
        to, output = (None, None) if output == "jsonl" else (Output(output), None)
        json_events = json_events or to is None
    if json_events and to not in (None, Output.stdout, Output.jsonl):
        raise UsageError(f"--json prints events on stdout, --to {to.value} delivers them elsewhere",
                         fix="pass one of the two")
    mode = Output.jsonl if json_events or to == Output.jsonl else (to or Output.stdout)
    transcript = Path(output) if output else None
    if transcript is not None and transcript.is_dir():
        raise UsageError(f"--output {transcript} is a folder", fix=f"pass a file, e.g. {transcript / 'dictation.txt'}")
    return mode, transcript


def _write_transcript(path: Path, finals: list[str]) -> None:
    """The session's text, one final per line, written atomically; when that fails it goes to stderr instead."""
    from sdk.atomic import write_atomic
    text = "".join(f + "\n" for f in finals)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
        err(f"dictation: wrote {len(finals)} finals to {path}")
    except OSError as e:
        err(f"error: cannot write {path} ({e.strerror or e}); the session's text follows\n{text}", )


def _stop_on_sigterm():
    """SIGTERM (kill, systemd, a desktop session ending) ends the session as Ctrl-C does: what was said is
    written, the socket removed and the summary printed. Returns the handler it replaced (None off the main
    thread, where signals cannot be handled)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupt(signum, frame):
        raise KeyboardInterrupt
    return signal.signal(signal.SIGTERM, interrupt)


def _show(events, sink, stream):
    for event in events:
        if event.type == "state":
            err(f"dictation: {event.state}" + (" - speak now" if event.state == "listening" else ""))
        elif event.type == "partial":
            sink.partial(event)
        else:
            sink.final(event)
            if sink.failed is not None:  # like `dictate stop`: what was captured is still transcribed (to stdout)
                stream.request_stop()


def _run_session(settings, *, output, transcript, partials, typer_tool, paste_chord, model, decoding, input_device,
                 file, fast, vad, silence_timeout, max_duration, save_audio, device):
    from pipelines.dictation import DictationOptions, FileSource, Microphone, Stream

    # a missing typing or clipboard tool fails here, before the microphone opens
    sink = Sink(output, partials=partials, typer_tool=typer_tool, paste_chord=paste_chord)
    source = FileSource(file, pace="fast" if fast else "realtime") if file else Microphone(input_device)
    source.check()   # a missing microphone or file fails now, not after the model has loaded
    options = DictationOptions(vad=vad, silence_timeout=silence_timeout, max_duration=max_duration,
                               partials=sink.partials)   # nobody sees partials: do not spend decodes on them

    def load():
        from pipelines.asr import Transcriber
        return Transcriber(model, device=device, options=decoding)

    stream = Stream(load, source, options, save_audio=save_audio)

    def handle(word: str) -> str:
        if word in ("stop", "toggle", "cancel"):
            stream.request_stop(cancel=word == "cancel")
            return "cancelled" if word == "cancel" else "stopping"
        if word in ("status", "start"):
            return f"running ({stream.state})"
        return f"unknown command {word!r}"

    server = ControlServer(socket_path(settings), handle)
    previous = _stop_on_sigterm()
    stream.start()
    try:
        try:
            _show(stream.events(), sink, stream)
        except KeyboardInterrupt:  # Ctrl-C ends the session like `dictate stop`: what was said is still written
            err("dictation: stopping (Ctrl-C again to abort)")
            stream.request_stop()
            _show(stream.events(), sink, stream)
            raise
        if sink.failed is not None:
            raise sink.failed
    except SdkError as e:
        if sink.failed is not None and e is not sink.failed:   # the note promised this error
            err(f"error: {sink.failed.message}")
        # events() ends only once the worker has stopped, so the unread audio is exactly what was not transcribed
        saved = None if save_audio else _save_unprocessed(stream, settings)
        if saved:
            err(f"note: {len(stream.unprocessed_audio()) / 16000:.1f} s of captured audio was not transcribed;"
                f" saved to {saved}")
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        sink.close()
        server.close()
        if transcript is not None:
            _write_transcript(transcript, sink.finals)
        report = stream.report()
        err(f"dictation: {report['captured_s']:.1f} s captured, {report['finals']} finals,"
            f" {report['dropped_blocks']} dropped blocks")
