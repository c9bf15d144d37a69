#include "snake_beta.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>

namespace omni::models::qwen3_omni {

namespace {

// Beyond this |x * alpha| the three-part pi/2 reduction below loses bits (as in Cephes' sinf);
// a tensor with such a value takes the reference's ops instead.
constexpr float kLargestArgument = 8192.0f;

// One channel's row: y = x + inv_beta * sin(x * alpha)^2. The sine reduces to [-pi/4, pi/4]
// and evaluates Cephes' single-precision sine or cosine polynomial there (within 2 ulp of sin);
// the square drops the quadrant's sign, so only its parity picks the polynomial. Branch-free,
// so the compiler vectorizes it for the instruction set of the function it is inlined into.
// Returns whether some argument was too large for the reduction.
inline __attribute__((always_inline)) int snake_beta_row(const float* x, float* y, int64_t n,
                                                         float alpha, float inv_beta) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding then subtracting it rounds to even
  int too_large = 0;
  for (int64_t t = 0; t < n; ++t) {
    const float a = x[t] * alpha;
    too_large |= static_cast<int>(std::fabs(a) > kLargestArgument);
    const float j = (a * 0.636619772367581343f + kRound) - kRound;  // nearest multiple of pi/2
    const float r =
        ((a - j * 1.5703125f) - j * 4.837512969970703125e-4f) - j * 7.54978995489188216e-8f;
    const float z = r * r;
    const float sin_r =
        r + r * z * ((-1.9515295891e-4f * z + 8.3321608736e-3f) * z - 1.6666654611e-1f);
    const float cos_r =
        1.0f - 0.5f * z +
        z * z * ((2.443315711809948e-5f * z - 1.388731625493765e-3f) * z + 4.166664568298827e-2f);
    // 1 where j is odd (sin^2 is cos_r^2 there), else 0: an exact blend without a branch.
    const float half = (j * 0.5f + kRound) - kRound;
    const float odd = (j - 2.0f * half) * (j - 2.0f * half);
    const float s2 = odd * (cos_r * cos_r) + (1.0f - odd) * (sin_r * sin_r);
    y[t] = x[t] + inv_beta * s2;
  }
  return too_large;
}

// The row for AVX-512, AVX2 and the baseline, picked once by what the CPU has. A dispatch of our
// own rather than GCC's target_clones: an ifunc resolver runs before a sanitizer's runtime is up.
using SnakeRow = int (*)(const float*, float*, int64_t, float, float);
__attribute__((target("avx512f"))) int snake_beta_row_avx512(const float* x, float* y, int64_t n,
                                                             float alpha, float inv_beta) {
  return snake_beta_row(x, y, n, alpha, inv_beta);
}
__attribute__((target("avx2"))) int snake_beta_row_avx2(const float* x, float* y, int64_t n,
                                                        float alpha, float inv_beta) {
  return snake_beta_row(x, y, n, alpha, inv_beta);
}
int snake_beta_row_baseline(const float* x, float* y, int64_t n, float alpha, float inv_beta) {
  return snake_beta_row(x, y, n, alpha, inv_beta);
}

SnakeRow pick_snake_beta_row() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return snake_beta_row_avx512;
  if (__builtin_cpu_supports("avx2")) return snake_beta_row_avx2;
  return snake_beta_row_baseline;
}

}  // namespace

bool fused_snake_beta_applies(const at::Tensor& x) {
  return x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 3;
}

at::Tensor snake_beta(const at::Tensor& x, const at::Tensor& alpha, const at::Tensor& inv_beta) {
  if (fused_snake_beta_applies(x)) {
    const auto in = x.contiguous();
    const auto a = alpha.to(at::kFloat).contiguous();
    const auto ib = inv_beta.to(at::kFloat).contiguous();
    auto out = at::empty_like(in);
    const int64_t channels = in.size(1), length = in.size(2);
    const float* src = in.const_data_ptr<float>();
    float* dst = out.mutable_data_ptr<float>();
    const float* a_data = a.const_data_ptr<float>();
    const float* ib_data = ib.const_data_ptr<float>();
    static const SnakeRow row_fn = pick_snake_beta_row();
    std::atomic<int> too_large{0};
    at::parallel_for(
        0, in.size(0) * channels, std::max<int64_t>(1, 32768 / std::max<int64_t>(length, 1)),
        [&](int64_t begin, int64_t end) {
          int flag = 0;
          for (int64_t row = begin; row < end; ++row) {
            const int64_t c = row % channels;
            flag |= row_fn(src + row * length, dst + row * length, length, a_data[c], ib_data[c]);
          }
          if (flag) too_large = 1;
        });
    if (!too_large) return out;
  }
  // The reference's ops, in place on one fresh tensor (products and sums commute bit for bit).
  auto out = x * alpha.view({1, -1, 1});
  out.sin_().pow_(2).mul_(inv_beta.view({1, -1, 1}));
  return out.add_(x);
}

}  // namespace omni::models::qwen3_omni
