"""Per-run DMA addresses (scratchpad parameters, kernels/README.md "Runtime parameters") from the design to the
host: a decode-shaped graph (embeddings gathered by token id and at the position, through maskgen's positions; a
GEMV whose K and V outputs go into a cache at the position) builds as one fused design whose sequence reads
scratchpad words; the build records them in the manifest. npu2: the npu backend writes word = value x scale into
each run's control scratchpad before the start. npu1: the build finds the DDR-patch ops of the shifted transfers in
each dispatch's instruction stream and the backend rewrites their argplus per run. tests/fake_pyxrt.py refuses a
start whose words (npu2) or patched addresses (npu1) on the device do not match the io values on the device.
EMULATED: the fake executes with the emulator's semantics, and the stand-in of IRON checks the designs; the npu1
streams are the fake's, laid out from mlir-aie's emitter, never ones aiecc wrote."""
from __future__ import annotations

import numpy as np
import pytest

from kernels import build as kbuild
from kernels.fused import design as fused_design
from sdk import ops
from sdk.compiler import compile as compile_graphs
from sdk.compiler import watchdog
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


def built(target="npu2", n=1, with_sites=False, budget_s=None):
    """The program, and the scratchpad words per dispatch as kernels/build.py records them (and on npu1 the
    transfers of each dispatch, per dispatch, as kernels/build.py records them)."""
    program = watchdog.split_dispatches(compile_graphs([graph(n)], target), budget_s)
    with standin.installed():
        fused, sites = kbuild.fused_build(program, target)
    dispatches = [s.op for e in program.entries.values() for s in e.steps if s.kind == "dispatch"]
    words = {d: fused.words(fused_design.sequence_symbol(d)) for d in dispatches}
    if with_sites:
        return program, words, {d: sites[fused_design.sequence_symbol(d)] for d in dispatches if words[d]}
    return program, words


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


def test_npu1_builds_per_run_addresses_at_their_static_base():
    """npu1: the same words, no scratchpad declarations, every shifted transfer built without its offset parameter
    and recorded with the word that shifts it."""
    program, words, sites = built("npu1", with_sites=True)
    (dispatch, table), = words.items()
    assert {(w["buffer"], w["limit"]) for w in table.values()} == {("decode/tokens", VOCAB - 1),
                                                                   ("decode/pos", CACHE + 3), ("decode/pos", CACHE - 1)}
    shifted = [s for s in sites[dispatch] if s.word]
    assert {s.word for s in shifted} == set(table)
    cache_word = next(n for n, w in table.items() if w["limit"] == CACHE - 1)
    k, v = program.buffers["k"], program.buffers["v"]   # the caches (bf16), in the state arena (argidx 1)
    assert {(s.arg, s.plus, s.bytes) for s in shifted if s.word == cache_word} == {(1, k.offset, 2), (1, v.offset, 2)}
    with standin.installed():
        text = fused_design.build(program, "npu1").mlir()
    assert "scratchpad_parameter" not in text


def run_both(prebuilt, words, positions=(0, 3, CACHE - 1), tokens=(5, VOCAB - 1, 0), n=1, target="npu2",
             sites=None):
    from sdk.session import Session
    program = compile_graphs([graph(n)], target)
    fake_pyxrt.write_artifacts(program, prebuilt, scratchpad=words, sites=sites)
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


def test_npu1_patches_the_instruction_stream_per_run(fake_npu):
    """A decode step on npu1: each run's token row and cache row go into the argplus of their DDR patches."""
    prebuilt = fake_npu("npu1")
    _, words, sites = built("npu1", with_sites=True)
    out = run_both(prebuilt, words, target="npu1", sites=sites)
    assert np.abs(out["k"][0, CACHE - 1]).sum() > 0
    assert fake_pyxrt.FAKE.dispatches   # ran on the fake device, not elsewhere


