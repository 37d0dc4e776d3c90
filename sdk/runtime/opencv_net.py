"""A cpu entry as one OpenCV dnn network: the entry's steps written as an ONNX model, run by OpenCV's engine.

Why: numpy runs one op at a time, each a pass over memory, and our workers cut every GEMM by rows, so each
core streams every weight. OpenCV's dnn engine (OpenCV is already a runtime dependency) packs the weights
once, splits GEMMs across its threads, and fuses the elementwise ops; on this machine's 2 cores it runs
MiniLM and BERT-base in less time than ONNX Runtime (bench/bert.py). An entry goes this way when every step
has an ONNX form below (see `plan`): masks made from runtime numbers are made on the host first, whole state
buffers it assigns are written after it; steps that write KV caches in place (Whisper's decoder) keep the
entry on numpy. Where OpenCV's own layers lose precision (its Tanh is NaN past |x| = 44, its LogSoftmax is
log(softmax), its LayerNormalization takes E[x^2] - E[x]^2) the forms below avoid them.

The model is written with a few lines of protobuf rather than the `onnx` package, which would add protobuf to
the runtime for a schema this small; tests read what we write back with `onnx` and check it.
"""
from __future__ import annotations

import math
import struct
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Mapping

import cv2
import numpy as np

from ..ops import OPS
from ..program import Entry, Program, Step, Usage

OPSET = 17  # LayerNormalization arrived in 17; OpenCV reads it
_DTYPES = {"float32": 1, "int32": 6, "int64": 7}  # onnx.TensorProto.DataType


# ---- protobuf, the few wire forms ONNX models use ------------------------------------------------

def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int64s are ten bytes of two's complement
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class _Pieces:
    """A serialised message kept as its pieces until the one final join: joining at every level of nesting
    would copy each weight once per level (MiniLM's network took 0.5 s to write that way, 0.05 s this way)."""

    def __init__(self):
        self.parts: list = []
        self.size = 0

    def add(self, piece) -> None:
        self.parts.append(piece)
        self.size += len(piece)


def _message(*fields: tuple[int, object]) -> _Pieces:
    """Fields (number, value): int -> varint, float -> 32-bit, str/bytes/memoryview (and sub-messages) ->
    length-delimited. A repeated field is the same number given again."""
    out = _Pieces()
    for number, value in fields:
        if isinstance(value, int):
            out.add(_varint(number << 3) + _varint(value))
        elif isinstance(value, float):
            out.add(_varint(number << 3 | 5) + struct.pack("<f", value))
        elif isinstance(value, _Pieces):
            out.add(_varint(number << 3 | 2) + _varint(value.size))
            out.parts += value.parts
            out.size += value.size
        else:
            value = value.encode() if isinstance(value, str) else value
            out.add(_varint(number << 3 | 2) + _varint(len(value)))
            out.add(value)
    return out


# ---- ONNX messages (field numbers from onnx.proto) -----------------------------------------------

def _tensor(name: str, array: np.ndarray) -> _Pieces:
    array = np.ascontiguousarray(array)
    return _message(*((1, d) for d in array.shape), (2, _DTYPES[array.dtype.name]), (8, name),
                    (9, memoryview(array).cast("B")))  # a view: the bytes are copied once, by the final join


def _value_info(name: str, shape: tuple[int, ...], dtype: str) -> _Pieces:
    dims = _message(*((1, _message((1, d))) for d in shape))
    return _message((1, name), (2, _message((1, _message((1, _DTYPES[dtype]), (2, dims))))))


def _attribute(name: str, value) -> _Pieces:
    if isinstance(value, float):
        return _message((1, name), (20, 1), (2, value))
    if isinstance(value, int):
        return _message((1, name), (20, 2), (3, value))
    return _message((1, name), (20, 7), *((8, int(v)) for v in value))  # ints


def _node(op_type: str, inputs, outputs, **attrs) -> _Pieces:
    return _message(*((1, i) for i in inputs), *((2, o) for o in outputs), (3, outputs[0]), (4, op_type),
                    *((5, _attribute(k, v)) for k, v in attrs.items()))


# ---- our ops in ONNX -----------------------------------------------------------------------------

