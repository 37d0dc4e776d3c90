// On-device argmax over the last axis (greedy decoding picks the next token without sending the logits to
// the host): chunks of the row update a running (best value, index) in L1; the first index wins ties, as in
// ops.argmax. x is bf16, or fp32 when x_f32. With picks, the kernel also keeps the value of a second row t at
// the running best index (Whisper's log-prob of its picked token), so no DMA needs an address the dispatch
// computes.
#include "../include/npu_kernel.h"

NPU_KERNEL void argmax_begin(float *best, int32_t *index) {
  *best = -3.0e38f;
  *index = 0;
}

// `offset` is the chunk's first column in the row.
NPU_KERNEL void argmax_chunk(const void *x, int32_t x_f32, int32_t n, int32_t offset, float *best, int32_t *index) {
  npu_vec v = {x, x_f32, 0};
  float b = *best;
  int32_t at = *index;
  for (int32_t i = 0; i < n; ++i) {
    float e = npu_get(v, i);
    if (e > b) {
      b = e;
      at = offset + i;
    }
  }
  *best = b;
  *index = at;
}

NPU_KERNEL void argmax_store(const int32_t *index, int32_t *y) { *y = *index; }

// A piece of x and of t joined in one object (t from 32-bit word t_word): the running best of x, its index,
// and t's value there.
NPU_KERNEL void argmax_chunk_pick(const void *xt, int32_t x_f32, int32_t t_word, int32_t t_f32, int32_t n,
                                  int32_t offset, float *best, int32_t *index, float *picked) {
  npu_vec v = {xt, x_f32, 0}, t = {(const char *)xt + 4 * t_word, t_f32, 0};
  float b = *best, p = offset == 0 ? npu_get(t, 0) : *picked;  // index 0 until a value beats the start
  int32_t at = *index;
  for (int32_t i = 0; i < n; ++i) {
    float e = npu_get(v, i);
    if (e > b) {
      b = e;
      at = offset + i;
      p = npu_get(t, i);
    }
  }
  *best = b;
  *index = at;
  *picked = p;
}

// One output object of 32-bit words: the index, then per pick the best of x (bit j of from_t clear) or t's
// value at the index (set).
NPU_KERNEL void argmax_store_picks(const int32_t *index, const float *best, const float *picked, void *y,
                                   int32_t n_picks, int32_t from_t) {
  int32_t *words = (int32_t *)y;
  float *values = (float *)y;
  words[0] = *index;
  for (int32_t j = 0; j < n_picks; ++j) values[1 + j] = (from_t >> j) & 1 ? *picked : *best;
}
