#include "model_runner/generation/sampler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/DistributionsHelper.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <utility>
#include <vector>

#include "cpu_offload/check.h"

namespace omni::models {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// HF TopKLogitsWarper: everything strictly below the k-th largest value goes, so ties with the
// k-th value survive. Over the last dimension of CPU float32 logits, [vocab] or [B, vocab]: the
// k-th value by selection on a copy of each row, the same value topk's k-th is, without its sort
// and its four ops per call.
at::Tensor apply_top_k(const at::Tensor& logits, int64_t top_k) {
  const int64_t vocab = logits.size(-1);
  const int64_t k = std::min(top_k, vocab);
  at::Tensor out = logits.clone(at::MemoryFormat::Contiguous);
  float* data = out.data_ptr<float>();
  std::vector<float> row_copy(static_cast<size_t>(vocab));
  for (int64_t r = 0; r < out.numel() / vocab; ++r) {
    float* row = data + r * vocab;
    std::copy(row, row + vocab, row_copy.begin());
    std::nth_element(row_copy.begin(), row_copy.begin() + (k - 1), row_copy.end(),
                     std::greater<float>());
    const float kth = row_copy[static_cast<size_t>(k - 1)];
    // A select, not a branch: which ids go is as unpredictable as the logits.
    for (int64_t j = 0; j < vocab; ++j) row[j] = row[j] < kth ? kNegInf : row[j];
  }
  return out;
}

// A key whose unsigned order is the float order of `v` (not NaN), then the index: sorting the
// keys is a stable sort by value. -0 and +0 compare equal as floats, so both take +0's key.
uint64_t ascending_key(float v, int64_t index) {
  uint32_t bits = 0;
  const float canonical = v + 0.0f;  // -0 + 0 = +0
  std::memcpy(&bits, &canonical, sizeof(bits));
  bits = (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
  return (static_cast<uint64_t>(bits) << 32) | static_cast<uint32_t>(index);
}

// HF TopPLogitsWarper: sort ascending, drop the tokens whose cumulative probability (from the
// least likely up) is <= 1 - top_p, and always keep the most likely one. Over the last dimension
// of CPU float32 logits, [vocab] or [B, vocab]. The numbers are ATen's for HF's ops: a stable
// ascending sort, ATen's softmax over the sorted row, cumsum as ATen's CPU kernel sums (in
// double, each sum stored as float), the threshold rounded to float; only the sort, the sums and
// the scatter back run here, row by row, instead of as eight small ops.
at::Tensor apply_top_p(const at::Tensor& logits, double top_p) {
  const at::Tensor x = logits.contiguous();
  const int64_t vocab = x.size(-1), rows = x.numel() / vocab;
  at::Tensor sorted = at::empty({rows, vocab}, x.options());
  std::vector<int64_t> order(static_cast<size_t>(rows * vocab));
  std::vector<int64_t> masked(static_cast<size_t>(rows));
  std::vector<uint64_t> keys(static_cast<size_t>(vocab));
  const float* in = x.const_data_ptr<float>();
  float* sorted_data = sorted.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = in + r * vocab;
    // -inf (top-k's cut, suppressed ids) is the least value: a stable sort puts those first, and
    // only the others need sorting. Their order among themselves never matters: they are equal,
    // their probability is 0, and the cut below starts after them.
    int64_t kept = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      keys[static_cast<size_t>(kept)] = ascending_key(row[j], j);
      kept += row[j] != kNegInf ? 1 : 0;
    }
    const int64_t first = vocab - kept;
    masked[static_cast<size_t>(r)] = first;
    std::sort(keys.begin(), keys.begin() + kept);
    int64_t* idx = order.data() + r * vocab;
    float* sorted_row = sorted_data + r * vocab;
    std::fill(sorted_row, sorted_row + first, kNegInf);
    for (int64_t i = 0; i < kept; ++i) {
      idx[first + i] = static_cast<int64_t>(keys[static_cast<size_t>(i)] & 0xffffffffu);
      sorted_row[first + i] = row[idx[first + i]];
    }
  }
  const at::Tensor probs = at::softmax(sorted, -1).contiguous();
  const float* p = probs.const_data_ptr<float>();
  const auto threshold = static_cast<float>(1.0 - top_p);
  at::Tensor out = x.clone();
  float* out_data = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    // The -inf ids add 0 to the sum and are -inf already: the sums start after them. The sums
    // only grow, so the first one past the threshold (or NaN) ends the cut.
    double cumulative = 0;
    for (int64_t j = masked[static_cast<size_t>(r)]; j + 1 < vocab; ++j) {  // the last stays
      cumulative += p[r * vocab + j];
      if (!(static_cast<float>(cumulative) <= threshold)) break;
      out_data[r * vocab + order[static_cast<size_t>(r * vocab + j)]] = kNegInf;
    }
  }
  return out.view(logits.sizes());
}

