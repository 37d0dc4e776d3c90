// Masks and positions computed on the device from the runtime parameters (position, valid length), so a
// decoder step or a padded bucket needs no host round trip (ops.causal_cache_mask / length_mask / positions):
//   causal: m[i][j] = 0 when j <= pos + i, else -1e30   (n_new x size)
//   length: m[j]    = 0 when j < length,  else -1e30    (size)
//   positions: p[i] = pos + i (int32)
// The runtime parameter arrives as one int32 in the io arena (the params buffer the dispatch reads).
#include "../include/npu_kernel.h"

static const float MASK_NEG = -1e30f;

NPU_KERNEL void mask_causal(const int32_t *pos, bf16 *m, int32_t n_new, int32_t size, int32_t row0) {
  for (int32_t i = 0; i < n_new; ++i)
    for (int32_t j = 0; j < size; ++j) m[i * size + j] = to_bf16(j <= *pos + row0 + i ? 0.0f : MASK_NEG);
}

NPU_KERNEL void mask_length(const int32_t *length, bf16 *m, int32_t size) {
  for (int32_t j = 0; j < size; ++j) m[j] = to_bf16(j < *length ? 0.0f : MASK_NEG);
}

NPU_KERNEL void mask_positions(const int32_t *pos, int32_t *p, int32_t n) {
  for (int32_t i = 0; i < n; ++i) p[i] = *pos + i;
}
