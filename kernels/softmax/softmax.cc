// softmax / log_softmax over the last axis, exact (max first, then the sum of exps, then the store), in
// chunks so a row longer than L1 (a vocabulary) streams through three times from the memtile; a row that
// fits runs the three phases on one resident chunk. emu.py k_softmax / k_log_softmax are the spec.
// st: [max, sum] per row, fp32, in L1. Operands through `map` (npu_kernel.h): input 0 is x.
#include "../include/npu_kernel.h"

static inline float npu_log(float x) {  // x > 0: log(m 2^e) = e ln2 + 2 atanh((m-1)/(m+1)), m in [1, 2)
  uint32_t u;
#ifdef __AIENGINE__
  u = *(uint32_t *)&x;
#else
  memcpy(&u, &x, 4);
#endif
  int32_t e = (int32_t)((u >> 23) & 0xff) - 127;
  u = (u & 0x7fffffu) | 0x3f800000u;
  float m;
#ifdef __AIENGINE__
  m = *(float *)&u;
#else
  memcpy(&m, &u, 4);
#endif
  float z = (m - 1.0f) / (m + 1.0f), z2 = z * z;
  float series = z * (2.0f + z2 * (2.0f / 3 + z2 * (2.0f / 5 + z2 * (2.0f / 7 + z2 * (2.0f / 9 + z2 * (2.0f / 11))))));
  return (float)e * 0.6931471805599453f + series;
}

NPU_KERNEL void softmax_begin(float *st) {
  st[0] = -3.0e38f;
  st[1] = 0.0f;
}

NPU_KERNEL void softmax_max(const bf16 *rows, const bf16 *shared, int32_t n, const int32_t *map, float *st) {
  const bf16 *x = npu_operand(rows, shared, map, 0, n);
  float m = st[0];
  for (int32_t i = 0; i < n; ++i) {
    float v = to_f32(x[i]);
    m = v > m ? v : m;
  }
  st[0] = m;
}

NPU_KERNEL void softmax_sum(const bf16 *rows, const bf16 *shared, int32_t n, const int32_t *map, float *st) {
  const bf16 *x = npu_operand(rows, shared, map, 0, n);
  float s = 0.0f;
  for (int32_t i = 0; i < n; ++i) s += npu_exp(to_f32(x[i]) - st[0]);
  st[1] += s;
}

// log_softmax = 0: exp(x - max) / sum; 1: (x - max) - log(sum). Then the fused epilogue, one bf16 store.
NPU_KERNEL void softmax_store(const bf16 *rows, const bf16 *shared, bf16 *y, int32_t n, const int32_t *map,
                              const float *st, int32_t log_softmax, const int32_t *chain, int32_t n_chain,
                              const float *imm) {
  NPU_ROUND_EVEN();
  const bf16 *x = npu_operand(rows, shared, map, 0, n), *operands[2];
  npu_epilogue_operands(rows, shared, map, 1, n_chain, chain, n, operands);
  const float log_sum = log_softmax ? npu_log(st[1]) : 0.0f;
  for (int32_t i = 0; i < n; ++i) {
    float d = to_f32(x[i]) - st[0];
    float v = log_softmax ? d - log_sum : npu_exp(d) / st[1];
    y[i] = to_bf16(npu_epilogue(v, i, chain, n_chain, imm, operands));
  }
}
