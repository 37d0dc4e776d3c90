"""The cpu backend's numpy engine and its own parallelism: every split step equals its numpy reference run whole.
(Entries that lower to ONNX run on OpenCV by default; these tests ask for the numpy engine.)"""
import contextlib
import gc
import mmap
import os
import signal
import threading
import time

import numpy as np
import pytest

from sdk import ops, settings
from sdk.ops import OPS
from sdk.runtime.cpu import SPLITTERS, Split, Workers

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
    "conv2d depthwise, dilated": ("conv2d", [f32(2, 16, 100, 100), f32(16, 1, 3, 3), None],
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
    ref = OPS[op].ref(*args, **attrs)
    ours = np.full(ref.shape, np.nan, ref.dtype)
    pieces = SPLITTERS[op](3, ours, *args, **attrs)
    assert pieces is not None and len(pieces) == 3, "the case is too small to be split"
    for piece in reversed(pieces):  # each fills its own part, whatever the order
        piece()
    record_parity(f"cpu split {case}", ours, ref)
    # GEMM pieces may take another BLAS kernel than the whole (OpenBLAS picks by size): float32 rounding only
    assert np.abs(ours - ref).max() <= 1e-6 * np.abs(ref).max()


def test_small_and_non_row_steps_run_whole():
    def split(op, *args, **attrs):
        shape = OPS[op].shape(*[a.shape for a in args], **attrs)
        return SPLITTERS[op](2, np.empty(shape, np.float32), *args, **attrs)
    assert split("linear", f32(1, 1, 384), np.asfortranarray(f32(384, 384))) is None  # a decoder GEMV
    assert split("gelu", f32(4, 8)) is None
    assert split("softmax", f32(700, 200), axis=0) is None  # rows are not independent along axis 0
    x = f32(600, 4, 100).transpose(1, 0, 2)  # its rows are not one strided view: a copy would go stale
    assert split("gelu", x) is None


def shared(n):
    """n int64s in a shared mapping: what a worker process writes there, the caller sees."""
    return np.frombuffer(mmap.mmap(-1, 8 * n), np.int64)


def test_a_failing_piece_raises_in_the_caller_after_every_piece_is_done_and_the_workers_go_on():
    seen = shared(4)

    def slow():
        time.sleep(0.05)
        seen[2] += 1

    def bad():
        raise ValueError("piece failed")
    splits = [Split(0, (lambda: None, bad, slow), (), (), 1),
              Split(1, tuple(lambda i=i: seen.__setitem__(i, seen[i] + 1) for i in range(3)), (), (), 1)]
    workers = Workers(splits, 3)
    pids = [worker.pid for worker in workers.procs]
    assert len(set(pids)) == 2 and os.getpid() not in pids
    with pytest.raises(ValueError, match="piece failed"):
        workers.spread(splits[0])
    assert seen[2] == 1  # not left running behind the error
    for _ in range(50):
        workers.spread(splits[1])
    assert list(seen[:3]) == [50, 50, 51]
    workers.close()
    assert all(gone(pid) for pid in pids)
    abandoned = [worker.pid for worker in Workers(splits, 2).procs]  # never closed: ends when collected
    gc.collect()
    assert all(gone(pid) for pid in abandoned)


def test_no_worker_processes_to_be_had_is_a_clear_error(monkeypatch):
    from sdk.errors import SdkError

    def fork():
        raise BlockingIOError(11, "Resource temporarily unavailable")
    monkeypatch.setattr(os, "fork", fork)
    with pytest.raises(SdkError, match="worker processes") as error:
        Workers([Split(0, (lambda: None, lambda: None), (), (), 1)], 2)
    assert "AIE_APPS_THREADS=1" in error.value.fix


def test_without_fork_everything_runs_in_the_caller(monkeypatch):
    monkeypatch.delattr(os, "fork")  # not on Linux, but where there is no fork the pieces must not be lost
    x = f32(1, 600, 256)
    with mlp_executable(2) as exe:
        assert exe.workers.procs == [] and exe.threads == 1
        ours = exe.run("mlp", {"x": x})["y"]
    ref = mlp(MLP_WEIGHTS, x)["y"]
    assert np.abs(ours - ref).max() <= 1e-6 * np.abs(ref).max()


def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def mlp(w, x):
    return {"y": ops.gelu(ops.linear(x, w["w"], w["b"]))}


MLP_WEIGHTS = {"w": f32(512, 256), "b": f32(512)}


@contextlib.contextmanager
def mlp_executable(threads=2):
    from sdk.compiler import compile
    from sdk.graph import trace
    from sdk.runtime.cpu import CpuBackend

    graph = trace(mlp, name="mlp", weights={k: v.shape for k, v in MLP_WEIGHTS.items()},
                  inputs={"x": ((1, 600, 256), "float32")})
    exe = CpuBackend(threads, engine="numpy").load(compile([graph], "cpu"), MLP_WEIGHTS)
    try:
        yield exe
    finally:
        exe.close()


def mapping_of(address: int) -> dict:
    """The /proc/self/smaps fields of the mapping that holds `address`."""
    fields, inside = {}, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(a, 16) for a in head.split("-"))
                inside = lo <= address < hi
            elif inside:
                fields[head.rstrip(":")] = line.split()[1:]
    return fields


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")
def test_linear_weights_are_the_sessions_own_fortran_copies_in_huge_page_memory():
    with mlp_executable() as exe:
        w = exe.weights["w"]
        assert np.array_equal(w, MLP_WEIGHTS["w"]) and not np.may_share_memory(w, MLP_WEIGHTS["w"])
        assert w.flags.f_contiguous and w.ctypes.data % 64 == 0
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as thp:
            if "[never]" in thp.read():
                pytest.skip("transparent huge pages are off on this machine")
        assert "hg" in mapping_of(w.ctypes.data)["VmFlags"]  # advised for huge pages
        assert exe.weights["b"] is MLP_WEIGHTS["b"]  # not a linear's weight: as given


