"""The op set: every computation a model may use, each with its numpy reference.

This file is the definition of each op: the oracle every backend is judged against. Model files call these
functions; on numpy arrays they compute eagerly, on `graph.Tensor`s they record a node (see graph.py). They
are written for clarity, never tuned: fast paths belong to a backend (the cpu backend runs ONNX Runtime), the
NPU's approximations to the emulator.

Conventions: float tensors are float32; `linear` weights are stored [out, in] as in PyTorch; tensor
arguments are positional (None for an absent optional tensor), everything else is a keyword attribute.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

NEG_INF = np.float32(-2.0 ** 100)  # additive mask value (~-1.27e30); finite so that a fully masked row stays
# finite, and a power of two so that it is exact in bf16 too: masks keep cancelling exactly (NEG_INF - NEG_INF
# == 0) after the NPU stores them in bf16


@dataclass(frozen=True)
class Op:
    name: str
    ref: Callable[..., np.ndarray]
    shape: Callable[..., tuple]  # (input shapes..., **attrs) -> output shape
    dtype: Callable[..., str] = field(default=lambda *dtypes, **_: dtypes[0])
    inplace: int | None = None  # index of the input this op writes into (state updates)
    variadic: bool = False      # takes a list of tensors as its only positional argument

    def __call__(self, *args, **attrs):
        tensors = args[0] if self.variadic else args
        for t in tensors:
            if getattr(t, "symbolic", False):
                return t.graph.record(self, args, attrs)
        return self.ref(*args, **attrs)


OPS: dict[str, Op] = {}


def _op(shape, dtype=None, inplace=None, variadic=False):
    def register(fn):
        kw = {"dtype": dtype} if dtype else {}
        OPS[fn.__name__] = Op(fn.__name__, fn, shape, inplace=inplace, variadic=variadic, **kw)
        return OPS[fn.__name__]
    return register


def _same(x, *rest, **_):
    return tuple(x)


def _broadcast(a, b, **_):
    return tuple(np.broadcast_shapes(a, b))


# ---- elementwise -------------------------------------------------------------------------------

@_op(_broadcast)
def add(a, b):
    """a + b with numpy broadcasting."""
    return np.add(a, b)


@_op(_broadcast)
def sub(a, b):
    """a - b with numpy broadcasting."""
    return np.subtract(a, b)


@_op(_broadcast)
def mul(a, b):
    """a * b with numpy broadcasting."""
    return np.multiply(a, b)


@_op(_broadcast)
def div(a, b):
    """a / b with numpy broadcasting."""
    return np.divide(a, b)


@_op(_same)
def scale(x, *, factor: float):
    """x * factor for a compile-time constant factor."""
    return (x * np.float32(factor)).astype(x.dtype, copy=False)


_erf = np.frompyfunc(math.erf, 1, 1)


@_op(_same)
def gelu(x):
    """Exact GELU: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), erf from the C library, in float64."""
    x64 = np.asarray(x, np.float64)
    return (0.5 * x64 * (1.0 + _erf(x64 / math.sqrt(2)).astype(np.float64))).astype(np.float32)


@_op(_same)
def gelu_tanh(x):
    """GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return (0.5 * x * (1.0 + np.tanh(np.float32(np.sqrt(2 / np.pi)) * (x + 0.044715 * x ** 3)))).astype(np.float32)


@_op(_same)
def sigmoid(x):
    """1 / (1 + exp(-x))."""
    with np.errstate(over="ignore"):  # exp(-x) is inf for x < -88: the limit 0 is right
        return (1 / (1 + np.exp(-x))).astype(x.dtype)


@_op(_same)
def silu(x):
    """x * sigmoid(x) (a.k.a. swish)."""
    return x * sigmoid(x)


@_op(_same)
def relu(x):
    """max(x, 0)."""
    return np.maximum(x, 0)


@_op(_same)
def tanh(x):
    """Hyperbolic tangent."""
    return np.tanh(x)


@_op(_same)
def exp(x):
    """e^x."""
    return np.exp(x)


def _halved(x, *, axis):
    shape = list(x)
    shape[axis] //= 2
    return tuple(shape)


@_op(_halved)
def glu(x, *, axis: int):
    """Gated linear unit along `axis`: first half * sigmoid(second half)."""
    a, b = np.split(x, 2, axis=axis)
    return a * sigmoid(b)


# ---- reductions and normalisation ----------------------------------------------------------------

@_op(_same)
def softmax(x, *, axis: int = -1):
    """exp(x - max) / sum, along `axis` (the row max subtracted: e^x never overflows)."""
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@_op(_same)
def log_softmax(x, *, axis: int = -1):
    """x - logsumexp(x), along `axis`."""
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


@_op(_same)
def layer_norm(x, w, b, *, eps: float):
    """(x - mean) / sqrt(var + eps) * w + b over the last axis (biased variance)."""
    centred = x - x.mean(axis=-1, keepdims=True)
    variance = (centred * centred).mean(axis=-1, keepdims=True)
    y = centred / np.sqrt(variance + np.float32(eps)) * w
    return y if b is None else y + b


