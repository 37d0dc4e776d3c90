"""The cpu backend: every entry as one ONNX Runtime session. Each model family's entries are checked against the
ops.py oracle run step by step, the decoder's KV cache against in-place writes, and the session plumbing."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from sdk import compiler, ops, settings
from sdk.errors import UsageError
from sdk.graph import trace
from sdk.models import bert, clip, conformer, esm, resnet, vit, whisper
from sdk.ops import OPS
from sdk.runtime.cpu import CpuBackend, EntryGraph

TOL = 1e-5  # rel-L2: float32 rounding in another order, nothing more


def rel_l2(ours, ref):
    return float(np.linalg.norm(ours - ref) / max(np.linalg.norm(ref), 1e-30))


def oracle(program, entry, weights, inputs, state):
    """The entry run one step at a time with the numpy references of ops.py; writes `state` in place."""
    e = program.entry(entry)
    env = {**weights, **program.constants, **state,
           **{program.entry(entry).inputs[n]: np.asarray(v) for n, v in inputs.items()}}
    for step in e.steps:
        args = [env[i] if i else None for i in step.inputs]
        op = OPS[step.op]
        env[step.outputs[0]] = op.ref(args, **step.attrs) if op.variadic else op.ref(*args, **step.attrs)
    return {name: np.asarray(env[b]) for name, b in e.outputs.items()}


def _rand(program, rng):
    return {n: rng.normal(0, 0.2, b.shape).astype(np.float32) for n, b in program.buffers.items()
            if b.usage.value == "weights" and n not in program.constants}


def _inputs(program, entry, rng):
    out = {}
    for name, buf in program.entry(entry).inputs.items():
        shape = program.buffers[buf].shape
        if shape == ():
            out[name] = np.int32(5)  # conformer lengths: frames past them are padding
        elif program.buffers[buf].dtype == "int32":
            out[name] = rng.integers(0, 2, shape).astype(np.int32)
        elif name == "mask":
            out[name] = (np.arange(shape[-1]) < shape[-1] - 3).astype(np.float32) * np.ones(shape, np.float32)
        else:
            out[name] = rng.normal(size=shape).astype(np.float32)
    return out


MODELS = {
    "bert": (lambda: [bert.graph(bert.TINY, 2, 16)], None),
    "clip-similarity": (lambda: [clip.similarity_graph(clip.TINY, 1, 2)], None),
    "clip-image": (lambda: [clip.image_graph(clip.TINY, 1)], None),
    "conformer-encoder": (lambda: [conformer.encoder_graph(conformer.TINY, 50)], None),
    "esm": (lambda: [esm.graph(esm.TINY, 1, 16)], None),
    "resnet": (lambda: [resnet.graph(resnet.TINY, 1)], None),
    **{f"vit-{k}": (lambda c=c: [vit.graph(c, 1)], None) for k, c in vit.TINY.items()},
    "whisper-encode": (lambda: whisper.graphs(whisper.TINY), "encode"),  # writes the cross K/V state
}


@pytest.mark.parametrize("model", MODELS)
def test_model_entry_equals_the_oracle(model, record_parity):
    graphs, entry = MODELS[model]
    program = compiler.compile(graphs())
    rng = np.random.default_rng(0)
    weights, inputs = _rand(program, rng), _inputs(program, entry, rng)
    exe = CpuBackend(2).load(program, weights)
    try:
        state = exe.new_state()
        ours = exe.run(entry, dict(inputs), state)
    finally:
        exe.close()
    ref_state = {n: np.zeros_like(a) for n, a in state.buffers.items()}
    ref = oracle(program, entry, weights, inputs, ref_state)
    for name in ref:
        _, rel = record_parity(f"{model}.cpu-vs-oracle.{name}", ours[name], ref[name])
        assert rel <= TOL
    for name in ref_state:
        assert rel_l2(state.buffers[name], ref_state[name]) <= TOL, name


def test_decoder_steps_write_the_cache_in_place_and_equal_the_oracle(record_parity):
    cfg = whisper.TINY
    program = compiler.compile(whisper.graphs(cfg, timestamp_begin=cfg.vocab_size - 10))
    rng = np.random.default_rng(1)
    weights = _rand(program, rng)
    exe = CpuBackend(2).load(program, weights)
    try:
        state = exe.new_state()
        ref_state = {n: np.zeros_like(a) for n, a in state.buffers.items()}
        where = {n: a.ctypes.data for n, a in state.buffers.items()}
        mel = {"mel": rng.normal(size=program.buffers["encode/mel"].shape).astype(np.float32)}
        exe.run("encode", mel, state), oracle(program, "encode", weights, mel, ref_state)
        for pos, token in enumerate([3, 17, 5, 60]):
            step = {"tokens": np.array([[token]], np.int32), "pos": np.int32(pos)}
            ours, ref = exe.run("decode_step", step, state), oracle(program, "decode_step", weights, step, ref_state)
            assert rel_l2(ours["logits"], ref["logits"]) <= TOL
        record_parity("whisper-tiny.decode_step.cpu-vs-oracle", ours["logits"], ref["logits"])
        assert {n: a.ctypes.data for n, a in state.buffers.items()} == where  # the caller's arrays, written there
        k = state.buffers["self_k.0"]
        assert np.abs(k[:, :, :4]).min() > 0 and not k[:, :, 4:].any()  # four positions written, the rest untouched
        for name in ref_state:
            assert rel_l2(state.buffers[name], ref_state[name]) <= TOL, name
        bias = np.zeros((2, cfg.vocab_size), np.float32)
        exe.run("set_suppress", {"bias": bias}, state), oracle(program, "set_suppress", weights, {"bias": bias},
                                                               ref_state)
        greedy = {"tokens": np.array([[7]], np.int32), **{n: np.int32(v) for n, v in
                  dict(pos=4, first=0, lo1=0, hi1=cfg.vocab_size - 10, lo2=cfg.vocab_size - 10,
                       hi2=cfg.vocab_size).items()}}
        ours, ref = exe.run("decode_greedy", greedy, state), oracle(program, "decode_greedy", weights, greedy, ref_state)
        assert ours["token"] == ref["token"] and ours["ts_token"] == ref["ts_token"]
        for name in ("logprob", "ts_logprob", "ts_total"):
            assert rel_l2(ours[name], ref[name]) <= TOL, name
    finally:
        exe.close()


def test_sessions_are_built_once_per_entry_on_its_first_run():
    program = compiler.compile([bert.graph(bert.TINY, 1, 8), bert.graph(bert.TINY, 1, 16)])
    rng = np.random.default_rng(2)
    exe = CpuBackend(2).load(program, _rand(program, rng))
    try:
        assert not exe.sessions
        first = program.entry("forward_b1_t8").name
        exe.run(first, _inputs(program, first, rng))
        built = dict(exe.sessions)
        exe.run(first, _inputs(program, first, rng))
        assert exe.sessions == built and len(built) == 1
    finally:
        exe.close()
    assert not exe.sessions and not exe.arrays


def test_a_linear_weight_has_one_packed_copy_and_other_sessions_read_the_array():
    """ONNX Runtime packs a constant GEMM weight once per session: the first session of an entry that reads a linear's
    weight with PACK_ROWS rows or more takes that copy; later sessions (other buckets) and one-row entries read the
    one array in place. Which session reads what shows in their results when the array is changed in place."""
    program = compiler.compile([bert.graph(bert.TINY, 1, 8), bert.graph(bert.TINY, 1, 16), bert.graph(bert.TINY, 1, 32)])
    rng = np.random.default_rng(2)
    weights = _rand(program, rng)
    exe = CpuBackend(2).load(program, weights)
    try:
        names = [program.entry(f"forward_b1_t{t}").name for t in (8, 32, 16)]   # built in this order
        inputs = {name: _inputs(program, name, rng) for name in names}
        before = {name: exe.run(name, inputs[name])["hidden"] for name in names}
        packed = [packed for _, packed in exe.sessions.values()]
        linears = {n for n in exe.arrays if n.endswith(".weight.T")}
        assert linears and packed == [frozenset(), frozenset(linears), frozenset()]  # 8 rows < PACK_ROWS = 16
        for name in names:
            ref = oracle(program, name, weights, inputs[name], {})["hidden"]
            assert rel_l2(before[name], ref) <= TOL, name
        for name in linears:
            exe.arrays[name][0][...] *= 2
        after = {name: exe.run(name, inputs[name])["hidden"] for name in names}
        assert np.array_equal(after[names[1]], before[names[1]])   # the packed copy, made before the change
        assert not np.allclose(after[names[0]], before[names[0]]) and not np.allclose(after[names[2]], before[names[2]])
    finally:
        exe.close()


def test_every_session_reads_the_one_copy_of_a_weight():
    """ONNX Runtime copies initializers it is given with add_external_initializers: that would make a program's
    entries hold the weights once each. Apart from the one packed copy above (the encoder's linears here), a weight
    changed in place after the sessions exist must change what every entry computes."""
    program = compiler.compile(whisper.graphs(whisper.TINY, timestamp_begin=90))
    rng = np.random.default_rng(2)
    weights = _rand(program, rng)
    exe = CpuBackend(2).load(program, weights)
    try:
        state = exe.new_state()
        exe.run("encode", _inputs(program, "encode", rng), state)
        step = {"tokens": np.array([[3]], np.int32), "pos": np.int32(0)}
        greedy = {**step, **{n: np.int32(v) for n, v in dict(first=0, lo1=0, hi1=90, lo2=90, hi2=100).items()}}

        def decode():
            return exe.run("decode_step", step, state)["logits"], exe.run("decode_greedy", greedy, state)["logprob"]
        before = decode()
        # tied: the logits' linear and the token embedding read one [d, vocab] array; no [vocab, d] copy is held
        table = "model.decoder.embed_tokens.weight"
        assert table not in exe.arrays
        fc = "model.decoder.layers.0.fc2.weight.T"
        assert not any(np.shares_memory(exe.arrays[fc][0], a) for a in weights.values())  # made once, at load
        for name in (fc, table + ".T"):  # a MatMul's weight only, then the tied one
            exe.arrays[name][0][...] *= 2
            assert all(not np.allclose(b, a) for b, a in zip(before, decode())), name
            exe.arrays[name][0][...] /= 2
            assert all(np.allclose(b, a, rtol=1e-5, atol=1e-6) for b, a in zip(before, decode())), name
    finally:
        exe.close()


def test_results_are_the_callers_own_arrays():
    program = compiler.compile([bert.graph(bert.TINY, 1, 8)])
    rng = np.random.default_rng(3)
    exe = CpuBackend(2).load(program, _rand(program, rng))
    try:
        first = exe.run(None, _inputs(program, None, rng))["hidden"]
        kept = first.copy()
        exe.run(None, _inputs(program, None, rng))
        assert np.array_equal(first, kept)
    finally:
        exe.close()


def test_an_entry_that_writes_state_asks_for_a_state():
    program = compiler.compile(whisper.graphs(whisper.TINY))
    rng = np.random.default_rng(4)
    exe = CpuBackend(2).load(program, _rand(program, rng))
    try:
        with pytest.raises(UsageError, match="reads or writes state"):
            exe.run("encode", _inputs(program, "encode", rng))
    finally:
        exe.close()


def test_a_closed_session_refuses_to_run():
    program = compiler.compile([bert.graph(bert.TINY, 1, 8)])
    rng = np.random.default_rng(5)
    exe = CpuBackend(2).load(program, _rand(program, rng))
    exe.close()
    with pytest.raises(UsageError, match="closed"):
        exe.run(None, _inputs(program, None, rng))


def test_the_written_model_is_valid_onnx():
    import onnx
    program = compiler.compile(whisper.graphs(whisper.TINY, timestamp_begin=90))
    for entry in program.entries.values():
        model = onnx.load_from_string(EntryGraph(program, entry).model())
        weights = [t for t in model.graph.initializer if t.name in program.buffers or t.name.endswith(".T")]
        assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in weights)  # none copied in
        assert weights or entry.name == "set_suppress"
        for t in weights:  # the checker reads external data from files: zeros in their place
            t.data_location = onnx.TensorProto.DEFAULT
            del t.external_data[:]
            t.raw_data = bytes(4 * int(np.prod(t.dims)))
        onnx.checker.check_model(model, full_check=True)


def _one_op(fn, x, weights=None):
    """fn traced over x, run on the cpu backend: (outputs, numpy reference)."""
    weights = weights or {}
    graph = trace(lambda w, x: fn(w, x), name="one", weights={k: v.shape for k, v in weights.items()},
                  inputs={"x": (x.shape, "float32")})
    exe = CpuBackend(2).load(compiler.compile([graph]), weights)
    try:
        return exe.run(None, {"x": x}), fn(weights, x)
    finally:
        exe.close()


WIDE = np.linspace(-100, 100, 2001, dtype=np.float32).reshape(1, -1)
GAPPED = np.array([[0, 88, -30], [0, -1.2676506e30, 5]], np.float32)  # the second: a masked logit
SHIFTED = (np.random.default_rng(9).normal(size=(4, 64)) + 1e3).astype(np.float32)
HARD_CASES = {
    "tanh past |x| = 44": (lambda w, x: {"y": ops.tanh(x)}, WIDE, {}),
    "gelu_tanh past x = 10": (lambda w, x: {"y": ops.gelu_tanh(x)}, WIDE, {}),
    "log_softmax of far-apart logits": (lambda w, x: {"y": ops.log_softmax(x, axis=-1)}, GAPPED, {}),
    # float32 rows near 1000 carry 1e-4 of rounding into their spread
    "layer_norm of rows far from 0": (lambda w, x: {"y": ops.layer_norm(
        x, w["g"], None, eps=1e-5)}, SHIFTED, {"g": np.ones(64, np.float32)}),
    "slice backwards to the start": (lambda w, x: {"y": ops.slice_axis(
        x, axis=1, start=2, stop=None, step=-1)}, SHIFTED, {}),
    "an output that is also read by the next step": (lambda w, x: {
        "product": (p := ops.linear(x, w["w"])), "biased": ops.add(p, w["b"])}, SHIFTED[:, :4],
        {"w": np.eye(6, 4, dtype=np.float32), "b": np.ones(6, np.float32)}),
    "a linear over an activation": (lambda w, x: {"y": ops.linear(x, ops.relu(x))}, SHIFTED[:, :8] - 1e3, {}),
}


@pytest.mark.parametrize("case", HARD_CASES)
def test_hard_inputs_give_the_references_numbers(case, record_parity):
    fn, x, weights = HARD_CASES[case]
    out, ref = _one_op(fn, x, weights)
    for name in ref:
        finite = np.abs(ref[name]) < 1e29
        _, rel = record_parity(f"hard.{case}.{name}", out[name][finite], ref[name][finite])
        assert rel <= 1e-4 if "far from 0" in case else rel <= TOL


def test_traced_basic_slicing_matches_numpy_including_backwards():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    cases = {"reversed": lambda t: t[:, ::-1], "every other back": lambda t: t[..., 3::-2],
             "middle": lambda t: t[1:, 1:-1], "index": lambda t: t[:, -1]}
    for label, index in cases.items():
        out, _ = _one_op(lambda w, x: {"y": index(x)}, x)
        assert np.array_equal(out["y"], index(x)), label


def test_threads_sharing_a_session_each_get_their_own_result():
    program = compiler.compile([bert.graph(bert.TINY, 1, 8)])
    rng = np.random.default_rng(6)
    weights = _rand(program, rng)
    runs = [_inputs(program, None, rng) for _ in range(3)]
    refs = [oracle(program, None, weights, r, {})["hidden"] for r in runs]
    wrong = []
    exe = CpuBackend(2).load(program, weights)
    try:
        def caller(inputs, ref):
            for _ in range(10):
                if rel_l2(exe.run(None, inputs)["hidden"], ref) > TOL:
                    wrong.append(1)
        callers = [threading.Thread(target=caller, args=pair, daemon=True) for pair in zip(runs, refs)]
        for thread in callers:
            thread.start()
        for thread in callers:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in callers) and not wrong
    finally:
        exe.close()


def test_threads_setting():
    assert settings.load({"AIE_APPS_THREADS": "3"}).threads == 3
    assert settings.load({"AIE_APPS_THREADS": "zero"}).threads >= 1
    assert settings.load({}).threads >= 1
    assert CpuBackend(3).threads == 3


def test_int8_entries_run_matmul_nbits_with_ort_quantizer_weights(record_parity):
    import onnx
    from onnxruntime.capi._pybind_state import quantize_matmul_8bits

    from sdk.runtime.cpu import INT8_BLOCK
    program = compiler.compile([bert.graph(bert.TINY, 1, 16), bert.graph(bert.TINY, 1, 8)])
    rng = np.random.default_rng(7)
    weights = _rand(program, rng)
    quantized, plain = program.entry("forward_b1_t16").name, program.entry("forward_b1_t8").name
    exe = CpuBackend(2, precision={quantized: "int8"}).load(program, weights)
    try:
        ops_of = {name: {n.op_type for n in onnx.load_from_string(g.model()).graph.node}
                  for name, g in exe.graphs.items()}
        assert "MatMulNBits" in ops_of[quantized] and "MatMulNBits" not in ops_of[plain]
        # the int8 form is what ORT's own 8-bit MatMulNBits quantizer (symmetric) writes for the weight
        name = "encoder.layer.0.output.dense.weight"  # [out, in]: 37 inputs, padded to two blocks
        n, k = weights[name].shape
        blocks = -(-k // INT8_BLOCK)
        packed, scales = np.zeros((n, blocks, INT8_BLOCK), np.uint8), np.zeros((n, blocks), np.float32)
        padded = np.ascontiguousarray(np.pad(weights[name].T, ((0, blocks * INT8_BLOCK - k), (0, 0))))  # [in, out]
        quantize_matmul_8bits(packed, padded, scales, np.zeros((n, blocks), np.uint8), INT8_BLOCK, n, len(padded), True)
        np.testing.assert_array_equal(exe.arrays[f"{name}.q8"][0], packed)
        np.testing.assert_array_equal(exe.arrays[f"{name}.q8scale2"][0], scales)
        inputs = _inputs(program, quantized, rng)
        ours = exe.run(quantized, inputs)["hidden"]
    finally:
        exe.close()
    ref = oracle(program, quantized, weights, inputs, {})["hidden"]
    _, rel = record_parity("bert.tiny.int8-vs-oracle", ours, ref)
    assert 1e-5 < rel <= 2e-2  # quantized (not the fp32 graph), and close: 8-bit weights and activations


def test_an_int8_decoder_gathers_its_tied_table_from_the_int8_head(record_parity):
    """Whisper's token table is also its output head: int8 decoder entries read both from one int8 form (the float
    table is not kept), and their logits stay close to fp32's."""
    import onnx
    program = compiler.compile(whisper.graphs(whisper.TINY))
    rng = np.random.default_rng(11)
    weights, table = _rand(program, rng), "model.decoder.embed_tokens.weight"
    mel = rng.normal(size=(1, whisper.TINY.num_mel_bins, whisper.TINY.n_frames)).astype(np.float32)
    logits = {}
    for precision in ("fp32", "int8"):
        exe = CpuBackend(2, precision=precision).load(program, weights)
        try:
            state = exe.new_state()
            exe.run("encode", {"mel": mel}, state)
            logits[precision] = np.concatenate([exe.run("decode_step", {"tokens": np.array([[t]], np.int32),
                                                                        "pos": np.int32(i)}, state)["logits"]
                                                for i, t in enumerate([1, 7, 30, 95])], axis=1)
            nodes = onnx.load_from_string(exe.graphs["decode_step"].model()).graph.node
            gathers = [list(n.input) for n in nodes if n.op_type == "GatherBlockQuantized"]
            if precision == "int8":
                assert gathers == [[f"{table}.q8", "decode_step/tokens", f"{table}.q8scale3"]]
                assert table not in exe.arrays and f"{table}.T" not in exe.arrays
            else:
                assert not gathers and f"{table}.T" in exe.arrays
        finally:
            exe.close()
    _, rel = record_parity("whisper.tiny.int8-vs-fp32.logits", logits["int8"], logits["fp32"])
    assert 1e-5 < rel <= 3e-2


