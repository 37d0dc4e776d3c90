"""Fuse: graph nodes -> kernels, the units the NPU runs.

Three things happen here, in one walk over the graph in order:
- views (reshape, transpose, slice_axis) produce no kernel: a consumer reads its operand through the view
  chain, which becomes the DMA access pattern of that operand (`Ref.views`);
- each remaining node starts a kernel of the catalog kind for its op, and absorbs the elementwise nodes that
  consume its output alone (bias, activation, residual add, scale) as an epilogue computed on the fp32
  accumulator before the single bf16 store, as long as the kernel's code still fits program memory;
- GEMMs that read the same activation with no epilogue (Q, K and V projections) merge into one GEMM whose
  packed weight is their concatenation;
- a layer/RMS norm read only by one GEMM becomes that GEMM's prologue (pre-LN transformers: the norm before
  Q/K/V and before FC1 costs no kernel of its own);
- a cache_write of a GEMM output that nothing else reads becomes that GEMM's output access pattern: K and V
  land in the cache at the runtime position straight from the projection;
- a gather of one element of a row at that row's argmax (Whisper's greedy log-prob at its token) becomes an
  output of the argmax kernel, which holds the value at its running best index: a DMA cannot take its address
  from a value the same dispatch computes.
In-place state writes (cache_write, assign) alias their output to the state tensor they write.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..graph import Graph, Node, Value
from . import catalog
from .hardware import Target

VIEW_OPS = {"reshape", "transpose", "slice_axis"}
UNARY = {"scale", "gelu", "gelu_tanh", "sigmoid", "silu", "relu", "tanh", "exp"}
BINARY = {"add", "sub", "mul", "div"}
STATE_WRITES = {"cache_write", "assign"}

KIND_OF = {
    **{op: "eltwise" for op in UNARY | BINARY | {"glu"}},
    "attention": "mha", "softmax": "softmax", "log_softmax": "softmax", "layer_norm": "norm", "rms_norm": "norm",
    "mean": "reduce", "argmax": "argmax", "concat": "concat", "pad": "pad", "embedding": "gather",
    "rotary": "rope", "conv1d": "conv", "conv2d": "conv", "max_pool2d": "pool",
    "causal_cache_mask": "maskgen", "length_mask": "maskgen", "positions": "maskgen",
    "cache_write": "state_write", "assign": "state_write",
}
# kinds whose fp32 result can take an elementwise epilogue before the store
EPILOGUE_KINDS = {"gemm", "bmm", "mha", "eltwise", "norm", "conv", "rope", "reduce", "pool", "softmax"}


@dataclass(frozen=True)
class Ref:
    """A kernel operand: a stored value read through a chain of views (its DMA access pattern)."""
    value: str
    views: tuple = ()


@dataclass
class Kernel:
    kind: str                      # catalog kind (gemm, mha, norm, ...) or "host"
    # inputs: the head's operands first (a GEMM: A, B, bias), then extra operands referenced by index from
    # `chain`, attrs["prologue"] and attrs["state_writes"]
    head: Node                     # the node the kernel is built around
    inputs: list                   # Ref or None, head operands first, then epilogue operands
    outputs: list[str]             # values the kernel stores
    position: int                  # index of the last graph node it covers: where it runs
    chain: list[dict] = field(default_factory=list)  # epilogue: {"op", "attrs", "operand", "swap"}
    nodes: list[Node] = field(default_factory=list)  # every graph node folded in (views excluded)
    attrs: dict = field(default_factory=dict)        # kind-specific (gemm: weights, biases, transpose_b)


@dataclass
class Fused:
    """A graph as kernels: what the later passes work on."""
    name: str
    kernels: list[Kernel]
    alias: dict[str, str]        # in-place outputs -> the state value they write
    outputs: dict[str, str]      # output name -> stored value
    values: dict[str, Value]     # the graph's values plus the ones fusion adds (output copies)
    views: dict[str, Ref]        # view values -> how they read their stored base
    positions: dict[str, int]    # node output -> index of the node in the graph
    view_nodes: int              # views folded into access patterns


def fuse(graph: Graph, target: Target) -> Fused:
    """The graph's kernels in run order."""
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(graph.nodes):
        for v in n.inputs:
            if v is not None:
                consumers.setdefault(v, []).append(i)
    outputs = set(graph.outputs.values())
    views: dict[str, Ref] = {}
    alias: dict[str, str] = {}
    inplace_at = [i for i, n in enumerate(graph.nodes) if n.op in STATE_WRITES]

    def ref(value):
        if value is None:
            return None
        value = alias.get(value, value)
        return views.get(value, Ref(value))

    for node in graph.nodes:  # first every view and alias, so that epilogues can read values defined later
        if node.op in VIEW_OPS:
            base = ref(node.inputs[0])
            views[node.output] = Ref(base.value, base.views + (_view(node),))
        elif node.op in STATE_WRITES:
            alias[node.output] = ref(node.inputs[0]).value

    kernels: list[Kernel] = []
    absorbed: set[int] = set()
    for i, node in enumerate(graph.nodes):
        if i in absorbed or node.op in VIEW_OPS:
            continue
        k = _start(graph, node, i, ref)
        if node.op in STATE_WRITES:
            k.outputs = [alias[node.output]]
            k.inputs[0] = Ref(alias[node.output])  # the kernel writes the state buffer itself
        kernels.append(k)
        on_host = catalog.supports(k, lambda r: graph.values[r.value].dtype, lambda r: _shape_after(graph, r)
                                   if not isinstance(r, str) else graph.values[r].shape)
        # absorb the elementwise consumers of the running result into the epilogue (NPU kernels only)
        while k.kind in EPILOGUE_KINDS and len(k.outputs) == 1 and not on_host:
            out = k.outputs[0]
            users = consumers.get(out, [])
            if out in outputs or len(users) != 1 or graph.values[out].dtype != "float32":
                break
            j = users[0]
            if j in absorbed:
                break  # already the epilogue of the kernel that produced its other operand
            c = graph.nodes[j]
            if any(k.position < p < j for p in inplace_at):
                break  # never move a read across a state write
            step = _epilogue(graph, c, out, ref, len(k.inputs))
            if step is None or catalog.program_bytes(k.kind, len(k.chain) + 1) > target.program_bytes:
                break
            operand, entry = step
            if operand is not None and (k.kind == "bmm" or k.kind == "gemm" and
                                        any(e["operand"] is not None for e in k.chain)):
                break  # kernels/gemm streams one epilogue operand tile beside A (none on a bmm): DINOv2's layer
                #        scale takes it, so its residual add runs as an eltwise kernel; CLIP's logit scale too
            extra = sum(1 for e in k.chain if e["operand"] is not None) + (operand is not None)
            head_inputs = sum(1 for r in k.inputs if r is not None) - extra + (operand is not None)
            if catalog.input_streams(k.kind, head_inputs, extra) > 2 * target.core_channels:
                break  # a core has two input channels, each can alternate between two streams
            if operand is not None:
                k.inputs.append(operand)
            k.chain.append(entry)
            k.nodes.append(c)
            k.outputs = [c.output]
            k.position = j
            absorbed.add(j)
    kernels.sort(key=lambda k: k.position)
    values = dict(graph.values)
    out_values = {}
    for name, value in graph.outputs.items():
        resolved = ref(value)
        out_values[name] = resolved.value
        if resolved.views or values[resolved.value].kind in ("input", "param", "weight", "const"):
            # an output that is a view or a graph input/weight: one copy kernel writes it out
            copy = Node("copy", (resolved.value,), {}, f"{value}.out")
            values[copy.output] = Value(copy.output, values[value].shape, values[value].dtype, "node")
            out_values[name] = copy.output
            kernels.append(Kernel("copy", copy, [resolved], [copy.output], len(graph.nodes), nodes=[]))
    positions = {n.output: i for i, n in enumerate(graph.nodes)}
    n_views = sum(1 for n in graph.nodes if n.op in VIEW_OPS)
    kernels = _merge_projections(kernels)
    kernels = _norm_prologues(kernels, set(out_values.values()), target)
    kernels = _fold_cache_writes(kernels, set(out_values.values()))
    kernels = _fold_argmax_picks(kernels, graph)
    return Fused(graph.name, kernels, alias, out_values, values, views, positions, n_views)


