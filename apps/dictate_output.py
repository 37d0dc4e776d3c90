"""Where dictated text goes: stdout (a live partial line on a TTY), JSON lines, typed into the focused window,
pasted, or on the clipboard. When typing or the clipboard fails, nothing said is lost: it goes to stdout."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from enum import Enum

from sdk import settings as sdk_settings
from sdk.errors import SdkError, UsageError

from .cli import err
from .desktop_typing import choose_typer, clipboard_tools, one_line, paste_keys, run_tool, type_text


class Output(str, Enum):
    stdout = "stdout"
    jsonl = "jsonl"
    type = "type"
    paste = "paste"
    clipboard = "clipboard"


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
        self.clip = clipboard_tools(self.session) if output in (Output.paste, Output.clipboard) else None
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
            run_tool(self.clip[0], stdin=" ".join(self.finals))

    def _paste(self, text: str):
        """Clipboard <- text, press the paste keys, then give the clipboard back what it held (if it held text)."""
        copy, read_back = self.clip
        try:
            held = subprocess.run(read_back, capture_output=True, text=True, timeout=5)
            previous = held.stdout if held.returncode == 0 else None   # an empty clipboard is not restored as ""
        except (OSError, subprocess.TimeoutExpired):
            previous = None
        run_tool(copy, stdin=one_line(text))
        argv, stdin = self.paste_keys
        try:
            run_tool(argv, stdin=stdin)
        finally:  # also when the keys fail: what the user had copied is theirs, not ours to replace
            if previous is not None:
                time.sleep(0.2)  # let the target read the clipboard before it is restored
                run_tool(copy, stdin=previous)

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
