// thinker-bench: loads a Qwen3-Omni checkpoint (or writes a random one of a chosen size), runs
// one text + audio + image request under each offload strategy and prints one JSON line per
// strategy: prefill time, decode tokens/s, peak device bytes of weights, bytes moved, and whether
// the tokens equal the no-offload run.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "bench_args.h"
#include "cpu_offload/check.h"
#include "cpu_offload/disk_probe.h"
#include "model_runner/kv/kv_block_pool.h"
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
  // Expert offload strategies (experts, experts-layerwise): one run per budget.
  std::string expert_cache_budgets = "25%";
  bool no_expert_prefetch = false;
  std::string expert_miss_policy = "fetch";
  std::string expert_eviction = "layer";
  // The disk tier: host bytes for the streamed weights (empty: no limit), read-ahead.
  std::string host_memory_budget;
  int disk_read_ahead = 2;
  int disk_reader_threads = 2;
  std::string disk_read = "pread";
  // The disk's own speed: bytes of the checkpoint read with direct 9 MiB reads after each run
  // that reads from disk (0: not measured).
  std::string raw_read_bytes = "2GiB";
  bool no_warmup = false;
  bool no_media = false;
  std::vector<int64_t> batch_sizes;
  int64_t batch_context = 0;  // prompt tokens per batch row (0: the text as it is)
  int64_t kv_block_size = 0;  // batch rows' caches in a block pool (0: growable caches)
};

// A byte count with an optional unit (805306368, 768MiB, 2GiB; KB/MB/GB powers of 1000); "0" is
// 0. The error gives the reason only: CLI11 names the flag.
size_t parse_bytes(const std::string& text, const char* flag) {
  if (text == "0") return 0;
  size_t bytes = 0;
  double fraction = 0;
  try {
    omni::models::parse_expert_cache_budget(text, flag, &bytes, &fraction);
  } catch (const std::exception&) {
    fraction = -1;
  }
  if (fraction != 0) {
    OMNI_THROW("'", text,
               "' is not a byte count (805306368, 768MiB, 2GiB; KB/MB/GB are powers of 1000)");
  }
  return bytes;
}

// The checkpoint's largest .safetensors file (where a MoE model's experts lie).
std::string largest_safetensors(const std::string& dir) {
  std::string best;
  uintmax_t best_bytes = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors" || !entry.is_regular_file()) continue;
    if (entry.file_size() > best_bytes) {
      best_bytes = entry.file_size();
      best = entry.path().string();
    }
  }
  OMNI_CHECK(!best.empty(), dir, ": no .safetensors file to measure the disk's read speed with");
  return best;
}

// Peak and current resident set of this process (VmHWM, VmRSS in /proc/self/status), bytes.
std::pair<uint64_t, uint64_t> rss_bytes() {
  std::ifstream in("/proc/self/status");
  uint64_t hwm = 0, rss = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmHWM:", 0) == 0) hwm = std::stoull(line.substr(6)) * 1024;
    if (line.rfind("VmRSS:", 0) == 0) rss = std::stoull(line.substr(6)) * 1024;
  }
  return {hwm, rss};
}

