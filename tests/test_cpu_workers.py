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
