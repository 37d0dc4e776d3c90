"""The emu backend: a functional emulator of an NPU program, run on the host.

It does what the device does, in the device's terms: four arenas of bytes in host memory (weights uploaded
once at load; scratch and io per executable; state per State object), each kernel step reading its operands out of the
arenas through their access patterns and storing its result back, the packed weight layouts decoded the way
the kernel's DMA reads them, and the NPU's numerics:
- values stored in the dtypes the program gives their buffers: bf16 (round to nearest even) for activations,
  matrices and KV caches; fp32 for the residual stream, weight vectors and io;
- matmul operands enter the MACs as bf16; fp32 accumulation and fp32 epilogues (bias, activation, residual)
  before the one store per kernel;
- GEMMs with split weights (weight_planes = 2, see catalog.py) read hi + lo: two bf16 MAC passes, one fp32
  accumulator;
- GEMMs whose tiling asks for "bfp16" precision (AIE2P only) round both operands to bfp16 (blocks of 8
  sharing an exponent, 8-bit signed mantissas, round to nearest even);
- exp as 2^(x log2 e) with a degree-6 polynomial for the fraction, and GELU / SiLU / sigmoid / tanh /
  softmax built on it: the approximations the kernels in kernels/ implement.
It counts what crosses between host and device per run (dispatches, syncs, bytes each way, weight bytes).
The arenas, views, weight packing and host steps are the runtime's shared arena executable (arena.py), the
same ones the npu backend runs on; the kernels' hardware limits are checked by the compiler.
Everything measured here is emulated, not timed on hardware.
"""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from ..errors import InputError, UsageError
from ..ops import OPS
from ..program import Program, Step, apply_views
from . import packing
from .arena import BF16, NPU_TARGETS, ArenaExecutable, ArenaState
from .backend import State
from .emu_numerics import ERFC_A, ERFC_P

# operands a kernel does not stream through the core: the packed GEMM weight (read tile by tile, decoded
# once below) and the cache a state write lands in
NOT_STREAMED = {("gemm", 1), ("state_write", 0)}


# ---- kernel numerics ---------------------------------------------------------------------------------

LOG2E = np.float32(1.4426950408889634)
# 2^f on [0, 1): Taylor coefficients of e^(f ln 2) to degree 6 (max relative error 1.6e-5, below bf16's 3.9e-3)
EXP2_POLY = np.array([1.0, 0.6931471805599453, 0.2402265069591007, 0.05550410866482158,
                      0.009618129107628477, 0.0013333558146428443, 0.00015403530393381606], np.float32)


def k_exp(x):
    t = np.clip(np.asarray(x, np.float32) * LOG2E, -126.0, 127.0)
    i = np.floor(t)
    f = t - i
    p = np.zeros_like(f)
    for c in EXP2_POLY[::-1]:
        p = p * f + c
    return np.ldexp(p, i.astype(np.int32)).astype(np.float32)


def k_sigmoid(x):
    return (1.0 / (1.0 + k_exp(-np.clip(x, -88.0, 88.0)))).astype(np.float32)


def k_tanh(x):
    return (2.0 * k_sigmoid(2.0 * x) - 1.0).astype(np.float32)


def k_erf(x):
    # Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7), on the kernels' exp
    a = np.abs(x)
    t = 1.0 / (1.0 + ERFC_P * a)
    poly = np.zeros_like(t)
    for c in ERFC_A[::-1]:
        poly = (poly + c) * t
    return (np.sign(x) * (1.0 - poly * k_exp(-a * a))).astype(np.float32)


def k_softmax(x, axis=-1):
    e = k_exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def k_log_softmax(x, axis=-1):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(k_exp(x - m).sum(axis=axis, keepdims=True))


