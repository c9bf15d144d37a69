// pipeline-bench: the cost of running the stages as gRPC worker processes. The same requests go
// through the orchestrator twice: over in-process stages (each stage's runner in this process)
// and over `vllm-omni worker` processes on loopback, both built from one stage config. One JSON
// line per mode: per-stage latency (time from the request's start to each stage's last packet,
// and the stage's own compute time), time to first audio, bytes moved between stages per
// request, and for the workers the gRPC overhead per request against in-process; plus whether
// the two modes gave the same codes and waveforms.
#include <ATen/ATen.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_args.h"
#include "model_runner/qwen3_omni/omni_options.h"
#include "worker/cli/intra_op_threads.h"
#include "worker/config/stage_yaml.h"
#include "worker/pipeline/local_stages.h"
#include "worker/pipeline/pipeline.h"
#include "worker/process/stage_launcher.h"

namespace {

using namespace omni;
using Json = nlohmann::json;

struct Options {
  std::string config = OMNI_DEFAULT_CONFIG;
  std::string worker = OMNI_DEFAULT_WORKER;
  std::string prompt = "Describe a quiet morning by the sea.";
  int requests = 8;
  int64_t tokens = 16;
  int64_t frames = 24;
};

pipeline::Request request(const Options& o, int i) {
  pipeline::Request r;
  r.chat.text = o.prompt + " (" + std::to_string(i) + ")";
  auto& omni = r.parts.get<models::OmniOptions>();
  omni.sampling.set_greedy(true);
  omni.sampling.thinker.max_new_tokens = o.tokens;
  omni.max_audio_frames = o.frames;
  return r;
}

struct Run {
  Json line;
  std::vector<pipeline::PipelineResult> results;
  double mean_total_ms = 0;
};

Run measure(const std::string& mode, pipeline::Pipeline& p, const Options& o) {
  p.generate(request(o, -1));  // warm-up: first-touch allocations, connections
  Run run;
  std::map<std::string, std::map<std::string, double>> stage_sums;
  double total = 0, ttfa = 0, bytes = 0;
  for (int i = 0; i < o.requests; ++i) {
    auto r = p.generate(request(o, i));
    total += r.timings.at("total_ms");
    ttfa += r.timings.at("time_to_first_audio_ms");
    bytes += static_cast<double>(r.bytes_between_stages);
    for (const auto& [stage, metrics] : r.stage_metrics) {
      for (const auto& [k, v] : metrics) stage_sums[stage][k] += v;
    }
    run.results.push_back(std::move(r));
  }
  const double n = o.requests;
  Json stages = Json::object();
  for (const auto& [stage, metrics] : stage_sums) {
    for (const auto& [k, v] : metrics) stages[stage][k] = v / n;
  }
  run.mean_total_ms = total / n;
  run.line = {{"mode", mode},
              {"requests", o.requests},
              {"total_ms", total / n},
              {"time_to_first_audio_ms", ttfa / n},
              {"bytes_between_stages_per_request", bytes / n},
              {"stages", stages}};
  return run;
}

int run(const Options& o) {
  auto config = config::load_pipeline_config(o.config);
  std::vector<pipeline::PipelineStage> local;
  for (const auto& s : config.stages) {
    local.push_back({s.stage_id, s.engine.model_stage, s.engine_input_source,
                     pipeline::make_local_stage(pipeline::local_stage_options(s))});
  }
  pipeline::Pipeline in_process(local);
  auto a = measure("in_process_stages", in_process, o);
  std::cout << a.line.dump() << std::endl;

  pipeline::LauncherOptions lo;
  lo.config = config;
  lo.worker_executable = o.worker;
  pipeline::StageLauncher launcher(lo);
  auto b = measure("workers_grpc", launcher.pipeline(), o);
  bool equal = true;
  for (size_t i = 0; i < a.results.size(); ++i) {
    equal = equal && a.results[i].tokens == b.results[i].tokens &&
            at::equal(a.results[i].audio.codes, b.results[i].audio.codes) &&
            at::equal(a.results[i].audio.waveform, b.results[i].audio.waveform);
  }
  b.line["grpc_overhead_ms_per_request"] = b.mean_total_ms - a.mean_total_ms;
  b.line["outputs_equal_to_in_process"] = equal;
  std::cout << b.line.dump() << std::endl;
  return equal ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app("pipeline-bench: in-process stages versus gRPC stage workers, one JSON line each");
  app.add_option("--stage-configs-path", o.config, "stage YAML")->capture_default_str();
  app.add_option("--worker-executable", o.worker, "the vllm-omni binary the workers run")
      ->capture_default_str();
  app.add_option("--prompt", o.prompt, "request text (numbered per request)")
      ->capture_default_str();
  app.add_option("--requests", o.requests, "measured requests per mode")
      ->check(bench::at_least(1))
      ->capture_default_str();
  app.add_option("--tokens", o.tokens, "thinker tokens per request")
      ->check(bench::at_least(2))
      ->capture_default_str();
  app.add_option("--frames", o.frames, "talker frames per request")
      ->check(bench::at_least(1))
      ->capture_default_str();
  return bench::bench_main(app, argc, argv, [&] {
    omni::cli::default_intra_op_threads();  // as vllm-omni, whose stages it runs in process
    return run(o);
  });
}