def test_npu1_prefill_patches_every_row(fake_npu):
    prebuilt = fake_npu("npu1")
    _, words, sites = built("npu1", n=8, with_sites=True)
    out = run_both(prebuilt, words, positions=(0, CACHE - 8), tokens=(3, 30), n=8, target="npu1", sites=sites)
    assert np.abs(out["k"][0, CACHE - 1]).sum() > 0


def test_npu1_split_dispatches_patch_their_own_streams(fake_npu):
    """A dispatch split for the watchdog runs as a runlist; each part's stream carries its own patches."""
    program = compile_graphs([graph()], "npu1")
    step = next(s for s in program.entry("decode").steps if s.kind == "dispatch")
    fixed = watchdog.dispatch_seconds(program, step) - sum(watchdog.kernel_seconds(program, k) for k in step.body)
    budget = 1.001 * max(watchdog.dispatch_seconds(program, step) / 3, fixed + max(watchdog.kernel_seconds(program, k)
                                                                             for k in step.body))
    prebuilt = fake_npu("npu1")
    _, words, sites = built("npu1", with_sites=True, budget_s=budget)
    assert len(words) > 1 and sum(1 for w in words.values() if w) > 1   # the words are spread over the parts
    fake_pyxrt.write_artifacts(program, prebuilt, budget, scratchpad={d: w for d, w in words.items() if w},
                               sites=sites)
    exe = npu.NpuBackend().load(watchdog.split_dispatches(program, budget), weights())
    emu = EmuBackend().load(program, weights())
    try:
        st, st_emu = exe.new_state(), emu.new_state()
        for pos, tok in ((0, 5), (4, 39), (CACHE - 1, 0)):
            inputs = {"tokens": np.array([[tok]], np.int32), "pos": np.int32(pos)}
            got, want = exe.run("decode", inputs, st), emu.run("decode", inputs, st_emu)
            for name in want:
                np.testing.assert_array_equal(got[name], want[name])
    finally:
        exe.close()
    assert fake_pyxrt.FAKE.runlists == 3 and len(set(fake_pyxrt.FAKE.dispatches)) == len(words)


def test_npu1_a_stale_patch_is_a_contract_violation(fake_npu, monkeypatch):
    """Without the instruction BO's sync the device runs the previous run's addresses: the fake catches it."""
    prebuilt = fake_npu("npu1")
    _, words, sites = built("npu1", with_sites=True)
    real = npu.NpuExecutable._patch_insts

    def unsynced(self, step):
        bo = self._insts[step.op][0]
        monkeypatch.setattr(bo, "sync", lambda *a, **k: None)
        real(self, step)
    monkeypatch.setattr(npu.NpuExecutable, "_patch_insts", unsynced)
    with pytest.raises(ContractViolation, match="argplus"):
        run_both(prebuilt, words, positions=(0, 3), tokens=(5, 6), target="npu1", sites=sites)


def _refused_npu1_manifest(fake_npu, edit) -> ArtifactMissing:
    """Write npu1 artifacts, let `edit(entry, prebuilt)` change the manifest's one entry (and its files), and
    open a session on them."""
    import json
    from sdk.session import Session
    prebuilt = fake_npu("npu1")
    program = compile_graphs([graph()], "npu1")
    _, words, sites = built("npu1", with_sites=True)
    fake_pyxrt.write_artifacts(program, prebuilt, scratchpad=words, sites=sites)
    manifest = prebuilt / "manifest.json"
    doc = json.loads(manifest.read_text())
    (entry,) = doc["artifacts"].values()
    edit(entry, prebuilt)
    manifest.write_text(json.dumps(doc))
    with pytest.raises(ArtifactMissing) as e:
        Session([graph()], weights(), device="npu")
    return e.value


def test_npu1_a_manifest_without_patches_is_refused(fake_npu):
    error = _refused_npu1_manifest(fake_npu, lambda entry, _: entry.pop("patches"))
    assert "no instruction patch" in error.message


