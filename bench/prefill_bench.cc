// prefill-bench: what a long prompt does to the requests already decoding. N requests decode
// in the thinker stage's engine loop; once each has its first tokens, one more arrives with a
// long prompt. Prints one JSON line per mode (whole prefill, chunked prefill): the decoding
// requests' inter-token latency p50 / p99 / max, and the long prompt's time to first token.
// The thinker runs on the simulated device (cpu) or CUDA, in this process.
#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench_args.h"
#include "cpu_offload/check.h"
#include "worker/pipeline/local_pipeline.h"
#include "worker/qwen3_omni/stage_params.h"

namespace {

using namespace omni;
using namespace omni::pipeline;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

struct Options {
  std::string model = OMNI_DEFAULT_ASSETS;
  std::string device = "cpu";
  std::string modes = "whole,chunked";
  int64_t decoders = 7;
  int64_t decode_tokens = 48;
  int64_t arrive_after = 8;
  int64_t prompt_tokens = 2000;
  int64_t max_num_batched_tokens = 64;
  int threads = 0;
};

// One request through the stage: the time of each token packet, and the prompt's length.
struct Timed {
  std::vector<Clock::time_point> tokens;
  int64_t prompt_tokens = 0;
  std::string error;
};

Timed call(Stage& stage, const std::string& text, int64_t max_new_tokens,
           std::atomic<int64_t>* started) {
  auto params = std::make_shared<ThinkerParams>();
  params->text = text;
  params->sampling.greedy = true;
  params->sampling.max_new_tokens = max_new_tokens;
  params->sampling.stop_token_ids = {-1};  // the full length
  StageCall c;
  c.request_id = text.substr(0, 16);
  c.params = params;
  PacketQueue input;
  input.close();
  Timed out;
  try {
    stage.run(
        c, input,
        [&](StagePacket&& p) {
          if (!p.tokens.empty()) out.tokens.push_back(Clock::now());
          if (started && out.tokens.size() == 1 && !p.tokens.empty()) ++*started;
          if (p.finished) out.prompt_tokens = static_cast<int64_t>(p.metrics.at("prompt_tokens"));
        },
        CancelToken());
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  return out;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<size_t>(std::lround(p * static_cast<double>(v.size() - 1)));
  return v[std::min(i, v.size() - 1)];
}

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

Json run_mode(const Options& o, bool chunked) {
  config::StageConfig s;
  s.stage_id = 0;
  s.engine.model_stage = "thinker";
  s.engine.model = o.model;
  s.engine.max_num_seqs = o.decoders + 1;
  s.engine.max_num_batched_tokens = o.max_num_batched_tokens;
  s.engine.enable_chunked_prefill = chunked;
  LocalStageOptions lo = local_stage_options(s, o.device);
  lo.name = "stage 0 (thinker)";
  lo.limits.max_num_seqs = o.decoders + 1;
  auto stage = make_local_stage(lo);
  // Warm up: the first forwards pay one-time costs.
  call(*stage, "Hello.", 4, nullptr);

  std::atomic<int64_t> started{0};
  std::vector<Timed> decoding(static_cast<size_t>(o.decoders));
  std::vector<std::thread> threads;
  for (int64_t i = 0; i < o.decoders; ++i) {
    threads.emplace_back([&, i] {
      decoding[static_cast<size_t>(i)] = call(
          *stage, "Request " + std::to_string(i) + ": tell a story.", o.decode_tokens, &started);
    });
  }
  // The long prompt arrives once every decoding request has its first token and the loop ran
  // `arrive_after` steps more.
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  const auto steps = [&] {
    return Json::parse(stage->stats_json())["engine"]["steps"].get<int64_t>();
  };
  while (started.load() < o.decoders && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const int64_t steps_before = steps();
  while (steps() < steps_before + o.arrive_after && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // Each " a" is one token of Qwen's tokenizer; the chat template adds a few.
  std::string text;
  for (int64_t i = 0; i < o.prompt_tokens - 12; ++i) text += " a";
  const auto arrived = Clock::now();
  const Timed long_prompt = call(*stage, text, 2, nullptr);
  for (auto& t : threads) t.join();

  std::vector<double> gaps;
  for (const auto& d : decoding) {
    OMNI_CHECK(d.error.empty(), "a decoding request failed: ", d.error);
    for (size_t k = 1; k < d.tokens.size(); ++k) gaps.push_back(ms(d.tokens[k] - d.tokens[k - 1]));
  }
  OMNI_CHECK(long_prompt.error.empty(), "the long prompt failed: ", long_prompt.error);
  const Json engine = Json::parse(stage->stats_json())["engine"];
  const double p50 = percentile(gaps, 0.5), p99 = percentile(gaps, 0.99);
  return {{"mode", chunked ? "chunked" : "whole"},
          {"decoding_requests", o.decoders},
          {"prompt_tokens", long_prompt.prompt_tokens},
          {"max_num_batched_tokens", o.max_num_batched_tokens},
          {"itl_ms_p50", p50},
          {"itl_ms_p99", p99},
          {"itl_ms_max", percentile(gaps, 1.0)},
          {"p99_over_p50", p50 > 0 ? p99 / p50 : 0.0},
          {"long_prompt_ttft_ms",
           long_prompt.tokens.empty() ? 0.0 : ms(long_prompt.tokens.front() - arrived)},
          {"prefill_chunks", engine["prefill_chunks"]},
          {"gaps", gaps.size()}};
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "prefill-bench: inter-token latency of decoding requests while a long prompt arrives, "
      "with whole and chunked prefill; one JSON line per mode"};
  app.add_option("--model", o.model, "a Qwen3-Omni checkpoint directory")->capture_default_str();
  app.add_option("--device", o.device, "cpu (the simulated device) or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--modes", o.modes, "comma-separated: whole, chunked")->capture_default_str();
  app.add_option("--decoders", o.decoders, "requests decoding when the long prompt arrives")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--decode-tokens", o.decode_tokens, "tokens each decoding request generates")
      ->check(omni::bench::at_least(2))
      ->capture_default_str();
  app.add_option("--arrive-after", o.arrive_after, "decode steps before the long prompt arrives")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--prompt-tokens", o.prompt_tokens, "the long prompt's length, about")
      ->check(omni::bench::at_least(16))
      ->capture_default_str();
  app.add_option("--max-num-batched-tokens", o.max_num_batched_tokens,
                 "tokens a step runs (chunked) / prompt tokens admitted per step (whole)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--threads", o.threads, "intra-op threads (0: LibTorch's default)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  return omni::bench::bench_main(app, argc, argv, [&] {
    if (o.threads > 0) at::set_num_threads(o.threads);
    for (const auto& mode : omni::bench::split_list(o.modes)) {
      OMNI_CHECK(mode == "whole" || mode == "chunked", "--modes: unknown mode '", mode,
                 "' (whole, chunked)");
      std::cout << run_mode(o, mode == "chunked").dump() << std::endl;
    }
    return 0;
  });
}
