// diffusion-bench: a diffusion pipeline at its real widths under each offload strategy on one
// engine (issue 25, point 7). It writes a synthetic diffusers folder (seeded random weights:
// the real widths with a few layers), loads it with the pipeline's loader as a user's folder
// would load, and prints one JSON line per strategy: loading time and RSS, peak device bytes,
// mean step time, host-to-device bytes per step and per output (video or image; the load's
// uploads left out), outputs per hour, and whether the output equals the resident run's.
// `--work-dir DIR --keep` on an existing folder of the preset's layout (a test fixture) runs
// that folder instead of writing one. The presets (--model):
//   wan-a14b (default): Wan2.2-T2V-A14B: the A14B transformer dims with a few layers per
//     expert, a UMT5-XXL-shaped encoder with a layer or two, the real Wan2.1 VAE; run through
//     load_wan_pipeline with guidance 4.0 / 3.0 (--cfg off: none), --batch requests denoised
//     together as the diffusion stage batches them; the fields name "frames".
//   qwen-image: Qwen-Image: the 3,072-wide transformer (24 heads of 128) with a few of its 60
//     blocks, a Qwen2.5-VL-7B-shaped text encoder with a layer or two, the real
//     AutoencoderKLQwenImage; run through load_qwen_image_pipeline with true CFG 4.0 (a
//     negative prompt: two transformer passes a step; --cfg off: none); the fields name
//     "images".
// Each preset takes its tokenizer, scheduler and model_index.json from a tiny fixture folder.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
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
#include "cpu_offload/hooks.h"
#include "cpu_offload/model_spec.h"
#include "cpu_offload/offload_backend.h"
#include "cpu_offload/transfer_engine.h"
#include "model_runner/diffusion/qwen_image_pipeline.h"
#include "model_runner/diffusion/qwen_image_transformer.h"
#include "model_runner/diffusion/umt5_encoder.h"
#include "model_runner/diffusion/wan_pipeline.h"
#include "model_runner/diffusion/wan_transformer.h"
#include "model_runner/diffusion/wan_vae.h"
#include "model_runner/qwen2_5/config.h"
#include "model_runner/qwen2_5/decoder.h"
#include "model_runner/weights/hf_config.h"
#include "model_runner/weights/load_weights.h"
#include "model_runner/weights/safetensors.h"

#ifndef OMNI_WAN_TEMPLATE
#error "OMNI_WAN_TEMPLATE must name a tiny Wan2.2 A14B fixture folder (tokenizer, scheduler)"
#endif
#ifndef OMNI_QWEN_IMAGE_TEMPLATE
#error "OMNI_QWEN_IMAGE_TEMPLATE must name a tiny QwenImagePipeline fixture folder"
#endif

