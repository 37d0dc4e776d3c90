// conv2d (and non-depthwise conv1d as H = 1) for ResNet and patch embeddings, one output row at a time in
// NCHW order (emu.py _conv -> ops.conv2d is the spec). The design streams the input band x [cin][kh][w]:
// kh consecutive image rows starting at the output row's first row clamped into [0, height - kh], so every
// band is one affine read; rows the output row needs outside the image are zero padding (the kernel knows its
// output row from the counter `oy` in L1 and skips them). The weight
// slice w [cout][cin/groups][kh][kw] (bf16, stored plain in the weights arena) and writes y [cout][wo]:
// y = bias + sum over (ci, kh, kw) w . x, zero padding left and right, fp32 accumulation, then the
// epilogue (its operand rides on the band stream after each band: a residual row [cout][wo]; with bit 1 of
// r_f32 one value per output channel [cout]; with bit 2 one value for the whole output row, a per-row factor)
// and one store. x and y are bf16, or fp32 (the residual stream) when flagged; the
// bias is fp32 (a weight vector). A patch embedding is stride = kernel, pad = 0. The stride is the same along H
// and W; the padding along H is pad_h (0 for a conv1d, whose one row has no padding), along W pad.
// Channel-chunked accumulation: when a band does not fit L1, the design streams it (and the weights) in n_chunks
// chunks of chunk_cin channels, or of chunk_rows of one channel's kh rows; a call per chunk adds into the fp32
// accumulator acc [cout][wo], and the last chunk's call adds the bias, applies the epilogue and stores.
// Width chunks: when even one channel's chunk of a full-width band does not fit (Whisper's first conv1d: 3000 fp32
// frames), the output row goes in wo / chunk_wo windows of chunk_wo columns. The band of a window holds only the
// input columns it reads, its halo included: win = (chunk_wo - 1) * stride + kw columns (bf16: one more, rounded
// to whole words) from the window's first one (bf16: rounded down to an even column) clamped into
// [0, width - win] (like the band rows; columns outside the image are zero padding). Each window
// runs its chunks, and y, acc and a residual row are [cout][chunk_wo]. chunk_wo = wo is the whole row, band
// columns = width.
// Bit 1 of y_f32: y is the block's whole image [cout][ho][wo] (output rows of odd width are not whole words, the
// image is), and each call writes its row oy there.
#include "../include/npu_kernel.h"

// The bias (fp32) arrives first on the weight stream, as whole weight-sized objects: copy `count` floats of
// one object into L1 at `first`.
NPU_KERNEL void conv_bias_load(const bf16 *w_obj, float *bias, int32_t first, int32_t count) {
  memcpy(&bias[first], w_obj, 4 * count);
}

