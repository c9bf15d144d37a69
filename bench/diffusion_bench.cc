// diffusion-bench: Wan2.2-T2V-A14B at its real widths (issue 25, point 7) under each offload
// strategy on one engine. It writes a synthetic diffusers folder (seeded random weights: the
// A14B transformer dims with a few layers per expert, a UMT5-XXL-shaped encoder with a layer
// or two, the real Wan2.1 VAE), loads it with load_wan_pipeline as a user's folder would load,
// and prints one JSON line per strategy: loading time and RSS, peak device bytes, mean step
// time, host-to-device bytes per step, and whether the frames equal the resident run's.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "bench_args.h"
#include "cpu_offload/check.h"
#include "cpu_offload/disk_tier.h"
#include "cpu_offload/offload_backend.h"
#include "cpu_offload/transfer_engine.h"
#include "model_runner/diffusion/umt5_encoder.h"
#include "model_runner/diffusion/wan_pipeline.h"
#include "model_runner/diffusion/wan_transformer.h"
#include "model_runner/diffusion/wan_vae.h"
#include "model_runner/weights/hf_config.h"
#include "model_runner/weights/load_weights.h"
#include "model_runner/weights/safetensors.h"

#ifndef OMNI_WAN_TEMPLATE
#error "OMNI_WAN_TEMPLATE must name a tiny Wan2.2 A14B fixture folder (tokenizer, scheduler)"
#endif

namespace {

namespace fs = std::filesystem;
using omni::offload::DeviceKind;
using omni::offload::OffloadConfig;
using omni::offload::Strategy;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

struct Options {
  int layers = 2;
  int text_layers = 1;
  int64_t vocab = 256384;
  std::string dtype = "bf16";
  int64_t frames = 1;
  int64_t height = 64;
  int64_t width = 64;
  int steps = 4;
  int64_t max_sequence_length = 16;
  std::string strategies = "resident,model,layerwise,phase,disk";
  int disk_units = 3;
  std::string work_dir;
  bool keep = false;
  uint64_t seed = 0;
  double sim_bandwidth_gbps = 0;
  std::optional<int> threads;
};

void add_options(CLI::App& app, Options& o) {
  using omni::bench::at_least;
  app.option_defaults()->always_capture_default();
  app.add_option("--layers", o.layers, "transformer blocks per expert (A14B has 40)")
      ->type_name("N")
      ->check(at_least(1));
  app.add_option("--text-layers", o.text_layers, "UMT5 encoder layers (UMT5-XXL has 24)")
      ->type_name("N")
      ->check(at_least(1));
  app.add_option("--vocab", o.vocab, "UMT5 vocabulary (UMT5-XXL: 256384)")
      ->type_name("V")
      ->check(at_least(384));
  app.add_option("--dtype", o.dtype, "weights and compute dtype")
      ->type_name("bf16|fp32")
      ->check(CLI::IsMember({"bf16", "bfloat16", "fp32", "float32"}));
  app.add_option("--frames", o.frames, "video frames (4k + 1)")->type_name("F")->check(at_least(1));
  app.add_option("--height", o.height, "pixels (multiple of 16)")
      ->type_name("H")
      ->check(at_least(16));
  app.add_option("--width", o.width, "pixels (multiple of 16)")
      ->type_name("W")
      ->check(at_least(16));
  app.add_option("--steps", o.steps, "denoising steps (>= 2: the mean leaves out the first)")
      ->type_name("S")
      ->check(at_least(2));
  app.add_option("--max-sequence-length", o.max_sequence_length, "prompt tokens (A14B: 512)")
      ->type_name("L")
      ->check(at_least(1));
  app.add_option("--strategies", o.strategies,
                 "comma-separated: resident, model, layerwise, phase, ratio, disk")
      ->type_name("LIST");
  app.add_option("--disk-units", o.disk_units,
                 "disk tier: host budget in blocks (window 1 + 1 + read-ahead; 3 is the least)")
      ->type_name("N")
      ->check(at_least(3));
  app.add_option("--work-dir", o.work_dir, "where the synthetic folder goes (default: a temp dir)")
      ->type_name("DIR");
  app.add_flag("--keep", o.keep, "keep the synthetic folder (reused when it exists)");
  app.add_option("--seed", o.seed, "weights and noise seed")->type_name("S");
  app.add_option("--sim-bandwidth-gbps", o.sim_bandwidth_gbps,
                 "simulated device: throttle copies to X GB/s, e.g. 25 for PCIe Gen4 (0 = memcpy)")
      ->type_name("X")
      ->check(at_least(0));
  app.add_option_function<int>(
         "--threads", [&o](const int& v) { o.threads = v; }, "intra-op compute threads")
      ->type_name("N")
      ->check(at_least(1));
}

Json read_json(const fs::path& path) {
  std::ifstream in(path);
  OMNI_CHECK(in.good(), "cannot read ", path.string());
  return Json::parse(in);
}

void write_json(const fs::path& path, const Json& j) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  OMNI_CHECK(out.good(), "cannot write ", path.string());
}

