"""Op references against closed forms and direct definitions (the references are the spec, so they are
checked against something independent of numpy's own vectorised path)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from sdk import ops
from sdk.graph import trace

rng = np.random.default_rng(0)


def test_gelu_matches_erf_definition():
    x = np.linspace(-8, 8, 2001).astype(np.float32)
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    assert np.abs(ops.gelu(x) - exact).max() <= np.spacing(np.float32(8)) / 2  # float32's rounding, no more


def test_gelu_tanh_sigmoid_silu_closed_forms():
    x = np.linspace(-30, 30, 601).astype(np.float32)
    assert np.abs(ops.sigmoid(x) - 1 / (1 + np.exp(-x.astype(np.float64)))).max() < 1e-7
    assert np.abs(ops.silu(x) - x / (1 + np.exp(-x.astype(np.float64)))).max() < 1e-5
    x64 = x.astype(np.float64)  # the tanh form itself (it differs from the erf GELU by up to ~5e-4)
    tanh_form = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3)))
    assert np.abs(ops.gelu_tanh(x) - tanh_form).max() < 2e-6  # measured 3.3e-7; the erf GELU is 4.7e-4 away
    assert np.isfinite(ops.sigmoid(np.float32([-1e4, 1e4]))).all()
    assert np.array_equal(ops.exp(x), np.exp(x))


def test_softmax_and_log_softmax():
    x = (np.round(rng.normal(size=(3, 5)) * 640) / 64).astype(np.float32)  # in 1/64ths: x + 1000 is exact
    p = ops.softmax(x)
    assert np.allclose(p.sum(-1), 1, atol=1e-6)
    assert np.allclose(np.exp(ops.log_softmax(x)), p, atol=1e-6)
    assert np.allclose(ops.softmax(x + 1000), p, atol=1e-6)  # shift invariant, no overflow


def test_layer_norm_and_rms_norm_statistics():
    x = rng.normal(3, 2, size=(4, 64)).astype(np.float32)
    y = ops.layer_norm(x, np.ones(64, np.float32), np.zeros(64, np.float32), eps=1e-12)
    assert np.allclose(y.mean(-1), 0, atol=1e-5) and np.allclose(y.std(-1), 1, atol=1e-4)
    r = ops.rms_norm(x, np.ones(64, np.float32), eps=0.0)
    assert np.allclose(np.sqrt((r * r).mean(-1)), 1, atol=1e-5)


def test_attention_with_mask_equals_attention_on_visible_keys():
    q, k, v = (rng.normal(size=(2, 3, 4, 8)).astype(np.float32) for _ in range(3))
    mask = np.where(np.arange(4) < 3, 0, ops.NEG_INF).astype(np.float32)
    full = ops.attention(q, k, v, mask, scale=0.3)
    cut = ops.attention(q, k[..., :3, :], v[..., :3, :], None, scale=0.3)
    assert np.abs(full - cut).max() < 1e-6


def attention_float64(q, k, v, mask, scale):
    s = (q.astype(np.float64) * scale) @ np.swapaxes(k.astype(np.float64), -1, -2) + (0 if mask is None else mask)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v.astype(np.float64)


@pytest.mark.parametrize("case, tol", [
    ("moderate scores", 2e-6),
    ("scores up to ~200: e^s would overflow without the row max", 2e-5),
    ("every score below -57", 2e-5),
    ("a fully masked row", 2e-6),
])
def test_attention_is_softmax_to_float32_rounding_whatever_the_scores(case, tol):
    q, k, v = (rng.normal(size=(1, 4, 64, 32)).astype(np.float32) for _ in range(3))
    mask = None
    if case.startswith("scores up to"):
        q, k = q * 6, k * 6
    elif case.startswith("every score"):
        q, k = np.abs(q) * 3 + 3, -np.abs(k) * 3 - 3  # each of q . k's 32 terms <= -9: scores <= -57.6
    elif case.startswith("a fully masked"):
        mask = np.zeros((64, 64), np.float32)  # broadcast over the 4 heads: each has the masked row
        mask[5] = ops.NEG_INF
    ours, ref = ops.attention(q, k, v, mask, scale=0.2), attention_float64(q, k, v, mask, 0.2)
    assert np.isfinite(ours).all()
    assert np.abs(ours - ref).max() <= tol * np.abs(ref).max()


def conv2d_direct(x, w, b, stride, pad, groups):
    B, C, H, W = x.shape
    O, Cg, KH, KW = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    Ho, Wo = (H + 2 * pad - KH) // stride + 1, (W + 2 * pad - KW) // stride + 1
    out = np.zeros((B, O, Ho, Wo))
    og = O // groups
    for o in range(O):
        g = o // og
        for i in range(Ho):
            for j in range(Wo):
                patch = xp[:, g * Cg:(g + 1) * Cg, i * stride:i * stride + KH, j * stride:j * stride + KW]
                out[:, o, i, j] = (patch * w[o]).sum(axis=(1, 2, 3)) + b[o]
    return out


@pytest.mark.parametrize("stride,pad,groups", [(1, 0, 1), (2, 1, 1), (1, 1, 4), (2, 1, 2)])
def test_conv2d_matches_direct_loops(stride, pad, groups):
    x = rng.normal(size=(2, 4, 7, 6)).astype(np.float32)
    w = rng.normal(size=(8, 4 // groups, 3, 3)).astype(np.float32)
    b = rng.normal(size=8).astype(np.float32)
    got = ops.conv2d(x, w, b, stride=stride, padding=pad, groups=groups)
    assert np.abs(got - conv2d_direct(x, w, b, stride, pad, groups)).max() < 1e-4


def test_conv1d_matches_direct_sum():
    x = rng.normal(size=(1, 3, 20)).astype(np.float32)
    w = rng.normal(size=(5, 3, 3)).astype(np.float32)
    got = ops.conv1d(x, w, None, stride=2, padding=1)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1)))
    ref = np.stack([np.einsum("ock,ck->o", w, xp[0, :, 2 * t:2 * t + 3]) for t in range(10)], axis=-1)
    assert got.shape == (1, 5, 10) and np.abs(got[0] - ref).max() < 1e-5


def test_max_pool_and_glu():
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    assert ops.max_pool2d(x, kernel=2, stride=2).ravel().tolist() == [5, 7, 13, 15]
    x = rng.normal(size=(2, 3, 11, 8)).astype(np.float32)  # ResNet's 3 x 3, stride 2, padding 1; odd sizes
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    ref = np.array([[[[xp[b, c, 2 * i:2 * i + 3, 2 * j:2 * j + 3].max() for j in range(4)] for i in range(6)]
                     for c in range(3)] for b in range(2)])
    assert np.array_equal(ops.max_pool2d(x, kernel=3, stride=2, padding=1), ref)
    a = rng.normal(size=(2, 6)).astype(np.float32)
    assert np.allclose(ops.glu(a, axis=-1), a[:, :3] / (1 + np.exp(-a[:, 3:])), atol=1e-6)


def test_rotary_rotates_pairs_by_the_angle():
    x = np.array([[1.0, 0.0, 0.0, 1.0]], np.float32)  # pairs (x0, x2) and (x1, x3)
    theta = np.array([0.3, 0.7], np.float32)
    cos, sin = np.cos(np.tile(theta, 2)), np.sin(np.tile(theta, 2))
    y = ops.rotary(x, cos, sin)
    assert np.allclose([y[0, 0], y[0, 2]], [np.cos(0.3), np.sin(0.3)], atol=1e-6)
    assert np.allclose([y[0, 1], y[0, 3]], [-np.sin(0.7), np.cos(0.7)], atol=1e-6)


def test_masks_positions_and_cache_write():
    m = ops.causal_cache_mask(np.int32(2), n_new=2, size=5)
    assert (m == 0).tolist() == [[True, True, True, False, False], [True, True, True, True, False]]
    assert (ops.length_mask(np.int32(3), size=5) == 0).tolist() == [True, True, True, False, False]
    assert ops.positions(np.int32(4), n=3).tolist() == [4, 5, 6]
    cache = np.zeros((2, 6, 3), np.float32)
    out = ops.cache_write(cache, np.ones((2, 2, 3), np.float32), np.int32(3), axis=1)
    assert out is cache and cache[:, 3:5].all() and not cache[:, :3].any() and not cache[:, 5:].any()


def test_every_op_has_a_docstring_and_shape_rule_that_agrees_with_its_reference():
    for name, op in ops.OPS.items():
        assert op.ref.__doc__, f"{name} is undocumented"
    x = rng.normal(size=(2, 3, 8)).astype(np.float32)

    def fn(w, x):
        return {"y": ops.layer_norm(x, w["g"], w["b"], eps=1e-5).transpose(0, 2, 1)[:, 1:5, ::2].reshape(2, -1)}
    g = trace(fn, name="t", weights={"g": (8,), "b": (8,)}, inputs={"x": (x.shape, "float32")})
    y = fn({"g": np.ones(8, np.float32), "b": np.zeros(8, np.float32)}, x)["y"]
    assert g.values[g.outputs["y"]].shape == y.shape
