// The config.json checks of the Qwen3-Omni parts: the family-neutral ones of
// weights/config_checks.h (every failure names the file and the dotted field).
#pragma once

#include "weights/config_checks.h"

namespace omni::models::qwen3_omni {

using models::positive;
using models::require;

}  // namespace omni::models::qwen3_omni
