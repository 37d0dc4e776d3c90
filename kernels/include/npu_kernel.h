// Shared by every kernel in kernels/: the bf16 storage type, the exp / activation approximations and the
// fused-epilogue interpreter. The numerics are the ones sdk/runtime/emu.py emulates (it is their executable
// spec): bf16 storage rounded to nearest even, fp32 arithmetic, exp as 2^(x log2 e) with a degree-6
// polynomial for the fraction, erf by Abramowitz & Stegun 7.1.26 on that exp.
//
// Two builds of the same source:
//   __AIENGINE__ defined (Peano / aiecc for npu1 = AIE2, npu2 = AIE2P): bf16 is the hardware bfloat16 and the
//     kernels' vector paths (aie_api) are compiled where a kernel has one;
//   host g++ (tests/test_kernels.py): bf16 is a 16-bit struct with round-to-nearest-even conversion and every
//     kernel runs its scalar path. Build with -ffp-contract=off so no FMA changes the fp32 rounding.
#pragma once
#include <stdint.h>
#include <string.h>

#ifdef __AIENGINE__
#include <aie_api/aie.hpp>
typedef bfloat16 bf16;
static inline float to_f32(bf16 x) { return (float)x; }
// The core's float->bfloat16 conversion rounds by the rounding mode; the designs run with
// aie::rounding_mode::conv_even set by kernel entry points that store (see NPU_ROUND_EVEN).
static inline bf16 to_bf16(float x) { return (bf16)x; }
#define NPU_ROUND_EVEN() ::aie::set_rounding(aie::rounding_mode::conv_even)
#else
struct bf16 { uint16_t bits; };
static inline float to_f32(bf16 x) {
  uint32_t u = (uint32_t)x.bits << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline bf16 to_bf16(float f) {  // round to nearest even; NaN stays NaN
  uint32_t u;
  memcpy(&u, &f, 4);
  bf16 r;
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) {
    r.bits = (uint16_t)((u >> 16) | 0x40);
    return r;
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  r.bits = (uint16_t)(u >> 16);
  return r;
}
#define NPU_ROUND_EVEN() ((void)0)
#endif

#define NPU_KERNEL extern "C"

// ---- exp and the activations built on it (emu.py: k_exp, k_sigmoid, k_tanh, k_erf, UNARY) ----------------

static const float NPU_LOG2E = 1.4426950408889634f;
// 2^f on [0, 1): Taylor coefficients of e^(f ln 2), constant term first (emu.py EXP2_POLY)
static const float NPU_EXP2_POLY[7] = {1.0f, 0.6931471805599453f, 0.2402265069591007f, 0.05550410866482158f,
                                       0.009618129107628477f, 0.0013333558146428443f, 0.00015403530393381606f};

static inline float npu_floor(float x) {
  float t = (float)(int32_t)x;  // |x| <= 127 here
  return t > x ? t - 1.0f : t;
}

static inline float npu_ldexp(float p, int32_t e) {  // p in [1, 2], e in [-126, 127]: build 2^e by its bits
  float s;
  if (e < -126) e = -126;
  uint32_t u = (uint32_t)(e + 127) << 23;
  memcpy(&s, &u, 4);
  return p * s;
}

static inline float npu_exp(float x) {
  float t = x * NPU_LOG2E;
  t = t < -126.0f ? -126.0f : (t > 127.0f ? 127.0f : t);
  float i = npu_floor(t);
  float f = t - i;
  float p = 0.0f;
  for (int c = 6; c >= 0; --c) p = p * f + NPU_EXP2_POLY[c];
  return npu_ldexp(p, (int32_t)i);
}

static inline float npu_sigmoid(float x) {
  x = x < -88.0f ? -88.0f : (x > 88.0f ? 88.0f : x);
  return 1.0f / (1.0f + npu_exp(-x));
}
static inline float npu_tanh(float x) { return 2.0f * npu_sigmoid(2.0f * x) - 1.0f; }
static inline float npu_erf(float x) {
  float a = x < 0 ? -x : x;
  float t = 1.0f / (1.0f + 0.3275911f * a);
  float poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  float r = 1.0f - poly * npu_exp(-a * a);
  return x < 0 ? -r : (x > 0 ? r : 0.0f);
}
static inline float npu_gelu(float x) { return 0.5f * x * (1.0f + npu_erf(x * 0.7071067811865476f)); }
static inline float npu_gelu_tanh(float x) {
  return 0.5f * x * (1.0f + npu_tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
static inline float npu_silu(float x) { return x * npu_sigmoid(x); }

// ---- fused epilogue: the op chain the compiler folds into a kernel (fuse.py `chain`) -------------------
// One int32 per chain entry: opcode | operand slot << 8 | swap << 12. Unary ops act on the running fp32
// value; `scale` multiplies by its immediate; binary ops combine it with the element of operand `slot`
// (swap: operand op value). The design writes the chain into the kernel's parameter buffer.
enum NpuEpilogueOp {
  EPI_GELU = 1, EPI_GELU_TANH = 2, EPI_SIGMOID = 3, EPI_SILU = 4, EPI_RELU = 5, EPI_TANH = 6, EPI_EXP = 7,
  EPI_SCALE = 8, EPI_ADD = 16, EPI_SUB = 17, EPI_MUL = 18, EPI_DIV = 19
};

static inline float npu_unary(int op, float v, float imm) {
  switch (op) {
    case EPI_GELU: return npu_gelu(v);
    case EPI_GELU_TANH: return npu_gelu_tanh(v);
    case EPI_SIGMOID: return npu_sigmoid(v);
    case EPI_SILU: return npu_silu(v);
    case EPI_RELU: return v > 0.0f ? v : 0.0f;
    case EPI_TANH: return npu_tanh(v);
    case EPI_EXP: return npu_exp(v);
    case EPI_SCALE: return v * imm;
    default: return v;
  }
}

static inline float npu_binary(int op, float a, float b) {
  switch (op) {
    case EPI_ADD: return a + b;
    case EPI_SUB: return a - b;
    case EPI_MUL: return a * b;
    case EPI_DIV: return a / b;
    default: return a;
  }
}

// ---- operands of either storage type -------------------------------------------------------------------
// Activations are bf16 on the device except the residual stream (fp32), and weight vectors (biases, norm
// scales) are fp32 (sdk/compiler/memory.py, layout.py): a kernel reads each operand through its dtype.
struct npu_vec {
  const void *p;
  int32_t f32;
  int32_t scalar;  // one value broadcast along the row (a scalar constant, a per-row factor)
};
static inline float npu_get(npu_vec v, int32_t i) {
  if (v.scalar) i = 0;
  return v.f32 ? ((const float *)v.p)[i] : to_f32(((const bf16 *)v.p)[i]);
}
static inline void npu_put(void *y, int32_t f32, int32_t i, float v) {
  if (f32)
    ((float *)y)[i] = v;
  else
    ((bf16 *)y)[i] = to_bf16(v);
}

// A matmul / convolution operand as the MACs read it: bf16 (an fp32 residual-stream value is rounded on load).
static inline float npu_mac_operand(npu_vec v, int32_t i) {
  return v.f32 ? to_f32(to_bf16(((const float *)v.p)[i])) : to_f32(((const bf16 *)v.p)[i]);
}

// Streaming kernels receive two objects per row piece: `rows` (the operands that differ per row, joined in
// the memtile) and `shared` (those every row shares, joined and broadcast), and a map saying where kernel
// input i lives: map[i] = shared << 15 | fp32 << 14 | offset in 32-bit words. The map lists the head
// inputs, then the epilogue operands, so chain slot s is input n_head + s. Bit 13 marks a scalar operand: one
// fp32 value per row piece (the DMAs cannot repeat an element; the kernel does).
static inline npu_vec npu_operand(const void *rows, const void *shared, const int32_t *map, int32_t i) {
  const int32_t code = map[i];
  const char *base = (const char *)((code >> 15) & 1 ? shared : rows);
  npu_vec v = {base + 4 * (code & 0x1fff), (code >> 14) & 1, (code >> 13) & 1};
  return v;
}

// The chain applied to element `i` of the result; operands[s] is the slot-s operand (same element order).
static inline float npu_epilogue(float v, int32_t i, const int32_t *chain, int32_t n_chain, const float *imm,
                                 const npu_vec *operands) {
  for (int32_t c = 0; c < n_chain; ++c) {
    int32_t word = chain[c], op = word & 0xff, slot = (word >> 8) & 0xf, swap = (word >> 12) & 1;
    if (op < EPI_ADD) {
      v = npu_unary(op, v, imm[c]);
    } else {
      float other = npu_get(operands[slot], i);
      v = swap ? npu_binary(op, other, v) : npu_binary(op, v, other);
    }
  }
  return v;
}

// The epilogue operands of a streaming kernel with n_head head inputs (unused slots point anywhere).
static inline void npu_epilogue_operands(const void *rows, const void *shared, const int32_t *map, int32_t n_head,
                                         int32_t n_chain, const int32_t *chain, npu_vec *operands) {
  operands[0] = operands[1] = npu_operand(rows, shared, map, 0);
  for (int32_t c = 0; c < n_chain; ++c)
    if ((chain[c] & 0xff) >= EPI_ADD) {
      int32_t slot = (chain[c] >> 8) & 0xf;
      operands[slot] = npu_operand(rows, shared, map, n_head + slot);
    }
}

// A kernel with no operand tiles in its chain (the design refuses chains that read one).
static inline float npu_epilogue_unary(float v, const int32_t *chain, int32_t n_chain, const float *imm) {
  for (int32_t c = 0; c < n_chain; ++c) v = npu_unary(chain[c] & 0xff, v, imm[c]);
  return v;
}
