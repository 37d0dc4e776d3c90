// layer_norm and rms_norm over the last axis with fp32 statistics (emu.py _norm is the spec):
//   layer_norm: mu = mean(x); xc = x - mu; y = xc / sqrt(mean(xc^2) + eps) * w + b
//   rms_norm:   y = x / sqrt(mean(x^2) + eps) * w
// Rows longer than the chunk stream through the phases chunk by chunk (sum, centred squares, store);
// st holds [sum, sum of squares] of the row in fp32. Operands through `map` (npu_kernel.h): inputs x, w
// and, when has_bias, b; x differs per row, w and b are shared by every row.
#include "../include/npu_kernel.h"

static inline float npu_sqrt(float x) { return __builtin_sqrtf(x); }

NPU_KERNEL void norm_begin(float *st) {
  st[0] = 0.0f;
  st[1] = 0.0f;
}

// Phase 1 (layer_norm only): sum of the row.
NPU_KERNEL void norm_sum(const void *rows, const void *shared, int32_t n, const int32_t *map, float *st) {
  npu_vec x = npu_operand(rows, shared, map, 0);
  float s = 0.0f;
  for (int32_t i = 0; i < n; ++i) s += npu_get(x, i);
  st[0] += s;
}

// Phase 2: sum of squares, centred on sum/row (layer_norm) or not (rms_norm: centred = 0).
NPU_KERNEL void norm_squares(const void *rows, const void *shared, int32_t n, const int32_t *map, int32_t row,
                             int32_t centred, float *st) {
  npu_vec x = npu_operand(rows, shared, map, 0);
  const float mu = centred ? st[0] / (float)row : 0.0f;
  float s = 0.0f;
  for (int32_t i = 0; i < n; ++i) {
    float d = npu_get(x, i) - mu;
    s += d * d;
  }
  st[1] += s;
}

// Phase 3: the store, with the fused chain; epilogue operands follow x, w (, b) in the map.
NPU_KERNEL void norm_store(const void *rows, const void *shared, void *y, int32_t y_f32, int32_t n,
                           const int32_t *map, int32_t row, int32_t centred, int32_t has_bias, float eps,
                           const float *st, const int32_t *chain, int32_t n_chain, const float *imm) {
  NPU_ROUND_EVEN();
  npu_vec x = npu_operand(rows, shared, map, 0), w = npu_operand(rows, shared, map, 1);
  npu_vec b = has_bias ? npu_operand(rows, shared, map, 2) : w, operands[2];
  npu_epilogue_operands(rows, shared, map, 2 + has_bias, n_chain, chain, operands);
  const float mu = centred ? st[0] / (float)row : 0.0f;
  const float denom = npu_sqrt(st[1] / (float)row + eps);
  for (int32_t i = 0; i < n; ++i) {
    float v = (npu_get(x, i) - mu) / denom * npu_get(w, i);
    if (has_bias) v += npu_get(b, i);
    npu_put(y, y_f32, i, npu_epilogue(v, i, chain, n_chain, imm, operands));
  }
}
