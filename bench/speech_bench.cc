// speech-bench: runs one spoken answer through a whole Qwen3-Omni checkpoint (thinker -> talker
// -> code predictor -> code2wav) in the stage pipeline `generate --model` runs, under each
// offload strategy, and prints one JSON line per strategy: talker frames/s, the code predictor's
// share, code2wav real-time factor, time to first audio, each stage's peak device bytes of
// weights, bytes moved, and whether codes and waveform equal the no-offload run. Without --model it
// writes a random checkpoint: the fixture's shapes (tiny) or the released checkpoint's talker and
// code2wav shapes behind a cheap thinker (real).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_args.h"
#include "cpu_offload/check.h"
#include "model_runner/qwen3_omni/omni_options.h"
#include "model_runner/runner/synthetic_checkpoint.h"
#include "worker/config/stage_overrides.h"
#include "worker/pipeline/local_pipeline.h"

namespace {

using namespace omni;
using Json = nlohmann::json;

struct Options {
  std::string model;
  std::string synthetic = "tiny";
  int64_t talker_layers = 0;
  std::string work_dir;
  std::string assets = OMNI_DEFAULT_ASSETS;
  std::string strategies = "none,thinker-talker,talker-code2wav,talker-layers,layerwise";
  int64_t tokens = 12;
  int64_t frames = 16;
  int repeats = 3;
  std::string device = "cpu";
  std::string dtype = "float32";
  double sim_bandwidth_gbps = 0;
  int threads = 0;
  bool no_pin = false;
  std::string text = "Say something nice.";
};

// The strategy as the command line's flags (--cpu-offload-components and friends).
config::EngineFlags flags_for(const std::string& strategy, const Options& o) {
  using config::engine_flag;
  config::EngineFlags f = {engine_flag("cpu_offload_pin_memory", {o.no_pin ? "false" : "true"})};
  const auto components = [&](std::vector<std::string> names, const char* policy) {
    f.push_back(engine_flag("cpu_offload_components", std::move(names)));
    f.push_back(engine_flag("cpu_offload_strategy", {policy}));
  };
  if (strategy == "none") return f;
  if (strategy == "thinker-talker")
    components({"thinker", "talker"}, "alternating");
  else if (strategy == "talker-code2wav")
    components({"talker", "code2wav"}, "alternating");
  else if (strategy == "talker-layers")
    components({"talker.model.layers.*"}, "sequential");
  else if (strategy == "layerwise")
    f.push_back(engine_flag("enable_layerwise_offload", {"true"}));
  else {
    OMNI_THROW("--strategies: unknown strategy '", strategy,
               "' (none, thinker-talker, talker-code2wav, talker-layers, layerwise)");
  }
  return f;
}

// Each stage's offload figures, {"stage 0 (thinker)": {...}, ...} (the device ledger left out).
Json stage_stats(pipeline::Pipeline& p) {
  Json all = Json::parse(p.stats_json());
  all.erase("device_ledger");
  return all;
}

std::string json_number(double v) {
  std::ostringstream out;
  out.precision(6);
  out << v;
  return out.str();
}

int run(const Options& o) {
  namespace fs = std::filesystem;
  if (o.threads > 0) at::set_num_threads(o.threads);
  const auto dtype = bench::parse_dtype(o.dtype);
  std::string model_dir = o.model;
  std::string model_name = o.model;
  if (model_dir.empty()) {
    const std::string work = o.work_dir.empty()
                                 ? (fs::temp_directory_path() / "omni_speech_bench").string()
                                 : o.work_dir;
    model_dir = work + "/" + o.synthetic;
    const auto thinker =
        models::synthetic_thinker_config(o.synthetic == "real" ? "speech-real" : "tiny");
    const auto speech = models::synthetic_speech_config(o.synthetic, thinker, o.talker_layers);
    std::cerr << "speech-bench: writing a synthetic '" << o.synthetic << "' checkpoint to "
              << model_dir << "\n";
    const auto bytes = models::write_synthetic_checkpoint(
        model_dir, thinker, o.assets, dtype == at::kFloat ? at::kFloat : at::kBFloat16, 0, &speech);
    model_name = "synthetic-" + o.synthetic + " (" + std::to_string(bytes) + " bytes)";
  }

  offload::TransferEngineOptions engine_options;
  engine_options.sim_bandwidth_bytes_per_s = o.sim_bandwidth_gbps * 1e9;
  pipeline::Request request;
  request.chat.text = o.text;
  auto& omni = request.parts.get<models::OmniOptions>();
  omni.sampling.set_greedy(true);
  omni.sampling.thinker.max_new_tokens = o.tokens;
  omni.max_audio_frames = o.frames;

  pipeline::PipelineResult baseline;
  bool have_baseline = false;
  for (const auto& strategy : bench::split_list(o.strategies)) {
    auto config = pipeline::checkpoint_stage_config(model_dir, o.device, o.dtype);
    config::apply_stage_flags(config, flags_for(strategy, o), "");
    auto p = pipeline::make_local_pipeline(config, o.device, engine_options);
    p->generate(request);  // warm-up
    const Json before = stage_stats(*p);
    // Timings are the median over the measured requests (the codes are the same every time).
    std::vector<pipeline::PipelineResult> runs;
    for (int i = 0; i < o.repeats; ++i) runs.push_back(p->generate(request));
    const Json after = stage_stats(*p);
    auto result = runs.front();
    for (auto& [name, value] : result.timings) {
      std::vector<double> v;
      for (const auto& r : runs) v.push_back(r.timings.at(name));
      std::sort(v.begin(), v.end());
      value = v[v.size() / 2];
    }
    if (!have_baseline && strategy == "none") {
      baseline = result;
      have_baseline = true;
    }
    // Per stage: its peak device and resident bytes, and what the measured requests moved.
    Json stages = Json::object();
    for (const auto& [name, s] : after.items()) {
      const Json& b = before[name];
      stages[name] = {
          {"peak_device_bytes", s.value("peak_device_bytes", 0)},
          {"resident_bytes", s.value("resident_bytes", 0)},
          {"param_bytes", s.value("param_bytes", 0)},
          {"bytes_h2d", s.value("bytes_h2d", uint64_t{0}) - b.value("bytes_h2d", uint64_t{0})},
          {"loads", s.value("loads", uint64_t{0}) - b.value("loads", uint64_t{0})},
          {"stall_ms", s.value("stall_ms", 0.0) - b.value("stall_ms", 0.0)}};
    }
    const auto t = [&](const char* name) { return result.timings.at(name); };
    const int64_t frames = result.audio.codes.defined() ? result.audio.codes.size(1) : 0;
    std::ostringstream line;
    line << "{\"model\": " << Json(model_name).dump() << ", \"strategy\": \"" << strategy
         << "\", \"device\": \"" << o.device << "\", \"dtype\": \"" << o.dtype
         << "\", \"thinker_tokens\": " << result.tokens.size() << ", \"frames\": " << frames
         << ", \"audio_seconds\": "
         << json_number(static_cast<double>(result.audio.waveform.numel()) /
                        static_cast<double>(result.audio.sample_rate))
         << ", \"thinker_prefill_ms\": " << json_number(t("thinker_prefill_ms"))
         << ", \"thinker_decode_tokens_per_s\": " << json_number(t("thinker_decode_tokens_per_s"))
         << ", \"talker_frames_per_s\": " << json_number(t("talker_frames_per_s"))
         << ", \"talker_ms\": " << json_number(t("talker_ms"))
         << ", \"code_predictor_ms\": " << json_number(t("code_predictor_ms"))
         << ", \"code_predictor_ms_per_frame\": "
         << json_number(frames ? t("code_predictor_ms") / static_cast<double>(frames) : 0)
         << ", \"code2wav_ms\": " << json_number(t("code2wav_ms"))
         << ", \"code2wav_real_time_factor\": " << json_number(t("code2wav_real_time_factor"))
         << ", \"time_to_first_audio_ms\": " << json_number(t("time_to_first_audio_ms"))
         << ", \"total_ms\": " << json_number(t("total_ms")) << ", \"repeats\": " << o.repeats
         << ", \"stages\": " << stages.dump();
    if (have_baseline && strategy != "none") {
      const bool codes_equal = at::equal(result.audio.codes, baseline.audio.codes);
      const bool wav_equal = at::equal(result.audio.waveform, baseline.audio.waveform);
      line << ", \"codes_equal_to_none\": " << (codes_equal ? "true" : "false")
           << ", \"wav_equal_to_none\": " << (wav_equal ? "true" : "false");
    } else {
      line << ", \"codes_equal_to_none\": null, \"wav_equal_to_none\": null";
    }
    line << "}";
    std::cout << line.str() << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "speech-bench: the talker, code predictor and code2wav in the stage pipeline under each "
      "offload strategy; one JSON line per strategy"};
  app.add_option("--model", o.model, "a Qwen3-Omni checkpoint directory (default: synthetic)");
  app.add_option("--synthetic", o.synthetic,
                 "shapes of the random checkpoint written when --model is absent: tiny (the "
                 "test fixture's) or real (Qwen3-Omni-30B-A3B's talker and code2wav)")
      ->check(CLI::IsMember({"tiny", "real"}))
      ->capture_default_str();
  app.add_option("--talker-layers", o.talker_layers,
                 "synthetic: talker decoder layers (0 = the preset's: 20 for real)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--work-dir", o.work_dir, "where the synthetic checkpoint goes (default: temp)");
  app.add_option("--assets", o.assets, "tokenizer.json and preprocessor_config.json")
      ->capture_default_str();
  app.add_option("--strategies", o.strategies,
                 "comma-separated: none, thinker-talker (the two stages take turns on the "
                 "device), talker-code2wav, talker-layers, layerwise")
      ->capture_default_str();
  app.add_option("--tokens", o.tokens, "thinker tokens (its text is what the talker speaks)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--frames", o.frames, "talker frames cap (80 ms each)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--device", o.device, "cpu (the simulated device) or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--dtype", o.dtype, "compute dtype (and the synthetic checkpoint's)")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}))
      ->capture_default_str();
  app.add_option("--sim-bandwidth-gbps", o.sim_bandwidth_gbps,
                 "simulated device: throttle copies to X GB/s (0 = unthrottled)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--threads", o.threads, "intra-op threads (0 = LibTorch's default)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--repeats", o.repeats,
                 "measured requests per strategy after a warm-up; timings are their median")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--no-pin", o.no_pin, "pageable host memory");
  app.add_option("--text", o.text, "the user's text")->capture_default_str();
  return bench::bench_main(app, argc, argv, [&] { return run(o); });
}
