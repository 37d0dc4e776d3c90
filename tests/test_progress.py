"""Progress bars: drawn on stderr when it is a terminal, nothing on a pipe or when the command prints JSON."""
from __future__ import annotations

import io
import sys

from apps.progress import progress


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_gets_a_bar_with_done_total_and_unit(monkeypatch):
    monkeypatch.setattr(sys, "stderr", _Terminal())
    with progress("transcribing", total=120, unit="s") as update:
        update(30)
        update(60)
    assert "transcribing" in sys.stderr.getvalue() and "/120 s" in sys.stderr.getvalue()


def test_a_pipe_or_json_gets_nothing(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with progress("embedding", total=10, unit="records") as update:
        update(5)
    monkeypatch.setattr(sys, "stderr", _Terminal())
    with progress("embedding", total=10, unit="records", enabled=False) as update:
        update(5)
    assert sys.stderr.getvalue() == ""
