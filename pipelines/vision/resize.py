"""Resizing exactly as PIL's Image.resize does it (the separable ImagingResample, PIL's fixed-point weights and
rounding), in numpy: transformers' PIL image processors resize this way, so the pixels the model sees match."""
from __future__ import annotations

import functools
import math

import numpy as np

from sdk.errors import UsageError

def _triangle(t):
    return np.maximum(1.0 - np.abs(t), 0.0)


def _bicubic(t, a=-0.5):  # PIL's cubic kernel uses a = -0.5
    t = np.abs(t)
    return np.where(t < 1, ((a + 2) * t - (a + 3)) * t * t + 1, np.where(t < 2, (((t - 5) * t + 8) * t - 4) * a, 0.0))


def _lanczos(t):
    return np.where(np.abs(t) < 3, np.sinc(t) * np.sinc(t / 3), 0.0)


def _box(t):
    return ((t > -0.5) & (t <= 0.5)).astype(np.float64)


# PIL resample codes (Image.Resampling): filter and support
_FILTERS = {1: (_lanczos, 3.0), 2: (_triangle, 1.0), 3: (_bicubic, 2.0), 4: (_box, 0.5)}
_PRECISION_BITS = 22  # PIL's fixed point for 8-bit images: 32 - 8 - 2


@functools.lru_cache(maxsize=64)
def _pil_taps(n_in: int, n_out: int, resample: int) -> tuple[np.ndarray, np.ndarray]:
    """PIL's separable resize (ImagingResample) for one axis: per output pixel, the input indices [n_out, K]
    and integer weights [n_out, K] in PIL's fixed point (unused taps have weight 0)."""
    scale = n_in / n_out
    if resample == 0:  # nearest
        idx = np.minimum(((np.arange(n_out) + 0.5) * scale).astype(np.int64), n_in - 1)[:, None]
        return idx, np.full((n_out, 1), 1 << _PRECISION_BITS, np.int32)
    if resample not in _FILTERS:
        raise UsageError(f"unsupported resample filter {resample}", fix="use 0 nearest, 1 lanczos, 2 bilinear, "
                                                                        "3 bicubic or 4 box")
    kernel, support = _FILTERS[resample]
    fscale = max(scale, 1.0)
    support *= fscale
    taps = int(math.ceil(support)) * 2 + 1
    idx, weights = np.zeros((n_out, taps), np.int64), np.zeros((n_out, taps), np.int32)
    for i in range(n_out):
        center = (i + 0.5) * scale
        lo, hi = max(int(center - support + 0.5), 0), min(int(center + support + 0.5), n_in)
        w = kernel((np.arange(lo, hi) - center + 0.5) / fscale)
        w = w / w.sum() if w.sum() else w
        idx[i, :hi - lo] = np.arange(lo, hi)
        weights[i, :hi - lo] = np.where(w < 0, np.trunc(-0.5 + w * (1 << _PRECISION_BITS)),
                                        np.trunc(0.5 + w * (1 << _PRECISION_BITS)))
    return idx, weights


def _resample_axis(image: np.ndarray, n_out: int, resample: int, axis: int) -> np.ndarray:
    """One PIL pass over uint8 data: exact integer sums (they fit in int32), PIL's rounding, clipped to uint8."""
    x = np.ascontiguousarray(np.moveaxis(image, axis, 0)).astype(np.int32)
    idx, weights = _pil_taps(x.shape[0], n_out, resample)
    acc = np.full((n_out,) + x.shape[1:], 1 << (_PRECISION_BITS - 1), np.int32)
    for k in range(idx.shape[1]):
        acc += weights[:, k].reshape((-1,) + (1,) * (x.ndim - 1)) * x[idx[:, k]]
    return np.moveaxis(np.clip(acc >> _PRECISION_BITS, 0, 255).astype(np.uint8), 0, axis)


def resize(image: np.ndarray, height: int, width: int, resample: int) -> np.ndarray:
    """Resize an RGB uint8 image [H, W, 3] like PIL's Image.resize (horizontal pass, then vertical)."""
    h, w = image.shape[:2]
    if w != width:
        image = _resample_axis(image, width, resample, axis=1)
    if h != height:
        image = _resample_axis(image, height, resample, axis=0)
    return image
