// max_pool2d (ResNet stem), one output row per call in NCHW order (ops.max_pool2d: padding counts as -inf):
// the band x [c][k][w] holds k consecutive image rows starting at the output row's first row clamped into
// [0, height - k] (one affine read); rows outside the image are padding and never win, nor do columns
// outside [0, w). The kernel knows its output row from the counter `oy` in L1. y [c][wo].
#include "../include/npu_kernel.h"

NPU_KERNEL void maxpool_row(const void *x, int32_t x_f32, void *y, int32_t y_f32, int32_t c, int32_t width, int32_t k, int32_t stride, int32_t pad,
                            int32_t wo, int32_t height, int32_t ho, int32_t *oy) {
  npu_vec xv = {x, x_f32, 0};
  const int32_t top = *oy * stride - pad;
  const int32_t bh = k < height ? k : height;  // band rows: k, or the whole image when it is smaller
  const int32_t start = top < 0 ? 0 : (top + bh > height ? height - bh : top);
  const int32_t kh_lo = top < 0 ? -top : 0, kh_hi = top + k > height ? height - top : k;
  *oy = *oy + 1 == ho ? 0 : *oy + 1;
  for (int32_t ch = 0; ch < c; ++ch)
    for (int32_t ox = 0; ox < wo; ++ox) {
      float m = -3.0e38f;
      for (int32_t r = kh_lo; r < kh_hi; ++r)
        for (int32_t s = 0; s < k; ++s) {
          const int32_t ix = ox * stride + s - pad;
          if (ix < 0 || ix >= width) continue;
          float v = npu_get(xv, (ch * bh + top + r - start) * width + ix);
          m = v > m ? v : m;
        }
      npu_put(y, y_f32, ch * wo + ox, m);
    }
}
