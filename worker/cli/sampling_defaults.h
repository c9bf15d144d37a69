// A stage YAML's default_sampling_params applied to one request, where its sender gave no value:
// sender > YAML > the runner's defaults. `generate` names what its flags gave; `serve` gives none
// (a request's own values are in Request::sampling, which wins over the YAML's).
#pragma once

#include <set>
#include <string>

#include "worker/config/stage_config.h"
#include "worker/pipeline/request.h"

namespace omni::cli {

// `given` holds the values the sender set: "temperature", "top_p", "top_k",
// "repetition_penalty", "max_tokens", "seed", "greedy" for the thinker, and the same names with
// "talker." for the talker ("talker.max_tokens" is its frame cap; "talker.seed" and
// "talker.greedy" also hold for the code predictor).
void apply_sampling_defaults(pipeline::Request& request, const config::PipelineConfig& config,
                             const std::set<std::string>& given);

// The names above for `generate`'s flags that were given ("--seed" gives "seed" and
// "talker.seed").
std::set<std::string> sampling_given_by_flags(const std::set<std::string>& flags);

}  // namespace omni::cli