UNARY = {
    "gelu": lambda x: 0.5 * x * (1.0 + k_erf(x * np.float32(0.7071067811865476))),
    "gelu_tanh": lambda x: 0.5 * x * (1.0 + k_tanh(np.float32(0.7978845608028654) * (x + 0.044715 * x * x * x))),
    "sigmoid": k_sigmoid, "silu": lambda x: x * k_sigmoid(x), "tanh": k_tanh, "exp": k_exp,
    "relu": lambda x: np.maximum(x, 0),
    "scale": lambda x, factor: x * np.float32(factor),
}
BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}


def bf16(x):
    """Round to bf16 (nearest even) and back: what storing a value in the device's memory does."""
    return np.asarray(x, np.float32).astype(BF16).astype(np.float32)


def bfp16(x, axis):
    """AIE2P's bfp16: blocks of 8 along `axis` share an exponent; 8-bit signed mantissas, nearest even."""
    x = np.moveaxis(np.asarray(x, np.float32), axis, -1)
    n = x.shape[-1]
    pad = -n % 8
    xb = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)]).reshape(*x.shape[:-1], -1, 8)
    top = np.abs(xb).max(axis=-1, keepdims=True)
    exponent = np.floor(np.log2(np.where(top > 0, top, 1.0)))
    step = np.exp2(exponent - 6).astype(np.float32)
    q = np.clip(np.rint(xb / step), -127, 127) * step
    return np.moveaxis(q.reshape(*x.shape[:-1], -1)[..., :n], -1, axis).astype(np.float32)


# ---- the backend -------------------------------------------------------------------------------------

class EmuState(ArenaState):
    """A stream's state arena, in host memory."""

    def __init__(self, program: Program):
        super().__init__(program, np.zeros(program.meta["arenas"]["state"], np.uint8))


class EmuExecutable(ArenaExecutable):
    state_type = EmuState

    def __init__(self, program: Program, weights: Mapping[str, np.ndarray]):
        super().__init__(program)
        self.arenas = {"weights": packing.weights_image(program, weights),
                       "scratch": np.zeros(program.meta["arenas"]["scratch"], np.uint8),
                       "io": np.zeros(program.meta["arenas"]["io"], np.uint8)}
        # the one upload of the session: weights cross to the device here and never again
        self.counters.weight_bytes_to_device += self.arenas["weights"].nbytes
        self.counters.bytes_to_device += self.arenas["weights"].nbytes
        self.counters.syncs += 1

    # -- protocol --
    def new_state(self) -> EmuState:
        return EmuState(self.program)

    def run(self, entry: str | None, inputs: Mapping[str, np.ndarray], state: State | None = None,
            stop: Callable[[], bool] | None = None) -> dict:
        e, data = self._begin(entry, inputs, state)
        self._state = state
        for name, array in data.items():  # inputs and runtime parameters: one ranged sync of the io arena
            self._store(name, array)
            self.counters.bytes_to_device += array.nbytes
        self.counters.syncs += 1
        for step in e.steps:
            if step.kind == "dispatch":
                self.counters.dispatches += 1
                for k in step.body:
                    self._kernel(k)
            else:
                self._host(step)
        out = {}
        for name, buf in e.outputs.items():
            out[name] = np.array(self._load(buf))
            self.counters.bytes_from_device += self.program.buffers[buf].nbytes
        self.counters.syncs += 1
        self.counters.runs += 1
        self._state = None
        return out

    def close(self):
        self.arenas, self._unpacked = {}, {}

    def _arena(self, arena: str) -> np.ndarray:
        return self.arenas[arena]

    # -- steps --
    def _host(self, step: Step) -> None:
        """A host op between dispatches: its operands come back from the device and its result goes out."""
        args = [self._load(n, v) if n is not None else None for n, v in zip(step.inputs, step.attrs["views"])]
        self.counters.bytes_from_device += sum(a.nbytes for a in args if a is not None)
        self._store(step.outputs[0], self.host_result(step, args))
        self.counters.bytes_to_device += self.program.buffers[step.outputs[0]].nbytes
        self.counters.syncs += 2
        self.counters.host_ops += 1

    def _kernel(self, k: Step) -> None:
        a = k.attrs
        args = [self._load(n, v) if n is not None and (k.op, i) not in NOT_STREAMED else None
                for i, (n, v) in enumerate(zip(k.inputs, a["views"]))]
        head = args[:a["n_head"]]
        if k.op == "state_write":
            return self._state_write(k, head)
        if k.op == "argmax" and "picks" in a:  # the index, then the picked rows' values at it (as stored)
            index = _reference(self, k, head, args)
            self._store(k.outputs[0], index)
            for name, i in zip(k.outputs[1:], a["picks"]):
                self._store(name, np.take_along_axis(args[i], np.reshape(index, (-1, 1)), axis=-1))
            return
        y = KERNELS.get(k.op, _reference)(self, k, head, args)
        if k.op == "gemm" and (len(k.outputs) > 1 or "state_writes" in a):
            # merged projections: one result per output; K/V may go straight into their cache
            parts = np.split(y, np.cumsum(a["n_splits"])[:-1], axis=-1)
            writes = {w["output"]: w for w in a.get("state_writes", ())}
            for i, (name, part) in enumerate(zip(k.outputs, parts)):
                if i in writes:
                    w = writes[i]
                    self._write_cache(name, apply_views(part, w["views"]), int(args[w["pos"]]), w["axis"])
                else:
                    self._store(name, part)
            return
        for c in a["chain"]:
            if c["operand"] is None:
                y = UNARY[c["op"]](y, **c["attrs"])
            else:
                other = args[c["operand"]]
                y = BINARY[c["op"]](other, y) if c["swap"] else BINARY[c["op"]](y, other)
        self._store(k.outputs[0], y)

    def _state_write(self, k: Step, head) -> None:
        if k.attrs["head"]["op"] == "assign":
            target = self._raw(k.outputs[0])
            target[...] = np.broadcast_to(head[1], target.shape).astype(target.dtype)
            return
        self._write_cache(k.outputs[0], head[1], int(head[2]), k.attrs["head"]["attrs"]["axis"])

    def _write_cache(self, name: str, value, pos: int, axis: int) -> None:
        target = self._raw(name)
        n = value.shape[axis]
        if not 0 <= pos <= target.shape[axis] - n:
            raise InputError(f"cache_write at position {pos} of {n} entries does not fit a cache of "
                             f"{target.shape[axis]}", fix="start a new state, or use a longer cache")
        index = [slice(None)] * target.ndim
        index[axis] = slice(pos, pos + n)
        target[tuple(index)] = value.astype(target.dtype)


