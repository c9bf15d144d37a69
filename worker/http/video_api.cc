#include "worker/http/video_api.h"

#include <httplib.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "cpu_offload/logging.h"
#include "model_runner/output/frames_writer.h"
#include "worker/http/api_error.h"
#include "worker/http/bounded_http_server.h"
#include "worker/http/server_metrics.h"
#include "worker/http/stage_errors.h"
#include "worker/http/video_request.h"
#include "worker/pipeline/pipeline.h"

namespace omni::http {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

int64_t unix_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}
int64_t unix_now() { return unix_now_ms() / 1000; }

std::string format_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

struct Job {
  std::string id;
  uint64_t seq = 0;  // creation order (created_at has a 1 s resolution)
  VideoRequest request;
  int64_t created_at = 0;
  bool sync = false;
  std::atomic<bool> cancel{false};  // deleted, or its sync client left
  // The rest under Impl::mutex_.
  std::string status = "queued";  // queued | in_progress | completed | failed
  int progress = 0;
  int64_t completed_at = 0;  // 0: null
  // In ms, so that a job lives its whole TTL; the object shows it rounded up to seconds.
  int64_t expires_at_ms = 0;
  std::string size, seconds;
  std::optional<ApiError> error;
  std::string path;  // the MP4, once completed
  uint64_t bytes = 0;

  bool finished() const { return status == "completed" || status == "failed"; }
};

ApiError video_error(int status, std::string type, std::string code, std::string message,
                     std::string param = "") {
  ApiError e;
  e.status = status;
  e.type = std::move(type);
  e.code = std::move(code);
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

}  // namespace

