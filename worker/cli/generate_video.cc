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

}  // namespace

void check_flags_apply(const GenerateOptions& o, bool video) {
  const auto& wrong = video ? omni_only_flags() : diffusion_only_flags();
  for (const auto& flag : wrong) {
    if (o.given.count(flag) == 0) continue;
    const std::string source = o.stage_configs_path.empty() ? o.model : o.stage_configs_path;
    std::string message = flag;
    message += " does not apply to '";
    message += source;
    message += "': ";
    message += video ? "it is a video diffusion model (flags: --prompt, --negative-prompt, "
                       "--height, --width, --num-frames, --num-inference-steps, --seed, "
                       "--image, --output, ...)"
                     : "it is not a video diffusion model (a diffusers folder with "
                       "model_index.json)";
    throw BadInput(message);
  }
  if (!video) return;
  if (o.image.size() > 1) throw BadInput("--image: a video model takes one image");
  if (!o.output.empty()) {
    std::error_code ec;
    const fs::path out(o.output);
    const fs::path folder = out.has_parent_path() ? out.parent_path() : fs::path(".");
    if (!fs::is_directory(folder, ec)) {
      throw BadInput("--output '" + o.output + "': folder '" + folder.string() +
                     "' does not exist");
    }
    if (fs::is_directory(out, ec)) throw BadInput("--output '" + o.output + "' is a directory");
  }
}

void run_video(const GenerateOptions& o, const CommandIo& io, GenerateBackend& backend,
               double load_ms) {
  pipeline::Request request = to_request(o);
  request.audio_output = false;
  request.text_output = true;
  if (o.output.empty()) {
    io.err << "vllm-omni: note: no --output: the frames are not written" << std::endl;
  }
  if (io.progress) io.err << "vllm-omni: generating" << std::endl;
  std::vector<double> step_ms;
  pipeline::PipelineResult answer;
  {
    ProgressBar bar(io.err);  // its line ends when it goes out of scope
    backend.set_progress([&](const std::map<std::string, double>& m) {
      const auto at = [&](const char* key) { return m.count(key) ? m.at(key) : 0.0; };
      step_ms.push_back(at("step_ms"));
      if (io.progress) {
        bar.step(static_cast<int64_t>(at("step")), static_cast<int64_t>(at("steps")),
                 at("step_ms"));
      }
    });
    answer = backend.generate(request, [](const std::string&) {});
    backend.set_progress({});
  }
  OMNI_CHECK(answer.video.defined(), "the diffusion stage returned no frames (finish reason ",
             answer.finish_reason, ")");
  const at::Tensor& frames = answer.video;
  const int64_t fps = answer.video_fps > 0 ? answer.video_fps : 16;
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
  // The diffusion stage's figures (the first stage that reports generate_ms).
  std::map<std::string, double> stage;
  for (const auto& [name, metrics] : answer.stage_metrics) {
    if (metrics.count("generate_ms")) {
      stage = metrics;
      break;
    }
  }
  const auto metric = [&](const char* key) { return stage.count(key) ? stage.at(key) : 0.0; };
  const Json offload = Json::parse(backend.offload_json());
  Json j;
  j["output"] = o.output.empty() ? Json(nullptr) : Json(o.output);
  j["frames"] = frames.size(0);
  j["height"] = frames.size(1);
  j["width"] = frames.size(2);
  j["fps"] = fps;
  j["finish_reason"] = answer.finish_reason;
  j["timings"] = Json{{"load_ms", load_ms},
                      {"total_ms", answer.timings["total_ms"]},
                      {"generate_ms", metric("generate_ms")},
                      {"step_ms", step_ms},
                      {"step_ms_mean", metric("step_ms_mean")},
                      {"decode_ms", metric("decode_ms")},
                      {"write_ms", write_ms}};
  j["peak_device_bytes"] = peak_device_bytes(offload);
  j["peak_host_bytes"] = peak_host_bytes();
  j["offload"] = offload;
  io.out << j.dump(-1, ' ', false, Json::error_handler_t::replace) << std::endl;
}

}  // namespace omni::cli