class _Writer:
    """Collects the nodes and initializers of one graph; each lowering below appends the nodes of one step."""

    def __init__(self, weights: Mapping[str, np.ndarray]):
        self.weights = weights
        self.nodes: list[_Pieces] = []
        self.initializers: dict[str, _Pieces] = {}

    def weight(self, name: str) -> np.ndarray:
        return self.weights[name]

    def node(self, op_type: str, inputs, out: str | None = None, **attrs) -> str:
        for name in inputs:  # a weight becomes an initializer when a node reads it as it is (see _linear)
            if name in self.weights:
                self.initializer(name, self.weights[name])
        out = out or f"{op_type}.{len(self.nodes)}"
        self.nodes.append(_node(op_type, inputs, [out], **attrs))
        return out

    def const(self, array) -> str:
        name = f"const.{len(self.initializers)}"
        self.initializers[name] = _tensor(name, np.asarray(array))
        return name

    def initializer(self, name: str, array: np.ndarray) -> str:
        if name not in self.initializers:
            self.initializers[name] = _tensor(name, array)
        return name


def _ints(values) -> np.ndarray:
    return np.asarray(values, np.int64).reshape(-1)


def _f32(value: float) -> np.ndarray:
    return np.float32(value)


def _gelu(w, out, x):  # the erf form, as exporters write it (OpenCV fuses it into one GELU layer)
    half = w.node("Mul", [w.node("Add", [w.node("Erf", [w.node("Div", [x, w.const(_f32(math.sqrt(2)))])]),
                                         w.const(_f32(1))]), x])
    return w.node("Mul", [half, w.const(_f32(0.5))], out)


def _tanh(w, out, x):  # OpenCV's Tanh is NaN from |x| = 44.2; in float32 tanh is +-1 from |x| = 9.1 on
    return w.node("Tanh", [w.node("Clip", [x, w.const(_f32(-10)), w.const(_f32(10))])], out)


def _log_softmax(w, out, x, *, axis):  # x - max - log(sum(exp(x - max))), as ops.log_softmax
    # (OpenCV turns the spelled-out Exp, ReduceSum, Log back into its log(softmax) layer)
    shifted = w.node("Sub", [x, w.node("ReduceMax", [x], axes=[axis], keepdims=1)])
    return w.node("Sub", [shifted, w.node("ReduceLogSumExp", [shifted], axes=[axis], keepdims=1)], out)


def _layer_norm(w, out, x, g, b, *, eps):
    # spelled out, two passes: OpenCV's LayerNormalization takes a one-pass variance, which loses the digits of
    # a row whose mean is large against its spread, and even on a centred row is 2-3x less exact than this
    centred = w.node("Sub", [x, w.node("ReduceMean", [x], axes=[-1], keepdims=1)])
    variance = w.node("ReduceMean", [w.node("Mul", [centred, centred])], axes=[-1], keepdims=1)
    std = w.node("Sqrt", [w.node("Add", [variance, w.const(_f32(eps))])])
    scaled = w.node("Mul", [w.node("Div", [centred, std]), g], None if b else out)
    return w.node("Add", [scaled, b], out) if b else scaled


def _gelu_tanh(w, out, x):  # in the order exporters write it: OpenCV 5.0 crashed on a form with x*x*x
    cube = w.node("Pow", [x, w.const(_f32(3))])
    inner = w.node("Add", [x, w.node("Mul", [w.const(_f32(0.044715)), cube])])
    t = _tanh(w, None, w.node("Mul", [w.const(_f32(math.sqrt(2 / math.pi))), inner]))
    return w.node("Mul", [w.node("Mul", [w.const(_f32(0.5)), x]), w.node("Add", [w.const(_f32(1)), t])], out)


def _linear(w, out, x, weight, bias=None):
    # [out, in] -> [in, out] once, when the network is written; MatMul then Add, which OpenCV fuses
    y = w.node("MatMul", [x, w.initializer(weight + ".T", w.weight(weight).T)], None if bias else out)
    return w.node("Add", [y, bias], out) if bias else y


def _swap_last(w, x, rank):
    return w.node("Transpose", [x], perm=list(range(rank - 2)) + [rank - 1, rank - 2])


