"""`aie-apps transcribe FILE...`: speech to text with Whisper; txt, srt, vtt, json or jsonl on stdout or in -o DIR."""
from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from sdk.atomic import write_atomic
from sdk.errors import InputError, UsageError

from .cli import DeviceOpt, PrecisionOpt, app, command, err, make_folder, report_error
from .progress import progress


class Format(str, Enum):
    txt = "txt"
    srt = "srt"
    vtt = "vtt"
    json = "json"
    jsonl = "jsonl"


def _clock(seconds: float, sep: str) -> str:
    ms = int(round(seconds * 1000))
    return f"{ms // 3600000:02d}:{ms // 60000 % 60:02d}:{ms // 1000 % 60:02d}{sep}{ms % 1000:03d}"


def render(t, fmt: Format) -> str:
    """One transcript in one format (text ends with a newline)."""
    if fmt is Format.txt:
        return t.text + "\n"
    if fmt is Format.srt:
        return "".join(f"{i}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text}\n\n"
                       for i, s in enumerate(t.segments, 1))
    if fmt is Format.vtt:
        return "WEBVTT\n\n" + "".join(f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.text}\n\n"
                                      for s in t.segments)
    doc = {"file": t.source, "text": t.text, "language": t.language, "duration": t.duration,
           "segments": [{"start": s.start, "end": s.end, "text": s.text} for s in t.segments],
           "device_requested": t.device_requested, "device_effective": t.device_effective}
    return json.dumps(doc, ensure_ascii=False, indent=None if fmt is Format.jsonl else 1) + "\n"


def _load(model: str, device: str | None, options):
    from pipelines.asr import Transcriber
    return Transcriber(model, device=device, options=options)


@app.command("transcribe")
@command
def transcribe(
    inputs: Annotated[list[Path], typer.Argument(
        help="audio files (wav, flac, ogg; mp3 where libsndfile can) and folders (their audio files, sorted)")],
    model: Annotated[str, typer.Option("--model", help="model name, HF repo id or folder")] = "whisper-tiny.en",
    fmt: Annotated[Format, typer.Option("--format", "-f", help=(
        "output format; json: on stdout one JSON array (one object per file); jsonl: one object per line; "
        "srt/vtt on stdout take one file (use -o for several)"))] = Format.txt,
    json_lines: Annotated[bool, typer.Option("--json", help="JSON lines: the same as --format jsonl")] = False,
    output_dir: Annotated[Optional[Path], typer.Option("--output", "-o", help=(
        "a folder (created when missing): FILE.<format> per input instead of stdout (existing files are replaced; "
        "two inputs with the same name are refused before any work)"))] = None,
    old_output_dir: Annotated[Optional[Path], typer.Option("--output-dir", hidden=True)] = None,
    language: Annotated[Optional[str], typer.Option("--language", help="e.g. en, de; default: detect")] = None,
    task: Annotated[str, typer.Option("--task", help="transcribe or translate (to English)")] = "transcribe",
    device: DeviceOpt = None,
    ray: Annotated[Optional[str], typer.Option("--ray", help="run on a Ray cluster: auto (the running one, else a local one) or HOST:PORT; needs -o DIR")] = None,
    max_errors: Annotated[int, typer.Option("--max-errors", help="with --ray: bad inputs to skip (listed) before the job fails")] = 0,
    precision: PrecisionOpt = "fp32",
):
    """Transcribe audio files (Whisper tiny.en by default, offline; Parakeet and GigaAM with --model).
    An unreadable file is reported on stderr and skipped; the exit code is then 1."""
    from pipelines.asr import TranscribeOptions
    from pipelines.audio import check_audio_path

    options = TranscribeOptions(language=language, task=task, precision=precision)  # bad options: before any work
    if old_output_dir is not None:
        err("note: --output-dir is deprecated: use -o/--output")
        output_dir = output_dir or old_output_dir
    if json_lines:
        fmt = Format.jsonl
    if ray is not None and output_dir is None:
        raise UsageError("--ray writes one transcript per file", fix="pass -o DIR")
    if output_dir is not None:
        if output_dir.exists() and not output_dir.is_dir():
            raise UsageError(f"-o {output_dir} is a file; transcripts are written one per input into a folder",
                             fix="pass a folder (it is created when missing)")
    files, failed_inputs = _expand(inputs)
    if output_dir is None and fmt in (Format.srt, Format.vtt) and len(files) > 1:
        raise UsageError(f"{len(files)} inputs as {fmt.value} on stdout would not be one valid {fmt.value} file",
                         fix=f"pass -o DIR for one .{fmt.value} per input, or use --format txt, json or jsonl")
    usable = []
    for path in files:  # before the model loads (seconds): a run with no file to read ends at once
        try:
            check_audio_path(path)
            usable.append(path)
        except InputError as e:
            report_error(e)
    if not usable:
        raise typer.Exit(1)
    if output_dir is not None:  # made once every check passed: a refused run leaves no empty folder
        _check_targets(usable, output_dir, fmt)
        make_folder(output_dir, "-o")
    if ray is not None:
        from pipelines.batch import ClusterOptions, transcribe as transcribe_on_ray
        report = transcribe_on_ray(usable, output_dir, lambda p: _target(output_dir, p, fmt), lambda t: render(t, fmt),
                                   model=model, options=options,
                                   device=device, cluster=ClusterOptions(address=ray, max_errors=max_errors))
        err(f"wrote transcripts to {output_dir}: {report.summary()}")
        if failed_inputs or len(files) > len(usable):
            raise typer.Exit(1)
        return
    transcriber = _load(model, device, options)
    array = fmt is Format.json and output_dir is None   # stdout stays one JSON document
    headers = fmt is Format.txt and output_dir is None and len(files) > 1
    failed, printed = failed_inputs + len(files) - len(usable), 0
    seconds = {path: _duration(path) for path in usable}
    with progress("transcribing", total=sum(seconds.values()), unit="s", enabled=fmt is not Format.jsonl) as update:
        done = 0.0
        for path in usable:
            try:
                result = transcriber.transcribe(path, on_progress=lambda s, base=done: update(base + s))
            except InputError as e:
                report_error(e)
                failed += 1
                continue
            finally:
                done += seconds[path]
                update(done)
            failed, printed = _deliver(result, path, fmt, output_dir, array, headers, failed, printed)
    if array:
        print("]" if printed else "[]", flush=True)
    if failed:
        raise typer.Exit(1)