def _operand(k: Step, x, axis):
    """A matmul operand as the MACs see it: bf16 (an fp32 residual is converted on load), or bfp16."""
    return bfp16(x, axis) if k.attrs["tiling"].get("precision") == "bfp16" else bf16(x)


def _gemm(exe, k, head, args):
    x, _, bias = head
    t = k.attrs["tiling"]
    if "prologue" in k.attrs:  # the norm of the A rows, in fp32, stored to bf16 as the MACs read it
        p = k.attrs["prologue"]
        x = bf16(_normalise(p["op"], p["attrs"]["eps"], x, *[args[i] for i in p["operands"]]))
    b = exe.weight_matrix(k.inputs[1])
    b = bfp16(b, 0) if k.attrs["tiling"].get("precision") == "bfp16" else b  # stored as bf16 already
    xp = np.pad(_operand(k, x, -1), [(0, 0)] * (x.ndim - 1) + [(0, t["Kp"] - t["K"])])
    width = _stored_width(k)
    y = (xp @ b)[..., :width]
    return y + bias[:width] if bias is not None else y


def _stored_width(k) -> int:
    """Columns a GEMM stores: N, or Np when the memory plan padded its output to whole tiles (attrs stored_width;
    the padding holds the epilogue of a zero accumulator, as on the device; readers slice it off)."""
    return k.attrs.get("stored_width", k.attrs["tiling"]["N"])


