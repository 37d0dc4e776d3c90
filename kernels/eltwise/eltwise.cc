// Elementwise chains streamed in row pieces (emu.py _eltwise + the epilogue chain are the spec): a unary op
// (gelu, gelu_tanh, sigmoid, silu, relu, tanh, exp, scale), a binary op (add, sub, mul, div; broadcasting is
// the design's access pattern: an operand the same for every row is a shared one), or GLU (a * sigmoid(b),
// the two halves as two operands), each followed by the fused chain; fp32 inside, one store (bf16, or fp32
// for the residual stream). `op` uses the epilogue opcodes; operands are found through `map` (npu_operand).
#include "../include/npu_kernel.h"

#ifdef __AIENGINE__
// Vector path for bf16 binary ops without a chain (gates, bf16 adds): 16 lanes in fp32.
static bool eltwise_binary_vec(npu_vec a, npu_vec b, void *y, int32_t y_f32, int32_t n, int32_t op) {
  if (n % 16 || a.f32 || b.f32 || a.scalar || b.scalar || y_f32 || (op != EPI_ADD && op != EPI_MUL && op != EPI_SUB)) return false;
  const bf16 *pa = (const bf16 *)a.p, *pb = (const bf16 *)b.p;
  bf16 *py = (bf16 *)y;
  for (int32_t i = 0; i < n; i += 16) chess_prepare_for_pipelining {
      aie::vector<float, 16> va = aie::load_v<16>(pa + i).template cast_to<float>();
      aie::vector<float, 16> vb = aie::load_v<16>(pb + i).template cast_to<float>();
      aie::vector<float, 16> r = op == EPI_ADD ? aie::add(va, vb) : op == EPI_SUB ? aie::sub(va, vb) : aie::mul(va, vb);
      aie::store_v(py + i, aie::to_float<bfloat16>(r));
    }
  return true;
}
#endif

NPU_KERNEL void eltwise_unary(const void *rows, const void *shared, void *y, int32_t y_f32, int32_t n,
                              const int32_t *map, int32_t op, float imm0, const int32_t *chain, int32_t n_chain,
                              const float *imm) {
  NPU_ROUND_EVEN();
  npu_vec x = npu_operand(rows, shared, map, 0), operands[2];
  npu_epilogue_operands(rows, shared, map, 1, n_chain, chain, operands);
  for (int32_t i = 0; i < n; ++i)
    npu_put(y, y_f32, i, npu_epilogue(npu_unary(op, npu_get(x, i), imm0), i, chain, n_chain, imm, operands));
}

NPU_KERNEL void eltwise_binary(const void *rows, const void *shared, void *y, int32_t y_f32, int32_t n,
                               const int32_t *map, int32_t op, const int32_t *chain, int32_t n_chain,
                               const float *imm) {
  NPU_ROUND_EVEN();
  npu_vec a = npu_operand(rows, shared, map, 0), b = npu_operand(rows, shared, map, 1), operands[2];
#ifdef __AIENGINE__
  if (n_chain == 0 && eltwise_binary_vec(a, b, y, y_f32, n, op)) return;
#endif
  npu_epilogue_operands(rows, shared, map, 2, n_chain, chain, operands);
  for (int32_t i = 0; i < n; ++i)
    npu_put(y, y_f32, i, npu_epilogue(npu_binary(op, npu_get(a, i), npu_get(b, i)), i, chain, n_chain, imm, operands));
}

NPU_KERNEL void eltwise_glu(const void *rows, const void *shared, void *y, int32_t y_f32, int32_t n,
                            const int32_t *map, const int32_t *chain, int32_t n_chain, const float *imm) {
  NPU_ROUND_EVEN();
  npu_vec a = npu_operand(rows, shared, map, 0), b = npu_operand(rows, shared, map, 1), operands[2];
  npu_epilogue_operands(rows, shared, map, 2, n_chain, chain, operands);
  for (int32_t i = 0; i < n; ++i)
    npu_put(y, y_f32, i, npu_epilogue(npu_get(a, i) * npu_sigmoid(npu_get(b, i)), i, chain, n_chain, imm, operands));
}

// int32 add / sub / mul (index arithmetic the compiler keeps on the device, e.g. CLIP's text pooling): no chain.
NPU_KERNEL void eltwise_int(const void *rows, const void *shared, int32_t *y, int32_t n, const int32_t *map,
                            int32_t op) {
  const int32_t *a = (const int32_t *)npu_operand(rows, shared, map, 0).p;
  const int32_t *b = (const int32_t *)npu_operand(rows, shared, map, 1).p;
  for (int32_t i = 0; i < n; ++i) y[i] = op == EPI_ADD ? a[i] + b[i] : op == EPI_SUB ? a[i] - b[i] : a[i] * b[i];
}
