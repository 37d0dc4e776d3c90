// bf16 GEMM tile kernel: C[m x n] (fp32, resident in L1) += A[m x k] . B[k x n], then one bf16 store with the
// fused epilogue (bias, activation, residual, scale) applied to the fp32 accumulator.
//
// Tiles arrive blocked by the MAC shape (R x S x T; npu1 4x8x4, npu2 8x8x8), which the memtile DMA produces
// from row-major tiles (kernels/gemm/design.py, dims_to_stream):
//   A [m/R][k/S][R][S]   B [k/S][n/T][S][T]   C and the output [m/R][n/T][R][T]
// The design streams B from the weights arena (packed tile-major by sdk/compiler/layout.py) for `gemm`, or
// from the scratch arena for `bmm` (activation x activation; one B per batch slice when B is batched), where a
// B whose columns are contiguous comes as tiles of B^T instead (gemm_mac_bt). emu.py's _gemm / _bmm are the numerics spec.
#include "../include/npu_kernel.h"

#ifndef MMUL_R
#define MMUL_R 4
#endif
#ifndef MMUL_S
#define MMUL_S 8
#endif
#ifndef MMUL_T
#define MMUL_T 4
#endif

NPU_KERNEL void gemm_zero(float *acc, int32_t m, int32_t n) {
  for (int32_t i = 0; i < m * n; ++i) acc[i] = 0.0f;
}

// A is bf16, or fp32 when a_f32 (the residual stream feeding a GEMM): the MACs read it rounded to bf16.
// B holds `planes` blocked [k x n] tiles back to back: one, or two for split weights (sdk/compiler/catalog.py
// SPLIT_WEIGHTS: hi = bf16(w), then lo = bf16(w - hi)), whose products go into the same fp32 accumulator.
#ifdef __AIENGINE__
// Vector path: one aie::mmul per (R x S) . (S x T) block, accumulating in an fp32 accumulator register.
template <typename TA>
static inline aie::vector<bfloat16, MMUL_R * MMUL_S> gemm_a_block(const TA *a) {
  if constexpr (sizeof(TA) == 4) {
    aie::accum<accfloat, MMUL_R * MMUL_S> wide;
    wide.from_vector(aie::load_v<MMUL_R * MMUL_S>(a));
    return wide.template to_vector<bfloat16>();
  } else {
    return aie::load_v<MMUL_R * MMUL_S>(a);
  }
}

template <typename TA>
static void gemm_mac_vec(const TA *a, const bf16 *b, int32_t planes, float *acc, int32_t m, int32_t k, int32_t n) {
  using MMUL = aie::mmul<MMUL_R, MMUL_S, MMUL_T, bfloat16, bfloat16, accfloat>;
  const int32_t mb = m / MMUL_R, kb = k / MMUL_S, nb = n / MMUL_T;
  for (int32_t i = 0; i < mb; ++i)
    chess_prepare_for_pipelining for (int32_t j = 0; j < nb; ++j) {
      float *c = acc + (i * nb + j) * MMUL_R * MMUL_T;
      MMUL C(aie::load_v<MMUL_R * MMUL_T>(c));
      for (int32_t kk = 0; kk < kb; ++kk) {
        auto A = gemm_a_block(a + (i * kb + kk) * MMUL_R * MMUL_S);
        for (int32_t p = 0; p < planes; ++p)
          C.mac(A, aie::load_v<MMUL_S * MMUL_T>(b + p * k * n + (kk * nb + j) * MMUL_S * MMUL_T));
      }
      aie::store_v(c, C.template to_vector<float>());
    }
}

NPU_KERNEL void gemm_mac(const void *a, int32_t a_f32, const bf16 *b, int32_t planes, float *acc, int32_t m, int32_t k,
                         int32_t n) {
  NPU_ROUND_EVEN();
  if (a_f32)
    gemm_mac_vec((const float *)a, b, planes, acc, m, k, n);
  else
    gemm_mac_vec((const bf16 *)a, b, planes, acc, m, k, n);
}
#else
// Scalar path (host tests): the same blocked layouts, fp32 accumulation in k order per output element, each
// weight plane's product in turn.
NPU_KERNEL void gemm_mac(const void *a, int32_t a_f32, const bf16 *b, int32_t planes, float *acc, int32_t m, int32_t k,
                         int32_t n) {
  const npu_vec av = {a, a_f32, 0};
  const int32_t kb = k / MMUL_S, nb = n / MMUL_T;
  for (int32_t row = 0; row < m; ++row)
    for (int32_t col = 0; col < n; ++col) {
      const int32_t i = row / MMUL_R, r = row % MMUL_R, j = col / MMUL_T, t = col % MMUL_T;
      float sum = acc[(i * nb + j) * MMUL_R * MMUL_T + r * MMUL_T + t];
      for (int32_t kk = 0; kk < k; ++kk) {
        const int32_t q = kk / MMUL_S, s = kk % MMUL_S;
        const float x = npu_mac_operand(av, (i * kb + q) * MMUL_R * MMUL_S + r * MMUL_S + s);
        for (int32_t p = 0; p < planes; ++p)
          sum += x * to_f32(b[p * k * n + (q * nb + j) * MMUL_S * MMUL_T + s * MMUL_T + t]);
      }
      acc[(i * nb + j) * MMUL_R * MMUL_T + r * MMUL_T + t] = sum;
    }
}
#endif

