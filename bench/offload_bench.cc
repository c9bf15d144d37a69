// offload-bench: runs the tiny (or a DiT-sized) diffusion pipeline under one offload strategy
// and prints one JSON object with time, memory and transfer figures, next to the resident
// baseline and a plain pinned copy of the same bytes (the bandwidth ceiling).
#include <ATen/ATen.h>

#include <chrono>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <map>
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
using omni::bench::Args;

constexpr const char* kUsage = R"(usage: offload-bench [options]
  --pipeline tiny|small|wan14b   model size preset (default tiny)
  --strategy none|model|layerwise (default layerwise)
  --num-gpu-layers N             layerwise window depth (default 1)
  --granularity block|phase      layerwise unit (default block)
  --offload-ratio R              layerwise: fraction of blocks streamed (default 1)
  --device cpu|cuda              compute device; cpu is the simulated device (default cpu)
  --steps S                      denoising steps (default 4)
  --guidance G                   classifier-free guidance scale, 1 = off (default 3)
  --blocks N                     override the preset's DiT block count
  --latent-size N                override the preset's latent size (tokens = (N/2)^2)
  --two-transformers             Wan2.2-style second DiT for the later steps
  --strict-vae                   model-level: the VAE joins the exclusion
  --budget-bytes B               model-level: device budget that allows prefetching
  --no-pin                       pageable host memory
  --sim-bandwidth-gbps X         simulated device: throttle copies to X GB/s
  --no-compare                   skip the resident baseline run
  --units                        add the per-unit table to the JSON
  --threads N                    intra-op compute threads (default: LibTorch's choice); on
                                 a small CPU, leave a core to the simulated copy stream
)";

Args parse_args(int argc, char** argv) {
  static const std::map<std::string, bool> kFlags = {// name -> takes a value
                                                     {"pipeline", true},
                                                     {"strategy", true},
                                                     {"num-gpu-layers", true},
                                                     {"granularity", true},
                                                     {"offload-ratio", true},
                                                     {"device", true},
                                                     {"steps", true},
                                                     {"guidance", true},
                                                     {"blocks", true},
                                                     {"latent-size", true},
                                                     {"two-transformers", false},
                                                     {"strict-vae", false},
                                                     {"budget-bytes", true},
                                                     {"no-pin", false},
                                                     {"threads", true},
                                                     {"sim-bandwidth-gbps", true},
                                                     {"no-compare", false},
                                                     {"units", false},
                                                     {"help", false}};
  return omni::bench::parse_args(argc, argv, kFlags);
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

int run(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  if (args.has("help")) {
    std::cout << kUsage;
    return 0;
  }
  auto model = omni::models::TinyDiffusionConfig::preset(args.get("pipeline", "tiny"));
  if (args.has("blocks")) model.blocks = static_cast<int64_t>(args.number("blocks", 0));
  if (args.has("latent-size"))
    model.latent_size = static_cast<int64_t>(args.number("latent-size", 0));
  model.two_transformers = args.has("two-transformers");
  OMNI_CHECK(model.blocks >= 1, "--blocks must be >= 1");

  const Strategy strategy = omni::offload::parse_strategy(args.get("strategy", "layerwise"));
  OffloadConfig config = OffloadConfig::for_strategy(strategy);
  config.num_gpu_layers = static_cast<int>(args.number("num-gpu-layers", 1));
  config.granularity = omni::offload::parse_granularity(args.get("granularity", "block"));
  config.offload_ratio = args.number("offload-ratio", 1.0);
  config.strict_vae = args.has("strict-vae");
  config.device_budget_bytes = static_cast<size_t>(args.number("budget-bytes", 0));
  config.pin_memory = !args.has("no-pin");
  config.validate();

  if (args.has("threads")) {
    const int threads = static_cast<int>(args.number("threads", 0));
    OMNI_CHECK(threads >= 1, "--threads must be >= 1, got ", threads);
    at::set_num_threads(threads);
  }
  const DeviceKind device = omni::offload::parse_device_kind(args.get("device", "cpu"));
  omni::offload::TransferEngineOptions engine_options;
  engine_options.sim_bandwidth_bytes_per_s = args.number("sim-bandwidth-gbps", 0) * 1e9;
  omni::models::GenerateOptions options;
  options.steps = static_cast<int>(args.number("steps", 4));
  options.guidance_scale = args.number("guidance", 3.0);
  OMNI_CHECK(options.steps >= 1, "--steps must be >= 1");

  Measured baseline;
  const bool compare = !args.has("no-compare");
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
  os << "{\"pipeline\": \"" << args.get("pipeline", "tiny") << "\", \"strategy\": \"" << s.strategy
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
  if (args.has("units")) {
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
  return omni::bench::guarded_main("offload-bench", [&] { return run(argc, argv); });
}
