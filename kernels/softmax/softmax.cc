// softmax / log_softmax over the last axis, exact (max first, then the sum of exps, then the store), in
// chunks so a row longer than L1 (a vocabulary) streams through three times from the memtile; a row that
// fits runs the three phases on one resident chunk. emu.py k_softmax / k_log_softmax are the spec.
// st: [max, sum] per row, fp32, in L1. Operands through `map` (npu_kernel.h): input 0 is x.
#include "../include/npu_kernel.h"

static inline float npu_log(float x) {  // x > 0: log(m 2^e) = e ln2 + 2 atanh((m-1)/(m+1)), m in [1, 2)
  uint32_t u;
  memcpy(&u, &x, 4);
  int32_t e = (int32_t)((u >> 23) & 0xff) - 127;
  u = (u & 0x7fffffu) | 0x3f800000u;
  float m;
  memcpy(&m, &u, 4);
  float z = (m - 1.0f) / (m + 1.0f), z2 = z * z;
  float series = z * (2.0f + z2 * (2.0f / 3 + z2 * (2.0f / 5 + z2 * (2.0f / 7 + z2 * (2.0f / 9 + z2 * (2.0f / 11))))));
  return (float)e * 0.6931471805599453f + series;
}

NPU_KERNEL void softmax_begin(float *st) {
  st[0] = -3.0e38f;
  st[1] = 0.0f;
}

NPU_KERNEL void softmax_max(const void *rows, const void *shared, int32_t n, const int32_t *map, float *st) {
  npu_vec x = npu_operand(rows, shared, map, 0);
  float m = st[0];
  for (int32_t i = 0; i < n; ++i) {
    float v = npu_get(x, i);
    m = v > m ? v : m;
  }
  st[0] = m;
}

NPU_KERNEL void softmax_sum(const void *rows, const void *shared, int32_t n, const int32_t *map, float *st) {
  npu_vec x = npu_operand(rows, shared, map, 0);
  float s = 0.0f;
  for (int32_t i = 0; i < n; ++i) s += npu_exp(npu_get(x, i) - st[0]);
  st[1] += s;
}

// log_softmax = 0: exp(x - max) / sum; 1: (x - max) - log(sum). Then the fused epilogue, one store.
NPU_KERNEL void softmax_store(const void *rows, const void *shared, void *y, int32_t y_f32, int32_t n,
                              const int32_t *map, const float *st, int32_t log_softmax, const int32_t *chain,
                              int32_t n_chain, const float *imm) {
  NPU_ROUND_EVEN();
  npu_vec x = npu_operand(rows, shared, map, 0), operands[2];
  npu_epilogue_operands(rows, shared, map, 1, n_chain, chain, operands);
  const float log_sum = log_softmax ? npu_log(st[1]) : 0.0f;
  for (int32_t i = 0; i < n; ++i) {
    float d = npu_get(x, i) - st[0];
    float v = log_softmax ? d - log_sum : npu_exp(d) / st[1];
    npu_put(y, y_f32, i, npu_epilogue(v, i, chain, n_chain, imm, operands));
  }
}
