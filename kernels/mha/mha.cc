// Multi-head attention for one head and one query tile q [tq x d] against key/value blocks [tk x d]:
//   s = (q k^T) * scale + mask;  p = bf16(softmax(s));  out = p v          (emu.py _mha is the spec)
// The softmax is exact, as in the emulator: pass 1 streams the key blocks for the row max, pass 2 for the
// sum of exps, pass 3 accumulates bf16(exp(s - max) / sum) . v in fp32. Prefill runs tq query rows over the
// keys of the window; decode is tq = 1 against the KV cache, whose unwritten tail the causal-cache mask
// (from the position runtime parameter, kernels/maskgen) hides. A key block arrives as one object joined in
// the memtile, kvm = [k: tk x d][v: tk x d][mask: mask_rows x tk] (bf16): mask_rows = 1 broadcasts one row
// over the query tile (decode's one row, and a key-padding mask's, the same for every query); mask_rows = 0
// means no mask; a negative mask_rows is a mask of -mask_rows rows stored in fp32 (a mask whose rows are an odd
// number of elements: in fp32 they are whole 32-bit words for the DMAs).
// st: [max[tq], sum[tq]] fp32; acc: [tq x d] fp32.
#include "../include/npu_kernel.h"

static inline float mha_score(const bf16 *q, const bf16 *kvm, int32_t i, int32_t j, int32_t tk, int32_t d,
                              float scale, int32_t mask_rows) {
  const bf16 *k = kvm, *mask = kvm + 2 * tk * d;
  float dot = 0.0f;
  for (int32_t c = 0; c < d; ++c) dot += to_f32(q[i * d + c]) * to_f32(k[j * d + c]);
  float s = dot * scale;
  if (mask_rows > 0) s += to_f32(mask[(mask_rows == 1 ? 0 : i) * tk + j]);
  if (mask_rows < 0) s += reinterpret_cast<const float *>(mask)[(mask_rows == -1 ? 0 : i) * tk + j];
  return s;
}

NPU_KERNEL void mha_begin(float *st, float *acc, int32_t tq, int32_t d) {
  for (int32_t i = 0; i < tq; ++i) {
    st[i] = -3.0e38f;
    st[tq + i] = 0.0f;
  }
  for (int32_t i = 0; i < tq * d; ++i) acc[i] = 0.0f;
}

NPU_KERNEL void mha_max(const bf16 *q, const bf16 *kvm, float *st, int32_t tq, int32_t tk, int32_t d, float scale,
                        int32_t mask_rows) {
  for (int32_t i = 0; i < tq; ++i)
    for (int32_t j = 0; j < tk; ++j) {
      float s = mha_score(q, kvm, i, j, tk, d, scale, mask_rows);
      st[i] = s > st[i] ? s : st[i];
    }
}

NPU_KERNEL void mha_sum(const bf16 *q, const bf16 *kvm, float *st, int32_t tq, int32_t tk, int32_t d, float scale,
                        int32_t mask_rows) {
  for (int32_t i = 0; i < tq; ++i) {
    float s = 0.0f;
    for (int32_t j = 0; j < tk; ++j) s += npu_exp(mha_score(q, kvm, i, j, tk, d, scale, mask_rows) - st[i]);
    st[tq + i] += s;
  }
}

NPU_KERNEL void mha_pv(const bf16 *q, const bf16 *kvm, const float *st, float *acc, int32_t tq, int32_t tk, int32_t d,
                       float scale, int32_t mask_rows) {
  const bf16 *v = kvm + tk * d;
  NPU_ROUND_EVEN();
  for (int32_t i = 0; i < tq; ++i)
    for (int32_t j = 0; j < tk; ++j) {
      float p = npu_exp(mha_score(q, kvm, i, j, tk, d, scale, mask_rows) - st[i]) / st[tq + i];
      p = to_f32(to_bf16(p));  // probabilities are stored bf16 for the second matmul
      for (int32_t c = 0; c < d; ++c) acc[i * d + c] += p * to_f32(v[j * d + c]);
    }
}

NPU_KERNEL void mha_store(const float *acc, void *out, int32_t out_f32, int32_t tq, int32_t d, const int32_t *chain,
                          int32_t n_chain, const float *imm) {
  NPU_ROUND_EVEN();
  for (int32_t e = 0; e < tq * d; ++e) npu_put(out, out_f32, e, npu_epilogue_unary(acc[e], chain, n_chain, imm));
}
