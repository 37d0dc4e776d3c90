// Depthwise conv1d (the conformer convolution module), channel-major [C][L] as the graph stores it:
//   y[c][t] = b[c] + sum_k w[c][k] x[c][t*stride + k - pad]     (emu.py _conv -> ops.conv1d, groups = C)
// The design streams a block of channels with a time window x [cb][win] whose first column is input
// position t0*stride - pad (columns outside [0, length) read as zero via `first` / `length`), writes
// y [cb][to]. fp32 accumulation, fused epilogue, one bf16 store.
#include "../include/npu_kernel.h"

// One definition for both builds: the AIE build compiles this scalar loop too (no vector path yet).
NPU_KERNEL void dwconv1d(const bf16 *x, const bf16 *w, const bf16 *bias, int32_t has_bias, bf16 *y, int32_t cb, int32_t win,
                         int32_t to, int32_t k, int32_t stride, int32_t first, int32_t length, const bf16 *op0,
                         const bf16 *op1, const int32_t *chain, int32_t n_chain, const float *imm) {
  NPU_ROUND_EVEN();
  const bf16 *operands[2] = {op0, op1};
  for (int32_t c = 0; c < cb; ++c)
    for (int32_t t = 0; t < to; ++t) {
      float sum = 0.0f;
      for (int32_t j = 0; j < k; ++j) {
        const int32_t col = t * stride + j, pos = first + col;
        if (pos < 0 || pos >= length || col >= win) continue;
        sum += to_f32(w[c * k + j]) * to_f32(x[c * win + col]);
      }
      if (has_bias) sum += to_f32(bias[c]);
      y[c * to + t] = to_bf16(npu_epilogue(sum, c * to + t, chain, n_chain, imm, operands));
    }
}
