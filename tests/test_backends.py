"""Backend conformance, in the spirit of ggml's test-backend-ops: each op of sdk/ops.py has ONE test case,
written once, run on every backend, and compared with the op's numpy reference. A backend joins by adding
a row to BACKENDS (the npu backend runs under the `npu` mark on real hardware)."""
from __future__ import annotations

import numpy as np
import pytest

from sdk import ops
from sdk.graph import trace
from sdk.ops import OPS
from sdk.session import Session

TOL = 1e-2  # rel-L2 for float results (bf16 storage on the NPU backends); integer results must be equal

BACKENDS = [
    pytest.param("cpu", None, id="cpu"),
    pytest.param("emu", "npu1", id="emu-npu1"),
    pytest.param("emu", "npu2", id="emu-npu2"),
    pytest.param("npu", None, id="npu", marks=pytest.mark.npu),  # real hardware; tests/test_backends_npu.py: fake pyxrt
]

F, I = "float32", "int32"


def case(fn, inputs=None, weights=None, params=None, state=None):
    return {"fn": fn, "inputs": inputs or {}, "weights": weights or {}, "params": params or {}, "state": state or {}}


# name -> how to call the op; inputs/weights: name -> (shape, dtype); params: name -> value; state: name -> shape
CASES = {
    "add": case(lambda w, a, b: ops.add(a, b), {"a": ((2, 3, 8), F), "b": ((8,), F)}),
    "sub": case(lambda w, a, b: ops.sub(a, b), {"a": ((4, 8), F), "b": ((4, 8), F)}),
    "mul": case(lambda w, a, b: ops.mul(a, b), {"a": ((4, 8), F), "b": ((4, 1), F)}),
    "div": case(lambda w, a, b: ops.div(a, b), {"a": ((4, 8), F), "b": ((4, 8), "positive")}),
    "scale": case(lambda w, x: ops.scale(x, factor=-0.37), {"x": ((3, 16), F)}),
    "gelu": case(lambda w, x: ops.gelu(x), {"x": ((3, 64), F)}),
    "gelu_tanh": case(lambda w, x: ops.gelu_tanh(x), {"x": ((3, 64), F)}),
    "sigmoid": case(lambda w, x: ops.sigmoid(x), {"x": ((3, 64), F)}),
    "silu": case(lambda w, x: ops.silu(x), {"x": ((3, 64), F)}),
    "relu": case(lambda w, x: ops.relu(x), {"x": ((3, 64), F)}),
    "tanh": case(lambda w, x: ops.tanh(x), {"x": ((3, 64), F)}),
    "exp": case(lambda w, x: ops.exp(x), {"x": ((3, 64), F)}),
    "glu": case(lambda w, x: ops.glu(x, axis=1), {"x": ((2, 16, 5), F)}),
    "softmax": case(lambda w, x: ops.softmax(x, axis=-1), {"x": ((4, 33), F)}),
    "log_softmax": case(lambda w, x: ops.log_softmax(x, axis=-1), {"x": ((4, 100), F)}),
    "layer_norm": case(lambda w, x: ops.layer_norm(x, w["g"], w["b"], eps=1e-5), {"x": ((2, 5, 24), F)},
                       {"g": ((24,), F), "b": ((24,), F)}),
    "rms_norm": case(lambda w, x: ops.rms_norm(x, w["g"], eps=1e-6), {"x": ((2, 5, 24), F)}, {"g": ((24,), F)}),
    "mean": case(lambda w, x: ops.mean(x, axis=1), {"x": ((2, 7, 12), F)}),
    "argmax": case(lambda w, x: ops.argmax(x, axis=-1), {"x": ((3, 50), "distinct")}),
    "linear": case(lambda w, x: ops.linear(x, w["w"], w["b"]), {"x": ((2, 5, 40), F)},
                   {"w": ((24, 40), F), "b": ((24,), F)}),
    "matmul": case(lambda w, a, b: ops.matmul(a, b, transpose_b=True), {"a": ((2, 3, 6, 16), F),
                                                                      "b": ((2, 3, 9, 16), F)}),
    "attention": case(lambda w, q, k, v, m: ops.attention(q, k, v, m, scale=0.25),
                      {"q": ((1, 2, 5, 16), F), "k": ((1, 2, 7, 16), F), "v": ((1, 2, 7, 16), F),
                       "m": ((1, 1, 1, 7), "mask")}),
    "reshape": case(lambda w, x: ops.reshape(x, shape=(6, -1)), {"x": ((2, 3, 8), F)}),
    "transpose": case(lambda w, x: ops.transpose(x, perm=(2, 0, 1)), {"x": ((2, 3, 8), F)}),
    "slice_axis": case(lambda w, x: ops.slice_axis(x, axis=1, start=1, stop=7, step=2), {"x": ((2, 9, 4), F)}),
    "concat": case(lambda w, a, b: ops.concat([a, b], axis=1), {"a": ((2, 3, 4), F), "b": ((2, 5, 4), F)}),
    "pad": case(lambda w, x: ops.pad(x, pads=((0, 0), (2, 1), (0, 3)), value=0.5), {"x": ((2, 3, 4), F)}),
    "embedding": case(lambda w, ids: ops.embedding(w["t"], ids), {"ids": ((2, 6), "ids:30")}, {"t": ((30, 16), F)}),
    "rotary": case(lambda w, x, c, s: ops.rotary(x, c, s), {"x": ((1, 2, 6, 8), F), "c": ((6, 8), F),
                                                          "s": ((6, 8), F)}),
    "conv1d": case(lambda w, x: ops.conv1d(x, w["w"], w["b"], stride=2, padding=1), {"x": ((1, 6, 20), F)},
                   {"w": ((8, 6, 3), F), "b": ((8,), F)}),
    "conv2d": case(lambda w, x: ops.conv2d(x, w["w"], w["b"], stride=2, padding=1, groups=4),
                   {"x": ((1, 4, 10, 10), F)}, {"w": ((4, 1, 3, 3), F), "b": ((4,), F)}),
    "max_pool2d": case(lambda w, x: ops.max_pool2d(x, kernel=3, stride=2, padding=1), {"x": ((1, 3, 9, 9), F)}),
    "causal_cache_mask": case(lambda w, pos: ops.causal_cache_mask(pos, n_new=3, size=10), params={"pos": 4}),
    "length_mask": case(lambda w, n: ops.length_mask(n, size=12), params={"n": 7}),
    "positions": case(lambda w, pos: ops.positions(pos, n=5), params={"pos": 3}),
    "cache_write": case(lambda w, v, pos, state: ops.cache_write(state["c"], v, pos, axis=2),
                        {"v": ((1, 2, 3, 8), F)}, params={"pos": 4}, state={"c": (1, 2, 10, 8)}),
    "assign": case(lambda w, v, state: ops.assign(state["c"], v), {"v": ((2, 6), F)}, state={"c": (2, 6)}),
}


