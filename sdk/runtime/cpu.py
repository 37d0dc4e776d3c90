"""The cpu backend: runs each host step with its numpy reference from ops.py, on all the cores it may use.

Parallelism is ours, not the BLAS library's: during a run BLAS is held to one thread and the big steps
(GEMMs, attention, the multi-pass elementwise ops) are split into one piece per core, each piece the same
numpy reference on a slice. On a 2-core machine that is as fast as BLAS's own threads when the machine is
idle and several times faster when anything else runs: a BLAS thread pool spins at every small GEMM and
collapses when it does not own every core (Whisper's encoder attention: 0.1 s vs 1.5 s per layer under
load). The pieces cut rows or output columns only, so every number is computed as the reference computes it.
Runs of row-local steps (a transformer layer from its O projection to the next Q/K/V) go to the workers as
one chain per block of rows, so a layer costs two hand-offs (chain, attention) rather than one per step.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import queue
import threading
import weakref
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
from threadpoolctl import ThreadpoolController

from ..errors import UsageError
from ..ops import OPS, pair
from ..program import Program, Usage
from ..settings import load as load_settings
from .backend import Counters, State, check_inputs, check_weights


GEMV_ROWS = 8  # a linear over at most this many rows is bound by reading its weight (decoder steps)
# Below these a piece costs more than it saves: handing a piece to a worker costs tens of microseconds, and
# a Whisper decoder step is ~100 small steps (splitting its 384 x 384 GEMVs doubled the step's time).
MIN_PIECE = 1 << 16      # output elements per piece
MIN_GEMM_PIECE = 1 << 20  # multiply-adds per piece of a GEMM (~15 us on one core)
MIN_GEMV_PIECE = 1 << 20  # weight elements per piece of a decoder-step GEMV (the vocabulary projection)


def gemv_layout(program: Program, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Weights that some `linear` step multiplies with at most GEMV_ROWS rows, stored in Fortran order: the
    same [out, in] array for ops.linear, but w.T is [in, out] contiguous, which OpenBLAS's GEMV streams about
    2x faster (Whisper's 51864 x 384 vocab projection: 14 -> 7 ms, 1 thread). Chosen once here, at load."""
    gemv = {s.inputs[1] for e in program.entries.values() for s in e.steps
            if s.op == "linear" and s.inputs[1] in weights
            and int(np.prod(program.buffers[s.inputs[0]].shape[:-1])) <= GEMV_ROWS}
    return {name: np.asfortranarray(w) if name in gemv else w for name, w in weights.items()}


# ---- how a step is cut into pieces ---------------------------------------------------------------
# A splitter gets the step's arguments and the number of workers and returns the output array plus a list
# of thunks, each filling its own part of that array; or None when the step is too small to be worth it.

Pieces = tuple[np.ndarray, list[Callable[[], None]]]


