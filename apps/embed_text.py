"""`aie-apps embed-text`: sentence embeddings from arguments, a file (one text per line) or stdin."""
from __future__ import annotations

import json as jsonlib
import sys
from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import typer

from sdk.errors import InputError, UsageError

from .cli import DeviceOpt, app, command, err


@app.command("embed-text")
@command
def embed_text(
    texts: Annotated[Optional[list[str]], typer.Argument(help="texts to embed; none = read lines from --file or stdin")] = None,
    file: Annotated[Optional[Path], typer.Option("--file", "-f", help="read one text per line from this file")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="write a .npy matrix here instead of JSON lines on stdout")] = None,
    model: Annotated[str, typer.Option("--model", help="model name or folder")] = "all-MiniLM-L6-v2",
    device: DeviceOpt = None,
):
    """Embed texts with a BERT-family sentence encoder (mean pooling, L2-normalised)."""
    from pipelines.text import TextEmbedder

    if texts and file:
        raise UsageError("give texts as arguments or --file, not both")
    if file is not None:
        try:
            lines = file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"cannot read {file}: {e}", fix="pass a UTF-8 text file with one text per line") from None
        texts = [line for line in lines if line.strip()]
    elif not texts:
        if sys.stdin.isatty():
            raise UsageError("no texts given", fix='pass texts as arguments, --file FILE, or pipe lines to stdin')
        texts = [line.rstrip("\n") for line in sys.stdin if line.strip()]
    with TextEmbedder(model, device=device) as embedder:
        vectors = embedder.embed(list(texts))
        report = embedder.report()
    if output is not None:
        if output.suffix != ".npy":
            raise UsageError(f"--output must end in .npy, got {output.name}")
        np.save(output, vectors)
        err(f"wrote {vectors.shape[0]}x{vectors.shape[1]} embeddings to {output} (device {report['device_effective']})")
        return
    for text, vec in zip(texts, vectors):
        print(jsonlib.dumps({"text": text, "embedding": [round(float(x), 7) for x in vec],
                             "model": report["model"], "device": report["device_effective"]}))