// Seeded weights that keep activations finite through a real-width model: norm scales 1,
// biases small, matrices N(0, 1/fan_in). The values only need to be deterministic and sane;
// the bench compares strategies with each other, not with a trained model.
void fill_random(torch::nn::Module& module, at::Generator& gen) {
  at::NoGradGuard no_grad;
  for (const auto& item : module.named_parameters()) {
    at::Tensor p = item.value();
    const std::string& name = item.key();
    const bool is_weight = name.size() >= 6 && name.compare(name.size() - 6, 6, "weight") == 0;
    if (p.dim() == 1 && is_weight) {
      p.fill_(1.0);
    } else if (p.dim() == 1) {
      p.normal_(0.0, 0.02, gen);
    } else {
      const double fan_in = static_cast<double>(p.numel()) / static_cast<double>(p.size(0));
      p.normal_(0.0, 1.0 / std::sqrt(fan_in), gen);
    }
  }
}

int64_t write_module(torch::nn::Module& module, const fs::path& file) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  int64_t bytes = 0;
  for (const auto& item : module.named_parameters()) {
    tensors.emplace_back(item.key(), item.value());
    bytes += static_cast<int64_t>(item.value().nbytes());
  }
  omni::models::write_safetensors(file.string(), tensors);
  return bytes;
}

// The synthetic folder: the template's tokenizer, scheduler and model_index.json, real-width
// configs, random weights. Returns the bytes of weights written.
int64_t write_folder(const Options& o, const fs::path& dir) {
  const fs::path tpl = OMNI_WAN_TEMPLATE;
  const bool bf16 = omni::bench::parse_dtype(o.dtype) == at::kBFloat16;
  const at::ScalarType dtype = bf16 ? at::kBFloat16 : at::kFloat;
  fs::create_directories(dir);
  for (const char* part : {"tokenizer", "scheduler"}) {
    fs::copy(tpl / part, dir / part,
             fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  }
  fs::copy_file(tpl / "model_index.json", dir / "model_index.json",
                fs::copy_options::overwrite_existing);

  Json text = read_json(tpl / "text_encoder" / "config.json");  // UMT5-XXL widths
  text["d_model"] = 4096;
  text["d_ff"] = 10240;
  text["d_kv"] = 64;
  text["num_heads"] = 64;
  text["num_layers"] = o.text_layers;
  text["num_decoder_layers"] = o.text_layers;
  text["vocab_size"] = o.vocab;
  text["dtype"] = bf16 ? "bfloat16" : "float32";
  write_json(dir / "text_encoder" / "config.json", text);

  Json dit = read_json(tpl / "transformer" / "config.json");  // Wan2.2-T2V-A14B widths
  dit["num_attention_heads"] = 40;
  dit["attention_head_dim"] = 128;
  dit["ffn_dim"] = 13824;
  dit["text_dim"] = 4096;
  dit["freq_dim"] = 256;
  dit["num_layers"] = o.layers;
  dit["rope_max_seq_len"] = 1024;
  write_json(dir / "transformer" / "config.json", dit);
  write_json(dir / "transformer_2" / "config.json", dit);

  Json vae = read_json(tpl / "vae" / "config.json");  // Wan2.1 VAE (Wan2.2-T2V-A14B's)
  vae["base_dim"] = 96;
  vae["dim_mult"] = {1, 2, 4, 4};
  vae["num_res_blocks"] = 2;
  write_json(dir / "vae" / "config.json", vae);

  // One part at a time: each is freed once written.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  int64_t bytes = 0;
  {
    const auto c = omni::models::UMT5Config::parse(
        omni::models::HfConfig::load((dir / "text_encoder").string()));
    omni::models::UMT5Encoder m(c, dtype);
    fill_random(m, gen);
    bytes += write_module(m, dir / "text_encoder" / "model.safetensors");
  }
  for (const char* part : {"transformer", "transformer_2"}) {
    omni::models::WanTransformer3DModel m(
        omni::models::WanTransformerConfig::load((dir / part).string()), dtype);
    fill_random(m, gen);
    bytes += write_module(m, dir / part / "diffusion_pytorch_model.safetensors");
  }
  {
    omni::models::AutoencoderKLWan m(omni::models::WanVAEConfig::load((dir / "vae").string()),
                                     dtype);
    fill_random(m, gen);
    bytes += write_module(m, dir / "vae" / "diffusion_pytorch_model.safetensors");
  }
  return bytes;
}

// kB fields of /proc/self/status, in bytes (0 where absent).
size_t status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) {
      return static_cast<size_t>(std::stoull(line.substr(field.size() + 1))) * 1024;
    }
  }
  return 0;
}

