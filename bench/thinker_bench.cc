// thinker-bench: loads a Qwen3-Omni checkpoint (or writes a random one of a chosen size), runs
// one text + audio + image request under each offload strategy and prints one JSON line per
// strategy: prefill time, decode tokens/s, peak device bytes of weights, bytes moved, and whether
// the tokens equal the no-offload run.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_args.h"
#include "cpu_offload/check.h"
#include "model_runner/runner/synthetic_checkpoint.h"
#include "model_runner/runner/thinker_runner.h"

namespace {

using omni::models::ThinkerOffloadOptions;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string model;  // empty: a synthetic checkpoint
  std::string synthetic = "small";
  int64_t synthetic_layers = 0;  // 0: the preset's
  std::string synthetic_dtype;   // empty: bfloat16 for "real", float32 otherwise
  std::string work_dir;          // empty: a folder in the temp dir
  std::string assets = OMNI_DEFAULT_ASSETS;
  std::string strategies = "none,alternating,sequential,layerwise";
  std::optional<double> budget_bytes;
  int num_gpu_layers = 1;
  int64_t tokens = 32;
  std::string device = "cpu";
  std::string dtype = "auto";
  double sim_bandwidth_gbps = 0;
  bool no_pin = false;
  std::optional<int> threads;
  std::string text = "What do you hear and see?";
};

void add_options(CLI::App& app, Options& o) {
  using omni::bench::at_least;
  using omni::bench::parsed_by;
  app.option_defaults()->always_capture_default();
  app.add_option("--model", o.model, "a Qwen3-Omni checkpoint directory (default: a synthetic one)")
      ->type_name("DIR");
  app.add_option("--synthetic", o.synthetic,
                 "size of the random checkpoint written to --work-dir when --model is absent")
      ->type_name("tiny|small|medium|real")
      ->check(parsed_by(omni::models::synthetic_thinker_config));
  app.add_option("--synthetic-layers", o.synthetic_layers,
                 "decoder layers of the synthetic checkpoint (0: the preset's; real has 48)")
      ->type_name("N")
      ->check(at_least(0));
  app.add_option("--synthetic-dtype", o.synthetic_dtype,
                 "storage dtype of the synthetic checkpoint (default: bfloat16 for real, float32 "
                 "otherwise)")
      ->type_name("float32|bfloat16|float16")
      ->check(parsed_by(omni::bench::parse_dtype));
  app.add_option("--work-dir", o.work_dir,
                 "where the synthetic checkpoint goes (default: omni_thinker_<size> in the temp "
                 "dir)")
      ->type_name("DIR");
  app.add_option("--assets", o.assets,
                 "tokenizer.json, preprocessor_config.json, audio.wav, image.png (default: "
                 "tests/fixtures/qwen3_omni_tiny of the source tree)")
      ->type_name("DIR");
  app.add_option("--strategies", o.strategies,
                 "comma-separated: none, alternating, sequential, layerwise (decoder + encoder "
                 "layers), layerwise-decoder (decoder layers only), budget (alternating under "
                 "--budget-bytes)")
      ->type_name("LIST")
      ->check(CLI::Validator(
          [](std::string& list) -> std::string {
            const std::vector<std::string> known = {"none",      "alternating",       "sequential",
                                                    "layerwise", "layerwise-decoder", "budget"};
            std::stringstream in(list);
            for (std::string name; std::getline(in, name, ',');) {
              if (!name.empty() && std::find(known.begin(), known.end(), name) == known.end()) {
                return "unknown strategy '" + name +
                       "' (none, alternating, sequential, layerwise, layerwise-decoder, budget)";
              }
            }
            return "";
          },
          ""));
  app.add_option_function<double>(
         "--budget-bytes", [&o](const double& v) { o.budget_bytes = v; },
         "device budget for the 'budget' strategy")
      ->type_name("B")
      ->check(at_least(0));
  app.add_option("--num-gpu-layers", o.num_gpu_layers, "layerwise window")
      ->type_name("N")
      ->check(at_least(1));
  app.add_option("--tokens", o.tokens, "tokens to generate")->type_name("N")->check(at_least(1));
  app.add_option("--device", o.device, "cpu is the simulated device")
      ->type_name("cpu|cuda")
      ->check(parsed_by(omni::offload::parse_device_kind));
  app.add_option("--dtype", o.dtype, "compute dtype (auto: the checkpoint's)")
      ->type_name("auto|float32|bfloat16|float16")
      ->check(parsed_by(omni::bench::parse_dtype));
  app.add_option("--sim-bandwidth-gbps", o.sim_bandwidth_gbps,
                 "simulated device: throttle copies to X GB/s (0 = no throttle)")
      ->type_name("X")
      ->check(at_least(0));
  app.add_flag("--no-pin", o.no_pin, "pageable host memory");
  app.add_option_function<int>(
         "--threads", [&o](const int& v) { o.threads = v; },
         "intra-op threads (default: LibTorch's choice)")
      ->type_name("N")
      ->check(at_least(1));
  app.add_option("--text", o.text, "the user's text")->type_name("T");
}

ThinkerOffloadOptions offload_for(const std::string& strategy, const Options& opt) {
  ThinkerOffloadOptions o;
  o.pin_memory = !opt.no_pin;
  if (strategy == "none") return o;
  if (strategy == "layerwise" || strategy == "layerwise-decoder") {
    o.layerwise = true;
    o.layerwise_encoders = strategy == "layerwise";
    o.num_gpu_layers = opt.num_gpu_layers;
    return o;
  }
  o.cpu_offload_enabled = true;
  o.components = {"visual", "audio_tower"};
  if (strategy == "alternating" || strategy == "sequential") {
    o.strategy = strategy;
    return o;
  }
  if (strategy == "budget") {
    OMNI_CHECK(opt.budget_bytes.has_value(), "strategy 'budget' needs --budget-bytes");
    o.strategy = "alternating";
    o.device_budget_bytes = static_cast<size_t>(*opt.budget_bytes);
    return o;
  }
  OMNI_THROW("--strategies: unknown strategy '", strategy,
             "' (none, alternating, sequential, layerwise, layerwise-decoder, budget)");
}

int run(const Options& o) {
  if (o.threads) at::set_num_threads(*o.threads);
  const auto strategies = omni::bench::split_list(o.strategies);
  OMNI_CHECK(!strategies.empty(), "--strategies is empty");
  for (const auto& strategy : strategies) offload_for(strategy, o);  // reject typos up front
  const std::string& assets = o.assets;
  std::string model_dir = o.model;
  if (model_dir.empty()) {
    const std::string& preset = o.synthetic;
    model_dir = !o.work_dir.empty()
                    ? o.work_dir
                    : (std::filesystem::temp_directory_path() /
                       ("omni_thinker_" + preset +
                        (o.synthetic_layers > 0 ? "_" + std::to_string(o.synthetic_layers) : "")))
                          .string();
    const auto start = Clock::now();
    auto cfg = omni::models::synthetic_thinker_config(preset);
    if (o.synthetic_layers > 0) cfg.text.num_hidden_layers = o.synthetic_layers;
    const auto storage = omni::bench::parse_dtype(!o.synthetic_dtype.empty() ? o.synthetic_dtype
                                                  : preset == "real"         ? "bfloat16"
                                                                             : "float32");
    OMNI_CHECK(storage != at::ScalarType::Undefined, "--synthetic-dtype: give a dtype, not auto");
    const int64_t bytes = omni::models::write_synthetic_checkpoint(model_dir, cfg, assets, storage);
    std::cerr << "synthetic '" << preset << "' checkpoint (" << bytes / 1e6 << " MB) in "
              << model_dir << " in " << std::chrono::duration<double>(Clock::now() - start).count()
              << " s\n";
  }
  const int64_t tokens = o.tokens;
  omni::offload::TransferEngineOptions engine_options;
  engine_options.sim_bandwidth_bytes_per_s = o.sim_bandwidth_gbps * 1e9;
  const auto device = omni::offload::parse_device_kind(o.device);

  omni::models::ChatRequest request;
  request.text = o.text;
  request.audio_files = {assets + "/audio.wav"};
  request.image_files = {assets + "/image.png"};

  std::vector<int64_t> baseline;
  for (const auto& strategy : strategies) {
    omni::models::ThinkerRunnerOptions options;
    options.model_dir = model_dir;
    options.dtype = omni::bench::parse_dtype(o.dtype);
    options.offload = offload_for(strategy, o);
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
  CLI::App app(
      "Loads a Qwen3-Omni checkpoint (or writes a random one), runs one text + audio + "
      "image request under each offload strategy and prints one JSON line per strategy.",
      "thinker-bench");
  Options options;
  add_options(app, options);
  return omni::bench::bench_main(app, argc, argv, [&] { return run(options); });
}
