#include "decode_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu_offload/logging.h"

namespace omni::models::qwen3_omni {
namespace {

bool cpu_float_rows(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat && t.dim() == 4 &&
         (t.size(3) <= 1 || t.stride(3) == 1);
}

// Eight running sums, then added pairwise: one order on every instruction set (no contraction
// either: -ffp-contract=off), so a row has the same bits wherever it sits in a batch.
inline __attribute__((always_inline)) float dot(const float* a, const float* b, int64_t n) {
  constexpr int kLanes = 8;
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += a[i + l] * b[i + l];
  }
  for (int width = kLanes / 2; width >= 1; width /= 2) {
    for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  }
  float sum = lanes[0];
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Where a row's query heads, keys, values and output are.
struct RowArgs {
  const float* q;  // [heads, d] at strides q_head, 1
  int64_t q_head;
  const float *keys, *values;  // [kv_heads, len, d] at strides (kv_head, position, 1)
  int64_t k_head, k_position, v_head, v_position;
  int64_t heads, kv_heads, len, d;
  float scale;
  float* out;     // [heads, d], contiguous
  float* scores;  // [heads / kv_heads, len] scratch
};

// The query heads of one KV head together, so that each key and value row is read once for
// all of them; each head's sums run in the order it would alone.
inline __attribute__((always_inline)) void attend_row(const RowArgs& a) {
  const int64_t rep = a.heads / a.kv_heads;
  for (int64_t g = 0; g < a.kv_heads; ++g) {
    const float* keys = a.keys + g * a.k_head;
    const float* values = a.values + g * a.v_head;
    for (int64_t j = 0; j < a.len; ++j) {
      const float* k = keys + j * a.k_position;
      for (int64_t r = 0; r < rep; ++r) {
        a.scores[r * a.len + j] = dot(a.q + (g * rep + r) * a.q_head, k, a.d) * a.scale;
      }
    }
    for (int64_t r = 0; r < rep; ++r) {
      float* p = a.scores + r * a.len;
      float max = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < a.len; ++j) max = std::max(max, p[j]);
      float sum = 0;
      for (int64_t j = 0; j < a.len; ++j) {
        p[j] = std::exp(p[j] - max);
        sum += p[j];
      }
      const float inverse = 1.0f / sum;
      for (int64_t j = 0; j < a.len; ++j) p[j] *= inverse;
    }
    float* out = a.out + g * rep * a.d;
    std::fill(out, out + rep * a.d, 0.0f);
    for (int64_t j = 0; j < a.len; ++j) {
      const float* v = values + j * a.v_position;
      for (int64_t r = 0; r < rep; ++r) {
        const float p = a.scores[r * a.len + j];
        float* o = out + r * a.d;
        for (int64_t e = 0; e < a.d; ++e) o[e] += p * v[e];
      }
    }
  }
}

// The same loops compiled for AVX2 and the baseline, picked once by what the CPU has (our own
// dispatch, as in snake_beta.cc: an ifunc resolver runs before a sanitizer's runtime is up).
__attribute__((target("avx2"))) void attend_row_avx2(const RowArgs& a) { attend_row(a); }
void attend_row_baseline(const RowArgs& a) { attend_row(a); }

using RowKernel = void (*)(const RowArgs&);
RowKernel pick_kernel() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") ? attend_row_avx2 : attend_row_baseline;
}

}  // namespace

bool decode_attention_applies(const at::Tensor& q, const std::vector<KeysValues>& kv) {
  if (!cpu_float_rows(q) || q.size(2) != 1 || kv.empty()) return false;
  const int64_t b = q.size(0), heads = q.size(1), d = q.size(3);
  if (kv.size() != 1 && static_cast<int64_t>(kv.size()) != b) return false;
  for (const auto& [k, v] : kv) {
    if (!cpu_float_rows(k) || !cpu_float_rows(v) || k.sizes() != v.sizes() || k.size(3) != d ||
        k.size(1) == 0 || heads % k.size(1) != 0 || k.size(2) == 0 ||
        heads * k.size(2) * d > kDecodeAttentionMaxWork) {
      return false;
    }
    if (k.size(0) != (kv.size() == 1 ? b : 1)) return false;
  }
  return true;
}

at::Tensor decode_attention(const at::Tensor& q, const std::vector<KeysValues>& kv, float scale) {
  OMNI_CHECK(decode_attention_applies(q, kv), "decode_attention: q ", q.sizes(),
             " and its keys/values do not fit (CPU float32, one query per row, ", kv.size(),
             " views)");
  static const RowKernel kernel = pick_kernel();
  const int64_t b = q.size(0), heads = q.size(1), d = q.size(3);
  at::Tensor out = at::empty({b, 1, heads * d}, q.options());
  std::vector<float> scores;
  for (int64_t r = 0; r < b; ++r) {
    const auto& [k, v] = kv.size() == 1 ? kv[0] : kv[static_cast<size_t>(r)];
    const int64_t n = kv.size() == 1 ? r : 0;  // the row's index in its view
    RowArgs a;
    a.q = q.const_data_ptr<float>() + r * q.stride(0);
    a.q_head = q.stride(1);
    a.keys = k.const_data_ptr<float>() + n * k.stride(0);
    a.values = v.const_data_ptr<float>() + n * v.stride(0);
    a.k_head = k.stride(1);
    a.k_position = k.stride(2);
    a.v_head = v.stride(1);
    a.v_position = v.stride(2);
    a.heads = heads;
    a.kv_heads = k.size(1);
    a.len = k.size(2);
    a.d = d;
    a.scale = scale;
    a.out = out.data_ptr<float>() + r * heads * d;
    scores.resize(static_cast<size_t>(heads / a.kv_heads * a.len));
    a.scores = scores.data();
    kernel(a);
  }
  return out;
}

}  // namespace omni::models::qwen3_omni
