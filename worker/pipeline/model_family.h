// The one registry of model families. A family (a folder of its own under worker/, or a test's)
// registers itself from its own folder with RegisterModelFamily; the orchestrator, the stage
// config schema and the command line find kinds, hand-offs, a checkpoint's default graph and
// sampling defaults here, and name no family.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "worker/config/stage_config.h"
#include "worker/pipeline/request.h"
#include "worker/pipeline/stage_kind.h"

namespace omni::pipeline {

// What `--model DIR` runs: the stages of the checkpoint in DIR.
struct CheckpointGraphOptions {
  std::string model_dir;  // absolute, normalised
  std::string devices;    // runtime.devices of every stage: "cpu" | "0"
  std::string dtype;      // engine_args.dtype ("" = the checkpoint's)
  std::string where;      // "--model DIR": the config's path in messages
};

// What a video request leaves unset takes, from a checkpoint that makes video (serve's
// /v1/videos: a request's `seconds` become frames at `fps`, and its cost cap is from these).
struct VideoDefaults {
  int64_t fps = 16;
  int64_t width = 0, height = 0, frames = 0, steps = 0;
};

// What an image request leaves unset takes, from a checkpoint that makes images (serve's
// /v1/images/generations: its pixel cap is from these), and how many images a request may give
// it to edit (0: it makes images from text only).
struct ImageDefaults {
  int64_t width = 0, height = 0;
  int64_t max_input_images = 0;
};

class ModelFamily {
 public:
  virtual ~ModelFamily() = default;
  // Its name (lower case, a word): in messages and in `vllm-omni --help`.
  virtual std::string name() const = 0;
  virtual const std::vector<StageKind>& stage_kinds() const = 0;
  // The hand-offs between its kinds (and from other families' kinds into its own).
  virtual const std::vector<Handoff>& handoffs() const;
  // `--model DIR`: whether DIR is a checkpoint of this family (a file that marks it, such as
  // config.json or model_index.json), what marks one (for the message when none claims DIR), and
  // its stage graph. A family that only runs from stage configs claims none.
  virtual bool claims_checkpoint(const std::string& model_dir) const;
  virtual std::string checkpoint_marker() const { return ""; }
  virtual config::PipelineConfig checkpoint_graph(const CheckpointGraphOptions& options) const;
  // `--model DIR`'s video defaults when its checkpoint makes video; nullopt otherwise.
  virtual std::optional<VideoDefaults> video_defaults(const std::string& model_dir) const;
  // `--model DIR`'s image defaults when its checkpoint makes images; nullopt otherwise.
  virtual std::optional<ImageDefaults> image_defaults(const std::string& model_dir) const;
  // A stage config's default_sampling_params of `stage` (one of its kinds) onto `request`,
  // except the names in `given` (set on the command line: "temperature", "<kind>.top_k").
  virtual void apply_sampling_defaults(const config::StageConfig& stage,
                                       const std::set<std::string>& given, Request& request) const;
};

// Adds `family` and its kinds to the registry (and the kind names to the stage config schema).
// Throws omni::Error when one of its kinds or hand-offs has a name already registered.
void register_model_family(std::unique_ptr<ModelFamily> family);
// Every registered family, in the order they registered.
std::vector<const ModelFamily*> model_families();
// The family of kind `model_stage`, or null.
const ModelFamily* family_of_kind(const std::string& model_stage);
// The family that claims `model_dir`; throws omni::Error naming what each family looks for when
// none does, or the families when more than one does.
const ModelFamily& family_of_checkpoint(const std::string& model_dir);

// One stage of a checkpoint's default graph, as the YAML would write it (for checkpoint_graph).
config::StageConfig checkpoint_stage(const CheckpointGraphOptions& options, int64_t id,
                                     const std::string& model_stage, std::vector<int64_t> sources,
                                     const std::string& final_output_type);

// A family registers itself with a namespace-scope object in its folder:
//   const RegisterModelFamily<MyFamily> registered;
// Its library links with whole-archive (worker/CMakeLists.txt: omni::model_families), so the
// object is kept although nothing names it.
template <typename Family>
struct RegisterModelFamily {
  RegisterModelFamily() { register_model_family(std::make_unique<Family>()); }
};

}  // namespace omni::pipeline