// First index of the maximum; spelled out because argmax's tie order is not documented.
int64_t first_argmax(const at::Tensor& logits) {
  const float* data = logits.const_data_ptr<float>();
  int64_t best = 0;
  for (int64_t i = 1; i < logits.size(0); ++i) {
    if (data[i] > data[best]) best = i;
  }
  return best;
}

// Whether the logits processors change anything for these parameters and context.
bool processes(const SamplingParams& p, const std::vector<int64_t>& context) {
  return (p.repetition_penalty != 1.0 && !context.empty()) || !p.suppress_tokens.empty();
}

// The logits processors on one row of CPU float32 logits (the sampler's own copy: written in
// place): HF's repetition penalty over `context`, then the suppressed ids to -inf.
void process_row(float* data, int64_t vocab, const SamplingParams& p,
                 const std::vector<int64_t>& context) {
  if (p.repetition_penalty != 1.0 && !context.empty()) {
    std::vector<bool> seen(static_cast<size_t>(vocab), false);
    const auto penalty = static_cast<float>(p.repetition_penalty);
    for (int64_t id : context) {
      if (id < 0 || id >= vocab || seen[id]) continue;
      seen[id] = true;
      data[id] = data[id] < 0 ? data[id] * penalty : data[id] / penalty;
    }
  }
  for (int64_t id : p.suppress_tokens) {
    if (id >= 0 && id < vocab) data[id] = kNegInf;
  }
}

// The warpers in HF's order (temperature, top-k, top-p) and the softmax, over the last
// dimension: the distribution each row draws from.
at::Tensor warped_probs(at::Tensor x, const SamplingParams& p) {
  if (p.temperature != 1.0) x = x / p.temperature;
  if (p.top_k > 0) x = apply_top_k(x, p.top_k);
  if (p.top_p < 1.0) x = apply_top_p(x, p.top_p);
  at::Tensor probs = at::softmax(x, -1).contiguous();
  const float* p_data = probs.const_data_ptr<float>();
  OMNI_CHECK(std::all_of(p_data, p_data + probs.numel(), [](float v) { return std::isfinite(v); }),
             "Sampler::sample: no token has a finite logit after the warpers");
  return probs;
}

