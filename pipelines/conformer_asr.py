"""Speech recognition with conformer models (Parakeet CTC / TDT, GigaAM CTC / RNN-T): front end, encoder over
static audio-length buckets, greedy decoding, and long audio through overlapping windows.

    from pipelines.conformer_asr import ConformerRecognizer
    with ConformerRecognizer("path/to/parakeet-tdt") as rec:
        for start, end, text in rec.transcribe(samples_16k):
            print(f"{start:6.2f} {end:6.2f} {text}")

Decoding runs on the host: CTC is an argmax over the encoder's log-probs; the transducers (TDT, RNN-T) loop over
encoder frames and call two small graphs in the same session, the prediction-network step (`predict`, one LSTM
step per emitted token; its state stays on the host and is only replaced when a token is emitted) and the joint
(`joint`, per decoding step). The loops follow transformers' ParakeetTDTGenerationMixin (TDT) and gigaam's
RNNTGreedyDecoding (RNN-T), so their tokens are identical.

Long audio and live streams: windows of `window_seconds` that overlap by `overlap_seconds` and start on
encoder-frame boundaries; each window owns the frames from the middle of its overlap with the previous window to
the middle of its overlap with the next one, and a token is kept only by the window owning the frame it was
emitted at (see ConformerStream; `transcribe` is a stream fed all at once).
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from pathlib import Path

from typing import Callable, Iterable

import numpy as np

from pipelines import audio
from pipelines.transcript import Segment
from sdk import hub
from sdk.errors import InputError, UsageError, WeightError
from sdk.models import conformer
from sdk.session import Session
from sdk.vocab import read_tokenizer
from sdk.weights import read_config, read_json_object

HOP = conformer.FEATURE_HOP


@dataclass(frozen=True)
class ConformerOptions:
    window_seconds: float = 30.0        # the longest window one encoder run sees (the largest bucket); 30 s as
                                        # Whisper's, so live dictation can hand either model the same buffers
    overlap_seconds: float = 4.0        # shared by consecutive windows of long audio; half goes to each side
    buckets_seconds: tuple[float, ...] = (5.0, 10.0, 20.0)  # smaller encoder shapes for short windows (+ the window)
    pause_seconds: float = 0.8          # a silence between tokens this long starts a new segment
    silence_rms: float = 3e-4           # quieter windows (about -70 dBFS RMS) are not decoded: []


# ---- vocabularies: tokenizer.json, SentencePiece .model (read without the sentencepiece package), char lists --

class Vocabulary:
    def __init__(self, pieces: list[str] | None = None, tokenizer=None):
        self.pieces, self.tokenizer = pieces, tokenizer

    @classmethod
    def from_folder(cls, folder: Path, config: dict) -> "Vocabulary":
        if (folder / "tokenizer.json").exists():
            return cls(tokenizer=read_tokenizer(folder / "tokenizer.json"))
        for name in ("tokenizer.model", f"{config.get('model_name', '')}_tokenizer.model"):
            if (folder / name).exists():
                return cls(sentencepiece_pieces((folder / name).read_bytes()))
        chars = config.get("decoding", {}).get("vocabulary")
        if chars:
            return cls(list(chars))
        raise WeightError(f"no vocabulary in {folder}",
                          fix="add tokenizer.json, a SentencePiece tokenizer.model, or decoding.vocabulary to config.json")

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is not None:
            return self.tokenizer.decode(list(ids))
        return "".join(self.pieces[i] for i in ids).replace("\u2581", " ").strip()


def sentencepiece_pieces(data: bytes) -> list[str]:
    """The piece strings of a SentencePiece ModelProto, in id order (field 1: repeated SentencePiece, whose
    field 1 is the piece). A minimal protobuf walk: varints and length-delimited fields only matter here."""
    def varint(buf, i):
        shift = value = 0
        while True:
            b = buf[i]
            value |= (b & 0x7F) << shift
            i, shift = i + 1, shift + 7
            if b < 0x80:
                return value, i

    def fields(buf):
        i = 0
        while i < len(buf):
            key, i = varint(buf, i)
            wire = key & 7
            if wire == 0:
                value, i = varint(buf, i)
            elif wire == 2:
                n, i = varint(buf, i)
                value, i = buf[i:i + n], i + n
            elif wire in (1, 5):
                value, i = buf[i:i + (8 if wire == 1 else 4)], i + (8 if wire == 1 else 4)
            else:
                raise WeightError("unreadable SentencePiece model", fix="re-export the tokenizer .model file")
            yield key >> 3, value

    return [next(v for f, v in fields(piece) if f == 1).decode("utf-8") for f, piece in fields(data) if f == 1]


# ---- greedy decoders over one window's encoder output -------------------------------------------------------

def ctc_greedy(log_probs: np.ndarray, blank: int) -> list[tuple[int, int]]:
    """(token, frame) at the first frame of each run of a non-blank label."""
    labels = log_probs.argmax(-1)
    return [(int(k), t) for t, k in enumerate(labels) if k != blank and (t == 0 or labels[t - 1] != k)]


class TransducerDecoder:
    """Greedy TDT / RNN-T decoding with the `predict` and `joint` graphs of a session."""

    def __init__(self, session: Session, cfg: conformer.Config):
        self.session, self.cfg = session, cfg

    def _predict(self, token: int, h, c):
        out = self.session.run("predict", token=np.array([token], np.int32), h=h, c=c)
        return out["dec"], out["h"], out["c"]

    def _joint(self, enc: np.ndarray, dec: np.ndarray) -> np.ndarray:
        return self.session.run("joint", enc=enc[None], dec=dec)["logits"][0]

    def __call__(self, projected: np.ndarray) -> list[tuple[int, int]]:
        cfg = self.cfg
        zeros = np.zeros((cfg.num_decoder_layers, 1, cfg.decoder_hidden_size), np.float32)
        dec, h, c = self._predict(cfg.blank_id, zeros, zeros)  # the blank starts the prediction network
        return self._tdt(projected, dec, h, c) if cfg.head == "tdt" else self._rnnt(projected, dec, h, c)

    def _tdt(self, projected, dec, h, c):
        """As transformers' TDT greedy search: the frame pointer moves by the predicted duration (a blank moves
        at least one frame); at most max_symbols_per_step * frames decoding steps."""
        cfg, tokens, t, steps = self.cfg, [], 0, 0
        n, v = len(projected), cfg.vocab_size
        while t < n and steps < cfg.max_symbols_per_step * n - 1:
            logits = self._joint(projected[t], dec)
            token, duration = int(logits[:v].argmax()), cfg.durations[int(logits[v:].argmax())]
            if token == cfg.blank_id:
                duration = max(duration, 1)
            else:
                tokens.append((token, t))
                dec, h, c = self._predict(token, h, c)
            t, steps = t + duration, steps + 1
        return tokens

    def _rnnt(self, projected, dec, h, c):
        """As gigaam's RNNTGreedyDecoding and transformers' RNN-T greedy search: emit until blank, at most
        max_symbols_per_step per frame. transformers also caps the whole search at max_symbols_per_step * frames - 1
        steps (its generation max_length counts the start token), which only bites when every frame is full."""
        cfg, tokens, steps = self.cfg, [], 0
        limit = cfg.max_symbols_per_step * len(projected) - 1 if cfg.model_type.startswith("parakeet") else math.inf
        for t in range(len(projected)):
            for _ in range(cfg.max_symbols_per_step):
                if steps >= limit:
                    return tokens
                token, steps = int(self._joint(projected[t], dec).argmax()), steps + 1
                if token == cfg.blank_id:
                    break
                tokens.append((token, t))
                dec, h, c = self._predict(token, h, c)
        return tokens


# ---- the recogniser -----------------------------------------------------------------------------------------

def program_graphs(cfg: conformer.Config, options: ConformerOptions = ConformerOptions()) -> list:
    """The graphs a ConformerRecognizer with these options runs (its one session): what `aie-apps build` compiles."""
    return conformer.program_graphs(cfg, options.window_seconds, options.buckets_seconds)


class ConformerRecognizer:
    """A conformer ASR model on one session: `decode_window` for up to `window_seconds` of 16 kHz audio,
    `transcribe` for any length."""

    sample_rate = audio.SAMPLE_RATE

    def __init__(self, model: str | Path, device: str | None = None, options: ConformerOptions = ConformerOptions()):
        self.source = hub.resolve(str(model))
        folder = Path(self.source.path)
        self.cfg, weights = conformer.load(folder)
        config = read_config(folder)
        self.vocabulary = Vocabulary.from_folder(folder, config)
        self.front_end = _front_end(self.cfg, folder)
        if options.overlap_seconds >= options.window_seconds / 2:
            raise UsageError("overlap_seconds must be less than half of window_seconds")
        self.options = options
        self.frame_samples = HOP * self.cfg.subsampling_factor  # audio per encoder frame
        self.frame_seconds = self.frame_samples / self.sample_rate
        self.buckets = conformer.encoder_buckets(options.window_seconds, options.buckets_seconds)
        self.session = Session(program_graphs(self.cfg, options), weights, device=device)
        self.transducer = TransducerDecoder(self.session, self.cfg) if self.cfg.head != "ctc" else None
        self._lock = threading.Lock()  # one session, one caller at a time (dictation may call from a thread)

    @property
    def window_seconds(self) -> float:
        return self.options.window_seconds

    def report(self) -> dict:
        return {"model": self.source.name, "model_path": str(self.source.path), "architecture": self.cfg.model_type,
                **self.session.report()}

    # -- one window --
    def window_tokens(self, samples: np.ndarray) -> list[tuple[int, int]]:
        """Greedy (token id, encoder frame) pairs for one window of 16 kHz mono float audio."""
        samples = _mono(samples)
        if len(samples) > self.options.window_seconds * self.sample_rate:
            raise InputError(f"a window holds at most {self.options.window_seconds:g} s, got "
                             f"{len(samples) / self.sample_rate:.2f} s", fix="use transcribe() for long audio")
        if len(samples) < 2 * HOP or np.sqrt(np.mean(np.square(samples))) < self.options.silence_rms:
            return []
        with self._lock:
            return self._window_tokens(samples)

    def _window_tokens(self, samples: np.ndarray) -> list[tuple[int, int]]:
        features = self.front_end(samples)  # [frames, mels]
        bucket = next(b for b in self.buckets if b >= len(features))
        padded = np.zeros((1, bucket, self.cfg.num_mel_bins), np.float32)
        padded[0, :len(features)] = features
        lengths = self.cfg.output_length(len(features))
        out = self.session.run(conformer.encoder_entry(bucket), features=padded,
                               **{f"length{i}": np.int32(n) for i, n in enumerate(lengths)})
        n = lengths[-1]
        if self.cfg.head == "ctc":
            return ctc_greedy(out["log_probs"][0, :n], self.cfg.blank_id)
        return self.transducer(out["projected"][0, :n])

    def decode_window(self, samples_16k: np.ndarray, *, offset: float = 0.0, fallback: bool = True,
                      stop: Callable[[], bool] | None = None) -> list[Segment] | None:
        """Segments (start, end, text) of one window; times in seconds, shifted by `offset`. Greedy search has
        no fallback passes, so `fallback` changes nothing here; `stop` is asked once, before the encoder (one
        pass, not cut short), and True gives None."""
        if stop is not None and stop():
            return None
        return self.segments(self.window_tokens(samples_16k), offset=offset)

    # -- any length --
    def stream(self) -> "ConformerStream":
        """Incremental decoding of live audio with the same windows and joins as transcribe()."""
        return ConformerStream(self)

    def transcribe_tokens(self, samples_16k: np.ndarray) -> list[tuple[int, int]]:
        """(token, absolute encoder frame) over audio of any length, through overlapping windows."""
        stream = self.stream()
        return stream.feed(samples_16k) + stream.flush()

    def transcribe(self, samples_16k: np.ndarray, *, offset: float = 0.0) -> list[Segment]:
        return self.segments(self.transcribe_tokens(samples_16k), offset=offset)

    def transcribe_blocks(self, blocks: Iterable[np.ndarray], *,
                          on_progress: Callable[[float], None] | None = None) -> tuple[list[Segment], float]:
        """(segments, seconds of audio) of consecutive 16 kHz mono blocks, e.g. audio.stream_audio(path): each
        block is decoded as it arrives and then dropped, so memory stays bounded for a file of any length.
        `on_progress(seconds)` is told how much audio has been read after each block."""
        stream, tokens, read = self.stream(), [], 0
        for block in blocks:
            tokens += stream.feed(block)
            read += len(block)
            if on_progress is not None:
                on_progress(read / self.sample_rate)
        return self.segments(tokens + stream.flush()), read / self.sample_rate

    def segments(self, tokens: list[tuple[int, int]], *, offset: float = 0.0) -> list[Segment]:
        """Group (token, frame) pairs into segments, split at pauses of `pause_seconds` or more."""
        groups, gap = [], self.options.pause_seconds / self.frame_seconds
        for tok, frame in tokens:
            if groups and frame - groups[-1][-1][1] < gap:
                groups[-1].append((tok, frame))
            else:
                groups.append([(tok, frame)])
        out = []
        for g in groups:
            text = self.vocabulary.decode([tok for tok, _ in g]).strip()
            if text:
                out.append(Segment(round(offset + g[0][1] * self.frame_seconds, 3),
                                   round(offset + (g[-1][1] + 1) * self.frame_seconds, 3), text))
        return out

    def close(self):
        self.session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _front_end(cfg: conformer.Config, folder: Path):
    """The family's log-mel: GigaAM's, or NeMo's with the settings of preprocessor_config.json if present."""
    if cfg.model_type == "gigaam":
        return lambda samples: audio.gigaam_log_mel(samples, n_mels=cfg.num_mel_bins)
    settings = {}
    if (folder / "preprocessor_config.json").exists():
        pre = read_json_object(folder / "preprocessor_config.json", "preprocessor_config.json")
        pre = pre.get("feature_extractor", pre)
        settings = {ours: pre[theirs] for ours, theirs in (("n_fft", "n_fft"), ("win_length", "win_length"),
                                                           ("hop", "hop_length"), ("preemphasis", "preemphasis"))
                    if theirs in pre}
    if settings.get("hop", HOP) != HOP:
        raise WeightError(f"{folder}: hop_length {settings['hop']} is not supported (10 ms frames expected)")
    return lambda samples: audio.nemo_log_mel(samples, n_mels=cfg.num_mel_bins, **settings)


