"""Symbolic tensors and tracing: a model function, called once on `Tensor`s, becomes a `Graph`.

A Graph is what a model computes at one set of static shapes: named values (inputs, weights, state,
runtime parameters, constants) and an ordered list of nodes, each one op from ops.py. The compiler
turns Graphs into a Program; nothing downstream looks at model code again.

    g = trace(bert.forward, name="forward", weights=shapes, inputs={"ids": ((1, 128), "int32")}, cfg=cfg)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from . import ops

KINDS = ("input", "weight", "state", "param", "const", "node")


@dataclass(frozen=True)
class Value:
    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str  # one of KINDS


@dataclass(frozen=True)
class Node:
    op: str
    inputs: tuple[str | None, ...]  # value names; None for an absent optional tensor
    attrs: dict[str, Any]
    output: str


@dataclass
class Graph:
    name: str
    values: dict[str, Value] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)  # output name -> value name
    constants: dict[str, np.ndarray] = field(default_factory=dict)

    # -- building (used by Tensor and Op) --
    def add_value(self, name: str, shape, dtype: str, kind: str) -> "Tensor":
        if name in self.values:
            raise ValueError(f"graph {self.name}: value {name!r} defined twice")
        self.values[name] = Value(name, tuple(int(d) for d in shape), str(dtype), kind)
        return Tensor(self, name)

    def constant(self, array) -> "Tensor":
        array = np.asarray(array)
        array = array.astype(np.float32) if array.dtype.kind == "f" else array.astype(np.int32)
        name = f"const.{self.name}.{len(self.constants)}"
        self.constants[name] = array
        return self.add_value(name, array.shape, array.dtype.name, "const")

    def lift(self, x) -> "Tensor":
        return x if isinstance(x, Tensor) else self.constant(x)

    def record(self, op: ops.Op, args, attrs) -> "Tensor":
        tensors = list(args[0]) if op.variadic else list(args)
        for t in tensors:
            if t is not None and not isinstance(t, Tensor):
                raise TypeError(f"{op.name}: tensor arguments must be traced tensors, got {type(t).__name__}; "
                                f"wrap constants with graph.constant()")
        shapes = [t.shape if t is not None else None for t in tensors]
        dtypes = [t.dtype if t is not None else None for t in tensors]
        try:
            shape = op.shape(shapes, **attrs) if op.variadic else op.shape(*shapes, **attrs)
            dtype = op.dtype(*dtypes, **attrs)
        except (ValueError, TypeError, IndexError) as e:
            raise ValueError(f"graph {self.name}: {op.name}{tuple(shapes)} {attrs}: {e}") from None
        if op.inplace is not None:  # the output is the state buffer itself, written in place
            target = tensors[op.inplace]
            if self.values[target.name].kind != "state":
                raise ValueError(f"{op.name} writes in place and needs a state tensor, got {target.name!r}")
        out = f"{op.name}.{len(self.nodes)}"
        self.nodes.append(Node(op.name, tuple(t.name if t is not None else None for t in tensors),
                               _plain(attrs), out))
        self.values[out] = Value(out, tuple(int(d) for d in shape), dtype, "node")
        return Tensor(self, out)

    def flops(self) -> int:
        """Multiply-adds x2 of the matmul-like nodes (the bulk of the work), for reports."""
        total = 0
        for n in self.nodes:
            out = self.values[n.output].shape
            if n.op == "linear":
                total += 2 * int(np.prod(out)) * self.values[n.inputs[1]].shape[1]
            elif n.op == "matmul":
                a = self.values[n.inputs[0]].shape
                total += 2 * int(np.prod(out)) * a[-1]
            elif n.op == "attention":
                q, k = self.values[n.inputs[0]].shape, self.values[n.inputs[1]].shape
                total += 4 * int(np.prod(q[:-1])) * k[-2] * q[-1]
            elif n.op in ("conv1d", "conv2d"):
                w = self.values[n.inputs[1]].shape
                total += 2 * int(np.prod(out)) * int(np.prod(w[1:]))
        return total


def _plain(attrs):
    """Attributes as JSON-friendly values (tuples -> lists happen at save time; numpy scalars -> python)."""
    def conv(v):
        if isinstance(v, (list, tuple)):
            return tuple(conv(x) for x in v)
        if isinstance(v, np.generic):
            return v.item()
        return v
    return {k: conv(v) for k, v in attrs.items()}


class Tensor:
    """A symbolic tensor: a name in a Graph. Supports the numpy-style methods models use."""
    symbolic = True
    __slots__ = ("graph", "name")
    __array_priority__ = 1000  # so that numpy scalars on the left defer to our operators

    def __init__(self, graph: Graph, name: str):
        self.graph, self.name = graph, name

    @property
    def shape(self) -> tuple[int, ...]:
        return self.graph.values[self.name].shape

    @property
    def dtype(self) -> str:
        return self.graph.values[self.name].dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self):
        return f"Tensor({self.name}, {self.shape}, {self.dtype})"

    def _binary(self, op, other, swap=False):
        if np.isscalar(other) and op in (ops.mul, ops.div) and not swap:
            return ops.scale(self, factor=float(other) if op is ops.mul else 1.0 / float(other))
        other = self.graph.lift(np.float32(other) if np.isscalar(other) else other)
        return op(other, self) if swap else op(self, other)

    def __add__(self, o): return self._binary(ops.add, o)
    def __radd__(self, o): return self._binary(ops.add, o, swap=True)
    def __sub__(self, o): return self._binary(ops.sub, o)
    def __rsub__(self, o): return self._binary(ops.sub, o, swap=True)
    def __mul__(self, o): return self._binary(ops.mul, o)
    def __rmul__(self, o): return self._binary(ops.mul, o)
    def __truediv__(self, o): return self._binary(ops.div, o)
    def __neg__(self): return ops.scale(self, factor=-1.0)
    def __matmul__(self, o): return ops.matmul(self, o)

    def reshape(self, *shape):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return ops.reshape(self, shape=tuple(shape))

    def transpose(self, *perm):
        perm = perm[0] if len(perm) == 1 and isinstance(perm[0], (tuple, list)) else perm
        return ops.transpose(self, perm=tuple(perm))

    def __getitem__(self, index):
        """Basic slicing only (slices with constant bounds, Ellipsis, integer = slice and squeeze)."""
        index = index if isinstance(index, tuple) else (index,)
        if Ellipsis in index:
            i = index.index(Ellipsis)
            index = index[:i] + (slice(None),) * (self.ndim - len(index) + 1) + index[i + 1:]
        out, squeeze = self, []
        for axis, ix in enumerate(index):
            if isinstance(ix, (int, np.integer)):
                ix = int(ix) % self.shape[axis]
                out = ops.slice_axis(out, axis=axis, start=ix, stop=ix + 1)
                squeeze.append(axis)
            elif isinstance(ix, slice):
                if ix != slice(None):
                    start, stop, step = ix.indices(self.shape[axis])
                    if step < 0 and stop < 0:
                        stop = None  # before the first element, which -1 (indices' answer) would not say
                    out = ops.slice_axis(out, axis=axis, start=start, stop=stop, step=step)
            else:
                raise TypeError(f"unsupported index {ix!r} on a traced tensor")
        if squeeze:
            out = out.reshape(tuple(d for a, d in enumerate(out.shape) if a not in squeeze))
        return out


class WeightRefs(Mapping):
    """The model's parameters as seen while tracing: declared in the graph on first use, so a graph
    lists only the weights it reads."""

    def __init__(self, graph: Graph, shapes: Mapping[str, tuple]):
        self._graph, self._shapes = graph, shapes

    def __getitem__(self, name: str) -> Tensor:
        if name in self._graph.values:
            return Tensor(self._graph, name)
        if name not in self._shapes:
            raise KeyError(f"graph {self._graph.name} reads weight {name!r}, which the model does not declare")
        return self._graph.add_value(name, self._shapes[name], "float32", "weight")

    def __contains__(self, name):
        return name in self._shapes

    def __iter__(self):
        return iter(self._shapes)

    def __len__(self):
        return len(self._shapes)


Spec = tuple  # (shape, dtype)


def trace(fn: Callable, *, name: str, weights: Mapping[str, tuple], inputs: Mapping[str, Spec] = (),
          state: Mapping[str, Spec] = (), params: Mapping[str, Spec] = (), **static) -> Graph:
    """Call fn(w, **inputs, **params, state=..., **static) on symbolic tensors and record a Graph.

    `weights` maps parameter names to shapes (float32). inputs/state/params map names to (shape, dtype).
    The function returns a tensor or a dict of tensors (the outputs); state is written with in-place ops.
    """
    g = Graph(name)
    kwargs: dict[str, Any] = dict(static)
    for kind, specs in (("input", dict(inputs)), ("param", dict(params))):
        for n, (shape, dtype) in specs.items():
            kwargs[n] = g.add_value(n, shape, dtype, kind)
    if state:
        kwargs["state"] = {n: g.add_value(n, shape, dtype, "state") for n, (shape, dtype) in dict(state).items()}
    result = fn(WeightRefs(g, weights), **kwargs)
    outputs = result if isinstance(result, dict) else ({} if result is None else {"output": result})
    for out_name, t in outputs.items():
        if not isinstance(t, Tensor) or t.graph is not g:
            raise TypeError(f"graph {name}: output {out_name!r} is not a traced tensor of this graph")
        g.outputs[out_name] = t.name
    return g
