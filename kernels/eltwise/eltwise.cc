// Elementwise chains streamed in row pieces (emu.py _eltwise + the epilogue chain are the spec): a unary op
// (gelu, gelu_tanh, sigmoid, silu, relu, tanh, exp, scale), a binary op (add, sub, mul, div; broadcasting is
// the design's access pattern: an operand the same for every row is a shared one), or GLU (a * sigmoid(b),
// the two halves as two operands), each followed by the fused chain; fp32 inside, one bf16 store.
// `op` uses the epilogue opcodes of npu_kernel.h; operands are found through `map` (npu_operand).
#include "../include/npu_kernel.h"

#ifdef __AIENGINE__
// Vector path for the binary ops without a chain (residual adds, gates): 16 lanes in fp32.
static bool eltwise_binary_vec(const bf16 *a, const bf16 *b, bf16 *y, int32_t n, int32_t op) {
  if (n % 16 || (op != EPI_ADD && op != EPI_MUL && op != EPI_SUB)) return false;
  for (int32_t i = 0; i < n; i += 16) chess_prepare_for_pipelining {
      aie::vector<float, 16> va = aie::load_v<16>(a + i).template cast_to<float>();
      aie::vector<float, 16> vb = aie::load_v<16>(b + i).template cast_to<float>();
      aie::vector<float, 16> r = op == EPI_ADD ? aie::add(va, vb) : op == EPI_SUB ? aie::sub(va, vb) : aie::mul(va, vb);
      aie::store_v(y + i, aie::to_float<bfloat16>(r));
    }
  return true;
}
#endif

NPU_KERNEL void eltwise_unary(const bf16 *rows, const bf16 *shared, bf16 *y, int32_t n, const int32_t *map,
                              int32_t op, float imm0, const int32_t *chain, int32_t n_chain, const float *imm) {
  NPU_ROUND_EVEN();
  const bf16 *x = npu_operand(rows, shared, map, 0, n), *operands[2];
  npu_epilogue_operands(rows, shared, map, 1, n_chain, chain, n, operands);
  for (int32_t i = 0; i < n; ++i)
    y[i] = to_bf16(npu_epilogue(npu_unary(op, to_f32(x[i]), imm0), i, chain, n_chain, imm, operands));
}

NPU_KERNEL void eltwise_binary(const bf16 *rows, const bf16 *shared, bf16 *y, int32_t n, const int32_t *map,
                               int32_t op, const int32_t *chain, int32_t n_chain, const float *imm) {
  NPU_ROUND_EVEN();
  const bf16 *a = npu_operand(rows, shared, map, 0, n), *b = npu_operand(rows, shared, map, 1, n), *operands[2];
#ifdef __AIENGINE__
  if (n_chain == 0 && eltwise_binary_vec(a, b, y, n, op)) return;
#endif
  npu_epilogue_operands(rows, shared, map, 2, n_chain, chain, n, operands);
  for (int32_t i = 0; i < n; ++i)
    y[i] = to_bf16(npu_epilogue(npu_binary(op, to_f32(a[i]), to_f32(b[i])), i, chain, n_chain, imm, operands));
}

NPU_KERNEL void eltwise_glu(const bf16 *rows, const bf16 *shared, bf16 *y, int32_t n, const int32_t *map,
                            const int32_t *chain, int32_t n_chain, const float *imm) {
  NPU_ROUND_EVEN();
  const bf16 *a = npu_operand(rows, shared, map, 0, n), *b = npu_operand(rows, shared, map, 1, n), *operands[2];
  npu_epilogue_operands(rows, shared, map, 2, n_chain, chain, n, operands);
  for (int32_t i = 0; i < n; ++i)
    y[i] = to_bf16(npu_epilogue(to_f32(a[i]) * npu_sigmoid(to_f32(b[i])), i, chain, n_chain, imm, operands));
}