def _view(node: Node) -> tuple:
    if node.op == "reshape":
        return ("reshape", tuple(node.attrs["shape"]))
    if node.op == "transpose":
        return ("transpose", tuple(node.attrs["perm"]))
    a = node.attrs
    return ("slice", a["axis"], a["start"], a["stop"], a.get("step", 1))


def _start(graph: Graph, node: Node, i: int, ref) -> Kernel:
    inputs = [ref(v) for v in node.inputs]
    if node.op in ("linear", "matmul"):
        b = inputs[1]
        transpose_b = node.op == "linear" or node.attrs.get("transpose_b", False)
        if graph.values[b.value].kind in ("weight", "const") and len(_shape_after(graph, b)) == 2:
            bias = inputs[2] if node.op == "linear" and len(inputs) > 2 else None
            return Kernel("gemm", node, [inputs[0], b, bias], [node.output], i, nodes=[node],
                          attrs={"weights": [b], "biases": [bias], "transpose_b": transpose_b})
        return Kernel("bmm", node, inputs, [node.output], i, nodes=[node], attrs={"transpose_b": transpose_b})
    return Kernel(KIND_OF.get(node.op, "host"), node, inputs, [node.output], i, nodes=[node])


def _shape_after(graph: Graph, r: Ref) -> tuple:
    from .layout import apply_views_shape
    return apply_views_shape(graph.values[r.value].shape, r.views)


