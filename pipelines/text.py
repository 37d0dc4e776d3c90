"""Sentence embeddings with BERT-family encoders: mean pooling over real tokens, then L2 normalisation.

    from sdk import TextEmbedder
    vectors = TextEmbedder().embed(["A man is eating food.", "A man is eating a piece of bread."])

Static shapes: sentences are sorted by length and run in batches padded to a length bucket; padding is
masked inside attention and excluded from pooling, so a sentence's vector does not depend on its batch.
"""
from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from sdk import hub
from sdk.errors import InputError, UsageError, WeightError
from sdk.models import bert
from sdk.session import Session
from sdk.vocab import read_tokenizer
from sdk.weights import read_config

DEFAULT_MODEL = "all-MiniLM-L6-v2"
# Bounds for text read from files and pipes (a line longer than this is far past the 512 tokens an encoder
# sees; /dev/zero or `yes` must end in an error, not in the OOM killer). Both are parameters of read_lines
# (`embed-text --max-line-size / --max-input-size`).
MAX_LINE_BYTES = 1 << 20
MAX_INPUT_BYTES = 256 << 20


def read_lines(stream: BinaryIO, where: str, *, max_line_bytes: int = MAX_LINE_BYTES,
               max_bytes: int = MAX_INPUT_BYTES) -> list[str]:
    """One text per line of a binary stream: lines end at b"\n" only (a final "\r" is dropped, so CRLF
    files work; U+2028 and other Unicode breaks stay inside their line), each decoded as strict UTF-8 (a byte-order
    mark before the first line, as Windows editors write, marks the encoding and is not part of the text). A
    blank line, an over-long line or an over-long input is an InputError naming the line: the rows of the
    result are exactly the lines of the input, or there is no result."""
    lines: list[str] = []
    total, number, blank = 0, 0, []
    while True:
        raw = stream.readline(max_line_bytes + 2)  # + "\r\n"
        if not raw:
            break
        number += 1
        total += len(raw)
        if total > max_bytes:
            raise InputError(f"{where} holds more than {max_bytes:,} bytes of text",
                             fix="split the input into smaller files and embed them one by one, or raise the limit: "
                                 "`embed-text --max-input-size 1G` (read_lines(max_bytes=) in the SDK)")
        body = raw[:-1] if raw.endswith(b"\n") else raw
        body = body[:-1] if body.endswith(b"\r") else body
        body = body.removeprefix(b"\xef\xbb\xbf") if number == 1 else body
        if len(body) > max_line_bytes:
            raise InputError(f"line {number} of {where} is longer than {max_line_bytes:,} bytes",
                             fix="one text per line: is this a binary file, or text without line breaks? (a longer line: "
                                 "`embed-text --max-line-size 4M`, read_lines(max_line_bytes=) in the SDK)")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"line {number} of {where} is not UTF-8 text ({e.reason} at byte {e.start})",
                             fix="convert the input to UTF-8 (e.g. with iconv)") from None
        if not text.strip():
            blank.append(number)
        lines.append(text)
    if len(blank) == len(lines):
        raise InputError(f"no texts to embed in {where}", fix="give at least one line (one text per line)")
    if blank:
        shown = ", ".join(map(str, blank[:10])) + (f", ... ({len(blank)} in all)" if len(blank) > 10 else "")
        raise InputError(f"{where} has blank lines ({shown}); every line is one text and gets one row",
                         fix="remove the blank lines first, e.g. `grep -v '^[[:space:]]*$'`")
    return lines


@dataclass(frozen=True)
class TextOptions:
    max_length: int = 256            # tokens, [CLS] and [SEP] included; longer input is truncated (warned)
    batch_size: int = 8
    buckets: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
    normalize: bool = True

    def __post_init__(self):
        if self.batch_size < 1 or self.max_length < 3:
            raise UsageError(f"batch_size ({self.batch_size}) must be at least 1 and max_length ({self.max_length}) "
                             f"at least 3", fix="max_length counts [CLS] and [SEP], so 3 leaves room for one token")


