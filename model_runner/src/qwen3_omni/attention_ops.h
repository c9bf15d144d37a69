// Small attention helpers of the text decoders, the vision encoder and code2wav: the
// family-neutral ones of text_decoder_ops.h.
#pragma once

#include "text_decoder_ops.h"

namespace omni::models::qwen3_omni {

using models::repeat_kv;
using models::rotate_half;

}  // namespace omni::models::qwen3_omni
