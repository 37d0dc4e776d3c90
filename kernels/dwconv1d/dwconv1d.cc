// Depthwise conv1d (the conformer convolution module), channel-major [C][L] as the graph stores it:
//   y[c][t] = b[c] + sum_k w[c][k] x[c][t*stride + k - pad]     (emu.py _conv -> ops.conv1d, groups = C)
// The design streams a block of channels with their whole time axis, x [cb][length] (bf16, or fp32 when
// x_f32), the weights w [cb][k] (bf16) and the bias [cb] (fp32), and writes y [cb][to]; positions outside
// [0, length) read as zero. fp32 accumulation, operand-free epilogue, one store.
// One definition for both builds: the AIE build compiles this scalar loop too (no vector path yet).
#include "../include/npu_kernel.h"

NPU_KERNEL void dwconv1d(const void *x, int32_t x_f32, const bf16 *w, const float *bias, int32_t has_bias, void *y,
                         int32_t y_f32, int32_t cb, int32_t length, int32_t to, int32_t k, int32_t stride,
                         int32_t pad, const int32_t *chain, int32_t n_chain, const float *imm) {
  NPU_ROUND_EVEN();
  npu_vec xv = {x, x_f32, 0};
  for (int32_t c = 0; c < cb; ++c)
    for (int32_t t = 0; t < to; ++t) {
      float sum = 0.0f;
      for (int32_t j = 0; j < k; ++j) {
        const int32_t pos = t * stride + j - pad;
        if (pos < 0 || pos >= length) continue;
        sum += to_f32(w[c * k + j]) * npu_mac_operand(xv, c * length + pos);
      }
      if (has_bias) sum += bias[c];
      npu_put(y, y_f32, c * to + t, npu_epilogue_unary(sum, chain, n_chain, imm));
    }
}