namespace {

namespace fs = std::filesystem;
using omni::offload::DeviceKind;
using omni::offload::OffloadConfig;
using omni::offload::Strategy;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

// Unset values take the preset's default (Preset below).
struct Options {
  std::string model = "wan-a14b";
  int layers = 2;
  int text_layers = 1;
  std::optional<int64_t> vocab;
  std::string dtype = "bf16";
  std::optional<int64_t> frames;
  std::optional<int64_t> height;
  std::optional<int64_t> width;
  int steps = 4;
  std::optional<int64_t> max_sequence_length;
  std::string strategies = "resident,model,layerwise,phase,disk";
  int disk_units = 3;
  std::string work_dir;
  bool keep = false;
  uint64_t seed = 0;
  double sim_bandwidth_gbps = 0;
  std::optional<int> threads;
  bool cfg = true;  // classifier-free guidance: two transformer passes a step
  int batch = 1;    // wan-a14b: requests denoised together
};

void add_options(CLI::App& app, Options& o) {
  using omni::bench::at_least;
  app.option_defaults()->always_capture_default();
  app.add_option("--model", o.model,
                 "preset: Wan2.2-T2V-A14B (video, two experts) or Qwen-Image (text-to-image)")
      ->type_name("wan-a14b|qwen-image")
      ->check(CLI::IsMember({"wan-a14b", "qwen-image"}));
  app.add_option("--layers", o.layers,
                 "transformer blocks (per expert; A14B has 40 per expert, Qwen-Image 60)")
      ->type_name("N")
      ->check(at_least(1));
  app.add_option("--text-layers", o.text_layers,
                 "text encoder layers (UMT5-XXL has 24, Qwen2.5-VL-7B 28)")
      ->type_name("N")
      ->check(at_least(1));
  const auto optional_int = [&app](const char* name, std::optional<int64_t>& value,
                                   const char* help, const char* type, double min) {
    app.add_option_function<int64_t>(
           name, [&value](const int64_t& v) { value = v; }, help)
        ->type_name(type)
        ->check(at_least(min));
  };
  optional_int("--vocab", o.vocab,
               "text encoder vocabulary, at least the template tokenizer's (default the real "
               "one: UMT5-XXL 256384, Qwen2.5-VL 152064)",
               "V", 384);
  app.add_option("--dtype", o.dtype, "weights and compute dtype")
      ->type_name("bf16|fp32")
      ->check(CLI::IsMember({"bf16", "bfloat16", "fp32", "float32"}));
  optional_int("--frames", o.frames, "video frames, 4k + 1 (wan-a14b only; default 1)", "F", 1);
  optional_int("--height", o.height,
               "pixels, a multiple of 16 (default 64 for wan-a14b, 256 for qwen-image)", "H", 16);
  optional_int("--width", o.width,
               "pixels, a multiple of 16 (default 64 for wan-a14b, 256 for qwen-image)", "W", 16);
  app.add_option_function<std::string>(
         "--cfg", [&o](const std::string& v) { o.cfg = v == "on"; },
         "classifier-free guidance (default on: a negative prompt, two transformer passes a "
         "step, sharing each block's visit; off: one pass)")
      ->type_name("on|off")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--batch", o.batch,
                 "wan-a14b: requests denoised together (their own prompts and seeds), as the "
                 "diffusion stage batches them: each step's block visits serve all of them")
      ->type_name("N")
      ->check(at_least(1));
  app.add_option("--steps", o.steps, "denoising steps (>= 2: the mean leaves out the first)")
      ->type_name("S")
      ->check(at_least(2));
  optional_int("--max-sequence-length", o.max_sequence_length,
               "prompt tokens: wan-a14b pads to it (default 16; A14B's is 512), qwen-image cuts "
               "to it (default 512, the pipeline's)",
               "L", 1);
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

// ---- Shared by the presets: the folder's files, random weights ----

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

at::ScalarType weights_dtype(const Options& o) {
  return omni::bench::parse_dtype(o.dtype) == at::kBFloat16 ? at::kBFloat16 : at::kFloat;
}

// The template's tokenizer, scheduler and model_index.json, as they are.
void copy_template(const fs::path& tpl, const fs::path& dir) {
  fs::create_directories(dir);
  for (const char* part : {"tokenizer", "scheduler"}) {
    fs::copy(tpl / part, dir / part,
             fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  }
  fs::copy_file(tpl / "model_index.json", dir / "model_index.json",
                fs::copy_options::overwrite_existing);
}

// The synthetic encoder keeps the template's tokenizer, whose ids must index its embeddings.
void check_vocab(int64_t vocab, int64_t template_vocab, const fs::path& tpl) {
  OMNI_CHECK(vocab >= template_vocab, "--vocab ", vocab, " is below the vocabulary of ",
             (tpl / "text_encoder").string(), " (", template_vocab,
             "), whose tokenizer the synthetic folder keeps");
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

// The module's parameters under `prefix` (where the checkpoint keeps it); returns their bytes.
int64_t write_module(torch::nn::Module& module, const fs::path& file,
                     const std::string& prefix = "") {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  int64_t bytes = 0;
  for (const auto& item : module.named_parameters()) {
    tensors.emplace_back(prefix + item.key(), item.value());
    bytes += static_cast<int64_t>(item.value().nbytes());
  }
  omni::models::write_safetensors(file.string(), tensors);
  return bytes;
}

// One part at a time: each is freed once written. Returns the bytes written.
template <typename Module, typename... Args>
int64_t write_random(at::Generator& gen, const fs::path& file, const std::string& prefix,
                     Args&&... args) {
  Module m(std::forward<Args>(args)...);
  fill_random(m, gen);
  return write_module(m, file, prefix);
}

constexpr const char* kPrompt = "a red fox runs through fresh snow at dawn";
constexpr const char* kNegativePrompt = "blurry, low quality";

// ---- The presets ----

// What the shared measuring needs of a loaded pipeline.
using StepFn = std::function<void(const std::string& transformer)>;
struct Loaded {
  std::shared_ptr<torch::nn::Module> root;  // the offload engine's root: the pipeline
  omni::offload::ModelSpec spec;
  // Runs the preset's request on `device`, calling on_step after each denoising step with the
  // transformer that ran it; returns the frames or images (float32 in [0, 1], CPU).
  std::function<at::Tensor(const StepFn& on_step, c10::Device device)> generate;
};

// Wan2.2-T2V-A14B.
int64_t write_wan_folder(const Options& o, const fs::path& dir) {
  const fs::path tpl = OMNI_WAN_TEMPLATE;
  const bool bf16 = weights_dtype(o) == at::kBFloat16;
  Json text = read_json(tpl / "text_encoder" / "config.json");  // UMT5-XXL widths
  check_vocab(*o.vocab, text.at("vocab_size").get<int64_t>(), tpl);
  copy_template(tpl, dir);
  text["d_model"] = 4096;
  text["d_ff"] = 10240;
  text["d_kv"] = 64;
  text["num_heads"] = 64;
  text["num_layers"] = o.text_layers;
  text["num_decoder_layers"] = o.text_layers;
  text["vocab_size"] = *o.vocab;
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

  namespace m = omni::models;
  const at::ScalarType dtype = weights_dtype(o);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  int64_t bytes = write_random<m::UMT5Encoder>(
      gen, dir / "text_encoder" / "model.safetensors", "",
      m::UMT5Config::parse(m::HfConfig::load((dir / "text_encoder").string())), dtype);
  for (const char* part : {"transformer", "transformer_2"}) {
    bytes += write_random<m::WanTransformer3DModel>(
        gen, dir / part / "diffusion_pytorch_model.safetensors", "",
        m::WanTransformerConfig::load((dir / part).string()), dtype);
  }
  bytes +=
      write_random<m::AutoencoderKLWan>(gen, dir / "vae" / "diffusion_pytorch_model.safetensors",
                                        "", m::WanVAEConfig::load((dir / "vae").string()), dtype);
  return bytes;
}

Loaded load_wan(const Options& o, const fs::path& dir) {
  auto pipe = omni::models::load_wan_pipeline(dir.string(), omni::bench::parse_dtype(o.dtype));
  omni::models::WanRequest request;
  request.prompt = kPrompt;
  request.negative_prompt = kNegativePrompt;
  request.height = *o.height;
  request.width = *o.width;
  request.num_frames = *o.frames;
  request.num_inference_steps = o.steps;
  // A14B's official high-noise / low-noise guidance; 1.0 runs no guidance.
  request.guidance_scale = o.cfg ? 4.0 : 1.0;
  request.guidance_scale_2 = o.cfg ? 3.0 : 1.0;
  request.seed = o.seed;
  request.max_sequence_length = *o.max_sequence_length;
  // --batch N: N requests with their own prompt and seed, a step of all of them at a time.
  std::vector<omni::models::WanRequest> batch;
  for (int k = 0; k < o.batch; ++k) {
    batch.push_back(request);
    if (k > 0) batch.back().prompt += ", take " + std::to_string(k + 1);
    batch.back().seed = o.seed + static_cast<uint64_t>(k);
  }
  Loaded loaded{pipe, pipe->offload_spec(), nullptr};
  loaded.generate = [pipe, batch](const StepFn& on_step, c10::Device device) {
    c10::InferenceMode guard;
    std::vector<omni::models::WanDenoising> states;
    for (const auto& r : batch) {
      pipe->validate(r);
      states.push_back(pipe->start_denoise(r, pipe->encode(r, device), device));
    }
    std::vector<omni::models::WanDenoising*> running;
    for (auto& s : states) running.push_back(&s);
    while (!states.front().done()) on_step(pipe->denoise_step(running).front().transformer);
    std::vector<at::Tensor> frames;
    for (const auto& s : states) frames.push_back(pipe->decode_latents(pipe->finish_denoise(s)));
    return at::cat(frames);  // [N * F, H, W, 3]
  };
  return loaded;
}

// Qwen-Image.
int64_t write_qwen_image_folder(const Options& o, const fs::path& dir) {
  const fs::path tpl = OMNI_QWEN_IMAGE_TEMPLATE;
  Json text = read_json(tpl / "text_encoder" / "config.json");  // Qwen2.5-VL-7B's decoder
  Json& decoder = text.at("text_config");
  check_vocab(*o.vocab, decoder.at("vocab_size").get<int64_t>(), tpl);
  copy_template(tpl, dir);
  decoder["hidden_size"] = 3584;
  decoder["intermediate_size"] = 18944;
  decoder["num_attention_heads"] = 28;
  decoder["num_key_value_heads"] = 4;
  decoder["num_hidden_layers"] = o.text_layers;
  decoder["layer_types"] =
      std::vector<std::string>(static_cast<size_t>(o.text_layers), "full_attention");
  decoder["max_position_embeddings"] = 128000;
  decoder["rms_norm_eps"] = 1e-6;
  decoder["rope_parameters"]["mrope_section"] = {16, 24, 24};
  decoder["rope_parameters"]["rope_theta"] = 1000000.0;
  decoder["vocab_size"] = *o.vocab;
  text["vision_config"]["out_hidden_size"] = 3584;  // not loaded; kept consistent
  text["dtype"] = weights_dtype(o) == at::kBFloat16 ? "bfloat16" : "float32";
  write_json(dir / "text_encoder" / "config.json", text);

  Json dit = read_json(tpl / "transformer" / "config.json");  // QwenImageTransformer2DModel
  dit["num_attention_heads"] = 24;
  dit["attention_head_dim"] = 128;
  dit["joint_attention_dim"] = 3584;
  dit["in_channels"] = 64;
  dit["out_channels"] = 16;
  dit["axes_dims_rope"] = {16, 56, 56};
  dit["num_layers"] = o.layers;
  write_json(dir / "transformer" / "config.json", dit);

  Json vae = read_json(tpl / "vae" / "config.json");  // AutoencoderKLQwenImage
  vae["base_dim"] = 96;
  vae["z_dim"] = 16;
  vae["dim_mult"] = {1, 2, 4, 4};
  vae["num_res_blocks"] = 2;
  vae["temperal_downsample"] = {false, true, true};
  write_json(dir / "vae" / "config.json", vae);

  namespace m = omni::models;
  const at::ScalarType dtype = weights_dtype(o);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  // The decoder only, under the released checkpoint's "model." (no visual.*, no lm_head: the
  // pipeline reads neither).
  int64_t bytes = write_random<m::qwen2_5::TextDecoder>(
      gen, dir / "text_encoder" / "model.safetensors", "model.",
      m::qwen2_5::TextConfig::load((dir / "text_encoder").string()), dtype);
  bytes += write_random<m::QwenImageTransformer2DModel>(
      gen, dir / "transformer" / "diffusion_pytorch_model.safetensors", "",
      m::QwenImageTransformerConfig::load((dir / "transformer").string()), dtype);
  bytes +=
      write_random<m::AutoencoderKLWan>(gen, dir / "vae" / "diffusion_pytorch_model.safetensors",
                                        "", m::WanVAEConfig::load((dir / "vae").string()), dtype);
  return bytes;
}

Loaded load_qwen_image(const Options& o, const fs::path& dir) {
  auto pipe =
      omni::models::load_qwen_image_pipeline(dir.string(), omni::bench::parse_dtype(o.dtype));
  omni::models::QwenImageRequest request;
  request.prompt = kPrompt;
  // Qwen-Image's recommended setting: both passes each step. Without a negative prompt diffusers
  // runs one.
  if (o.cfg) request.negative_prompt = kNegativePrompt;
  request.true_cfg_scale = 4.0;
  request.height = *o.height;
  request.width = *o.width;
  request.num_inference_steps = o.steps;
  request.seed = o.seed;
  request.max_sequence_length = *o.max_sequence_length;
  Loaded loaded{pipe, pipe->offload_spec(), nullptr};
  loaded.generate = [pipe, request](const StepFn& on_step, c10::Device device) {
    const auto on_qwen_step = [&](const omni::models::QwenImageStep&) {
      on_step("transformer");
      return true;
    };
    return pipe->generate(request, on_qwen_step, device).images;
  };
  return loaded;
}

struct Preset {
  const char* name;        // --model
  const char* output;      // what generate() gives: "frames" or "images" (names the JSON fields)
  const char* layers_key;  // the header line's name for --layers
  bool video;              // takes --frames
  int64_t vocab, height, width, max_sequence_length;  // defaults
  int64_t (*write_folder)(const Options& o, const fs::path& dir);
  Loaded (*load)(const Options& o, const fs::path& dir);
};

const Preset kPresets[] = {
    {"wan-a14b", "frames", "layers_per_expert", true, 256384, 64, 64, 16, write_wan_folder,
     load_wan},
    {"qwen-image", "images", "layers", false, 152064, 256, 256, 512, write_qwen_image_folder,
     load_qwen_image},
};

// The preset of --model, with its defaults filled into `o`.
const Preset& resolve_preset(Options& o) {
  for (const Preset& p : kPresets) {
    if (o.model != p.name) continue;
    OMNI_CHECK(p.video || !o.frames, "--frames: ", p.name, " makes images, not video");
    OMNI_CHECK(p.video || o.batch == 1, "--batch: ", p.name,
               " runs one request (wan-a14b batches)");
    o.frames = o.frames.value_or(1);
    o.vocab = o.vocab.value_or(p.vocab);
    o.height = o.height.value_or(p.height);
    o.width = o.width.value_or(p.width);
    o.max_sequence_length = o.max_sequence_length.value_or(p.max_sequence_length);
    return p;
  }
  OMNI_THROW("unknown --model '", o.model, "' (expected wan-a14b or qwen-image)");
}

// ---- Shared by the presets: the strategies and the measuring ----

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

// The root's children whose blocks stream ("transformer", "transformer_2"): the first part of
// each block list's path, once each.
std::vector<std::string> streamed_parts(const omni::offload::ModelSpec& spec) {
  std::vector<std::string> parts;
  for (const auto& list : spec.block_lists) {
    const std::string part = list.path.substr(0, list.path.find('.'));
    if (std::find(parts.begin(), parts.end(), part) == parts.end()) parts.push_back(part);
  }
  return parts;
}

// Slab bytes of the largest block: its tensors plus the engine's alignment padding for each.
size_t block_slab_bytes(torch::nn::Module& root, const omni::offload::ModelSpec& spec) {
  size_t bytes = 0;
  for (const auto& list : spec.block_lists) {
    for (const auto& block : omni::offload::find_module(root, list.path)->children()) {
      size_t b = 0;
      for (const auto& p : block->parameters()) b += p.nbytes() + omni::offload::kTensorAlignment;
      bytes = std::max(bytes, b);
    }
  }
  return bytes;
}

struct Measured {
  std::string json;
  at::Tensor output;  // the frames or images
};

Measured run_strategy(const Options& o, const Preset& preset, const fs::path& dir,
                      const std::string& name, const at::Tensor* resident) {
  const size_t anon0 = status_bytes("RssAnon"), file0 = status_bytes("RssFile");
  const auto load_start = Clock::now();
  const Loaded pipe = preset.load(o, dir);
  OffloadConfig config = config_for(name);
  size_t budget = 0;
  if (name == "disk") {
    // The streamed blocks stay in their files: bind each transformer again to learn where each
    // tensor lies (the same bytes the loader already viewed), and cap the host cache.
    for (const auto& part : streamed_parts(pipe.spec)) {
      auto& module = *omni::offload::find_module(*pipe.root, part);
      const auto ckpt = omni::models::SafetensorsCheckpoint::open((dir / part).string());
      omni::models::add_disk_files(omni::models::load_weights(module, ckpt, ""), part + ".",
                                   config.disk_files);
    }
    config.disk_read_ahead = o.disk_units - 2;
    budget = static_cast<size_t>(o.disk_units) * block_slab_bytes(*pipe.root, pipe.spec);
    config.host_memory_budget_bytes = budget;
  }
  omni::offload::TransferEngineOptions engine_options;
  engine_options.sim_bandwidth_bytes_per_s = o.sim_bandwidth_gbps * 1e9;
  auto engine = omni::offload::make_transfer_engine(DeviceKind::kCpuSim, engine_options);
  auto backend = omni::offload::apply_offload(*pipe.root, pipe.spec, config, engine);
  engine->synchronize();
  const double load_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - load_start).count();
  const size_t anon1 = status_bytes("RssAnon"), file1 = status_bytes("RssFile");
  const size_t host_after_load = engine->host_counter()->current();

  // Steps after the first: the first also holds the prompt encoding (and model-level's swap
  // from the encoder to the first transformer).
  std::vector<Clock::time_point> at_step;
  std::vector<uint64_t> h2d_at_step;
  std::vector<std::string> transformers;
  Measured m;
  const uint64_t h2d_before = backend->stats().bytes_h2d;  // the load's uploads are not a video's
  const auto start = Clock::now();
  {
    auto scope = backend->forward_scope();
    m.output = pipe.generate(
        [&](const std::string& transformer) {
          engine->synchronize();
          at_step.push_back(Clock::now());
          h2d_at_step.push_back(backend->stats().bytes_h2d);
          transformers.push_back(transformer);
        },
        engine->compute_device());
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
  for (size_t i = 1; i < transformers.size(); ++i) {
    switches += transformers[i] != transformers[i - 1];
  }

  const std::string output = preset.output;
  std::ostringstream os;
  os << std::fixed << std::setprecision(1);
  os << "{\"model\": \"" << preset.name << "\", \"strategy\": \"" << name << "\", \"engine\": \""
     << s.strategy << "\", \"device\": \"" << s.device << "\", \"dtype\": \"" << o.dtype
     << "\", \"load_ms\": " << load_ms
     << ", \"load_rss_anon_bytes\": " << static_cast<int64_t>(anon1) - static_cast<int64_t>(anon0)
     << ", \"load_rss_file_bytes\": " << static_cast<int64_t>(file1) - static_cast<int64_t>(file0)
     << ", \"host_bytes_after_load\": " << host_after_load
     << ", \"host_peak_bytes\": " << s.host_peak_bytes << ", \"param_bytes\": " << s.param_bytes
     << ", \"resident_bytes\": " << s.resident_bytes << ", \"max_unit_bytes\": " << s.max_unit_bytes
     << ", \"peak_device_bytes\": " << s.peak_device_bytes << ", \"steps\": " << o.steps
     << ", \"cfg\": " << (o.cfg ? "true" : "false") << ", \"expert_switches\": " << switches
     << ", \"batch\": " << o.batch << ", \"step_ms\": " << step_ms << ", \"total_ms\": " << total_ms
     << ", \"outputs_per_hour\": " << 3.6e6 * o.batch / total_ms
     << ", \"h2d_bytes_per_step\": " << std::setprecision(0) << h2d_per_step
     << ", \"bytes_h2d\": " << s.bytes_h2d
     << ", \"h2d_bytes_per_output\": " << static_cast<double>(s.bytes_h2d - h2d_before) / o.batch;
  if (disk) {
    os << ", \"host_budget_bytes\": " << budget << ", \"disk_entries\": " << disk->entries
       << ", \"disk_read_bytes\": " << disk->read_bytes;
  }
  os << ", \"" << output
     << "_finite\": " << (m.output.isfinite().all().item<bool>() ? "true" : "false") << ", \""
     << output << "_equal_to_resident\": ";
  if (resident != nullptr) {
    os << (at::equal(m.output, *resident) ? "true" : "false");
  } else {
    os << "null";
  }
  os << "}";
  m.json = os.str();
  return m;
}

int run(Options& o) {
  if (o.threads) at::set_num_threads(*o.threads);
  const Preset& preset = resolve_preset(o);
  const auto names = omni::bench::split_list(o.strategies);
  for (const auto& name : names) config_for(name);  // a typo fails before the writing
  fs::path dir = o.work_dir;
  if (dir.empty()) {
    dir = fs::temp_directory_path() / ("diffusion-bench-" + std::to_string(::getpid()));
  }
  if (!(o.keep && fs::exists(dir / "model_index.json"))) {
    const auto start = Clock::now();
    const int64_t bytes = preset.write_folder(o, dir);
    std::cout << "{\"model\": \"" << preset.name << "\", \"synthetic_folder\": \"" << dir.string()
              << "\", \"weight_bytes\": " << bytes << ", \"write_ms\": " << std::fixed
              << std::setprecision(1)
              << std::chrono::duration<double, std::milli>(Clock::now() - start).count() << ", \""
              << preset.layers_key << "\": " << o.layers << ", \"text_layers\": " << o.text_layers
              << ", \"vocab\": " << *o.vocab;
    if (preset.video) std::cout << ", \"frames\": " << *o.frames;
    std::cout << ", \"height\": " << *o.height << ", \"width\": " << *o.width
              << ", \"threads\": " << at::get_num_threads()
              << ", \"sim_bandwidth_gbps\": " << o.sim_bandwidth_gbps << "}" << std::endl;
  }
  at::Tensor resident;
  for (const auto& name : names) {
    const Measured m = run_strategy(o, preset, dir, name, resident.defined() ? &resident : nullptr);
    if (name == "resident") resident = m.output;
    std::cout << m.json << std::endl;
  }
  if (!o.keep) fs::remove_all(dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "Writes a synthetic diffusers folder at a pipeline's real widths (Wan2.2-T2V-A14B or "
      "Qwen-Image: few layers, random weights), runs it under each offload strategy on the "
      "simulated device and prints one JSON line per strategy.",
      "diffusion-bench");
  Options options;
  add_options(app, options);
  return omni::bench::bench_main(app, argc, argv, [&] { return run(options); });
}
