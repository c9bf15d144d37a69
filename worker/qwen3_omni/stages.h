// The in-process stages of Qwen3-Omni's kinds (family.cc registers them).
#pragma once

#include <memory>

#include "worker/pipeline/local_stages.h"

namespace omni::pipeline::local {

std::unique_ptr<Stage> make_thinker_stage(const LocalStageOptions& options);
std::unique_ptr<Stage> make_talker_stage(const LocalStageOptions& options);
std::unique_ptr<Stage> make_code2wav_stage(const LocalStageOptions& options);

}  // namespace omni::pipeline::local