def test_an_unknown_precision_is_a_usage_error():
    program = compiler.compile([bert.graph(bert.TINY, 1, 8)])
    weights = _rand(program, np.random.default_rng(8))
    with pytest.raises(UsageError, match="unknown cpu precision int4"):
        CpuBackend(2, precision="int4").load(program, weights)
    with pytest.raises(UsageError, match="entry 'nope'"):
        CpuBackend(2, precision={"nope": "int8"}).load(program, weights)


def test_int8_is_refused_on_the_emulator():
    from sdk.session import Session
    with pytest.raises(UsageError, match="cpu backend option"):
        Session([bert.graph(bert.TINY, 1, 8)], {}, device="emu", precision="int8")


def test_a_token_id_past_the_vocabulary_is_an_input_error():
    from sdk.errors import InputError
    program = compiler.compile(whisper.graphs(whisper.TINY))
    exe = CpuBackend(2).load(program, _rand(program, np.random.default_rng(9)))
    try:
        with pytest.raises(InputError, match="refused its inputs") as error:
            exe.run("decode_step", {"tokens": np.array([[whisper.TINY.vocab_size + 5]], np.int32), "pos": np.int32(0)},
                    exe.new_state())
        assert "vocabulary" in error.value.fix
    finally:
        exe.close()


def test_a_run_whose_stop_says_true_is_given_up_and_the_session_runs_on():
    """`stop` is asked before the run and then by a watcher while it goes on; once it says True, ORT gives the run
    up (RunStopped). One that never does changes nothing: the result equals a run without it."""
    from sdk.errors import RunStopped
    program = compiler.compile(whisper.graphs(whisper.TINY))
    rng = np.random.default_rng(10)
    exe = CpuBackend(2).load(program, _rand(program, rng))
    mel = _inputs(program, "encode", rng)
    try:
        asked = []
        with pytest.raises(RunStopped, match="given up"):
            exe.run("encode", mel, exe.new_state(), stop=lambda: not asked.append(1))
        assert asked == [1]
        plain_state, state = exe.new_state(), exe.new_state()
        plain = exe.run("encode", mel, plain_state)
        watched = exe.run("encode", mel, state, stop=lambda: False)
        assert np.array_equal(watched["encoder"], plain["encoder"])
        assert all(np.array_equal(state.buffers[n], b) for n, b in plain_state.buffers.items())
    finally:
        exe.close()
