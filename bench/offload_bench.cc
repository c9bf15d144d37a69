// offload-bench: runs the tiny (or a DiT-sized) diffusion pipeline under one offload strategy
// and prints one JSON object with time, memory and transfer figures, next to the resident
// baseline and a plain pinned copy of the same bytes (the bandwidth ceiling).
#include <ATen/ATen.h>

#include <chrono>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>

#include "bench_args.h"
#include "cpu_offload/check.h"
#include "cpu_offload/offload_backend.h"
#include "model_runner/diffusion/tiny_pipeline.h"

namespace {

using omni::offload::DeviceKind;
using omni::offload::OffloadConfig;
using omni::offload::Strategy;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string pipeline = "tiny";
  std::string strategy = "layerwise";
  int num_gpu_layers = 1;
  std::string granularity = "block";
  double offload_ratio = 1.0;
  std::string device = "cpu";
  int steps = 4;
  double guidance = 3.0;
  std::optional<int64_t> blocks;
  std::optional<int64_t> latent_size;
  bool two_transformers = false;
  bool strict_vae = false;
  double budget_bytes = 0;
  bool no_pin = false;
  double sim_bandwidth_gbps = 0;
  bool no_compare = false;
  bool units = false;
  std::optional<int> threads;
};

void add_options(CLI::App& app, Options& o) {
  using omni::bench::at_least;
  using omni::bench::parsed_by;
  app.option_defaults()->always_capture_default();
  app.add_option("--pipeline", o.pipeline, "model size preset")
      ->type_name("tiny|small|wan14b")
      ->check(parsed_by(omni::models::TinyDiffusionConfig::preset));
  app.add_option("--strategy", o.strategy, "offload strategy")
      ->type_name("none|model|layerwise")
      ->check(parsed_by(omni::offload::parse_strategy));
  app.add_option("--num-gpu-layers", o.num_gpu_layers, "layerwise window depth")
      ->type_name("N")
      ->check(at_least(1));
  app.add_option("--granularity", o.granularity, "layerwise unit")
      ->type_name("block|phase")
      ->check(parsed_by(omni::offload::parse_granularity));
  app.add_option("--offload-ratio", o.offload_ratio, "layerwise: fraction of blocks streamed")
      ->type_name("R")
      ->check(at_least(0));
  app.add_option("--device", o.device, "compute device; cpu is the simulated device")
      ->type_name("cpu|cuda")
      ->check(parsed_by(omni::offload::parse_device_kind));
  app.add_option("--steps", o.steps, "denoising steps")->type_name("S")->check(at_least(1));
  app.add_option("--guidance", o.guidance, "classifier-free guidance scale, 1 = off")
      ->type_name("G");
  app.add_option_function<int64_t>(
         "--blocks", [&o](const int64_t& v) { o.blocks = v; },
         "override the preset's DiT block count")
      ->type_name("N")
      ->check(at_least(1));
  app.add_option_function<int64_t>(
         "--latent-size", [&o](const int64_t& v) { o.latent_size = v; },
         "override the preset's latent size (tokens = (N/2)^2)")
      ->type_name("N")
      ->check(at_least(1));
  app.add_flag("--two-transformers", o.two_transformers,
               "Wan2.2-style second DiT for the later steps");
  app.add_flag("--strict-vae", o.strict_vae, "model-level: the VAE joins the exclusion");
  app.add_option("--budget-bytes", o.budget_bytes,
                 "model-level: device budget that allows prefetching")
      ->type_name("B")
      ->check(at_least(0));
  app.add_flag("--no-pin", o.no_pin, "pageable host memory");
  app.add_option("--sim-bandwidth-gbps", o.sim_bandwidth_gbps,
                 "simulated device: throttle copies to X GB/s (0 = no throttle)")
      ->type_name("X")
      ->check(at_least(0));
  app.add_flag("--no-compare", o.no_compare, "skip the resident baseline run");
  app.add_flag("--units", o.units, "add the per-unit table to the JSON");
  app.add_option_function<int>(
         "--threads", [&o](const int& v) { o.threads = v; },
         "intra-op compute threads (default: LibTorch's choice); on a small CPU, leave a core "
         "to the simulated copy stream")
      ->type_name("N")
      ->check(at_least(1));
}

struct Measured {
  at::Tensor image;
  double total_ms = 0;
  size_t allocator_peak_bytes = 0;  // CUDA: weights + activations
  omni::offload::OffloadStats stats;
};

Measured run_pipeline(const omni::models::TinyDiffusionConfig& model, const OffloadConfig& config,
                      DeviceKind device, const omni::offload::TransferEngineOptions& engine_options,
                      const omni::models::GenerateOptions& options) {
  omni::models::TinyDiffusionPipeline pipe(model);
  auto engine = omni::offload::make_transfer_engine(device, engine_options);
  auto backend = omni::offload::apply_offload(pipe, pipe.offload_spec(), config, engine);
  auto forward = backend->forward_scope();  // every forward runs in it
  const auto prompt = omni::models::example_prompt(1, 8, model.vocab, 1);
  const auto negative = omni::models::example_prompt(1, 8, model.vocab, 2);
  // Warm-up: first-touch allocations, kernel selection, the first cycle of prefetches.
  auto warm = options;
  warm.steps = 1;
  pipe.generate(prompt, negative, warm, engine->compute_device());
  engine->synchronize();
  backend->reset_stats();
  Measured m;
  const auto start = Clock::now();
  m.image = pipe.generate(prompt, negative, options, engine->compute_device()).cpu();
  engine->synchronize();
  m.total_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  m.stats = backend->stats();
  m.allocator_peak_bytes = engine->allocator_peak_bytes();
  return m;
}