def _bounds(n: int, parts: int) -> list[tuple[int, int]]:
    edges = [i * n // parts for i in range(parts + 1)]
    return [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def _by_rows(op):
    """Ops whose output row i depends on input row i only (elementwise ops, norms, softmax over the last
    axis): cut the rows of the first argument; each piece written straight into its rows where op can."""
    def split(parts, x, *rest, **attrs) -> Pieces | None:
        if x.ndim < 2 or x.dtype != np.float32:
            return None
        rows = x.reshape(-1, x.shape[-1])
        n = rows.shape[0]
        if n < parts or rows.size < 2 * MIN_PIECE:
            return None
        out = np.empty(rows.shape, np.float32)

        def piece(a, b):
            def run():
                _fill(out[a:b], op, rows[a:b], *rest, **attrs)
            return run
        return out.reshape(x.shape), [piece(a, b) for a, b in _bounds(n, parts)]
    return split


def _fill(out, op, *args, **attrs):
    """op's result written into `out`: straight there where op can, else copied from op's own array."""
    if op.fills_out:
        op.ref(*args, **attrs, out=out)
    else:
        out[...] = op.ref(*args, **attrs)


def _linear(parts, x, w, b=None) -> Pieces | None:
    """ops.linear cut into row blocks (or, for a decoder step, the weight's output rows), each block's GEMM
    written straight into its part of the output and its bias added there."""
    rows = int(np.prod(x.shape[:-1]))
    if rows > GEMV_ROWS:
        if rows < parts or rows * w.shape[0] * w.shape[1] < 2 * MIN_GEMM_PIECE:
            return None
        blocks = [(slice(a, c), slice(None)) for a, c in _bounds(rows, parts)]
    else:
        if w.size < 2 * MIN_GEMV_PIECE:
            return None
        blocks = [(slice(None), slice(c0, c1)) for c0, c1 in _bounds(w.shape[0], parts)]
    x2, out = x.reshape(rows, -1), np.empty((rows, w.shape[0]), np.float32)

    def piece(r, c):
        return lambda: _linear_into(out[r, c], x2[r], w[c], None if b is None else b[c])
    return out.reshape(*x.shape[:-1], w.shape[0]), [piece(r, c) for r, c in blocks]


def _linear_into(out, x, w, b=None):
    """ops.linear(x, w, b) for 2-D x, written into `out` (no temporary, no copy)."""
    np.matmul(x, w.T, out=out)
    if b is not None:
        out += b


def _attention(parts, q, k, v, mask=None, *, scale) -> Pieces | None:
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    T, S = q.shape[-2], k.shape[-2]
    out = np.empty(lead + (T, v.shape[-1]), np.float32)
    if out.size < 2 * MIN_PIECE and T * S * int(np.prod(lead)) < 2 * MIN_PIECE:
        return None
    axis = next((i for i, n in enumerate(lead) if n >= parts), None)
    args = [q, k, v] + ([] if mask is None else [mask])
    if axis is not None:  # one slice of heads (or batch) per piece
        n, nd = lead[axis], len(lead) + 2

        def cut(t, a, b):  # t's view of lead[axis] in a..b (a broadcast axis of size 1 stays whole)
            ax = axis - (nd - t.ndim)
            return t if ax < 0 or t.shape[ax] == 1 else t[(slice(None),) * ax + (slice(a, b),)]
        index = lambda a, b: (slice(None),) * axis + (slice(a, b),)  # noqa: E731
    else:  # one head: one block of query rows per piece
        n = T

        def cut(t, a, b):
            return t[..., a:b, :] if t is q or (t is mask and t.shape[-2] > 1) else t
        index = lambda a, b: (Ellipsis, slice(a, b), slice(None))  # noqa: E731
    if n < parts:
        return None

    def piece(a, b):
        def run():
            _fill(out[index(a, b)], OPS["attention"], *[cut(t, a, b) for t in args], scale=scale)
        return run
    return out, [piece(a, b) for a, b in _bounds(n, parts)]


def _conv2d(parts, x, w, b=None, *, stride=1, padding=0, groups=1, dilation=1) -> Pieces | None:
    """Cut the output rows (or, for a single row, as in conv1d, the output columns): each piece convolves
    the window of the zero-padded input its outputs read, with no padding of its own."""
    (sh, sw), (ph, pw), (dh, dw) = pair(stride), pair(padding), pair(dilation)
    B, O, Ho, Wo = OPS["conv2d"].shape(x.shape, w.shape, stride=stride, padding=padding, groups=groups,
                                       dilation=dilation)
    axis, n, s, d, k = (2, Ho, sh, dh, w.shape[2]) if Ho >= parts else (3, Wo, sw, dw, w.shape[3])
    if B * O * Ho * Wo < 2 * MIN_PIECE or n < parts:
        return None
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    out = np.empty((B, O, Ho, Wo), np.float32)

    def piece(a, c):
        def run():
            window = [slice(None)] * 4
            window[axis] = slice(a * s, (c - 1) * s + d * (k - 1) + 1)
            y = OPS["conv2d"].ref(xp[tuple(window)], w, b, stride=stride, padding=0, groups=groups,
                                  dilation=dilation)
            out[(slice(None),) * axis + (slice(a, c),)] = y
        return run
    return out, [piece(a, c) for a, c in _bounds(n, parts)]


def _conv1d(parts, x, w, b=None, *, stride=1, padding=0, groups=1, dilation=1) -> Pieces | None:
    pieces = _conv2d(parts, x[:, :, None, :], w[:, :, None, :], b, stride=(1, stride), padding=(0, padding),
                     groups=groups, dilation=(1, dilation))
    return None if pieces is None else (pieces[0][:, :, 0, :], pieces[1])


def _row_softmax(op):
    rows = _by_rows(op)

    def split(parts, x, *, axis=-1):
        return rows(parts, x, axis=-1) if axis in (-1, x.ndim - 1) else None
    return split


SPLITTERS: dict[str, Callable[..., Pieces | None]] = {
    "linear": _linear,
    "attention": _attention,
    "conv2d": _conv2d,
    "conv1d": _conv1d,
    **{name: _by_rows(OPS[name]) for name in ("gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "exp")},
    **{name: _by_rows(OPS[name]) for name in ("layer_norm", "rms_norm")},
    **{name: _row_softmax(OPS[name]) for name in ("softmax", "log_softmax")},
}


def _weight_streaming(program: Program, entry) -> bool:
    """A decoder step: every GEMM has at most GEMV_ROWS rows, so the entry streams its weights from memory.
    BLAS's own threads share that bandwidth best; handing each 384 x 384 GEMV to a worker costs more than
    the GEMV (Whisper tiny.en's step: 12 ms with BLAS threads, 18-26 ms split). Such entries run as they are."""
    gemms = [s for s in entry.steps if s.op in ("linear", "matmul")]
    return bool(gemms) and all(int(np.prod(program.buffers[s.inputs[0]].shape[:-1])) <= GEMV_ROWS for s in gemms)


# ---- row chains: consecutive row-local steps run per block of rows, one hand-off for the lot ------------
# A transformer layer outside its attention is a run of steps where output row i reads row i of its inputs
# only (the O projection, residual add, norm, FFN, the next Q/K/V). Running such a run as one piece per
# worker costs one hand-off instead of one per step, and each worker's rows stay in its own cache from one
# step to the next (a GELU reads its GEMM's output rows where that GEMM wrote them).

ROW_LOCAL = {"linear", "add", "sub", "mul", "div", "scale", "gelu", "gelu_tanh", "silu", "sigmoid", "relu",
             "tanh", "exp", "layer_norm", "rms_norm"}
VIEWS = {"reshape", "transpose", "slice_axis"}  # no arithmetic: may run after the chain that they sit in


def _rows(shape) -> int:
    return int(np.prod(shape[:-1])) if len(shape) else 1


def _row_role(in_shape, out_shape) -> str | None:
    """'rows' if input row i is output row i (same shape up to leading 1s), 'vector' if every output row reads
    all of it (a vector or scalar), None otherwise. (A linear's weight and bias are 'whole'.)"""
    if _rows(in_shape) == 1:
        return "vector"
    strip = lambda s: tuple(s)[next((i for i, n in enumerate(s) if n != 1), len(s)):]  # noqa: E731
    if strip(in_shape[:-1]) == strip(out_shape[:-1]):
        return "rows"
    return None


@dataclass(frozen=True)
class Chain:
    steps: tuple           # the row-local steps, in program order
    roles: tuple           # per step, per input: "rows" | "vector" | "whole" | None (absent optional input)
    shapes: tuple          # per step, its output's shape
    views: tuple           # view steps met on the way, run after the chain
    rows: int


def plan(program: Program, entry) -> list:
    """The entry's steps, with every run of >= 2 row-local steps over the same rows (big enough to split)
    replaced by a Chain."""
    items, chain, roles, views, met = [], [], [], [], []  # met: the run's steps and views in program order
    buffers = program.buffers

    def close():
        work = sum(_rows(buffers[s.outputs[0]].shape) * buffers[s.outputs[0]].shape[-1]
                   * (buffers[s.inputs[0]].shape[-1] if s.op == "linear" else 1) for s in chain)
        if len(chain) >= 2 and work >= 2 * MIN_GEMM_PIECE:
            items.append(Chain(tuple(chain), tuple(roles), tuple(buffers[s.outputs[0]].shape for s in chain),
                               tuple(views), _rows(buffers[chain[0].outputs[0]].shape)))
        else:
            items.extend(met)
        for pending in (chain, roles, views, met):
            pending.clear()

    made_by_view: set[str] = set()
    for step in entry.steps:
        out_shape = buffers[step.outputs[0]].shape
        step_roles = [None if i is None else "whole" if step.op == "linear" and k > 0
                      else _row_role(buffers[i].shape, out_shape) for k, i in enumerate(step.inputs)]
        joins = (step.op in ROW_LOCAL and len(out_shape) >= 2 and _rows(out_shape) > GEMV_ROWS
                 and buffers[step.outputs[0]].dtype == "float32"
                 and all(r is not None for r, i in zip(step_roles, step.inputs) if i is not None)
                 and not made_by_view & set(step.inputs)
                 and (not chain or _rows(out_shape) == _rows(buffers[chain[0].outputs[0]].shape)))
        if joins:
            chain.append(step), roles.append(tuple(step_roles)), met.append(step)
        elif chain and step.op in VIEWS:
            views.append(step), made_by_view.add(step.outputs[0]), met.append(step)
        else:
            if chain:
                close()
            made_by_view.clear()
            items.append(step)
    if chain:
        close()
    return items


class _Helper:
    """A worker thread fed through C-level queues. A MiniLM forward pass hands work over 13 times, and each
    hand-off is Python code that runs while the other worker waits for the GIL: ~40 us a round trip this
    way against ~95 us through ThreadPoolExecutor's Future and Condition objects. Pieces are numbered and
    the helper records the number of the last one it finished, so a Ctrl-C that lands anywhere in the
    hand-off cannot leave the caller waiting for a wake-up that was already taken."""

    def __init__(self):
        self.todo, self.woken = queue.SimpleQueue(), queue.SimpleQueue()
        self.sent, self.outcome = 0, (0, None)  # outcome: (number of the last piece finished, its error)
        self.thread = threading.Thread(target=_serve, args=(self,), name="aie-cpu", daemon=True)
        self.thread.start()


def _serve(helper: _Helper) -> None:
    while (item := helper.todo.get()) is not None:  # None: stop
        number, piece = item
        try:
            piece()
            error = None
        except BaseException as e:  # handed to the caller, who raises it
            error = e
        helper.outcome = (number, error)
        helper.woken.put(None)


def _stop(helpers: list[_Helper]) -> None:
    for helper in helpers:
        helper.todo.put(None)


def _collect(helpers: list[_Helper]) -> list[BaseException | None]:
    """Wait until each helper has finished the last piece sent to it; Ctrl-C is raised once they have."""
    interrupted = False
    for helper in helpers:
        while helper.outcome[0] != helper.sent:
            try:
                helper.woken.get()
            except KeyboardInterrupt:
                interrupted = True
    if interrupted:
        raise KeyboardInterrupt
    return [helper.outcome[1] for helper in helpers]


class Workers:
    """`n` threads, the caller being one of them; BLAS single-threaded while a program runs."""

    def __init__(self, n: int):
        self.n = max(1, n)
        self.helpers = [_Helper() for _ in range(self.n - 1)]
        self.lock = threading.Lock()  # one hand-off at a time: two threads running one session take turns
        self._stop = weakref.finalize(self, _stop, self.helpers)  # threads end with their Workers
        self.blas = ThreadpoolController()

    def one_blas_thread(self):
        return self.blas.limit(limits=1, user_api="blas")

    def run(self, op: str, args: list, attrs: dict):
        split = SPLITTERS.get(op) if self.helpers else None
        pieces = split(self.n, *args, **attrs) if split is not None else None
        if pieces is None:
            return OPS[op].ref(*args, **attrs)
        out, work = pieces
        self._spread(work)
        return out

    def run_chain(self, chain: Chain, env: dict) -> None:
        """Every step of `chain` over one block of rows per worker; outputs are whole arrays in env."""
        as_rows = lambda x: x.reshape(chain.rows, x.shape[-1])  # noqa: E731  (a copy only for a strided view)
        flat = lambda x: x.reshape(x.shape[-1:])  # noqa: E731  (a vector every row reads)
        shaped = {"rows": as_rows, "vector": flat, "whole": lambda x: x}
        inputs = [[None if role is None else shaped[role](env[name]) if name in env else name
                   for name, role in zip(step.inputs, roles)] for step, roles in zip(chain.steps, chain.roles)]
        outs = {step.outputs[0]: np.empty((chain.rows, shape[-1]), np.float32)
                for step, shape in zip(chain.steps, chain.shapes)}

        def piece(a, b):
            def run():
                for step, args, roles in zip(chain.steps, inputs, chain.roles):
                    args = [outs[x][a:b] if isinstance(x, str) else x[a:b] if role == "rows" else x
                            for x, role in zip(args, roles)]
                    out = outs[step.outputs[0]][a:b]
                    if step.op == "linear":
                        _linear_into(out, *args)
                    else:
                        _fill(out, OPS[step.op], *args, **step.attrs)
            return run
        self._spread([piece(a, b) for a, b in _bounds(chain.rows, self.n)])
        for step, shape in zip(chain.steps, chain.shapes):
            env[step.outputs[0]] = outs[step.outputs[0]].reshape(shape)

    def _spread(self, work: list[Callable[[], None]]) -> None:
        """The first piece here, the others on the helpers (any beyond them here too), back when all are
        done: every piece has finished before this returns or raises, so none still writes into a run's
        arrays."""
        sent: list[_Helper] = []
        with self.lock:
            try:
                for helper, piece in zip(self.helpers, work[1:]):
                    helper.sent += 1
                    helper.todo.put((helper.sent, piece))
                    sent.append(helper)
                for piece in [work[0], *work[len(self.helpers) + 1:]]:
                    piece()
            finally:
                errors = _collect(sent)
        error = next((e for e in errors if e is not None), None)
        if error is not None:
            raise error

    def close(self):
        self._stop()
        for helper in self.helpers:
            helper.thread.join()


class CpuExecutable:
    def __init__(self, program: Program, weights: Mapping[str, np.ndarray], threads: int):
        bad = [s.op for e in program.entries.values() for s in e.steps if s.kind != "host"]
        if bad:
            raise ValueError(f"the cpu backend runs host steps only; this program has {bad[:3]} (target "
                             f"{program.target})")
        self.program = program
        self.weights = gemv_layout(program, check_weights(program, weights))
        self.counters = Counters()
        self.closed = False
        self.workers = Workers(threads)
        self.weight_streaming = {name for name, e in program.entries.items() if _weight_streaming(program, e)}
        self.plans = {name: e.steps if name in self.weight_streaming or not self.workers.helpers
                      else plan(program, e) for name, e in program.entries.items()}

    def new_state(self) -> State:
        return State({n: np.zeros(b.shape, b.dtype) for n, b in self.program.buffers_of(Usage.STATE).items()})

    def run(self, entry: str | None, inputs: Mapping[str, np.ndarray], state: State | None = None) -> dict:
        if self.closed:  # its worker threads are gone: a run would wait for them forever
            raise UsageError("this cpu session is closed", fix="open a new Session")
        program_entry = self.program.entry(entry)
        env: dict[str, np.ndarray] = {**self.weights, **check_inputs(self.program, entry, inputs)}
        if state is not None:
            env.update(state.buffers)
        if program_entry.name in self.weight_streaming:
            self._steps(self.plans[program_entry.name], env, lambda op, args, attrs: OPS[op].ref(*args, **attrs))
        else:
            with self.workers.one_blas_thread():
                self._steps(self.plans[program_entry.name], env, self.workers.run)
        self.counters.runs += 1
        # outputs are the caller's own arrays: never a view of state, weights or another output
        return {name: np.array(env[buf]) if self.program.buffers[buf].usage is Usage.STATE
                or not env[buf].flags.owndata else env[buf] for name, buf in program_entry.outputs.items()}

    def _steps(self, items: list, env: dict, run_step: Callable):
        for step in items:
            try:
                if isinstance(step, Chain):
                    self.workers.run_chain(step, env)
                    self.counters.host_ops += len(step.steps)
                    self._steps(step.views, env, run_step)
                    continue
                args = [env[i] if i is not None else None for i in step.inputs]
                env[step.outputs[0]] = run_step(step.op, [args] if OPS[step.op].variadic else args, step.attrs)
            except KeyError as e:
                raise ValueError(f"step {getattr(step, 'op', 'chain')} reads {e}, which nothing wrote: "
                                 f"a state buffer needs a State (session.new_state())") from None
            self.counters.host_ops += 1

    def close(self):
        self.closed = True
        self.weights = {}
        self.workers.close()


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, <malloc.h>


@functools.cache
def keep_freed_memory() -> None:
    """Have glibc keep freed blocks for the next step instead of handing them back to the kernel.

    Each step returns fresh arrays of 0.1-10 MB; by default glibc maps such blocks anew and unmaps them when
    freed, so every step first takes a page fault per 4 KiB it writes (slow in a VM): MiniLM's forward pass
    spent ~20 % of its time there. Process-wide, so done once per process; without glibc it does nothing."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "mallopt") or not hasattr(libc, "gnu_get_libc_version"):
        return
    libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)   # blocks below 32 MiB come from the heap and are reused
    libc.mallopt(M_TRIM_THRESHOLD, 256 << 20)  # the heap keeps up to 256 MiB of freed memory


class CpuBackend:
    name = "cpu"
    target = "cpu"

    def __init__(self, threads: int | None = None):
        self.threads = threads or load_settings().threads

    def load(self, program: Program, weights: Mapping[str, np.ndarray]) -> CpuExecutable:
        keep_freed_memory()
        return CpuExecutable(program, weights, self.threads)
