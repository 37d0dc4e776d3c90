"""Audio in: files and arrays -> mono float32 at the model's rate; spectral front ends (STFT power, mel filter
banks) and the model-specific log-mel features built from them.

    samples = load_audio("talk.flac")          # mono float32, 16 kHz
    mel = whisper_log_mel(samples, n_mels=80)   # [80, 3000], matches transformers' WhisperFeatureExtractor

Files are read with soundfile (wav, flac, ogg; mp3 where libsndfile supports it); every failure is an
InputError that names the file and the reason; a WAV file shorter than its header declares is read as far as
it goes, with a TruncatedAudioWarning. Resampling uses soxr (high quality).
"""
from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Iterator

import numpy as np

from sdk.errors import InputError, UsageError

SAMPLE_RATE = 16000  # what every speech model here expects
# sox (0x7ffff000), arecord (~0x7fffffff) and ffmpeg (0xffffffff) declare sizes from here up when they write
# to a pipe and cannot go back to fill in the length: such a file is not truncated
_UNKNOWN_LENGTH = 0x7FFFF000


class TruncatedAudioWarning(UserWarning):
    """An audio file holds less audio than its header declares (a cut-off download or copy)."""


# ---- reading, downmixing, resampling -------------------------------------------------------------

def read_audio(path: str | Path) -> tuple[np.ndarray, int]:
    """(samples [frames] or [frames, channels] float32, sample rate) of an audio file."""
    import soundfile as sf
    path = Path(path)
    check_audio_path(path)
    try:
        with sf.SoundFile(str(path)) as f:
            samples, rate, log = f.read(dtype="float32", always_2d=False), f.samplerate, f.extra_info
    except (sf.LibsndfileError, RuntimeError) as e:
        raise _unreadable(path, e) from None
    _warn_if_truncated(path, log, len(samples), int(rate))
    return samples, int(rate)


def stream_audio(path: str | Path, *, target: int = SAMPLE_RATE, block_seconds: float = 5.0) -> Iterator[np.ndarray]:
    """Mono float32 blocks at `target` Hz of an audio file, decoded and resampled block by block (a streaming
    soxr resampler, HQ, whose output does not depend on the block size), so that memory stays bounded for a file
    of any length. Blocks hold about `block_seconds` of audio (the last one less; a block may be empty): 5 s of
    48 kHz stereo is 1.9 MB decoded, with its mono and resampled copies beside it while a model is resident (30 s
    blocks added 23 MB to the peak of a long transcription). The same checks and errors as read_audio; an
    InputError at the end when the file held no samples."""
    import soundfile as sf
    import soxr
    path = Path(path)
    check_audio_path(path)
    try:
        f = sf.SoundFile(str(path))
    except (sf.LibsndfileError, RuntimeError) as e:
        raise _unreadable(path, e) from None
    with f:
        rate, name = int(f.samplerate), str(path)
        _warn_if_truncated(path, f.extra_info, f.frames, rate)
        resampler = soxr.ResampleStream(rate, target, 1, dtype="float32", quality="HQ") if rate != target else None
        frames, per_block = 0, max(1, int(rate * block_seconds))
        while True:
            try:
                block = f.read(per_block, dtype="float32", always_2d=True)
            except (sf.LibsndfileError, RuntimeError) as e:
                raise _unreadable(path, e) from None
            last = len(block) < per_block
            frames += len(block)
            mono = to_mono(float_samples(block, name)) if len(block) else np.zeros(0, np.float32)
            out = mono if resampler is None else resampler.resample_chunk(mono, last=last)
            if not np.isfinite(out).all():  # float samples near the float32 limit overflow when filtered
                raise InputError(f"{name} holds float samples too large to process (|x| near 3.4e38)",
                                 fix="check how the audio was produced; float WAV samples belong in [-1, 1]")
            yield out
            if last:
                break
    if frames == 0:
        raise InputError(f"{name} has no samples", fix="pass audio that is at least a fraction of a second long")


def _unreadable(path: Path, e: Exception) -> InputError:
    readable = path.suffix.lower() in (".wav", ".flac", ".ogg")  # a format we read: the file itself is bad
    return InputError(f"cannot read {path} as audio: {getattr(e, 'error_string', None) or e}",
                      fix="the file looks truncated or corrupt: export or record it again" if readable else
                      "use a wav, flac or ogg file (convert others with `sox in.mp3 out.wav` or ffmpeg)")