def _attention(w, out, q, k, v, mask=None, *, scale, rank):
    # q scaled rather than the scores: [T, d] products instead of [T, T] (ESM-2 35M: 2 % of its forward)
    scores = w.node("MatMul", [w.node("Mul", [q, w.const(_f32(scale))]), _swap_last(w, k, rank)])
    if mask:
        scores = w.node("Add", [scores, mask])
    return w.node("MatMul", [w.node("Softmax", [scores], axis=-1), v], out)


def _rotary(w, out, x, cos, sin, *, size):
    # rotate_half(x) = [-x2, x1] as x @ R, R a signed permutation: one exact product per output (the rest are
    # zeros) in one MatMul, where two Slices, a Neg and a Concat took 8 % of ESM-2 35M's forward
    half = size // 2
    turn = np.zeros((size, size), np.float32)
    turn[np.arange(half) + half, np.arange(half)] = -1
    turn[np.arange(half), np.arange(half) + half] = 1
    rotated = w.node("MatMul", [x, w.const(turn)])
    return w.node("Add", [w.node("Mul", [x, cos]), w.node("Mul", [rotated, sin])], out)


def _rms_norm(w, out, x, weight, *, eps):
    mean_square = w.node("ReduceMean", [w.node("Mul", [x, x])], axes=[-1], keepdims=1)
    root = w.node("Sqrt", [w.node("Add", [mean_square, w.const(_f32(eps))])])
    return w.node("Mul", [w.node("Div", [x, root]), weight], out)


def _slice(w, out, x, *, axis, start, stop, step=1):
    return w.node("Slice", [x, w.const(_ints(start)), w.const(_ints(stop)), w.const(_ints(axis)),
                            w.const(_ints(step))], out)


def _bounds(start, stop, step, n) -> dict:
    """Python's slice bounds (None, negative, past the end) as ONNX Slice takes them."""
    start, stop, step = slice(start, stop, step).indices(n)
    if step < 0 and stop < 0:
        stop = -(1 << 63)  # before the first element: ONNX would read -1 as the last one
    return {"start": start, "stop": stop, "step": step}


def _glu(w, out, x, *, axis, size):
    half = size // 2
    a, b = (_slice(w, None, x, axis=axis, start=s, stop=s + half) for s in (0, half))
    return w.node("Mul", [a, w.node("Sigmoid", [b])], out)


def _conv(w, out, x, weight, bias=None, *, stride=1, padding=0, groups=1, dilation=1, dims, shapes):
    def each(v):
        return [int(v)] * dims if np.isscalar(v) else [int(a) for a in v]
    _, c, *kernel = shapes[1]
    patch = kernel[0] if dims == 2 and kernel[0] == kernel[1] and each(stride) == kernel else 1
    if patch > 1 and groups == 1 and each(padding) == [0, 0] and each(dilation) == [1, 1]:
        return _conv_patches(w, out, x, weight, bias, patch, shapes[0][2:], shapes[-1][2:])
    if dims == 2 and groups == 1 and c <= 4 and 1 < math.prod(kernel) <= 49:
        return _conv_columns(w, out, x, weight, bias, each(stride), each(padding), each(dilation), shapes[-1][2:])
    return w.node("Conv", [x, weight] + ([bias] if bias else []), out, strides=each(stride),
                  pads=each(padding) * 2, group=int(groups), dilations=each(dilation))


def _conv_patches(w, out, x, weight, bias, k, image, size):
    """A conv whose stride is its kernel (ViT's patch embedding) as SpaceToDepth and a 1x1 conv: OpenCV's Conv
    ran ViT-B/16's at 17 GMAC/s (7 ms of its forward), a 1x1 conv over 768 channels is a plain GEMM."""
    if [n * k for n in size] != list(image):  # rows and columns past the last whole patch are not read
        x = _slice(w, None, x, axis=[2, 3], start=[0, 0], stop=[size[0] * k, size[1] * k], step=[1, 1])
    return _conv_1x1(w, out, w.node("SpaceToDepth", [x], blocksize=k), weight, bias)