class ConformerStream:
    """Audio in as it arrives, final tokens out. Windows of `window_seconds` start every window - overlap
    seconds (on encoder-frame boundaries). Window k owns the frames from the middle of its overlap with window k-1
    to the middle of its overlap with window k+1 (the first from 0, the last to the end); a token is kept by the
    window that owns the frame it was emitted at, so tokens seen by two windows are kept once and every frame
    belongs to exactly one window. A window is decoded once audio beyond it has arrived (or at flush), so
    tokens are final when returned."""

    def __init__(self, recognizer: ConformerRecognizer):
        self.rec = recognizer
        fs, rate, opts = recognizer.frame_samples, recognizer.sample_rate, recognizer.options
        self.window = int(opts.window_seconds * rate) // fs * fs
        self.overlap = int(opts.overlap_seconds * rate) // fs * fs
        self.pending = np.zeros(0, np.float32)  # audio from the next window's start on
        self.start = 0                          # absolute sample where the next window starts
        self.owned_from = 0                     # first absolute frame no window has finalised yet

    def feed(self, samples_16k: np.ndarray) -> list[tuple[int, int]]:
        """Append audio; returns the (token, absolute frame) pairs that became final."""
        self.pending = np.concatenate([self.pending, _mono(samples_16k)])
        out = []
        while len(self.pending) > self.window:  # audio past this window exists, so a next window will too
            out += self._decode(last=False)
        return out

    def flush(self) -> list[tuple[int, int]]:
        """Decode what is left (the end of the audio) and start over."""
        out = []
        while True:
            last = len(self.pending) <= self.window
            out += self._decode(last=last)
            if last:
                break
        self.pending, self.start, self.owned_from = np.zeros(0, np.float32), 0, 0
        return out

    def _decode(self, *, last: bool) -> list[tuple[int, int]]:
        fs, step = self.rec.frame_samples, self.window - self.overlap
        first_frame = self.start // fs
        owned_to = math.inf if last else (self.start + step + self.overlap // 2) // fs
        tokens = [(tok, first_frame + f) for tok, f in self.rec.window_tokens(self.pending[:self.window])
                  if self.owned_from <= first_frame + f < owned_to]
        self.owned_from = owned_to
        if not last:
            self.pending, self.start = self.pending[step:], self.start + step
        return tokens


def _mono(samples: np.ndarray) -> np.ndarray:
    samples = audio.float_samples(samples)
    if samples.ndim != 1:
        raise InputError(f"expected mono 16 kHz samples (a 1-D array), got shape {samples.shape}",
                         fix="downmix first, e.g. pipelines.audio.to_mono")
    return samples