@_op(_same)
def rms_norm(x, w, *, eps: float):
    """x / sqrt(mean(x^2) + eps) * w over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps)) * w


def _reduced(x, *, axis, keepdims=False):
    axes = {a % len(x) for a in np.atleast_1d(axis)}
    return tuple(1 if i in axes else n for i, n in enumerate(x) if keepdims or i not in axes)


@_op(_reduced)
def mean(x, *, axis, keepdims: bool = False):
    """Arithmetic mean over `axis` (an int or a tuple of ints)."""
    return x.mean(axis=axis if isinstance(axis, int) else tuple(axis), keepdims=keepdims)


@_op(_reduced, dtype=lambda *_, **__: "int32")
def argmax(x, *, axis: int = -1, keepdims: bool = False):
    """Index of the largest value along `axis` (first one on ties), int32."""
    return np.argmax(x, axis=axis, keepdims=keepdims).astype(np.int32)


# ---- linear algebra ------------------------------------------------------------------------------

@_op(lambda x, w, b=None, **_: tuple(x[:-1]) + (w[0],))
def linear(x, w, b=None):
    """x @ w.T + b, with w stored [out, in]."""
    y = x @ w.T
    return y if b is None else y + b


def _matmul_shape(a, b, *, transpose_b=False):
    k_b, n = (b[-1], b[-2]) if transpose_b else (b[-2], b[-1])
    if a[-1] != k_b:
        raise ValueError(f"matmul: inner dimensions differ: {a} @ {b} (transpose_b={transpose_b})")
    return tuple(np.broadcast_shapes(a[:-2], b[:-2])) + (a[-2], n)


@_op(_matmul_shape)
def matmul(a, b, *, transpose_b: bool = False):
    """Batched a @ b (or a @ b^T), broadcasting leading dimensions."""
    return a @ (np.swapaxes(b, -1, -2) if transpose_b else b)


@_op(lambda q, k, v, mask=None, **_: tuple(q[:-1]) + (v[-1],))
def attention(q, k, v, mask=None, *, scale: float):
    """softmax(q k^T * scale + mask) v over the last two axes; mask is additive and broadcasts."""
    scores = q @ np.swapaxes(k, -1, -2) * np.float32(scale)
    if mask is not None:
        scores = scores + mask
    return softmax(scores, axis=-1) @ v


# ---- shape and data movement ---------------------------------------------------------------------

def _reshape_shape(x, *, shape):
    shape = list(shape)
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1]))
        shape[shape.index(-1)] = int(np.prod(x)) // known
    if int(np.prod(shape)) != int(np.prod(x)):
        raise ValueError(f"reshape: cannot view {tuple(x)} as {tuple(shape)}")
    return tuple(shape)


@_op(_reshape_shape)
def reshape(x, *, shape):
    """View with a new shape (one -1 allowed)."""
    return x.reshape(shape)


@_op(lambda x, *, perm: tuple(x[p] for p in perm))
def transpose(x, *, perm):
    """Permute axes (a view)."""
    return np.transpose(x, perm)


def _slice_shape(x, *, axis, start, stop, step=1):
    shape = list(x)
    shape[axis] = len(range(*slice(start, stop, step).indices(x[axis])))
    return tuple(shape)


@_op(_slice_shape)
def slice_axis(x, *, axis: int, start: int, stop: int, step: int = 1):
    """x[..., start:stop:step, ...] along one axis."""
    index = [slice(None)] * x.ndim
    index[axis] = slice(start, stop, step)
    return x[tuple(index)]


def _concat_shape(shapes, *, axis):
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    return tuple(out)


@_op(_concat_shape, variadic=True)
def concat(xs, *, axis: int):
    """Join tensors along `axis`."""
    return np.concatenate(xs, axis=axis)


@_op(lambda x, *, pads, value=0.0: tuple(n + a + b for n, (a, b) in zip(x, pads)))
def pad(x, *, pads, value: float = 0.0):
    """Constant padding; pads = ((before, after), ...) per axis."""
    return np.pad(x, pads, constant_values=value)


@_op(lambda table, ids, **_: tuple(ids) + tuple(table[1:]),
     dtype=lambda table, ids, **_: table)
def embedding(table, ids):
    """Rows of `table` at integer `ids` (any shape)."""
    return table[ids]


@_op(_same)
def rotary(x, cos, sin):
    """Rotary position embedding, rotate-half form: x * cos + rotate_half(x) * sin."""
    h = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    return x * cos + rotated * sin


# ---- convolution and pooling ---------------------------------------------------------------------

def _conv_out(n, k, stride, pad, dilation=1):
    return (n + 2 * pad - dilation * (k - 1) - 1) // stride + 1


@_op(lambda x, w, b=None, *, stride=1, padding=0, groups=1, dilation=1:
     (x[0], w[0], _conv_out(x[2], w[2], stride, padding, dilation)))
def conv1d(x, w, b=None, *, stride: int = 1, padding: int = 0, groups: int = 1, dilation: int = 1):
    """1-D convolution (cross-correlation) of x [B, C, L] with w [O, C/groups, K], zero padding."""
    return conv2d(x[:, :, None, :], w[:, :, None, :], b, stride=(1, stride), padding=(0, padding),
                  groups=groups, dilation=(1, dilation))[:, :, 0, :]


def pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _conv2d_shape(x, w, b=None, *, stride=1, padding=0, groups=1, dilation=1):
    (sh, sw), (ph, pw), (dh, dw) = pair(stride), pair(padding), pair(dilation)
    return (x[0], w[0], _conv_out(x[2], w[2], sh, ph, dh), _conv_out(x[3], w[3], sw, pw, dw))


@_op(_conv2d_shape)
def conv2d(x, w, b=None, *, stride=1, padding=0, groups: int = 1, dilation=1):
    """2-D convolution of x [B, C, H, W] with w [O, C/groups, KH, KW], zero padding, via im2col."""
    (sh, sw), (ph, pw), (dh, dw) = pair(stride), pair(padding), pair(dilation)
    B, C, _, _ = x.shape
    O, Cg, KH, KW = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (dh * (KH - 1) + 1, dw * (KW - 1) + 1), axis=(2, 3))
    win = win[:, :, ::sh, ::sw, ::dh, ::dw]  # [B, C, Ho, Wo, KH, KW]
    Ho, Wo = win.shape[2:4]
    # columns [Cg*KH*KW, Ho*Wo]: each (c, kh, kw) row is a shifted [Ho, Wo] window of the image, so the copy
    # runs along image rows, and the product is [Og, Ho*Wo], the output's own layout (no transpose after)
    win = win.reshape(B, groups, Cg, Ho, Wo, KH, KW).transpose(0, 1, 2, 5, 6, 3, 4)
    cols = win.reshape(B, groups, Cg * KH * KW, Ho * Wo)
    y = (w.reshape(groups, O // groups, Cg * KH * KW) @ cols).reshape(B, O, Ho, Wo)  # [B, G, Og, Ho*Wo]
    return y if b is None else y + b[None, :, None, None]


def _pool_shape(x, *, kernel, stride, padding=0):
    return (x[0], x[1], _conv_out(x[2], kernel, stride, padding), _conv_out(x[3], kernel, stride, padding))


@_op(_pool_shape)
def max_pool2d(x, *, kernel: int, stride: int, padding: int = 0):
    """Max pooling over [B, C, H, W]; padding counts as -inf: the max over the window offsets, each a strided
    view of the padded input."""
    B, C, Ho, Wo = _pool_shape(x.shape, kernel=kernel, stride=stride, padding=padding)
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)), constant_values=-np.inf)
    shifted = [xp[:, :, i:i + stride * (Ho - 1) + 1:stride, j:j + stride * (Wo - 1) + 1:stride]
               for i in range(kernel) for j in range(kernel)]
    return np.max(np.stack(shifted), axis=0)


# ---- masks and state (runtime parameters) --------------------------------------------------------

@_op(lambda pos, *, n_new, size: (n_new, size), dtype=lambda *_, **__: "float32")
def causal_cache_mask(pos, *, n_new: int, size: int):
    """Additive mask [n_new, size] for queries at absolute positions pos..pos+n_new-1 over a key cache:
    key j is visible to query i when j <= pos + i."""
    q = int(pos) + np.arange(n_new)[:, None]
    return np.where(np.arange(size)[None, :] <= q, np.float32(0), NEG_INF).astype(np.float32)


@_op(lambda length, *, size: (size,), dtype=lambda *_, **__: "float32")
def length_mask(length, *, size: int):
    """Additive mask [size]: 0 for the first `length` positions, NEG_INF after (padding)."""
    return np.where(np.arange(size) < int(length), np.float32(0), NEG_INF).astype(np.float32)


@_op(lambda pos, *, n: (n,), dtype=lambda *_, **__: "int32")
def positions(pos, *, n: int):
    """The int32 positions pos, pos+1, ..., pos+n-1 (for position-embedding lookups)."""
    return (int(pos) + np.arange(n)).astype(np.int32)


@_op(lambda cache, value, pos, *, axis: tuple(cache), inplace=0)
def cache_write(cache, value, pos, *, axis: int):
    """Write `value` into `cache` at offset `pos` along `axis`, in place (KV cache update)."""
    index = [slice(None)] * cache.ndim
    index[axis] = slice(int(pos), int(pos) + value.shape[axis])
    cache[tuple(index)] = value
    return cache


@_op(lambda dst, value: tuple(dst), inplace=0)
def assign(dst, value):
    """Overwrite the whole of `dst` with `value`, in place (e.g. cross-attention K/V per window)."""
    dst[...] = value
    return dst
