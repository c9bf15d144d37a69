// One decode step's attention (one query per row, no mask) on CPU float32 in one pass per row:
// the dot products, the softmax and the weighted sum of values, with grouped-query heads read in
// place. ATen spends about ten small ops per row and layer on this (matmul, scale, softmax,
// matmul, views), which is most of a small model's decode step on the CPU and grows with every
// row a batch adds.
#pragma once

#include <ATen/ATen.h>

#include <utility>
#include <vector>

#include "model_runner/kv/kv_cache.h"

namespace omni::models::qwen3_omni {

// A row's (or a batch's) cached keys and values: [n, kv_heads, len, d] views (a KvCache's).
using models::KeysValues;

// The most heads * len * d a row may take: up to there the ops' fixed costs dominate and one
// pass is faster; beyond it BLAS and a vectorized exp win (a 2-core EPYC: 1.5 against 6.9 us
// for 4 heads of 16 over 30 keys, 39 against 24 us for 32 heads of 128 over 64 keys).
constexpr int64_t kDecodeAttentionMaxWork = 32768;

// Whether decode_attention applies: q [b, heads, 1, d] and every keys/values view
// [n, kv_heads, len, d] CPU float32 with the last dimension contiguous, heads a multiple of
// kv_heads, heads * len * d at most kDecodeAttentionMaxWork, and either one view per row
// (n = 1) or one view for all rows (n = b).
bool decode_attention_applies(const at::Tensor& q, const std::vector<KeysValues>& kv);

// softmax((q @ k^T) * scale) @ v for each row and head, query head h reading key/value head
// h / (heads / kv_heads): [b, 1, heads * d], contiguous. The scores are rounded as float32
// products scaled in float32, as the reference's ops round them; a row gives the same bits
// alone or in any batch. Only where decode_attention_applies.
at::Tensor decode_attention(const at::Tensor& q, const std::vector<KeysValues>& kv, float scale);

}  // namespace omni::models::qwen3_omni
