// Rotary position embedding, rotate-half form (ops.rotary; emu.py runs the op's reference on bf16 operands):
//   y = x * cos + rotate_half(x) * sin,  rotate_half(x) = concat(-x[h:], x[:h]),  h = d / 2
// over one row of the head dimension d per call; operands through `map` (npu_kernel.h): x, cos, sin (the rows
// of the tables for this row's position; a table row every x row shares is a shared operand).
#include "../include/npu_kernel.h"

NPU_KERNEL void rope_row(const void *rows, const void *shared, void *y, int32_t y_f32, int32_t d,
                         const int32_t *map, const int32_t *chain, int32_t n_chain, const float *imm) {
  NPU_ROUND_EVEN();
  npu_vec x = npu_operand(rows, shared, map, 0), c = npu_operand(rows, shared, map, 1);
  npu_vec s = npu_operand(rows, shared, map, 2), operands[2];
  npu_epilogue_operands(rows, shared, map, 3, n_chain, chain, operands);
  const int32_t h = d / 2;
  for (int32_t i = 0; i < d; ++i) {
    float rot = i < h ? -npu_get(x, i + h) : npu_get(x, i - h);
    float a = npu_get(x, i) * npu_get(c, i);
    float b = rot * npu_get(s, i);
    npu_put(y, y_f32, i, npu_epilogue(a + b, i, chain, n_chain, imm, operands));
  }
}
