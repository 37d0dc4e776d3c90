"""Whisper's tokenizer: tokenizer.json through `tokenizers`, plus the special ids decoding needs."""
from __future__ import annotations

from pathlib import Path

from sdk.errors import WeightError
from sdk.vocab import read_tokenizer, read_vocabulary


class WhisperTokenizer:
    """tokenizer.json through `tokenizers`, plus Whisper's special ids (timestamps from vocabulary.txt)."""

    def __init__(self, folder: Path, vocab_size: int):
        path = folder / "tokenizer.json"
        if not path.exists():
            raise WeightError(f"no tokenizer.json in {folder}", fix="use a complete Whisper model folder")
        self.tok = read_tokenizer(path)
        special = self.tok.token_to_id
        self.eot, self.sot = special("<|endoftext|>"), special("<|startoftranscript|>")
        self.translate, self.transcribe = special("<|translate|>"), special("<|transcribe|>")
        self.no_timestamps = special("<|notimestamps|>")
        if None in (self.eot, self.sot, self.translate, self.transcribe, self.no_timestamps):
            raise WeightError(f"{path} lacks Whisper's special tokens", fix="use the model's own tokenizer.json")
        self.no_speech = self.no_timestamps - 1  # <|nospeech|> (<|nocaptions|> in older vocabularies)
        self.sot_prev, self.sot_lm = special("<|startofprev|>"), special("<|startoflm|>")
        self.timestamp_begin = self.no_timestamps + 1
        vocabulary = folder / "vocabulary.txt"
        if vocabulary.exists():  # CTranslate2 folders: the timestamps live here, not in tokenizer.json
            lines = read_vocabulary(vocabulary)
            if len(lines) <= self.timestamp_begin or lines[self.timestamp_begin] != "<|0.00|>":
                raise WeightError(f"{vocabulary} does not have <|0.00|> at id {self.timestamp_begin}",
                                  fix="use the vocabulary.txt that came with the model")
        self.vocab_size = vocab_size
        self.multilingual = vocab_size >= 51865
        # language tokens sit between <|startoftranscript|> and <|translate|>
        self.languages = {self.tok.id_to_token(i)[2:-2]: i for i in range(self.sot + 1, self.translate)}

    def decode(self, tokens: list[int]) -> str:
        return self.tok.decode([t for t in tokens if t < self.eot])