def _conv_columns(w, out, x, weight, bias, stride, padding, dilation, size):
    """A conv over a few channels (an image stem, a spectrogram's first conv) as a 1x1 conv over its kernel's
    shifted, strided views: OpenCV's Conv runs ResNet's 7x7 stem over 3 channels at a quarter of its speed
    on 64 (6.6 ms of ResNet-18's 31)."""
    kh, kw = w.weight(weight).shape[2:]
    padded = w.node("Pad", [x, w.const(_ints([0, 0, *padding, 0, 0, *padding]))])
    starts = [(i * dilation[0], j * dilation[1]) for i in range(kh) for j in range(kw)]
    views = [_slice(w, None, padded, axis=[2, 3], start=start, step=stride,
                    stop=[a + (n - 1) * s + 1 for a, n, s in zip(start, size, stride)]) for start in starts]
    return _conv_1x1(w, out, w.node("Concat", views, axis=1), weight, bias)


def _conv_1x1(w, out, columns, weight, bias):
    """The conv as a 1x1 conv over `columns`, whose channels are the kernel's taps in (i, j, channel) order
    (SpaceToDepth's, and the views' above); its weight is rearranged to match, once, when written."""
    o, c, kh, kw = w.weight(weight).shape
    taps = w.weight(weight).transpose(0, 2, 3, 1).reshape(o, kh * kw * c, 1, 1)
    return w.node("Conv", [columns, w.initializer(weight + ".taps", taps)] + ([bias] if bias else []), out)


def _lowerings() -> dict[str, Callable]:
    """op name -> lower(writer, out, *input names, shapes=..., **attrs); shapes are the step's input shapes
    then its output shape, for the forms that need them."""
    def same(op_type):
        return lambda w, out, *xs, shapes: w.node(op_type, list(xs), out)

    return {
        **{name: same(t) for name, t in [("add", "Add"), ("sub", "Sub"), ("mul", "Mul"), ("div", "Div"),
                                         ("sigmoid", "Sigmoid"), ("relu", "Relu"),
                                         ("exp", "Exp"), ("embedding", "Gather")]},
        "scale": lambda w, out, x, *, factor, shapes: w.node("Mul", [x, w.const(_f32(factor))], out),
        "gelu": lambda w, out, x, *, shapes: _gelu(w, out, x),
        "gelu_tanh": lambda w, out, x, *, shapes: _gelu_tanh(w, out, x),
        "silu": lambda w, out, x, *, shapes: w.node("Mul", [x, w.node("Sigmoid", [x])], out),
        "softmax": lambda w, out, x, *, axis=-1, shapes: w.node("Softmax", [x], out, axis=axis),
        "tanh": lambda w, out, x, *, shapes: _tanh(w, out, x),
        "log_softmax": lambda w, out, x, *, axis=-1, shapes: _log_softmax(w, out, x, axis=axis),
        "layer_norm": lambda w, out, x, g, b=None, *, eps, shapes: _layer_norm(w, out, x, g, b, eps=float(eps)),
        "rms_norm": lambda w, out, x, g, *, eps, shapes: _rms_norm(w, out, x, g, eps=float(eps)),
        "rotary": lambda w, out, x, cos, sin, *, shapes: _rotary(w, out, x, cos, sin, size=shapes[0][-1]),
        "mean": lambda w, out, x, *, axis, keepdims=False, shapes: w.node(
            "ReduceMean", [x], out, axes=list(np.atleast_1d(axis)), keepdims=int(keepdims)),
        "linear": lambda w, out, x, weight, bias=None, *, shapes: _linear(w, out, x, weight, bias),
        "matmul": lambda w, out, a, b, *, transpose_b=False, shapes: w.node(
            "MatMul", [a, _swap_last(w, b, len(shapes[1])) if transpose_b else b], out),
        "attention": lambda w, out, q, k, v, mask=None, *, scale, shapes: _attention(
            w, out, q, k, v, mask, scale=scale, rank=len(shapes[1])),
        "reshape": lambda w, out, x, *, shape, shapes: w.node("Reshape", [x, w.const(_ints(shapes[-1]))], out),
        "transpose": lambda w, out, x, *, perm, shapes: w.node("Transpose", [x], out, perm=list(perm)),
        "slice_axis": lambda w, out, x, *, axis, start, stop, step=1, shapes: _slice(
            w, out, x, axis=axis, **_bounds(start, stop, step, shapes[0][axis])),
        "concat": lambda w, out, *xs, axis, shapes: w.node("Concat", list(xs), out, axis=axis),
        "pad": lambda w, out, x, *, pads, value=0.0, shapes: w.node(
            "Pad", [x, w.const(_ints([a for a, _ in pads] + [b for _, b in pads])), w.const(_f32(value))], out),
        "glu": lambda w, out, x, *, axis, shapes: _glu(w, out, x, axis=axis, size=shapes[0][axis]),
        "conv1d": lambda w, out, *xs, shapes, **at: _conv(w, out, *xs, dims=1, shapes=shapes, **at),
        "conv2d": lambda w, out, *xs, shapes, **at: _conv(w, out, *xs, dims=2, shapes=shapes, **at),
        "max_pool2d": lambda w, out, x, *, kernel, stride, padding=0, shapes: w.node(
            "MaxPool", [x], out, kernel_shape=[kernel] * 2, strides=[stride] * 2, pads=[padding] * 4),
    }


