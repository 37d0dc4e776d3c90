"""Typing text into the focused window and using the clipboard, through the desktop's own tools (xdotool,
wtype, ydotool, dotool; wl-copy, xclip, xsel): which one a session has, and what each needs when it fails."""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile

from sdk import settings as sdk_settings
from sdk.errors import DeviceIOError, UsageError

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


def run_tool(argv: list[str], *, stdin: str | None = None) -> None:
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


def one_line(text: str) -> str:
    """Dictation never presses Enter: line breaks (typed, or inside pasted text) become spaces."""
    return re.sub(r"[\r\n\t\v\f]+", " ", text)


def type_text(text: str, tool: str) -> None:
    """Type text into the focused window (never an Enter)."""
    text = one_line(text)
    if not text.strip():
        return
    if tool == "dotool":
        run_tool(["dotool"], stdin=f"type {text}\n")
    else:
        run_tool(TYPERS[tool](text))


def clipboard_tools(session: str) -> tuple[list[str], list[str]]:
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