// A bmm whose B is read as rows of B^T (kernels/gemm/design.py: its columns are contiguous in memory, its rows
// are not, as for scores against per-head keys or relative positions): each B object is an [n x k] tile of B^T,
// which the memtile blocks [k/S][n/T][T][S], so that every block is the transpose of the S x T block gemm_mac
// reads at the same place. Columns from n_valid on lie past N, in the output's padding to whole tiles
// (sdk/compiler/memory.py pad_to_tiles): the design fills them with a real row of B^T again, and they are zeroed
// here first, so that those output columns hold the epilogue of a zero accumulator, as a GEMM's do.
static void gemm_bt_clear(bf16 *bt, int32_t n_valid, int32_t k, int32_t n) {
  const int32_t nb = n / MMUL_T;
  for (int32_t col = n_valid; col < n; ++col)
    for (int32_t kk = 0; kk < k; ++kk)
      bt[((kk / MMUL_S) * nb + col / MMUL_T) * MMUL_S * MMUL_T + (col % MMUL_T) * MMUL_S + kk % MMUL_S] = to_bf16(0.0f);
}

#ifdef __AIENGINE__
template <typename TA>
static void gemm_mac_bt_vec(const TA *a, const bf16 *bt, float *acc, int32_t m, int32_t k, int32_t n) {
  using MMUL = aie::mmul<MMUL_R, MMUL_S, MMUL_T, bfloat16, bfloat16, accfloat>;
  const int32_t mb = m / MMUL_R, kb = k / MMUL_S, nb = n / MMUL_T;
  for (int32_t i = 0; i < mb; ++i)
    chess_prepare_for_pipelining for (int32_t j = 0; j < nb; ++j) {
      float *c = acc + (i * nb + j) * MMUL_R * MMUL_T;
      MMUL C(aie::load_v<MMUL_R * MMUL_T>(c));
      for (int32_t kk = 0; kk < kb; ++kk) {
        auto A = gemm_a_block(a + (i * kb + kk) * MMUL_R * MMUL_S);
        auto Bt = aie::load_v<MMUL_S * MMUL_T>(bt + (kk * nb + j) * MMUL_S * MMUL_T);  // T x S
        C.mac(A, aie::transpose(Bt, MMUL_T, MMUL_S));                                      // -> S x T
      }
      aie::store_v(c, C.template to_vector<float>());
    }
}

NPU_KERNEL void gemm_mac_bt(const void *a, int32_t a_f32, bf16 *bt, int32_t n_valid, float *acc, int32_t m, int32_t k,
                            int32_t n) {
  NPU_ROUND_EVEN();
  gemm_bt_clear(bt, n_valid, k, n);
  if (a_f32)
    gemm_mac_bt_vec((const float *)a, bt, acc, m, k, n);
  else
    gemm_mac_bt_vec((const bf16 *)a, bt, acc, m, k, n);
}
#else
NPU_KERNEL void gemm_mac_bt(const void *a, int32_t a_f32, bf16 *bt, int32_t n_valid, float *acc, int32_t m, int32_t k,
                            int32_t n) {
  gemm_bt_clear(bt, n_valid, k, n);
  const npu_vec av = {a, a_f32, 0};
  const int32_t kb = k / MMUL_S, nb = n / MMUL_T;
  for (int32_t row = 0; row < m; ++row)
    for (int32_t col = 0; col < n; ++col) {
      const int32_t i = row / MMUL_R, r = row % MMUL_R, j = col / MMUL_T, t = col % MMUL_T;
      float sum = acc[(i * nb + j) * MMUL_R * MMUL_T + r * MMUL_T + t];
      for (int32_t kk = 0; kk < k; ++kk) {
        const int32_t q = kk / MMUL_S, s = kk % MMUL_S;
        sum += npu_mac_operand(av, (i * kb + q) * MMUL_R * MMUL_S + r * MMUL_S + s) *
               to_f32(bt[(q * nb + j) * MMUL_S * MMUL_T + t * MMUL_S + s]);
      }
      acc[(i * nb + j) * MMUL_R * MMUL_T + r * MMUL_T + t] = sum;
    }
}
#endif