LOWERINGS = _lowerings()


# Steps the network does not run: masks and positions made from runtime parameters (numbers, which a network
# cannot take) are made on the host first and go in as inputs; `assign` writes state the caller keeps, so the
# network outputs the value and the host copies it into the state buffer.
PRELUDE_OPS = ("length_mask", "causal_cache_mask", "positions")
# OpenCV keeps two copies of each weight (the initializer and its packed form) and, while it loads, about
# four more besides the caller's (a BERT-base session peaked at 1.75 GB over its 0.42 GB of weights). Past
# this size numpy runs the entry: ESM-2 650M would peak near 13 GB, 3B near 60 GB.
MAX_WEIGHT_BYTES = 1 << 30
# What the live networks of one session may hold (two copies of the weights each entry reads): a text embedder
# has a dozen length buckets, each its own network with its own copies, and past this the least recently used
# one is dropped (rebuilt on its next run: MiniLM's takes ~0.4 s).
NETWORK_BUDGET = 2 << 30


@dataclass(frozen=True)
class Plan:
    prelude: tuple[Step, ...]        # host steps before the network
    body: tuple[Step, ...]           # the network
    assigns: tuple[tuple[str, str], ...]  # (state buffer, value) copied after it
    inputs: tuple[str, ...]          # buffers the network reads from the host
    outputs: tuple[str, ...]         # buffers it hands back
    weight_bytes: int                # of the weights the network reads


def plan(program: Program, entry: Entry) -> Plan | str:
    """How the entry runs as one network, or why it cannot (a str)."""
    def usage(name):
        return program.buffers[name].usage

    prelude, body, assigns = [], [], []
    for step in entry.steps:
        names = [i for i in step.inputs if i is not None]
        if any(program.buffers[b].nbytes == 0 for b in (*names, *step.outputs)):
            return f"step {step.op} has an empty tensor"  # OpenCV's layers do not take them
        if step.op in PRELUDE_OPS and all(i in entry.inputs.values() for i in names):
            prelude.append(step)
        elif step.op == "assign" and usage(step.inputs[1]) is not Usage.STATE:
            assigns.append((step.inputs[0], step.inputs[1]))
        elif step.op not in LOWERINGS:
            return f"op {step.op} has no ONNX form here"
        elif step.op == "linear" and usage(step.inputs[1]) is not Usage.WEIGHTS:
            return "a linear multiplies with an activation, not a weight"  # _linear transposes it when written
        elif any(usage(i) is Usage.STATE for i in names):
            return f"step {step.op} reads state {next(i for i in names if usage(i) is Usage.STATE)}"
        else:
            body.append(step)
    read = {i for s in body for i in s.inputs if i is not None}
    size = sum(program.buffers[i].nbytes for i in read if usage(i) is Usage.WEIGHTS)
    if size > MAX_WEIGHT_BYTES:
        return f"its weights ({size / 2**30:.1f} GiB) are over the {MAX_WEIGHT_BYTES / 2**30:.0f} GiB " \
               f"OpenCV's copies leave room for"
    made = {o for s in prelude for o in s.outputs}
    inputs = [b for b in entry.inputs.values() if b in read] + [b for b in made if b in read]
    for name in inputs:
        if program.buffers[name].shape == () or program.buffers[name].dtype not in _DTYPES:
            return f"the network would read runtime parameter {name}"
    made_by_body = {o for s in body for o in s.outputs}
    outputs = [b for b in dict.fromkeys(entry.outputs.values()) if usage(b) is not Usage.STATE]
    outputs += [v for _, v in assigns if v not in outputs]
    if any(b not in made_by_body for b in outputs):
        return "an output is not computed by the network"
    return Plan(tuple(prelude), tuple(body), tuple(assigns), tuple(inputs), tuple(outputs), size)


