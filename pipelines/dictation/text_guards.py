"""Text checks against Whisper's failure modes (loops, empty or degenerate output) and the word matching that
finds where two decodes agree or where a decode re-transcribes the last final."""
from __future__ import annotations

import re
import zlib
from difflib import SequenceMatcher
from typing import Callable

_WORD = re.compile(r"[\w']+")


def norm_word(word: str) -> str:
    return "".join(_WORD.findall(word.lower()))


def collapse_repeats(words: list[str], *, max_ngram: int = 6) -> list[str]:
    """Whisper loops ("the the the the", "thank you. thank you. thank you."): keep one copy of any n-gram
    repeated back to back 3+ times (4+ for single words, which people do say twice or thrice)."""
    out = list(words)
    for n in range(1, max_ngram + 1):
        limit = 4 if n == 1 else 3
        i = 0
        while i + n <= len(out):
            gram = [norm_word(w) for w in out[i:i + n]]
            reps = 1
            while [norm_word(w) for w in out[i + reps * n:i + (reps + 1) * n]] == gram:
                reps += 1
            if reps >= limit:
                del out[i + n:i + reps * n]
            i += 1
    return out


def looks_like_text(text: str) -> bool:
    return any(ch.isalnum() for ch in text)


def too_compressible(text: str) -> bool:
    """The compression-ratio test Whisper itself uses for degenerate output (ratio > 2.4)."""
    raw = text.encode()
    return len(raw) > 40 and len(raw) / len(zlib.compress(raw)) > 2.4


def edit_distance(a: list[str], b: list[str], same: Callable[[str, str], bool] = str.__eq__) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row[0] = row[:], i
        for j, y in enumerate(b, 1):
            row[j] = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (not same(x, y)))
    return row[-1]


def similar_words(a: str, b: str) -> bool:
    """One word heard twice: equal, or spelt alike (tiny models re-transcribe "ill-disposed" as "old-sposed")."""
    return a == b or (min(len(a), len(b)) >= 4 and SequenceMatcher(None, a, b).ratio() >= 0.6)


def overlap_words(before: list[str], after: list[str], *, most: int = 40) -> int:
    """How many leading words of `after` re-transcribe the end of `before`: the longest k whose first k
    words end with (a spelling like) the last word of `before` and match some tail of it with at most k // 4
    word errors."""
    b = [norm_word(w) for w in before[-most:]]
    a = [norm_word(w) for w in after[:most]]
    if not a or not b:
        return 0
    for k in range(min(len(a), len(b) + 3), 0, -1):
        if not similar_words(a[k - 1], b[-1]):
            continue
        allowed = k // 4
        for m in range(max(1, k - allowed), min(len(b), k + allowed) + 1):
            if edit_distance(a[:k], b[-m:], same=similar_words) <= allowed:
                return k
    return 0


def agreed_words(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b):
        if norm_word(x) != norm_word(y):
            break
        n += 1
    return n