// A plain copy of `bytes` (in chunks of `chunk`) from host to device memory of the same
// engine: the ceiling our streaming is compared to.
double raw_copy_gbps(DeviceKind device, const omni::offload::TransferEngineOptions& engine_options,
                     bool pin, size_t chunk, uint64_t bytes) {
  auto engine = omni::offload::make_transfer_engine(device, engine_options);
  chunk = std::max<size_t>(chunk, 1 << 20);
  bytes = std::max<uint64_t>(bytes, chunk);
  auto src = engine->allocate_host(chunk, pin);
  std::memset(src.data(), 1, chunk);
  auto dst = engine->allocate_device(chunk);
  engine->copy_async({{src, 0, dst, 0, chunk}}, {});  // warm-up
  engine->synchronize();
  const uint64_t copies = (bytes + chunk - 1) / chunk;
  const auto start = Clock::now();
  for (uint64_t i = 0; i < copies; ++i) engine->copy_async({{src, 0, dst, 0, chunk}}, {});
  engine->synchronize();
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  return static_cast<double>(copies * chunk) / s / 1e9;
}

int run(const Options& o) {
  auto model = omni::models::TinyDiffusionConfig::preset(o.pipeline);
  if (o.blocks) model.blocks = *o.blocks;
  if (o.latent_size) model.latent_size = *o.latent_size;
  model.two_transformers = o.two_transformers;

  const Strategy strategy = omni::offload::parse_strategy(o.strategy);
  OffloadConfig config = OffloadConfig::for_strategy(strategy);
  config.num_gpu_layers = o.num_gpu_layers;
  config.granularity = omni::offload::parse_granularity(o.granularity);
  config.offload_ratio = o.offload_ratio;
  config.strict_vae = o.strict_vae;
  config.device_budget_bytes = static_cast<size_t>(o.budget_bytes);
  config.pin_memory = !o.no_pin;
  config.validate();

  if (o.threads) at::set_num_threads(*o.threads);
  const DeviceKind device = omni::offload::parse_device_kind(o.device);
  omni::offload::TransferEngineOptions engine_options;
  engine_options.sim_bandwidth_bytes_per_s = o.sim_bandwidth_gbps * 1e9;
  omni::models::GenerateOptions options;
  options.steps = o.steps;
  options.guidance_scale = o.guidance;

  Measured baseline;
  const bool compare = !o.no_compare;
  if (compare) {
    baseline = run_pipeline(model, OffloadConfig::for_strategy(Strategy::kNone), device,
                            engine_options, options);
  }
  const Measured m = run_pipeline(model, config, device, engine_options, options);
  const auto& s = m.stats;
  const double h2d_gbps =
      s.copy_ms > 0 ? static_cast<double>(s.bytes_h2d) / (s.copy_ms / 1e3) / 1e9 : 0;
  const double raw = raw_copy_gbps(device, engine_options, config.pin_memory,
                                   s.max_unit_bytes ? s.max_unit_bytes : (64u << 20), s.bytes_h2d);

  std::ostringstream os;
  os << std::fixed << std::setprecision(3);
  os << "{\"pipeline\": \"" << o.pipeline << "\", \"strategy\": \"" << s.strategy
     << "\", \"device\": \"" << s.device << "\", \"num_gpu_layers\": " << config.num_gpu_layers
     << ", \"granularity\": \"" << omni::offload::to_string(config.granularity)
     << "\", \"offload_ratio\": " << config.offload_ratio << ", \"blocks\": " << model.blocks
     << ", \"threads\": " << at::get_num_threads() << ", \"steps\": " << options.steps
     << ", \"step_ms\": " << m.total_ms / options.steps << ", \"total_ms\": " << m.total_ms;
  if (compare) {
    os << ", \"resident_step_ms\": " << baseline.total_ms / options.steps
       << ", \"slowdown_pct\": " << 100.0 * (m.total_ms / baseline.total_ms - 1.0)
       << ", \"resident_peak_device_bytes\": " << baseline.stats.peak_device_bytes;
    if (device == DeviceKind::kCuda) {
      os << ", \"resident_cuda_allocator_peak_bytes\": " << baseline.allocator_peak_bytes;
    }
  }
  if (device == DeviceKind::kCuda) {
    os << ", \"cuda_allocator_peak_bytes\": " << m.allocator_peak_bytes;
  }
  os << ", \"peak_device_bytes\": " << s.peak_device_bytes
     << ", \"resident_bytes\": " << s.resident_bytes << ", \"max_unit_bytes\": " << s.max_unit_bytes
     << ", \"host_bytes\": " << s.host_bytes << ", \"param_bytes\": " << s.param_bytes
     << ", \"bytes_h2d\": " << s.bytes_h2d << ", \"loads\": " << s.loads
     << ", \"sync_loads\": " << s.sync_loads << ", \"copy_ms\": " << s.copy_ms
     << ", \"stall_ms\": " << s.stall_ms << ", \"h2d_gbps\": " << h2d_gbps
     << ", \"raw_copy_gbps\": " << raw << ", \"outputs_equal_to_resident\": ";
  if (compare) {
    os << (at::equal(m.image, baseline.image) ? "true" : "false");
  } else {
    os << "null";
  }
  if (o.units) {
    const std::string full = s.to_json(true);
    os << ", \"units\": " << full.substr(full.find("\"units\": ") + 9, std::string::npos);
    os.seekp(-1, std::ios_base::end);  // drop the inner object's closing brace
  }
  os << "}";
  std::cout << os.str() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "Runs the tiny (or a DiT-sized) diffusion pipeline under one offload strategy and "
      "prints one JSON object with time, memory and transfer figures.",
      "offload-bench");
  Options options;
  add_options(app, options);
  return omni::bench::bench_main(app, argc, argv, [&] { return run(options); });
}
