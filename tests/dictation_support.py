"""Shared by the dictation tests and the soak bench: the LibriVox session, WER, and process helpers."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np

LIBRIVOX = Path("/usr/share/pocketsphinx/test/data/librivox")
RATE = 16000
PAUSE = 2.0


def librivox_clips() -> list[tuple[Path, str]]:
    """(wav, reference words) for the 5 clips, in order."""
    refs = {}
    for line in (LIBRIVOX / "transcription").read_text().splitlines():
        m = re.match(r"<s>(.*)</s>\s*\((\S+)\)", line.strip())
        if m:
            refs[m.group(2)] = m.group(1).strip()
    return [(LIBRIVOX / f"{fid}.wav", refs[fid]) for fid in (LIBRIVOX / "fileids").read_text().split()]


def librivox_session() -> tuple[np.ndarray, str, list[tuple[float, float]]]:
    """The clips joined with 2 s pauses (and 2 s at the end): (audio 16 kHz, reference text, clip spans s)."""
    import soundfile

    parts, spans, t = [], [], 0.0
    for wav, _ in librivox_clips():
        audio, rate = soundfile.read(str(wav), dtype="float32")
        assert rate == RATE
        parts += [audio, np.zeros(int(PAUSE * RATE), np.float32)]
        spans.append((t, t + len(audio) / RATE))
        t += len(audio) / RATE + PAUSE
    return np.concatenate(parts), " ".join(ref for _, ref in librivox_clips()), spans


# The reader of clip 0920 says "a more a amiable woman"; the transcript keeps the slip, Whisper does not.
SPOKEN_SLIP = ("had he married a more a amiable", "had he married a more amiable")
ROOM_TONE_DB = -45.0   # the clips' room tone is -51..-57 dBFS; their speech is louder than this


def speech_span(audio: np.ndarray) -> tuple[int, int]:
    """Samples [first, last) of the 10 ms frames louder than room tone: the speech without the silence around it."""
    frames = audio[:len(audio) // 160 * 160].reshape(-1, 160)
    loud = np.flatnonzero(10 * np.log10(np.mean(frames ** 2, axis=1) + 1e-12) > ROOM_TONE_DB)
    return int(loud[0]) * 160, (int(loud[-1]) + 1) * 160


def clip_session(pauses: list[float], *, lead: float | None = None, tight: tuple[int, ...] = ()) -> tuple[np.ndarray, str]:
    """The clips in order, cycled, each followed by the pause of the same index; `lead` s of the first clip's
    leading silence kept (None: all of it); at each join in `tight` the room tone on both sides is cut, so the
    pause after clip i is that long between speech, not that plus the clips' own silence. (audio, reference)."""
    import soundfile

    clips = librivox_clips()
    parts, refs = [], []
    for i, pause in enumerate(pauses):
        wav, ref = clips[i % len(clips)]
        audio, rate = soundfile.read(str(wav), dtype="float32")
        assert rate == RATE
        first, last = speech_span(audio)
        audio = audio[first if i - 1 in tight else 0:last if i in tight else len(audio)]
        if i == 0 and lead is not None:
            onset = int(np.flatnonzero(np.abs(audio) > 0.05)[0])
            audio = audio[max(0, onset - int(lead * RATE)):]
        parts += [audio, np.zeros(int(pause * RATE), np.float32)]
        refs.append(ref.replace(*SPOKEN_SLIP))
    return np.concatenate(parts), " ".join(refs)


def long_session() -> tuple[np.ndarray, str]:
    """The clips repeated five times, joined as recorded (~124 s): most joins are the clips' own short pauses."""
    return clip_session([0.0] * 25)


def short_pause_session() -> tuple[np.ndarray, str]:
    """The clips once, 1 s apart but 0.3 s of pause between speech after the second, speech from the first 30 ms."""
    return clip_session([1.0, 0.3, 1.0, 1.0, 1.0], lead=0.03, tight=(1,))


def clause_session(pauses: tuple[float, ...] = (0.3, 0.4, 0.5, 0.35, 0.45, 0.55),
                   clips: int = 20) -> tuple[np.ndarray, str]:
    """The clips in order, cycled (`clips` of them), every join cut to the next of `pauses` s between speech (the
    clips are the clauses of two sentences, so most joins are comma pauses), 1 s after the last: (audio, reference)."""
    joins = [pauses[i % len(pauses)] for i in range(clips - 1)]
    return clip_session(joins + [1.0], tight=tuple(range(clips - 1)))