def check_audio_path(path: Path) -> None:
    """Raise the InputError read_audio would for a path that is missing, a folder or an empty file (cheap: an
    app can check all its inputs before it loads a model)."""
    if path.is_dir():
        raise InputError(f"{path} is a folder, not an audio file", fix=f"pass the audio files in it, e.g. {path}/*.wav")
    if not path.exists():
        raise InputError(f"audio file {path} does not exist", fix="check the path")
    if not path.is_file():  # a FIFO or a device would be read forever, or block
        raise InputError(f"{path} is not a regular file (a device, FIFO or socket)",
                         fix="save the audio to a file first (e.g. `sox -d talk.wav`), then pass that file")
    if not os.access(path, os.R_OK):
        raise InputError(f"audio file {path} is not readable (permission denied)", fix=f"check the permissions of {path}")
    if path.stat().st_size == 0:
        raise InputError(f"audio file {path} is empty (0 bytes)", fix="record or copy the file again")


def _warn_if_truncated(path: Path, log: str, frames: int, rate: int) -> None:
    """libsndfile reads a cut-off WAV without an error, up to where it ends; only its header log, a line like
    `data : 64000 (should be 31978)` (bytes declared, bytes present), tells."""
    m = re.search(r"^data : (\d+) \(should be (\d+)\)", log, re.MULTILINE)
    if not m or int(m.group(1)) >= _UNKNOWN_LENGTH or not frames:  # none read: no bytes per frame to scale by
        return
    declared, present = int(m.group(1)), int(m.group(2))
    seconds = frames / rate
    warnings.warn(f"{path} looks truncated: its header declares {seconds * declared / present:.1f} s of audio "
                  f"but only {seconds:.1f} s are present; only those are used", TruncatedAudioWarning, stacklevel=3)


def to_mono(samples: np.ndarray) -> np.ndarray:
    """Average the channels of [frames, channels] audio; 1-D audio is returned as is."""
    samples = np.asarray(samples, dtype=np.float32)
    if samples.ndim == 2 and samples.shape[1] > max(samples.shape[0], 64):  # averaging would leave a few samples
        raise InputError(f"audio of shape {samples.shape} looks like [channels, frames]",
                         fix="pass [frames, channels] (samples.T) or 1-D mono samples")
    if samples.ndim == 2:
        return samples.mean(axis=1, dtype=np.float32)
    if samples.ndim != 1:
        raise InputError(f"audio must be [frames] or [frames, channels], got shape {samples.shape}",
                         fix="pass a 1-D (mono) or 2-D (frames x channels) array")
    return samples


def resample(samples: np.ndarray, rate: int, target: int = SAMPLE_RATE) -> np.ndarray:
    """Band-limited resampling with soxr (HQ); a no-op when the rates agree."""
    if rate == target:
        return samples
    if rate <= 0:
        raise InputError(f"invalid sample rate {rate}", fix="pass the sample rate the audio was recorded at")
    import soxr
    out = soxr.resample(samples, rate, target, quality="HQ").astype(np.float32, copy=False)
    if not np.isfinite(out).all():  # float samples near the float32 limit overflow when filtered
        raise InputError("the audio holds float samples too large to process (|x| near 3.4e38)",
                         fix="check how the audio was produced; float samples belong in [-1, 1]")
    return out


def load_audio(source: str | Path | np.ndarray, sample_rate: int | None = None, *,
               target: int = SAMPLE_RATE) -> np.ndarray:
    """Mono float32 samples at `target` Hz from a file, or from an array recorded at `sample_rate` (default:
    already at `target`). Raises InputError for unreadable files and for audio without samples."""
    if isinstance(source, (str, Path)):  # the streaming reader: one decoder and resampler for every file
        return np.concatenate(list(stream_audio(source, target=target)))
    rate, name = check_sample_rate(target if sample_rate is None else sample_rate), "the audio array"
    samples = to_mono(float_samples(source, name))
    if samples.size == 0:
        raise InputError(f"{name} has no samples", fix="pass audio that is at least a fraction of a second long")
    return resample(samples, rate, target)


def check_sample_rate(rate) -> int:
    """`rate` as an int when it is a positive integer number of Hz (True is not 1 Hz, 0 not "the default")."""
    if isinstance(rate, (bool, np.bool_)) or not isinstance(rate, (int, np.integer)) or rate <= 0:
        raise UsageError(f"sample_rate must be a positive integer (Hz), got {rate!r}",
                         fix="pass the rate the audio was recorded at, e.g. sample_rate=48000")
    return int(rate)


