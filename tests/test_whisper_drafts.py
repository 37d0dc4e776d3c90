"""Draft verification (pipelines/whisper_drafts.py) on the real whisper-tiny.en: a decode given a draft gives plain
greedy's tokens, token for token, whatever the draft; and a dictation session's finals are the same with it."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pipelines import whisper_drafts
from pipelines.dictation import DictationOptions, FileSource, Final, Partial, Stream
from tests.dictation_support import LIBRIVOX, RATE, clip_session, librivox_clips, librivox_session

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (LIBRIVOX / "fileids").is_file(),
                                 reason="needs Debian's pocketsphinx-testdata (LibriVox clips)")]


@pytest.fixture(scope="module")
def transcriber():
    from pipelines.asr import Transcriber
    from sdk.errors import ModelNotFound
    try:
        return Transcriber("whisper-tiny.en", device="cpu")
    except ModelNotFound as e:
        pytest.skip(f"whisper-tiny.en weights are not installed: {e}")


@pytest.fixture()
def entries(transcriber):
    """The session entries each decode runs, in order (the list is emptied before every decode)."""
    session = transcriber.recognizer.session
    run, ran = session.run, []

    def counted(entry, state, **inputs):
        ran.append(entry)
        return run(entry, state, **inputs)
    session.run = counted
    yield ran
    session.run = run


def _clips(*indices: int) -> np.ndarray:
    import soundfile
    clips = librivox_clips()
    return np.concatenate([soundfile.read(str(clips[i][0]), dtype="float32")[0] for i in indices])


def _decode(transcriber, entries, audio, draft=()):
    entries.clear()
    segments = transcriber.decode_window(audio, draft=draft)
    return list(transcriber.last_tokens), [s.text for s in segments], list(entries)


def _passes(ran):
    return [e for e in ran if e.startswith("decode_") and not e.startswith(("decode_step", "decode_greedy"))]


def test_the_exact_tokens_as_draft_need_no_step_after_the_pass(transcriber, entries):
    audio = _clips(0)
    tokens, texts, _ = _decode(transcriber, entries, audio)
    drafted, drafted_texts, ran = _decode(transcriber, entries, audio, draft=tokens)
    assert (drafted, drafted_texts) == (tokens, texts)
    assert len(tokens) >= 20 and ran[0].startswith("encode") and _passes(ran) == ran[1:], ran  # EOT in the pass


@pytest.mark.parametrize("case", ["wrong token in the middle", "truncated", "empty", "another clip's"])
def test_any_draft_gives_the_plain_greedy_tokens(transcriber, entries, case):
    audio = _clips(2)
    tokens, texts, plain = _decode(transcriber, entries, audio)
    other, _, _ = _decode(transcriber, entries, _clips(3))
    wrong = list(tokens)
    wrong[len(wrong) // 2] = transcriber.recognizer.tokenizer.tok.encode(" banana", add_special_tokens=False).ids[0]
    draft = {"wrong token in the middle": wrong, "truncated": tokens[:len(tokens) // 2], "empty": [],
             "another clip's": other}[case]
    drafted, drafted_texts, ran = _decode(transcriber, entries, audio, draft=draft)
    assert (drafted, drafted_texts) == (tokens, texts)
    if case == "empty":
        assert ran == plain
    else:   # a pass stands for one step at least: never more runs than the plain decode
        assert _passes(ran) and len(ran) <= len(plain), (ran, plain)
    if case == "wrong token in the middle":  # greedy leaves the draft at the wrong token and, once its last two tokens
        # are the draft's again (two steps on), the rest of the draft is verified in a second pass
        assert len(ran) == 5 and _passes(ran) == [ran[1], ran[4]], ran
    if case == "truncated":  # the steps resume after the accepted half
        assert len(ran) <= len(plain) - len(tokens) // 2 + 3, (ran, plain)


def test_a_draft_longer_than_the_longest_pass_goes_on_in_a_second_pass(transcriber, entries):
    audio = _clips(0, 2, 3)  # 18.5 s: still the 20 s window, where the passes are
    tokens, texts, plain = _decode(transcriber, entries, audio)
    drafted, drafted_texts, ran = _decode(transcriber, entries, audio, draft=tokens)
    assert len(tokens) > 64 + whisper_drafts.PICK_UP_REST and (drafted, drafted_texts) == (tokens, texts)
    assert _passes(ran) == ran[1:] and len(ran) == 3 and ran[1] == "decode_64_t2000", ran  # EOT in the second


def test_a_draft_is_picked_up_where_the_decode_reads_its_tokens_again():
    draft = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert whisper_drafts.picked_up([1, 2, 30, 4, 5], draft, 2) == 5      # at the draft's [4, 5]: verify from 6
    assert whisper_drafts.picked_up([1, 2, 30, 40], draft, 2) is None      # not (yet) read the same again
    assert whisper_drafts.picked_up([1, 2, 30, 6, 7], draft, 2) is None    # too few draft tokens left after it
    assert whisper_drafts.picked_up([5, 6], [5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4], 3) == 8   # the first place past `after`


def test_a_decode_given_up_midway_leaves_its_tokens_so_far_as_a_draft(transcriber, entries):
    """A live decode that gives way keeps what its greedy pass had: the plain decode's first tokens, which the
    next decode of that audio verifies in one pass instead of stepping through them again."""
    audio = _clips(0)
    tokens, texts, plain = _decode(transcriber, entries, audio)
    counters = transcriber.recognizer.session.counters
    runs = counters.runs
    assert transcriber.decode_window(audio, stop=lambda: counters.runs - runs > 12) is None   # encoder + 12 steps
    so_far = list(transcriber.last_tokens)
    assert 5 <= len(so_far) < len(tokens) and so_far == tokens[:len(so_far)], (so_far, tokens)
    drafted, drafted_texts, ran = _decode(transcriber, entries, audio, draft=so_far)
    assert (drafted, drafted_texts) == (tokens, texts)
    assert len(_passes(ran)) == 1 and len(ran) <= len(plain) - len(so_far) + 2, (ran, plain)
    polls = iter(range(1 << 30))
    assert transcriber.decode_window(audio, stop=lambda: next(polls) >= 0) is None   # before the encoder
    assert transcriber.last_tokens == []


def test_drafts_off_runs_no_pass(transcriber, entries):
    audio = _clips(0)
    tokens, _, _ = _decode(transcriber, entries, audio)
    options = transcriber.recognizer.options
    transcriber.recognizer.options = replace(options, verify_drafts=False)
    try:
        drafted, _, ran = _decode(transcriber, entries, audio, draft=tokens)
    finally:
        transcriber.recognizer.options = options
    assert drafted == tokens and not _passes(ran)


def test_a_dictation_session_has_the_same_events_with_and_without_drafts(transcriber, entries):
    """The LibriVox session on a simulated clock (a fixed cost per decode, so both runs decode the same audio):
    partials and finals are the same text, and the drafts saved decoder steps."""
    audio, _, _ = librivox_session()
    options = transcriber.recognizer.options

    def session(verify: bool):
        transcriber.recognizer.options = replace(options, verify_drafts=verify)
        entries.clear()
        source = FileSource(audio, RATE, pace="simulated", decode_cost=0.45)
        events = list(Stream(transcriber, source, DictationOptions(partials=True)).start().events())
        return [(type(e).__name__, e.text) for e in events if isinstance(e, (Final, Partial))], list(entries)
    try:
        (on, ran_on), (off, ran_off) = session(True), session(False)
    finally:
        transcriber.recognizer.options = options
    assert on == off and sum(kind == "Final" for kind, _ in on) == 5
    assert _passes(ran_on) and not _passes(ran_off)
    steps = [sum(e.startswith("decode") for e in ran) for ran in (ran_on, ran_off)]
    assert steps[0] < 0.8 * steps[1], steps  # 226 vs 326: an utterance's first decode has no draft


def _prefixed(transcriber, entries, audio, prefix, draft=()):
    entries.clear()
    segments = transcriber.decode_window(audio, prefix=prefix, draft=draft)
    return list(transcriber.last_tokens), [s.text for s in segments], list(entries)


@pytest.mark.parametrize("cut", ["segment end", "mid-segment", "longer than a pass", "all"])
def test_a_prefix_decode_is_the_plain_decodes_continuation(transcriber, entries, cut):
    """A continued utterance's decode: the plain decode's first tokens as the forced prefix give the plain decode's
    tokens, and only the segments (or the rest of the one) after the prefix. A prefix that ends with punctuation and
    timestamps (all but "mid-segment" here) is continued after its last word: those are decoded again."""
    audio = _clips(0, 2, 3) if cut == "longer than a pass" else _clips(0, 1)
    tokens, texts, _ = _decode(transcriber, entries, audio)
    tb = transcriber.recognizer.tokenizer.timestamp_begin
    pairs = [i + 1 for i in range(len(tokens) - 1) if tokens[i] >= tb and tokens[i + 1] >= tb]
    n = {"segment end": pairs[0], "mid-segment": pairs[0] + 4, "longer than a pass": 70, "all": len(tokens)}[cut]
    # the whole decode continued, as the recognizer continues an emitted one: its tokens are the draft as well
    continued, continued_texts, ran = _prefixed(transcriber, entries, audio, tokens[:n],
                                                draft=tokens if cut == "all" else ())
    assert continued == tokens
    if cut == "segment end":
        assert continued_texts == texts[1:]
    elif cut == "mid-segment":
        assert continued_texts[0] != texts[1] and texts[1].endswith(continued_texts[0]) and continued_texts[1:] == texts[2:]
    elif cut == "all":
        # the closing tokens verified and EOT chosen in the one pass; no new word is what a short window's silence
        # is, so the full window decides
        assert continued_texts == [] and ran == ["encode_t2000", "decode_64_t2000", "encode", "decode_64"], ran
    else:
        assert len(tokens) > 70 and _passes(ran)[:2] == ["decode_64_t2000", "decode_32_t2000"], ran


def test_a_continuation_that_stops_short_goes_on_after_the_tokens_as_emitted(transcriber, entries):
    """Clips 0-2, the second and third 0.3 s apart: the decode that heard the pause ends "young man." and its text was
    emitted; continued after "man", tiny.en closes that segment after "selfish," and ends 1.4 s before the audio
    does, without "is to be ill-disposed". Such a continuation is decoded again after the tokens as emitted."""
    audio, _ = clip_session([1.0, 0.3, 1.0], tight=(1,))
    start = 2.01   # a dictation window: 6 s of context before the second clip (the recognizer's own cut)
    half, whole = (audio[int(start * RATE):int(end * RATE)] for end in (11.04, 16.2))
    assert [s.text for s in transcriber.decode_window(half, offset=start)][-1].endswith("young man.")
    emitted = list(transcriber.last_tokens)
    continued = " ".join(s.text for s in transcriber.decode_window(whole, offset=start, prefix=emitted, draft=emitted))
    assert continued.lower().startswith("unless to be rather") and "is to be" in continued, continued


def test_a_prefix_without_passes_is_fed_step_by_step(transcriber, entries):
    audio = _clips(0, 1)
    tokens, texts, _ = _decode(transcriber, entries, audio)
    options = transcriber.recognizer.options
    transcriber.recognizer.options = replace(options, verify_drafts=False)
    try:
        continued, continued_texts, ran = _prefixed(transcriber, entries, audio, tokens[:20])
    finally:
        transcriber.recognizer.options = options
    assert continued == tokens and not _passes(ran) and len(ran) >= len(tokens) + 1
    assert " ".join(continued_texts) in " ".join(texts) and continued_texts[-1] == texts[-1]