NPU_KERNEL void conv2d_row(const void *x, int32_t x_f32, const bf16 *w, const float *bias, int32_t has_bias,
                           int32_t j0, void *y, int32_t y_f32, int32_t cin, int32_t width, int32_t cout,
                           int32_t groups, int32_t kh, int32_t kw, int32_t stride, int32_t pad, int32_t pad_h,
                           int32_t wo, int32_t height, int32_t ho, int32_t *oy, const int32_t *chain, int32_t n_chain,
                           const float *imm, const void *res, int32_t r_f32, int32_t chunk_cin, int32_t chunk_rows,
                           int32_t n_chunks, int32_t chunk_wo, float *acc) {
  NPU_ROUND_EVEN();
  npu_vec xv = {x, x_f32, 0};
  // the chain's operand: a residual row [cout][chunk_wo], one value per output channel (bit 1 of r_f32), or one
  // value for the row (bit 2)
  const npu_vec operands[2] = {{res, r_f32 & 1, (r_f32 >> 2) & 1}, {res, r_f32 & 1, (r_f32 >> 2) & 1}};
  const int32_t per_channel = (r_f32 >> 1) & 1;
  const int32_t cg = cin / groups, og = cout / groups, top = oy[0] * stride - pad_h;
  // This call's chunk: oy[1] counts the chunks of the row's windows, n_chunks per window of chunk_wo columns
  const int32_t windows = wo / chunk_wo, window = oy[1] / n_chunks, q = oy[1] % n_chunks;
  const int32_t ox0 = window * chunk_wo;  // the window's first output column
  // its band columns: the whole row, or the window's input columns (halo included) from a whole 32-bit word (an
  // even column in bf16, a column one early when the window starts on an odd one), clamped into the image
  const int32_t a = x_f32 ? 1 : 2, left = ox0 * stride - pad, aligned = left - (left % a + a) % a;
  const int32_t win_full = ((chunk_wo - 1) * stride + kw + a - 1) / a * a;
  const int32_t win = windows == 1 || win_full > width ? width : win_full;
  const int32_t x0 = aligned < 0 ? 0 : (aligned + win > width ? width - win : aligned);
  // bit 1 of y_f32: y holds the block's whole image [cout][ho][wo] (rows of odd width are not whole words)
  const int32_t y_ch = (y_f32 >> 1) & 1 ? ho * wo : chunk_wo, y_at = (y_f32 >> 1) & 1 ? oy[0] * wo + ox0 : 0;
  const int32_t bh = kh < height ? kh : height;  // band rows: kh, or the whole image when it is smaller
  const int32_t start = top < 0 ? 0 : (top + bh > height ? height - bh : top);
  const int32_t kh_lo = top < 0 ? -top : 0, kh_hi = top + kh > height ? height - top : kh;
  // The chunk: chunk_cin channels of band rows [r0, r0 + chunk_rows), with the weights of those channels, all kh
  // rows when the chunk holds whole bands, else only the chunk's rows (the design then guarantees start == top,
  // so band row == kernel row)
  const int32_t per_channel_chunks = bh / chunk_rows;
  const int32_t r0 = (q % per_channel_chunks) * chunk_rows;
  const int32_t whole = chunk_rows == bh, w_rows = whole ? kh : chunk_rows;
  const int32_t first = q == 0, last = q + 1 == n_chunks, row_done = last && window + 1 == windows;
  const int32_t chans = n_chunks == 1 ? cg : chunk_cin;  // a single chunk is the whole (grouped) band
  oy[1] = row_done ? 0 : oy[1] + 1;
  if (row_done) oy[0] = oy[0] + 1 == ho ? 0 : oy[0] + 1;
  for (int32_t o = 0; o < cout; ++o) {
    const int32_t g = n_chunks == 1 ? o / og : 0;
    for (int32_t lx = 0; lx < chunk_wo; ++lx) {
      const int32_t ox = ox0 + lx;
      float sum = first ? 0.0f : acc[o * chunk_wo + lx];  // fp32 across chunks
      for (int32_t c = 0; c < chans; ++c)
        for (int32_t t = 0; t < chunk_rows; ++t) {
          const int32_t r = r0 + t + start - top;  // kernel row of band row r0 + t
          if (r < kh_lo || r >= kh_hi) continue;
          const int32_t wr = whole ? r : t;
          for (int32_t s = 0; s < kw; ++s) {
            const int32_t ix = ox * stride + s - pad;
            if (ix < 0 || ix >= width) continue;
            sum += to_f32(w[((o * chans + c) * w_rows + wr) * kw + s]) *
                   npu_mac_operand(xv, ((g * cg + c) * chunk_rows + t) * win + ix - x0);
          }
        }
      if (!last) {
        acc[o * chunk_wo + lx] = sum;
        continue;
      }
      if (has_bias) sum += bias[j0 + o];
      npu_put(y, y_f32 & 1, o * y_ch + y_at + lx,
              npu_epilogue(sum, per_channel ? o : o * chunk_wo + lx, chain, n_chain, imm, operands));
    }
  }
}
