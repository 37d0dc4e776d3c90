"""Draft verification for Whisper's greedy decoding: the tokens of an earlier decode of nearly the same audio (a
live utterance's last partial) checked in ONE decoder pass instead of one step each.

The pass (`decode_{n}`, sdk/models/whisper.py DRAFT_PASSES) feeds prompt + draft from position 0 and returns the
logits after every input. Greedy's choice after each prefix is made on the host with decode_greedy's own filters
(the recognizer's `choose`); while it equals the draft's next token the draft token is accepted. The first choice
that differs (or the one after the whole draft) is greedy's own next token, so the decode continues from there with
ordinary steps, and the result is the plain greedy decode's token for token. The pass also wrote the KV cache rows
of every accepted token; rows past them are overwritten by the steps that follow.

A forced prefix (a continued dictation utterance's emitted tokens) goes before the draft: it is fed as already
decoded, never checked, in passes at positions 0, n, 2n... when it is longer than one pass.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np


PICK_UP_NGRAM = 2  # the decode's last tokens that must be found in the draft for it to be verified again from there
PICK_UP_REST = 4   # the fewest draft tokens after that place worth a pass


@dataclass(frozen=True)
class Verified:
    choices: list[int]            # greedy's first choices: the accepted draft, then one token of its own
    logprobs: list[float]         # the log-prob of each choice
    no_speech_logits: np.ndarray | None  # the logits after <|startoftranscript|> (position 0), for the no-speech prob


def pass_length(passes: Sequence[int], inputs: int) -> int:
    """The shortest pass that holds `inputs` tokens, else the longest (the draft is cut to fit)."""
    return min((n for n in passes if n >= inputs), default=max(passes))


def verify(run_pass: Callable[[np.ndarray, int], np.ndarray], passes: Sequence[int], prompt: list[int],
           draft: Sequence[int], limit: int, pad: int,
           choose: Callable[[np.ndarray, list[int]], tuple[int, float]], forced: Sequence[int] = (),
           cached: int = 0) -> Verified:
    """Passes over prompt + forced + draft (the draft cut to what the last pass holds); `run_pass(tokens [1, n],
    pos)` -> logits [n, vocab]; `choose(logits, sampled so far)` is greedy's filtered pick (sampled: forced + the
    choices). At most `limit` choices (the decode's token limit); the forced tokens are not choices. `cached`: the
    positions whose KV rows the cache already holds (a draft picked up again mid-decode), which are not fed again;
    then no_speech_logits is None."""
    head, longest, start, no_speech = list(prompt) + list(forced), max(passes), cached, None
    while len(head) - start > longest:   # a head longer than a pass: whole passes first, their logits unread
        logits = run_pass(np.array([head[start:start + longest]], np.int32), start)
        no_speech = logits[0] if no_speech is None and cached == 0 else no_speech
        start += longest
    n = pass_length(passes, len(head) - start + len(draft))
    draft = list(draft[:n - (len(head) - start)])
    inputs = np.full((1, n), pad, np.int32)  # the pad's rows are never read: the mask is causal
    inputs[0, :len(head) - start + len(draft)] = head[start:] + draft
    logits = run_pass(inputs, start)
    no_speech = logits[0] if no_speech is None and cached == 0 else no_speech
    choices, logprobs = [], []
    for j in range(min(len(draft) + 1, limit)):
        token, logprob = choose(logits[len(head) - start - 1 + j], list(forced) + choices)
        choices.append(token)
        logprobs.append(logprob)
        if j == len(draft) or token != draft[j]:
            break
    return Verified(choices, logprobs, no_speech)


def picked_up(new: Sequence[int], draft: Sequence[int], after: int) -> int | None:
    """Where a draft that greedy left picks up again (prompt-lookup decoding): the index in `draft` just past the
    first place, at or after `after`, where it holds the decode's last PICK_UP_NGRAM tokens, if at least
    PICK_UP_REST draft tokens follow there (a pass costs a few steps). A model that reads one word otherwise than
    the draft ("Coldhearted" for "cold-hearted") most often reads the words after it the same."""
    tail = list(new[-PICK_UP_NGRAM:])
    if len(tail) < PICK_UP_NGRAM:
        return None
    for i in range(max(after, PICK_UP_NGRAM), len(draft) - PICK_UP_REST + 1):
        if list(draft[i - PICK_UP_NGRAM:i]) == tail:
            return i
    return None