class VideoApi::Impl {
 public:
  Impl(pipeline::Pipeline& pipeline, VideoOptions options, std::string model_name,
       ServerMetrics& metrics, Authorize authorize)
      : pipeline_(pipeline),
        options_(std::move(options)),
        model_name_(std::move(model_name)),
        metrics_(metrics),
        authorize_(std::move(authorize)),
        enabled_(pipeline_.has_video()) {
    if (!enabled_) return;
    const fs::path parent = options_.folder_parent.empty() ? fs::temp_directory_path()
                                                           : fs::path(options_.folder_parent);
    std::string pattern = (parent / "omni-videos-XXXXXX").string();
    // mkdtemp: a fresh folder only this user can read, never one an attacker prepared.
    if (mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("cannot make the video folder in '" + parent.string() + "'");
    }
    folder_ = pattern;
    worker_ = std::thread([this] { loop(); });
  }
  ~Impl() { stop(); }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopped_) return;
      stopped_ = true;
      stopping_ = true;
      changed_.notify_all();
    }
    if (worker_.joinable()) worker_.join();
    if (!folder_.empty()) {
      std::error_code ec;
      fs::remove_all(folder_, ec);
      if (ec) log_warning("serve: could not remove ", folder_, ": ", ec.message());
    }
  }

  void add_routes(httplib::Server& server) {
    server.Post("/v1/videos", [this](const httplib::Request& req, httplib::Response& res) {
      if (!ready(req, res)) return;
      create(req, res, false);
    });
    server.Post("/v1/videos/sync", [this](const httplib::Request& req, httplib::Response& res) {
      if (!ready(req, res)) return;
      create(req, res, true);
    });
    server.Get("/v1/videos", [this](const httplib::Request& req, httplib::Response& res) {
      if (!ready(req, res)) return;
      list(res);
    });
    server.Get(R"(/v1/videos/([^/]+))",
               [this](const httplib::Request& req, httplib::Response& res) {
                 if (!ready(req, res)) return;
                 const auto job = find(req.matches[1], res);
                 if (!job) return;
                 std::lock_guard<std::mutex> lock(mutex_);
                 ok(res, object(*job).dump());
               });
    server.Get(R"(/v1/videos/([^/]+)/content)",
               [this](const httplib::Request& req, httplib::Response& res) {
                 if (!ready(req, res)) return;
                 content(req.matches[1], res);
               });
    server.Delete(R"(/v1/videos/([^/]+))",
                  [this](const httplib::Request& req, httplib::Response& res) {
                    if (!ready(req, res)) return;
                    remove(req.matches[1], res);
                  });
  }

  std::string prometheus() const {
    std::map<std::string, int> by_status = {
        {"queued", 0}, {"in_progress", 0}, {"completed", 0}, {"failed", 0}};
    uint64_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& [id, job] : jobs_) ++by_status[job->status];
      bytes = bytes_;
    }
    std::ostringstream out;
    out << "# HELP omni_video_jobs Video jobs stored, by status.\n# TYPE omni_video_jobs gauge\n";
    for (const auto& [status, n] : by_status) {
      out << "omni_video_jobs{status=\"" << status << "\"} " << n << "\n";
    }
    out << "# HELP omni_video_bytes MP4 bytes the video jobs hold on disk.\n"
           "# TYPE omni_video_bytes gauge\nomni_video_bytes "
        << bytes << "\n";
    return out.str();
  }

 private:
  void send(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(e.json(), "application/json");
    metrics_.count_request(e.status);
  }
  void ok(httplib::Response& res, const std::string& json) {
    res.set_content(json, "application/json");
    metrics_.count_request(200);
  }

  // Authorized, and the model makes video; expired jobs are gone before any answer.
  bool ready(const httplib::Request& req, httplib::Response& res) {
    if (!authorize_(req, res)) return false;
    if (!enabled_) {
      send(res, video_error(400, "invalid_request_error", "unsupported",
                            "the model '" + model_name_ +
                                "' makes no video: /v1/videos needs a diffusers video folder "
                                "(model_index.json) as --model",
                            "model"));
      return false;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    sweep();
    return true;
  }

  std::shared_ptr<Job> find(const std::string& id, httplib::Response& res) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto it = jobs_.find(id);
      if (it != jobs_.end()) return it->second;
    }
    send(res, not_found(id));
    return nullptr;
  }

  static ApiError not_found(const std::string& id) {
    const std::string shown = id.size() <= 64 ? id : id.substr(0, 64) + "...";
    return video_error(404, "not_found_error", "video_not_found",
                       "no video '" + shown + "' (deleted, expired, or never made)", "video_id");
  }

  // The video object (OpenAI's, plus "prompt"); under mutex_.
  Json object(const Job& j) const {
    const auto or_null = [](int64_t v) { return v ? Json(v) : Json(nullptr); };
    const auto str_or_null = [](const std::string& s) {
      return s.empty() ? Json(nullptr) : Json(s);
    };
    Json error = nullptr;
    if (j.error) error = Json{{"code", j.error->code}, {"message", j.error->message}};
    return Json{{"id", j.id},
                {"object", "video"},
                {"model", model_name_},
                {"status", j.status},
                {"progress", j.progress},
                {"created_at", j.created_at},
                {"completed_at", or_null(j.completed_at)},
                {"expires_at", or_null((j.expires_at_ms + 999) / 1000)},
                {"size", str_or_null(j.size)},
                {"seconds", str_or_null(j.seconds)},
                {"prompt", j.request.prompt},
                {"error", error}};
  }

  void create(const httplib::Request& req, httplib::Response& res, bool sync) {
    auto job = std::make_shared<Job>();
    try {
      if (req.is_multipart_form_data()) {
        std::vector<FormField> fields;
        for (const auto& [name, part] : req.files) {
          fields.push_back({name, part.content, !part.filename.empty()});
        }
        job->request = parse_video_form(fields, options_.fps);
      } else {
        job->request = parse_video_request(req.body, options_.fps);
      }
    } catch (const ApiException& e) {
      send(res, e.error());
      return;
    }
    if (!job->request.model.empty() && job->request.model != model_name_) {
      const auto& m = job->request.model;
      send(res, model_not_found("the model '" + (m.size() <= 64 ? m : m.substr(0, 64) + "...") +
                                "' does not exist: this server serves '" + model_name_ + "'"));
      return;
    }
    job->id = random_id("video_");
    job->created_at = unix_now();
    job->sync = sync;
    job->size = job->request.size;
    if (job->request.seconds) job->seconds = format_seconds(*job->request.seconds);
    std::unique_lock<std::mutex> lock(mutex_);
    if (stopping_) {
      lock.unlock();
      send(res, video_error(503, "server_error", "shutting_down", "the server is stopping"));
      return;
    }
    if (jobs_.size() >= options_.max_jobs) {
      lock.unlock();
      send(res, rate_limited("more than --max-video-jobs (" + std::to_string(options_.max_jobs) +
                             ") video jobs are stored: delete finished ones (DELETE "
                             "/v1/videos/{id}) or wait for them to expire"));
      return;
    }
    job->seq = ++seq_;
    jobs_[job->id] = job;
    queue_.push_back(job);
    changed_.notify_all();
    if (!sync) {
      const std::string body = object(*job).dump();
      lock.unlock();
      ok(res, body);
      return;
    }
    // Sync: wait here for the job; a client that leaves cancels it.
    const int socket = BoundedHttpServer::current_socket();
    while (!job->finished()) {
      changed_.wait_for(lock, std::chrono::milliseconds(100));
      if (job->finished()) break;
      if (stopping_ || BoundedHttpServer::client_gone(socket)) {
        job->cancel = true;
        erase(job->id);
        lock.unlock();
        if (stopping_) {
          send(res, video_error(503, "server_error", "shutting_down", "the server is stopping"));
        } else {
          metrics_.count_request(499);
        }
        return;
      }
    }
    const std::optional<ApiError> error = job->error;
    const std::string path = job->path;
    const std::string id = job->id;
    lock.unlock();
    std::string bytes;
    if (!error) bytes = read_file(path);
    {
      std::lock_guard<std::mutex> relock(mutex_);
      erase(id);  // the answer carries the video: nothing to keep
    }
    if (error) {
      send(res, *error);
      return;
    }
    res.set_header("X-Video-Id", id);
    res.body = std::move(bytes);  // set_content would copy it
    res.set_header("Content-Type", "video/mp4");
    metrics_.count_request(200);
  }

  void list(httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::shared_ptr<Job>> all;
    for (const auto& [id, job] : jobs_) all.push_back(job);
    std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a->seq > b->seq; });
    Json data = Json::array();
    for (const auto& j : all) data.push_back(object(*j));
    ok(res, Json{{"object", "list"},
                 {"data", data},
                 {"first_id", all.empty() ? Json(nullptr) : Json(all.front()->id)},
                 {"last_id", all.empty() ? Json(nullptr) : Json(all.back()->id)},
                 {"has_more", false}}
                .dump());
  }

  void content(const std::string& id, httplib::Response& res) {
    const auto job = find(id, res);
    if (!job) return;
    std::string path;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (job->status != "completed") {
        const std::string why =
            job->status == "failed"
                ? "failed (" + (job->error ? job->error->message : std::string("no reason")) + ")"
                : "is " + job->status + " (" + std::to_string(job->progress) + "%)";
        const ApiError e = video_error(
            409, "invalid_request_error", "video_not_ready",
            "video '" + job->id + "' " + why + ": its content exists once its status is completed",
            "video_id");
        send(res, e);
        return;
      }
      path = job->path;
    }
    std::string bytes = read_file(path);
    if (bytes.empty()) {
      send(res, not_found(id));  // deleted or expired while we read
      return;
    }
    res.body = std::move(bytes);  // set_content would copy it
    res.set_header("Content-Type", "video/mp4");
    metrics_.count_request(200);
  }

  void remove(const std::string& id, httplib::Response& res) {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto it = jobs_.find(id);
    if (it == jobs_.end()) {
      lock.unlock();
      send(res, not_found(id));
      return;
    }
    const std::string found = it->first;
    erase(found);
    lock.unlock();
    ok(res, Json{{"id", found}, {"object", "video"}, {"deleted", true}}.dump());
  }

  static std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream out;
    out << in.rdbuf();
    return in ? out.str() : std::string();
  }

  // Drops a job and its file (under mutex_); a queued or running job is cancelled.
  void erase(const std::string& id) {
    const auto it = jobs_.find(id);
    if (it == jobs_.end()) return;
    auto& job = *it->second;
    job.cancel = true;
    if (!job.path.empty()) {
      std::error_code ec;
      fs::remove(job.path, ec);
      bytes_ -= job.bytes;
      job.path.clear();
      job.bytes = 0;
    }
    jobs_.erase(it);
  }

  // Removes expired jobs (under mutex_).
  void sweep() {
    const int64_t now = unix_now_ms();
    std::vector<std::string> expired;
    for (const auto& [id, job] : jobs_) {
      if (job->expires_at_ms != 0 && now >= job->expires_at_ms) expired.push_back(id);
    }
    for (const auto& id : expired) erase(id);
  }

  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      changed_.wait_for(lock, std::chrono::seconds(1),
                        [&] { return stopping_.load() || !queue_.empty(); });
      sweep();
      if (stopping_) return;
      if (queue_.empty()) continue;
      const auto job = queue_.front();
      queue_.pop_front();
      if (job->cancel) continue;
      job->status = "in_progress";
      lock.unlock();
      run(*job);
      lock.lock();
      changed_.notify_all();
    }
  }

  // Runs a job on the job thread; ends with its status completed or failed.
  void run(Job& job) {
    models::OmniRequest request;
    request.chat.text = job.request.prompt;
    request.text_output = true;
    request.audio_output = false;
    request.diffusion = job.request.diffusion;
    pipeline::PipelineCallbacks callbacks;
    callbacks.on_progress = [&](const std::map<std::string, double>& m) {
      const auto step = m.find("step"), steps = m.find("steps");
      if (step != m.end() && steps != m.end() && steps->second > 0) {
        // 100 is kept for completed: the VAE decode and the encoding come after the last step.
        const int p =
            std::clamp(static_cast<int>(std::lround(99 * step->second / steps->second)), 0, 99);
        std::lock_guard<std::mutex> lock(mutex_);
        job.progress = std::max(job.progress, p);
      }
      return !job.cancel && !stopping_;
    };
    callbacks.cancelled = [&] { return job.cancel.load() || stopping_.load(); };
    std::optional<ApiError> error;
    std::string path;
    uint64_t size = 0;
    std::string dims, seconds;
    try {
      const auto result = pipeline_.generate(request, callbacks);
      if (!result.video.defined()) {
        throw ApiException(video_error(500, "server_error", "cancelled", "the job was cancelled"));
      }
      const int64_t fps = result.video_fps > 0 ? result.video_fps : options_.fps;
      const std::string mp4 = models::encode_mp4_bytes(result.video, fps);
      dims = std::to_string(result.video.size(2)) + "x" + std::to_string(result.video.size(1));
      seconds = format_seconds(static_cast<double>(result.video.size(0)) / fps);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (bytes_ + mp4.size() > options_.max_bytes) {
          throw ApiException(video_error(507, "server_error", "storage_full",
                                         "the video (" + std::to_string(mp4.size()) +
                                             " bytes) does not fit in "
                                             "--max-video-bytes (" +
                                             std::to_string(options_.max_bytes) + " bytes, " +
                                             std::to_string(bytes_) +
                                             " held): delete finished videos and try again"));
        }
        bytes_ += mp4.size();  // reserved before writing, so two jobs cannot both fit
      }
      size = mp4.size();
      path = (fs::path(folder_) / (job.id + ".mp4")).string();
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(mp4.data(), static_cast<std::streamsize>(mp4.size()));
      out.close();
      if (!out) {
        std::lock_guard<std::mutex> lock(mutex_);
        bytes_ -= size;
        std::error_code ec;
        fs::remove(path, ec);
        throw std::runtime_error("could not write the video file");
      }
    } catch (const ApiException& e) {
      error = e.error();
    } catch (const pipeline::StageError& e) {
      error = stage_error(e);
    } catch (const std::exception& e) {
      error = server_error(published(e.what()));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error && job.cancel) {
      // Deleted while it finished: nobody will fetch the file.
      std::error_code ec;
      fs::remove(path, ec);
      bytes_ -= size;
      error = video_error(500, "server_error", "cancelled", "the job was cancelled");
    }
    if (error) {
      if (error->code.empty()) {
        error->code = error->status == 400 ? "invalid_value" : "generation_failed";
      }
      job.status = "failed";
      job.error = error;
    } else {
      job.status = "completed";
      job.progress = 100;
      job.path = path;
      job.bytes = size;
      job.size = dims;
      job.seconds = seconds;
    }
    const int64_t now = unix_now_ms();
    job.completed_at = now / 1000;
    job.expires_at_ms = now + options_.ttl.count() * 1000;
  }

  pipeline::Pipeline& pipeline_;
  const VideoOptions options_;
  const std::string model_name_;
  ServerMetrics& metrics_;
  const Authorize authorize_;
  const bool enabled_;
  std::string folder_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;  // a job queued or finished, or stopping
  std::map<std::string, std::shared_ptr<Job>> jobs_;
  std::deque<std::shared_ptr<Job>> queue_;
  uint64_t bytes_ = 0;  // MP4 bytes of the stored jobs (and the one being written)
  uint64_t seq_ = 0;
  std::atomic<bool> stopping_{false};
  bool stopped_ = false;
  std::thread worker_;
};

VideoApi::VideoApi(pipeline::Pipeline& pipeline, VideoOptions options, std::string model_name,
                   ServerMetrics& metrics, Authorize authorize)
    : impl_(std::make_unique<Impl>(pipeline, std::move(options), std::move(model_name), metrics,
                                   std::move(authorize))) {}
VideoApi::~VideoApi() { stop(); }
void VideoApi::add_routes(httplib::Server& server) { impl_->add_routes(server); }
void VideoApi::stop() { impl_->stop(); }
std::string VideoApi::prometheus() const { return impl_->prometheus(); }

}  // namespace omni::http