def test_npu1_a_token_outside_the_table_is_refused_before_the_dispatch(fake_npu):
    prebuilt = fake_npu("npu1")
    _, words, sites = built("npu1", with_sites=True)
    with pytest.raises(InputError, match=r"outside 0\.\.39"):
        run_both(prebuilt, words, positions=(0,), tokens=(VOCAB,), target="npu1", sites=sites)
    assert not fake_pyxrt.FAKE.dispatches


def test_emu_agrees_with_numpy_on_the_graph():
    w = weights()
    exe = EmuBackend().load(compile_graphs([graph()], "npu2"), w)
    state = exe.new_state()
    out = exe.run("decode", {"tokens": np.array([[7]], np.int32), "pos": np.int32(2)}, state)
    want = (w["table"][7] + w["pos_table"][2]) @ w["wk"].T
    assert np.allclose(out["k"][0, 2], want, rtol=0.05, atol=0.05)


# ---- the npu1 instruction-stream format (sdk/runtime/npu_insts.py) ------------------------------------------------
# Synthetic streams written field by field from the sources: mlir-aie lib/Targets/AIETargetNPU.cpp (version 0.1:
# appendWrite32 6 words, appendMaskWrite32 7, appendBlockWrite 4 + n, appendSync 4, appendAddressPatch 12 with
# regaddr / argidx / argplus at words 6 / 8 / 10; the header's word 3 is the size in bytes) and aie-rt
# driver/src/global/xaie_txn.h (XAie_TxnHeader, XAie_MaskPoll32Hdr, the "_opt" structs of version 1.0:
# XAie_Write32Hdr_opt 3 words, XAie_MaskWrite32Hdr_opt 4, XAie_CustomOpHdr_opt + patch_op_opt_t = 6).

def _v01(*ops) -> np.ndarray:
    body = [w for op in ops for w in op]
    return np.array([0x06030100, 0x00000105, len(ops), 4 * (4 + len(body))] + body, np.uint32)


def _patch01(reg, arg, plus):
    return [0x81, 48, 0, 0, 0, 0, reg, 0, arg, 0, plus & 0xFFFFFFFF, plus >> 32]


V01_OPS = ([0x00, 0, 0x1D214, 0, 3, 24],                         # WRITE
           [0x01, 0, 0x1D000, 4 * 12] + list(range(8)),           # BLOCKWRITE of a shim BD
           _patch01(0x1D004, 2, 4096),                             # DDR_PATCH: io arena + 4096 bytes
           [0x03, 0, 0x1D220, 0, 1, 1, 28],                        # MASKWRITE
           [0x04, 0, 0x1D228, 0, 0, 0xFF, 28],                     # MASKPOLL
           _patch01(0x1D024, 1, 768),                              # DDR_PATCH: state arena + 768
           [0x80, 16, 0x00000001, 0x01010000],                     # TCT sync
           [0x84, 12, 7])                                          # MERGE_SYNC, sized by its header


def test_insts_parser_reads_a_version_0_1_transaction():
    from sdk.runtime import npu_insts
    words = _v01(*V01_OPS)
    stream = npu_insts.parse(words)
    assert stream.version == "0.1" and stream.dev_gen == 3 and len(stream.ops) == len(V01_OPS)
    assert [(p.regaddr, p.arg, p.plus, p.op) for p in stream.patches] == [(0x1D004, 2, 4096, 2), (0x1D024, 1, 768, 5)]
    for p in stream.patches:
        assert words[p.at] == p.plus and words[p.at - 2] == p.arg and words[p.at - 4] == p.regaddr
    npu_insts.set_argplus(words, stream.patches[1].at, 768 + 5 * 64)
    assert npu_insts.parse(words).patches[1].plus == 768 + 5 * 64   # rewritten in place, nothing else moved


