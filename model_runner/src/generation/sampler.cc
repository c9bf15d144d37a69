#include "model_runner/generation/sampler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <limits>
#include <utility>

#include "cpu_offload/check.h"

namespace omni::models {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// HF TopKLogitsWarper: everything strictly below the k-th largest value goes, so ties with the
// k-th value survive.
// Over the last dimension: [vocab] or [B, vocab].
at::Tensor apply_top_k(const at::Tensor& logits, int64_t top_k) {
  const int64_t k = std::min(top_k, logits.size(-1));
  const at::Tensor kth = std::get<0>(at::topk(logits, k)).narrow(-1, k - 1, 1);
  return logits.masked_fill(logits < kth, kNegInf);
}

// HF TopPLogitsWarper: sort ascending, drop the tokens whose cumulative probability (from the
// least likely up) is <= 1 - top_p, and always keep the most likely one.
// Over the last dimension: [vocab] or [B, vocab].
at::Tensor apply_top_p(const at::Tensor& logits, double top_p) {
  // Stable, so that equal logits are ordered the same way on every run.
  auto [sorted, indices] = at::sort(logits, /*stable=*/true, /*dim=*/-1, /*descending=*/false);
  const at::Tensor cumulative = at::softmax(sorted, -1).cumsum(-1);
  at::Tensor sorted_remove = cumulative <= (1.0 - top_p);
  sorted_remove.narrow(-1, sorted_remove.size(-1) - 1, 1).fill_(false);
  const at::Tensor remove = at::zeros_like(sorted_remove).scatter(-1, indices, sorted_remove);
  return logits.masked_fill(remove, kNegInf);
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

// Every suppressed id to -inf in each row of x ([vocab] or [B, vocab], CPU float32, the
// sampler's own copy: written in place).
void suppress_ids(at::Tensor& x, const std::vector<int64_t>& ids) {
  const int64_t vocab = x.size(-1);
  float* data = x.data_ptr<float>();
  for (int64_t row = 0; row < x.numel() / vocab; ++row, data += vocab) {
    for (int64_t id : ids) {
      if (id >= 0 && id < vocab) data[id] = kNegInf;
    }
  }
}

// The warpers in HF's order (temperature, top-k, top-p) and the softmax, over the last
// dimension: the distribution each row draws from.
at::Tensor warped_probs(at::Tensor x, const SamplingParams& p) {
  if (p.temperature != 1.0) x = x / p.temperature;
  if (p.top_k > 0) x = apply_top_k(x, p.top_k);
  if (p.top_p < 1.0) x = apply_top_p(x, p.top_p);
  at::Tensor probs = at::softmax(x, -1);
  OMNI_CHECK(probs.isfinite().all().item<bool>(),
             "Sampler::sample: no token has a finite logit after the warpers");
  return probs;
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
  const bool penalize = params_.repetition_penalty != 1.0 && !context.empty();
  if (penalize || !params_.suppress_tokens.empty()) x = x.clone();
  if (penalize) {
    float* data = x.data_ptr<float>();
    std::vector<bool> seen(static_cast<size_t>(vocab), false);
    const auto penalty = static_cast<float>(params_.repetition_penalty);
    for (int64_t id : context) {
      if (id < 0 || id >= vocab || seen[id]) continue;
      seen[id] = true;
      data[id] = data[id] < 0 ? data[id] * penalty : data[id] / penalty;
    }
  }
  if (!params_.suppress_tokens.empty()) suppress_ids(x, params_.suppress_tokens);

  if (params_.is_greedy()) return first_argmax(x);
  return at::multinomial(warped_probs(x, params_), 1, /*replacement=*/false, gen_).item<int64_t>();
}

std::vector<int64_t> Sampler::sample_rows(const std::vector<Sampler*>& samplers,
                                          const at::Tensor& logits) {
  const auto b = static_cast<int64_t>(samplers.size());
  OMNI_CHECK(logits.defined() && logits.dim() == 2 && logits.size(0) == b && b > 0,
             "Sampler::sample_rows: logits must be [", b, ", vocab] for ", b, " samplers");
  const SamplingParams& p = samplers[0]->params_;
  bool shared = !p.is_greedy();
  for (const auto* s : samplers) {
    const SamplingParams& q = s->params_;
    shared = shared && !q.is_greedy() && q.temperature == p.temperature && q.top_k == p.top_k &&
             q.top_p == p.top_p && q.suppress_tokens == p.suppress_tokens;
  }
  std::vector<int64_t> ids;
  if (b == 1 || !shared) {  // each row its own way (greedy rows are one pass over the row)
    for (int64_t i = 0; i < b; ++i) ids.push_back(samplers[i]->sample(logits[i]));
    return ids;
  }
  // The same steps as sample(), row-wise over the batch, then each row's own draw.
  at::Tensor x = logits.to(at::kCPU, at::kFloat).contiguous();
  OMNI_CHECK(at::isFloatingType(logits.scalar_type()) && !x.isnan().any().item<bool>(),
             "Sampler::sample_rows: logits must be floating point without NaN");
  if (!p.suppress_tokens.empty()) {
    x = x.clone();  // x may alias the caller's tensor
    suppress_ids(x, p.suppress_tokens);
  }
  const at::Tensor probs = warped_probs(x, p);
  for (int64_t i = 0; i < b; ++i) {
    ids.push_back(
        at::multinomial(probs[i], 1, /*replacement=*/false, samplers[i]->gen_).item<int64_t>());
  }
  return ids;
}

}  // namespace omni::models
