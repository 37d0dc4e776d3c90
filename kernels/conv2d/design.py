"""conv2d design (catalog kind `conv`: ResNet convolutions, ViT / CLIP patch embeddings, non-depthwise conv1d
as H = 1), one output row per kernel call (kernels/conv2d/conv2d.cc). A core owns a set of output-channel
blocks: it loads its biases once (the first objects of its weight stream), then for each block keeps the
block's weights resident and streams, for every image and output row, the band of input rows that row reads
(rows outside the image clamped to the edge; the kernel skips them). A grouped convolution (the conformer's
depthwise conv2d) takes blocks of whole groups, or part of one group, and a block's band carries only its groups'
input channels. Each core reads two streams straight
from its column's shim (band; weights) and writes its rows back. Bands whose channels do not fit L1 next to
the weights would need channel-chunked accumulation, which this design does not do (it refuses them)."""
from __future__ import annotations

import math

import numpy as np

from kernels import dataflow as df
from sdk.compiler.hardware import TARGETS

KINDS = ("conv",)
W_BYTES = 8 * 1024      # a resident weight block
L1_BUDGET = 56 * 1024   # what bands, weights, output rows and the bias may take of the 64 KB


def build(target: str, step, buffers: dict, params: dict):
    hw = TARGETS[target]
    attrs = step.attrs["head"]["attrs"]
    slots = [c["operand"] for c in step.attrs["chain"] if c["operand"] is not None]
    if len(slots) > 1:
        raise df.DesignError("a convolution epilogue that reads two operands: a core has two input channels")
    x = df.operand(step.inputs[0], buffers[step.inputs[0]], step.attrs["views"][0])
    w = df.operand(step.inputs[1], buffers[step.inputs[1]])
    has_bias = len(step.inputs) > 2 and step.inputs[2] is not None
    bias = df.operand(step.inputs[2], buffers[step.inputs[2]]) if has_bias else None
    out = df.operand(step.outputs[0], buffers[step.outputs[0]])
    one_d = step.attrs["head"]["op"] == "conv1d"
    xi, wi, oi = x.index, w.index, out.index
    if one_d:  # [B, C, L] as [B, C, 1, L]
        xi, wi, oi = xi[:, :, None], wi[:, :, None], oi[:, :, None]
    groups = attrs.get("groups", 1)
    pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)  # noqa: E731
    (sh, sw), (ph, pw) = pair(attrs.get("stride", 1)), pair(attrs.get("padding", 0))
    if one_d:
        sh, ph = 1, 0
    if sh != sw and not one_d:
        raise df.DesignError("different strides along H and W")
    B, cin, H, W = xi.shape
    cout, cg, kh, kw = wi.shape
    ho, wo = oi.shape[2], oi.shape[3]
    og = cout // groups                                        # output channels per group
    per_out = cg * kh * kw
    # A block of output channels reads the input channels of its groups only: whole groups, or part of one
    block_cin = lambda c: cin if groups == 1 else max(1, c // og) * cg  # noqa: E731
    res = df.operand(step.inputs[slots[0]], buffers[step.inputs[slots[0]]], step.attrs["views"][slots[0]]) \
        if slots else None
    fits = [c for c in range(1, cout + 1) if cout % c == 0 and c * per_out * 2 <= W_BYTES
            and (c * per_out % 2 == 0 or c == cout) and (groups == 1 or c % og == 0 or og % c == 0)]
    # The operand rides as a residual row [cout_b][wo], or as [cout_b] when it has one value per output channel
    # (bit 1 of r_f32), or as [1] when it has one value per output row (a per-row factor; bit 2)
    per_channel = per_row = False
    if res is not None:
        ri = np.broadcast_to(res.index if not one_d else res.index[:, :, None], oi.shape)
        per_row = bool((ri == ri[:, :1, :, :1]).all())
        per_channel = not per_row and bool((ri == ri[:, :, :1, :1]).all())
        r_width = 1 if per_channel or per_row else wo
        # a block whose residual rows pack whole into band objects, if there is one
        fits = [c for c in fits if block_cin(c) * min(kh, H) * W * x.dtype.itemsize
                % ((1 if per_row else c) * r_width * res.dtype.itemsize) == 0] or fits
    cout_b = max(fits) if fits else 0
    if not cout_b:
        raise df.DesignError(f"one output channel's weights ({per_out * 2} bytes) exceed the {W_BYTES} byte block")
    cin_b, groups_b = block_cin(cout_b), max(1, cout_b // og) if groups > 1 else 1
    band = cin_b * min(kh, H) * W
    if (cout_b * per_out) % 2:
        raise df.DesignError("an odd-sized weight block is not whole 32-bit words")
    blocks = cout // cout_b
    cores = max(c for c in range(1, min(step.attrs["tiling"]["cores"], hw.columns, blocks) + 1) if blocks % c == 0)
    mine = blocks // cores
    l1 = 2 * band * x.dtype.itemsize + 2 * cout_b * per_out * 2 + 2 * cout_b * wo * out.dtype.itemsize \
        + 4 * mine * cout_b
    if l1 > L1_BUDGET:
        raise df.DesignError(f"a band of {cin_b} channels x {kh} rows x {W} ({band * x.dtype.itemsize} bytes) with "
                             f"its weights needs {l1} bytes of L1: needs channel-chunked accumulation")
    wobj = cout_b * per_out                                  # bf16 elements of one weight object
    floats = wobj // 2
    n_bias = mine * cout_b
    span = math.lcm(n_bias, floats)                          # the core's biases, repeated to whole objects
    bias_objects = span // floats if has_bias else 0
    if bias_objects > 16:
        raise df.DesignError(f"{bias_objects} objects to carry {n_bias} biases: needs channel-chunked accumulation")

    bh = min(kh, H)                                                                       # band rows
    start = np.clip(np.arange(ho) * sh - ph, 0, H - bh)                                  # each band's first row
    rows = start[:, None] + np.arange(bh)[None]                                           # [ho, bh]
    first_ch = lambda j: 0 if groups == 1 else (j * cout_b // og) * cg                    # block j's first channel  # noqa: E731
    band_of = lambda b, j: xi[b][first_ch(j):first_ch(j) + cin_b][:, rows].transpose(1, 0, 2, 3)  # [ho, cin_b, kh, W]  # noqa: E731
    x_core, w_core, y_core = [], [], []
    for c in range(cores):
        blks = list(range(c, blocks, cores))
        x_core.append(np.stack([band_of(b, j) for j in blks for b in range(B)]).reshape(-1, cin_b, bh, W))  # per row
        wparts = []
        if has_bias:
            seq = bias.index.reshape(blocks, cout_b)[c::cores]
            wparts.append(np.broadcast_to(seq[None], (span // n_bias,) + seq.shape))
        w_core.append((wparts, np.stack([wi[j * cout_b:(j + 1) * cout_b] for j in blks])))
        y_core.append(np.stack([oi[b, j * cout_b:(j + 1) * cout_b].transpose(1, 0, 2) for j in blks
                                for b in range(B)]).reshape(-1, cout_b, wo))

    io = df.iron()
    i32 = np.int32
    band_bytes = band * x.dtype.itemsize
    if res is not None:
        res_bytes = (1 if per_row else cout_b) * r_width * res.dtype.itemsize
        if band_bytes % res_bytes:
            raise df.DesignError(f"a residual row of {res_bytes} bytes does not pack into band objects of "
                                 f"{band_bytes}: a convolution epilogue that reads an operand")
        r_repeat = band_bytes // res_bytes
        per_item = 1 if per_row else cout_b     # values of the operand per output row of a block
        if per_channel:
            ri = ri[:, :, :1, :1]
        elif per_row:
            ri = np.broadcast_to(ri[:, :1, :, :1], (B, cout, ho, 1))
        r_core = [np.stack([np.broadcast_to(ri[b, j * cout_b:j * cout_b + per_item].transpose(1, 0, 2)[:, None],
                                            (ho, r_repeat, per_item, r_width))
                            for j in range(c, blocks, cores) for b in range(B)]).reshape(-1, r_repeat, per_item, r_width)
                  for c in range(cores)]
    x_t, w_t = df.tensor(band, x.dtype), df.tensor(wobj)
    y_t, bias_t = df.tensor(cout_b * wo, out.dtype), df.tensor(max(n_bias, 1), np.float32)
    vec_i, vec_f = df.tensor(df.MAX_CHAIN, np.int32), df.tensor(df.MAX_CHAIN, np.float32)
    oy_t = df.tensor(1, np.int32)
    kernels = [io.Kernel("conv_bias_load", "conv2d.o", [w_t, bias_t, i32, i32]),
               io.Kernel("conv2d_row", "conv2d.o", [x_t, i32, w_t, bias_t, i32, i32, y_t, i32, i32, i32, i32, i32, i32,
                                                   i32, i32, i32, i32, i32, i32, oy_t, vec_i, i32, vec_f, x_t, i32])]
    words, imms = df.encode_chain(step.attrs["chain"], 3)
    n_chain, x_f32, y_f32 = len(step.attrs["chain"]), df.is_f32(x), df.is_f32(out)
    r_f32 = (df.is_f32(res) | per_channel << 1 | per_row << 2) if res is not None else 0
    state = {"bias": (max(n_bias, 1), np.float32, None), "oy": (1, np.int32, np.zeros(1, np.int32)),
             "chain": (df.MAX_CHAIN, np.int32, words), "imm": (df.MAX_CHAIN, np.float32, imms)}

    def body(x_in, w_in, y_out, bias_buf, oy, chain, imm, load_bias, conv, n_blocks, n_images):
        for q in range(bias_objects):
            wt = w_in.acquire(1)
            load_bias(wt, bias_buf, q * floats, max(0, min(floats, n_bias - q * floats)))
            w_in.release(1)
        for blk in range(n_blocks):  # unrolled: each block knows where its biases sit
            wt = w_in.acquire(1)
            for _ in io.range_(n_images * ho):
                xt, yt = x_in.acquire(1), y_out.acquire(1)
                rt_obj = x_in.acquire(1) if res is not None else xt  # the residual row follows the band
                conv(xt, x_f32, wt, bias_buf, int(has_bias), blk * cout_b, yt, y_f32, cin_b, W, cout_b, groups_b, kh, kw, sw,
                     pw, wo, H, ho, oy, chain, n_chain, imm, rt_obj, r_f32)
                x_in.release(2 if res is not None else 1)
                y_out.release(1)
            w_in.release(1)

    lead = (bias, [wp[0] for wp, _ in w_core]) if has_bias else None
    inputs = [df.Stream(x, x_t, x_core, follow=(res, r_core) if res is not None else None),
              df.Stream(w, w_t, [wb for _, wb in w_core], lead)]
    params.update({"cout_block": cout_b, "blocks_per_core": mine, "band": band})
    return df.per_core_design(target, "conv2d", inputs, df.Stream(out, y_t, y_core), kernels, state, body,
                              [mine, B], params, step)


if __name__ == "__main__":
    df.main(build)