def test_insts_parser_reads_a_version_1_0_transaction():
    from sdk.runtime import npu_insts
    ops = ([0x00, 0x1D214, 3],                                     # XAie_Write32Hdr_opt
           [0x01, 0x1D000, 4 * 11] + list(range(8)),               # XAie_BlockWrite32Hdr_opt + BD
           [0x81, 24, 0x1D004, 3, 512, 0],                         # CustomOpHdr_opt + patch_op_opt_t
           [0x03, 0x1D220, 1, 1], [0x04, 0x1D228, 0, 0xFF])        # MaskWrite / MaskPoll _opt
    body = [w for op in ops for w in op]
    words = np.array([0x06030001, 0x00000105, len(ops), 4 * (4 + len(body))] + body, np.uint32)
    (patch,) = npu_insts.parse(words).patches
    assert (patch.regaddr, patch.arg, patch.plus, patch.at) == (0x1D004, 3, 512, 4 + 3 + 11 + 4)


@pytest.mark.parametrize("break_it, why", [
    (lambda w: w[:-1], "header says"),                                               # truncated file
    (lambda w: np.concatenate([w[:2], [w[2] + 1], w[3:]]).astype(np.uint32), "ends after"),  # op count too high
    (lambda w: np.concatenate([w[:2], [w[2] - 1], w[3:]]).astype(np.uint32), "words after"),
    (lambda w: np.concatenate([[0x06030102], w[1:]]).astype(np.uint32), "version"),
    (lambda w: np.concatenate([w[:4], [0x05], w[5:]]).astype(np.uint32), "opcode 0x5"),  # NOOP: numbering moved
    (lambda w: np.concatenate([w[:4], [0x81, 40], w[6:]]).astype(np.uint32), "DDR patch op 0"),  # short patch
    (lambda w: w.astype(np.int64), "uint32"),
])
def test_insts_parser_refuses_malformed_streams(break_it, why):
    from sdk.runtime import npu_insts
    words = _v01(_patch01(0x1D004, 2, 64), [0x00, 0, 0x1D214, 0, 3, 24])
    assert len(npu_insts.parse(words).patches) == 1
    with pytest.raises(npu_insts.InstructionStreamError, match=why):
        npu_insts.parse(break_it(words))


def _site(arg, plus, word=None, what="t"):
    return kbuild.Site(arg, plus, 2, word, what)


def test_patch_table_matches_in_order_and_refuses_ambiguity():
    from sdk.runtime import npu_insts
    # a KV-cache write at row 0 and an attention read of row 0 share (argidx 1, argplus 0)
    sites = [_site(1, 0, "sp_pos"), _site(1, 0, None, "read of the cache"), _site(2, 64)]
    ops = [_patch01(0x1D004, 1, 0), _patch01(0x1D024, 1, 0), _patch01(0x1D044, 2, 64)]
    patches = npu_insts.parse(_v01(*ops)).patches
    table = kbuild.patch_table(sites, patches, ["sp_pos"], "d")   # one op per transfer, in order: resolved
    assert table == {"sp_pos": [{"at": patches[0].at, "base": 0, "bytes": 2}]}
    shuffled = npu_insts.parse(_v01(ops[2], ops[0], ops[1])).patches
    with pytest.raises(npu_insts.InstructionStreamError, match="ambiguous"):
        kbuild.patch_table(sites, shuffled, ["sp_pos"], "d")
    # out of order but every key unique: matched by (argidx, argplus)
    sites = [_site(1, 0, "sp_pos"), _site(2, 64)]
    assert kbuild.patch_table(sites, npu_insts.parse(_v01(ops[2], ops[0])).patches, ["sp_pos"], "d") \
        == {"sp_pos": [{"at": 4 + 12 + 10, "base": 0, "bytes": 2}]}
    with pytest.raises(npu_insts.InstructionStreamError, match="matches no transfer"):
        kbuild.patch_table(sites, npu_insts.parse(_v01(ops[2], ops[0], _patch01(0, 3, 8))).patches, ["sp_pos"], "d")
    with pytest.raises(npu_insts.InstructionStreamError, match="no DDR patch op for the transfers of sp_gone"):
        kbuild.patch_table(sites, npu_insts.parse(_v01(ops[0], ops[2])).patches, ["sp_pos", "sp_gone"], "d")