def onnx_model(program: Program, steps, inputs, outputs, weights: Mapping[str, np.ndarray], name: str) -> bytes:
    """Steps as a serialised ONNX ModelProto; weights (and the program's constants) are initializers."""
    w = _Writer({b: weights[b] for s in steps for b in s.inputs if b and program.buffers[b].usage is Usage.WEIGHTS})
    for step in steps:
        args = [i or "" for i in step.inputs]
        shapes = [program.buffers[i].shape if i else None for i in step.inputs] + \
                 [program.buffers[step.outputs[0]].shape]
        while args and not args[-1]:
            args.pop()  # absent optional inputs at the end
        LOWERINGS[step.op](w, step.outputs[0], *(a or None for a in args), shapes=shapes, **step.attrs)

    def info(b):
        return _value_info(b, program.buffers[b].shape, program.buffers[b].dtype)
    graph = _message(*((1, n) for n in w.nodes), (2, name), *((5, t) for t in w.initializers.values()),
                     *((11, info(b)) for b in inputs), *((12, info(b)) for b in outputs))
    return b"".join(_message((1, 8), (2, "aie-apps"), (7, graph), (8, _message((1, ""), (2, OPSET)))).parts)


class OpencvEntry:
    """One entry, loaded as an OpenCV dnn network around its host prelude and state writes.
    cv2.error when OpenCV cannot read the network (the cpu backend then runs the entry with numpy)."""

    def __init__(self, program: Program, entry: Entry, plan: Plan, weights: Mapping[str, np.ndarray]):
        self.program, self.entry, self.plan = program, entry, plan
        model = onnx_model(program, plan.body, plan.inputs, plan.outputs, weights, entry.name)
        self.net = cv2.dnn.readNetFromONNX(np.frombuffer(model, np.uint8))

    def run(self, env: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """env: the entry's inputs and the state buffers by buffer name; returns the entry's outputs by
        buffer name (arrays of their own) after writing the assigned state."""
        missing = [state for state, _ in self.plan.assigns if state not in env]
        if missing:
            raise ValueError(f"entry {self.entry.name} writes state {missing[0]}: it needs a State "
                             f"(session.new_state())")
        for step in self.plan.prelude:
            env[step.outputs[0]] = OPS[step.op].ref(*(env[i] for i in step.inputs), **step.attrs)
        for name in self.plan.inputs:
            self.net.setInput(env[name], name)
        results = self.net.forward(list(self.plan.outputs))
        for name, r in zip(self.plan.outputs, results):
            buf = self.program.buffers[name]
            if r is None or r.size != math.prod(buf.shape):  # OpenCV fused it into the next layer (x, x + b)
                raise cv2.error(f"OpenCV returned {getattr(r, 'shape', r)} for {name}, which is {buf.shape}")
            env[name] = np.asarray(r, buf.dtype).reshape(buf.shape)
        for state, value in self.plan.assigns:
            env[state][...] = env[value]
        return {b: np.array(env[b]) if self.program.buffers[b].usage is Usage.STATE else env[b]
                for b in self.entry.outputs.values()}


class Networks:
    """The OpenCV networks of one session, each built on its entry's first run (an embedder uses a few of its
    length buckets) and dropped least recently used when they would hold more than NETWORK_BUDGET."""

    def __init__(self, program: Program, plans: dict[str, Plan], weights: Mapping[str, np.ndarray]):
        self.program, self.plans, self.weights = program, plans, weights
        self.live: OrderedDict[str, OpencvEntry] = OrderedDict()

    def get(self, name: str) -> OpencvEntry:
        """cv2.error when OpenCV cannot load the network."""
        net = self.live.pop(name, None) or OpencvEntry(self.program, self.program.entries[name], self.plans[name],
                                                       self.weights)
        self.live[name] = net
        while len(self.live) > 1 and sum(2 * self.plans[n].weight_bytes for n in self.live) > NETWORK_BUDGET:
            self.live.popitem(last=False)
        return net
