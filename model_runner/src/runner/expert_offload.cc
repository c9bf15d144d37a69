#include "model_runner/runner/expert_offload.h"

#include <cctype>
#include <cmath>

#include "cpu_offload/check.h"
#include "cpu_offload/option_values.h"

namespace omni::models {

void parse_expert_cache_budget(const std::string& text, const std::string& option, size_t* bytes,
                               double* fraction) {
  *bytes = 0;
  *fraction = 0;
  std::string t;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) t += c;
  }
  auto bad = [&]() -> void {
    OMNI_THROW(option, ": '", text,
               "' is not a budget (expected a percentage of the experts' bytes such as 25%, or "
               "bytes such as 805306368, 768MiB, 1.5GiB)");
  };
  if (t.empty()) bad();
  if (t.back() == '%') {
    size_t used = 0;
    double value = 0;
    try {
      value = std::stod(t.substr(0, t.size() - 1), &used);
    } catch (const std::exception&) {
      bad();
    }
    if (used + 1 != t.size() || !std::isfinite(value)) bad();
    OMNI_CHECK(value > 0 && value <= 100, option, ": '", text, "' must be in (0%, 100%]");
    *fraction = value / 100.0;
    return;
  }
  try {
    *bytes = offload::values::parse_byte_size(t);
  } catch (const std::invalid_argument&) {
    bad();
  }
  OMNI_CHECK(*bytes > 0, option, ": '", text, "' is 0 bytes");
}

ExpertOffload::ExpertOffload(qwen3_omni::TextModel& model, const std::string& prefix,
                             offload::ExpertCache& cache, bool prefetch)
    : model_(model), cache_(cache), prefetch_(prefetch) {
  const auto& cfg = model.config();
  num_experts_ = cfg.num_experts;
  keys_.assign(cfg.num_hidden_layers, std::vector<int>(num_experts_, -1));
  size_t found = 0;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    for (int64_t e = 0; e < num_experts_; ++e) {
      keys_[l][e] = cache.key_of(prefix + "layers." + std::to_string(l) + ".mlp.experts." +
                                 std::to_string(e));
      found += keys_[l][e] >= 0 ? 1 : 0;
    }
  }
  OMNI_CHECK(found == cache.size(), "expert offload: ", cache.size(),
             " experts in the cache but only ", found, " found under '", prefix, "layers'");
  for (size_t k = 0; k < cache.size(); ++k) {
    double params = 0;
    for (const auto& t : cache.unit(static_cast<int>(k)).tensors()) {
      params += static_cast<double>(t.nbytes) / static_cast<double>(c10::elementSize(t.dtype));
    }
    flops_per_row_.push_back(2.0 * params);
  }
  model_.set_expert_provider(this);
}

ExpertOffload::~ExpertOffload() { model_.set_expert_provider(nullptr); }

int ExpertOffload::key(int64_t layer, int64_t expert) const {
  OMNI_CHECK(layer >= 0 && layer < static_cast<int64_t>(keys_.size()) && expert >= 0 &&
                 expert < num_experts_,
             "expert offload: no expert ", expert, " in layer ", layer);
  const int k = keys_[layer][expert];
  OMNI_CHECK(k >= 0, "expert offload: expert ", expert, " of layer ", layer, " is not offloaded");
  return k;
}

size_t ExpertOffload::capacity() const {
  // With the host miss policy a miss takes no slot: every expert of a layer fits.
  if (cache_.options().miss_policy == offload::ExpertMissPolicy::kHost) {
    return static_cast<size_t>(num_experts_);
  }
  return cache_.slots();
}

std::vector<bool> ExpertOffload::prepare(int64_t layer, const std::vector<int64_t>& experts,
                                         const std::vector<int64_t>& rows) {
  std::vector<int> keys;
  keys.reserve(experts.size());
  for (int64_t e : experts) keys.push_back(key(layer, e));
  const auto placement = cache_.ensure(keys, rows);
  std::vector<bool> on_host(placement.size());
  for (size_t i = 0; i < placement.size(); ++i) {
    on_host[i] = placement[i] == offload::ExpertCache::Placement::kHost;
  }
  return on_host;
}

bool ExpertOffload::may_run_on_host() const {
  return cache_.options().miss_policy != offload::ExpertMissPolicy::kFetch;
}

bool ExpertOffload::wants_prediction(int64_t layer) {
  return prefetch_ && cache_.prefetch_wanted(key(layer, 0));
}

void ExpertOffload::prefetch(int64_t layer, const std::vector<int64_t>& experts) {
  std::vector<int> keys;
  keys.reserve(experts.size());
  for (int64_t e : experts) keys.push_back(key(layer, e));
  cache_.prefetch(keys);
}

void ExpertOffload::host_computed(int64_t layer, int64_t expert, int64_t rows, double ms) {
  cache_.record_host_compute(flops_per_row_[key(layer, expert)] * static_cast<double>(rows), ms);
}

}  // namespace omni::models