# Sentences with commas (written for these tests), spoken by flite's and espeak-ng's voices with their comma pauses
# set to COMMA_PAUSES: the pauses an early final must not mistake for the end, in other voices than the clips' reader.
COMMA_SENTENCES = [
    "When the rain finally stopped, the children ran outside to play in the puddles.",
    "My brother, who lives in Denver, is coming to visit us next week.",
    "If you have any questions, please call the front desk before noon.",
    "The old bridge was narrow, uneven, and badly in need of repair.",
    "After dinner, we walked along the river until the lights came on.",
    "Although the train was late, nobody on the platform seemed to mind.",
    "She opened the letter, read it twice, and put it back in the drawer.",
    "In the spring, the garden is full of tulips, daisies, and roses.",
    "To be honest, I never expected the meeting to last three hours.",
    "The doctor, a tall woman with grey hair, listened to his heart.",
    "Because the road was closed, we had to take the long way home.",
    "On Monday morning, the office was quiet, and the coffee was cold.",
    "He was not an unkind man, but he was careless with his promises.",
    "Before you leave, remember to lock the door and turn off the lights.",
    "The museum, which opened last year, has a large collection of maps.",
    "When the music started, everyone in the hall stood up and cheered.",
    "Our neighbours, the Carters, have three dogs and a very patient cat.",
    "If the weather is fine tomorrow, we will climb the hill behind the village.",
    "The recipe calls for flour, sugar, butter, and two fresh eggs.",
    "As the sun went down, the fishermen pulled their boats onto the sand.",
    "Despite the noise outside, the baby slept soundly through the night.",
    "The report was long, detailed, and surprisingly easy to read.",
    "After a short pause, the speaker thanked the audience and sat down.",
    "Whenever I visit my grandmother, she tells me stories about the war.",
    "His inheritance, though modest, was enough to keep the family comfortable.",
    "The solicitor, Mr. Pemberton, was thoroughly indifferent to their quarrel.",
    "She was an amiable woman, generous to her friends, and rather fond of gossip.",
    "The captain, weary and ill-tempered, ordered the crew below deck.",
    "Margaret, being the eldest, was expected to manage the household accounts.",
    "The estate, including the orchards, passed to a distant cousin in Yorkshire.",
    "Such conduct, however well intended, could hardly be called prudent.",
    "The committee, after a lengthy discussion, postponed the vote until autumn.",
]
COMMA_PAUSES = (0.3, 0.45, 0.35, 0.55, 0.4, 0.5, 0.25)   # s between speech, cycled over the commas
SENTENCE_PAUSES = (0.8, 0.5, 1.1, 0.65, 1.4)             # ... over the sentence ends
VOICES = {"flite": ("slt", "awb", "kal16"), "espeak-ng": ("en-us", "en-gb", "en-gb-scotland", "en-029")}
SYNTH_NOISE_DB = -60.0                                   # white noise under the synthetic speech (its pauses are 0)


def spoken(engine: str, voice: str, text: str, folder: Path) -> np.ndarray:
    """`text` spoken by flite or espeak-ng, 16 kHz float32 (check need(engine) first)."""
    import soundfile
    import soxr
    path = speak(engine, voice, text, folder / "spoken.wav")
    audio, rate = soundfile.read(str(path), dtype="float32")
    return audio if rate == RATE else soxr.resample(audio, rate, RATE).astype(np.float32)


def speak(engine: str, voice: str, text: str, wav: Path) -> Path:
    """`text` spoken by flite or espeak-ng into `wav` (at the engine's own rate)."""
    command = (["flite", "-voice", voice, "-t", text, "-o", str(wav)] if engine == "flite"
               else ["espeak-ng", "-v", voice, "-w", str(wav), text])
    subprocess.run(command, check=True, capture_output=True)
    return wav


def _quiet_runs(audio: np.ndarray, below_db: float = -50.0, hop: int = 160) -> list[tuple[int, int]]:
    """[start, end) samples of the runs of 10 ms frames quieter than `below_db` dBFS."""
    n = len(audio) // hop
    quiet = 10 * np.log10(np.mean(audio[:n * hop].reshape(n, hop) ** 2, axis=1) + 1e-12) < below_db
    edges = np.flatnonzero(np.diff(np.concatenate([[0], quiet.astype(int), [0]])))
    return [(int(a) * hop, int(b) * hop) for a, b in zip(edges[::2], edges[1::2])]


