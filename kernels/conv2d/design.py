"""conv2d design (catalog kind `conv`: ResNet convolutions, ViT / CLIP patch embeddings, non-depthwise conv1d
as H = 1), one output row per kernel call (kernels/conv2d/conv2d.cc). A core owns a set of output-channel
blocks: it loads its biases once (the first objects of its weight stream), then for each block keeps the
block's weights resident and streams, for every image and output row, the band of input rows that row reads
(rows outside the image clamped to the edge; the kernel skips them). A grouped convolution (the conformer's
depthwise conv2d) takes blocks of whole groups, or part of one group, and a block's band carries only its groups'
input channels. Each core reads two streams straight
from its column's shim (band; weights) and writes its rows back. A band that does not fit L1 streams in chunks of input
channels, or of one channel's kernel rows when no band is clamped at the image's edge (channel-chunked
accumulation): each chunk with its weights, re-streamed per output row, one kernel call per chunk adding into an
fp32 accumulator (the output row itself when it is fp32); the last chunk's call adds the bias, applies the
epilogue and stores. An epilogue operand follows the last chunk. When not even one channel's chunk of a whole row
fits (Whisper's first conv1d: 80 fp32 channels of 3000 frames), the output row goes in windows of columns (width
chunks): each window's band holds only the input columns it reads, its halo included, clamped into the image like
the band rows, and runs its own chunks; its output, accumulator and residual rows are the window's columns."""
from __future__ import annotations

import math

import numpy as np

from kernels import design_cli, epilogue, per_core
from kernels.design_error import DesignError
from kernels.iron_program import iron, tensor
from kernels.step_operands import is_f32, operand
from sdk.compiler import catalog
from sdk.compiler.hardware import TARGETS

KINDS = ("conv",)
W_BYTES = 8 * 1024      # a resident weight block
L1_BUDGET = catalog.CONV_L1  # what bands, weights, output rows, the accumulator and the biases may take