bool is_expert_strategy(const std::string& s) { return s == "experts" || s == "experts-layerwise"; }

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
                 "--budget-bytes), experts (MoE experts in a device expert cache, the rest "
                 "resident), experts-layerwise (experts cached, the rest of each decoder layer "
                 "layerwise)")
      ->type_name("LIST")
      ->check(CLI::Validator(
          [](std::string& list) -> std::string {
            const std::vector<std::string> known = {"none",      "alternating",       "sequential",
                                                    "layerwise", "layerwise-decoder", "budget",
                                                    "experts",   "experts-layerwise"};
            std::stringstream in(list);
            for (std::string name; std::getline(in, name, ',');) {
              if (!name.empty() && std::find(known.begin(), known.end(), name) == known.end()) {
                return "unknown strategy '" + name +
                       "' (none, alternating, sequential, layerwise, layerwise-decoder, budget, "
                       "experts, experts-layerwise)";
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
  app.add_option("--expert-cache-budgets", o.expert_cache_budgets,
                 "experts strategies: comma-separated expert cache budgets, each a percentage "
                 "of all experts' bytes (10%) or bytes (768MiB); one run per budget")
      ->type_name("LIST");
  app.add_flag("--no-expert-prefetch", o.no_expert_prefetch,
               "experts strategies: no next-layer expert prediction and prefetch");
  app.add_option("--expert-miss-policy", o.expert_miss_policy,
                 "experts strategies: a miss is fetched, computed on the host, or auto")
      ->type_name("fetch|host|auto")
      ->check(parsed_by(omni::offload::parse_expert_miss_policy));
  app.add_option("--expert-eviction", o.expert_eviction,
                 "experts strategies: which expert leaves a full device cache: the least "
                 "recently used, or by the MoE layers' run order")
      ->type_name("lru|layer")
      ->check(parsed_by(omni::offload::parse_expert_eviction));
  app.add_option("--host-memory-budget", o.host_memory_budget,
                 "host bytes for the streamed weights (layerwise layers, experts); beyond it "
                 "they are read from the checkpoint file when needed (the disk tier). Bytes, "
                 "or with a unit: 4GiB, 512MiB (default: no limit)")
      ->type_name("SIZE")
      ->check(
          parsed_by([](const std::string& t) { return parse_bytes(t, "--host-memory-budget"); }));
  app.add_option("--disk-read-ahead", o.disk_read_ahead,
                 "disk tier: layerwise units read ahead beyond the device window")
      ->type_name("N")
      ->check(at_least(0));
  app.add_option("--disk-reader-threads", o.disk_reader_threads,
                 "disk tier: threads that read units from the checkpoint")
      ->type_name("N")
      ->check(at_least(1));
  app.add_option("--disk-read", o.disk_read,
                 "disk tier: pread into our bounded pinned cache, or copy from the file's "
                 "mapping with the OS page cache as the only cache (llama.cpp's way)")
      ->type_name("pread|mmap")
      ->check(parsed_by(omni::offload::parse_disk_read));
  app.add_option("--raw-read-bytes", o.raw_read_bytes,
                 "disk tier: after each run that reads from disk, read this many bytes of the "
                 "checkpoint's largest file alone (direct 9 MiB reads, as the tier reads an "
                 "expert) and print each tier's read throughput as a fraction of it (0: skip)")
      ->type_name("BYTES")
      ->check(parsed_by([](const std::string& t) { return parse_bytes(t, "--raw-read-bytes"); }));
  app.add_flag("--no-warmup", o.no_warmup,
               "measure the first request (for runs too long to do twice)");
  app.add_flag("--no-media", o.no_media, "a text-only request (no audio, no image)");
  app.add_option("--batch-sizes", o.batch_sizes,
                 "after each strategy's request, decode this many different requests together "
                 "(Thinker::decode_batch, as the serving engine does) and print one more line "
                 "per size: bytes moved per generated token and per step, tokens/s")
      ->delimiter(',')
      ->type_name("N,...")
      ->check(CLI::PositiveNumber);
  app.add_option("--batch-context", o.batch_context,
                 "batch rows' prompts: the text repeated to at least this many tokens, so that "
                 "decode steps attend over a long context")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--kv-block-size", o.kv_block_size,
                 "batch rows' KV caches in one block pool of blocks of N tokens, allocated "
                 "before the prefills (as the serving stage does with kv_cache_memory_bytes); "
                 "0: each cache grows on its own by blocks of 16 tokens, copying its history")
      ->check(CLI::NonNegativeNumber);
}

// `batch` requests (the text numbered per row, so that their MoE routing differs) prefilled one
// by one, then `tokens` decode steps of all of them together: what a decode step of the serving
// engine moves to the device and how fast it goes. One JSON line.
void run_batch(const std::string& strategy, omni::models::ThinkerRunner& runner,
               omni::offload::TransferEngine& engine, omni::models::ChatRequest request,
               int64_t batch, int64_t tokens, const Options& o) {
  auto& thinker = runner.model();
  at::NoGradGuard no_grad;
  auto scope = runner.offload().forward_scope();
  std::vector<omni::models::qwen3_omni::ThinkerInputs> inputs;
  std::string text = request.text;
  for (int64_t b = 0; b < batch; ++b) {
    request.text = text + " (" + std::to_string(b + 1) + ")";
    inputs.push_back(runner.prepare(request));
    while (static_cast<int64_t>(inputs.back().input_ids.size()) < o.batch_context) {
      request.text += " " + text;
      inputs.back() = runner.prepare(request);
    }
  }
  // The pool holds every row's prompt and its tokens (one warm step, then `tokens`).
  std::shared_ptr<omni::models::KvBlockPool> pool;
  if (o.kv_block_size > 0) {
    auto shape = omni::models::qwen3_omni::kv_pool_shape(thinker.config().text, runner.dtype(),
                                                         thinker.device(), o.kv_block_size, 0);
    for (const auto& in : inputs) {
      const auto length = static_cast<int64_t>(in.input_ids.size()) + tokens + 2;
      shape.num_blocks += (length + o.kv_block_size - 1) / o.kv_block_size;
    }
    pool = std::make_shared<omni::models::KvBlockPool>(shape);
  }
  std::vector<omni::models::qwen3_omni::ThinkerState> states;
  std::vector<int64_t> next;
  for (const auto& in : inputs) {
    states.push_back(thinker.new_state());
    if (pool) {
      states.back().cache.use_pool(pool);
    } else {
      // As the serving stage's caches grew without a pool: block by block, of 16 tokens.
      states.back().cache.set_block_size(16);
    }
    const auto logits = thinker.prefill(in, states.back());
    next.push_back(logits.argmax(-1).item<int64_t>());
  }
  std::vector<omni::models::qwen3_omni::ThinkerState*> rows;
  for (auto& s : states) rows.push_back(&s);
  // One step first (warm: the batch's shapes), then the measured ones.
  auto step = [&] {
    const auto logits = thinker.decode_batch(next, rows);
    const auto best = logits.argmax(-1).contiguous();
    for (int64_t b = 0; b < batch; ++b) next[b] = best[b].item<int64_t>();
  };
  step();
  engine.synchronize();
  auto* experts = runner.expert_cache();
  const uint64_t h2d_before = engine.counters().bytes_h2d;
  const auto experts_before = experts ? experts->stats() : omni::offload::ExpertCacheStats{};
  auto kv_copies = [&] {
    std::pair<int64_t, uint64_t> sum{0, 0};
    for (const auto& s : states) {
      sum.first += s.cache.reallocations();
      sum.second += s.cache.bytes_copied();
    }
    return sum;
  };
  const auto kv_before = kv_copies();
  const auto start = Clock::now();
  for (int64_t t = 0; t < tokens; ++t) step();
  engine.synchronize();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const double bytes = static_cast<double>(engine.counters().bytes_h2d - h2d_before);
  const double generated = static_cast<double>(tokens * batch);
  const auto kv_after = kv_copies();
  std::cout << "{\"strategy\": \"" << strategy << "\", \"batch\": " << batch
            << ", \"context\": " << inputs.front().input_ids.size()
            << ", \"kv_block_size\": " << o.kv_block_size
            << ", \"kv_reallocations\": " << kv_after.first - kv_before.first
            << ", \"kv_bytes_copied_per_token\": "
            << static_cast<double>(kv_after.second - kv_before.second) / generated
            << ", \"decode_steps\": " << tokens
            << ", \"decode_tokens_per_s\": " << generated / seconds
            << ", \"bytes_h2d_per_step\": " << bytes / tokens
            << ", \"bytes_h2d_per_decode_token\": " << bytes / generated;
  if (experts) {
    const auto e = experts->stats();
    const uint64_t uses = e.uses() - experts_before.uses();
    std::cout << ", \"decode_expert_hit_rate\": "
              << (uses ? static_cast<double>(e.hits - experts_before.hits) /
                             static_cast<double>(uses)
                       : 0.0)
              << ", \"decode_expert_uses_per_step\": "
              << static_cast<double>(uses) / static_cast<double>(tokens)
              << ", \"decode_expert_bytes_per_token\": "
              << static_cast<double>(e.bytes_h2d - experts_before.bytes_h2d) / generated;
  }
  std::cout << "}" << std::endl;
}

ThinkerOffloadOptions offload_for(const std::string& strategy, const Options& opt,
                                  const std::string& expert_budget = "25%") {
  ThinkerOffloadOptions o;
  o.pin_memory = !opt.no_pin;
  if (!opt.host_memory_budget.empty()) {
    o.host_memory_budget_bytes = parse_bytes(opt.host_memory_budget, "--host-memory-budget");
  }
  o.disk_read_ahead = opt.disk_read_ahead;
  o.disk_reader_threads = opt.disk_reader_threads;
  o.disk_read = opt.disk_read;
  if (strategy == "none") return o;
  if (is_expert_strategy(strategy)) {
    o.cpu_offload_experts = true;
    omni::models::parse_expert_cache_budget(expert_budget, "--expert-cache-budgets",
                                            &o.expert_cache_budget_bytes,
                                            &o.expert_cache_budget_fraction);
    o.expert_prefetch = !opt.no_expert_prefetch;
    o.expert_miss_policy = opt.expert_miss_policy;
    o.expert_eviction = opt.expert_eviction;
    if (strategy == "experts-layerwise") {
      o.layerwise = true;
      o.layerwise_encoders = false;
      o.num_gpu_layers = opt.num_gpu_layers;
    }
    return o;
  }
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
             "' (none, alternating, sequential, layerwise, layerwise-decoder, budget, experts, "
             "experts-layerwise)");
}

int run(const Options& o) {
  if (o.threads) at::set_num_threads(*o.threads);
  const auto strategies = omni::bench::split_list(o.strategies);
  OMNI_CHECK(!strategies.empty(), "--strategies is empty");
  const auto expert_budgets = omni::bench::split_list(o.expert_cache_budgets);
  OMNI_CHECK(!expert_budgets.empty(), "--expert-cache-budgets is empty");
  // (strategy, expert budget) runs, in order; typos rejected up front.
  std::vector<std::pair<std::string, std::string>> runs;
  for (const auto& strategy : strategies) {
    if (!is_expert_strategy(strategy)) {
      offload_for(strategy, o);
      runs.emplace_back(strategy, "");
      continue;
    }
    for (const auto& budget : expert_budgets) {
      offload_for(strategy, o, budget);
      runs.emplace_back(strategy, budget);
    }
  }
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
  if (!o.no_media) {
    request.audio_files = {assets + "/audio.wav"};
    request.image_files = {assets + "/image.png"};
  }

  std::vector<int64_t> baseline;
  const size_t raw_read_bytes = parse_bytes(o.raw_read_bytes, "--raw-read-bytes");
  for (const auto& [strategy, expert_budget] : runs) {
    omni::models::ThinkerRunnerOptions options;
    options.model_dir = model_dir;
    options.dtype = omni::bench::parse_dtype(o.dtype);
    options.offload = offload_for(strategy, o, expert_budget);
    auto engine = omni::offload::make_transfer_engine(device, engine_options);
    auto runner = omni::models::ThinkerRunner::load(options, engine);
    const auto inputs = runner->prepare(request);
    omni::models::SamplingParams params;
    params.greedy = true;
    params.max_new_tokens = tokens;
    params.stop_token_ids = {-1};  // never stop early: every strategy decodes `tokens` tokens
    // Warm-up request (first-touch allocations, kernel choice), then the measured one.
    if (!o.no_warmup) runner->generate(inputs, params);
    engine->synchronize();
    runner->offload().reset_stats();
    auto* experts = runner->expert_cache();
    if (experts) experts->reset_stats();
    Clock::time_point first_token;
    // Bytes moved by the prefill (engine counter when the first token arrives): the rest are
    // the decode steps'.
    uint64_t prefill_h2d = 0;
    omni::offload::ExpertCacheStats prefill_experts;
    // Disk-tier bytes read by the time the first token arrived (layers', experts').
    uint64_t prefill_layer_reads = 0, prefill_expert_reads = 0;
    const auto start = Clock::now();
    const auto result = runner->generate(inputs, params, [&](int64_t) {
      if (first_token == Clock::time_point()) {
        first_token = Clock::now();
        prefill_h2d = engine->counters().bytes_h2d;
        if (experts) prefill_experts = experts->stats();
        if (const auto d = runner->offload().disk_stats()) prefill_layer_reads = d->read_bytes;
        if (experts && experts->disk()) prefill_expert_reads = experts->disk()->stats().read_bytes;
      }
      return true;
    });
    engine->synchronize();
    const auto end = Clock::now();
    const double prefill_ms =
        std::chrono::duration<double, std::milli>(first_token - start).count();
    const double decode_s = std::chrono::duration<double>(end - first_token).count();
    if (strategy == "none") baseline = result.tokens;
    const auto s = runner->offload().stats();
    const size_t decode_steps = result.tokens.size() > 1 ? result.tokens.size() - 1 : 1;
    std::ostringstream expert_json;
    if (experts) {
      const auto e = experts->stats();
      // The decode steps alone (the prefill hits most experts of every layer).
      const uint64_t hits = e.hits - prefill_experts.hits;
      const uint64_t uses = e.uses() - prefill_experts.uses();
      const uint64_t prefetched = e.prefetched - prefill_experts.prefetched;
      const uint64_t prefetch_hits = e.prefetch_hits - prefill_experts.prefetch_hits;
      expert_json << ", \"expert_cache_budget\": \"" << expert_budget
                  << "\", \"expert_eviction\": \"" << o.expert_eviction
                  << "\", \"expert_cache_bytes\": " << e.device_bytes
                  << ", \"expert_slots\": " << e.slots << ", \"experts\": " << e.experts
                  << ", \"expert_hit_rate\": " << e.hit_rate()
                  << ", \"expert_prefetch_hit_rate\": " << e.prefetch_hit_rate()
                  << ", \"decode_expert_hit_rate\": "
                  << (uses ? static_cast<double>(hits) / static_cast<double>(uses) : 0.0)
                  << ", \"decode_expert_prefetch_hit_rate\": "
                  << (prefetched
                          ? static_cast<double>(prefetch_hits) / static_cast<double>(prefetched)
                          : 0.0)
                  << ", \"decode_expert_bytes_per_token\": "
                  << static_cast<double>(e.bytes_h2d - prefill_experts.bytes_h2d) /
                         static_cast<double>(decode_steps)
                  << ", \"expert_stats\": " << e.to_json();
    }
    // The disk tiers' stats, taken once: the layers' and the experts'.
    const auto layer_disk = runner->offload().disk_stats();
    std::optional<omni::offload::DiskTierStats> expert_disk;
    if (experts && experts->disk()) expert_disk = experts->disk()->stats();
    // The disk's own speed on the same file, right after each run that read from it (the run
    // is not slowed by it). A virtual disk's speed drifts within minutes (1.6 to 3.1 GB/s in
    // back-to-back direct reads on the VM of bench/RESULTS.md), so each run is set against
    // the disk as it was at that time, not against one reading taken after the first run.
    const bool read_disk =
        (layer_disk && layer_disk->read_bytes > 0) || (expert_disk && expert_disk->read_bytes > 0);
    std::optional<omni::offload::SequentialRead> raw_read;
    if (read_disk && raw_read_bytes > 0) {
      raw_read =
          omni::offload::measure_sequential_read(largest_safetensors(model_dir), raw_read_bytes);
    }
    // Each tier's reads (per token over the request, and over the decode steps alone), their
    // throughput while a read ran, and that as a fraction of the disk's own speed.
    std::ostringstream disk_json;
    auto add_disk = [&](const char* key, const omni::offload::DiskTierStats& d,
                        uint64_t prefill_reads) {
      disk_json << ", \"" << key << "\": " << d.to_json() << ", \"" << key
                << "_read_bytes_per_token\": "
                << static_cast<double>(d.read_bytes) / static_cast<double>(result.tokens.size())
                << ", \"" << key << "_decode_read_bytes_per_token\": "
                << static_cast<double>(d.read_bytes - prefill_reads) /
                       static_cast<double>(decode_steps);
      if (raw_read && d.read_bytes > 0 && raw_read->bytes_per_s() > 0) {
        disk_json << ", \"" << key
                  << "_read_fraction_of_raw\": " << d.read_bytes_per_s() / raw_read->bytes_per_s();
      }
    };
    if (layer_disk) add_disk("layer_disk", *layer_disk, prefill_layer_reads);
    if (expert_disk) add_disk("expert_disk", *expert_disk, prefill_expert_reads);
    if (raw_read) disk_json << ", \"raw_read\": " << raw_read->to_json();
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
              << ", \"bytes_h2d_per_decode_token\": "
              << static_cast<double>(s.bytes_h2d - std::min<uint64_t>(prefill_h2d, s.bytes_h2d)) /
                     static_cast<double>(decode_steps)
              << ", \"loads\": " << s.loads << ", \"stall_ms\": " << s.stall_ms << expert_json.str()
              << disk_json.str() << ", \"peak_rss_bytes\": " << rss_bytes().first
              << ", \"tokens_equal_to_none\": "
              << (baseline.empty() || strategy == "none"
                      ? "null"
                      : (baseline == result.tokens ? "true" : "false"))
              << "}" << std::endl;
    for (const int64_t batch : o.batch_sizes) {
      run_batch(strategy, *runner, *engine, request, batch, tokens, o);
    }
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
