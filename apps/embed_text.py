"""`aie-apps embed-text`: sentence embeddings from arguments, a file (one text per line) or stdin."""
from __future__ import annotations

import json as jsonlib
import sys
from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import typer

from sdk.atomic import atomic_open
from sdk.errors import InputError, UsageError

from .cli import DeviceOpt, app, byte_size, command, err, make_folder, utf8_argument
from .progress import progress

PROGRESS_EVERY = 256   # lines embedded between two moves of the progress bar


@app.command("embed-text")
@command
def embed_text(
    texts: Annotated[Optional[list[str]], typer.Argument(help="texts to embed; none = read lines from --file or stdin")] = None,
    file: Annotated[Optional[Path], typer.Option("--file", help="read one text per line from this file")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="write a .npy matrix here instead of JSON lines on stdout")] = None,
    model: Annotated[str, typer.Option("--model", help="model name or folder")] = "all-MiniLM-L6-v2",
    max_line_size: Annotated[Optional[int], typer.Option(
        "--max-line-size", parser=byte_size, metavar="SIZE",
        help="refuse a line longer than this (bytes; K, M, G suffixes; default 1M)")] = None,
    max_input_size: Annotated[Optional[int], typer.Option(
        "--max-input-size", parser=byte_size, metavar="SIZE",
        help="refuse --file or stdin input larger than this (bytes; K, M, G suffixes; default 256M)")] = None,
    ray: Annotated[Optional[str], typer.Option("--ray", help="run on a Ray cluster: auto (the running one, else a local one) or HOST:PORT; needs -o")] = None,
    max_errors: Annotated[int, typer.Option("--max-errors", help="with --ray: bad inputs to skip (listed) before the job fails")] = 0,
    device: DeviceOpt = None,
):
    """Embed texts with a BERT-family sentence encoder (mean pooling, L2-normalised)."""
    from pipelines.text import MAX_INPUT_BYTES, MAX_LINE_BYTES, TextEmbedder, read_lines

    limits = {"max_line_bytes": max_line_size or MAX_LINE_BYTES, "max_bytes": max_input_size or MAX_INPUT_BYTES}

    if texts and file:
        raise UsageError("give texts as arguments or --file, not both")
    if ray is not None and output is None:
        raise UsageError("--ray writes its results to a file", fix="pass -o vectors.npy")
    if output is not None:  # before reading input and loading the model: a bad path must not cost the work
        if output.suffix != ".npy":
            raise UsageError(f"--output must end in .npy, got {output.name}", fix="e.g. -o vectors.npy")
        if output.parent.exists() and not output.parent.is_dir():
            raise UsageError(f"--output {output}: {output.parent} is not a folder", fix="pass a path in a folder")
        make_folder(output.parent, "--output")   # -o creates its folder, as in every command
        if output.is_dir():
            raise UsageError(f"--output {output} is a folder", fix="pass a file path ending in .npy")
    if file is not None:
        try:
            with open(file, "rb") as f:
                texts = read_lines(f, str(file), **limits)
        except OSError as e:
            raise InputError(f"cannot read {file}: {e.strerror or e}",
                             fix="pass a UTF-8 text file with one text per line") from None
    elif not texts:
        if sys.stdin.isatty():
            raise UsageError("no texts given", fix='pass texts as arguments, --file FILE, or pipe lines to stdin')
        texts = read_lines(sys.stdin.buffer, "stdin", **limits)  # bytes, decoded strictly, split at "\n" only
    else:
        for i, text in enumerate(texts, 1):
            utf8_argument(text, f"text argument {i}", fix="pass UTF-8 text")
    if ray is not None:
        from pipelines.batch import ClusterOptions, embed_texts
        report = embed_texts(texts, output, model=model, device=device,
                             cluster=ClusterOptions(address=ray, max_errors=max_errors))
        err(f"wrote {len(texts)} embeddings to {output}: {report.summary()}")
        return
    with TextEmbedder(model, device=device) as embedder, \
            progress("embedding", total=len(texts), unit="lines") as update:
        chunks = []
        for start in range(0, len(texts), PROGRESS_EVERY):   # the bar moves per chunk; results are the same
            chunks.append(embedder.embed(list(texts[start:start + PROGRESS_EVERY])))
            update(start + len(chunks[-1]))
        vectors = np.concatenate(chunks)
        report = embedder.report()
    if output is not None:
        try:
            with atomic_open(output, "wb") as f:  # a failed write leaves an existing file whole
                np.save(f, vectors)
        except OSError as e:  # the vectors are not lost: they go to stdout instead
            err(f"error: cannot write {output}: {e.strerror or e}; the embeddings follow on stdout as JSON lines\n"
                f"  fix: check the permissions and free space of {output.parent}")
            _print_jsonl(texts, vectors, report)
            raise typer.Exit(1) from None
        err(f"wrote {vectors.shape[0]}x{vectors.shape[1]} embeddings to {output} (device {report['device_effective']})")
        return
    _print_jsonl(texts, vectors, report)


def _print_jsonl(texts, vectors, report) -> None:
    for text, vec in zip(texts, vectors):
        print(jsonlib.dumps({"text": text, "embedding": [round(float(x), 7) for x in vec],
                             "model": report["model"], "device": report["device_effective"]}))
