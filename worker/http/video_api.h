// /v1/videos, OpenAI's video API in vLLM-Omni's shape, on a pipeline with a diffusion stage:
//   POST   /v1/videos              creates a job, answers its video object at once (queued)
//   GET    /v1/videos              the jobs, newest first
//   GET    /v1/videos/{id}         one job: status, progress (0-100, moving with the steps)
//   GET    /v1/videos/{id}/content its MP4 once completed (409 before, 404 when unknown)
//   DELETE /v1/videos/{id}         removes the job and its file; a running job is cancelled
//   POST   /v1/videos/sync         runs a job and answers its MP4 bytes
// Jobs run one at a time in FIFO order on one thread (the stage computes one request at a
// time anyway). They are bounded in number (more get 429) and their MP4s in bytes on disk (a
// job whose file would not fit fails); finished jobs expire after a TTL. The files live in a
// private folder (0700) made at start and removed at stop. A pipeline without a diffusion stage
// answers these routes 400 saying the model makes no video.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace omni::pipeline {
class Pipeline;
}

namespace omni::http {

class ServerMetrics;

struct VideoOptions {
  size_t max_jobs = 16;                    // stored jobs (queued, running, finished)
  uint64_t max_bytes = uint64_t{1} << 30;  // MP4 bytes on disk, all jobs together
  std::chrono::seconds ttl{3600};          // a finished job is removed this long after
  int64_t fps = 16;                        // the model's frame rate: `seconds` to frames
  std::string folder_parent;               // where the private folder goes; empty: $TMPDIR
};

class VideoApi {
 public:
  // False (with the 401 written and counted) when the request lacks the key.
  using Authorize = std::function<bool(const httplib::Request&, httplib::Response&)>;

  // Makes the folder and starts the job thread when the pipeline makes video; throws
  // std::runtime_error naming the folder when it cannot be made.
  VideoApi(pipeline::Pipeline& pipeline, VideoOptions options, std::string model_name,
           ServerMetrics& metrics, Authorize authorize);
  ~VideoApi();  // stop()
  VideoApi(const VideoApi&) = delete;
  VideoApi& operator=(const VideoApi&) = delete;

  void add_routes(httplib::Server& server);
  // Cancels the running job, joins the job thread, removes the folder. Idempotent.
  void stop();
  // Prometheus gauges: jobs stored by status, bytes on disk.
  std::string prometheus() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace omni::http
