"""The IRON designs in kernels/, checked without the toolchain: every design is built against the IRON stand-in
(tests/iron_standin.py: same names and signatures as the pinned mlir-aie's IRON API) for the kernel steps the
sdk compiler emits for npu1 and npu2, and the stand-in checks what the toolchain or the array would refuse:
L1 (64 KB with the stack) and memtile (512 KB) use, DMA channels per tile, buffer descriptors and their
dimensions, every kernel call against its C++ signature, that fills and core consumption balance, and that the
drains write every output element. The design parameters must agree with the catalog's tiling. What only runs
with the toolchain (MLIR verification, aiecc placement and routing, Peano) and on hardware is listed in
kernels/README.md."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kernels
from kernels import build as kbuild
from kernels.iron_program import iron
from kernels.design_error import DesignError
from kernels.fused import design as fused_design
from sdk import ops
from sdk.compiler import catalog
from sdk.compiler import compile as compile_graphs
from sdk.compiler.hardware import TARGETS
from sdk.compiler.npu import TOOLCHAIN_PIN
from sdk.graph import trace
from sdk.models import bert, clip, conformer, esm, resnet, vit, whisper

from . import iron_standin as standin
from .conftest import FIXTURES

TARGET_NAMES = ("npu1", "npu2")

def build_step(step, program, target):
    params = {}
    with standin.installed():
        rec = kernels.design_module(step).build(target, step, program.buffers, params)
    return rec, params


def kernel_steps(program):
    return [k for e in program.entries.values() for s in e.steps if s.kind == "dispatch" for k in s.body]


def agrees_with_catalog(step, params) -> list[str]:
    """The design's parameters against the catalog's tiling for this step."""
    t, name, bad = step.attrs["tiling"], kernels.design_name(step), []
    if params.get("cores", 1) > t.get("cores", 1):
        bad.append(f"uses {params['cores']} cores, the catalog {t['cores']}")
    if name in ("gemm", "gemv"):  # a GEMV's rows are the decode step's few, not a tile
        tile = ("m", "k", "n") if name == "gemm" else ("k", "n")
        bad += [f"{x} {params[x]} != {t[x]}" for x in tile if params[x] != t[x]]
    elif name == "mha":
        bad += [f"{x} {params[x]} > {t[x]}" for x in ("tq", "tk") if params[x] > t[x]]
    elif "piece" in params and params["piece"] > t["chunk"]:
        bad.append(f"pieces of {params['piece']} > chunk {t['chunk']}")
    return bad


def check_step(step, program, target):
    rec, params = build_step(step, program, target)
    problems = standin.check(rec, TARGETS[target]) + agrees_with_catalog(step, params)
    out_index = len(rec.runtime.data) - len(step.outputs)
    for i in range(len(step.outputs)):
        if runtime_shifted(rec, out_index + i):
            continue
        hits = standin.written(rec, out_index + i)
        if name_of(step) not in ("gemm", "gemv") and (hits != 1).any() or (hits < 1).any():
            problems.append(f"output {step.outputs[i]}: {int((hits < 1).sum())} elements never written, "
                            f"{int((hits > 1).sum())} written more than once")
    return problems + runtime_offsets_in_bounds(rec, params, name_of(step) in ("gemm", "gemv")), params


def runtime_shifted(rec, data_index) -> bool:
    data = rec.runtime.data[data_index]
    return any(t.offset_parameter is not None and t.data is data for t in rec.runtime.transfers)


def runtime_offsets_in_bounds(rec, params, rewrites_ok=False) -> list[str]:
    """Transfers shifted by scratchpad words (a KV-cache row at the position, a table row by id): at the words'
    smallest and largest values every address stays inside its tensor, no element is written twice (a GEMM's
    shifted last row tile rewrites the same values: rewrites_ok), and a shifted drain writes the same elements
    at both, moved by the word (one cache row per position)."""
    spec = params.get("scratchpad", {})
    for t in rec.runtime.transfers:
        if t.offset_parameter is not None and t.offset_parameter.name not in spec:
            return [f"scratchpad parameter {t.offset_parameter.name} has no host-side spec"]
    extremes = [{}, {n: s["limit"] * s["scale"] for n, s in spec.items()}]
    problems = []
    for d in range(len(rec.runtime.data)):
        if not runtime_shifted(rec, d):
            continue
        elements = rec.runtime.data[d].elements
        sums = set()
        for words in extremes:
            read = standin.read(rec, d, words)
            if read.size and (read.min() < 0 or read.max() >= elements):
                problems.append(f"tensor {d}: a fill reads outside it at words {words}")
            try:
                hits = standin.written(rec, d, words)
            except IndexError:
                problems.append(f"tensor {d}: a drain writes outside it at words {words}")
                continue
            if (hits > 1).any() and not rewrites_ok:
                problems.append(f"tensor {d}: elements written more than once at words {words}")
            sums.add(int((hits > 0).sum()))
        if len(sums) > 1:
            problems.append(f"tensor {d}: a shifted drain writes {sorted(sums)} elements at different words")
    return problems


def name_of(step):
    return kernels.design_name(step)


# ---- real models: every kernel step builds or is a documented gap ------------------------------------------------

def _bert():
    cfg, _ = bert.load(FIXTURES / "bert")
    return [bert.graph(cfg, 2, 8)]


def _whisper():  # with the greedy step and its suppress table (timestamps from id 76 of 96)
    return whisper.graphs(whisper.TINY, timestamp_begin=76, prefill=(8,))


def _resnet():
    return [resnet.graph(resnet.TINY, 1, 64)]


MODELS = {"bert": _bert, "whisper": _whisper, "resnet": _resnet,
          "esm": lambda: [esm.graph(esm.TINY, 1, 16)], "vit": lambda: [vit.graph(vit.TINY["vit"], 1)],
          "clip": lambda: [clip.image_graph(clip.TINY, 1), clip.text_graph(clip.TINY, 2, 8)],
          "conformer": lambda: [conformer.encoder_graph(conformer.TINY, 64)]}


@pytest.fixture(scope="module")
def programs():
    cache = {}

    def get(model, target):
        if (model, target) not in cache:
            cache[(model, target)] = compile_graphs(MODELS[model](), target)
        return cache[(model, target)]
    return get


@pytest.mark.parametrize("target", TARGET_NAMES)
@pytest.mark.parametrize("model", sorted(MODELS))
def test_model_steps_build_within_the_limits(programs, model, target):
    """Every kernel step of every TINY model builds on both targets and passes the stand-in's checks (kernels/
    README.md, the counts table): a refusal is a regression. That includes GEMMs whose width, depth or row count
    is off the tile: the memory plan pads GEMM outputs to whole tiles (sdk/compiler/memory.py: pad_to_tiles) and
    the GEMM design handles M < R."""
    program = programs(model, target)
    built, failures = {}, []
    for step in kernel_steps(program):
        name = name_of(step)
        try:
            problems, _ = check_step(step, program, target)
        except DesignError as e:
            failures.append(f"{name} {step.attrs.get('name')}: refused: {e.message}")
            continue
        if problems:
            failures.append(f"{name} {step.attrs.get('name')}: " + "; ".join(problems[:3]))
        built[name] = built.get(name, 0) + 1
    print(f"\n  {model} {target}: built {built}", end="")
    assert not failures, "\n".join(failures[:10])
    assert sum(built.values()) == len(kernel_steps(program)) > 0


# ---- the operand-order contract: every aiex.run passes what the called sequence declares -------------------------

def sequence_mismatches(program, target) -> tuple[int, list[str]]:
    """Every kernel step that builds (a refusal is the test above's business): the run the fused design
    composes for it (`fused_design.run_of`, from its design's params["sequence"]) against the tensors the design's
    runtime sequence declares (the stand-in's record). Returns (runs checked, mismatches)."""
    checked, bad = 0, []
    for k in kernel_steps(program):
        try:
            rec, params = build_step(k, program, target)
            run = fused_design.run_of(program, k, name_of(k), params)
        except DesignError as e:
            if "params['sequence']" in e.message:
                bad.append(e.message)
            continue
        try:
            standin.check_run(rec, run.types(), f"{name_of(k)} {k.attrs['head']['op']} {k.attrs.get('name', '')}")
        except standin.SequenceMismatch as e:
            bad.append(str(e))
        checked += 1
    return checked, bad


@pytest.mark.parametrize("target", TARGET_NAMES)
@pytest.mark.parametrize("model", sorted(MODELS))
def test_every_run_passes_what_its_sequence_declares(programs, model, target):
    """Each design records params["sequence"], the place among the step's operands (present inputs, then outputs)
    of each tensor its runtime sequence declares; the fused design's aiex.run passes exactly those, in that order,
    one by one in count, shape and dtype (a gather takes no id tensor, GLU its input twice, eltwise a broadcast
    operand after the per-row ones, an assign only the value and the state). The composed module is checked as
    text too: each aiex.run against the sequence of the device it configures."""
    program = programs(model, target)
    checked, bad = sequence_mismatches(program, target)
    assert not bad, "\n".join(bad[:10])
    steps = len(kernel_steps(program))
    assert checked == steps, (checked, steps)
    with standin.installed():
        fused = fused_design.build(program)
    assert standin.check_runs(fused.mlir()) == steps


def test_a_run_that_differs_from_its_sequence_is_refused():
    """The stand-in refuses a run whose arguments differ from the declared tensors in count, shape or dtype, and
    so does the composed module's check."""
    from sdk.program import Buffer, Step, Usage
    buffers = {"x": Buffer("x", (16, 64), "bfloat16", Usage.SCRATCH),
               "b": Buffer("b", (64,), "float32", Usage.WEIGHTS), "y": Buffer("y", (16, 64), "bfloat16", Usage.SCRATCH)}
    step = Step("kernel", "eltwise", ("b", "x"), ("y",), {"head": {"op": "sub", "attrs": {}}, "chain": [],
                                                        "views": [[], []],
                                                        "tiling": {"chunk": 64, "cores": 4}, "n_head": 2})
    params = {}
    with standin.installed():
        rec = kernels.design_module(step).build("npu2", step, buffers, params)
    assert params["sequence"] == [1, 0, 2]       # the per-row x first, then the broadcast b, then y
    good = ["memref<1024xbf16>", "memref<64xf32>", "memref<1024xbf16>"]
    standin.check_run(rec, good)
    swapped = [good[1], good[0], good[2]]
    for wrong in (swapped, good[:2], good + good[:1], good[:2] + ["memref<1024xf32>"]):
        with pytest.raises(standin.SequenceMismatch):
            standin.check_run(rec, wrong)
    declared = ", ".join(f"%a{i}: {t}" for i, t in enumerate(good))
    module = "\n".join(["aie.device(npu2) @k {", f"  aiex.runtime_sequence @sequence({declared}) {{",
                        "aie.device(npu2) @main {", "  aiex.configure @k {",
                        f"    aiex.run @sequence(%v0, %v1, %v2) : ({', '.join(good)})",
                        f"    aiex.run @sequence(%v1, %v0, %v2) : ({', '.join(swapped)})"])
    with pytest.raises(standin.SequenceMismatch, match=r"1 of 2 runs"):
        standin.check_runs(module)


def _passthrough(io, *, in_fn_args=True, group=None, runtime_kwargs=None, worker_kwargs=None, stray=False):
    """A one-core copy in v1.4.5's spelling, optionally broken: the stand-in builds it as the release would.
    `stray`: a second Worker is made and not given to Program."""
    t = np.ndarray[(64,), np.dtype[np.int32]]
    of_in, of_out = io.ObjectFifo(t, depth=2, name="in"), io.ObjectFifo(t, depth=2, name="out")

    def core(a, b):
        x, y = a.acquire(1), b.acquire(1)
        a.release(1)
        b.release(1)
    worker = io.Worker(core, [of_in.cons(), of_out.prod()], **(worker_kwargs or {"tile": io.Tile(0, 2)}))
    if stray:
        io.Worker(lambda: None, [], tile=io.Tile(1, 2))
    into, out = of_in.prod(tile=io.Tile(0, 0)), of_out.cons(tile=io.Tile(0, 0))

    def sequence(a, b, *_):
        tg = io.TaskGroup() if group == "explicit" else None
        into.fill(a, group=tg)
        out.drain(b, wait=True)
        if tg is not None:
            tg.finish()
    rt = io.Runtime(sequence, [t, t] + ([into, out] if in_fn_args else []), **(runtime_kwargs or {}))
    return io.Program(io.NPU2(), rt, workers=[worker]).resolve_program()


def test_the_standin_refuses_what_mlir_aie_v1_4_5_refuses():
    """tests/iron_standin.py has v1.4.5's signatures (kernels/README.md, "IRON API of v1.4.5"): the spellings of
    v1.3.x and the misuses the release raises on fail here with the release's exception types."""
    with standin.installed():
        io = iron()
        rec = _passthrough(io)
        assert standin.check(rec, TARGETS["npu2"]) == [] and [t.kind for t in rec.runtime.transfers] == \
            ["fill", "drain"]
        standin.fresh()
        t = np.ndarray[(64,), np.dtype[np.int32]]
        for old in ("sequence", "fill", "drain", "start", "task_group", "finish_task_group", "sync_parameters"):
            assert not hasattr(io.Runtime(lambda: None), old)    # the v1.3 Runtime methods are gone (PR #3387)
        with pytest.raises(TypeError):
            io.Runtime()                                          # the sequence body is the first argument
        with pytest.raises(TypeError):
            io.ObjectFifo(t, 2)                                   # depth is keyword-only
        with pytest.raises(TypeError):
            io.ObjectFifo(t, depth=2, dims_to_stream=[(64, 1)])   # now to_stream=, a TensorAccessPattern
        with pytest.raises(TypeError):
            io.ObjectFifo(t, depth=2, to_stream=[(64, 1)])
        with pytest.raises(TypeError):
            io.ObjectFifo(t, depth=2).cons().forward(placement=io.Tile(0, 1))   # now tile=
        with pytest.raises(RuntimeError):
            io.TaskGroup()                                        # only inside the sequence body
        f = io.ObjectFifo(t, depth=2, name="f")
        with pytest.raises(RuntimeError):
            f.prod(tile=io.Tile(0, 0)).fill(io.Runtime(lambda a: None, [t]).data[0])   # fill outside the body
        with pytest.raises(ValueError):
            f.prod(tile=io.Tile(1, 0))                            # a producer pinned to one shim, not two
        with pytest.raises(ValueError):
            f.cons().fill(None)                                   # fill on a consumer handle
        with pytest.raises(ImportError):
            from aie.iron import GlobalBuffer  # noqa: F401       # now Buffer
        with pytest.raises(ImportError):
            from aie.iron.placers import SequentialPlacer  # noqa: F401   # placement is aiecc's pass
        for broken, error in (({"in_fn_args": False}, ValueError),       # runtime ends not given to the Runtime
                              ({"group": "explicit"}, standin.IronRuntimeError),   # default + explicit groups
                              ({"runtime_kwargs": {"strict_task_groups": True, "placement": None}}, TypeError),
                              ({"worker_kwargs": {"placement": io.Tile(0, 2)}}, TypeError)):
            standin.fresh()
            with pytest.raises(error):
                _passthrough(io, **broken)
        standin.fresh()
        k = io.Kernel("copy", "eltwise.o", [t, t])
        with pytest.raises(ValueError):
            k(None)                                               # a call with the wrong number of arguments


def _fills_on_one_shim(io, n: int):
    """A one-core copy of n objects, each its own fill on shim (0, 0), all in the default group (so all live at
    once); the one drain goes through shim (1, 0)."""
    obj, whole = np.ndarray[(64,), np.dtype[np.int32]], np.ndarray[(64 * n,), np.dtype[np.int32]]
    of_in, of_out = io.ObjectFifo(obj, depth=2, name="in"), io.ObjectFifo(obj, depth=2, name="out")

    def core(a, b):
        for _ in io.range_(n):
            a.acquire(1)
            b.acquire(1)
            a.release(1)
            b.release(1)
    worker = io.Worker(core, [of_in.cons(), of_out.prod()], tile=io.Tile(0, 2))
    into, out = of_in.prod(tile=io.Tile(0, 0)), of_out.cons(tile=io.Tile(1, 0))

    def sequence(a, b, *_):
        for i in range(n):
            into.fill(a, tap=io.TensorAccessPattern((64 * n,), 64 * i, [1, 1, 1, 64], [0, 0, 0, 1]))
        out.drain(b, wait=True)
    rt = io.Runtime(sequence, [whole, whole, into, out])
    return io.Program(io.NPU2(), rt, workers=[worker]).resolve_program()


def test_the_standin_refuses_a_17th_live_shim_buffer_descriptor():
    """aiecc refuses a runtime sequence with a 17th buffer descriptor live on one shim tile
    (AIEAssignRuntimeSequenceBDIDs.cpp); the stand-in refuses it as the sequence body runs, naming the tile, the
    count and the transfer, and builds 16."""
    with standin.installed():
        io = iron()
        rec = _fills_on_one_shim(io, 16)
        assert rec.runtime.peak[io.Tile(0, 0)] == 16 and standin.check(rec, TARGETS["npu2"]) == []
        standin.fresh()
        with pytest.raises(standin.TooManyBufferDescriptors, match=r"tile \(0,0\), which supports up to 16: the "
                                                                   r"fill of in .* live descriptor 17"):
            _fills_on_one_shim(io, 17)


# ---- one graph that exercises every design, fused into one program ----------------------------------------------

SYNTH_WEIGHTS = {"ln_w": (64,), "ln_b": (64,), "w1": (128, 64), "b1": (128,), "w2": (64, 128), "b2": (64,),
                 "rms_w": (64,), "wq": (64, 64), "wk": (64, 64), "wv": (64, 64), "cos": (16, 16), "sin": (16, 16),
                 "conv_w": (8, 3, 3, 3), "conv_b": (8,), "dw": (16, 1, 5), "wo": (64, 64), "bo": (64,)}


def synthetic(w, x, img, seq, last, length):
    """Layer norm -> GEMM+GELU -> GEMM; RMS norm (also an output, so it stays a kernel); Q/K/V (one merged GEMM) with rotary embedding and masked
    attention; softmax, log-softmax, GLU; a decode-shaped GEMV and argmax; conv2d, max pool, global mean;
    depthwise conv1d."""
    n = ops.layer_norm(x, w["ln_w"], w["ln_b"], eps=1e-5)                          # [1, 16, 64]
    h = ops.linear(ops.gelu(ops.linear(n, w["w1"], w["b1"])), w["w2"], w["b2"])
    r = ops.rms_norm(h, w["rms_w"], eps=1e-6)
    q, k, v = (ops.linear(r, w[p]).reshape(1, 16, 4, 16).transpose(0, 2, 1, 3) for p in ("wq", "wk", "wv"))
    q, k = ops.rotary(q, w["cos"], w["sin"]), ops.rotary(k, w["cos"], w["sin"])
    mask = ops.length_mask(length, size=16).reshape(1, 1, 1, 16)
    a = ops.attention(q, k, v, mask, scale=0.25)
    s = ops.softmax(n, axis=-1)
    ls = ops.log_softmax(h, axis=-1)
    g = ops.glu(ls, axis=-1)
    logits = ops.linear(last, w["wo"], w["bo"])                                     # [1, 64] -> [1, 64]: GEMV
    pick = ops.argmax(logits, axis=-1)
    c = ops.max_pool2d(ops.relu(ops.conv2d(img, w["conv_w"], w["conv_b"], stride=2, padding=1)), kernel=3,
                       stride=2, padding=1)
    pooled = ops.mean(c, axis=(2, 3))
    dw = ops.conv1d(seq, w["dw"], None, padding=2, groups=16)
    return {"attn": a, "soft": s, "glu": g, "pick": pick, "pooled": pooled, "dw": dw, "normed": r}


def synthetic_graph():
    return trace(synthetic, name="synthetic", weights=SYNTH_WEIGHTS,
                 inputs={"x": ((1, 16, 64), "float32"), "img": ((1, 3, 16, 16), "float32"),
                         "seq": ((1, 16, 20), "float32"), "last": ((1, 64), "float32")},
                 params={"length": ((), "int32")})


@pytest.fixture(scope="module")
def synthetic_programs():
    return {t: compile_graphs([synthetic_graph()], t) for t in TARGET_NAMES}


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_every_design_builds_and_fits(synthetic_programs, target):
    program = synthetic_programs[target]
    seen, failures = set(), []
    for step in kernel_steps(program):
        problems, params = check_step(step, program, target)
        seen.add(name_of(step))
        if problems:
            failures.append(f"{name_of(step)}: " + "; ".join(problems[:4]))
    assert not failures, "\n".join(failures)
    expected = {"gemm", "gemv", "norm", "mha", "rope", "softmax", "eltwise", "argmax", "conv2d", "pool", "reduce",
                "dwconv1d", "maskgen"}
    assert expected <= seen, f"designs not exercised: {expected - seen}"


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_fused_design_is_one_sequence_per_dispatch(synthetic_programs, target):
    program = synthetic_programs[target]
    with standin.installed():
        fused = fused_design.build(program)
    dispatches = [s for e in program.entries.values() for s in e.steps if s.kind == "dispatch"]
    assert len(fused.sequences) == len(dispatches) == 1  # every op on the NPU: the whole graph is one dispatch
    runs = next(iter(fused.sequences.values()))
    assert len(runs) == len(kernel_steps(program))
    text = fused.mlir()
    assert text.count("aiex.run @sequence") == len(runs) == standin.check_runs(text)
    assert text.count("aiex.configure @") == sum(1 for i, r in enumerate(runs) if i == 0 or runs[i - 1].device != r.device)
    for run in runs:  # every operand view lies inside its arena
        for _, arena, offset, elements, dtype in run.operands:
            assert 0 <= offset and offset + elements * np.dtype(dtype).itemsize <= fused.arenas[arena]
    assert fused.params["synthetic"] == ["synthetic/length"]  # the valid length is a runtime parameter
    manifest = fused.manifest()
    assert set(manifest["devices"]) == set(fused.devices) and manifest["arenas"] == fused.arenas


def greedy_tail(w, logits, lo, hi):
    """Whisper's decode_greedy tail at a width that exercises what its real size needs: a length mask wider than
    the chunk that the chunk does not divide, a slice from an odd element, rows of odd width, and values gathered
    at an argmax the same dispatch computes."""
    V, begin = logits.shape[1], 4001
    outside = float(ops.NEG_INF) - (ops.length_mask(lo, size=V) - ops.length_mask(hi, size=V))
    lp = ops.log_softmax(logits + outside, axis=-1)
    ts = lp[:, begin:]
    within = ops.log_softmax(ts, axis=-1)

    def at(a, i):
        return ops.embedding(a.reshape(a.shape[1], 1), i).reshape(1)
    best, ts_best = ops.argmax(lp, axis=-1), ops.argmax(within, axis=-1)
    return {"token": best, "logprob": at(lp, best), "ts_token": ts_best, "ts_logprob": at(within, ts_best),
            "ts_total": at(ts, ts_best) - at(within, ts_best)}


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_the_greedy_tail_builds_and_the_emulator_picks_what_numpy_picks(target):
    from sdk.runtime.emu import EmuBackend
    graph = trace(greedy_tail, name="greedy", weights={}, inputs={"logits": ((1, 4100), "float32")},
                  params={"lo": ((), "int32"), "hi": ((), "int32")})
    program = compile_graphs([graph], target)
    steps = kernel_steps(program)
    assert not [k for k in steps if k.op == "gather"]   # folded into the argmax kernels (fuse._fold_argmax_picks)
    # at(within, ts_best) twice (ts_logprob, ts_total) and at(ts, ts_best): picks of the row itself (0) and of ts
    assert sorted(k.attrs.get("picks", []) for k in steps if k.op == "argmax") == [[0], [0, 1, 0]]
    mask = next(k for k in steps if k.op == "maskgen")
    assert program.buffers[mask.outputs[0]].shape[0] % mask.attrs["tiling"]["chunk"] == 0 < \
        program.buffers[mask.outputs[0]].shape[0] - 4100   # stored padded to whole chunks
    failures = [f"{name_of(k)}: {p}" for k in steps for p in check_step(k, program, target)[0]]
    assert not failures, "\n".join(failures)
    with standin.installed():
        fused_design.build(program)   # nothing refused, no data-dependent DMA address

    logits = np.random.default_rng(3).normal(scale=3.0, size=(1, 4100)).astype(np.float32)
    out = EmuBackend(target).load(program, {}).run("greedy", {"logits": logits, "lo": np.int32(0),
                                                               "hi": np.int32(4050)})
    z = np.where(np.arange(4100) < 4050, logits[0], np.float32(ops.NEG_INF))   # only [lo, hi) = [0, 4050) stays
    lp = z - np.log(np.exp(z - z.max()).sum()) - z.max()
    ts = lp[4001:]
    within = ts - np.log(np.exp(ts - ts.max()).sum()) - ts.max()
    assert int(np.argmax(within)) > 0
    assert int(out["token"][0]) == int(np.argmax(lp)) and int(out["ts_token"][0]) == int(np.argmax(within))
    np.testing.assert_allclose([out["logprob"][0], out["ts_logprob"][0], out["ts_total"][0]],
                               [lp.max(), within.max(), ts[np.argmax(within)] - within.max()], atol=2e-2)


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_a_gemv_whose_k_is_off_the_tile_repeats_its_last_word(target):
    """GigaAM's joint: relu(enc + dec) [1, 28] into a 32-deep tile. The row is no padded GEMM output, so the K
    padding (against the weight's zero rows) repeats its last 32-bit word, in a transfer of its own."""
    def joint(w, enc, dec):
        return {"logits": ops.linear(ops.relu(enc + dec), w["w"], w["b"])}
    program = compile_graphs([trace(joint, name="joint", weights={"w": (34, 28), "b": (34,)},
                                    inputs={"enc": ((1, 28), "float32"), "dec": ((1, 28), "float32")})], target)
    gemv = [k for k in kernel_steps(program) if name_of(k) == "gemv"]
    assert len(gemv) == 1 and gemv[0].attrs["tiling"]["K"] % gemv[0].attrs["tiling"]["k"]
    problems, _ = check_step(gemv[0], program, target)
    assert not problems, problems


def test_fused_design_names_the_kernels_it_cannot_build():
    # an int32 entry input read through a transpose: a DMA moves contiguous words, and kernels/transpose moves
    # floats only, so layout.route_transposes leaves it to the copy, which refuses
    def transposed(w, x):
        return {"y": ops.transpose(x, perm=(1, 0))}
    program = compile_graphs([trace(transposed, name="t", weights={}, inputs={"x": ((4, 6), "int32")})], "npu2")
    with standin.installed(), pytest.raises(DesignError, match=r"1 kernel steps have no design.*copy.*stride"):
        fused_design.build(program)


def test_a_design_that_refuses_after_making_a_worker_is_what_the_user_sees(monkeypatch):
    """A design that refuses after it made fifos and a Worker (here the eltwise design, patched to) leaves them on
    the stand-in's record; the next design to resolve must not take them for its own and fail with "Workers were
    made but not given", which would hide the refusal: the fused build reports the refusal's own message. A
    Worker a design makes and does not give to its Program is still refused when it is the only problem."""
    from kernels.eltwise import design as eltwise

    def refuses_late(target, step, buffers, params):
        io = iron()
        t = np.ndarray[(64,), np.dtype[np.int32]]
        fifo = io.ObjectFifo(t, depth=2, name="abandoned")
        io.Worker(lambda a: None, [fifo.cons()], tile=io.Tile(0, 2))
        raise DesignError("relu: this design's own refusal")
    monkeypatch.setattr(eltwise, "build", refuses_late)

    def padded(w, x):
        return {"y": ops.pad(ops.relu(x), pads=((1, 1), (0, 0)), value=0.5)}
    program = compile_graphs([trace(padded, name="pad", weights={}, inputs={"x": ((4, 6), "float32")})], "npu2")
    assert [k.op for k in kernel_steps(program)] == ["eltwise", "concat"]   # the concat resolves after the refusal
    with standin.installed():
        with pytest.raises(DesignError, match="relu: this design's own refusal") as refused:
            fused_design.build(program)
        assert "not given" not in str(refused.value)
        standin.fresh()
        with pytest.raises(ValueError, match="1 Workers were made but not given to Program"):
            _passthrough(iron(), stray=True)


@pytest.mark.parametrize("target", TARGET_NAMES)
@pytest.mark.parametrize("shape,perm", [((4, 6), (1, 0)), ((2, 3, 8), (2, 0, 1))])
def test_an_fp32_entry_input_read_through_a_transpose_goes_through_kernels_transpose(target, shape, perm):
    """layout.route_transposes routes an fp32 entry input as it routes activations: a transpose step (fp32 in and
    out, the copy into the fp32 entry output moves whole words) inside the entry's one dispatch, then a plain
    copy. [2, 3, 8] by (2, 0, 1) is the transpose of x as [6, 8]: the trailing output axes merge into one."""
    def transposed(w, x):
        return {"y": ops.transpose(x, perm=perm)}
    program = compile_graphs([trace(transposed, name="t", weights={}, inputs={"x": (shape, "float32")})], target)
    steps = kernel_steps(program)
    assert [k.op for k in steps] == ["transpose", "copy"]
    assert sum(s.kind == "dispatch" for e in program.entries.values() for s in e.steps) == 1
    failures = [p for k in steps for p in check_step(k, program, target)[0]]
    assert not failures, failures
    with standin.installed():
        fused_design.build(program)
    from sdk.runtime.emu import EmuBackend
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    y = EmuBackend(target).load(program, {}).run("t", {"x": x})["y"]
    np.testing.assert_array_equal(y, np.transpose(x, perm))   # fp32 all the way: no rounding


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_a_pad_along_two_axes_is_two_concats(target):
    def padded(w, x):
        return {"y": ops.pad(ops.relu(x), pads=((1, 1), (2, 2)), value=0.5)}
    program = compile_graphs([trace(padded, name="pad2", weights={}, inputs={"x": ((4, 6), "float32")})], target)
    steps = kernel_steps(program)
    assert [k.op for k in steps] == ["eltwise", "concat", "concat"]
    failures = [p for k in steps for p in check_step(k, program, target)[0]]
    assert not failures, failures
    from sdk.runtime.emu import EmuBackend
    x = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32)
    y = EmuBackend(target).load(program, {}).run("pad2", {"x": x})["y"]
    want = np.pad(np.maximum(x, 0), ((1, 1), (2, 2)), constant_values=0.5)
    np.testing.assert_allclose(y, want, rtol=2 ** -8)   # relu's rows stored as bf16 on the way


@pytest.mark.parametrize("target", TARGET_NAMES)
@pytest.mark.parametrize("shape,dtype,tile", [((6, 32, 48), "bfloat16", (32, 48)), ((1, 251, 32), "bfloat16", (251, 16)),
                                              ((1, 64, 125), "float32", (16, 125))])
def test_transpose_design(target, shape, dtype, tile):
    """A transpose step as layout.route_transposes emits it (here made by hand): the design builds and writes every
    element. [1, 251, 32] is the conformer's 20 s bucket: 251 rows (prime) of 32 exceed the tile, so it tiles by
    all rows x 16 columns (16 whole output rows per tile). An fp32 x (a conv output of odd width, kept in words:
    a 125-row Whisper encoder bucket) is transposed into bf16."""
    from sdk.program import Buffer, Step, Usage
    b, r, c = shape
    buffers = {"x": Buffer("x", (b, r, c), dtype, Usage.SCRATCH),
               "y": Buffer("y", (b, c, r), "bfloat16", Usage.SCRATCH)}
    step = Step("kernel", "transpose", ("x",), ("y",), {"head": {"op": "transpose", "attrs": {}}, "chain": [],
                                                        "views": [[]], "tiling": {"cores": 4}})
    params = {}
    with standin.installed():
        from kernels.transpose import design
        rec = design.build(target, step, buffers, params)
    assert standin.check(rec, TARGETS[target]) == []
    assert (standin.written(rec, 1) == 1).all()
    assert (params["rows_per_call"], params["columns_per_call"]) == tile


# ---- the GEMM's memtile layouts are the kernel's -------------------------------------------------------------

@pytest.mark.parametrize("target", TARGET_NAMES)
def test_gemm_blocking_matches_the_kernel_layout(target):
    """The memtile access patterns of the GEMM design, run as an address simulator, produce the blocked tiles
    the kernel reads (tests/test_kernels.py feeds gemm.cc exactly this layout), and un-block its output. A tile
    of B^T [n, k] (a bmm's B read by its columns) arrives as B's blocks in B's order, each one transposed."""
    from kernels.gemm.tiles import blocking, blocking_transposed, unblocking
    R, S, T = TARGETS[target].mac_shape
    m, k = 16, 32

    def stream(dims, n):
        idx = np.zeros([d for d, _ in dims], np.int64)
        for axis, (size, stride) in enumerate(dims):
            shape = [1] * len(dims)
            shape[axis] = size
            idx = idx + np.arange(size).reshape(shape) * stride
        assert idx.size == n
        return idx.reshape(-1)

    tile = np.arange(m * k)
    expect = tile.reshape(m // R, R, k // S, S).transpose(0, 2, 1, 3).reshape(-1)
    np.testing.assert_array_equal(tile[stream(blocking(m, k, R, S), m * k)], expect)
    n = 16
    bt = np.arange(n * k).reshape(n, k)                                   # bt[j, q] is B[q, j]
    expect = bt.reshape(n // T, T, k // S, S).transpose(2, 0, 1, 3).reshape(-1)  # [k/S][n/T][T][S]
    np.testing.assert_array_equal(bt.reshape(-1)[stream(blocking_transposed(n, k, T, S), n * k)], expect)
    rows = 3
    blocked = np.concatenate([np.arange(m * k).reshape(m // R, R, k // T, T).transpose(0, 2, 1, 3).reshape(-1)
                              + i * m * k for i in range(rows)])
    order = np.concatenate([tile[stream(unblocking(m, k, R, T), m * k)]          # the join walks each tile
                            for tile in blocked.reshape(rows, m * k)])
    np.testing.assert_array_equal(order, np.arange(rows * m * k))


# ---- build: the toolchain pin, the manifest ------------------------------------------------------------------

def test_build_without_toolchain_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setattr(kbuild.importlib.metadata, "version",
                        lambda dist: (_ for _ in ()).throw(kbuild.importlib.metadata.PackageNotFoundError(dist)))
    with pytest.raises(kbuild.ToolchainMissing) as e:
        kbuild.find_toolchain()
    assert TOOLCHAIN_PIN["mlir_aie"].lstrip("v") in e.value.fix and TOOLCHAIN_PIN["llvm_aie"] in e.value.fix
    assert kbuild.main([str(FIXTURES / "bert"), "--target", "npu2"]) == 1
    err = capsys.readouterr().err
    assert "mlir_aie" in err and f"llvm-aie=={TOOLCHAIN_PIN['llvm_aie']}" in err


def test_aie_apps_build_exits_nonzero_without_toolchain(monkeypatch):
    from typer.testing import CliRunner

    from apps.main import app
    monkeypatch.setattr(kbuild.importlib.metadata, "version",
                        lambda dist: (_ for _ in ()).throw(kbuild.importlib.metadata.PackageNotFoundError(dist)))
    result = CliRunner().invoke(app, ["build", str(FIXTURES / "bert"), "--target", "npu1"])
    assert result.exit_code == 1
    assert "pip install mlir_aie" in result.output


def test_installed_aie_apps_build_finds_the_checkouts_kernels(tmp_path):
    """The console script, run outside the checkout with nothing on PYTHONPATH (as a user runs it after
    `pip install -e .`), reaches kernels/build.py: here that is the toolchain check, exit 1."""
    script = Path(sys.executable).with_name("aie-apps")
    if not script.exists():
        pytest.skip(f"aie-apps is not installed next to {sys.executable}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(script), "build", "smoke", "--target", "npu2"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "pip install mlir_aie" in done.stderr and done.stdout == ""


def test_committed_manifest_is_empty_and_valid():
    """The committed manifest is the runtime's format with no artifact (nothing can be built here)."""
    from sdk.runtime import npu_artifacts
    doc = json.loads((kbuild.PREBUILT / "manifest.json").read_text())
    assert doc == {"format": npu_artifacts.MANIFEST_FORMAT, "artifacts": {}}
    assert npu_artifacts.read_manifest(kbuild.PREBUILT / "manifest.json") == {}


def test_content_key_follows_every_kernel_source_and_the_target(synthetic_programs, monkeypatch, tmp_path):
    """One content key (the compiler's), over every source under kernels/, also those of kinds whose design
    lives in another kind's folder (dma, dwconv1d) and the shared include/ and access.py."""
    from sdk.compiler import npu as npu_compiler
    p1, p2 = synthetic_programs["npu1"], synthetic_programs["npu2"]
    k1 = p1.meta["content_key"]
    assert k1 != p2.meta["content_key"] and k1 == npu_compiler.content_key(p1)
    for source in ("include/npu_kernel.h", "access.py", "dma/design.py", "fused/design.py"):
        tree = tmp_path / source.replace("/", "_")
        for f in kbuild.KERNELS.rglob("*"):
            if f.is_file() and "__pycache__" not in f.parts:
                (tree / f.relative_to(kbuild.KERNELS)).parent.mkdir(parents=True, exist_ok=True)
                (tree / f.relative_to(kbuild.KERNELS)).write_bytes(f.read_bytes())
        monkeypatch.setattr(npu_compiler, "KERNELS_DIR", tree)
        assert npu_compiler.content_key(p1) == k1  # the same bytes: the same key
        (tree / source).write_bytes((tree / source).read_bytes() + b"\n")
        assert npu_compiler.content_key(p1) != k1, source


# ---- what the fills deliver: the GEMM's A and B tiles reach the cores in the kernel's order ----------------------

@pytest.mark.parametrize("planes", [1, 2], ids=["bf16", "split"])
@pytest.mark.parametrize("target", TARGET_NAMES)
def test_gemm_fills_deliver_the_tiles_each_core_multiplies(target, planes):
    """The addresses the GEMM design's fills read, cut into objects, are the A row tiles and packed B tiles each
    core multiplies, in its loop order (column tiles, row tiles, K steps), re-derived here independently. Split
    weights ([2, Kt, Nt, k, n]): each B object is a tile's hi plane, then its lo plane."""
    from sdk.program import Buffer, Step, Usage
    M, K, N, m, k, n = 64, 64, 128, 16, 32, 32
    Kt, Nt = K // k, N // n
    buffers = {"a": Buffer("a", (M, K), "bfloat16", Usage.SCRATCH),
               "w": Buffer("w", (planes, Kt, Nt, k, n)[planes == 1:], "bfloat16", Usage.WEIGHTS),
               "y": Buffer("y", (M, N), "bfloat16", Usage.SCRATCH)}
    tiling = {"M": M, "K": K, "N": N, "m": m, "k": k, "n": n, "Kp": K, "Np": N, "cores": 8, "precision": "bf16"}
    if planes > 1:
        tiling["weight_planes"] = planes
    step = Step("kernel", "gemm", ("a", "w", None), ("y",),
                {"head": {"op": "linear", "attrs": {}}, "chain": [], "views": [[], [], []], "tiling": tiling,
                 "n_splits": [N], "n_head": 3})
    params = {}
    with standin.installed():
        from kernels.gemm import design
        rec = design.build(target, step, buffers, params)
    assert standin.check(rec, TARGETS[target]) == []
    cols, rows = params["columns"], params["rows"]
    it, jt = (M // m) // rows, Nt // cols

    def delivered(fifo_prefix, data_index):
        out = {}
        for t in rec.runtime.transfers:
            if t.kind == "fill" and t.data is rec.runtime.data[data_index] and t.handle.fifo.name.startswith(fifo_prefix):
                out.setdefault(t.handle.fifo.name, []).append(t.tap.addresses())
        return {name: np.concatenate(parts) for name, parts in out.items()}

    a_streams = delivered("gemm_a", 0)
    for r in range(rows):
        want = [np.arange(M * K).reshape(M, K)[i * m:(i + 1) * m, q * k:(q + 1) * k].reshape(-1)
                for _ in range(jt) for il in range(it) for i in [il * rows + r] for q in range(Kt)]
        np.testing.assert_array_equal(a_streams[f"gemm_a{r}"], np.concatenate(want))
    b_streams = delivered("gemm_b", 1)
    for c in range(cols):
        want = [np.arange(planes * Kt * Nt * k * n).reshape(planes, Kt, Nt, k * n)[:, q, jl * cols + c].reshape(-1)
                for jl in range(jt) for _ in range(it) for q in range(Kt)]
        np.testing.assert_array_equal(b_streams[f"gemm_b{c}"], np.concatenate(want))
    # and every output element is drained exactly once
    assert (standin.written(rec, 2) == 1).all()


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_bmm_with_a_batched_b_streams_each_slice_its_own(target):
    """The conformer's rel-pos scores: q [1, H, T, D] @ r [1, H, D, 2T - 1], where r is the [2T - 1, H x D]
    position projection read through reshape + transpose, so B's columns are contiguous and its rows are not.
    One B per head (tiling batch): the A stream carries each head's row tile, and the B stream that head's
    B^T rows [n, k], the row past N = 15 (the output is padded to 16 columns) a repeat of the last one, which
    gemm_mac_bt zeroes. The drains write every element of the padded output once."""
    from sdk.program import Buffer, Step, Usage
    H, T, D = 4, 8, 8
    N = 2 * T - 1
    buffers = {"q": Buffer("q", (1, H, T, D), "bfloat16", Usage.SCRATCH),
               "r": Buffer("r", (N, H * D), "bfloat16", Usage.SCRATCH),
               "y": Buffer("y", (1, H, T, 16), "float32", Usage.SCRATCH)}
    tiling = {"M": H * T, "K": D, "N": N, "m": 8, "k": 8, "n": 16, "Kp": D, "Np": 16, "batch": H, "cores": 4,
              "precision": "bf16"}
    step = Step("kernel", "bmm", ("q", "r"), ("y",),
                {"head": {"op": "matmul", "attrs": {}}, "chain": [], "tiling": tiling, "stored_width": 16,
                 "views": [[], [("reshape", (1, N, H, D)), ("transpose", (0, 2, 3, 1))]], "n_head": 2})
    params = {}
    with standin.installed():
        from kernels.gemm import design
        rec = design.build(target, step, buffers, params)
    assert standin.check(rec, TARGETS[target]) == []
    assert params["batch"] == H and params["b_transposed"] and params["cores"] == 1
    assert (standin.written(rec, 2) == 1).all()

    def delivered(data_index):
        return np.concatenate([t.tap.addresses() for t in rec.runtime.transfers
                               if t.kind == "fill" and t.data is rec.runtime.data[data_index]])

    np.testing.assert_array_equal(delivered(0), np.arange(H * T * D))   # head by head, T rows each
    rows = np.minimum(np.arange(16), N - 1)
    want = [(rows[:, None] * H * D + h * D + np.arange(D)).reshape(-1) for h in range(H)]
    np.testing.assert_array_equal(delivered(1), np.concatenate(want))


def _rel_pos_scores(T, H, D):
    """The conformer's rel-pos scores alone: q heads [1, H, T, D] @ the position projection [2T - 1, H x D]
    viewed [1, H, D, 2T - 1] (sdk/models/conformer.py)."""
    def scores(w, x, pos):
        q = ops.linear(x, w["wq"]).reshape(1, T, H, D).transpose(0, 2, 1, 3)
        r = ops.linear(pos, w["wr"]).reshape(1, 2 * T - 1, H, D).transpose(0, 2, 3, 1)
        return {"bd": ops.relu((q + w["bv"].reshape(1, H, 1, D)) @ r)}
    return trace(scores, name="scores", weights={"wq": (H * D, H * D), "wr": (H * D, H * D), "bv": (H, D)},
                 inputs={"x": ((1, T, H * D), "float32"), "pos": ((2 * T - 1, H * D), "float32")})


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_bmm_wider_than_a_tile_shifts_its_last_column_tile(target):
    """N = 2T - 1 = 47 over tiles of n = 32: the memory plan leaves the bmm output unpadded (fp32, rows of odd
    width are whole words), and the design shifts the last column tile to end at N (B^T rows 15..46 of each
    head): output columns 15..31 are written twice, with the same values, and every element at least once."""
    program = compile_graphs([_rel_pos_scores(24, 2, 16)], target)
    (step,) = [k for k in kernel_steps(program) if k.op == "bmm"]
    t = step.attrs["tiling"]
    assert (t["N"], t["n"], t["batch"]) == (47, 32, 2) and "stored_width" not in step.attrs
    out = program.buffers[step.outputs[0]]
    assert out.shape == (1, 2, 24, 47) and out.dtype == "float32"
    problems, params = check_step(step, program, target)
    assert problems == [] and params["shifted_columns"] and params["b_transposed"]
    rec, _ = build_step(step, program, target)
    hits = standin.written(rec, 2).reshape(2 * 24, 47)
    assert (hits[:, :15] == 1).all() and (hits[:, 15:32] == 2).all() and (hits[:, 32:] == 1).all()


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_bmm_slices_off_the_row_tile_go_in_task_groups(target):
    """T = 72 rows per head over row tiles of 64: each head's last row tile shifts (rows 8..71), so every head's
    A tiles and output tiles are transfers of their own. Eight heads would take more shim buffer descriptors than
    there are; the batched bmm's runtime sequence goes in task groups, which reuse them."""
    program = compile_graphs([_rel_pos_scores(72, 8, 16)], target)
    (step,) = [k for k in kernel_steps(program) if k.op == "bmm"]
    assert step.attrs["tiling"]["batch"] == 8 and step.attrs["tiling"]["m"] == 64
    problems, _ = check_step(step, program, target)
    assert problems == []


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_bmm_row_tile_stays_within_a_slice_off_the_mac_rows(target):
    """T = 50 rows per head (Parakeet-110M's 400 frames subsampled 8x), not a multiple of the MAC rows: the
    catalog's row tile is the slice's rows rounded down to the MAC rows (48), the tile the design uses (each head's
    last tile shifts back to end at row 50), not rounded up past the slice into the next head's rows."""
    program = compile_graphs([_rel_pos_scores(50, 2, 16)], target)
    (step,) = [k for k in kernel_steps(program) if k.op == "bmm"]
    assert step.attrs["tiling"]["batch"] == 2 and step.attrs["tiling"]["m"] == 48
    problems, params = check_step(step, program, target)
    assert problems == [] and params["m"] == 48

def _masked_attention(T, H, D, key_mask):
    """Self-attention of T tokens over H heads of D, masked by a key-padding mask [1, 1, 1, T] (ESM-2's and
    GigaAM's) or by a causal mask [T, T] whose rows differ."""
    def attend(w, x, n):
        q, k, v = (ops.linear(x, w[p]).reshape(1, T, H, D).transpose(0, 2, 1, 3) for p in ("wq", "wk", "wv"))
        mask = (ops.length_mask(n, size=T).reshape(1, 1, 1, T) if key_mask
                else ops.causal_cache_mask(n, n_new=T, size=T))
        return {"a": ops.attention(q, k, v, mask, scale=0.25)}
    return trace(attend, name="attend", weights={p: (H * D, H * D) for p in ("wq", "wk", "wv")},
                 inputs={"x": ((1, T, H * D), "float32")}, params={"n": ((), "int32")})


@pytest.mark.parametrize("target", TARGET_NAMES)
@pytest.mark.parametrize("T,key_mask,rows", [(17, True, -1), (24, True, 1), (24, False, None)],
                         ids=["key-mask-fp32", "key-mask", "causal"])
def test_mha_key_mask_is_one_row_per_key_block(target, T, key_mask, rows):
    """A mask whose rows are the same for every query (key padding) goes as one row of tk per key block, which
    the kernel broadcasts over the query tile (mask_rows 1, -1 for a fp32 mask of odd width: 17 keys, a prime,
    in blocks of 1), so each work item's mask for all three passes is one transfer, not one per (pass, key
    block). A causal mask's rows differ: tq rows per block."""
    program = compile_graphs([_masked_attention(T, 2, 16, key_mask)], target)
    (step,) = [k for k in kernel_steps(program) if name_of(k) == "mha"]
    problems, params = check_step(step, program, target)
    assert problems == [] and params["mask_rows"] == (rows or params["tq"])
    rec, _ = build_step(step, program, target)
    items = params["cores"] * params["items_per_core"]
    mask_fills = [t for t in rec.runtime.transfers if t.data is rec.runtime.data[3]]
    assert len(mask_fills) == items if key_mask else len(mask_fills) >= items


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_conv_rows_wider_than_l1_go_in_windows_of_columns(target):
    """Whisper's two conv1d at 8000 frames over 2 and 8 channels (tiny.en has 80 fp32 channels of 3000): one
    channel's row does not fit the L1 budget next to its output row, so the output row goes in windows of columns.
    Each core reads, per block and window, its band: the window's input columns with the halo (bf16: from an even
    column, rounded to whole words), the first and last clamped into the row, exactly the [chunk][win] objects
    test_kernels' test_conv2d_width_chunks_match_emu feeds conv2d.cc; every output element is written once, within
    the limits and the catalog's footprint."""
    def convs(w, x):
        return {"y": ops.conv1d(ops.gelu(ops.conv1d(x, w["w1"], w["b1"], padding=1)), w["w2"], w["b2"], stride=2,
                                padding=1)}
    program = compile_graphs([trace(convs, name="convs", weights={"w1": (8, 2, 3), "b1": (8,), "w2": (8, 8, 3),
                                                                    "b2": (8,)},
                                    inputs={"x": ((1, 2, 8000), "float32")})], target)
    hw, W = TARGETS[target], 8000
    for step, cin, s, a in zip([k for k in kernel_steps(program) if k.op == "conv"], (2, 8), (1, 2), (1, 2)):
        problems, params = check_step(step, program, target)
        assert problems == [] and params["windows"] > 1 and params["chunks"] == 1, (problems, params)
        wc = params["window"]
        win = -(-((wc - 1) * s + 3 + a - 1) // a) * a
        first = np.clip((np.arange(params["windows"]) * wc * s - 1) // a * a, 0, W - win)
        assert first[0] == 0 and first[-1] == W - win
        rec, _ = build_step(step, program, target)
        x_data = rec.runtime.data[0]
        got = np.concatenate([t.tap.addresses() for t in rec.runtime.transfers
                              if t.kind == "fill" and t.data is x_data and t.placement.col == 0])
        per_block = np.concatenate([(np.arange(cin)[:, None] * W + f + np.arange(win)).reshape(-1) for f in first])
        np.testing.assert_array_equal(got, np.tile(per_block, params["blocks_per_core"]))
        assert max(standin.l1_use(rec).values()) <= catalog.footprint("conv", step.attrs["tiling"], hw).l1 \
            <= hw.l1_bytes


def _gemm_step(inputs, outputs, tiling, chain=(), stored_width=None):
    from sdk.program import Step
    t = {"precision": "bf16", "cores": 8, **tiling}
    t |= {"Kp": -(-t["K"] // t["k"]) * t["k"], "Np": -(-t["N"] // t["n"]) * t["n"]}
    attrs = {"head": {"op": "linear", "attrs": {}}, "chain": list(chain), "views": [[] for _ in inputs],
             "tiling": t, "n_splits": [t["N"]], "n_head": 3}
    if stored_width:
        attrs["stored_width"] = stored_width
    return Step("kernel", "gemm", tuple(inputs), tuple(outputs), attrs)


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_gemm_pads_to_whole_tiles(target):
    """A GEMM output of N = 37 columns stored padded to Np = 64 (the memory plan's stored_width): the design
    drains whole tiles into [M, 64], every element once. The next GEMM (K = 37, tile k = 40) reads that buffer
    through a slice of its first 37 columns and reads each row on to 40, inside the row's padding."""
    from sdk.program import Buffer, Usage
    M = 16
    buffers = {"x": Buffer("x", (M, 32), "bfloat16", Usage.SCRATCH),
               "w1": Buffer("w1", (1, 2, 32, 32), "bfloat16", Usage.WEIGHTS),
               "h": Buffer("h", (M, 64), "float32", Usage.SCRATCH),
               "w2": Buffer("w2", (1, 1, 40, 32), "bfloat16", Usage.WEIGHTS),
               "y": Buffer("y", (M, 32), "bfloat16", Usage.SCRATCH)}
    up = _gemm_step(("x", "w1", None), ("h",), {"M": M, "K": 32, "N": 37, "m": 16, "k": 32, "n": 32},
                    stored_width=64)
    down = _gemm_step(("h", "w2", None), ("y",), {"M": M, "K": 37, "N": 32, "m": 16, "k": 40, "n": 32})
    down.attrs["views"][0] = [("slice", 1, 0, 37, 1)]
    from kernels.gemm import design
    with standin.installed():
        rec_up = design.build(target, up, buffers, {})
    with standin.installed():
        rec_down = design.build(target, down, buffers, {})
    assert standin.check(rec_up, TARGETS[target]) == standin.check(rec_down, TARGETS[target]) == []
    assert (standin.written(rec_up, 2) == 1).all()             # [16, 64]: the padding columns too
    rows = standin.read(rec_down, 0).reshape(-1, 40)           # A's tiles: whole rows of 40 of the stored 64
    assert set(map(int, rows[:, 0])) == set(range(0, M * 64, 64))
    np.testing.assert_array_equal(rows - rows[:, :1], np.broadcast_to(np.arange(40), rows.shape))


def test_memory_plan_pads_gemm_outputs_and_keeps_entry_outputs(programs):
    """BERT's FFN up-projection (N = 37, tile n = 32) stores [.., 64] and its reader slices it; ResNet's classifier
    (N = 10, an entry output) stores a padded fp32 scratch value that a copy moves into the [1, 10] io buffer."""
    for model, graphs in (("bert", _bert()), ("resnet", _resnet())):
        program = programs(model, "npu2")
        steps = kernel_steps(program)
        padded = [k for k in steps if k.attrs.get("stored_width")]
        assert padded, model
        for k in padded:
            out = k.outputs[0]
            assert program.buffers[out].shape[-1] == k.attrs["stored_width"] == k.attrs["tiling"]["Np"]
            cut = ("slice", len(program.buffers[out].shape) - 1, 0, k.attrs["tiling"]["N"], 1)
            reads = [tuple(v[0]) for r in steps for n, v in zip(r.inputs, r.attrs["views"]) if n == out]
            assert reads and all(v == cut for v in reads), (model, reads)
        for g in graphs:  # what the caller gets back keeps the graph's shapes
            for name, value in g.outputs.items():
                assert program.buffers[program.entries[g.name].outputs[name]].shape == g.values[value].shape


@pytest.mark.parametrize("rows", [2, 3])
@pytest.mark.parametrize("target", TARGET_NAMES)
def test_gemm_with_fewer_rows_than_the_mac_repeats_them(target, rows):
    """M = 2 or 3 rows (CLIP's pooled text rows) under the MAC shape's R rows: each tile reads the rows over and
    over and drains them onto the same rows (the same values each time); no buffer grows. A shim descriptor
    steps by 0 only in its outermost dimension, so each K step of a tile is its own transfer."""
    from sdk.program import Buffer, Usage
    R, K = TARGETS[target].mac_shape[0], 128
    buffers = {"a": Buffer("a", (rows, K), "float32", Usage.SCRATCH),
               "w": Buffer("w", (4, 1, 32, 16), "bfloat16", Usage.WEIGHTS),
               "y": Buffer("y", (rows, 16), "float32", Usage.IO)}
    step = _gemm_step(("a", "w", None), ("y",), {"M": rows, "K": K, "N": 16, "m": R, "k": 32, "n": 16})  # catalog's m
    params = {}
    with standin.installed():
        from kernels.gemm import design
        rec = design.build(target, step, buffers, params)
    assert standin.check(rec, TARGETS[target]) == [] and params["m"] == R
    a_rows = standin.read(rec, 0).reshape(-1, 32) // K                   # per K step, R rows cycling over M
    np.testing.assert_array_equal(a_rows[:, 0], np.arange(len(a_rows)) % R % rows)
    assert (standin.written(rec, 2) >= 1).all()
    for t in rec.runtime.transfers:
        live = [s for n, s in zip(t.tap.sizes, t.tap.strides) if n > 1]
        assert 0 not in live[1:], (t.kind, t.tap.sizes, t.tap.strides)


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_gemm_k_steps_split_over_groups_await_their_fills(target, monkeypatch):
    """M = 2 rows and K = 40 tile depths: a tile's K steps (each its own A transfer) split over task groups, and a
    group before the tile's drains awaits each fifo's last fill, so that finishing it frees no descriptor whose
    data still moves."""
    from sdk.program import Buffer, Usage
    R, K = TARGETS[target].mac_shape[0], 40 * 32
    buffers = {"a": Buffer("a", (2, K), "float32", Usage.SCRATCH),
               "w": Buffer("w", (40, 1, 32, 16), "bfloat16", Usage.WEIGHTS),
               "y": Buffer("y", (2, 16), "float32", Usage.IO)}
    step = _gemm_step(("a", "w", None), ("y",), {"M": 2, "K": K, "N": 16, "m": R, "k": 32, "n": 16})
    issued, finished = [], []   # (group, fifo, is a drain, wait) in order; groups as they finish
    fill, drain, finish = standin.Handle.fill, standin.Handle.drain, standin.TaskGroup.finish
    monkeypatch.setattr(standin.Handle, "fill", lambda self, source, tap=None, wait=False, group=None, **kw: (
        issued.append((group, self.fifo.name, False, wait)), fill(self, source, tap=tap, wait=wait, group=group, **kw)))
    monkeypatch.setattr(standin.Handle, "drain", lambda self, dest, tap=None, wait=False, group=None, **kw: (
        issued.append((group, self.fifo.name, True, wait)), drain(self, dest, tap=tap, wait=wait, group=group, **kw)))
    monkeypatch.setattr(standin.TaskGroup, "finish", lambda self: (finished.append(self), finish(self)))
    with standin.installed():
        from kernels.gemm import design
        rec = design.build(target, step, buffers, {})
    assert standin.check(rec, TARGETS[target]) == []
    fills_only = [g for g in finished if not any(d for grp, _, d, _ in issued if grp is g)
                  and any(grp is g for grp, *_ in issued) and g is not finished[-1]]   # the last: the resident one
    assert len(fills_only) > 1
    for g in fills_only:
        mine = [(fifo, wait) for grp, fifo, _, wait in issued if grp is g]
        last = {fifo: wait for fifo, wait in mine}   # each fifo's last fill
        assert all(last.values()), last


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_gemm_residual_tile_tops_up_its_a_object(target):
    """A residual tile (fp32 [16, 32], 2048 bytes) beside fp32 A objects of [16, 40] (2560 bytes): one A-sized
    object carries the tile's rows in order, then its first 4 rows again to fill it (gemm_residual reads the
    rows in order and never the top-up). The runtime sequence takes the run's operands in order: A, B, the
    residual, the output."""
    from sdk.program import Buffer, Usage
    M = 16
    buffers = {"a": Buffer("a", (M, 64), "float32", Usage.SCRATCH),
               "w": Buffer("w", (1, 1, 40, 32), "bfloat16", Usage.WEIGHTS),
               "r": Buffer("r", (M, 32), "float32", Usage.SCRATCH),
               "y": Buffer("y", (M, 32), "float32", Usage.SCRATCH)}
    step = _gemm_step(("a", "w", None, "r"), ("y",), {"M": M, "K": 37, "N": 32, "m": 16, "k": 40, "n": 32},
                      chain=[{"op": "add", "attrs": {}, "operand": 3, "swap": False}])
    step.attrs["views"][0] = [("slice", 1, 0, 37, 1)]
    params = {}
    with standin.installed():
        from kernels.gemm import design
        rec = design.build(target, step, buffers, params)
    assert standin.check(rec, TARGETS[target]) == [] and params["residual_objects"] == 1
    assert [d.elements for d in rec.runtime.data] == [M * 64, 40 * 32, M * 32, M * 32]
    rows = standin.read(rec, 2).reshape(-1, 32)[:, 0] // 32
    np.testing.assert_array_equal(rows, np.concatenate([np.arange(M), np.arange(4)]))


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_gemv_split_weight_fills_send_hi_then_lo_per_tile(target):
    """GEMV with split weights ([2, Kt, Nt, k, n]): after its bias, each core's W stream carries, per column tile
    and K step, one object holding the tile's hi plane, then its lo plane."""
    from sdk.program import Buffer, Step, Usage
    K, N, k, n = 64, 128, 32, 32
    Kt, Nt = K // k, N // n
    buffers = {"x": Buffer("x", (1, K), "bfloat16", Usage.SCRATCH),
               "w": Buffer("w", (2, Kt, Nt, k, n), "bfloat16", Usage.WEIGHTS),
               "b": Buffer("b", (N,), "float32", Usage.WEIGHTS),
               "y": Buffer("y", (1, N), "bfloat16", Usage.SCRATCH)}
    tiling = {"M": 1, "K": K, "N": N, "m": 4, "k": k, "n": n, "Kp": K, "Np": N, "cores": 8, "precision": "bf16",
              "weight_planes": 2}
    step = Step("kernel", "gemm", ("x", "w", "b"), ("y",),
                {"head": {"op": "linear", "attrs": {}}, "chain": [], "views": [[], [], []], "tiling": tiling,
                 "n_splits": [N], "n_head": 3})
    params = {}
    with standin.installed():
        from kernels.gemv import design
        rec = design.build(target, step, buffers, params)
    assert standin.check(rec, TARGETS[target]) == []
    cores, jt = params["cores"], params["tiles_per_core"]
    w_data = rec.runtime.data[1]
    for c in range(cores):
        got = np.concatenate([t.tap.addresses() for t in rec.runtime.transfers
                              if t.kind == "fill" and t.data is w_data and t.handle.fifo.name == f"gemv_w{c}"])
        want = [np.arange(2 * Kt * Nt * k * n).reshape(2, Kt, Nt, k * n)[:, q, c * jt + jl].reshape(-1)
                for jl in range(jt) for q in range(Kt)]
        np.testing.assert_array_equal(got, np.concatenate(want))
    assert (standin.written(rec, 3) == 1).all()


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_gemv_spreads_a_prime_tile_count_and_wraps_norm_vectors(target):
    """A GEMV head of 17 column tiles (a prime count, like Whisper's 51864-wide vocabulary in 1621 tiles) runs on
    as many cores as the shims feed, each core the same number of tiles (a core past the end recomputes its own
    last tile); gamma and beta (K = 96) wrap into whole W objects of 256 floats in two transfers each."""
    from sdk.program import Buffer, Usage
    K, N, k, n = 96, 272, 32, 16
    Kt, Nt = K // k, N // n
    buffers = {"x": Buffer("x", (1, K), "float32", Usage.SCRATCH),
               "w": Buffer("w", (Kt, Nt, k, n), "bfloat16", Usage.WEIGHTS),
               "g": Buffer("g", (K,), "float32", Usage.WEIGHTS), "b": Buffer("b", (K,), "float32", Usage.WEIGHTS),
               "y": Buffer("y", (1, N), "float32", Usage.SCRATCH)}
    step = _gemm_step(("x", "w", None, "g", "b"), ("y",), {"M": 1, "K": K, "N": N, "m": 8, "k": k, "n": n,
                                                          "cores": 32, "prologue_k": K})
    step.attrs["prologue"] = {"op": "layer_norm", "attrs": {"eps": 1e-5}, "operands": [3, 4]}
    params = {}
    with standin.installed():
        from kernels.gemv import design
        rec = design.build(target, step, buffers, params)
    assert standin.check(rec, TARGETS[target]) == []
    limit = TARGETS[target].columns * TARGETS[target].shim_channels - 1
    assert params["tiles_per_core"] == -(-Nt // limit) and params["cores"] > 1
    assert (standin.written(rec, 4) >= 1).all()                           # x, w, gamma, beta, y
    gamma = [t for t in rec.runtime.transfers if t.kind == "fill" and t.data is rec.runtime.data[2]
             and t.handle.fifo.name == "gemv_w0"]
    assert len(gamma) == 2
    np.testing.assert_array_equal(np.concatenate([t.tap.addresses() for t in gamma]), np.resize(np.arange(K), 256))


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_streaming_cores_write_the_rows_they_read(target):
    """In the row-streaming skeleton (here layer_norm), the k-th output object of every core is the row its
    k-th input object came from: the fills into each core's joined object and the column's drain agree."""
    from sdk.program import Buffer, Step, Usage
    rows, row = 48, 64
    buffers = {"x": Buffer("x", (rows, row), "float32", Usage.SCRATCH), "w": Buffer("w", (row,), "float32", Usage.WEIGHTS),
               "b": Buffer("b", (row,), "float32", Usage.WEIGHTS), "y": Buffer("y", (rows, row), "bfloat16", Usage.SCRATCH)}
    step = Step("kernel", "norm", ("x", "w", "b"), ("y",),
                {"head": {"op": "layer_norm", "attrs": {"eps": 1e-5}}, "chain": [], "views": [[], [], []],
                 "tiling": {"row": row, "elements": rows * row, "chunk": 64, "in_streams": 3, "cores": 16},
                 "n_head": 3})
    params = {}
    with standin.installed():
        from kernels.norm import design
        rec = design.build(target, step, buffers, params)
    assert standin.check(rec, TARGETS[target]) == []
    per_col = params["cores"] // params["columns"]
    for c in range(params["columns"]):
        drained = np.concatenate([t.tap.addresses() for t in rec.runtime.transfers
                                  if t.kind == "drain" and t.handle.fifo.name == f"norm_out_c{c}"])
        by_core = drained.reshape(-1, per_col, row)                                  # [object, core, row]
        for r in range(per_col):
            read = np.concatenate([t.tap.addresses() for t in rec.runtime.transfers
                                   if t.kind == "fill" and t.handle.fifo.name == f"norm_in0_c{c}r{r}"])
            np.testing.assert_array_equal(read.reshape(-1, row) // row, by_core[:, r] // row)
