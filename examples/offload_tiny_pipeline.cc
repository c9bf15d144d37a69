// The library API in a few lines: build a model, apply an offload strategy, run it as usual,
// read the engine's figures.
//   offload_tiny_pipeline [cpu|cuda]
#include <ATen/ATen.h>

#include <iostream>

#include "cpu_offload/offload_backend.h"
#include "model_runner/diffusion/tiny_pipeline.h"

int main(int argc, char** argv) {
  namespace off = omni::offload;
  try {
    const off::DeviceKind device = off::parse_device_kind(argc > 1 ? argv[1] : "cpu");
    omni::models::TinyDiffusionPipeline pipe(omni::models::TinyDiffusionConfig::preset("tiny"));

    // Stream the DiT's blocks with one block in flight ahead of the one computing.
    off::OffloadConfig config = off::OffloadConfig::for_strategy(off::Strategy::kLayerwise);
    config.num_gpu_layers = 1;
    auto engine = off::make_transfer_engine(device);
    auto backend = off::apply_offload(pipe, pipe.offload_spec(), config, engine);
    auto forward = backend->forward_scope();  // every forward runs in it

    const auto prompt = omni::models::example_prompt(1, 8, pipe.config().vocab, 1);
    const auto negative = omni::models::example_prompt(1, 8, pipe.config().vocab, 2);
    const auto image = pipe.generate(prompt, negative, {}, engine->compute_device());
    std::cout << "image " << image.sizes() << " mean " << image.mean().item<double>() << "\n"
              << backend->stats().to_json() << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
}
