// mean over axes (ops.mean; emu.py runs the op's reference on the stored operand): fp32 sums in L1, then one
// store of sum / count through the fused (operand-free) epilogue.
//   reduce_rows: acc[*at + r] += sum_j x[r][j], *at += rows   (mean over trailing axes: ResNet's global pool)
//   reduce_cols: acc[j] += sum_r x[r][j]                       (mean over an outer axis: ESM's masked mean)
#include "../include/npu_kernel.h"

NPU_KERNEL void reduce_zero(float *acc, int32_t n, int32_t *at) {
  for (int32_t i = 0; i < n; ++i) acc[i] = 0.0f;
  *at = 0;
}

NPU_KERNEL void reduce_rows(const void *x, int32_t x_f32, float *acc, int32_t rows, int32_t n, int32_t *at) {
  npu_vec v = {x, x_f32, 0};
  for (int32_t r = 0; r < rows; ++r) {
    float s = 0.0f;
    for (int32_t j = 0; j < n; ++j) s += npu_get(v, r * n + j);
    acc[*at + r] += s;
  }
  *at += rows;
}

NPU_KERNEL void reduce_cols(const void *x, int32_t x_f32, float *acc, int32_t rows, int32_t n) {
  npu_vec v = {x, x_f32, 0};
  for (int32_t r = 0; r < rows; ++r)
    for (int32_t j = 0; j < n; ++j) acc[j] += npu_get(v, r * n + j);
}

NPU_KERNEL void reduce_mean_store(const float *acc, void *y, int32_t y_f32, int32_t n, int32_t count,
                                  const int32_t *chain, int32_t n_chain, const float *imm) {
  NPU_ROUND_EVEN();
  for (int32_t i = 0; i < n; ++i) npu_put(y, y_f32, i, npu_epilogue_unary(acc[i] / (float)count, chain, n_chain, imm));
}

// The store of a mean whose epilogue reads operands, each one value per work item (ESM's token-dropout
// rescale: divide by another mean, subtract from a constant): the values ride in the last input object of the
// item, `rows`, at the word offsets of `map` (kernel input 0 is the mean's input, 1.. the chain's operands).
NPU_KERNEL void reduce_mean_store_operands(const float *acc, void *y, int32_t y_f32, int32_t n, int32_t count,
                                           const int32_t *chain, int32_t n_chain, const float *imm,
                                           const void *rows, const int32_t *map) {
  NPU_ROUND_EVEN();
  npu_vec operands[8];
  npu_epilogue_operands(rows, rows, map, 1, n_chain, chain, operands);
  for (int32_t i = 0; i < n; ++i)
    npu_put(y, y_f32, i, npu_epilogue(acc[i] / (float)count, i, chain, n_chain, imm, operands));
}