// torch.multinomial(probs[i], 1) for each row, drawn as its CPU kernel draws it: argmax(p / q)
// with q ~ Exp(1) from the row's own generator, so the ids are those multinomial gives. Done
// here for the batch at once, without multinomial's per-call checks (warped_probs checked).
// `uniforms`: each row's, as draw_noise took them. q is the float exponential_ would have
// stored, computed only where it can matter: p / q is 0 where p is 0, unless q is 0 (u = 0).
// The argmax is ATen's: float division, the first index of the largest, a NaN above all.
std::vector<int64_t> draw_rows(const at::Tensor& probs, const at::Tensor& uniforms) {
  OMNI_CHECK(uniforms.sizes() == probs.sizes() && uniforms.scalar_type() == at::kDouble,
             "Sampler: noise drawn ahead for ", uniforms.sizes(), " ids, but the draw is over ",
             probs.sizes());
  // A group's slice of draw_noise's [B, draws, vocab] is read in place: rows apart, ids adjacent.
  const at::Tensor u_rows = uniforms.stride(-1) == 1 ? uniforms : uniforms.contiguous();
  const int64_t row_stride = u_rows.stride(0);     // [rows, vocab], as probs
  const float* p = probs.const_data_ptr<float>();  // contiguous: warped_probs
  const int64_t vocab = probs.size(-1);
  std::vector<int64_t> ids;
  for (int64_t r = 0; r < probs.numel() / vocab; ++r) {
    const float* p_row = p + r * vocab;
    const double* u = u_rows.const_data_ptr<double>() + r * row_stride;
    int64_t best = 0;
    float best_value = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      if (p_row[j] == 0 && u[j] != 0) continue;  // 0 / q = 0: never above the first value
      const auto q = static_cast<float>(at::transformation::exponential<double>(u[j], 1.0));
      const float v = p_row[j] / q;
      if (std::isnan(v)) {
        best = j;
        break;
      }
      if (v > best_value) {
        best = j;
        best_value = v;
      }
    }
    ids.push_back(best);
  }
  return ids;
}

}  // namespace

void SamplingParams::validate() const {
  OMNI_CHECK(std::isfinite(temperature) && temperature >= 0.0,
             "SamplingParams.temperature must be finite and >= 0, got ", temperature);
  OMNI_CHECK(top_k >= 0, "SamplingParams.top_k must be >= 0 (0 = off), got ", top_k);
  OMNI_CHECK(top_p > 0.0 && top_p <= 1.0, "SamplingParams.top_p must be in (0, 1], got ", top_p);
  OMNI_CHECK(max_new_tokens >= 0, "SamplingParams.max_new_tokens must be >= 0, got ",
             max_new_tokens);
  OMNI_CHECK(std::isfinite(repetition_penalty) && repetition_penalty > 0.0,
             "SamplingParams.repetition_penalty must be finite and > 0, got ", repetition_penalty);
}

Sampler::Sampler(SamplingParams params)
    : params_(std::move(params)), gen_(at::make_generator<at::CPUGeneratorImpl>(params_.seed)) {
  params_.validate();
}

int64_t Sampler::sample(const at::Tensor& logits, const std::vector<int64_t>& context) {
  return sample_with(logits, context, at::Tensor());
}

int64_t Sampler::sample_with(const at::Tensor& logits, const std::vector<int64_t>& context,
                             const at::Tensor& noise) {
  OMNI_CHECK(logits.defined(), "Sampler::sample: logits are undefined");
  OMNI_CHECK(at::isFloatingType(logits.scalar_type()),
             "Sampler::sample: logits must be floating point, got ", logits.scalar_type());
  const bool batch_of_one = logits.dim() == 2 && logits.size(0) == 1;
  OMNI_CHECK(logits.dim() == 1 || batch_of_one,
             "Sampler::sample: logits must be [vocab] or [1, vocab], got ", logits.sizes());
  OMNI_CHECK(logits.numel() > 0, "Sampler::sample: logits are empty");
  // One copy to the CPU in float32: the same numbers, and the same draws, on any device.
  at::Tensor x = logits.reshape({-1}).to(at::kCPU, at::kFloat).contiguous();
  OMNI_CHECK(!x.isnan().any().item<bool>(), "Sampler::sample: logits contain NaN");
  const int64_t vocab = x.size(0);

  // Logits processors, in HF's order; they apply to greedy decoding too. They write in place,
  // and x may alias the caller's tensor (to() returns it unchanged when it is CPU float32).
  if (processes(params_, context)) {
    x = x.clone();
    process_row(x.data_ptr<float>(), vocab, params_, context);
  }

  if (params_.is_greedy()) return first_argmax(x);
  return draw_rows(warped_probs(x, params_).unsqueeze(0),
                   noise.defined() ? noise.unsqueeze(0) : draw_noise({this}, 1, vocab)[0])[0];
}