// The bias (fp32, sdk/compiler/layout.py) arrives once, at the start, as the first objects of the B stream
// (the design fills them with this core column's bias tiles, repeated to whole objects); the memtile blocked
// them like B tiles, so gemm_bias_load undoes the blocking: word u of the object's row-major bytes sits at
// bf16 unit (2u) of a [k][n] tile blocked [k/S][n/T][S][T] (k counts both planes' rows of a split weight's
// object, which the memtile blocks as one [2k][n] tile: the hi tile's blocks, then the lo tile's).
NPU_KERNEL void gemm_bias_load(const bf16 *b_obj, float *bias, int32_t first, int32_t count, int32_t k, int32_t n) {
  const int32_t nb = n / MMUL_T;
  for (int32_t w = 0; w < count; ++w) {
    const int32_t u = 2 * w, r = u / n, c = u % n;  // T is even: both halves of a float stay adjacent
    const int32_t at = ((r / MMUL_S) * nb + c / MMUL_T) * MMUL_S * MMUL_T + (r % MMUL_S) * MMUL_T + c % MMUL_T;
    memcpy(&bias[first + w], &b_obj[at], 4);
  }
  (void)k;
}

// The single store of a finished tile: acc (+ bias[j0 .. j0+n)) -> chain -> bf16 (or fp32), blocked like C.
// The chain takes no operand tiles (the design refuses GEMM epilogues with operands: they would need a third
// input stream per core).
NPU_KERNEL void gemm_store(const float *acc, const float *bias, int32_t has_bias, int32_t j0, void *out,
                           int32_t out_f32, int32_t m, int32_t n, const int32_t *chain, int32_t n_chain,
                           const float *imm) {
  NPU_ROUND_EVEN();
  const int32_t nb = n / MMUL_T, block = MMUL_R * MMUL_T;
  for (int32_t e = 0; e < m * n; ++e) {
    float v = acc[e];
    if (has_bias) v += bias[j0 + ((e / block) % nb) * MMUL_T + e % MMUL_T];
    npu_put(out, out_f32, e, npu_epilogue_unary(v, chain, n_chain, imm));
  }
}

// The residual-add epilogue: the residual tile (same [m x n] as C; fp32 for the residual stream, or bf16)
// rides on the core's own A stream as `res_objs` extra A objects after the K steps, so a core still reads two
// streams. The memtile blocked those objects like A tiles ([m/R][k/S][R][S] of A's elements, a_size bytes
// each); gemm_residual finds element (row, col) of the residual in them.
static inline float gemm_residual(const void *r0, const void *r1, int32_t r_f32, int32_t a_size, int32_t row, int32_t col,
                                  int32_t m, int32_t n, int32_t k) {
  const int32_t r_size = r_f32 ? 4 : 2;
  const int32_t u = (row * n + col) * (r_size / a_size), per = m * k;  // in A elements, before blocking
  const char *obj = (const char *)(u / per ? r1 : r0);
  const int32_t w = u % per, rr = w / k, cc = w % k;
  const int32_t at = ((rr / MMUL_R) * (k / MMUL_S) + cc / MMUL_S) * MMUL_R * MMUL_S + (rr % MMUL_R) * MMUL_S + cc % MMUL_S;
  if (r_f32) {
    float v;
    memcpy(&v, obj + at * a_size, 4);
    return v;
  }
  bf16 b;
  memcpy(&b, obj + at * a_size, 2);
  return to_f32(b);
}

