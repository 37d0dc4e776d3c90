"""The typer app and what every command shares: the device option, error handling, JSON output.

Results go to stdout, everything else (progress, warnings, errors) to stderr. An SdkError becomes one
message on stderr and its documented exit code; Ctrl-C exits 130.
"""
from __future__ import annotations

import functools
import json
import re
import sys
import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer

from sdk.errors import InputError, SdkError, UsageError
from sdk.runtime import FallbackWarning

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Run models on the AMD Ryzen AI NPU (or the CPU where there is none).")


def _print_version(value: bool) -> None:
    if value:
        from sdk import __version__
        print(f"aie-apps {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                help="print the version and exit")] = False) -> None:
    """Run models on the AMD Ryzen AI NPU (or the CPU where there is none)."""

DeviceOpt = Annotated[Optional[str], typer.Option(
    "--device", help="auto | npu | emu | cpu (default: $AIE_APPS_DEVICE or auto; npu is strict)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")]
PrecisionOpt = Annotated[str, typer.Option(
    "--precision", help="cpu backend: fp32 (default) or int8 (int8 weights where the model's accuracy gate allows)")]


_SIZE_UNITS = {"": 0, "K": 10, "M": 20, "G": 30}


def byte_size(text) -> int:
    """The value of a `--max-*-size` input limit: bytes, or with a K, M or G suffix (powers of 1024): 300M, 2G."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+)\s*(?:([KMG])(?:i?B)?|B?)\s*", str(text), re.IGNORECASE)
    if not m or int(m.group(1)) == 0:
        raise typer.BadParameter(f"{text!r} is not a size", param_hint="a positive number of bytes, e.g. 300M or 2G")
    return int(m.group(1)) << _SIZE_UNITS[(m.group(2) or "").upper()]


def err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def report_error(e: SdkError) -> None:
    """A typed error as the CLI shows it: the message, then the fix."""
    err(f"error: {e.message}" + (f"\n  fix: {e.fix}" if e.fix else ""))


def make_folder(folder: Path, option: str) -> None:
    """Create an output's folder (and its parents) before any work; one that cannot be made is a UsageError."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{option}: cannot create the folder {e.filename or folder}: {e.strerror or e}",
                         fix=f"choose an {option} path you can write to") from None


def utf8_argument(text: str, what: str, fix: str) -> str:
    """`text` if it is valid UTF-8. A command-line argument that is not arrives with surrogates in place of its
    bytes, which the tokenizers reject with a TypeError: an InputError naming the argument instead."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{what} is not valid UTF-8", fix=fix) from None
    return text


def out_json(obj) -> None:
    print(json.dumps(obj, ensure_ascii=False, default=_jsonable))


def _jsonable(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "__fspath__"):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _show_warning(message, category, filename, lineno, file=None, line=None):
    label = "note" if issubclass(category, FallbackWarning) else "warning"
    err(f"{label}: {message}")


def command(fn):
    """Decorator for every command: typed errors -> stderr + exit code; warnings -> stderr, once."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        warnings.showwarning = _show_warning
        try:
            return fn(*args, **kwargs)
        except SdkError as e:
            report_error(e)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            err("interrupted")
            raise typer.Exit(130) from None
        except BrokenPipeError:
            raise typer.Exit(0) from None
    return wrapper
