// A parsed chat request's conversation as the pipeline takes it: the turn to answer, the system
// turn, the earlier turns, and every user turn's media as bytes (audio first, then images, the
// order the prompt gives them). Shared by `serve` and `generate --messages`.
#pragma once

#include <vector>

#include "model_runner/runner/chat_inputs.h"
#include "worker/http/openai_protocol.h"
#include "worker/pipeline/stage.h"

namespace omni::http {

void to_conversation(const ChatCompletionRequest& request, models::ChatRequest& chat,
                     std::vector<pipeline::MediaFile>& media);

}  // namespace omni::http