NPU_KERNEL void gemm_store_residual(const float *acc, const float *bias, int32_t has_bias, int32_t j0, void *out,
                                    int32_t out_f32, int32_t m, int32_t n, const int32_t *chain, int32_t n_chain,
                                    const float *imm, const void *r0, const void *r1, int32_t r_f32, int32_t a_size,
                                    int32_t k) {
  NPU_ROUND_EVEN();
  const int32_t nb = n / MMUL_T, block = MMUL_R * MMUL_T;
  for (int32_t e = 0; e < m * n; ++e) {
    const int32_t ib = e / (nb * block), jb = (e / block) % nb, r = (e % block) / MMUL_T, t = e % MMUL_T;
    const int32_t row = ib * MMUL_R + r, col = jb * MMUL_T + t;
    float v = acc[e];
    if (has_bias) v += bias[j0 + col];
    float res = gemm_residual(r0, r1, r_f32, a_size, row, col, m, n, k);
    const npu_vec operands[2] = {{&res, 1, 1}, {&res, 1, 1}};
    npu_put(out, out_f32, e, npu_epilogue(v, e, chain, n_chain, imm, operands));
  }
}

// The norm prologue (a layer_norm / rms_norm whose only reader is this GEMM, fused by the compiler): the
// core streams each A row tile through itself once more per statistic (sum, then centred squares; rms_norm
// only the squares) before the K loop, keeps gamma and beta for the whole K in L1 (loaded like the bias, from
// the first objects of the B stream), and normalises each A tile into a bf16 tile the MACs read, exactly as
// emu.py's _gemm rounds the normalised rows to bf16. st: [sum[m], squares[m]]; kpos: the K offset of the next
// tile (advanced by gemm_prologue_apply, wrapping at K).
static inline int32_t gemm_a_at(int32_t row, int32_t col, int32_t k) {
  return ((row / MMUL_R) * (k / MMUL_S) + col / MMUL_S) * MMUL_R * MMUL_S + (row % MMUL_R) * MMUL_S + col % MMUL_S;
}

NPU_KERNEL void gemm_prologue_begin(float *st, int32_t *kpos, int32_t m) {
  for (int32_t i = 0; i < 2 * m; ++i) st[i] = 0.0f;
  *kpos = 0;
}

NPU_KERNEL void gemm_prologue_sum(const void *a, int32_t a_f32, float *st, int32_t m, int32_t k) {
  const npu_vec av = {a, a_f32, 0};
  for (int32_t row = 0; row < m; ++row) {
    float s = 0.0f;
    for (int32_t col = 0; col < k; ++col) s += npu_get(av, gemm_a_at(row, col, k));
    st[row] += s;
  }
}

NPU_KERNEL void gemm_prologue_squares(const void *a, int32_t a_f32, float *st, int32_t m, int32_t k, int32_t K,
                                      int32_t centred) {
  const npu_vec av = {a, a_f32, 0};
  for (int32_t row = 0; row < m; ++row) {
    const float mu = centred ? st[row] / (float)K : 0.0f;
    float s = 0.0f;
    for (int32_t col = 0; col < k; ++col) {
      float d = npu_get(av, gemm_a_at(row, col, k)) - mu;
      s += d * d;
    }
    st[m + row] += s;
  }
}

NPU_KERNEL void gemm_prologue_apply(const void *a, int32_t a_f32, const float *gamma, const float *beta,
                                    int32_t has_beta, float *st, int32_t *kpos, bf16 *a_norm, int32_t m, int32_t k,
                                    int32_t K, int32_t centred, float eps) {
  NPU_ROUND_EVEN();
  const npu_vec av = {a, a_f32, 0};
  const int32_t k0 = *kpos;
  for (int32_t row = 0; row < m; ++row) {
    const float mu = centred ? st[row] / (float)K : 0.0f;
    const float denom = __builtin_sqrtf(st[m + row] / (float)K + eps);
    for (int32_t col = 0; col < k; ++col) {
      const int32_t at = gemm_a_at(row, col, k);
      float v = (npu_get(av, at) - mu) / denom * gamma[k0 + col];
      if (has_beta) v += beta[k0 + col];
      a_norm[at] = to_bf16(v);
    }
  }
  *kpos = k0 + k == K ? 0 : k0 + k;
}

// gemm_prologue_apply then gemm_mac on the normalised tile: one call, so the design declares gemm_mac with one
// A type only (an MLIR function has one signature).
NPU_KERNEL void gemm_prologue_mac(const void *a, int32_t a_f32, const float *gamma, const float *beta, int32_t has_beta,
                                  float *st, int32_t *kpos, bf16 *a_norm, const bf16 *b, int32_t planes, float *acc,
                                  int32_t m, int32_t k, int32_t n, int32_t K, int32_t centred, float eps) {
  gemm_prologue_apply(a, a_f32, gamma, beta, has_beta, st, kpos, a_norm, m, k, K, centred, eps);
  gemm_mac(a_norm, 0, b, planes, acc, m, k, n);
}
