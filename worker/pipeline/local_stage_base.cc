#include "worker/pipeline/local_stage_base.h"

#include <ATen/ATen.h>
#include <stdlib.h>

#include <fstream>

namespace omni::pipeline::local {

namespace fs = std::filesystem;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

void check_going(const StageCall& call, const CancelToken& cancel) {
  if (cancel.cancelled()) {
    throw StageError(StageError::Code::kCancelled, "", "the request was cancelled");
  }
  if (Clock::now() >= call.deadline) {
    throw StageError(StageError::Code::kDeadlineExceeded, "", "the request's deadline passed");
  }
}

at::Tensor cpu(const at::Tensor& t) { return t.to(at::kCPU).contiguous(); }

at::Tensor ids_tensor(const std::vector<int64_t>& ids) { return at::tensor(ids, at::kLong); }

std::vector<int64_t> ids_from(const at::Tensor& t) {
  const auto c = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

std::string offload_stats_json(offload::OffloadBackend& backend) {
  return backend.stats().to_json();
}

models::RunnerOffloadOptions whole_stage_offload(bool pin_memory) {
  models::RunnerOffloadOptions o;
  o.cpu_offload_enabled = true;
  o.components = {"thinker.*"};
  o.strategy = "alternating";
  o.pin_memory = pin_memory;
  o.device_budget_bytes = size_t{1} << 62;
  return o;
}

MediaFolder::MediaFolder(const std::vector<MediaFile>& media) {
  if (media.empty()) return;
  // mkdtemp replaces the trailing XXXXXX with a unique suffix and creates the folder (0700).
  std::string pattern = (fs::temp_directory_path() / "omni-media-XXXXXX").string();
  OMNI_CHECK(::mkdtemp(pattern.data()) != nullptr, "cannot create a folder for the media in ",
             fs::temp_directory_path().string());
  dir_ = pattern;
  for (size_t i = 0; i < media.size(); ++i) {
    // Keep the name's extension: the decoders report formats by name.
    const auto name = fs::path(media[i].name).filename().string();
    const auto path = dir_ / (std::to_string(i) + "-" + (name.empty() ? "input" : name));
    std::ofstream out(path, std::ios::binary);
    out.write(media[i].data.data(), static_cast<std::streamsize>(media[i].data.size()));
    OMNI_CHECK(out.good(), "cannot write ", path.string());
    (media[i].kind == "image" ? images : audio).push_back(path.string());
  }
}
MediaFolder::~MediaFolder() {
  std::error_code ec;
  if (!dir_.empty()) fs::remove_all(dir_, ec);
}

}  // namespace omni::pipeline::local