def test_every_op_has_a_conformance_case():
    assert set(OPS) <= set(CASES), f"ops without a conformance case: {sorted(set(OPS) - set(CASES))}"


def _data(kind, shape, rng):
    if kind == "distinct":  # argmax: no near ties, whatever the storage precision
        return rng.permutation(np.arange(np.prod(shape))).reshape(shape).astype(np.float32)
    if kind == "positive":
        return rng.uniform(0.5, 2.0, shape).astype(np.float32)
    if kind == "mask":
        return np.where(rng.uniform(size=shape) < 0.3, ops.NEG_INF, 0).astype(np.float32)
    if kind.startswith("ids:"):
        return rng.integers(0, int(kind[4:]), shape).astype(np.int32)
    return rng.normal(size=shape).astype(np.float32)


def _build(name):
    c = CASES[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    spec = {n: (s, I if k.startswith("ids") else F) for n, (s, k) in c["inputs"].items()}
    g = trace(lambda w, **kw: {"out": c["fn"](w, **kw)}, name=f"op_{name}",
              weights={n: s for n, (s, _) in c["weights"].items()}, inputs=spec,
              params={n: ((), I) for n in c["params"]}, state={n: (s, F) for n, s in c["state"].items()})
    inputs = {n: _data(k, s, rng) for n, (s, k) in c["inputs"].items()}
    inputs |= {n: np.int32(v) for n, v in c["params"].items()}
    weights = {n: _data(k, s, rng) for n, (s, k) in c["weights"].items()}
    initial = {n: rng.normal(size=s).astype(np.float32) for n, s in c["state"].items()}
    return g, weights, inputs, initial


def _reference(name, weights, inputs, initial):
    c = CASES[name]
    kw = dict(inputs)
    if initial:
        kw["state"] = {n: a.copy() for n, a in initial.items()}
    return np.asarray(c["fn"]({n: a for n, a in weights.items()}, **kw))


@pytest.mark.parametrize("device,target", BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_op_matches_reference(name, device, target, record_parity):
    g, weights, inputs, initial = _build(name)
    expected = _reference(name, weights, inputs, initial)
    with Session([g], weights, device=device, target=target) as s:
        state = s.new_state()
        for n, a in initial.items():
            state.buffers[n][...] = a
        out = np.asarray(s.run(state=state, **inputs)["out"])
    assert out.shape == expected.shape
    if expected.dtype.kind != "f":
        assert np.array_equal(out, expected)
        return
    finite = np.isfinite(expected) & (np.abs(expected) < 1e29)  # masks: -1e30 is "minus infinity"
    assert np.array_equal(finite, np.isfinite(out) & (np.abs(out) < 1e29))
    _, rel = record_parity(f"{name}.{device}{'-' + target if target else ''}", out[finite], expected[finite])
    assert rel <= TOL
