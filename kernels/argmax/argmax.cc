// On-device argmax over the last axis (greedy decoding picks the next token without sending the logits to
// the host): chunks of the row update a running (best value, index) in L1; the first index wins ties, as in
// ops.argmax. The running state is the best value (fp32) and its index (int32).
#include "../include/npu_kernel.h"

NPU_KERNEL void argmax_begin(float *best, int32_t *index) {
  *best = -3.0e38f;
  *index = 0;
}

// `offset` is the chunk's first column in the row.
NPU_KERNEL void argmax_chunk(const bf16 *x, int32_t n, int32_t offset, float *best, int32_t *index) {
  float b = *best;
  int32_t at = *index;
  for (int32_t i = 0; i < n; ++i) {
    float v = to_f32(x[i]);
    if (v > b) {
      b = v;
      at = offset + i;
    }
  }
  *best = b;
  *index = at;
}

NPU_KERNEL void argmax_store(const int32_t *index, int32_t *y) { *y = *index; }
