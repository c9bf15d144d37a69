// A pipeline's failures as an HTTP client sees them.
#pragma once

#include <string>

#include "worker/http/api_error.h"
#include "worker/pipeline/stage.h"

namespace omni::http {

// `prefix` followed by 16 random hex digits: ids of completions and of logged errors.
std::string random_id(const char* prefix);

// An internal error's text as the client gets it: without internals (public_error_message),
// with the id under which the whole text is in the server's log.
std::string published(const std::string& internal);

// A bad request is the client's (400, naming the stage that refused it), a deadline 504, a full
// stage queue 429 (retry later), a stage that cannot serve 503, anything else ours (500, naming
// the stage that failed).
ApiError stage_error(const pipeline::StageError& e);

}  // namespace omni::http
