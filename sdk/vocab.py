"""Checked readers for the vocabulary files of a model folder: tokenizer.json (through `tokenizers`) and the
one-token-per-line lists (CTranslate2's vocabulary.txt, ESM's vocab.txt). A damaged file is a WeightError
that names it, never a library's own exception, and no file is read past MODEL_FILE_LIMIT."""
from __future__ import annotations

from pathlib import Path

from .errors import WeightError
from .weights import read_model_file


def read_tokenizer(path: str | Path, *, encodes_any_text: bool = False):
    """A `tokenizers.Tokenizer` from a tokenizer.json, padding and truncation off (callers bucket lengths).
    `encodes_any_text`: the caller encodes user text, so the tokenizer must encode any text (an ASR decoder's
    vocabulary need not, and may have no unknown token)."""
    from tokenizers import Tokenizer
    path = Path(path)
    raw = read_model_file(path, what="tokenizer.json")
    try:
        tokenizer = Tokenizer.from_str(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise WeightError(f"{path} is not UTF-8 text (byte {e.start})",
                          fix="restore tokenizer.json from the model's source") from None
    except Exception as e:  # tokenizers raises plain Exception for every malformed document
        reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise WeightError(f"{path} is not a valid tokenizer.json: {reason}",
                          fix="restore tokenizer.json from the model's source") from None
    tokenizer.no_padding()
    tokenizer.no_truncation()
    try:  # some damage shows only when text is encoded (a WordPiece model without its [UNK] token)
        if encodes_any_text:
            tokenizer.encode("a \u2603 1")
    except Exception as e:
        raise WeightError(f"{path} cannot encode text: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}",
                          fix="restore tokenizer.json from the model's source") from None
    return tokenizer


def read_vocabulary(path: str | Path) -> list[str]:
    """The tokens of a one-token-per-line file, in id order (a final newline ends the last token)."""
    path = Path(path)
    raw = read_model_file(path, what="vocabulary")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise WeightError(f"{path} is not UTF-8 text (line {line})",
                          fix="restore the vocabulary file from the model's source") from None
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines
