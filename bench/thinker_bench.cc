// thinker-bench: loads a Qwen3-Omni checkpoint (or writes a random one of a chosen size), runs
// one text + audio + image request under each offload strategy and prints one JSON line per
// strategy: prefill time, decode tokens/s, peak device bytes of weights, bytes moved, and whether
// the tokens equal the no-offload run.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "bench_args.h"
#include "cpu_offload/check.h"
#include "model_runner/runner/synthetic_checkpoint.h"
#include "model_runner/runner/thinker_runner.h"

namespace {

using omni::bench::Args;
using omni::models::ThinkerOffloadOptions;
using Clock = std::chrono::steady_clock;

constexpr const char* kUsage = R"(usage: thinker-bench [options]
  --model DIR                    a Qwen3-Omni checkpoint directory (default: a synthetic one)
  --synthetic tiny|small|medium  size of the random checkpoint written when --model is absent
                                 (default small); written to --work-dir
  --work-dir DIR                 where the synthetic checkpoint goes (default: temp dir)
  --assets DIR                   tokenizer.json, preprocessor_config.json, audio.wav, image.png
                                 (default: tests/fixtures/qwen3_omni_tiny of the source tree)
  --strategies LIST              comma-separated: none, alternating, sequential, layerwise
                                 (decoder layers + encoder layers), layerwise-decoder (decoder
                                 layers only), budget (alternating under --budget-bytes)
                                 (default: none,alternating,sequential,layerwise)
  --budget-bytes B               device budget for the 'budget' strategy
  --num-gpu-layers N             layerwise window (default 1)
  --tokens N                     tokens to generate (default 32)
  --device cpu|cuda              cpu is the simulated device (default cpu)
  --dtype float32|bfloat16|float16  compute dtype (default float32)
  --sim-bandwidth-gbps X         simulated device: throttle copies to X GB/s
  --no-pin                       pageable host memory
  --threads N                    intra-op threads
  --text T                       the user's text
)";

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

ThinkerOffloadOptions offload_for(const std::string& strategy, const Args& args) {
  ThinkerOffloadOptions o;
  o.pin_memory = !args.has("no-pin");
  if (strategy == "none") return o;
  if (strategy == "layerwise" || strategy == "layerwise-decoder") {
    o.layerwise = true;
    o.layerwise_encoders = strategy == "layerwise";
    o.num_gpu_layers = static_cast<int>(args.number("num-gpu-layers", 1));
    return o;
  }
  o.cpu_offload_enabled = true;
  o.components = {"visual", "audio_tower"};
  if (strategy == "alternating" || strategy == "sequential") {
    o.strategy = strategy;
    return o;
  }
  if (strategy == "budget") {
    OMNI_CHECK(args.has("budget-bytes"), "strategy 'budget' needs --budget-bytes");
    o.strategy = "alternating";
    o.device_budget_bytes = static_cast<size_t>(args.number("budget-bytes", 0));
    return o;
  }
  OMNI_THROW("--strategies: unknown strategy '", strategy,
             "' (none, alternating, sequential, layerwise, layerwise-decoder, budget)");
}

