"""The cpu backend's own parallelism: every split step equals its numpy reference run whole."""
import numpy as np
import pytest

from sdk import ops, settings
from sdk.ops import OPS
from sdk.runtime.cpu import SPLITTERS, Workers

rng = np.random.default_rng(0)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


NEG = np.float32(-2.0 ** 100)
CASES = {
    "linear rows": ("linear", [f32(1, 700, 96), f32(200, 96), f32(200)], {}),
    "linear decode (weight columns)": ("linear", [f32(1, 1, 96), np.asfortranarray(f32(22001, 96)), f32(22001)], {}),
    "attention heads + padding mask": ("attention", [f32(1, 6, 200, 32), f32(1, 6, 240, 32), f32(1, 6, 240, 32),
                                                     np.where(rng.random((1, 1, 1, 240)) < .2, NEG, 0).astype(np.float32)],
                                       {"scale": 0.17}),
    "attention one head, causal rows": ("attention", [f32(1, 1, 400, 32), f32(1, 1, 400, 32), f32(1, 1, 400, 32),
                                                      np.triu(np.full((400, 400), NEG, np.float32), 1)], {"scale": 0.17}),
    "conv2d rows, stride 2, padded": ("conv2d", [f32(1, 8, 100, 101), f32(64, 8, 3, 3), f32(64)],
                                      {"stride": 2, "padding": 1}),
    "conv2d depthwise, dilated": ("conv2d", [f32(2, 16, 70, 70), f32(16, 1, 3, 3), None],
                                  {"padding": 2, "groups": 16, "dilation": 2}),
    "conv1d columns (Whisper's conv2)": ("conv1d", [f32(1, 96, 3000), f32(96, 96, 3), f32(96)],
                                         {"stride": 2, "padding": 1}),
    "gelu": ("gelu", [f32(3, 500, 100)], {}),
    "silu": ("silu", [f32(700, 200)], {}),
    "layer_norm": ("layer_norm", [f32(1, 1500, 96), f32(96), f32(96)], {"eps": 1e-5}),
    "rms_norm": ("rms_norm", [f32(1, 1500, 96), f32(96)], {"eps": 1e-6}),
    "softmax last axis": ("softmax", [f32(2, 1000, 70)], {"axis": -1}),
    "log_softmax last axis": ("log_softmax", [f32(1400, 100)], {"axis": 1}),
}


@pytest.mark.parametrize("case", CASES)
def test_split_step_equals_reference(case, record_parity):
    op, args, attrs = CASES[case]
    workers = Workers(3)
    try:
        assert SPLITTERS[op](workers.n, *args, **attrs) is not None, "the case is too small to be split"
        ours = workers.run(op, args, attrs)
    finally:
        workers.close()
    ref = OPS[op].ref(*args, **attrs)
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    record_parity(f"cpu split {case}", ours, ref)
    # GEMM pieces may take another BLAS kernel than the whole (OpenBLAS picks by size): float32 rounding only
    assert np.abs(ours - ref).max() <= 1e-6 * np.abs(ref).max()


def test_small_and_non_row_steps_run_whole():
    assert SPLITTERS["linear"](2, f32(1, 1, 384), np.asfortranarray(f32(384, 384))) is None  # a decoder GEMV
    assert SPLITTERS["gelu"](2, f32(4, 8)) is None
    assert SPLITTERS["softmax"](2, f32(700, 200), axis=0) is None  # rows are not independent along axis 0


def test_a_failing_piece_raises_in_the_caller_after_every_piece_is_done_and_the_workers_go_on():
    import gc
    import threading
    import time

    workers = Workers(3)
    finished = []

    def slow():
        time.sleep(0.05)
        finished.append("slow")

    def bad():
        raise ValueError("piece failed")
    with pytest.raises(ValueError, match="piece failed"):
        workers._spread([lambda: None, bad, slow])
    assert finished == ["slow"]  # not left running behind the error
    ran = []
    workers._spread([lambda i=i: ran.append(i) for i in range(5)])  # more pieces than workers: none dropped
    assert sorted(ran) == [0, 1, 2, 3, 4]
    pieces = [[lambda i=i: ran.append(i) for i in range(3)] for _ in range(40)]
    callers = [threading.Thread(target=lambda: [workers._spread(p) for p in pieces], daemon=True) for _ in range(3)]
    for caller in callers:  # one Workers shared by several threads (one session, several callers)
        caller.start()
    for caller in callers:
        caller.join(timeout=30)
    assert len(ran) == 5 + 3 * 40 * 3
    threads = [h.thread for h in workers.helpers]
    workers.close()
    assert not any(t.is_alive() for t in threads)
    abandoned = [h.thread for h in Workers(2).helpers]  # never closed: its threads end when it is collected
    gc.collect()
    for thread in abandoned:
        thread.join(timeout=5)
    assert not any(t.is_alive() for t in abandoned) and threading.active_count() < 50


