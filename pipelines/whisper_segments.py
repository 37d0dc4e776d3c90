"""Whisper's sampled tokens read as text: timed segments cut at timestamp pairs, how sure the model was of each
word, and a forced prefix cut back to its last word. Functions of a WhisperTokenizer and token lists only; the
recognizer (pipelines/whisper_asr.py) decodes, this reads what it decoded."""
from __future__ import annotations

import re
from typing import Sequence

from pipelines.transcript import Segment
from pipelines.whisper_tokenizer import WhisperTokenizer

TIME_PRECISION = 0.02  # seconds per timestamp token


def last_stamp(tok: WhisperTokenizer, tokens: Sequence[int]) -> float | None:
    """The seconds of the last timestamp token among `tokens`, None when there is none."""
    stamps = [t for t in tokens if t >= tok.timestamp_begin]
    return (stamps[-1] - tok.timestamp_begin) * TIME_PRECISION if stamps else None


def segments(tok: WhisperTokenizer, tokens: list[int], size: int, window_seconds: float, offset: float, *,
             timestamps: bool, keep_tail: bool, after: int = 0,
             logprobs: list[float] | None = None) -> tuple[list[Segment], int, list[list[float]]]:
    """Cut sampled tokens of a window of `size` mel frames (`window_seconds`) into timed segments at timestamp
    pairs; returns (segments, frames to advance, word log-probs). Only the text of tokens from index `after` on (a
    forced prefix's continuation) is kept: a segment the prefix ends inside keeps its times and the rest of its
    text. Given `logprobs` (of tokens[after:]), each segment's words get theirs (see word_logprobs); else the third
    value is []."""
    tb = tok.timestamp_begin
    pieces: list[tuple[Segment, int, int]] = []   # each segment and the tokens [from, to) of its text
    if not timestamps:
        pieces.append((Segment(offset, offset + window_seconds, tok.decode(tokens[after:])), after, len(tokens)))
        advance = size
    else:
        is_ts = [t >= tb for t in tokens]
        single_ending = is_ts[-2:] == [False, True]
        cuts = [i + 1 for i in range(len(tokens) - 1) if is_ts[i] and is_ts[i + 1]]
        if cuts:
            if (single_ending or keep_tail) and cuts[-1] < len(tokens):
                cuts.append(len(tokens))
            last = 0
            for cut in cuts:
                piece = tokens[last:cut]
                start = (piece[0] - tb) * TIME_PRECISION if piece and piece[0] >= tb else 0.0
                end = (piece[-1] - tb) * TIME_PRECISION if piece[-1] >= tb else window_seconds
                if cut > after:
                    text = tok.decode(tokens[max(last, after):cut])
                    pieces.append((Segment(round(offset + start, 3), round(offset + end, 3), text),
                                   max(last, after), cut))
                last = cut
            advance = size if single_ending or keep_tail else (tokens[last - 1] - tb) * 2  # 2 mel frames a token
        else:
            end = last_stamp(tok, tokens)
            end = end if end else window_seconds  # none, or only <|0.00|>: the segment runs to the window's end
            pieces.append((Segment(round(offset, 3), round(offset + end, 3), tok.decode(tokens[after:])),
                           after, len(tokens)))
            advance = size
    kept, sure = [], []
    for segment, a, b in pieces:
        text, dropped = segment.text.strip(), 0
        if a == after > 0:   # a continuation: punctuation where the emitted text has its own is nothing new
            lead = re.match(r"(?:[^\w\s]+(?:\s+|$))*", text).group()
            text, dropped = text[len(lead):], len(lead.split())
        if text and segment.end > segment.start:
            kept.append(Segment(segment.start, segment.end, text))
            if logprobs is not None:
                sure.append(word_logprobs(tok, tokens[a:b], logprobs[a - after:b - after])[dropped:])
    return kept, advance, sure


def to_last_word(tok: WhisperTokenizer, tokens: Sequence[int]) -> list[int]:
    """`tokens` up to their last word: without the timestamps and punctuation after it."""
    tokens = list(tokens)
    while tokens:
        text = tok.decode(tokens[-1:])
        if tokens[-1] < tok.timestamp_begin and ("\ufffd" in text or re.search(r"\w", text)):
            break
        tokens.pop()
    return tokens


def word_logprobs(tok: WhisperTokenizer, tokens: list[int], logprobs: list[float]) -> list[float]:
    """For each word of the tokens' text (split on whitespace, as text.split() does), the lowest log-prob of its
    tokens that hold a letter or digit (punctuation changes no word: a word of punctuation alone gets 0.0).
    Tokens are read in groups that decode to whole characters (a byte-level token may hold part of one)."""
    words: list[float] = []
    group, low, open_word = [], 0.0, False     # open_word: the last word may go on in the next group
    for token, logprob in zip(tokens, logprobs):
        if token >= tok.eot:                   # timestamps
            continue
        group.append(token)
        low = min(low, logprob)
        text = tok.decode(group)
        if "\ufffd" in text:                   # a character split across tokens: read on
            continue
        for k, word in enumerate(re.finditer(r"\S+", text)):
            sure = low if re.search(r"\w", word.group()) else 0.0
            if k == 0 and open_word and not text[0].isspace():
                words[-1] = min(words[-1], sure)
            else:
                words.append(sure)
        open_word = bool(words) and not text[-1:].isspace()
        group, low = [], 0.0
    return words
