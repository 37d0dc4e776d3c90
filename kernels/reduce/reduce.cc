// mean over axes (ops.mean; emu.py runs the op's reference on the bf16 operand): fp32 sums in L1, then one
// bf16 store of sum / count through the fused epilogue.
//   reduce_rows: acc[*at + r] += sum_j x[r][j], *at += rows   (mean over trailing axes: ResNet's global pool)
//   reduce_cols: acc[j] += sum_r x[r][j]                       (mean over an outer axis: ESM's masked mean)
#include "../include/npu_kernel.h"

NPU_KERNEL void reduce_zero(float *acc, int32_t n, int32_t *at) {
  for (int32_t i = 0; i < n; ++i) acc[i] = 0.0f;
  *at = 0;
}

NPU_KERNEL void reduce_rows(const bf16 *x, float *acc, int32_t rows, int32_t n, int32_t *at) {
  for (int32_t r = 0; r < rows; ++r) {
    float s = 0.0f;
    for (int32_t j = 0; j < n; ++j) s += to_f32(x[r * n + j]);
    acc[*at + r] += s;
  }
  *at += rows;
}

NPU_KERNEL void reduce_cols(const bf16 *x, float *acc, int32_t rows, int32_t n) {
  for (int32_t r = 0; r < rows; ++r)
    for (int32_t j = 0; j < n; ++j) acc[j] += to_f32(x[r * n + j]);
}

NPU_KERNEL void reduce_mean_store(const float *acc, bf16 *y, int32_t n, int32_t count, const int32_t *chain,
                                  int32_t n_chain, const float *imm) {
  NPU_ROUND_EVEN();
  const bf16 *operands[2] = {y, y};  // no operand tiles: the design refuses chains that read one
  for (int32_t i = 0; i < n; ++i)
    y[i] = to_bf16(npu_epilogue(acc[i] / (float)count, i, chain, n_chain, imm, operands));
}
