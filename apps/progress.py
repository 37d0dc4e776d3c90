"""Progress on stderr for the long-running commands: a rich bar on a terminal, nothing on a pipe or with --json.

    with progress("transcribing", total=seconds, unit="s") as update:
        ...; update(done)                      # the amount done so far
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Iterator


@contextmanager
def progress(label: str, *, total: float | None, unit: str, enabled: bool = True) -> Iterator[Callable[[float], None]]:
    """Yield `update(done)`; a bar with done / total, rate and time left is drawn only when stderr is a terminal
    (and `enabled`: commands pass `not json`), and removed when the block ends."""
    if not (enabled and sys.stderr.isatty()):
        yield lambda done: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(),
                   TextColumn("{task.completed:,.0f}/{task.total:,.0f} " + unit),
                   TextColumn("{task.fields[rate]}"), TimeRemainingColumn(),
                   console=Console(stderr=True), transient=True)
    with bar:
        task = bar.add_task(label, total=total, rate="")

        def update(done: float) -> None:
            speed = bar.tasks[0].speed
            bar.update(task, completed=done, rate=f"{speed:,.1f} {unit}/s" if speed else "")
        yield update
