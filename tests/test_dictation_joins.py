"""No word is lost where utterances meet: the 5 LibriVox clips repeated five times as one long file (joined as
recorded, so most joins are the clips' own short pauses and long utterances are committed early), in real
time (the simulated clock) and as fast as possible; a pause cut to 0.3 s; speech from the first 50 ms."""
from __future__ import annotations

import math

import numpy as np
import pytest

from pipelines.dictation import DictationOptions, FileSource, Final, Stream
from tests.dictation_support import (RATE, alignment, clip_session, deleted_words, long_session, short_pause_session,
                                     wer)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def transcriber():
    from pipelines.asr import Transcriber
    return Transcriber("whisper-tiny.en")


def _lost_words(reference: str, finals: list[Final]) -> list[tuple[int, str]]:
    """Reference words missing from the finals: the deletions of a word alignment (a misread word is a
    substitution, counted by the WER bound, not here): [(index, word)]."""
    return deleted_words(reference, " ".join(f.text for f in finals))


def _dictate(transcriber, audio: np.ndarray, pace: str, options=DictationOptions(partials=False)) -> list[Final]:
    stream = Stream(transcriber, FileSource(audio, RATE, pace=pace), options)
    finals = [e for e in stream.start().events() if isinstance(e, Final)]
    assert stream.dropped_blocks == 0
    return finals


@pytest.mark.parametrize("pace", ["simulated", "fast"])
def test_no_word_is_lost_at_utterance_joins_over_a_long_file(transcriber, pace, record_property):
    audio, reference = long_session()
    assert 120 < len(audio) / RATE < 130
    finals = _dictate(transcriber, audio, pace)
    assert _lost_words(reference, finals) == [], [(round(f.start, 2), f.text) for f in finals]
    for a, b in zip(finals, finals[1:]):
        assert a.end <= b.start + 1e-6, "finals overlap in audio time"
    live_wer = wer(reference, " ".join(f.text for f in finals))
    record_property("live_wer", round(live_wer, 4))
    assert live_wer <= 0.03, live_wer


@pytest.mark.parametrize("pace", ["simulated", "fast"])
def test_a_short_pause_and_speech_in_the_first_50_ms_lose_nothing(transcriber, pace):
    audio, reference = short_pause_session()
    onset = np.flatnonzero(np.abs(audio) > 0.05)[0] / RATE
    assert onset <= 0.05
    finals = _dictate(transcriber, audio, pace)
    assert _lost_words(reference, finals) == [], [(round(f.start, 2), f.text) for f in finals]
    assert wer(reference, " ".join(f.text for f in finals)) <= 0.05, [f.text for f in finals]


@pytest.mark.parametrize("pace", ["simulated", "fast"])
def test_an_unsure_half_waits_at_a_comma_pause_and_sure_finals_come_before_the_hangover(transcriber, pace):
    """The short-pause file at the default options: "He was not an ill-disposed young man, | unless ..." pauses
    0.3 s between speech, and tiny.en is unsure of "ill-disposed" in the decode that heard the pause (heard alone
    it writes "old-sposed"), so nothing is final there: the utterance goes on and is decoded whole. The finals of
    utterances it was sure of go out before the hangover (fast pace: the clock is the audio consumed)."""
    audio, reference = short_pause_session()
    options = DictationOptions(partials=False)
    finals = _dictate(transcriber, audio, pace, options)
    said = [f.text.lower() for f in finals]
    assert any("young man, unless" in text or "young man unless" in text for text in said), said
    assert _lost_words(reference, finals) == [], said
    if pace == "fast":
        assert any(f.latency < options.hangover for f in finals), [(f.end, f.at) for f in finals]


@pytest.mark.parametrize("pace", ["simulated", "fast"])
def test_a_talker_who_resumes_after_an_emitted_final_continues_it_without_a_lost_or_repeated_word(transcriber, pace):
    """Three clips, the second and third 0.3 s apart between speech ("young man, | unless": the talker resumes
    0.35-0.4 s after the last word as the VAD hears it, within the hangover): the words before the pause are final
    at commit_quiet (whatever the model's confidence here, as the default would not emit them), the same utterance
    goes on, and the next final holds exactly the words after them."""
    audio, reference = clip_session([1.0, 0.3, 1.0], tight=(1,))
    options = DictationOptions(partials=True, commit_quiet=0.3, commit_logprob=-math.inf)
    finals = _dictate(transcriber, audio, pace, options)
    live = " ".join(f.text for f in finals)
    assert _lost_words(reference, finals) == [], [(round(f.start, 2), f.text) for f in finals]
    assert [j for i, j in alignment(reference, live) if i is None] == [], live   # no word twice
    # less quiet than the hangover between two finals: one utterance, continued after the first
    continued = [(a, b) for a, b in zip(finals, finals[1:]) if b.start - a.end < options.hangover]
    assert continued, [(f.start, f.end, f.at, f.text) for f in finals]
    if pace == "fast":   # the stream's clock is the audio consumed: the first went out before the talker resumed
        assert all(a.at < b.start for a, b in continued), [(f.start, f.end, f.at) for f in finals]