std::vector<int64_t> Sampler::sample_rows(const std::vector<Sampler*>& samplers,
                                          const at::Tensor& logits,
                                          const std::vector<const std::vector<int64_t>*>& contexts,
                                          const at::Tensor& noise) {
  const auto b = static_cast<int64_t>(samplers.size());
  OMNI_CHECK(logits.defined() && logits.dim() == 2 && logits.size(0) == b && b > 0,
             "Sampler::sample_rows: logits must be [", b, ", vocab] for ", b, " samplers");
  OMNI_CHECK(contexts.empty() || static_cast<int64_t>(contexts.size()) == b,
             "Sampler::sample_rows: ", contexts.size(), " contexts for ", b, " rows");
  static const std::vector<int64_t> kNoContext;
  const auto context = [&](int64_t i) -> const std::vector<int64_t>& {
    return contexts.empty() || !contexts[i] ? kNoContext : *contexts[i];
  };
  const SamplingParams& p = samplers[0]->params_;
  bool shared = !p.is_greedy();
  for (const auto* s : samplers) {
    const SamplingParams& q = s->params_;
    shared = shared && !q.is_greedy() && q.temperature == p.temperature && q.top_k == p.top_k &&
             q.top_p == p.top_p && q.suppress_tokens == p.suppress_tokens &&
             q.repetition_penalty == p.repetition_penalty;
  }
  std::vector<int64_t> ids;
  if (b == 1 || !shared) {  // each row its own way (greedy rows are one pass over the row)
    for (int64_t i = 0; i < b; ++i) {
      ids.push_back(
          samplers[i]->sample_with(logits[i], context(i), noise.defined() ? noise[i] : noise));
    }
    return ids;
  }
  // The same steps as sample(), row-wise over the batch, then each row's own draw.
  at::Tensor x = logits.to(at::kCPU, at::kFloat).contiguous();
  OMNI_CHECK(at::isFloatingType(logits.scalar_type()) && !x.isnan().any().item<bool>(),
             "Sampler::sample_rows: logits must be floating point without NaN");
  bool cloned = false;
  for (int64_t i = 0; i < b; ++i) {
    if (!processes(p, context(i))) continue;
    if (!cloned) x = x.clone();  // x may alias the caller's tensor
    cloned = true;
    const int64_t vocab = x.size(1);
    process_row(x.data_ptr<float>() + i * vocab, vocab, p, context(i));
  }
  return draw_rows(warped_probs(x, p),
                   noise.defined() ? noise : draw_noise(samplers, 1, x.size(1)).select(1, 0));
}

at::Tensor Sampler::draw_noise(const std::vector<Sampler*>& samplers, int64_t draws,
                               int64_t vocab) {
  OMNI_CHECK(draws > 0 && vocab > 0, "Sampler::draw_noise: needs draws > 0 and vocab > 0, got ",
             draws, " and ", vocab);
  at::Tensor uniforms = at::empty({static_cast<int64_t>(samplers.size()), draws, vocab},
                                  at::TensorOptions(at::kDouble));
  double* out = uniforms.data_ptr<double>();
  const int64_t per_row = draws * vocab;
  for (size_t i = 0; i < samplers.size(); ++i) {
    if (samplers[i]->params_.is_greedy()) continue;
    // The numbers exponential_ takes from the generator, in its order (one uniform double each,
    // from random64(): two 32-bit draws, the first the high word). Drawn from a copy of its
    // engine, whose steps inline here, then put back.
    auto* gen = at::check_generator<at::CPUGeneratorImpl>(samplers[i]->gen_);
    std::lock_guard<std::mutex> lock(gen->mutex_);
    at::mt19937 engine = gen->engine();
    double* row = out + static_cast<int64_t>(i) * per_row;
    for (int64_t j = 0; j < per_row; ++j) {
      const uint64_t high = engine();
      const uint64_t low = engine();
      row[j] = at::transformation::uniform_real<double>((high << 32) | low, 0.0, 1.0);
    }
    gen->set_engine(engine);
  }
  return uniforms;
}

}  // namespace omni::models
