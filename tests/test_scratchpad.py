"""Per-run DMA addresses (scratchpad parameters, kernels/README.md "Runtime parameters") from the design to the
host: a decode-shaped graph (embeddings gathered by token id and at the position, through maskgen's positions; a
GEMV whose K and V outputs go into a cache at the position) builds as one fused design whose sequence reads scratchpad words; the build records them in the
manifest; the npu backend writes word = value x scale into each run's control scratchpad before the start; and
tests/fake_pyxrt.py refuses a start whose words on the device do not match the io values on the device.
EMULATED: the fake executes with the emulator's semantics, and the stand-in of IRON checks the designs."""
from __future__ import annotations

import numpy as np
import pytest

from kernels import dataflow as df
from kernels.fused import design as fused_design
from sdk import ops
from sdk.compiler import compile as compile_graphs
from sdk.errors import ArtifactMissing, InputError
from sdk.graph import trace
from sdk.runtime import npu
from sdk.runtime.emu import EmuBackend

from . import fake_pyxrt
from . import iron_standin as standin
from .fake_pyxrt import ContractViolation
from .test_npu_backend import fake_npu  # noqa: F401  (the fixture: a fake Ryzen AI laptop)

VOCAB, WIDTH, CACHE = 40, 32, 12
WEIGHTS = {"table": (VOCAB, WIDTH), "pos_table": (CACHE + 4, WIDTH), "wk": (WIDTH, WIDTH), "wv": (WIDTH, WIDTH)}


def step(w, tokens, pos, state, n):
    x = ops.embedding(w["table"], tokens) + ops.embedding(w["pos_table"], ops.positions(pos, n=n))  # [1, n, WIDTH]
    k = ops.cache_write(state["k"], ops.linear(x, w["wk"]), pos, axis=1)
    v = ops.cache_write(state["v"], ops.linear(x, w["wv"]), pos, axis=1)
    return {"k": k, "v": v}


def graph(n=1):
    """n = 1: a decode step (GEMVs); n = 8: a prefill of 8 tokens (GEMMs: at least the MAC shape's rows)."""
    return trace(step, name="decode", weights=WEIGHTS, inputs={"tokens": ((1, n), "int32")},
                 params={"pos": ((), "int32")}, n=n,
                 state={"k": ((1, CACHE, WIDTH), "float32"), "v": ((1, CACHE, WIDTH), "float32")})


def weights():
    rng = np.random.default_rng(3)
    return {n: rng.standard_normal(s).astype(np.float32) * 0.3 for n, s in WEIGHTS.items()}


def built(target="npu2", n=1):
    """The program, and the scratchpad words per dispatch as kernels/build.py records them."""
    program = npu.device_program(compile_graphs([graph(n)], target))
    with standin.installed():
        fused = fused_design.build(program, target)
    return program, {d: fused.words(fused_design.sequence_symbol(d)) for d in
                     (s.op for e in program.entries.values() for s in e.steps if s.kind == "dispatch")}


def test_the_fused_design_reads_the_position_and_the_token_ids_as_scratchpad_words():
    program, words = built()
    (dispatch, table), = words.items()
    got = {(w["buffer"], w["element"], w["add"], w["scale"], w["limit"]) for w in table.values()}
    assert got == {("decode/tokens", 0, 0, WIDTH, VOCAB - 1),      # the token's row of the table
                   ("decode/pos", 0, 0, WIDTH, CACHE + 3),         # pos_table at maskgen's positions(pos, 1)
                   ("decode/pos", 0, 0, WIDTH, CACHE - 1)}, got    # the cache row K and V go to
    assert sorted(w["index"] for w in table.values()) == list(range(len(table)))
    with standin.installed():
        text = fused_design.build(program, "npu2").mlir()
    assert all(f"aiex.scratchpad_parameter @{n} : i32" in text for n in table)


