// bf16 GEMV for decode (one activation row): y[n] (fp32 in L1) += x[k] . W[k x n], then the store with
// the fused (operand-free) epilogue. W tiles are the GEMM's packed weight tiles read as they lie in the weights arena
// (tile-major [Kp/k, Np/n, k, n], row-major inside a tile: sdk/compiler/layout.py), so decode and prefill
// share one packed copy of every weight. Memory-bound: each weight byte is read once per token.
#include "../include/npu_kernel.h"

NPU_KERNEL void gemv_zero(float *acc, int32_t n) {
  for (int32_t i = 0; i < n; ++i) acc[i] = 0.0f;
}

// x is bf16, or fp32 when x_f32 (the residual stream), read rounded to bf16 as the MACs see it.
// w holds `planes` [k x n] tiles back to back: one, or two for split weights (sdk/compiler/catalog.py
// SPLIT_WEIGHTS: hi = bf16(w), then lo = bf16(w - hi)), whose products go into the same fp32 accumulator.
#ifdef __AIENGINE__
// Vector path: 16 output columns at a time, x[kk] broadcast against a row of each plane's weight tile.
NPU_KERNEL void gemv_mac(const void *x, int32_t x_f32, const bf16 *w, int32_t planes, float *acc, int32_t k, int32_t n) {
  NPU_ROUND_EVEN();
  const npu_vec xv = {x, x_f32, 0};
  for (int32_t j = 0; j < n; j += 16) {
    aie::accum<accfloat, 16> c;
    c.from_vector(aie::load_v<16>(acc + j));
    for (int32_t kk = 0; kk < k; ++kk)
      chess_prepare_for_pipelining {
        const auto xk = aie::broadcast<bfloat16, 16>(to_bf16(npu_get(xv, kk)));
        for (int32_t p = 0; p < planes; ++p) c = aie::mac(c, xk, aie::load_v<16>(w + p * k * n + kk * n + j));
      }
    aie::store_v(acc + j, c.template to_vector<float>());
  }
}
#else
NPU_KERNEL void gemv_mac(const void *x, int32_t x_f32, const bf16 *w, int32_t planes, float *acc, int32_t k, int32_t n) {
  const npu_vec xv = {x, x_f32, 0};
  for (int32_t j = 0; j < n; ++j) {
    float sum = acc[j];
    for (int32_t kk = 0; kk < k; ++kk) {
      const float xk = npu_mac_operand(xv, kk);
      for (int32_t p = 0; p < planes; ++p) sum += xk * to_f32(w[p * k * n + kk * n + j]);
    }
    acc[j] = sum;
  }
}
#endif

// The bias (fp32) arrives once, at the start, as the first objects of the W stream (this core's bias tiles,
// repeated to whole objects): gemv_bias_load copies `count` floats of one object into L1 at `first`.
NPU_KERNEL void gemv_bias_load(const bf16 *w_obj, float *bias, int32_t first, int32_t count) {
  memcpy(&bias[first], w_obj, 4 * count);
}

NPU_KERNEL void gemv_store(const float *acc, const float *bias, int32_t has_bias, int32_t j0, void *out,
                           int32_t out_f32, int32_t n, const int32_t *chain, int32_t n_chain, const float *imm) {
  NPU_ROUND_EVEN();
  for (int32_t j = 0; j < n; ++j) {
    float v = acc[j] + (has_bias ? bias[j0 + j] : 0.0f);
    npu_put(out, out_f32, j, npu_epilogue_unary(v, chain, n_chain, imm));
  }
}

// The residual-add epilogue: the residual slice [n] (fp32 for the residual stream, or bf16) rides on the core's
// own W stream as one W-sized object after each column tile's K steps (the slice repeated to fill it).
NPU_KERNEL void gemv_store_residual(const float *acc, const float *bias, int32_t has_bias, int32_t j0, void *out,
                                    int32_t out_f32, int32_t n, const int32_t *chain, int32_t n_chain,
                                    const float *imm, const void *r_obj, int32_t r_f32) {
  NPU_ROUND_EVEN();
  const npu_vec res = {r_obj, r_f32, 0};
  for (int32_t j = 0; j < n; ++j) {
    float v = acc[j] + (has_bias ? bias[j0 + j] : 0.0f);
    float r = npu_get(res, j);
    const npu_vec operands[2] = {{&r, 1, 1}, {&r, 1, 1}};
    npu_put(out, out_f32, j, npu_epilogue(v, j, chain, n_chain, imm, operands));
  }
}

// The norm prologue for one activation row: the row streams through twice more before the K loop for its
// statistics (sum, then centred squares; rms_norm only the squares), gamma / beta for the whole K lead the W
// stream into L1, and each chunk is normalised to bf16 before the MACs (as emu.py's _gemm does).
// st: [sum, squares]; kpos: the K offset of the next chunk.
NPU_KERNEL void gemv_prologue_begin(float *st, int32_t *kpos) {
  st[0] = st[1] = 0.0f;
  *kpos = 0;
}

NPU_KERNEL void gemv_prologue_sum(const void *x, int32_t x_f32, float *st, int32_t k) {
  const npu_vec xv = {x, x_f32, 0};
  float s = 0.0f;
  for (int32_t i = 0; i < k; ++i) s += npu_get(xv, i);
  st[0] += s;
}

NPU_KERNEL void gemv_prologue_squares(const void *x, int32_t x_f32, float *st, int32_t k, int32_t K, int32_t centred) {
  const npu_vec xv = {x, x_f32, 0};
  const float mu = centred ? st[0] / (float)K : 0.0f;
  float s = 0.0f;
  for (int32_t i = 0; i < k; ++i) {
    float d = npu_get(xv, i) - mu;
    s += d * d;
  }
  st[1] += s;
}

NPU_KERNEL void gemv_prologue_mac(const void *x, int32_t x_f32, const float *gamma, const float *beta, int32_t has_beta,
                                  float *st, int32_t *kpos, bf16 *x_norm, const bf16 *w, int32_t planes, float *acc,
                                  int32_t k, int32_t n, int32_t K, int32_t centred, float eps) {
  NPU_ROUND_EVEN();
  const npu_vec xv = {x, x_f32, 0};
  const int32_t k0 = *kpos;
  const float mu = centred ? st[0] / (float)K : 0.0f;
  const float denom = __builtin_sqrtf(st[1] / (float)K + eps);
  for (int32_t i = 0; i < k; ++i) {
    float v = (npu_get(xv, i) - mu) / denom * gamma[k0 + i];
    if (has_beta) v += beta[k0 + i];
    x_norm[i] = to_bf16(v);
  }
  *kpos = k0 + k == K ? 0 : k0 + k;
  gemv_mac(x_norm, 0, w, planes, acc, k, n);
}
