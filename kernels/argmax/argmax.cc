// On-device argmax over the last axis (greedy decoding picks the next token without sending the logits to
// the host): chunks of the row update a running (best value, index) in L1; the first index wins ties, as in
// ops.argmax. x is bf16, or fp32 when x_f32.
#include "../include/npu_kernel.h"

NPU_KERNEL void argmax_begin(float *best, int32_t *index) {
  *best = -3.0e38f;
  *index = 0;
}

// `offset` is the chunk's first column in the row.
NPU_KERNEL void argmax_chunk(const void *x, int32_t x_f32, int32_t n, int32_t offset, float *best, int32_t *index) {
  npu_vec v = {x, x_f32, 0};
  float b = *best;
  int32_t at = *index;
  for (int32_t i = 0; i < n; ++i) {
    float e = npu_get(v, i);
    if (e > b) {
      b = e;
      at = offset + i;
    }
  }
  *best = b;
  *index = at;
}

NPU_KERNEL void argmax_store(const int32_t *index, int32_t *y) { *y = *index; }