def test_a_closed_session_refuses_to_run_instead_of_waiting_for_its_stopped_workers():
    from sdk.errors import UsageError
    from sdk.graph import trace
    from sdk.session import Session

    def mlp(w, x):
        return {"y": ops.gelu(ops.linear(x, w["w"], w["b"]))}
    weights = {"w": f32(512, 256), "b": f32(512)}
    graph = trace(mlp, name="mlp", weights={k: v.shape for k, v in weights.items()},
                  inputs={"x": ((1, 600, 256), "float32")})
    session = Session([graph], weights, device="cpu")
    x = f32(1, 600, 256)
    session.run("mlp", x=x)
    session.close()
    with pytest.raises(UsageError, match="closed"):
        session.run("mlp", x=x)


def test_threads_setting():
    assert settings.load({"AIE_APPS_THREADS": "3"}).threads == 3
    assert settings.load({"AIE_APPS_THREADS": "zero"}).threads >= 1
    assert settings.load({}).threads >= 1


def test_decoder_steps_stream_weights_and_forwards_split():
    """Entries whose GEMMs all have <= GEMV_ROWS rows run with BLAS's own threads (memory-bound); the rest
    go to the workers. Both give the reference's numbers."""
    from sdk.graph import trace
    from sdk.session import Session

    def mlp(w, x):
        return {"y": ops.gelu(ops.linear(x, w["w"], w["b"]))}
    weights = {"w": f32(512, 256), "b": f32(512)}
    shapes = {k: v.shape for k, v in weights.items()}
    graphs = [trace(mlp, name=f"rows_{n}", weights=shapes, inputs={"x": ((1, n, 256), "float32")}) for n in (1, 600)]
    with Session(graphs, weights, device="cpu") as session:
        exe = session._exe
        assert exe.weight_streaming == {"rows_1"}
        for n in (1, 600):
            x = f32(1, n, 256)
            ours = session.run(f"rows_{n}", x=x)["y"]
            ref = ops.gelu(ops.linear(x, weights["w"], weights["b"]))
            assert np.abs(ours - ref).max() <= 1e-6 * np.abs(ref).max()


def block(w, x):
    """A post-LN transformer block outside its attention, then the head split the attention would read."""
    h = ops.layer_norm(ops.add(ops.linear(x, w["o"], w["ob"]), x), w["g1"], w["b1"], eps=1e-5)
    f = ops.linear(ops.gelu(ops.linear(h, w["up"], w["upb"])), w["down"], w["downb"])
    h = ops.layer_norm(ops.add(f, h), w["g2"], w["b2"], eps=1e-5)
    q = ops.transpose(ops.reshape(ops.linear(h, w["q"], w["qb"]), shape=(1, 300, 4, 24)), perm=(0, 2, 1, 3))
    k = ops.linear(h, w["k"], w["kb"])
    return {"h": h, "q": q, "k": ops.softmax(k, axis=1)}  # a softmax over rows: not row-local


BLOCK_WEIGHTS = {"o": f32(96, 96), "ob": f32(96), "g1": f32(96), "b1": f32(96), "up": f32(384, 96), "upb": f32(384),
                 "down": f32(96, 384), "downb": f32(96), "g2": f32(96), "b2": f32(96), "q": f32(96, 96), "qb": f32(96),
                 "k": f32(96, 96), "kb": f32(96)}


def test_row_local_runs_become_one_chain_that_equals_the_steps(record_parity):
    """From the O projection to the next layer's projections every step is row-local: one Chain (the view
    steps in between run after it); the softmax over rows is not row-local and runs on its own."""
    from sdk.compiler import compile
    from sdk.graph import trace
    from sdk.runtime.cpu import Chain, CpuBackend, plan

    graph = trace(block, name="block", weights={k: v.shape for k, v in BLOCK_WEIGHTS.items()},
                  inputs={"x": ((1, 300, 96), "float32")})
    program = compile([graph], "cpu")
    items = plan(program, program.entry("block"))
    chains = [item for item in items if isinstance(item, Chain)]
    assert [[s.op for s in c.steps] for c in chains] == [
        ["linear", "add", "layer_norm", "linear", "gelu", "linear", "add", "layer_norm", "linear", "linear"]]
    assert [s.op for s in chains[0].views] == ["reshape", "transpose"]
    assert [getattr(item, "op", None) for item in items[-2:]] == [None, "softmax"]

    x = f32(1, 300, 96)
    ref = block(BLOCK_WEIGHTS, x)
    exe = CpuBackend(threads=3).load(program, BLOCK_WEIGHTS)
    try:
        ours = exe.run("block", {"x": x})
    finally:
        exe.close()
    for name in ref:  # a GEMM over a block of rows may round differently from the whole (OpenBLAS kernels)
        record_parity(f"cpu chain {name}", ours[name], ref[name])
        assert np.linalg.norm(ours[name] - ref[name]) <= 1e-5 * np.linalg.norm(ref[name])


def test_bert_layers_run_as_chains():
    """BERT-base at seq 128: between two attentions, one chain of the 11 row-local steps of a layer."""
    from sdk.compiler import compile
    from sdk.models import bert
    from sdk.runtime.cpu import Chain, plan

    program = compile([bert.graph(bert.Config(), 1, 128)], "cpu")
    items = plan(program, next(iter(program.entries.values())))
    chains = [[s.op for s in item.steps] for item in items if isinstance(item, Chain)]
    assert chains.count(["linear", "add", "layer_norm", "linear", "gelu", "linear", "add", "layer_norm",
                         "linear", "linear", "linear"]) == bert.Config().num_hidden_layers - 1
