#include "worker/cli/generate_video.h"

#include <ATen/ATen.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cpu_offload/check.h"
#include "model_runner/output/frames_writer.h"
#include "worker/cli/generate_backend.h"
#include "worker/pipeline/elapsed.h"

namespace omni::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

using pipeline::ms_since;

// One line redrawn in place ("\r") per step: step i/N, seconds per step, time left.
class ProgressBar {
 public:
  explicit ProgressBar(std::ostream& err) : err_(err) {}
  void step(int64_t i, int64_t n, double step_ms) {
    if (i > 1) total_ms_ += step_ms;  // the first step also encodes the prompt
    const double per_step_s = (i > 1 ? total_ms_ / static_cast<double>(i - 1) : step_ms) / 1000;
    const int64_t width = 24;
    const int64_t filled = n > 0 ? width * i / n : width;
    std::ostringstream line;
    line << "\rvllm-omni: [" << std::string(static_cast<size_t>(filled), '#')
         << std::string(static_cast<size_t>(width - filled), '.') << "] step " << i << "/" << n
         << std::fixed << std::setprecision(2) << "  " << per_step_s << " s/step  ETA "
         << std::setprecision(1) << per_step_s * static_cast<double>(n - i) << " s  ";
    err_ << line.str() << std::flush;
    open_ = true;
  }
  ~ProgressBar() {
    if (open_) err_ << "\n" << std::flush;
  }

 private:
  std::ostream& err_;
  double total_ms_ = 0;
  bool open_ = false;
};

// The largest peak_device_bytes of any stage in the backend's offload figures.
uint64_t peak_device_bytes(const Json& offload) {
  uint64_t peak = 0;
  for (const auto& [name, stage] : offload.items()) {
    if (stage.is_object() && stage.contains("peak_device_bytes") &&
        stage["peak_device_bytes"].is_number_unsigned()) {
      peak = std::max(peak, stage["peak_device_bytes"].get<uint64_t>());
    }
  }
  return peak;
}

uint64_t peak_host_bytes() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<uint64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

// The flags of the other kinds of model, and what this one reads.
const std::vector<std::string>& video_only_flags() {
  static const std::vector<std::string> flags = {
      "--num-frames", "--guidance-scale", "--guidance-scale-2", "--boundary-ratio", "--flow-shift"};
  return flags;
}

const std::vector<std::string>& image_only_flags() {
  static const std::vector<std::string> flags = {"--true-cfg-scale", "--num-images"};
  return flags;
}

struct Generated {
  pipeline::PipelineResult answer;
  std::vector<double> step_ms;
};

// The request with a progress bar on a terminal; each step's time kept for the report.
Generated generate_with_progress(const GenerateOptions& o, const CommandIo& io,
                                 GenerateBackend& backend, const char* what) {
  pipeline::Request request = to_request(o);
  request.audio_output = false;
  request.text_output = true;
  if (o.output.empty()) {
    io.err << "vllm-omni: note: no --output: the " << what << " are not written" << std::endl;
  }
  if (io.progress) io.err << "vllm-omni: generating" << std::endl;
  Generated g;
  ProgressBar bar(io.err);  // its line ends when it goes out of scope
  backend.set_progress([&](const std::map<std::string, double>& m) {
    const auto at = [&](const char* key) { return m.count(key) ? m.at(key) : 0.0; };
    g.step_ms.push_back(at("step_ms"));
    if (io.progress) {
      bar.step(static_cast<int64_t>(at("step")), static_cast<int64_t>(at("steps")), at("step_ms"));
    }
  });
  g.answer = backend.generate(request, [](const std::string&) {});
  backend.set_progress({});
  return g;
}

// The --json fields both outputs share: finish_reason, timings, peaks, offload.
Json report(const GenerateOptions& o, GenerateBackend& backend, Generated& g, double load_ms,
            double write_ms) {
  // The diffusion stage's figures (the first stage that reports generate_ms).
  std::map<std::string, double> stage;
  for (const auto& [name, metrics] : g.answer.stage_metrics) {
    if (metrics.count("generate_ms")) {
      stage = metrics;
      break;
    }
  }
  const auto metric = [&](const char* key) { return stage.count(key) ? stage.at(key) : 0.0; };
  const Json offload = Json::parse(backend.offload_json());
  Json j;
  j["output"] = o.output.empty() ? Json(nullptr) : Json(o.output);
  j["finish_reason"] = g.answer.finish_reason;
  j["timings"] = Json{{"load_ms", load_ms},
                      {"total_ms", g.answer.timings["total_ms"]},
                      {"generate_ms", metric("generate_ms")},
                      {"step_ms", g.step_ms},
                      {"step_ms_mean", metric("step_ms_mean")},
                      {"decode_ms", metric("decode_ms")},
                      {"write_ms", write_ms}};
  j["peak_device_bytes"] = peak_device_bytes(offload);
  j["peak_host_bytes"] = peak_host_bytes();
  j["offload"] = offload;
  return j;
}

void print(const CommandIo& io, const Json& j) {
  io.out << j.dump(-1, ' ', false, Json::error_handler_t::replace) << std::endl;
}

}  // namespace

DiffusionOutput diffusion_output(GenerateBackend& backend) {
  if (backend.answers_video()) return DiffusionOutput::kVideo;
  if (backend.answers_images()) return DiffusionOutput::kImages;
  return DiffusionOutput::kNone;
}