def _epilogue(graph: Graph, c: Node, running: str, ref, n_inputs: int):
    """(new operand or None, chain entry) when node `c` can run on the kernel's fp32 result, else None."""
    if c.op in UNARY:
        return None, {"op": c.op, "attrs": dict(c.attrs), "operand": None, "swap": False}
    if c.op not in BINARY:
        return None
    a, b = c.inputs
    if a == b:
        return None
    other, swap = (b, False) if a == running else (a, True)
    if graph.values[other].dtype != "float32" or graph.values[c.output].shape != graph.values[running].shape:
        return None  # the epilogue may broadcast its operand, never the running result
    return ref(other), {"op": c.op, "attrs": {}, "operand": n_inputs, "swap": swap}


def _merge_projections(kernels: list[Kernel]) -> list[Kernel]:
    """Q, K, V (or any GEMMs) reading the same activation with no epilogue become one GEMM."""
    groups: dict[tuple, list[Kernel]] = {}
    for k in kernels:
        if k.kind == "gemm" and not k.chain:
            groups.setdefault((k.inputs[0], k.attrs["transpose_b"]), []).append(k)
    merged_away = set()
    for group in groups.values():
        if len(group) < 2:
            continue
        first = group[0]
        for other in group[1:]:
            first.attrs["weights"] += other.attrs["weights"]
            first.attrs["biases"] += other.attrs["biases"]
            first.outputs += other.outputs
            first.nodes += other.nodes
            merged_away.add(id(other))
    return [k for k in kernels if id(k) not in merged_away]


def _readers(kernels: list[Kernel]) -> dict[str, list[Kernel]]:
    readers: dict[str, list[Kernel]] = {}
    for k in kernels:
        for r in k.inputs:
            if r is not None and not any(x is k for x in readers.get(r.value, [])):
                readers.setdefault(r.value, []).append(k)
    return readers