OffloadConfig config_for(const std::string& name) {
  if (name == "resident") return OffloadConfig::for_strategy(Strategy::kNone);
  if (name == "model") return OffloadConfig::for_strategy(Strategy::kModelLevel);
  auto c = OffloadConfig::for_strategy(Strategy::kLayerwise);
  c.num_gpu_layers = 1;  // one block (or phase) ahead of the computing one
  if (name == "layerwise" || name == "disk") return c;
  if (name == "phase") {
    c.granularity = omni::offload::Granularity::kPhase;
    return c;
  }
  if (name == "ratio") {
    c.offload_ratio = 0.5;
    return c;
  }
  OMNI_THROW("unknown strategy '", name,
             "' (expected resident, model, layerwise, phase, ratio or disk)");
}

// Slab bytes of the largest block: its tensors plus the engine's alignment padding for each.
size_t block_slab_bytes(omni::models::WanPipeline& pipe) {
  size_t bytes = 0;
  for (const auto& child : pipe.transformer().named_children()) {
    if (child.key() != "blocks") continue;
    for (const auto& block : child.value()->named_children()) {
      size_t b = 0;
      for (const auto& p : block.value()->parameters()) {
        b += p.nbytes() + omni::offload::kTensorAlignment;
      }
      bytes = std::max(bytes, b);
    }
  }
  return bytes;
}

struct Measured {
  std::string json;
  at::Tensor frames;
};

Measured run_strategy(const Options& o, const fs::path& dir, const std::string& name,
                      const at::Tensor* resident) {
  const at::ScalarType dtype = omni::bench::parse_dtype(o.dtype);
  const size_t anon0 = status_bytes("RssAnon"), file0 = status_bytes("RssFile");
  const auto load_start = Clock::now();
  auto pipe = omni::models::load_wan_pipeline(dir.string(), dtype);
  OffloadConfig config = config_for(name);
  size_t budget = 0;
  if (name == "disk") {
    // The streamed blocks stay in their files: bind the experts again to learn where each
    // tensor lies (the same bytes the loader already viewed), and cap the host cache.
    for (const char* part : {"transformer", "transformer_2"}) {
      auto& t = std::string(part) == "transformer" ? pipe->transformer() : *pipe->transformer_2();
      const auto ckpt = omni::models::SafetensorsCheckpoint::open((dir / part).string());
      omni::models::add_disk_files(omni::models::load_weights(t, ckpt, ""), std::string(part) + ".",
                                   config.disk_files);
    }
    config.disk_read_ahead = o.disk_units - 2;
    budget = static_cast<size_t>(o.disk_units) * block_slab_bytes(*pipe);
    config.host_memory_budget_bytes = budget;
  }
  omni::offload::TransferEngineOptions engine_options;
  engine_options.sim_bandwidth_bytes_per_s = o.sim_bandwidth_gbps * 1e9;
  auto engine = omni::offload::make_transfer_engine(DeviceKind::kCpuSim, engine_options);
  auto backend = omni::offload::apply_offload(*pipe, pipe->offload_spec(), config, engine);
  engine->synchronize();
  const double load_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - load_start).count();
  const size_t anon1 = status_bytes("RssAnon"), file1 = status_bytes("RssFile");
  const size_t host_after_load = engine->host_counter()->current();

  omni::models::WanRequest request;
  request.prompt = "a red fox runs through fresh snow at dawn";
  request.negative_prompt = "blurry, low quality";
  request.height = o.height;
  request.width = o.width;
  request.num_frames = o.frames;
  request.num_inference_steps = o.steps;
  request.guidance_scale = 4.0;  // A14B's official high-noise / low-noise guidance
  request.guidance_scale_2 = 3.0;
  request.seed = o.seed;
  request.max_sequence_length = o.max_sequence_length;

  // Steps after the first: the first also holds the prompt encoding (and model-level's swap
  // from the encoder to the first expert).
  std::vector<Clock::time_point> at_step;
  std::vector<uint64_t> h2d_at_step;
  std::vector<std::string> experts;
  Measured m;
  const auto start = Clock::now();
  {
    auto scope = backend->forward_scope();
    m.frames = pipe->generate(
                       request,
                       [&](const omni::models::WanStep& step) {
                         engine->synchronize();
                         at_step.push_back(Clock::now());
                         h2d_at_step.push_back(backend->stats().bytes_h2d);
                         experts.emplace_back(step.transformer);
                         return true;
                       },
                       engine->compute_device())
                   .frames;
  }
  engine->synchronize();
  const double total_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  const auto s = backend->stats();
  const auto disk = backend->disk_stats();
  const size_t n = at_step.size() - 1;
  const double step_ms =
      std::chrono::duration<double, std::milli>(at_step.back() - at_step.front()).count() /
      static_cast<double>(n);
  const double h2d_per_step =
      static_cast<double>(h2d_at_step.back() - h2d_at_step.front()) / static_cast<double>(n);
  int switches = 0;
  for (size_t i = 1; i < experts.size(); ++i) switches += experts[i] != experts[i - 1];

  std::ostringstream os;
  os << std::fixed << std::setprecision(1);
  os << "{\"strategy\": \"" << name << "\", \"engine\": \"" << s.strategy << "\", \"device\": \""
     << s.device << "\", \"dtype\": \"" << o.dtype << "\", \"load_ms\": " << load_ms
     << ", \"load_rss_anon_bytes\": " << static_cast<int64_t>(anon1) - static_cast<int64_t>(anon0)
     << ", \"load_rss_file_bytes\": " << static_cast<int64_t>(file1) - static_cast<int64_t>(file0)
     << ", \"host_bytes_after_load\": " << host_after_load
     << ", \"host_peak_bytes\": " << s.host_peak_bytes << ", \"param_bytes\": " << s.param_bytes
     << ", \"resident_bytes\": " << s.resident_bytes << ", \"max_unit_bytes\": " << s.max_unit_bytes
     << ", \"peak_device_bytes\": " << s.peak_device_bytes << ", \"steps\": " << o.steps
     << ", \"expert_switches\": " << switches << ", \"step_ms\": " << step_ms
     << ", \"total_ms\": " << total_ms << ", \"h2d_bytes_per_step\": " << std::setprecision(0)
     << h2d_per_step << ", \"bytes_h2d\": " << s.bytes_h2d;
  if (disk) {
    os << ", \"host_budget_bytes\": " << budget << ", \"disk_entries\": " << disk->entries
       << ", \"disk_read_bytes\": " << disk->read_bytes;
  }
  os << ", \"frames_finite\": " << (m.frames.isfinite().all().item<bool>() ? "true" : "false")
     << ", \"frames_equal_to_resident\": ";
  if (resident != nullptr) {
    os << (at::equal(m.frames, *resident) ? "true" : "false");
  } else {
    os << "null";
  }
  os << "}";
  m.json = os.str();
  return m;
}

