// Masks and positions computed on the device from the runtime parameters (position, valid length), so a
// decoder step or a padded bucket needs no host round trip (ops.causal_cache_mask / length_mask / positions):
//   causal: m[i][j] = 0 when j <= pos + row0 + i, else NEG_INF   (rows of n_new x size)
//   length: m[j]    = 0 when col0 + j < length, else NEG_INF      (one piece of `size` from column col0)
//   positions: p[i] = pos + i (int32)
// NEG_INF is ops.NEG_INF = -2^100: exact in bf16, finite so a fully masked row stays finite. The runtime
// parameter arrives as one int32 from the io arena (the parameter buffer the dispatch reads); masks are
// stored bf16, or fp32 when y_f32.
#include "../include/npu_kernel.h"

static const float MASK_NEG = -0x1p100f;

NPU_KERNEL void mask_causal(const int32_t *pos, void *m, int32_t y_f32, int32_t n_new, int32_t size, int32_t row0) {
  NPU_ROUND_EVEN();
  for (int32_t i = 0; i < n_new; ++i)
    for (int32_t j = 0; j < size; ++j) npu_put(m, y_f32, i * size + j, j <= *pos + row0 + i ? 0.0f : MASK_NEG);
}

NPU_KERNEL void mask_length(const int32_t *length, void *m, int32_t y_f32, int32_t size, int32_t col0) {
  NPU_ROUND_EVEN();
  for (int32_t j = 0; j < size; ++j) npu_put(m, y_f32, j, col0 + j < *length ? 0.0f : MASK_NEG);
}

NPU_KERNEL void mask_positions(const int32_t *pos, int32_t *p, int32_t n) {
  for (int32_t i = 0; i < n; ++i) p[i] = *pos + i;
}