def float_samples(samples, name: str = "the audio array") -> np.ndarray:
    """float32 samples from float or PCM integer ones (scaled to [-1, 1)); InputError for anything else and for
    NaN or infinite samples, which a model would turn into confident nonsense."""
    samples = np.asarray(samples)
    if samples.dtype.kind not in "fiu":
        raise InputError(f"{name} has dtype {samples.dtype}", fix="pass float or integer (PCM) samples")
    if samples.dtype.kind == "i":
        samples = samples.astype(np.float32) / np.float32(-np.iinfo(samples.dtype).min)
    elif samples.dtype.kind == "u":  # unsigned PCM (8-bit WAV) is centred on its midpoint
        half = np.float32(np.iinfo(samples.dtype).max // 2 + 1)
        samples = (samples.astype(np.float32) - half) / half
    samples = samples.astype(np.float32, copy=False)
    if not np.isfinite(samples).all():
        raise InputError(f"{name} contains NaN or infinite samples", fix="check how the audio was produced")
    return samples


# ---- spectral building blocks ----------------------------------------------------------------------

def hann_window(length: int, *, periodic: bool = True) -> np.ndarray:
    """Hann window (periodic, as torch.hann_window and STFT front ends use by default)."""
    n = length if periodic else length - 1
    return (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(length) / n)).astype(np.float64)


