"""`aie-apps dictate`: talk, and text appears on stdout, as JSON lines, typed into the focused window,
pasted, or on the clipboard.

    aie-apps dictate                          # microphone -> stdout (live partial line on a TTY)
    aie-apps dictate --to type                # type finals into the focused window (never presses Enter)
    aie-apps dictate -o paste --paste-keys ctrl+shift+v   # via the clipboard, into a terminal
    aie-apps dictate --file talk.wav --fast   # a file played as the microphone
    aie-apps dictate toggle                   # start a session, or stop the running one (bind this to a key)

A running session listens on a user-only unix socket in $XDG_RUNTIME_DIR, so `dictate stop|cancel|toggle`
from a desktop key binding controls it; nothing here grabs global hotkeys.

This file is the command; `dictate_output.py` delivers the text (with `desktop_typing.py`'s tools), `dictate_control.py` is the control
socket; pipelines/dictation/ does the listening and transcribing.
"""
from __future__ import annotations

import signal
import threading
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from sdk import settings as sdk_settings
from sdk.atomic import atomic_open
from sdk.errors import SdkError, UsageError

from .cli import DeviceOpt, app, command, err, make_folder, out_json
from .dictate_control import ControlServer, send, socket_path
from .dictate_output import Output, Sink


class VadChoice(str, Enum):
    auto = "auto"
    silero = "silero"
    energy = "energy"
    off = "off"


class Action(str, Enum):
    start = "start"
    stop = "stop"
    toggle = "toggle"
    cancel = "cancel"


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
    vad: Annotated[Optional[VadChoice], typer.Option(
        "--vad", help="voice activity: auto (default: silero-vad when installed, else energy) | silero | energy | off")] = None,
    no_vad: Annotated[bool, typer.Option("--no-vad", help="no voice activity detection (= --vad off)")] = False,
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
    if no_vad and vad not in (None, VadChoice.off):
        raise UsageError(f"--no-vad and --vad {vad.value} contradict each other", fix="pass one of the two")
    from pipelines.asr import TranscribeOptions
    decoding = TranscribeOptions(language=language, task=task)
    _run_session(settings, output=mode, transcript=transcript, partials=partials, typer_tool=typer_tool, paste_chord=paste_chord,
                 model=model, decoding=decoding, input_device=input_device, file=file, fast=fast,
                 vad="off" if no_vad else (vad or VadChoice.auto).value, silence_timeout=silence_timeout,
                 max_duration=max_duration, save_audio=save_audio, device=device)


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
    if transcript is not None:
        make_folder(transcript.parent, "--output")  # before listening, not after the session
    return mode, transcript


def _write_transcript(path: Path, finals: list[str]) -> bool:
    """The session's text, one final per line, written atomically; when that fails it goes to stderr instead
    (and False is returned)."""
    from sdk.atomic import write_atomic
    text = "".join(f + "\n" for f in finals)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
        err(f"dictation: wrote {len(finals)} finals to {path}")
        return True
    except OSError as e:
        err(f"error: cannot write {path} ({e.strerror or e}); the session's text follows\n{text}")
        return False


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
                               partials=sink.partials)   # no partial events nobody sees

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
    previous, written = _stop_on_sigterm(), True
    try:
        stream.start()   # a missing silero-vad (--vad silero) fails here: the socket still goes
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
            written = _write_transcript(transcript, sink.finals)
        report = stream.report()
        err(f"dictation: {report['captured_s']:.1f} s captured, {report['finals']} finals,"
            f" {report['dropped_blocks']} dropped blocks")
    if not written:  # the text went to stderr; a script must still see that the file it asked for is not there
        raise typer.Exit(1)
