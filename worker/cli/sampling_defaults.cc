#include "worker/cli/sampling_defaults.h"

#include <map>
#include <vector>

namespace omni::cli {

void apply_sampling_defaults(models::OmniRequest& r, const config::PipelineConfig& config,
                             const std::set<std::string>& given) {
  for (const auto& stage : config.stages) {
    const auto& d = stage.sampling;
    const bool talker = stage.engine.model_stage == "talker";
    if (!talker && stage.engine.model_stage != "thinker") continue;
    const std::string prefix = talker ? "talker." : "";
    const auto unset = [&](const char* name) { return given.count(prefix + name) == 0; };
    auto& p = talker ? r.sampling.talker : r.sampling.thinker;
    if (d.temperature && unset("temperature")) p.temperature = *d.temperature;
    if (d.top_p && unset("top_p")) p.top_p = *d.top_p;
    if (d.top_k && unset("top_k")) p.top_k = *d.top_k;
    if (d.repetition_penalty && unset("repetition_penalty")) {
      p.repetition_penalty = *d.repetition_penalty;
    }
    if (d.max_tokens && unset("max_tokens")) {
      (talker ? r.max_audio_frames : p.max_new_tokens) = *d.max_tokens;
    }
    if (d.seed && unset("seed")) {
      p.seed = *d.seed;
      if (talker) r.sampling.code_predictor.seed = *d.seed;
    }
    if (d.greedy && unset("greedy")) {
      p.greedy = *d.greedy;
      if (talker) r.sampling.code_predictor.greedy = *d.greedy;
    }
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
