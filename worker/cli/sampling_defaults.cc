#include "worker/cli/sampling_defaults.h"

#include <map>
#include <vector>

#include "worker/pipeline/model_family.h"

namespace omni::cli {

void apply_sampling_defaults(pipeline::Request& r, const config::PipelineConfig& config,
                             const std::set<std::string>& given) {
  for (const auto& stage : config.stages) {
    const pipeline::ModelFamily* family = pipeline::family_of_kind(stage.engine.model_stage);
    if (family != nullptr) family->apply_sampling_defaults(stage, given, r);
  }
}

std::set<std::string> sampling_given_by_flags(const std::set<std::string>& flags) {
  static const std::map<std::string, std::vector<std::string>> kNames = {
      {"--temperature", {"temperature"}},
      {"--top-p", {"top_p"}},
      {"--top-k", {"top_k"}},
      {"--repetition-penalty", {"repetition_penalty"}},
      {"--max-tokens", {"max_tokens"}},
      {"--seed", {"seed", "talker.seed"}},
      {"--greedy", {"greedy", "talker.greedy"}},
      {"--talker-temperature", {"talker.temperature"}},
      {"--talker-top-p", {"talker.top_p"}},
      {"--talker-top-k", {"talker.top_k"}},
      {"--talker-repetition-penalty", {"talker.repetition_penalty"}},
      {"--max-audio-frames", {"talker.max_tokens"}},
  };
  std::set<std::string> names;
  for (const auto& flag : flags) {
    const auto it = kNames.find(flag);
    if (it != kNames.end()) names.insert(it->second.begin(), it->second.end());
  }
  return names;
}

}  // namespace omni::cli
