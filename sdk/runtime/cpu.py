"""The cpu backend: every entry of a program runs as one ONNX Runtime session built from the entry's steps.

Each step is a few ONNX nodes (LOWERINGS). The sessions share one array per weight (EntryGraph: how each reaches a
session). State (KV caches, cross K/V) is the caller's arrays, bound as outputs over their own memory: a decoder step
writes its K/V at `pos` and copies no cache. Runtime parameters are 0-d int32 inputs; results are fresh arrays.
"""
from __future__ import annotations

import hashlib
import math
import threading
from typing import Callable, Mapping

import numpy as np

from ..errors import InputError, RunStopped, SdkError, UsageError
from ..ops import NEG_INF
from ..program import Entry, Program, Usage
from ..settings import load as load_settings
from .backend import Counters, State, check_inputs, check_weights

OPSET = 23  # Gelu (20) and RMSNormalization (23), each one ORT kernel
PRECISIONS = ("fp32", "int8")
SPIN = "0"  # a spinning intra-op pool collapses on a shared machine, a sleeping one degrades with load (issue 24)
# Unpacked, ORT packs a GEMM weight at every run (half of BERT-base's linear time at 128 rows; one row, never):
# an entry reading a weight with at least this many rows takes ONE packed copy for all, if none exists yet.
PACK_ROWS = 16
STOP_POLL_S = 0.01  # how often a run given `stop` asks it: a small part of an encoder pass
INT8_BLOCK = 16  # inputs per int8 block with its own scale (weights and activations): MatMulNBits' smallest, most exact
_arena_lock, _arena = threading.Lock(), []  # the process's one CPU arena once registered (CpuExecutable._options)


def _slice(g, out, x, axis, start, stop, step, n) -> str:
    """x[start:stop:step] along `axis` (of length n): Python's bounds (None, negative, past the end) made ONNX's."""
    start, stop, step = slice(start, stop, step).indices(n)
    if step < 0 and stop < 0:
        stop = -(1 << 63)  # before the first element: ONNX reads -1 as the last one
    return g.node("Slice", [x, *(g.const([v], np.int64) for v in (start, stop, axis, step))], out)


def _transposed(g, w) -> str:
    """A weight [out, in] as [in, out], transposed once at load: MatMul reads it in place (Gemm's transB reads
    [out, in] but is slower at one row, the decoder's case, without a prepacked copy per session)."""
    return g.derived(w, ".T", lambda weights: np.ascontiguousarray(weights[w].T), "float32",
                     g.program.buffers[w].shape[::-1])


def _int8(g, w, gather: bool = False) -> tuple[str, str]:
    """A weight [out, in] as MatMulNBits' uint8 blocks [out, blocks, INT8_BLOCK] and scales [out, blocks] (+ [1] for
    GatherBlockQuantized), made at load as ORT's symmetric quantizer does: zero-padded, extreme -128, stored + 128."""
    (n, k), pad = g.program.buffers[w].shape, -g.program.buffers[w].shape[1] % INT8_BLOCK
    scale_shape = (n, (k + pad) // INT8_BLOCK, 1)[:2 + gather]

    def quantize(weights, scale_only=False):
        blocks = np.pad(weights[w], ((0, 0), (0, pad))).reshape(n, -1, INT8_BLOCK)
        scale = np.take_along_axis(blocks, np.abs(blocks).argmax(-1)[..., None], -1) / np.float32(-128)
        return scale.reshape(scale_shape) if scale_only else np.clip(
            np.rint(blocks / np.where(scale == 0, np.float32(1), scale)) + 128, 0, 255).astype(np.uint8)
    return (g.derived(w, ".q8", quantize, "uint8", (*scale_shape[:2], INT8_BLOCK)),
            g.derived(w, f".q8scale{2 + gather}", lambda weights: quantize(weights, True), "float32", scale_shape))


def _linear(g, out, x, w, b=None, *, shapes):
    shape, weight = g.program.buffers[w].shape, g.program.buffers[w].usage is Usage.WEIGHTS
    if weight and g.int8:  # MatMulNBits: int8 weight blocks, and (accuracy level 4) activations in int8 blocks too
        return g.node("MatMulNBits", [g.value(x), *_int8(g, w), "", "", g.value(b) if b else ""], out,
                      domain="com.microsoft", K=shape[1], N=shape[0], bits=8, block_size=INT8_BLOCK, accuracy_level=4)
    wt = _transposed(g, w) if weight else g.node("Transpose", [g.value(w)], perm=[1, 0])
    g.rows[wt] = max(g.rows.get(wt, 0), math.prod(shapes[0][:-1]))
    y = g.node("MatMul", [g.value(x), wt], None if b else out)
    return g.node("Add", [y, g.value(b)], out) if b else y


def _swap_last(g, x, rank) -> str:
    return g.node("Transpose", [g.value(x)], perm=[*range(rank - 2), rank - 1, rank - 2])


def _attention(g, out, q, k, v, mask=None, *, scale, shapes):
    k_t = _swap_last(g, k, len(shapes[1]))
    scores = g.node("MatMul", [g.node("Mul", [g.value(q), g.f32(scale)]), k_t])
    if mask:
        scores = g.node("Add", [scores, g.value(mask)])
    return g.node("MatMul", [g.node("Softmax", [scores], axis=-1), g.value(v)], out)


def _cache_write(g, out, cache, value, pos, *, axis, shapes):
    """cache[..., pos:pos + n, ...] = value along any `axis` (TensorScatter takes no axis 0) as a ScatterND over the
    leading axes up to `axis`; its output is bound to the cache's memory, which ORT's ScatterND does not copy."""
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in shapes[1][:axis + 1]], indexing="ij"), axis=-1)
    at = g.node("Mul", [g.node("Cast", [g.value(pos)], to=g.tensor.INT64), g.const(np.eye(axis + 1)[axis], np.int64)])
    indices = g.node("Add", [g.const(grid, np.int64), at])
    return g.node("ScatterND", [g.value(cache), indices, g.value(value)], out)


def _embedding(g, out, table, ids, *, shapes):
    if g.int8 and shapes[0][1] % INT8_BLOCK == 0 and any(
            s.op == "linear" and s.inputs[1] == table for e in g.program.entries.values() for s in e.steps):
        # a table tied to a linear, in an int8 entry: rows of the linear's int8 blocks (the float table not kept)
        blocks, scales = _int8(g, table, gather=True)
        rows = g.node("GatherBlockQuantized", [blocks, g.value(ids), scales], domain="com.microsoft", bits=8,
                      block_size=INT8_BLOCK, gather_axis=0, quantize_axis=2)
        return g.node("Reshape", [rows, g.const(shapes[-1], np.int64)], out)
    if table not in g.transposed:
        return g.node("Gather", [g.value(table), g.value(ids)], out)
    # a table tied to a linear is kept as [d, vocab] only: gather its columns, move d last
    columns = g.node("Gather", [_transposed(g, table), g.value(ids)], axis=1)
    return g.node("Transpose", [columns], out, perm=[*range(1, len(shapes[1]) + 1), 0])


def _where_less(g, out, a, b, *, then, otherwise):
    return g.node("Where", [g.node("Less", [a, b]), g.f32(then), g.f32(otherwise)], out)


def _rotary(g, out, x, cos, sin, *, shapes):
    x, n = g.value(x), shapes[0][-1]
    first, second = (_slice(g, None, x, -1, a, b, 1, n) for a, b in ((0, n // 2), (n // 2, n)))
    rotated = g.node("Concat", [g.node("Neg", [second]), first], axis=-1)
    return g.node("Add", [g.node("Mul", [x, g.value(cos)]), g.node("Mul", [rotated, g.value(sin)])], out)


def _glu(g, out, x, *, axis, shapes):
    n = shapes[0][axis]
    a, b = (_slice(g, None, g.value(x), axis, s, e, 1, n) for s, e in ((0, n // 2), (n // 2, n)))
    return g.node("Mul", [a, g.node("Sigmoid", [b])], out)


def _conv(g, out, x, w, b=None, *, stride=1, padding=0, groups=1, dilation=1, shapes):
    each = (lambda v: [int(a) for a in np.broadcast_to(v, len(shapes[1]) - 2)])  # noqa: E731
    return g.node("Conv", [g.value(x), g.value(w)] + ([g.value(b)] if b else []), out, strides=each(stride),
                  pads=each(padding) * 2, group=int(groups), dilations=each(dilation))


def _same(op_type, **fixed):  # the ONNX op of the same meaning, attributes and all (and `fixed` ones of its own)
    return lambda g, out, *xs, shapes, **attrs: g.node(op_type, [g.value(x) for x in xs], out, **attrs, **fixed)


LOWERINGS = {  # op -> lower(graph, out, *input buffers, shapes=[input shapes..., output shape], **attrs)
    **{op: _same(t) for op, t in [("add", "Add"), ("sub", "Sub"), ("mul", "Mul"), ("div", "Div"), ("relu", "Relu"),
                                  ("sigmoid", "Sigmoid"), ("tanh", "Tanh"), ("exp", "Exp"), ("concat", "Concat"),
                                  ("softmax", "Softmax"), ("log_softmax", "LogSoftmax"), ("transpose", "Transpose"),
                                  ("gelu", "Gelu")]},
    "embedding": _embedding, "linear": _linear, "attention": _attention, "cache_write": _cache_write, "glu": _glu,
    "gelu_tanh": _same("Gelu", approximate="tanh"), "rotary": _rotary,
    "conv1d": _conv, "conv2d": _conv,
    "assign": lambda g, out, dst, value, *, shapes: g.node("Identity", [g.value(value)], out),
    "scale": lambda g, out, x, *, factor, shapes: g.node("Mul", [g.value(x), g.f32(factor)], out),
    "silu": lambda g, out, x, *, shapes: g.node("Mul", [g.value(x), g.node("Sigmoid", [g.value(x)])], out),
    "layer_norm": lambda g, out, *xs, eps, shapes: g.node(  # x, w and an optional b
        "LayerNormalization", [g.value(x) for x in xs], out, axis=-1, epsilon=float(eps)),
    "rms_norm": lambda g, out, x, w, *, eps, shapes: g.node(
        "RMSNormalization", [g.value(x), g.value(w)], out, axis=-1, epsilon=float(eps)),
    "mean": lambda g, out, x, *, axis, keepdims=False, shapes: g.node(
        "ReduceMean", [g.value(x), g.const(np.atleast_1d(axis), np.int64)], out, keepdims=int(keepdims)),
    "argmax": lambda g, out, x, *, axis=-1, keepdims=False, shapes: g.node(
        "Cast", [g.node("ArgMax", [g.value(x)], axis=axis, keepdims=int(keepdims))], out, to=g.tensor.INT32),
    "matmul": lambda g, out, a, b, *, transpose_b=False, shapes: g.node(
        "MatMul", [g.value(a), _swap_last(g, b, len(shapes[1])) if transpose_b else g.value(b)], out),
    "reshape": lambda g, out, x, *, shape, shapes: g.node("Reshape", [g.value(x), g.const(shapes[-1], np.int64)], out),
    "slice_axis": lambda g, out, x, *, axis, start, stop, step=1, shapes: _slice(
        g, out, g.value(x), axis, start, stop, step, shapes[0][axis]),
    "pad": lambda g, out, x, *, pads, value=0.0, shapes: g.node(
        "Pad", [g.value(x), g.const([a for a, _ in pads] + [b for _, b in pads], np.int64), g.f32(value)], out),
    "max_pool2d": lambda g, out, x, *, kernel, stride, padding=0, shapes: g.node(
        "MaxPool", [g.value(x)], out, kernel_shape=[kernel] * 2, strides=[stride] * 2, pads=[padding] * 4),
    "positions": lambda g, out, pos, *, n, shapes: g.node(
        "Add", [g.const(np.arange(n, dtype=np.int32)), g.value(pos)], out),
    "causal_cache_mask": lambda g, out, pos, *, n_new, size, shapes: _where_less(  # hidden when pos + i < key j
        g, out, g.node("Add", [g.const(np.arange(n_new, dtype=np.int32)[:, None]), g.value(pos)]),
        g.const(np.arange(size, dtype=np.int32)[None, :]), then=NEG_INF, otherwise=0),
    "length_mask": lambda g, out, length, *, size, shapes: _where_less(
        g, out, g.const(np.arange(size, dtype=np.int32)), g.value(length), then=0, otherwise=NEG_INF),
}
BOUND_READERS = {("MatMul", 1), ("Gather", 0)}
SHARED_READERS = {("MatMulNBits", 1), ("MatMulNBits", 2), ("GatherBlockQuantized", 0), ("GatherBlockQuantized", 2),
                  ("Conv", 1), ("Conv", 2), ("LayerNormalization", 1), ("LayerNormalization", 2)}


class EntryGraph:
    """One entry as an ONNX model (`model()`; `key`: its digest), written by the lowerings with `value`, `node` and
    `const`. Buffers are SSA values: a state buffer a step writes gets a new name, which the readers after it read."""

    def __init__(self, program: Program, entry: Entry, precision: str = "fp32",
                 transposed: frozenset[str] = frozenset()):
        from onnx import TensorProto, helper, numpy_helper
        self.helper, self.tensor, self.numpy_helper = helper, TensorProto, numpy_helper
        self.program, self.name, self.int8, self.transposed = program, entry.name, precision == "int8", transposed
        self.nodes, self.constants = [], []
        self.weights: dict[str, tuple] = {}  # initializer name -> (make(weights) -> its array, dtype, shape)
        self.current: dict[str, str] = {}  # buffer -> the value that holds it now
        self.reads: list[str] = []          # buffers read from the caller (inputs and state), in order
        self.rows: dict[str, int] = {}      # weight -> the most rows a linear reads it with
        buffers = program.buffers
        for step in entry.steps:
            if step.op not in LOWERINGS:
                raise SdkError(f"the cpu backend has no ONNX form for op {step.op}",
                               fix="add a lowering for it in sdk/runtime/cpu.py")
            inputs, out = [b for b in step.inputs if b], step.outputs[0]  # an absent optional input: only the last
            shapes = [buffers[b].shape for b in inputs + [out]]
            value = f"{out}:{len(self.nodes)}" if out in self.current or buffers[out].usage is Usage.STATE else out
            self.current[out] = LOWERINGS[step.op](self, value, *inputs, shapes=shapes, **step.attrs)
        self.writes = [b for b, v in self.current.items() if buffers[b].usage is Usage.STATE and v != b]
        self.returns = [b for b in dict.fromkeys(entry.outputs.values()) if buffers[b].usage is not Usage.STATE]
        readers = {}
        for node in self.nodes:
            for i, name in enumerate(node.input):
                readers.setdefault(name, set()).add((node.op_type, i))
        # How each weight reaches the session: read only by MatMul or Gather (nearly all the bytes), an input bound in
        # place unless the session packs it; read by ops ORT rewrites (Conv to NCHWc, MatMulNBits), an initializer
        # shared with add_initializer; the rest (small) copied per session, as ORT's transpose pass may reshape it.
        kinds = {n: readers.get(n, {None}) for n in self.weights}
        self.bound = [n for n, r in kinds.items() if r <= BOUND_READERS]
        self.shared = [n for n, r in kinds.items() if r <= SHARED_READERS]
        # only linears read it, with rows enough to pay for a packed copy (not a tied, vocabulary-sized table)
        self.packable = [n for n in self.bound if kinds[n] == {("MatMul", 1)} and self.rows.get(n, 0) >= PACK_ROWS]
        self.location = {n: hashlib.sha256(n.encode()).hexdigest()[:24] for n in self.weights}
        self.outputs = {b: self.current[b] for b in self.writes + self.returns}
        for b, v in list(self.outputs.items()):
            if v in self.reads or v in self.weights or list(self.outputs.values()).count(v) > 1:
                self.outputs[b] = self.node("Identity", [v], f"{b}:out")  # an output ORT writes, not one it reads
        self.key = hashlib.sha256(self.model()).hexdigest()

    def model(self, packed: frozenset[str] = frozenset()) -> bytes:
        """The serialised model; the `packed` weights (of `packable`) are constant initializers, not inputs."""
        helper, buffers = self.helper, self.program.buffers
        code = (lambda dtype: helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))  # noqa: E731
        info = (lambda name, dtype, shape: helper.make_tensor_value_info(name, code(dtype), shape))  # noqa: E731
        externals = [self.tensor(name=n, data_type=code(dtype), dims=shape, data_location=self.tensor.EXTERNAL,
                                 external_data=[{"key": "location", "value": self.location[n]}])
                     for n, (_, dtype, shape) in self.weights.items() if n not in self.bound or n in packed]
        inputs = [info(b, buffers[b].dtype, buffers[b].shape) for b in self.reads] + \
            [info(n, *self.weights[n][1:]) for n in self.bound if n not in packed]
        outputs = [info(v, buffers[b].dtype, buffers[b].shape) for b, v in self.outputs.items()]
        graph = helper.make_graph(self.nodes, self.name, inputs, outputs, externals + self.constants)
        opsets = [helper.make_opsetid("", OPSET)] + [helper.make_opsetid("com.microsoft", 1)] * self.int8
        ir = helper.find_min_ir_version_for(opsets[:1])  # OPSET's, not the onnx package's newest: older ORTs refuse it
        return helper.make_model(graph, opset_imports=opsets, ir_version=ir,
                                 producer_name="aie-apps").SerializeToString()

    def value(self, buffer: str) -> str:
        if buffer not in self.current:
            self.current[buffer] = buffer
            buf = self.program.buffers[buffer]
            if buf.usage is Usage.WEIGHTS:  # reshaped: check_weights' ascontiguousarray makes a 0-d constant 1-d
                self.derived(buffer, "", lambda weights: weights[buffer].reshape(buf.shape), buf.dtype, buf.shape)
            else:
                self.reads.append(buffer)
        return self.current[buffer]

    def node(self, op_type: str, inputs, out: str | None = None, **attrs) -> str:
        out = out or f"{op_type}.{len(self.nodes)}"
        self.nodes.append(self.helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def const(self, array, dtype=None) -> str:
        name = f"const.{len(self.constants)}"
        self.constants.append(self.numpy_helper.from_array(np.asarray(array, dtype), name))
        return name

    def f32(self, value) -> str:
        return self.const(np.float32(value))

    def derived(self, buffer: str, suffix: str, make, dtype: str, shape) -> str:
        """An initializer made from a weight once, at load: make(weights) -> array of `dtype` and `shape`."""
        self.weights.setdefault(f"{buffer}{suffix}", (make, dtype, tuple(shape)))
        return f"{buffer}{suffix}"


def transposed_only(program: Program, precision: Mapping[str, str]) -> frozenset[str]:
    """The weights every reader can take as [in, out]: fp32 linears and embedding lookups, at least one linear."""
    weight = (lambda b: b and program.buffers[b].usage is Usage.WEIGHTS)  # noqa: E731
    reads = [(s.op, i, b, precision[e.name]) for e in program.entries.values() for s in e.steps
             for i, b in enumerate(s.inputs) if weight(b)]
    linear = {b for op, i, b, p in reads if (op, i, p) == ("linear", 1, "fp32")}  # int8: its own form
    other = {b for op, i, b, _ in reads if (op, i) not in (("linear", 1), ("embedding", 0))}
    return frozenset(linear - other - {b for e in program.entries.values() for b in e.outputs.values() if weight(b)})


def entry_precisions(program: Program, precision: str | Mapping[str, str]) -> dict[str, str]:
    """Each entry's precision: one for all, or entry name -> precision (entries not named stay fp32)."""
    named = dict.fromkeys(program.entries, precision) if isinstance(precision, str) else dict(precision)
    bad = sorted({str(p) for p in named.values() if p not in PRECISIONS} |
                 {f"entry {n!r}" for n in named if n not in program.entries})
    if bad:
        raise UsageError(f"unknown cpu precision {', '.join(bad)}", fix=f"use one of {', '.join(PRECISIONS)} "
                         f"(per entry: a mapping from this program's entries {sorted(program.entries)})")
    return {name: named.get(name, "fp32") for name in program.entries}


def _watch(stop: Callable[[], bool], run_options, done: threading.Event):
    """Asks `stop` every STOP_POLL_S s until the run is done; once it says True, ORT gives the run up at its next node
    (an encoder's run ends within a node's time, not the whole pass's)."""
    while not run_options.terminate and not done.wait(STOP_POLL_S):
        run_options.terminate = bool(stop())


class CpuExecutable:
    def __init__(self, program: Program, weights: Mapping[str, np.ndarray], threads: int,
                 precision: str | Mapping[str, str] = "fp32"):
        if any(s.kind != "host" for e in program.entries.values() for s in e.steps):
            raise ValueError(f"the cpu backend runs host steps only; this program was compiled for {program.target}")
        import onnxruntime  # here, not at import: commands that run no model never load it
        self.ort, self.program, self.threads = onnxruntime, program, threads
        self.precision = entry_precisions(program, precision)
        weights = check_weights(program, weights)
        transposed = transposed_only(program, self.precision)
        self.graphs = {name: EntryGraph(program, e, self.precision[name], transposed)
                       for name, e in program.entries.items()}
        self.arrays: dict[str, tuple] = {}  # initializer name -> (array, OrtValue over it), made once for all sessions
        for name, make in {n: m for graph in self.graphs.values() for n, (m, _, _) in graph.weights.items()}.items():
            array = make(weights)
            self.arrays[name] = array, onnxruntime.OrtValue.ortvalue_from_numpy(array)
        self.sessions: dict[str, tuple] = {}  # EntryGraph.key -> (session, weights it packed), built at first run
        self.packed: set[str] = set()          # the weights some session holds a packed copy of
        self.lock, self.local, self.counters, self.closed = threading.Lock(), threading.local(), Counters(), False

    def _options(self, pack: bool):
        """What every session is built with (bench/cpu_options.py varies it); `pack`: it packs its constant weights."""
        ort, options = self.ort, self.ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = self.threads, 1
        options.add_session_config_entry("session.intra_op.allow_spinning", SPIN)
        options.log_severity_level = 4  # errors reach the caller as typed errors, not log lines
        # packed weights are a copy per session; int8's MatMulNBits must pack (else it dequantizes at every run)
        options.add_session_config_entry("session.disable_prepacking", "0" if pack else "1")
        options.enable_mem_pattern = False  # it kept a run's activations twice: its own block beside the arena's
        # one CPU arena for the process, grown by what a run asks (ORT's own, one per session, grows by powers of two)
        options.add_session_config_entry("session.use_env_allocators", "1")
        with _arena_lock:
            if not _arena:  # the arena's config: no limit; extend strategy 1, kSameAsRequested
                info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
                ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, 1, -1, -1))
                _arena.append(info)
        return options

    def _binding(self, graph: EntryGraph):
        """This thread's IO binding for the entry, weights bound once; the entry's first run builds the session."""
        bindings = self.local.__dict__.setdefault("bindings", {})
        if graph.key in bindings:
            return bindings[graph.key]
        with self.lock:
            if graph.key not in self.sessions:
                packed = frozenset(n for n in graph.packable if n not in self.packed)
                self.packed |= packed
                options = self._options(pack=bool(packed) or graph.int8)
                files = [n for n in graph.location if n not in graph.bound or n in packed]
                arrays = [self.arrays[n][0] for n in files]  # read in place
                options.add_external_initializers_from_files_in_memory([graph.location[n] for n in files], arrays,
                                                                       [a.nbytes for a in arrays])
                for name in [*graph.shared, *packed]:
                    options.add_initializer(name, self.arrays[name][1])
                self.sessions[graph.key] = self.ort.InferenceSession(graph.model(packed), options,
                                                                     providers=["CPUExecutionProvider"]), packed
        session, packed = self.sessions[graph.key]
        binding = bindings[graph.key] = session.io_binding()
        for name in [n for n in graph.bound if n not in packed]:
            binding.bind_ortvalue_input(name, self.arrays[name][1])  # the OrtValue over our array: no copy
        return binding

    def new_state(self) -> State:
        return State({n: np.zeros(b.shape, b.dtype) for n, b in self.program.buffers_of(Usage.STATE).items()})

    def run(self, entry: str | None, inputs: Mapping[str, np.ndarray], state: State | None = None,
            stop: Callable[[], bool] | None = None) -> dict:
        if self.closed:
            raise UsageError("this cpu session is closed", fix="open a new Session")
        program_entry = self.program.entry(entry)
        graph = self.graphs[program_entry.name]
        env = check_inputs(self.program, entry, inputs) | (state.buffers if state is not None else {})
        if any(b not in env for b in graph.reads + graph.writes):
            raise UsageError(f"entry {program_entry.name!r} reads or writes state", fix="pass state=session.new_state()")
        binding = self._binding(graph)
        for name in graph.reads:
            binding.bind_input(name, "cpu", 0, env[name].dtype, env[name].shape, env[name].ctypes.data)
        results = {b: np.empty(self.program.buffers[b].shape, self.program.buffers[b].dtype) for b in graph.returns}
        for buffer, value in graph.outputs.items():
            array = env[buffer] if buffer in graph.writes else results[buffer]  # state: written where it lives
            binding.bind_output(value, "cpu", 0, array.dtype, array.shape, array.ctypes.data)
        run_options = watcher = None
        if stop is not None:
            run_options, done = self.ort.RunOptions(), threading.Event()
            run_options.terminate = bool(stop())   # already True: ORT ends the run at its first node
            watcher = threading.Thread(target=_watch, args=(stop, run_options, done), name="cpu-run-stop", daemon=True)
            watcher.start()
        try:
            self.sessions[graph.key][0].run_with_iobinding(binding, run_options)
        except RuntimeError as e:  # how run_with_iobinding reports any failed run, a terminated one too
            if run_options is not None and run_options.terminate:
                raise RunStopped(f"entry {program_entry.name} was given up: its caller's stop() said so") from None
            # data its kernels refuse (an index past a table, ...)
            raise InputError(f"entry {program_entry.name} refused its inputs: {str(e).strip().splitlines()[-1]}",
                             fix="check the token ids against the vocabulary and the position against the "
                                 "model's context") from None
        finally:
            if watcher is not None:
                done.set()
                watcher.join()
        self.counters.host_ops += len(program_entry.steps)
        self.counters.runs += 1
        return {name: np.array(env[b]) if b not in results else results[b] for name, b in program_entry.outputs.items()}

    def close(self):
        self.closed, self.sessions, self.arrays, self.packed, self.local = True, {}, {}, set(), threading.local()


class CpuBackend:
    name = target = "cpu"

    def __init__(self, threads: int | None = None, precision: str | Mapping[str, str] = "fp32"):
        """precision: "fp32", or "int8" (int8 weights, ORT's quantized matmuls), for every entry or per entry."""
        self.threads, self.precision = threads or load_settings().threads, precision

    def load(self, program: Program, weights: Mapping[str, np.ndarray]) -> CpuExecutable:
        return CpuExecutable(program, weights, self.threads, self.precision)