def test_npu1_refuses_per_run_addresses():
    program = npu.device_program(compile_graphs([graph()], "npu1"))
    with standin.installed(), pytest.raises(df.DesignError, match="no control scratchpad"):
        fused_design.build(program, "npu1")


def run_both(prebuilt, words, positions=(0, 3, CACHE - 1), tokens=(5, VOCAB - 1, 0), n=1):
    from sdk.session import Session
    program = compile_graphs([graph(n)], "npu2")
    fake_pyxrt.write_artifacts(program, prebuilt, scratchpad=words)
    w = weights()
    with Session([graph(n)], w, device="npu") as s_npu, Session([graph(n)], w, device="emu") as s_emu:
        st_npu, st_emu = s_npu.new_state(), s_emu.new_state()
        for pos, tok in zip(positions, tokens):
            ids = tok + np.arange(n, dtype=np.int32)[None]
            got = s_npu.run("decode", st_npu, tokens=ids, pos=np.int32(pos))
            want = s_emu.run("decode", st_emu, tokens=ids, pos=np.int32(pos))
            for name in want:
                np.testing.assert_array_equal(got[name], want[name])
        return got


def test_the_backend_writes_the_words_and_the_fake_checks_them(fake_npu):
    prebuilt = fake_npu("npu2")
    _, words = built()
    out = run_both(prebuilt, words)
    assert np.abs(out["k"][0, CACHE - 1]).sum() > 0   # the last position's row was written


def test_a_prefill_writes_its_rows_at_the_position(fake_npu):
    """8 tokens: the GEMMs drain 8 cache rows at the position."""
    program, words = built(n=8)
    table, = words.values()
    assert sum(w["buffer"] == "decode/tokens" for w in table.values()) == 8          # one word per token id
    limits = {w["limit"] for w in table.values() if w["buffer"] == "decode/pos"}
    assert limits == {CACHE - 8, CACHE + 3}              # 8 cache rows from pos; pos_table's row pos + i
    prebuilt = fake_npu("npu2")
    out = run_both(prebuilt, words, positions=(0, CACHE - 8), tokens=(3, 30), n=8)
    assert np.abs(out["k"][0, CACHE - 1]).sum() > 0


def test_a_wrong_word_is_a_contract_violation(fake_npu, monkeypatch):
    prebuilt = fake_npu("npu2")
    _, words = built()
    real = npu.scratchpad_words
    monkeypatch.setattr(npu, "scratchpad_words", lambda spec, values: {i: w + 1 for i, w in real(spec, values).items()})
    with pytest.raises(ContractViolation, match="scratchpad word"):
        run_both(prebuilt, words)


def test_a_token_outside_the_table_is_refused_before_the_dispatch(fake_npu):
    prebuilt = fake_npu("npu2")
    _, words = built()
    with pytest.raises(InputError, match=r"outside 0\.\.39"):
        run_both(prebuilt, words, positions=(0,), tokens=(VOCAB,))
    assert not fake_pyxrt.FAKE.dispatches


def test_an_npu1_artifact_with_words_is_refused(fake_npu):
    prebuilt = fake_npu("npu1")
    program = compile_graphs([graph()], "npu1")
    _, words = built()
    fake_pyxrt.write_artifacts(program, prebuilt, scratchpad={npu.device_program(program).entries["decode"]
                                                              .steps[0].op: next(iter(words.values()))})
    from sdk.session import Session
    with pytest.raises(ArtifactMissing, match="no control scratchpad"):
        Session([graph()], weights(), device="npu")


def test_emu_agrees_with_numpy_on_the_graph():
    w = weights()
    exe = EmuBackend().load(compile_graphs([graph()], "npu2"), w)
    state = exe.new_state()
    out = exe.run("decode", {"tokens": np.array([[7]], np.int32), "pos": np.int32(2)}, state)
    want = (w["table"][7] + w["pos_table"][2]) @ w["wk"].T
    assert np.allclose(out["k"][0, 2], want, rtol=0.05, atol=0.05)
