// thinker-chat: one chat turn with a Qwen3-Omni checkpoint (text + optional audio and image
// files), streaming the reply as it is generated. Offload flags use the stage-config names.
//   thinker-chat --model DIR --text "What do you hear?" [--audio a.wav] [--image i.png]
//       [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]
//       [--offload visual,audio_tower] [--offload-strategy alternating|sequential]
//       [--budget-bytes B] [--layerwise] [--device cpu|cuda] [--dtype float32|bfloat16|float16]
#include <iostream>
#include <sstream>

#include "../bench/bench_args.h"
#include "model_runner/runner/thinker_runner.h"

int main(int argc, char** argv) {
  return omni::bench::guarded_main("thinker-chat", [&] {
    const auto args = omni::bench::parse_args(argc, argv,
                                              {{"model", true},
                                               {"text", true},
                                               {"audio", true},
                                               {"image", true},
                                               {"system", true},
                                               {"max-tokens", true},
                                               {"temperature", true},
                                               {"top-k", true},
                                               {"top-p", true},
                                               {"seed", true},
                                               {"offload", true},
                                               {"offload-strategy", true},
                                               {"budget-bytes", true},
                                               {"layerwise", false},
                                               {"device", true},
                                               {"dtype", true}});
    OMNI_CHECK(args.has("model"), "--model DIR is required");
    omni::models::ThinkerRunnerOptions options;
    options.model_dir = args.get("model", "");
    options.dtype = omni::bench::parse_dtype(args.get("dtype", "float32"));
    auto& offload = options.offload;
    if (args.has("offload")) {
      offload.cpu_offload_enabled = true;
      offload.components.clear();
      std::stringstream list(args.get("offload", ""));
      for (std::string item; std::getline(list, item, ',');) offload.components.push_back(item);
      offload.strategy = args.get("offload-strategy", "alternating");
      offload.device_budget_bytes = static_cast<size_t>(args.number("budget-bytes", 0));
    }
    offload.layerwise = args.has("layerwise");
    auto engine = omni::offload::make_transfer_engine(
        omni::offload::parse_device_kind(args.get("device", "cpu")));
    auto runner = omni::models::ThinkerRunner::load(options, engine);

    omni::models::ChatRequest request;
    request.text = args.get("text", "");
    request.system_prompt = args.get("system", "");
    if (args.has("audio")) request.audio_files = {args.get("audio", "")};
    if (args.has("image")) request.image_files = {args.get("image", "")};
    omni::models::SamplingParams params;
    params.max_new_tokens = static_cast<int64_t>(args.number("max-tokens", 64));
    params.temperature = args.number("temperature", 0.0);  // greedy unless asked
    params.top_k = static_cast<int64_t>(args.number("top-k", 0));
    params.top_p = args.number("top-p", 1.0);
    params.seed = static_cast<uint64_t>(args.number("seed", 0));

    const auto& tokenizer = runner->tokenizer();
    const auto result = runner->generate(runner->prepare(request), params, [&](int64_t token) {
      std::cout << tokenizer.decode({static_cast<int32_t>(token)}, /*skip_special=*/true)
                << std::flush;
      return true;
    });
    std::cout << "\n[" << result.tokens.size() << " tokens, finish: " << result.finish_reason
              << "]\n";
    std::cerr << runner->offload().stats().to_json() << "\n";
    return 0;
  });
}