def test_threads_sharing_a_session_take_turns_and_each_gets_its_own_result():
    xs = [f32(1, 600, 256) for _ in range(3)]
    refs = [mlp(MLP_WEIGHTS, x)["y"] for x in xs]
    wrong = []
    with mlp_executable(3) as exe:
        def caller(x, ref):
            for _ in range(20):
                y = exe.run("mlp", {"x": x})["y"]
                if np.abs(y - ref).max() > 1e-5 * np.abs(ref).max():
                    wrong.append(np.abs(y - ref).max())
        callers = [threading.Thread(target=caller, args=pair, daemon=True) for pair in zip(xs, refs)]
        for thread in callers:
            thread.start()
        for thread in callers:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in callers) and not wrong


def test_a_closed_session_refuses_to_run_instead_of_waiting_for_its_stopped_workers():
    from sdk.errors import UsageError

    x = f32(1, 600, 256)
    with mlp_executable() as exe:
        exe.run("mlp", {"x": x})
    with pytest.raises(UsageError, match="closed"):
        exe.run("mlp", {"x": x})


def test_a_worker_killed_mid_session_is_a_clear_error_not_a_hang():
    from sdk.errors import SdkError

    with mlp_executable() as exe:
        (worker,) = exe.workers.procs
        os.kill(worker.pid, signal.SIGKILL)
        os.waitpid(worker.pid, 0)
        with pytest.raises(SdkError, match="ended during a run") as error:
            exe.run("mlp", {"x": f32(1, 600, 256)})
        assert "AIE_APPS_THREADS=1" in error.value.fix


def test_a_session_refuses_to_run_in_a_process_forked_from_its_own():
    with mlp_executable() as exe:
        x = f32(1, 600, 256)
        expected = exe.run("mlp", {"x": x})["y"]
        pid = os.fork()
        if pid == 0:  # the copy: must not talk to its parent's worker processes
            code = 3
            try:
                exe.run("mlp", {"x": x})
            except Exception as e:
                code = 0 if "another process" in str(e) else 2
            finally:
                os._exit(code)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        assert np.array_equal(exe.run("mlp", {"x": x})["y"], expected)  # the owner's workers are untouched


def test_arena_slots_share_bytes_only_when_their_lives_do_not_overlap():
    """MiniLM's shape: the worker-visible buffers fit in a fraction of their sum, and any two slots that
    overlap in the arena are never live in the same item."""
    from sdk.compiler import compile
    from sdk.models import bert
    from sdk.runtime.cpu import _layout

    cfg = bert.Config(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
    program = compile([bert.graph(cfg, 1, 128)], "cpu")
    entry = next(iter(program.entries.values()))
    weights = {n: np.empty(b.shape, b.dtype) for n, b in program.buffers.items() if b.usage.value == "weights"}
    layout = _layout(program, entry, weights, 2)
    assert sum(splits for _, splits in layout.items) == 13  # 6 attentions, 6 layer chains, the embeddings' norm
    total = sum(program.buffers[b].nbytes for b in layout.offsets)
    assert layout.size < total / 4
    spans = layout.spans
    slots = sorted(layout.offsets, key=layout.offsets.get)
    for i, a in enumerate(slots):
        for b in slots[i + 1:]:
            a0, b0 = layout.offsets[a], layout.offsets[b]
            if a0 < b0 + program.buffers[b].nbytes and b0 < a0 + program.buffers[a].nbytes:
                assert spans[a][1] < spans[b][0] or spans[b][1] < spans[a][0], (a, b)


def test_threads_setting():
    assert settings.load({"AIE_APPS_THREADS": "3"}).threads == 3
    assert settings.load({"AIE_APPS_THREADS": "zero"}).threads >= 1
    assert settings.load({}).threads >= 1


def test_decoder_steps_stream_weights_and_forwards_split(monkeypatch):
    """Entries whose GEMMs all have <= GEMV_ROWS rows run with BLAS's own threads (memory-bound); the rest
    go to the workers. Both give the reference's numbers."""
    from sdk.graph import trace
    from sdk.session import Session

    monkeypatch.setenv("AIE_APPS_CPU_ENGINE", "numpy")
    weights = MLP_WEIGHTS
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
    exe = CpuBackend(threads=3, engine="numpy").load(program, BLOCK_WEIGHTS)
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