def with_comma_pauses(audio: np.ndarray, text: str, pauses) -> np.ndarray:
    """The speech of one synthesized sentence (its silence around it cut) with the pause at each comma set to the
    next of `pauses` s: the comma's pause is the quiet run (>= 50 ms) nearest to the comma's place in the text
    (by characters, within 15 % of the speech); a comma without one keeps the voice's own."""
    runs = _quiet_runs(audio)
    first = runs[0][1] if runs and runs[0][0] == 0 else 0
    last = runs[-1][0] if runs and runs[-1][1] >= len(audio) - 160 else len(audio)
    inner = [(a, b) for a, b in runs if a > first and b < last and b - a >= 800]
    commas = []
    for i in (i for i, ch in enumerate(text) if ch == ","):
        want = first + (last - first) * i / len(text)
        near = [r for r in inner if abs((r[0] + r[1]) / 2 - want) < 0.15 * (last - first)]
        if near:
            commas.append(min(near, key=lambda r: abs((r[0] + r[1]) / 2 - want)))
    parts, at = [], first
    for (a, b), pause in zip(sorted(set(commas)), pauses):
        middle = (a + b) // 2
        parts += [audio[at:middle], np.zeros(max(0, int(pause * RATE) - (b - a)), np.float32)]
        at = middle
    return np.concatenate(parts + [audio[at:last]])


