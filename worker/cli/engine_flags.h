// The engine options' command-line flags (config::engine_options()), registered the same way on
// generate, serve and worker: each flag given is checked while parsing by the option's own
// parser (a bad value is a CLI::ParseError naming the flag) and recorded for
// config::apply_stage_flags.
#pragma once

#include "worker/config/engine_options.h"

namespace CLI {
class App;
}

namespace omni::cli {

// Adds every engine option that has a flag to `app`, recording what is given in `given`.
void add_engine_flags(CLI::App& app, config::EngineFlags& given);

// After parsing, when no stage config can have turned them on: throws CLI::RequiresError for a
// flag given without any of the options it needs ("--layerwise-num-gpu-layers requires
// --enable-layerwise-offload").
void check_engine_flag_needs(const CLI::App& app);

}  // namespace omni::cli