def power_spectrum(samples: np.ndarray, *, n_fft: int, hop: int, window: np.ndarray, center: bool = True,
                   pad_mode: str = "reflect") -> np.ndarray:
    """|STFT|^2 as [frames, n_fft // 2 + 1] (float64), like torch.stft(..., center=center) with `window`
    (shorter windows are zero-padded to n_fft on both sides, as torch does)."""
    x = np.asarray(samples, dtype=np.float64)
    if len(window) < n_fft:
        left = (n_fft - len(window)) // 2
        window = np.pad(window, (left, n_fft - len(window) - left))
    if center:
        x = np.pad(x, n_fft // 2, mode=pad_mode)
    frames = np.lib.stride_tricks.sliding_window_view(x, n_fft)[::hop]
    # a block of frames at a time: the windowed frames and their spectrum of a whole 30 s Whisper window would be
    # 29 MB of float64 and complex128 temporaries at once, on top of a resident model (the same numbers either way)
    power = np.empty((len(frames), n_fft // 2 + 1))
    for i in range(0, len(frames), _STFT_BLOCK):
        spec = np.fft.rfft(frames[i:i + _STFT_BLOCK] * window, axis=-1)
        power[i:i + _STFT_BLOCK] = spec.real ** 2 + spec.imag ** 2
    return power


_STFT_BLOCK = 256  # frames per block of power_spectrum: 0.8 MB of spectrum at Whisper's n_fft


def _hz_to_mel(f, scale: str):
    f = np.asarray(f, dtype=np.float64)
    if scale == "htk":
        return 2595.0 * np.log10(1.0 + f / 700.0)
    # Slaney: linear below 1 kHz, logarithmic above
    return np.where(f < 1000.0, 3.0 * f / 200.0, 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / (np.log(6.4) / 27.0))


def _mel_to_hz(m, scale: str):
    m = np.asarray(m, dtype=np.float64)
    if scale == "htk":
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)
    return np.where(m < 15.0, 200.0 * m / 3.0, 1000.0 * np.exp((np.log(6.4) / 27.0) * (m - 15.0)))


def mel_filters(*, sample_rate: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None,
                scale: str = "slaney", norm: str | None = "slaney") -> np.ndarray:
    """Triangular mel filter bank [n_mels, n_fft // 2 + 1] (float64). `scale` "slaney" or "htk";
    `norm` "slaney" (each filter divided by its width in Hz, constant energy) or None (peak 1)."""
    fmax = sample_rate / 2 if fmax is None else fmax
    freqs = np.linspace(0, sample_rate / 2, n_fft // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(fmin, scale), _hz_to_mel(fmax, scale), n_mels + 2), scale)
    lower = (freqs[None, :] - edges[:-2, None]) / (edges[1:-1] - edges[:-2])[:, None]
    upper = (edges[2:, None] - freqs[None, :]) / (edges[2:] - edges[1:-1])[:, None]
    banks = np.maximum(0.0, np.minimum(lower, upper))
    if norm == "slaney":
        banks *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    elif norm is not None:
        raise ValueError(f"unknown mel norm {norm!r}")
    return banks


# ---- Whisper ---------------------------------------------------------------------------------------

WHISPER_N_FFT, WHISPER_HOP, WHISPER_CHUNK = 400, 160, 30 * SAMPLE_RATE
_whisper_banks: dict[int, np.ndarray] = {}


def whisper_log_mel(samples: np.ndarray, n_mels: int = 80, *, n_samples: int = WHISPER_CHUNK) -> np.ndarray:
    """Whisper's log-mel [n_mels, n_samples // 160] of 16 kHz audio, zero-padded (or cut) to `n_samples`:
    periodic Hann STFT (400/160, centred, reflect), Slaney mel 0-8 kHz, log10 floored at 1e-10, clamped to
    (max - 8), scaled (x + 4) / 4. The same numbers as transformers' WhisperFeatureExtractor (<= 1e-4)."""
    n = min(len(samples), n_samples)
    # only the audio and n_fft zeros after it are transformed: every later frame sees zeros alone (power 0), so
    # it is the log floor, -10, without an FFT (a 5 s clip in a 30 s window is a sixth of the work)
    x = np.zeros(min(n_samples, n + WHISPER_N_FFT), np.float64)
    x[:n] = samples[:n]
    if n_mels not in _whisper_banks:
        _whisper_banks[n_mels] = mel_filters(sample_rate=SAMPLE_RATE, n_fft=WHISPER_N_FFT, n_mels=n_mels,
                                             fmax=8000.0)
    power = power_spectrum(x, n_fft=WHISPER_N_FFT, hop=WHISPER_HOP, window=hann_window(WHISPER_N_FFT))[:-1]
    mel = np.full((n_mels, n_samples // WHISPER_HOP), -10.0)
    mel[:, :len(power)] = np.log10(np.maximum(_whisper_banks[n_mels] @ power.T, 1e-10))
    mel = np.maximum(mel, mel.max() - 8.0)
    return ((mel + 4.0) / 4.0).astype(np.float32)


# ---- conformer front ends: Parakeet (NeMo) and GigaAM ----------------------------------------------

def nemo_log_mel(samples: np.ndarray, *, n_mels: int = 80, n_fft: int = 512, win_length: int = 400, hop: int = 160,
                 preemphasis: float = 0.97, normalize: str | None = "per_feature") -> np.ndarray:
    """NeMo / Parakeet log-mel [len // hop, n_mels]: pre-emphasis, symmetric Hann window zero-padded to n_fft,
    centred STFT with zero padding, Slaney mel, log(x + 2^-24), then per-feature normalisation over the frames
    (mean, unbiased std + 1e-5). The same numbers as transformers' ParakeetFeatureExtractor (<= 1e-4)."""
    x = np.asarray(samples, dtype=np.float64)
    if preemphasis:
        x = np.concatenate([x[:1], x[1:] - preemphasis * x[:-1]])
    power = power_spectrum(x, n_fft=n_fft, hop=hop, window=hann_window(win_length, periodic=False),
                           pad_mode="constant")[:len(x) // hop]
    mel = np.log(power @ mel_filters(sample_rate=SAMPLE_RATE, n_fft=n_fft, n_mels=n_mels).T + 2.0 ** -24)
    if normalize == "per_feature":
        mean = mel.mean(axis=0)
        std = np.sqrt(((mel - mean) ** 2).sum(axis=0) / max(len(mel) - 1, 1))
        mel = (mel - mean) / (std + 1e-5)
    elif normalize is not None:
        raise ValueError(f"unknown normalisation {normalize!r}")
    return mel.astype(np.float32)


def gigaam_log_mel(samples: np.ndarray, *, n_mels: int = 64) -> np.ndarray:
    """GigaAM log-mel [len // 160 + 1, n_mels]: torchaudio MelSpectrogram settings (n_fft = win = 400, hop 160,
    periodic Hann, centred reflect padding, power 2, HTK mel without norm), then log(clamp(x, 1e-9, 1e9))."""
    power = power_spectrum(samples, n_fft=400, hop=160, window=hann_window(400))
    banks = mel_filters(sample_rate=SAMPLE_RATE, n_fft=400, n_mels=n_mels, scale="htk", norm=None)
    return np.log(np.clip(power @ banks.T, 1e-9, 1e9)).astype(np.float32)
