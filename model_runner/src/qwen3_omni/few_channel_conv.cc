#include "few_channel_conv.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu_offload/check.h"

namespace omni::models::qwen3_omni {
namespace {

// GCC vector types: one register of AVX-512, AVX2 or SSE2, by the function they are used in.
typedef float V16 __attribute__((vector_size(64)));
typedef float V8 __attribute__((vector_size(32)));
typedef float V4 __attribute__((vector_size(16)));

constexpr int kBlock = 4;  // output channels a tile accumulates at once, in registers

struct ConvArgs {
  const float* x;     // one sample, [cin, length]
  const float* w;     // [cout, cin, taps]
  const float* bias;  // [cout], or null
  float* out;         // one sample, [cout, length]
  int64_t cin, cout, length, taps, dilation;
};

template <typename V>
constexpr int64_t lanes() {
  return static_cast<int64_t>(sizeof(V) / sizeof(float));
}

// Outputs t0 .. t0 + lanes of channels co .. co + N: `xs` is channel 0's input at t0 - padding
// (rows x_stride apart), `o` is where channel co's outputs go (rows o_stride apart).
template <typename V, int N>
inline __attribute__((always_inline)) void tile(const ConvArgs& a, const float* xs,
                                                int64_t x_stride, int64_t co, float* o,
                                                int64_t o_stride) {
  V acc[N];
  for (int c = 0; c < N; ++c) acc[c] = V{} + (a.bias ? a.bias[co + c] : 0.0f);
  const int64_t w_row = a.cin * a.taps;  // one output channel's weights
  const float* w = a.w + co * w_row;
  for (int64_t ci = 0; ci < a.cin; ++ci) {
    const float* row = xs + ci * x_stride;
    const float* wc = w + ci * a.taps;
    for (int64_t k = 0; k < a.taps; ++k) {
      V s;  // unaligned: memcpy rather than a cast (a vector-typed value returned would change ABI)
      std::memcpy(&s, row + k * a.dilation, sizeof(V));
      for (int c = 0; c < N; ++c) acc[c] += wc[c * w_row + k] * s;
    }
  }
  for (int c = 0; c < N; ++c) std::memcpy(o + c * o_stride, &acc[c], sizeof(V));
}

// Channels co .. co + N of the tile at t0, of which n <= lanes outputs exist.
template <typename V, int N>
inline __attribute__((always_inline)) void channels(const ConvArgs& a, const float* xs,
                                                    int64_t x_stride, int64_t co, int64_t t0,
                                                    int64_t n) {
  constexpr int64_t kLanes = lanes<V>();
  if (n == kLanes) {
    tile<V, N>(a, xs, x_stride, co, a.out + co * a.length + t0, a.length);
    return;
  }
  float partial[N * kLanes];
  tile<V, N>(a, xs, x_stride, co, partial, kLanes);
  for (int c = 0; c < N; ++c) {
    std::memcpy(a.out + (co + c) * a.length + t0, partial + c * kLanes,
                static_cast<size_t>(n) * sizeof(float));
  }
}

// Tiles [first, end) of one sample, every output channel. A tile that reaches into the causal
// padding or past the end reads a zero-padded copy of its window instead.
template <typename V>
inline __attribute__((always_inline)) void conv_tiles(const ConvArgs& a, int64_t first,
                                                      int64_t end) {
  constexpr int64_t kLanes = lanes<V>();
  const int64_t padding = (a.taps - 1) * a.dilation;
  const int64_t width = padding + kLanes;
  std::vector<float> window;
  for (int64_t t = first; t < end; ++t) {
    const int64_t t0 = t * kLanes;
    const int64_t n = std::min(kLanes, a.length - t0);
    const float* xs = nullptr;
    int64_t x_stride = a.length;
    if (t0 >= padding && n == kLanes) {
      xs = a.x + (t0 - padding);
    } else {
      window.assign(static_cast<size_t>(a.cin * width), 0.0f);
      for (int64_t ci = 0; ci < a.cin; ++ci) {
        for (int64_t j = std::max<int64_t>(0, padding - t0);
             j < width && t0 - padding + j < a.length; ++j) {
          window[static_cast<size_t>(ci * width + j)] = a.x[ci * a.length + t0 - padding + j];
        }
      }
      xs = window.data();
      x_stride = width;
    }
    int64_t co = 0;
    for (; co + kBlock <= a.cout; co += kBlock) channels<V, kBlock>(a, xs, x_stride, co, t0, n);
    for (; co < a.cout; ++co) channels<V, 1>(a, xs, x_stride, co, t0, n);
  }
}

// The tiles for AVX-512, AVX2 and the baseline, picked once by what the CPU has (our own
// dispatch, as in snake_beta.cc: an ifunc resolver runs before a sanitizer's runtime is up).
struct Kernel {
  void (*tiles)(const ConvArgs&, int64_t, int64_t);
  int64_t lanes;
};
__attribute__((target("avx512f"))) void tiles_avx512(const ConvArgs& a, int64_t first,
                                                     int64_t end) {
  conv_tiles<V16>(a, first, end);
}
__attribute__((target("avx2"))) void tiles_avx2(const ConvArgs& a, int64_t first, int64_t end) {
  conv_tiles<V8>(a, first, end);
}
void tiles_baseline(const ConvArgs& a, int64_t first, int64_t end) {
  conv_tiles<V4>(a, first, end);
}

Kernel pick_kernel() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return {tiles_avx512, lanes<V16>()};
  if (__builtin_cpu_supports("avx2")) return {tiles_avx2, lanes<V8>()};
  return {tiles_baseline, lanes<V4>()};
}

bool cpu_float(const at::Tensor& t) { return t.device().is_cpu() && t.scalar_type() == at::kFloat; }

}  // namespace

