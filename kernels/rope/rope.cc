// Rotary position embedding, rotate-half form (ops.rotary; emu.py runs the op's reference on bf16 operands):
//   y = x * cos + rotate_half(x) * sin,  rotate_half(x) = concat(-x[h:], x[:h]),  h = d / 2
// over one row of the head dimension d per call; operands through `map` (npu_kernel.h): x, cos, sin (the rows
// of the tables for this row's position; a table row every x row shares is a shared operand).
#include "../include/npu_kernel.h"

NPU_KERNEL void rope_row(const bf16 *rows, const bf16 *shared, bf16 *y, int32_t d, const int32_t *map,
                         const int32_t *chain, int32_t n_chain, const float *imm) {
  NPU_ROUND_EVEN();
  const bf16 *x = npu_operand(rows, shared, map, 0, d), *c = npu_operand(rows, shared, map, 1, d);
  const bf16 *s = npu_operand(rows, shared, map, 2, d), *operands[2];
  npu_epilogue_operands(rows, shared, map, 3, n_chain, chain, d, operands);
  const int32_t h = d / 2;
  for (int32_t i = 0; i < d; ++i) {
    float rot = i < h ? -to_f32(x[i + h]) : to_f32(x[i - h]);
    float a = to_f32(x[i]) * to_f32(c[i]);
    float b = rot * to_f32(s[i]);
    y[i] = to_bf16(npu_epilogue(a + b, i, chain, n_chain, imm, operands));
  }
}