def _duration(path: Path) -> float:
    """Seconds of audio in a file, from its header (0 when the header does not say)."""
    import soundfile
    try:
        info = soundfile.info(str(path))
        return info.frames / info.samplerate if info.frames > 0 else 0.0
    except (RuntimeError, OSError):
        return 0.0


def _deliver(result, path: Path, fmt: Format, output_dir: Path | None, array: bool, headers: bool, failed: int,
             printed: int) -> tuple[int, int]:
    """One transcript to stdout or to its file in -o DIR; (failed, printed) counted on."""
    text = render(result, fmt)
    if output_dir is None:
        if array:
            text = ("," if printed else "[") + text
        elif headers:
            text = f"{'' if not printed else chr(10)}==> {path} <==\n" + text
        print(text, end="", flush=True)
        return failed, printed + 1
    target = _target(output_dir, path, fmt)
    try:
        write_atomic(target, text)  # a failed write leaves an existing transcript whole
    except OSError as e:  # the transcript is not lost: it goes to stdout instead
        err(f"error: cannot write {target}: {e.strerror or e}; its transcript follows on stdout\n"
            f"  fix: check the permissions and free space of the -o directory")
        print(text, end="", flush=True)
        return failed + 1, printed
    err(f"wrote {target} ({result.duration:.1f} s of audio, device {result.device_effective})")
    return failed, printed


AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aiff", ".aif", ".aifc", ".caf", ".w64")


def _expand(inputs: list[Path]) -> tuple[list[Path], int]:
    """The files to transcribe: each file as given, each folder's audio files (recursively, sorted); (files,
    number of inputs reported and skipped: a folder without audio)."""
    files, skipped = [], 0
    for path in inputs:
        if not path.is_dir():
            files.append(path)
            continue
        found = sorted(p for p in path.rglob("*") if p.suffix.lower() in AUDIO_SUFFIXES and p.is_file())
        if not found:
            report_error(InputError(f"{path} is a folder with no audio files ({', '.join(AUDIO_SUFFIXES[:4])}, ...)",
                                    fix="pass audio files, or folders that hold them"))
            skipped += 1
        files += found
    return files, skipped


def _target(output_dir: Path, path: Path, fmt: Format) -> Path:
    return output_dir / f"{path.stem}.{fmt.value}"


def _check_targets(files: list[Path], output_dir: Path, fmt: Format) -> None:
    """Refuse, before any work, outputs that would overwrite each other or cannot be files."""
    seen: dict[Path, Path] = {}
    for path in files:
        target = _target(output_dir, path, fmt)
        other = seen.setdefault(target, path)
        if other.resolve() != path.resolve():
            raise UsageError(f"{other} and {path} would both be written to {target}",
                             fix="rename one, or transcribe them in separate runs with different -o directories")
        if target.is_dir():
            raise UsageError(f"cannot write {target}: it is a folder", fix="move it away, or pass another -o directory")
