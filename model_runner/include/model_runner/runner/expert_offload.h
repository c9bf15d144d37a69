// Expert-level offload of a Qwen3 MoE text model: the bridge between SparseMoe (which experts a
// forward hit, which the next layer will likely hit) and the engine's device expert cache
// (cpu_offload/expert_cache.h), which holds the experts as units of their own.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cpu_offload/expert_cache.h"
#include "model_runner/qwen3_omni/text_model.h"

namespace omni::models {

// Budget text as the CLI and the stage YAML take it: "25%" (of all experts' bytes), a byte count
// ("805306368"), or one with a unit as the stage config takes them ("768MiB", "1.5GiB",
// "512MB": KB/MB/GB/TB powers of 1000, KiB/MiB/GiB/TiB powers of 1024). Sets exactly one of
// `bytes` / `fraction` (the other to 0). Throws omni::Error naming `option` on bad text.
void parse_expert_cache_budget(const std::string& text, const std::string& option, size_t* bytes,
                               double* fraction);

class ExpertOffload final : public qwen3_omni::ExpertProvider {
 public:
  // The experts of `model` (module paths `<prefix>layers.<L>.mlp.experts.<E>`, e.g. prefix
  // "model." for a thinker root) are in `cache`. Sets itself as the model's provider; the
  // destructor unsets it. With `prefetch`, every MoE layer predicts the next one's experts.
  ExpertOffload(qwen3_omni::TextModel& model, const std::string& prefix,
                offload::ExpertCache& cache, bool prefetch);
  ~ExpertOffload() override;
  ExpertOffload(const ExpertOffload&) = delete;
  ExpertOffload& operator=(const ExpertOffload&) = delete;

  size_t capacity() const override;
  std::vector<bool> prepare(int64_t layer, const std::vector<int64_t>& experts,
                            const std::vector<int64_t>& rows) override;
  // With the host or auto miss policy.
  bool may_run_on_host() const override;
  // With prefetch on, while the cache's prefetch gate is open (ExpertCache::prefetch_wanted).
  bool wants_prediction(int64_t layer) override;
  void prefetch(int64_t layer, const std::vector<int64_t>& experts) override;
  void host_computed(int64_t layer, int64_t expert, int64_t rows, double ms) override;

  offload::ExpertCache& cache() { return cache_; }

 private:
  int key(int64_t layer, int64_t expert) const;

  qwen3_omni::TextModel& model_;
  offload::ExpertCache& cache_;
  bool prefetch_;
  int64_t num_experts_ = 0;
  std::vector<std::vector<int>> keys_;  // [layer][expert] -> cache key (-1: not an expert)
  std::vector<double> flops_per_row_;   // per cache key: 2 x the expert's parameters
};

}  // namespace omni::models