def comma_session(engine: str, folder: Path) -> tuple[np.ndarray, str]:
    """COMMA_SENTENCES, each by the next of the engine's VOICES, their commas' pauses cycling over COMMA_PAUSES and
    the pauses after them over SENTENCE_PAUSES, 0.5 s before the first, white noise at SYNTH_NOISE_DB (about 160 s,
    check need(engine) first): (audio, reference)."""
    voices, parts, commas = VOICES[engine], [np.zeros(RATE // 2, np.float32)], 0
    for i, text in enumerate(COMMA_SENTENCES):
        pauses = [COMMA_PAUSES[(commas + j) % len(COMMA_PAUSES)] for j in range(text.count(","))]
        commas += len(pauses)
        speech = with_comma_pauses(spoken(engine, voices[i % len(voices)], text, folder), text, pauses)
        parts += [speech, np.zeros(int(SENTENCE_PAUSES[i % len(SENTENCE_PAUSES)] * RATE), np.float32)]
    audio = np.concatenate(parts)
    noise = 10 ** (SYNTH_NOISE_DB / 20) * np.random.default_rng(0).standard_normal(len(audio))
    return (audio + noise).astype(np.float32), " ".join(COMMA_SENTENCES)


# Harvard sentences (public domain), spoken by flite's slt voice: generated speech beside the LibriVox clips in
# the WER gate of the short encoder windows (tests/test_whisper_base.py, tests/test_transcribe.py)
HARVARD = ["The birch canoe slid on the smooth planks.", "Glue the sheet to the dark blue background.",
           "It is easy to tell the depth of a well.", "These days a chicken leg is a rare dish.",
           "The juice of lemons makes fine punch.", "The box was thrown beside the parked truck.",
           "Four hours of steady work faced us.", "A large size in stockings is hard to sell.",
           "The boy was there when the sun rose. A rod is used to catch pink salmon. The source of the huge "
           "river is the clear spring.",
           "The small pup gnawed a hole in the sock. The fish twisted and turned on the bent hook. Press the pants "
           "and sew a button on the vest. The swan dive was far short of perfect."]


# Everyday sentences (no numbers or names, which a WER would count as spelling), for a gate that must tell half a
# point: 393 words, so that one word weighs 0.25 points, not the Harvard sentences' 0.78.
EVERYDAY = [
    'The old man walked slowly along the river bank every morning.',
    'She opened the window and let the cool air fill the room.',
    'We waited for the bus in the rain for almost an hour.',
    'The children built a small house out of wooden blocks.',
    'He forgot his keys on the kitchen table again.',
    'A gentle wind moved the leaves of the tall trees.',
    'The teacher asked the class to read the first chapter aloud.',
    'Please bring a warm coat because the nights are cold.',
    'The market was crowded with people buying fresh bread.',
    'They painted the fence white before the summer ended.',
    'The doctor told him to rest and drink plenty of water.',
    'Our neighbor grows tomatoes and beans in his garden.',
    'The train left the station a few minutes late.',
    'I found an old letter hidden inside a library book.',
    'The cat slept all afternoon in a patch of sunlight.',
    'Her brother fixed the broken chair with glue and nails.',
    'The meeting will start as soon as everyone arrives.',
    'A loud noise woke the whole family in the middle of the night.',
    'He carried the heavy boxes up the narrow stairs.',
    'The lake was calm and the sky was clear and blue.',
    'You should check the tires before a long drive.',
    'The baker wakes up early to prepare the morning bread.',
    'They talked about their plans for the coming year.',
    'The museum closes early on most weekdays.',
    'She wrote a short note and left it by the door.',
    'The farmer sold apples and honey at the weekend market.',
    'Most of the students passed the difficult exam.',
    'The small boat drifted slowly toward the rocky shore.',
    'He listened to the radio while he cooked dinner.',
    'The road was closed because of the heavy snow.',
    'My sister likes to read mystery novels before bed.',
    'The workers finished the bridge ahead of schedule.',
    'Fresh paint makes an old room look bright and new.',
    'The dog ran across the field to catch the ball.',
    'We need to buy milk, eggs, and a loaf of bread.',
    'The pilot spoke calmly as the plane began to descend.',
    'Clean the brushes carefully after you finish painting.',
    'The village church has a bell that rings every hour.',
    'A thick fog covered the harbor early in the morning.',
    'The young girl learned to ride a bicycle in one day.',
]


def gate_speech(folder: Path) -> list[tuple[Path, str]]:
    """(wav, reference) for the 5 LibriVox clips and the Harvard sentences, spoken by flite into `folder`
    (flite must be on PATH: check need("flite") first)."""
    return list(librivox_clips()) + flite_speech(folder, HARVARD, ["slt"], "h")


def flite_speech(folder: Path, sentences: list[str], voices: list[str], prefix: str) -> list[tuple[Path, str]]:
    """(wav, sentence) for each sentence spoken by flite into `folder`, the voices taking turns."""
    return [(speak("flite", voices[i % len(voices)], text, folder / f"{prefix}{i}.wav"), text)
            for i, text in enumerate(sentences)]


ABBREVIATIONS = {"mr": "mister", "mrs": "missus", "dr": "doctor", "st": "saint"}


def words(text: str) -> list[str]:
    """Lowercase words without punctuation; hyphens split words; Mr./Mrs./Dr. spelled out (as Whisper's
    English normaliser does), so that spelling conventions do not count as recognition errors."""
    tokens = re.sub(r"[^a-z0-9' ]", " ", text.lower().replace("-", " ")).split()
    return [ABBREVIATIONS.get(t, t) for t in tokens]


def _edit_table(ref: list[str], hyp: list[str]) -> np.ndarray:
    """Levenshtein distances between every prefix of ref (rows) and of hyp (columns)."""
    d = np.zeros((len(ref) + 1, len(hyp) + 1), int)
    d[:, 0], d[0, :] = np.arange(len(ref) + 1), np.arange(len(hyp) + 1)
    for i, r in enumerate(ref, 1):
        for j, h in enumerate(hyp, 1):
            d[i, j] = min(d[i - 1, j] + 1, d[i, j - 1] + 1, d[i - 1, j - 1] + (r != h))
    return d


def wer(reference: str, hypothesis: str) -> float:
    ref, hyp = words(reference), words(hypothesis)
    return float(_edit_table(ref, hyp)[-1, -1]) / max(1, len(ref))


def alignment(reference: str, hypothesis: str) -> list[tuple[int | None, int | None]]:
    """A minimal word alignment, in order: (reference index, hypothesis index) pairs, None on the side an
    insertion or a deletion lacks. Where an edit could be a deletion or a substitution, it is taken as a
    substitution: a misreading, not a loss."""
    ref, hyp = words(reference), words(hypothesis)
    d = _edit_table(ref, hyp)
    pairs, i, j = [], len(ref), len(hyp)
    while i > 0 or j > 0:
        if i > 0 and j > 0 and d[i, j] == d[i - 1, j - 1] + (ref[i - 1] != hyp[j - 1]):
            i, j = i - 1, j - 1
            pairs.append((i, j))
        elif j > 0 and d[i, j] == d[i, j - 1] + 1:
            j -= 1
            pairs.append((None, j))
        else:
            i -= 1
            pairs.append((i, None))
    return pairs[::-1]


def deleted_words(reference: str, hypothesis: str) -> list[tuple[int, str]]:
    """Reference words a minimal word alignment deletes (not those it substitutes): [(index, word)]."""
    ref = words(reference)
    return [(i, ref[i]) for i, j in alignment(reference, hypothesis) if j is None]


# The Debian package that ships each binary the device tests run, where its name differs from the binary's.
DEBIAN_PACKAGE = {"paplay": "pulseaudio-utils", "pactl": "pulseaudio-utils", "parec": "pulseaudio-utils",
                  "Xvfb": "xvfb", "swaymsg": "sway", "wl-copy": "wl-clipboard", "wl-paste": "wl-clipboard",
                  "setpriv": "util-linux", "xwd": "x11-apps", "convert": "imagemagick"}


def need(*binaries: str) -> str | None:
    """The skip reason when a required binary is absent, else None; it names the Debian packages to install."""
    missing = [b for b in binaries if shutil.which(b) is None]
    if not missing:
        return None
    packages = dict.fromkeys(DEBIAN_PACKAGE.get(b, b) for b in missing)
    return f"needs {', '.join(missing)} on PATH (Debian: apt install {' '.join(packages)})"


def stop_process(proc: subprocess.Popen, timeout: float = 5.0) -> None:
    """Terminate a process this test started (its own process group), then kill it if it lingers."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