def _norm_prologues(kernels: list[Kernel], outputs: set[str], target: Target) -> list[Kernel]:
    """A norm whose only reader is one GEMM (as its A operand, no view) runs inside that GEMM."""
    readers = _readers(kernels)
    producer = {v: k for k in kernels for v in k.outputs}
    gone = set()
    for g in kernels:
        a = g.inputs[0] if g.kind == "gemm" else None
        n = producer.get(a.value) if a is not None and not a.views else None
        if n is None or n.kind != "norm" or n.chain or len(n.outputs) != 1 or a.value in outputs:
            continue
        if [id(k) for k in readers.get(a.value, [])] != [id(g)]:
            continue
        extra = sum(1 for c in g.chain if c["operand"] is not None)
        if catalog.input_streams("gemm", 2, extra + 1) > 2 * target.core_channels or \
                catalog.program_bytes("gemm", len(g.chain)) + catalog.PROLOGUE_BYTES > target.program_bytes:
            continue
        first = len(g.inputs)
        g.inputs += n.inputs[1:]
        g.inputs[0] = n.inputs[0]
        g.attrs["prologue"] = {"op": n.head.op, "attrs": dict(n.head.attrs),
                               "operands": list(range(first, first + len(n.inputs) - 1))}
        g.nodes = n.nodes + g.nodes
        gone.add(id(n))
    return [k for k in kernels if id(k) not in gone]


def _fold_cache_writes(kernels: list[Kernel], outputs: set[str]) -> list[Kernel]:
    """cache_write(cache, gemm output, pos) -> the GEMM stores that output into the cache at pos."""
    readers = _readers(kernels)
    producer = {v: k for k in kernels for v in k.outputs}
    gone = set()
    for s in kernels:
        if s.kind != "state_write" or s.head.op != "cache_write":
            continue
        value, cache = s.inputs[1], s.outputs[0]
        g = producer.get(value.value)
        if g is None or g.kind != "gemm" or g.chain or value.value in outputs \
                or [id(k) for k in readers.get(value.value, [])] != [id(s)]:
            continue
        between = [k for k in kernels if g.position < k.position < s.position]
        if any(r is not None and r.value == cache for k in between for r in k.inputs) or \
                any(cache in k.outputs for k in between):
            continue  # something reads or writes the cache between the projection and the write
        i = g.outputs.index(value.value)
        g.inputs.append(s.inputs[2])
        g.attrs.setdefault("state_writes", []).append({"output": i, "axis": s.head.attrs["axis"],
                                                       "views": list(value.views), "pos": len(g.inputs) - 1})
        g.outputs[i] = cache
        g.nodes += s.nodes
        gone.add(id(s))
    return [k for k in kernels if id(k) not in gone]


def _fold_argmax_picks(kernels: list[Kernel], graph: Graph) -> list[Kernel]:
    """gather(t.reshape(V, 1), argmax(x)) for rows t, x [1, V] -> one more output of the argmax kernel: the value
    of t at the index it picks (attrs picks: for each extra output, the kernel input it reads; 0 is x itself,
    whose value at the index is the running best). t must be computed before the argmax runs."""
    producer = {v: k for k in kernels for v in k.outputs}
    gone = set()
    for g in kernels:
        if g.kind != "gather" or g.inputs[1] is None or g.inputs[1].views:
            continue
        a = producer.get(g.inputs[1].value)
        table = g.inputs[0]
        if a is None or a.kind != "argmax" or a.chain or not table.views or table.views[-1][0] != "reshape":
            continue
        x = a.inputs[0]
        row = _shape_after(graph, x)
        payload = Ref(table.value, table.views[:-1])
        if len(row) != 2 or row[0] != 1 or _shape_after(graph, payload) != row \
                or tuple(table.views[-1][1]) != (row[1], 1) or _shape_after(graph, g.inputs[1]) != (1,):
            continue
        made = producer.get(payload.value)
        if made is not None and made.position > a.position:
            continue
        if payload not in a.inputs:
            a.inputs.append(payload)
        a.attrs.setdefault("picks", []).append(a.inputs.index(payload))
        a.outputs.append(g.outputs[0])
        a.nodes += g.nodes
        gone.add(id(g))
    return [k for k in kernels if id(k) not in gone]