def program_graphs(cfg: bert.Config, options: TextOptions = TextOptions()) -> list:
    """The graphs a TextEmbedder with these options runs (its one session): what `aie-apps build` compiles."""
    return bert.program_graphs(cfg, options.batch_size, options.max_length, options.buckets)


class TextEmbedder:
    def __init__(self, model: str = DEFAULT_MODEL, *, device: str | None = None, options: TextOptions = TextOptions()):
        self.source = hub.resolve(model)
        model_type = read_config(self.source.path).get("model_type")
        if model_type not in (None, "bert"):
            raise UsageError(f"{self.source.path} holds a {model_type!r} model, not a BERT-family text encoder",
                             fix="pass a BERT, MiniLM or BGE model (e.g. all-MiniLM-L6-v2 or a folder with its files)")
        self.options = options
        self.cfg, weights = bert.load(self.source.path)
        tokenizer_file = Path(self.source.path) / "tokenizer.json"
        if not tokenizer_file.exists():
            raise WeightError(f"no tokenizer.json in {self.source.path}", fix="use a folder with tokenizer.json")
        self.tokenizer = read_tokenizer(tokenizer_file, encodes_any_text=True)
        self.buckets = bert.length_buckets(self.cfg, options.max_length, options.buckets)
        self.max_length = self.buckets[-1]
        self.session = Session(program_graphs(self.cfg, options), weights, device=device)
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        return self.cfg.hidden_size

    def report(self) -> dict:
        return {"model": self.source.name, "model_path": str(self.source.path), **self.session.report()}

    def embed(self, texts: list[str] | str) -> np.ndarray:
        """[n, dim] float32 (unit vectors when options.normalize). A single string gives [dim]."""
        if isinstance(texts, str):
            return self.embed([texts])[0]
        if not isinstance(texts, (list, tuple)):  # not any iterable: a dict would give its keys
            raise UsageError(f"embed() takes a string or a list of strings, got {type(texts).__name__}",
                             fix="pass a list of str (list(...) turns a generator or an array into one)")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise UsageError(f"text {i} is a {type(t).__name__}, not a str",
                                 fix="decode bytes and convert other values with str() first")
            try:
                t.encode("utf-8")  # the tokenizer takes only encodable text (no lone surrogates)
            except UnicodeEncodeError as e:
                raise InputError(f"text {i} is not valid Unicode: {e.reason} at character {e.start}",
                                 fix="decode the source with errors='replace', or drop those characters") from None
        out = np.zeros((len(texts), self.dim), np.float32)
        if not texts:
            return out
        encodings = self.tokenizer.encode_batch(list(texts))
        ids = [e.ids for e in encodings]
        if any(len(i) > self.max_length for i in ids):
            warnings.warn(f"some texts exceed {self.max_length} tokens and were truncated", stacklevel=2)
            ids = [i[:self.max_length - 1] + i[-1:] if len(i) > self.max_length else i for i in ids]
        order = sorted(range(len(ids)), key=lambda k: len(ids[k]))
        step = self.options.batch_size
        for start in range(0, len(order), step):
            chunk = order[start:start + step]
            with self._lock:  # an embedder may be shared by threads; its session runs one batch at a time
                out[chunk] = self._embed_batch([ids[k] for k in chunk])
        return out

    def _embed_batch(self, ids: list[list[int]]) -> np.ndarray:
        length = next(b for b in self.buckets if b >= max(len(i) for i in ids))
        batch = 1 if len(ids) == 1 else self.options.batch_size
        tokens = np.full((batch, length), self.cfg.pad_token_id, np.int32)
        mask = np.zeros((batch, length), np.float32)
        for row, seq in enumerate(ids):
            tokens[row, :len(seq)] = seq
            mask[row, :len(seq)] = 1.0
        hidden = self.session.run(bert.entry(batch, length), ids=tokens, token_types=np.zeros_like(tokens),
                                  mask=mask)["hidden"][:len(ids)]
        m = mask[:len(ids), :, None]
        pooled = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1.0)
        if not self.options.normalize:
            return pooled
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        if not np.all(np.isfinite(norms)):
            raise InputError("the encoder produced non-finite values", fix="report this with the input text")
        return pooled / np.maximum(norms, 1e-12)

    def close(self):
        self.session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