bool few_channel_conv_applies(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                              int64_t stride, int64_t groups) {
  return stride == 1 && groups == 1 && x.dim() == 3 && weight.dim() == 3 && cpu_float(x) &&
         cpu_float(weight) && x.size(1) > 0 && x.size(1) <= kFewChannelConvMaxInputs &&
         weight.size(1) == x.size(1) && weight.size(2) > 0 &&
         (!bias.defined() ||
          (cpu_float(bias) && bias.dim() == 1 && bias.size(0) == weight.size(0)));
}

at::Tensor few_channel_causal_conv(const at::Tensor& x, const at::Tensor& weight,
                                   const at::Tensor& bias, int64_t dilation) {
  OMNI_CHECK(few_channel_conv_applies(x, weight, bias, 1, 1) && dilation > 0,
             "few_channel_causal_conv: needs CPU float32 x [B, C_in <= ", kFewChannelConvMaxInputs,
             ", T], weight [C_out, C_in, K] and dilation > 0, got x ", x.sizes(), ", weight ",
             weight.sizes(), ", dilation ", dilation);
  const auto in = x.contiguous();
  const auto w = weight.contiguous();
  const auto b = bias.defined() ? bias.contiguous() : bias;
  const int64_t batch = in.size(0), length = in.size(2);
  auto out = at::empty({batch, w.size(0), length}, in.options());
  if (out.numel() == 0) return out;
  static const Kernel kernel = pick_kernel();
  const int64_t tiles = (length + kernel.lanes - 1) / kernel.lanes;
  ConvArgs args{nullptr,
                w.const_data_ptr<float>(),
                b.defined() ? b.const_data_ptr<float>() : nullptr,
                nullptr,
                in.size(1),
                w.size(0),
                length,
                w.size(2),
                dilation};
  const float* x_data = in.const_data_ptr<float>();
  float* out_data = out.mutable_data_ptr<float>();
  // Samples and their tiles as one range: a long sample splits across threads.
  at::parallel_for(0, batch * tiles, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end;) {
      const int64_t sample = i / tiles;
      const int64_t stop = std::min(end, (sample + 1) * tiles);
      ConvArgs a = args;
      a.x = x_data + sample * a.cin * length;
      a.out = out_data + sample * a.cout * length;
      kernel.tiles(a, i - sample * tiles, stop - sample * tiles);
      i = stop;
    }
  });
  return out;
}

bool few_channel_transposed_conv_applies(const at::Tensor& x, const at::Tensor& weight,
                                         const at::Tensor& bias, int64_t stride) {
  return stride > 0 && x.dim() == 3 && weight.dim() == 3 && cpu_float(x) && cpu_float(weight) &&
         x.size(1) > 0 && x.size(1) <= kFewChannelConvMaxInputs && weight.size(0) == x.size(1) &&
         weight.size(2) >= stride && weight.size(2) % stride == 0 &&
         (!bias.defined() ||
          (cpu_float(bias) && bias.dim() == 1 && bias.size(0) == weight.size(1)));
}

at::Tensor few_channel_trimmed_transposed_conv(const at::Tensor& x, const at::Tensor& weight,
                                               const at::Tensor& bias, int64_t stride) {
  OMNI_CHECK(few_channel_transposed_conv_applies(x, weight, bias, stride),
             "few_channel_trimmed_transposed_conv: needs CPU float32 x [B, C_in <= ",
             kFewChannelConvMaxInputs, ", T] and weight [C_in, C_out, K], K a multiple of the ",
             "stride, got x ", x.sizes(), ", weight ", weight.sizes(), ", stride ", stride);
  const int64_t batch = x.size(0), cin = x.size(1), length = x.size(2);
  const int64_t cout = weight.size(1), taps = weight.size(2), per_phase = taps / stride;
  // Output t = m * stride + r sums weight[.., r + j * stride] * x[m - j]: phase r is a causal
  // conv over x whose tap k is weight's r + (per_phase - 1 - k) * stride; channel r * cout + co.
  const auto phase_weights = weight.contiguous()
                                 .view({cin, cout, per_phase, stride})
                                 .permute({3, 1, 0, 2})
                                 .flip({3})
                                 .reshape({stride * cout, cin, per_phase});
  const auto phases = few_channel_causal_conv(
      x, phase_weights, bias.defined() ? bias.repeat({stride}) : bias, /*dilation=*/1);
  // The trim (taps - stride) is whole frames of m: out[co][m' * stride + r] is phase r at
  // m = m' + trim / stride.
  const int64_t trim_frames = per_phase - 1;
  const int64_t frames = length + 1 - per_phase;
  auto out = at::empty({batch, cout, std::max<int64_t>(frames, 0) * stride}, x.options());
  if (frames <= 0) return out;
  // The interleave as a loop: ATen's copy through a permuted view runs an inner loop of
  // `stride` elements.
  const float* p = phases.const_data_ptr<float>();
  float* o = out.mutable_data_ptr<float>();
  at::parallel_for(0, batch * cout, 1, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t sample = row / cout, co = row % cout;
      float* dst = o + row * frames * stride;
      for (int64_t r = 0; r < stride; ++r) {
        const float* src = p + ((sample * stride + r) * cout + co) * length + trim_frames;
        for (int64_t m = 0; m < frames; ++m) dst[m * stride + r] = src[m];
      }
    }
  });
  return out;
}

}  // namespace omni::models::qwen3_omni
