// /v1/videos, OpenAI's video API in vLLM-Omni's shape, on a pipeline with a diffusion stage:
//   POST   /v1/videos              creates a job, answers its video object at once (queued)
//   GET    /v1/videos              the jobs, newest first, a page at a time (?limit=&after=)
//   GET    /v1/videos/{id}         one job: status, progress (0-100, moving with the steps)
//   GET    /v1/videos/{id}/content its MP4 once completed (409 before, 404 when unknown), read
//                                  from the file; a Range of a few spans is served (206)
//   DELETE /v1/videos/{id}         removes the job and its file; a running job is cancelled
//   POST   /v1/videos/sync         runs a job and answers its MP4 bytes
// Jobs start in FIFO order on `concurrent_jobs` threads (as many as the diffusion stage
// denoises together). Queued and running jobs are bounded in number (more get 429 with
// Retry-After); finished ones by the MP4 bytes they hold on disk (a job whose file would not fit
// fails) and a TTL. A job's cost (width x height x frames x steps) is capped, and the frames it
// holds while it is encoded are taken from the server's byte budget before it runs. The files live
// in a private folder (0700) made at start and removed at stop; folders of servers that died are
// removed at start. The key is checked before any handler runs (chat_server.h). A pipeline
// without a diffusion stage answers these routes 400 saying the model makes no video.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace httplib {
class Server;
}  // namespace httplib

namespace omni::pipeline {
class Pipeline;
}

namespace omni::http {

class InflightBudget;
class ServerMetrics;

struct VideoOptions {
  size_t max_jobs = 16;                    // queued and running jobs
  size_t concurrent_jobs = 1;              // jobs running at once (the stage's batch)
  uint64_t max_bytes = uint64_t{1} << 30;  // MP4 bytes on disk, all jobs together
  std::chrono::seconds ttl{3600};          // a finished job is removed this long after
  int64_t fps = 16;                        // the model's frame rate: `seconds` to frames
  std::string folder_parent;               // where the private folder goes; empty: $TMPDIR
  // The model's defaults, for the fields a request leaves unset.
  int64_t default_width = 832, default_height = 480, default_frames = 81, default_steps = 50;
  // width x height x frames x steps a job may ask for; 0: 4 times the defaults' product.
  double max_cost = 0;
  // How long a /v1/videos/sync request waits for its job to start (then 503).
  std::chrono::milliseconds queue_timeout{60000};
};

class VideoApi {
 public:
  // Makes the folder (removing those of dead servers) and starts the job threads when the
  // pipeline makes video; throws std::runtime_error naming the folder when it cannot be made.
  VideoApi(pipeline::Pipeline& pipeline, VideoOptions options, std::string model_name,
           ServerMetrics& metrics, InflightBudget& budget);
  ~VideoApi();  // stop()
  VideoApi(const VideoApi&) = delete;
  VideoApi& operator=(const VideoApi&) = delete;

  void add_routes(httplib::Server& server);
  // Cancels the running jobs, joins the job threads, removes the folder. Idempotent.
  void stop();
  // Prometheus gauges: jobs stored by status, bytes on disk.
  std::string prometheus() const;

  // "/v1/videos/{id}/content": the one route that serves byte ranges.
  static bool is_content_path(const std::string& path);
  // What one frame-pixel of a job holds while its video is made and encoded: the float RGB
  // frames the pipeline returns and the encoder's copy.
  static constexpr uint64_t kBytesPerPixelFrame = 16;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace omni::http