def build(target: str, step, buffers: dict, params: dict):
    hw = TARGETS[target]
    attrs = step.attrs["head"]["attrs"]
    slots = [c["operand"] for c in step.attrs["chain"] if c["operand"] is not None]
    if len(slots) > 1:
        raise DesignError("a convolution epilogue that reads two operands: a core has two input channels")
    x = operand(step.inputs[0], buffers[step.inputs[0]], step.attrs["views"][0])
    w = operand(step.inputs[1], buffers[step.inputs[1]])
    has_bias = len(step.inputs) > 2 and step.inputs[2] is not None
    bias = operand(step.inputs[2], buffers[step.inputs[2]]) if has_bias else None
    out = operand(step.outputs[0], buffers[step.outputs[0]])
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
        raise DesignError("different strides along H and W")
    B, cin, H, W = xi.shape
    cout, cg, kh, kw = wi.shape
    ho, wo = oi.shape[2], oi.shape[3]
    og = cout // groups                                        # output channels per group
    per_out = cg * kh * kw
    # A block of output channels reads the input channels of its groups only: whole groups, or part of one
    block_cin = lambda c: cin if groups == 1 else max(1, c // og) * cg  # noqa: E731
    res = operand(step.inputs[slots[0]], buffers[step.inputs[slots[0]]], step.attrs["views"][slots[0]]) \
        if slots else None
    # blocks of output channels; the plan checks their weights against the block (a chunk's, when chunked)
    fits = [c for c in range(1, cout + 1) if cout % c == 0 and (groups == 1 or c % og == 0 or og % c == 0)]
    # The operand rides as a residual row [cout_b][wo], or as [cout_b] when it has one value per output channel
    # (bit 1 of r_f32), or as [1] when it has one value per output row (a per-row factor; bit 2)
    per_channel = per_row = False
    if res is not None:
        ri = np.broadcast_to(res.index if not one_d else res.index[:, :, None], oi.shape)
        per_row = bool((ri == ri[:, :1, :, :1]).all())
        per_channel = not per_row and bool((ri == ri[:, :, :1, :1]).all())
        r_width = 1 if per_channel or per_row else wo
    # a block whose residual rows (a window's columns of them) pack whole into band (chunk) objects, if there is one
    packs = lambda c, chunk_bytes, wc: (res is None or chunk_bytes % (  # noqa: E731
        (1 if per_row else c) * (r_width if r_width == 1 else wc) * res.dtype.itemsize) == 0) and (
        ho * wo % 2 == 0 or c % 2 == 0 or out.dtype.itemsize == 4)
    # Output rows that are not whole words (CLIP's 7-wide patch grid in bf16) drain as a block's whole image
    # [cout_b][ho][wo], which is whole words when cout_b * ho * wo is even
    y_rows = ho if ho > 1 and wo * out.dtype.itemsize % 4 else 1
    if y_rows > 1 and res is not None:
        raise DesignError(f"output rows of {wo * out.dtype.itemsize} bytes are not whole 32-bit words, with an "
                          "epilogue operand")
    bh = min(kh, H)                                                                       # band rows
    # Windows of output columns (width chunks), when no whole row fits: wc columns dividing the row, whose drains,
    # band columns (at every window's first column) and residual slices are whole 32-bit words
    # (as conv2d.cc computes them: in bf16 from an even column, one more rounded to whole words)
    a = 4 // x.dtype.itemsize                                                             # elements per word
    win_of = lambda wc: W if wc == wo else min(-(-((wc - 1) * sw + kw + a - 1) // a) * a, W)  # noqa: E731
    first_col = lambda wc: np.clip((np.arange(0, wo, wc) * sw - pw) // a * a, 0, W - win_of(wc))  # noqa: E731
    widths = [wc for wc in range(wo - 1, 0, -1) if y_rows == 1 and wo % wc == 0
              and wc * out.dtype.itemsize % 4 == 0 and win_of(wc) * x.dtype.itemsize % 4 == 0
              and (first_col(wc) * x.dtype.itemsize % 4 == 0).all()
              and (res is None or r_width == 1 or wc * res.dtype.itemsize % 4 == 0)]

    def n_cores(c):  # cores for blocks of c output channels: the most that divide the blocks
        most = min(step.attrs["tiling"]["cores"], hw.columns, cout // c)
        return max(d for d in range(1, most + 1) if (cout // c) % d == 0)

    # the core's biases ride ahead of its weights, repeated to whole weight objects: at most 16 of them
    def bias_ok(c, w_elems):
        return not has_bias or math.lcm(cout // n_cores(c), w_elems // 2) // (w_elems // 2) <= 16
    cout_b, chunk_cin, chunk_rows, wc = plan(fits, block_cin, groups, per_out, bh, kh, kw, wo, widths, win_of,
                                             x.dtype.itemsize, out.dtype.itemsize * y_rows, n_cores,
                                             edge_free(ho, sh, ph, kh, H), packs, groups == 1, bias_ok)
    cin_b, groups_b = block_cin(cout_b), max(1, cout_b // og) if groups > 1 else 1
    win, n_win = win_of(wc), wo // wc                        # a window's band columns; windows per output row
    band = cin_b * bh * win
    n_chunks = (cin_b // chunk_cin) * (bh // chunk_rows)
    chunk = chunk_cin * chunk_rows * win                     # band elements of one chunk
    w_rows = kh if chunk_rows == bh else chunk_rows
    w_chunk = (per_out if n_chunks == 1 else chunk_cin * w_rows * kw)  # weights of one output channel per chunk
    if (cout_b * w_chunk) % 2:
        raise DesignError("an odd-sized weight block is not whole 32-bit words")
    blocks = cout // cout_b
    cores = n_cores(cout_b)
    mine = blocks // cores
    in_place = n_chunks > 1 and is_f32(out) and y_rows == 1  # an fp32 output row is its own accumulator
    acc = cout_b * wc if n_chunks > 1 and not in_place else 1
    wobj = cout_b * w_chunk                                  # bf16 elements of one weight object
    floats = wobj // 2
    n_bias = mine * cout_b
    span = math.lcm(n_bias, floats)                          # the core's biases, repeated to whole objects
    bias_objects = span // floats if has_bias else 0
    if bias_objects > 16:
        raise DesignError(f"{bias_objects} objects to carry {n_bias} biases: needs channel-chunked accumulation")

    start = np.clip(np.arange(ho) * sh - ph, 0, H - bh)                                  # each band's first row
    rows = start[:, None] + np.arange(bh)[None]                                           # [ho, bh]
    first_ch = lambda j: 0 if groups == 1 else (j * cout_b // og) * cg                    # block j's first channel  # noqa: E731
    cols = first_col(wc)[:, None] + np.arange(win)[None]                                # [n_win, win]
    band_of = lambda b, j: xi[b][first_ch(j):first_ch(j) + cin_b][:, rows][..., cols].transpose(  # noqa: E731
        1, 3, 0, 2, 4)                                                                    # [ho, n_win, cin_b, bh, win]
    x_core, w_core, y_core = [], [], []
    for c in range(cores):
        blks = list(range(c, blocks, cores))
        bands = np.stack([band_of(b, j) for j in blks for b in range(B)])
        x_core.append(bands.reshape(-1, n_chunks, chunk) if y_rows == 1  # [rows x windows, chunks, chunk]
                      else bands.reshape(-1, ho, n_chunks, chunk))       # [images, rows, chunks, chunk]
        wparts = []
        if has_bias:
            seq = bias.index.reshape(blocks, cout_b)[c::cores]
            wparts.append(np.broadcast_to(seq[None], (span // n_bias,) + seq.shape))
        if n_chunks == 1:  # the block's weights stay resident over its rows
            w_core.append((wparts, np.stack([wi[j * cout_b:(j + 1) * cout_b] for j in blks])))
        else:  # each row streams the block's weights again, chunk by chunk ([chunk][cout_b][w_chunk])
            chunked = [wi[j * cout_b:(j + 1) * cout_b].reshape(cout_b, n_chunks, w_chunk).transpose(1, 0, 2)
                       for j in blks]
            w_core.append((wparts, np.stack([np.broadcast_to(wr[None], (B * ho * n_win,) + wr.shape)
                                             for wr in chunked])))
        y_core.append(np.stack([oi[b, j * cout_b:(j + 1) * cout_b][None] for j in blks for b in range(B)])
                      .reshape(-1, cout_b * ho * wo) if y_rows > 1 else
                      np.stack([oi[b, j * cout_b:(j + 1) * cout_b].reshape(cout_b, ho, n_win, wc).transpose(1, 2, 0, 3)
                                for j in blks for b in range(B)]).reshape(-1, cout_b, wc))

    io = iron()
    i32 = np.int32
    band_bytes = chunk * x.dtype.itemsize
    if res is not None:
        r_width = wc if r_width > 1 else 1  # a residual row holds the window's columns
        res_bytes = (1 if per_row else cout_b) * r_width * res.dtype.itemsize
        if band_bytes % res_bytes:
            raise DesignError(f"a residual row of {res_bytes} bytes does not pack into band objects of "
                              f"{band_bytes}: a convolution epilogue that reads an operand")
        r_repeat = band_bytes // res_bytes
        per_item = 1 if per_row else cout_b     # values of the operand per output row of a block
        if per_channel:
            ri = ri[:, :, :1, :1]
        elif per_row:
            ri = np.broadcast_to(ri[:, :1, :, :1], (B, cout, ho, 1))
        def r_item(b, j):  # [ho, n_win, r_repeat, per_item, r_width]: per row and window, repeated to a band object
            sl = ri[b, j * cout_b:j * cout_b + per_item]                           # [per_item, ho or 1, wo or 1]
            sl = sl.reshape(per_item, sl.shape[1], n_win, wc) if r_width > 1 else sl[:, :, None]
            return np.broadcast_to(sl.transpose(1, 2, 0, 3)[:, :, None], (ho, n_win, r_repeat, per_item, r_width))
        r_core = [np.stack([r_item(b, j) for j in range(c, blocks, cores) for b in range(B)])
                  .reshape(-1, r_repeat, per_item, r_width) for c in range(cores)]
    x_t, w_t = tensor(chunk, x.dtype), tensor(wobj)
    y_t, bias_t = tensor(cout_b * wc * y_rows, out.dtype), tensor(max(n_bias, 1), np.float32)
    vec_i, vec_f = tensor(epilogue.MAX_CHAIN, np.int32), tensor(epilogue.MAX_CHAIN, np.float32)
    oy_t = tensor(2, np.int32)
    acc_t = y_t if in_place else tensor(acc, np.float32)
    kernels = [io.Kernel("conv_bias_load", "conv2d.o", [w_t, bias_t, i32, i32]),
               io.Kernel("conv2d_row", "conv2d.o", [x_t, i32, w_t, bias_t, i32, i32, y_t, i32, i32, i32, i32, i32, i32,
                                                   i32, i32, i32, i32, i32, i32, i32, oy_t, vec_i, i32, vec_f, x_t, i32,
                                                   i32, i32, i32, i32, acc_t])]
    words, imms = epilogue.encode_chain(step.attrs["chain"], 3)
    n_chain, x_f32, y_f32 = len(step.attrs["chain"]), is_f32(x), is_f32(out) | (y_rows > 1) << 1
    r_f32 = (is_f32(res) | per_channel << 1 | per_row << 2) if res is not None else 0
    state = {"bias": (max(n_bias, 1), np.float32, None), "oy": (2, np.int32, np.zeros(2, np.int32)),
             "chain": (epilogue.MAX_CHAIN, np.int32, words), "imm": (epilogue.MAX_CHAIN, np.float32, imms),
             "acc": (acc, np.float32, None)}

    def body(x_in, w_in, y_out, bias_buf, oy, chain, imm, acc_buf, load_bias, conv, n_blocks, n_images):
        for q in range(bias_objects):
            wt = w_in.acquire(1)
            load_bias(wt, bias_buf, q * floats, max(0, min(floats, n_bias - q * floats)))
            w_in.release(1)
        for blk in range(n_blocks):  # unrolled: each block knows where its biases sit
            wt = w_in.acquire(1) if n_chunks == 1 else None
            for _ in io.range_(n_images * ho * n_win // y_rows):  # output rows (windows of them), or images
                yt = y_out.acquire(1)
                def one_row():
                    def row(xt, wk, rt_obj):
                        conv(xt, x_f32, wk, bias_buf, int(has_bias), blk * cout_b, yt, y_f32, cin_b, W, cout_b,
                             groups_b, kh, kw, sw, pw, ph, wo, H, ho, oy, chain, n_chain, imm, rt_obj, r_f32,
                             chunk_cin, chunk_rows, n_chunks, wc, yt if in_place else acc_buf)
                    if n_chunks > 1:
                        for _ in io.range_(n_chunks - 1):  # all but the last chunk: into the fp32 accumulator
                            xt, wk = x_in.acquire(1), w_in.acquire(1)
                            row(xt, wk, xt)
                            x_in.release(1)
                            w_in.release(1)
                    xt = x_in.acquire(1)
                    wk = w_in.acquire(1) if n_chunks > 1 else wt
                    rt_obj = x_in.acquire(1) if res is not None else xt  # the residual row follows the last chunk
                    row(xt, wk, rt_obj)  # the last chunk: bias, epilogue, store
                    x_in.release(2 if res is not None else 1)
                    if n_chunks > 1:
                        w_in.release(1)
                if y_rows > 1:  # rows of one image into one output object
                    for _ in io.range_(y_rows):
                        one_row()
                else:
                    one_row()
                y_out.release(1)
            if n_chunks == 1:
                w_in.release(1)

    lead = (bias, [wp[0] for wp, _ in w_core]) if has_bias else None
    inputs = [per_core.Stream(x, x_t, x_core, follow=(res, r_core) if res is not None else None),
              per_core.Stream(w, w_t, [wb for _, wb in w_core], lead)]
    params.update({"cout_block": cout_b, "blocks_per_core": mine, "band": band, "chunks": n_chunks,
                   "window": wc, "windows": n_win})
    return per_core.per_core_design(target, "conv2d", inputs, per_core.Stream(out, y_t, y_core), kernels, state, body,
                                    [mine, B], params, step)


def edge_free(ho: int, sh: int, ph: int, kh: int, H: int) -> bool:
    """Every output row's kh input rows lie inside the image (no clamped band), so band row = kernel row."""
    return ph == 0 and (ho - 1) * sh + kh <= H


def plan(fits, block_cin, groups, per_out, bh, kh, kw, wo, widths, win_of, xb, ob, n_cores, rows_ok, packs, may_chunk,
         bias_ok):
    """The widest output-channel block, then the largest chunk of its band, whose L1 fits the budget: the band
    whole when it fits, else (ungrouped only) chunks of whole channels, else (when no band is clamped) chunks of
    one channel's rows. Residual rows must pack into the chunk objects when some block lets them (else the
    design refuses the residual). Whole output rows first; only when none of these fits, windows of `widths`
    output columns (widest first), each window's band `win_of(wc)` columns. Returns (cout_b, chunk_cin,
    chunk_rows, wc)."""
    for cols in ([wo], widths):
        for need_pack in (True, False):
            found = _plan(fits, block_cin, groups, per_out, bh, kh, kw, cols, win_of, xb, ob, n_cores, rows_ok,
                          may_chunk, packs if need_pack else lambda c, b, wc: True, bias_ok)
            if found:
                return found
    if not any(c * per_out * 2 <= W_BYTES for c in fits) and not may_chunk:
        raise DesignError(f"one output channel's weights ({per_out * 2} bytes) exceed the {W_BYTES} byte block")
    narrowest = f"windows of {widths[-1]} columns" if widths else "windows (none of whole 32-bit words)"
    raise DesignError(f"no chunk of a band ({bh} rows x {win_of(wo)}) fits L1 next to its output row ({wo} wide), "
                      f"not even in {narrowest}: needs channel-chunked accumulation in smaller pieces")


def _plan(fits, block_cin, groups, per_out, bh, kh, kw, cols, win_of, xb, ob, n_cores, rows_ok, may_chunk, packs,
          bias_ok):
    whole = [(c, block_cin(c), bh) for c in sorted(fits, reverse=True)]  # no chunking, when some block fits
    blocks = sorted(fits, key=lambda c: (n_cores(c), c), reverse=True)     # chunked: as many cores as there are
    chunks = [(c, n, bh) for c in blocks if may_chunk for n in range(block_cin(c) - 1, 0, -1) if block_cin(c) % n == 0]
    if may_chunk and rows_ok and bh == kh:
        chunks += [(c, 1, r) for c in blocks for r in range(bh - 1, 0, -1) if bh % r == 0]
    for cout_b, chunk_cin, chunk_rows in whole + chunks:
        chunked = (chunk_cin, chunk_rows) != (block_cin(cout_b), bh)
        per_chunk = chunk_cin * (kh if chunk_rows == bh else chunk_rows) * kw if chunked else per_out
        w_elems = cout_b * per_chunk  # a channel's chunk of weights must be whole words
        if w_elems * 2 > W_BYTES or w_elems % 2 or chunked and per_chunk % 2 or not bias_ok(cout_b, w_elems):
            continue
        for wc in cols:
            band_bytes = chunk_cin * chunk_rows * win_of(wc) * xb
            if not packs(cout_b, band_bytes, wc):
                continue
            # double-buffered band chunk, weight object and output row (window); the fp32 accumulator (an fp32
            # output row accumulates in place); the core's biases
            l1 = (2 * band_bytes + 2 * w_elems * 2 + 2 * cout_b * wc * ob
                  + (4 * cout_b * wc if chunked and ob != 4 else 0) + 4 * (max(fits) // n_cores(cout_b)))
            if l1 <= L1_BUDGET:
                return cout_b, chunk_cin, chunk_rows, wc
    return None


if __name__ == "__main__":
    design_cli.main(build)
