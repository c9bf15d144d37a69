// Which parts of a model are what: the engine's view of a pipeline.
#pragma once

#include <torch/nn/module.h>

#include <string>
#include <vector>

namespace omni::offload {

struct BlockList {
  std::string path;  // dotted path of a ModuleList of blocks, e.g. "transformer.blocks"
  // Phase granularity: the children of each block that form its phases, in execution order.
  // Empty: every child of the block that holds tensors, in declaration order.
  std::vector<std::string> phases;
};

// Component paths are dotted paths from the root module.
struct ModelSpec {
  std::vector<std::string> dits;       // denoisers (several are mutually exclusive)
  std::vector<std::string> encoders;   // text / image encoders
  std::vector<std::string> vaes;       // resident unless strict_vae
  std::vector<std::string> resident;   // always on the device
  std::vector<std::string> auxiliary;  // small helpers, always on the device
  std::vector<BlockList> block_lists;  // what layerwise offload streams

  bool has_components() const { return !dits.empty() || !encoders.empty() || !vaes.empty(); }
};

// `declared` when it names components; otherwise a scan of the root's children by well-known
// names (transformer, transformer_2, dit, language_model, model; text_encoder*, image_encoder;
// vae) and of each DiT's children for block lists (blocks, transformer_blocks,
// single_transformer_blocks, layers), with a warning that says what was found.
ModelSpec resolve_model_spec(torch::nn::Module& root, const ModelSpec& declared);

}  // namespace omni::offload
