// Batched transpose of bf16 tiles: x [b][r][c] -> y [b][c][r]. The DMAs move 32-bit words, so a transpose at
// bf16 granularity (a view whose innermost stride is not 1) needs a core: the design streams [b, r, c] tiles
// through this kernel (r and c multiples of 2 so every DMA row is whole words).
#include "../include/npu_kernel.h"

#ifdef __AIENGINE__
// Vector path: 8x8 blocks; aie::transpose shuffles one 64-element block in registers.
NPU_KERNEL void transpose_bf16(const bf16 *x, bf16 *y, int32_t b, int32_t r, int32_t c) {
  if (r % 8 == 0 && c % 8 == 0) {
    for (int32_t i = 0; i < b; ++i)
      for (int32_t rb = 0; rb < r; rb += 8)
        for (int32_t cb = 0; cb < c; cb += 8) {
          aie::vector<bfloat16, 64> blk;
          for (int32_t k = 0; k < 8; ++k)
            blk.insert(k, aie::load_v<8>(x + (size_t)i * r * c + (rb + k) * c + cb));
          auto t = aie::transpose(blk, 8, 8);
          for (int32_t k = 0; k < 8; ++k)
            aie::store_v(y + (size_t)i * r * c + (cb + k) * r + rb, t.template extract<8>(k));
        }
    return;
  }
  for (int32_t i = 0; i < b; ++i)
    for (int32_t rr = 0; rr < r; ++rr)
      for (int32_t cc = 0; cc < c; ++cc) y[(size_t)i * r * c + cc * r + rr] = x[(size_t)i * r * c + rr * c + cc];
}
#else
NPU_KERNEL void transpose_bf16(const bf16 *x, bf16 *y, int32_t b, int32_t r, int32_t c) {
  for (int32_t i = 0; i < b; ++i)
    for (int32_t rr = 0; rr < r; ++rr)
      for (int32_t cc = 0; cc < c; ++cc) y[(long)i * r * c + cc * r + rr] = x[(long)i * r * c + rr * c + cc];
}
#endif

// fp32 rows in (a conv output of odd width, kept in whole words: the Whisper encoder's 125-frame bucket), bf16
// out, rounded to nearest even as every store is.
NPU_KERNEL void transpose_f32_bf16(const float *x, bf16 *y, int32_t b, int32_t r, int32_t c) {
  NPU_ROUND_EVEN();
  for (int32_t i = 0; i < b; ++i)
    for (int32_t rr = 0; rr < r; ++rr)
      for (int32_t cc = 0; cc < c; ++cc) y[(long)i * r * c + cc * r + rr] = to_bf16(x[(long)i * r * c + rr * c + cc]);
}

// fp32 in and out (an fp32 entry input read through a transpose into an fp32 entry output): no rounding.
NPU_KERNEL void transpose_f32(const float *x, float *y, int32_t b, int32_t r, int32_t c) {
  for (int32_t i = 0; i < b; ++i)
    for (int32_t rr = 0; rr < r; ++rr)
      for (int32_t cc = 0; cc < c; ++cc) y[(long)i * r * c + cc * r + rr] = x[(long)i * r * c + rr * c + cc];
}