void check_flags_apply(const GenerateOptions& o, DiffusionOutput output, int64_t max_input_images) {
  const bool diffusion = output != DiffusionOutput::kNone;
  std::vector<std::string> wrong = diffusion ? omni_only_flags() : diffusion_only_flags();
  const auto& other = output == DiffusionOutput::kVideo ? image_only_flags() : video_only_flags();
  if (diffusion) wrong.insert(wrong.end(), other.begin(), other.end());
  const std::string what =
      output == DiffusionOutput::kVideo
          ? "it is a video diffusion model (flags: --prompt, --negative-prompt, --height, "
            "--width, --num-frames, --num-inference-steps, --guidance-scale, --seed, --image, "
            "--output, ...)"
      : output == DiffusionOutput::kImages
          ? "it is an image diffusion model (flags: --prompt, --negative-prompt, --height, "
            "--width, --num-inference-steps, --true-cfg-scale, --num-images, --seed, --output, "
            "...)"
          : "it is not a diffusion model (a diffusers folder with model_index.json)";
  for (const auto& flag : wrong) {
    if (o.given.count(flag) == 0) continue;
    const std::string source = o.stage_configs_path.empty() ? o.model : o.stage_configs_path;
    std::string message = flag;
    message += " does not apply to '";
    message += source;
    message += "': ";
    message += what;
    throw BadInput(message);
  }
  if (!diffusion) return;
  if (output == DiffusionOutput::kVideo && o.image.size() > 1) {
    throw BadInput("--image: a video model takes one image");
  }
  const auto given = static_cast<int64_t>(o.image.size());
  if (output == DiffusionOutput::kImages && max_input_images == 0 && given > 0) {
    throw BadInput(
        "--image: this image model makes images from text only (an image-editing "
        "checkpoint, such as a QwenImageEditPipeline folder, takes --image)");
  }
  if (output == DiffusionOutput::kImages && max_input_images > 0 && given > max_input_images) {
    throw BadInput("--image: this image model edits at most " + std::to_string(max_input_images) +
                   (max_input_images == 1 ? " image" : " images") + ", got " +
                   std::to_string(given));
  }
  if (!o.output.empty()) {
    std::error_code ec;
    const fs::path out(o.output);
    const fs::path folder = out.has_parent_path() ? out.parent_path() : fs::path(".");
    if (!fs::is_directory(folder, ec)) {
      throw BadInput("--output '" + o.output + "': folder '" + folder.string() +
                     "' does not exist");
    }
    if (fs::is_directory(out, ec)) throw BadInput("--output '" + o.output + "' is a directory");
    if (output == DiffusionOutput::kImages && out.extension() == ".mp4") {
      throw BadInput("--output '" + o.output + "': an image model writes .png or .npy");
    }
  }
}

void run_video(const GenerateOptions& o, const CommandIo& io, GenerateBackend& backend,
               double load_ms) {
  Generated g = generate_with_progress(o, io, backend, "frames");
  OMNI_CHECK(g.answer.video.defined(), "the diffusion stage returned no frames (finish reason ",
             g.answer.finish_reason, ")");
  const at::Tensor& frames = g.answer.video;
  const int64_t fps = g.answer.video_fps > 0 ? g.answer.video_fps : 16;
  double write_ms = 0;
  if (!o.output.empty()) {
    const auto start = Clock::now();
    models::write_frames(o.output, frames, fps);
    write_ms = ms_since(start);
    if (io.progress) {
      std::ostringstream line;
      line << "vllm-omni: wrote " << o.output << " (" << frames.size(0) << " frames, "
           << frames.size(2) << "x" << frames.size(1) << ", " << fps << " fps)";
      io.err << line.str() << std::endl;
    }
  }
  if (!o.json) return;
  Json j = report(o, backend, g, load_ms, write_ms);
  j["frames"] = frames.size(0);
  j["height"] = frames.size(1);
  j["width"] = frames.size(2);
  j["fps"] = fps;
  print(io, j);
}

void run_images(const GenerateOptions& o, const CommandIo& io, GenerateBackend& backend,
                double load_ms) {
  Generated g = generate_with_progress(o, io, backend, "images");
  OMNI_CHECK(g.answer.images.defined(), "the diffusion stage returned no images (finish reason ",
             g.answer.finish_reason, ")");
  const at::Tensor& images = g.answer.images;
  std::vector<std::string> written;
  double write_ms = 0;
  if (!o.output.empty()) {
    const auto start = Clock::now();
    models::write_frames(o.output, images, /*fps=*/1);  // .png or .npy: no frame rate
    write_ms = ms_since(start);
    written = fs::path(o.output).extension() == ".npy"
                  ? std::vector<std::string>{o.output}
                  : models::png_frame_paths(o.output, images.size(0));
    if (io.progress) {
      std::ostringstream line;
      line << "vllm-omni: wrote "
           << (written.size() == 1 ? written[0]
                                   : o.output + " as " + std::to_string(written.size()) + " files")
           << " (" << images.size(0) << (images.size(0) == 1 ? " image, " : " images, ")
           << images.size(2) << "x" << images.size(1) << ")";
      io.err << line.str() << std::endl;
    }
  }
  if (!o.json) return;
  Json j = report(o, backend, g, load_ms, write_ms);
  j["files"] = written;
  j["images"] = images.size(0);
  j["height"] = images.size(1);
  j["width"] = images.size(2);
  print(io, j);
}

}  // namespace omni::cli