def _bmm(exe, k, head, args):
    a, b = head
    if k.attrs["head"]["attrs"].get("transpose_b", False) or k.attrs["head"]["op"] == "linear":
        b = np.swapaxes(b, -1, -2)
    y = _operand(k, a, -1) @ _operand(k, b, -2)
    if k.attrs["head"]["op"] == "linear" and len(head) > 2 and head[2] is not None:
        y = y + head[2]
    # padded to whole tiles (memory.pad_to_tiles): the kernel zeroes B past N, so the padding is a zero accumulator
    return np.pad(y, [(0, 0)] * (y.ndim - 1) + [(0, _stored_width(k) - y.shape[-1])])


def _mha(exe, k, head, args):
    q, kk, v = head[:3]
    mask = head[3] if len(head) > 3 else None
    q, kk, v = bf16(q), bf16(kk), bf16(v)
    s = (q @ np.ascontiguousarray(np.swapaxes(kk, -1, -2))) * np.float32(k.attrs["head"]["attrs"]["scale"])
    if mask is not None:
        s = s + mask
    p = bf16(k_softmax(s))  # probabilities go back to bf16 for the second matmul
    y = p @ v
    # stored [B, T, H, D] when its readers merge the heads (memory.interleave_heads), as the kernel drains it
    return np.transpose(y, k.attrs["stored_perm"]) if "stored_perm" in k.attrs else y


def _eltwise(exe, k, head, args):
    op, attrs = k.attrs["head"]["op"], k.attrs["head"]["attrs"]
    if op in UNARY:
        return UNARY[op](head[0], **attrs)
    if op in BINARY:
        return BINARY[op](head[0], head[1])
    a, b = np.split(head[0], 2, axis=attrs["axis"])  # glu
    return a * k_sigmoid(b)


def _softmax(exe, k, head, args):
    fn = k_softmax if k.attrs["head"]["op"] == "softmax" else k_log_softmax
    return fn(head[0], axis=k.attrs["head"]["attrs"].get("axis", -1))


def _norm(exe, k, head, args):
    return _normalise(k.attrs["head"]["op"], k.attrs["head"]["attrs"]["eps"], *head)


def _normalise(op, eps, x, w, b=None):
    eps = np.float32(eps)
    if op == "rms_norm":
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w
    xc = x - x.mean(axis=-1, keepdims=True)
    y = xc / np.sqrt(np.mean(xc * xc, axis=-1, keepdims=True) + eps) * w
    return y + b if b is not None else y


def _conv(exe, k, head, args):
    x, w = bf16(head[0]), head[1]
    b = head[2] if len(head) > 2 else None
    return OPS[k.attrs["head"]["op"]].ref(x, w, b, **k.attrs["head"]["attrs"])


def _gather(exe, k, head, args):
    table, ids = head
    bad = ids[(ids < 0) | (ids >= table.shape[0])]
    if bad.size:
        raise InputError(f"index {int(bad.flat[0])} (a token id or position) is outside a table of "
                         f"{table.shape[0]} rows", fix="check the tokenizer matches the model, and that positions "
                                                      "stay below the model's context")
    return table[ids]


def _reference(exe, k, head, args):
    """Data movement and the ops whose NPU result equals the reference (copy, concat, pad, masks, pooling,
    rotary, mean, argmax): the op's own numpy reference on the bf16 operands."""
    op = k.attrs["head"]["op"]
    if op == "copy":
        return head[0]
    ref = OPS[op]
    return ref.ref(*([head] if ref.variadic else head), **k.attrs["head"]["attrs"])


KERNELS = {"gemm": _gemm, "bmm": _bmm, "mha": _mha, "eltwise": _eltwise, "softmax": _softmax, "norm": _norm,
           "conv": _conv, "gather": _gather}


class EmuBackend:
    name = "emu"

    def __init__(self, target: str = "npu2"):
        if target not in NPU_TARGETS:
            raise UsageError(f"unknown NPU target {target!r}", fix=f"use one of {list(NPU_TARGETS)}")
        self.target = target

    def load(self, program: Program, weights: Mapping[str, np.ndarray]) -> EmuExecutable:
        return EmuExecutable(program, weights)