int run(int argc, char** argv) {
  const Args args = omni::bench::parse_args(argc, argv,
                                            {{"model", true},
                                             {"synthetic", true},
                                             {"work-dir", true},
                                             {"assets", true},
                                             {"strategies", true},
                                             {"budget-bytes", true},
                                             {"num-gpu-layers", true},
                                             {"tokens", true},
                                             {"device", true},
                                             {"dtype", true},
                                             {"sim-bandwidth-gbps", true},
                                             {"no-pin", false},
                                             {"threads", true},
                                             {"text", true},
                                             {"help", false}});
  if (args.has("help")) {
    std::cout << kUsage;
    return 0;
  }
  if (args.has("threads")) at::set_num_threads(static_cast<int>(args.number("threads", 1)));
  const auto strategies = split(args.get("strategies", "none,alternating,sequential,layerwise"));
  OMNI_CHECK(!strategies.empty(), "--strategies is empty");
  for (const auto& strategy : strategies) offload_for(strategy, args);  // reject typos up front
  const std::string assets = args.get("assets", OMNI_DEFAULT_ASSETS);
  std::string model_dir = args.get("model", "");
  if (model_dir.empty()) {
    const std::string preset = args.get("synthetic", "small");
    model_dir = args.get(
        "work-dir", (std::filesystem::temp_directory_path() / ("omni_thinker_" + preset)).string());
    const auto start = Clock::now();
    const int64_t bytes = omni::models::write_synthetic_checkpoint(
        model_dir, omni::models::synthetic_thinker_config(preset), assets);
    std::cerr << "wrote synthetic '" << preset << "' checkpoint (" << bytes / 1e6 << " MB) to "
              << model_dir << " in " << std::chrono::duration<double>(Clock::now() - start).count()
              << " s\n";
  }
  const int64_t tokens = static_cast<int64_t>(args.number("tokens", 32));
  OMNI_CHECK(tokens >= 1, "--tokens must be >= 1");
  omni::offload::TransferEngineOptions engine_options;
  engine_options.sim_bandwidth_bytes_per_s = args.number("sim-bandwidth-gbps", 0) * 1e9;
  const auto device = omni::offload::parse_device_kind(args.get("device", "cpu"));

  omni::models::ChatRequest request;
  request.text = args.get("text", "What do you hear and see?");
  request.audio_files = {assets + "/audio.wav"};
  request.image_files = {assets + "/image.png"};

  std::vector<int64_t> baseline;
  for (const auto& strategy : strategies) {
    omni::models::ThinkerRunnerOptions options;
    options.model_dir = model_dir;
    options.dtype = omni::bench::parse_dtype(args.get("dtype", "float32"));
    options.offload = offload_for(strategy, args);
    auto engine = omni::offload::make_transfer_engine(device, engine_options);
    auto runner = omni::models::ThinkerRunner::load(options, engine);
    const auto inputs = runner->prepare(request);
    omni::models::SamplingParams params;
    params.greedy = true;
    params.max_new_tokens = tokens;
    params.stop_token_ids = {-1};  // never stop early: every strategy decodes `tokens` tokens
    // Warm-up request (first-touch allocations, kernel choice), then the measured one.
    runner->generate(inputs, params);
    engine->synchronize();
    runner->offload().reset_stats();
    Clock::time_point first_token;
    const auto start = Clock::now();
    const auto result = runner->generate(inputs, params, [&](int64_t) {
      if (first_token == Clock::time_point()) first_token = Clock::now();
      return true;
    });
    engine->synchronize();
    const auto end = Clock::now();
    const double prefill_ms =
        std::chrono::duration<double, std::milli>(first_token - start).count();
    const double decode_s = std::chrono::duration<double>(end - first_token).count();
    if (strategy == "none") baseline = result.tokens;
    const auto s = runner->offload().stats();
    std::cout << "{\"strategy\": \"" << strategy << "\", \"device\": \"" << s.device
              << "\", \"model_dir\": \"" << model_dir << "\", \"param_bytes\": " << s.param_bytes
              << ", \"prompt_tokens\": " << inputs.input_ids.size()
              << ", \"generated_tokens\": " << result.tokens.size()
              << ", \"prefill_ms\": " << prefill_ms << ", \"decode_tokens_per_s\": "
              << (result.tokens.size() > 1 ? (result.tokens.size() - 1) / decode_s : 0.0)
              << ", \"end_to_end_tokens_per_s\": "
              << result.tokens.size() / std::chrono::duration<double>(end - start).count()
              << ", \"peak_device_bytes\": " << s.peak_device_bytes
              << ", \"resident_bytes\": " << s.resident_bytes << ", \"bytes_h2d\": " << s.bytes_h2d
              << ", \"loads\": " << s.loads << ", \"stall_ms\": " << s.stall_ms
              << ", \"tokens_equal_to_none\": "
              << (baseline.empty() || strategy == "none"
                      ? "null"
                      : (baseline == result.tokens ? "true" : "false"))
              << "}" << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return omni::bench::guarded_main("thinker-bench", [&] { return run(argc, argv); });
}