int run(const Options& o) {
  if (o.threads) at::set_num_threads(*o.threads);
  const auto names = omni::bench::split_list(o.strategies);
  for (const auto& name : names) config_for(name);  // a typo fails before the writing
  fs::path dir = o.work_dir;
  if (dir.empty()) {
    dir = fs::temp_directory_path() / ("diffusion-bench-" + std::to_string(::getpid()));
  }
  if (!(o.keep && fs::exists(dir / "model_index.json"))) {
    const auto start = Clock::now();
    const int64_t bytes = write_folder(o, dir);
    std::cout << "{\"synthetic_folder\": \"" << dir.string() << "\", \"weight_bytes\": " << bytes
              << ", \"write_ms\": " << std::fixed << std::setprecision(1)
              << std::chrono::duration<double, std::milli>(Clock::now() - start).count()
              << ", \"layers_per_expert\": " << o.layers << ", \"text_layers\": " << o.text_layers
              << ", \"vocab\": " << o.vocab << ", \"frames\": " << o.frames
              << ", \"height\": " << o.height << ", \"width\": " << o.width
              << ", \"threads\": " << at::get_num_threads()
              << ", \"sim_bandwidth_gbps\": " << o.sim_bandwidth_gbps << "}" << std::endl;
  }
  at::Tensor resident;
  for (const auto& name : names) {
    const Measured m = run_strategy(o, dir, name, resident.defined() ? &resident : nullptr);
    if (name == "resident") resident = m.frames;
    std::cout << m.json << std::endl;
  }
  if (!o.keep) fs::remove_all(dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "Writes a synthetic Wan2.2-T2V-A14B-shaped diffusers folder (real widths, few layers, "
      "random weights), runs it under each offload strategy on the simulated device and prints "
      "one JSON line per strategy.",
      "diffusion-bench");
  Options options;
  add_options(app, options);
  return omni::bench::bench_main(app, argc, argv, [&] { return run(options); });
}