def test_npu1_a_manifest_that_disagrees_with_its_stream_is_refused(fake_npu):
    def point_at_argidx(entry, _):
        (table,) = entry["patches"].values()
        next(iter(table.values()))[0]["at"] += 2       # now points at argidx, not argplus
    assert "the stream has" in _refused_npu1_manifest(fake_npu, point_at_argidx).message


def test_npu1_every_design_places_its_transfers():
    """kernels/build.py finds the run operand behind every fill and drain of every design (test_designs' graph
    that uses all of them), each inside its arena."""
    from .test_designs import synthetic_graph
    program = watchdog.split_dispatches(compile_graphs([synthetic_graph()], "npu1"))
    with standin.installed():
        with kbuild.static_transfers() as log:
            fused = fused_design.build(program, "npu1")
    sites = kbuild.transfer_sites(fused, log, list(fused.sequences))
    sizes = [program.meta["arenas"][a] for a in ("weights", "state", "io", "scratch")]
    placed = [s for ss in sites.values() for s in ss]
    assert len(placed) >= sum(len(runs) for runs in fused.sequences.values())   # at least one transfer per kernel
    assert all(0 <= s.plus and s.plus + s.bytes <= sizes[s.arg] for s in placed), \
        [s for s in placed if not s.plus + s.bytes <= sizes[s.arg]]


def test_insts_parser_names_the_older_ipu_format():
    """mlir-aie's AIETargetIPU.cpp (2023) began every stream with a fixed prolog whose first word is 0x11."""
    from sdk.runtime import npu_insts
    prolog = np.array([0x00000011, 0x01000405, 0x01000100, 0x0B590100] + [0] * 13, np.uint32)
    prolog[3] = 4 * len(prolog)  # even with a plausible size field it is not a transaction
    with pytest.raises(npu_insts.InstructionStreamError, match="IPU instruction format"):
        npu_insts.parse(prolog)


def test_npu1_transfers_follow_a_recorded_sequence_order():
    """A design that records params["sequence"] (the run operand behind each runtime-sequence argument) is placed by
    it; without it the build matches the sequence's tensors to the run's operands by size and dtype in order."""
    program = watchdog.split_dispatches(compile_graphs([graph()], "npu1"))
    with standin.installed():
        with kbuild.static_transfers() as log:
            fused = fused_design.build(program, "npu1")
    (symbol,) = fused.sequences
    gather = next(r for r in fused.sequences[symbol] if [o[0] for o in r.operands][:2] == ["table", "decode/tokens"])
    assert len(gather.operands) == 3                                  # table, tokens, out; the sequence takes 2
    default = kbuild.transfer_sites(fused, log, [symbol])[symbol]
    fused.parameters[gather.device]["sequence"] = [0, 2]               # what the matching found
    assert kbuild.transfer_sites(fused, log, [symbol])[symbol] == default
    fused.parameters[gather.device]["sequence"] = [2, 0]               # table and out swapped
    swapped = kbuild.transfer_sites(fused, log, [symbol])[symbol]
    table, out = program.buffers["table"], program.buffers[gather.operands[2][0]]
    fill = [(s.arg, s.plus) for s in default if s.word == "sp_decode_tokens_0_x32"]
    assert fill == [(0, table.offset)]                                 # the weights arena, at the table
    assert [(s.arg, s.plus) for s in swapped if s.word == "sp_decode_tokens_0_x32"] == [(3, out.offset)]


def test_npu1_a_malformed_stream_is_refused_at_load(fake_npu):
    """A stream that is not a readable transaction (here cut short, its manifest entry re-hashed) never runs."""
    import hashlib

    def cut_short(entry, prebuilt):
        role = next(r for r in entry["files"] if r.startswith("insts/"))
        path = prebuilt / entry["files"][role]["path"]
        path.write_bytes(path.read_bytes()[:-4])
        entry["files"][role]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    assert "header says" in _refused_npu1_manifest(fake_npu, cut_short).message
    assert not fake_pyxrt.FAKE.dispatches
