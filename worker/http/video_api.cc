#include "worker/http/video_api.h"

#include <fcntl.h>
#include <httplib.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string_view>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "cpu_offload/logging.h"
#include "model_runner/output/frames_writer.h"
#include "worker/http/api_error.h"
#include "worker/http/bounded_http_server.h"
#include "worker/http/error_response.h"
#include "worker/http/http_head.h"
#include "worker/http/inflight_budget.h"
#include "worker/http/request_json.h"
#include "worker/http/server_metrics.h"
#include "worker/http/stage_errors.h"
#include "worker/http/video_request.h"
#include "worker/pipeline/pipeline.h"

namespace omni::http {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

int64_t unix_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}
int64_t unix_now() { return unix_now_ms() / 1000; }

// A job's stored metadata beside its prompts (the Job object, its strings, the map entry).
constexpr uint64_t kJobBytes = 1024;
// A list page: OpenAI's default and most.
constexpr int64_t kDefaultPage = 20, kMaxPage = 100;
// The MP4 is read from its file in pieces of this size.
constexpr size_t kReadChunk = size_t{64} << 10;

struct Job {
  std::string id;
  uint64_t seq = 0;  // creation order (created_at has a 1 s resolution)
  VideoRequest request;
  int64_t created_at = 0;
  bool sync = false;
  std::atomic<bool> cancel{false};  // deleted, or its sync client left
  InflightBudget::Lease stored;     // the budget's share of its metadata, while it is stored
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

// An open MP4 read by a response as it is written; the file may be deleted meanwhile.
struct OpenFile {
  int fd = -1;
  uint64_t size = 0;
  ~OpenFile() {
    if (fd >= 0) ::close(fd);
  }
};

std::shared_ptr<OpenFile> open_file(const std::string& path) {
  auto file = std::make_shared<OpenFile>();
  file->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st {};
  if (file->fd < 0 || ::fstat(file->fd, &st) != 0) return nullptr;
  file->size = static_cast<uint64_t>(st.st_size);
  return file;
}

// The server's video folders carry a file naming the process that made them: "<pid> <start>",
// its start time in clock ticks since boot (/proc/<pid>/stat field 22), so that a recycled pid
// is not taken for the owner.
constexpr const char* kOwnerFile = "owner";

std::string process_start(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t name_end = stat.rfind(')');  // the command may hold spaces and parentheses
  if (name_end == std::string::npos) return "";
  std::istringstream fields(stat.substr(name_end + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 22) return field;
  }
  return "";
}

// Removes the video folders under `parent` whose owner process is gone (a server that was
// killed cannot remove its own).
void remove_dead_folders(const fs::path& parent) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("omni-videos-", 0) != 0 || !entry.is_directory(ec)) continue;
    std::ifstream owner(entry.path() / kOwnerFile);
    pid_t pid = 0;
    std::string start;
    if (!(owner >> pid >> start) || pid <= 0) continue;                // not ours to judge
    if (::kill(pid, 0) == 0 && process_start(pid) == start) continue;  // still running
    if (::kill(pid, 0) != 0 && errno == EPERM) continue;  // another user's live process
    fs::remove_all(entry.path(), ec);
    if (!ec) log_info("serve: removed ", entry.path().string(), " of a server that is gone");
  }
}

std::string format_seconds(double s) { return detail::format_number(s); }

}  // namespace

class VideoApi::Impl {
 public:
  Impl(pipeline::Pipeline& pipeline, VideoOptions options, std::string model_name,
       ServerMetrics& metrics, InflightBudget& budget)
      : pipeline_(pipeline),
        options_(std::move(options)),
        model_name_(std::move(model_name)),
        metrics_(metrics),
        budget_(budget),
        enabled_(pipeline_.has_video()) {
    if (options_.max_cost <= 0) {
      options_.max_cost = 4.0 * static_cast<double>(options_.default_width) *
                          static_cast<double>(options_.default_height) *
                          static_cast<double>(options_.default_frames) *
                          static_cast<double>(options_.default_steps);
    }
    if (!enabled_) return;
    const fs::path parent = options_.folder_parent.empty() ? fs::temp_directory_path()
                                                           : fs::path(options_.folder_parent);
    remove_dead_folders(parent);
    std::string pattern = (parent / "omni-videos-XXXXXX").string();
    // mkdtemp: a fresh folder only this user can read, never one an attacker prepared.
    if (mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("cannot make the video folder in '" + parent.string() + "'");
    }
    folder_ = pattern;
    std::ofstream(fs::path(folder_) / kOwnerFile) << ::getpid() << " " << process_start(::getpid());
    for (size_t i = 0; i < std::max<size_t>(1, options_.concurrent_jobs); ++i) {
      workers_.emplace_back([this] { loop(); });
    }
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
    for (auto& worker : workers_) worker.join();
    workers_.clear();
    if (!folder_.empty()) {
      std::error_code ec;
      fs::remove_all(folder_, ec);
      if (ec) log_warning("serve: could not remove ", folder_, ": ", ec.message());
    }
  }

  void add_routes(httplib::Server& server) {
    server.Post("/v1/videos", [this](const httplib::Request& req, httplib::Response& res) {
      if (!ready(res)) return;
      create(req, res, false);
    });
    server.Post("/v1/videos/sync", [this](const httplib::Request& req, httplib::Response& res) {
      if (!ready(res)) return;
      create(req, res, true);
    });
    server.Get("/v1/videos", [this](const httplib::Request& req, httplib::Response& res) {
      if (!ready(res)) return;
      list(req, res);
    });
    server.Get(R"(/v1/videos/([^/]+))",
               [this](const httplib::Request& req, httplib::Response& res) {
                 if (!ready(res)) return;
                 const auto job = find(req.matches[1], res);
                 if (!job) return;
                 std::lock_guard<std::mutex> lock(mutex_);
                 ok(res, object(*job, true).dump());
               });
    server.Get(R"(/v1/videos/([^/]+)/content)",
               [this](const httplib::Request& req, httplib::Response& res) {
                 if (!ready(res)) return;
                 content(req, req.matches[1], res);
               });
    server.Delete(R"(/v1/videos/([^/]+))",
                  [this](const httplib::Request& req, httplib::Response& res) {
                    if (!ready(res)) return;
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
    answer_error(res, e, retry_after_seconds(), metrics_);
  }
  void ok(httplib::Response& res, const std::string& json) {
    res.set_content(json, "application/json");
    metrics_.count_request(200);
  }

  // Seconds until a place is likely free: the recent mean job time times the jobs ahead.
  int retry_after_seconds() const {
    const double s = std::ceil(mean_job_ms_.load() * static_cast<double>(active_.load()) / 1000.0);
    return static_cast<int>(std::clamp(s, 1.0, 3600.0));
  }

  // The model makes video; expired jobs are gone before any answer.
  bool ready(httplib::Response& res) {
    if (!enabled_) {
      send(res, api_error(400, "invalid_request_error", "unsupported",
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
    return api_error(404, "not_found_error", "video_not_found",
                     "no video '" + shown + "' (deleted, expired, or never made)", "video_id");
  }

  // The video object (OpenAI's, plus "prompt" when `with_prompt`); under mutex_.
  Json object(const Job& j, bool with_prompt) const {
    const auto or_null = [](int64_t v) { return v ? Json(v) : Json(nullptr); };
    const auto str_or_null = [](const std::string& s) {
      return s.empty() ? Json(nullptr) : Json(s);
    };
    Json error = nullptr;
    if (j.error) error = Json{{"code", j.error->code}, {"message", j.error->message}};
    Json o = Json{{"id", j.id},
                  {"object", "video"},
                  {"model", model_name_},
                  {"status", j.status},
                  {"progress", j.progress},
                  {"created_at", j.created_at},
                  {"completed_at", or_null(j.completed_at)},
                  {"expires_at", or_null((j.expires_at_ms + 999) / 1000)},
                  {"size", str_or_null(j.size)},
                  {"seconds", str_or_null(j.seconds)},
                  {"error", error}};
    if (with_prompt) o["prompt"] = j.request.prompt;
    return o;
  }

  // The cost caps of a request: width x height x frames x steps, and the bytes its frames hold.
  std::optional<ApiError> too_costly(const VideoRequest& r) const {
    const auto& d = r.diffusion;
    const double pixel_frames = static_cast<double>(d.width.value_or(options_.default_width)) *
                                static_cast<double>(d.height.value_or(options_.default_height)) *
                                static_cast<double>(d.num_frames.value_or(options_.default_frames));
    const double cost =
        pixel_frames * static_cast<double>(d.num_inference_steps.value_or(options_.default_steps));
    if (cost > options_.max_cost) {
      return api_error(400, "invalid_request_error", "job_too_large",
                       "the job's width x height x frames x steps is " +
                           detail::format_number(cost) + ", more than --max-video-cost (" +
                           detail::format_number(options_.max_cost) +
                           "): ask for a smaller size, fewer frames or fewer steps");
    }
    const double bytes = pixel_frames * static_cast<double>(kBytesPerPixelFrame);
    if (bytes > static_cast<double>(budget_.limit())) {
      return api_error(400, "invalid_request_error", "job_too_large",
                       "the job's frames would hold " + detail::format_number(bytes) +
                           " bytes, more than --max-inflight-bytes (" +
                           std::to_string(budget_.limit()) +
                           "): ask for a smaller size or fewer frames");
    }
    return std::nullopt;
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
    if (const auto e = too_costly(job->request)) {
      send(res, *e);
      return;
    }
    job->stored = budget_.lease();
    const uint64_t stored_bytes = kJobBytes + job->request.prompt.size() +
                                  job->request.diffusion.negative_prompt.value_or("").size();
    if (!job->stored.grow(stored_bytes)) {
      send(res, api_error(503, "server_error", "server_busy",
                          "the server holds as many request bytes as --max-inflight-bytes "
                          "allows: try again shortly"));
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
      send(res, api_error(503, "server_error", "shutting_down", "the server is stopping"));
      return;
    }
    if (active_ >= options_.max_jobs) {
      lock.unlock();
      send(res, rate_limited("--max-video-jobs (" + std::to_string(options_.max_jobs) +
                             ") video jobs are queued or running: try again later"));
      return;
    }
    ++active_;
    job->seq = ++seq_;
    jobs_[job->id] = job;
    queue_.push_back(job);
    changed_.notify_all();
    if (!sync) {
      const std::string body = object(*job, true).dump();
      lock.unlock();
      ok(res, body);
      return;
    }
    // Sync: wait here for the job; a client that leaves cancels it, and one that waits longer
    // than the queue timeout for it to start gets 503.
    const int socket = BoundedHttpServer::current_socket();
    const auto queued_until = Clock::now() + options_.queue_timeout;
    while (!job->finished()) {
      changed_.wait_for(lock, std::chrono::milliseconds(100));
      if (job->finished()) break;
      const bool waited_too_long = job->status == "queued" && Clock::now() >= queued_until;
      if (stopping_ || waited_too_long || BoundedHttpServer::client_gone(socket)) {
        job->cancel = true;
        erase(job->id);
        lock.unlock();
        if (stopping_) {
          send(res, api_error(503, "server_error", "shutting_down", "the server is stopping"));
        } else if (waited_too_long) {
          send(res, api_error(503, "server_error", "queue_timeout",
                              "the job waited --queue-timeout for the jobs ahead of it: "
                              "try again later"));
        } else {
          metrics_.count_request(499);
        }
        return;
      }
    }
    const std::optional<ApiError> error = job->error;
    const std::string id = job->id;
    std::shared_ptr<OpenFile> file = error ? nullptr : open_file(job->path);
    erase(id);  // the answer carries the video: nothing to keep (an open file outlives it)
    lock.unlock();
    if (error) {
      send(res, *error);
      return;
    }
    if (!file) {
      send(res, server_error("the video file could not be read back"));
      return;
    }
    res.set_header("X-Video-Id", id);
    serve_file(file, "video/mp4", res);
    metrics_.count_request(200);
  }

  // The response reads `file` as it is written: no copy of the video in memory.
  static void serve_file(const std::shared_ptr<OpenFile>& file, const std::string& type,
                         httplib::Response& res) {
    res.set_content_provider(static_cast<size_t>(file->size), type,
                             [file](size_t offset, size_t length, httplib::DataSink& sink) {
                               char buffer[kReadChunk];
                               const ssize_t n =
                                   ::pread(file->fd, buffer, std::min(length, sizeof(buffer)),
                                           static_cast<off_t>(offset));
                               return n > 0 && sink.write(buffer, static_cast<size_t>(n));
                             });
  }

  void list(const httplib::Request& req, httplib::Response& res) {
    int64_t limit = kDefaultPage;
    if (req.has_param("limit")) {
      const std::string text = req.get_param_value("limit");
      char* end = nullptr;
      limit = std::strtoll(text.c_str(), &end, 10);
      if (text.empty() || end != text.c_str() + text.size() || limit < 1 || limit > kMaxPage) {
        send(res,
             bad_request("invalid value for 'limit': must be from 1 to " + std::to_string(kMaxPage),
                         "limit", "invalid_value"));
        return;
      }
    }
    const std::string order = req.has_param("order") ? req.get_param_value("order") : "desc";
    if (order != "desc" && order != "asc") {
      send(res,
           bad_request("invalid value for 'order': \"asc\" or \"desc\"", "order", "invalid_value"));
      return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::shared_ptr<Job>> all;
    for (const auto& [id, job] : jobs_) all.push_back(job);
    std::sort(all.begin(), all.end(), [&](const auto& a, const auto& b) {
      return order == "desc" ? a->seq > b->seq : a->seq < b->seq;
    });
    auto first = all.begin();
    if (req.has_param("after")) {
      const std::string after = req.get_param_value("after");
      first = std::find_if(all.begin(), all.end(), [&](const auto& j) { return j->id == after; });
      if (first == all.end()) {
        send(res, not_found(after));
        return;
      }
      ++first;
    }
    const auto last = first + std::min<std::ptrdiff_t>(limit, all.end() - first);
    Json data = Json::array();
    for (auto it = first; it != last; ++it) data.push_back(object(**it, false));
    ok(res, Json{{"object", "list"},
                 {"data", data},
                 {"first_id", first == last ? Json(nullptr) : Json((*first)->id)},
                 {"last_id", first == last ? Json(nullptr) : Json((*(last - 1))->id)},
                 {"has_more", last != all.end()}}
                .dump());
  }

  void content(const httplib::Request& req, const std::string& id, httplib::Response& res) {
    const auto job = find(id, res);
    if (!job) return;
    std::shared_ptr<OpenFile> file;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (job->status != "completed") {
        const std::string why =
            job->status == "failed"
                ? "failed (" + (job->error ? job->error->message : std::string("no reason")) + ")"
                : "is " + job->status + " (" + std::to_string(job->progress) + "%)";
        const ApiError e = api_error(
            409, "invalid_request_error", "video_not_ready",
            "video '" + job->id + "' " + why + ": its content exists once its status is completed",
            "video_id");
        send(res, e);
        return;
      }
      file = open_file(job->path);
    }
    if (!file) {
      send(res, not_found(id));  // deleted or expired meanwhile
      return;
    }
    // httplib serves req.ranges from the provider; they are resolved here against the file
    // (the connection already dropped Range headers of more than a few spans).
    auto& ranges = const_cast<httplib::Request&>(req).ranges;
    if (!ranges.empty()) {
      std::vector<ByteRange> asked;
      for (const auto& [first, last] : ranges) {
        ByteRange r;
        if (first >= 0) r.first = static_cast<uint64_t>(first);
        if (last >= 0) r.last = static_cast<uint64_t>(last);
        asked.push_back(r);
      }
      std::vector<std::pair<uint64_t, uint64_t>> spans;
      const RangeAnswer answer = resolve_byte_ranges(asked, file->size, &spans);
      ranges.clear();
      if (answer == RangeAnswer::kUnsatisfiable) {
        res.set_header("Content-Range", "bytes */" + std::to_string(file->size));
        send(res, api_error(416, "invalid_request_error", "range_not_satisfiable",
                            "the range starts past the video's " + std::to_string(file->size) +
                                " bytes"));
        return;
      }
      for (const auto& [offset, length] : spans) {
        ranges.emplace_back(static_cast<ssize_t>(offset),
                            static_cast<ssize_t>(offset + length - 1));
      }
    }
    serve_file(file, "video/mp4", res);
    res.set_header("Accept-Ranges", "bytes");
    metrics_.count_request(ranges.empty() ? 200 : 206);
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

  // Drops a job and its file (under mutex_); a queued or running job is cancelled (and stops
  // counting as active when the job thread lets go of it).
  void erase(const std::string& id) {
    const auto it = jobs_.find(id);
    if (it == jobs_.end()) return;
    auto& job = *it->second;
    job.cancel = true;
    if (job.status == "queued") {  // its place goes at once; a running job's when it stops
      const auto queued = std::find(queue_.begin(), queue_.end(), it->second);
      if (queued != queue_.end()) {
        queue_.erase(queued);
        --active_;
      }
    }
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
      if (job->cancel) {
        --active_;
        continue;
      }
      job->status = "in_progress";
      lock.unlock();
      const auto start = Clock::now();
      run(*job);
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      lock.lock();
      --active_;
      const double mean = mean_job_ms_.load();
      mean_job_ms_ = mean == 0 ? ms : 0.8 * mean + 0.2 * ms;
      changed_.notify_all();
    }
  }

  // The job's frames in the byte budget: waits (on the job thread) until they fit.
  std::optional<InflightBudget::Lease> frames_lease(Job& job) {
    const auto& d = job.request.diffusion;
    const uint64_t bytes = static_cast<uint64_t>(d.width.value_or(options_.default_width)) *
                           static_cast<uint64_t>(d.height.value_or(options_.default_height)) *
                           static_cast<uint64_t>(d.num_frames.value_or(options_.default_frames)) *
                           kBytesPerPixelFrame;
    InflightBudget::Lease lease = budget_.lease();
    while (!lease.grow(bytes)) {
      if (job.cancel || stopping_) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return lease;
  }

  // Runs a job on the job thread; ends with its status completed or failed.
  void run(Job& job) {
    pipeline::Request request;
    request.chat.text = job.request.prompt;
    request.text_output = true;
    request.audio_output = false;
    request.parts.get<models::DiffusionRequest>() = job.request.diffusion;
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
      const auto frames = frames_lease(job);
      if (!frames) {
        throw ApiException(api_error(500, "server_error", "cancelled", "the job was cancelled"));
      }
      const auto result = pipeline_.generate(request, callbacks);
      if (!result.video.defined()) {
        throw ApiException(api_error(500, "server_error", "cancelled", "the job was cancelled"));
      }
      const int64_t fps = result.video_fps > 0 ? result.video_fps : options_.fps;
      const std::string mp4 = models::encode_mp4_bytes(result.video, fps);
      dims = std::to_string(result.video.size(2)) + "x" + std::to_string(result.video.size(1));
      seconds = format_seconds(static_cast<double>(result.video.size(0)) / fps);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (bytes_ + mp4.size() > options_.max_bytes) {
          throw ApiException(api_error(507, "server_error", "storage_full",
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
      error = api_error(500, "server_error", "cancelled", "the job was cancelled");
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
  VideoOptions options_;
  const std::string model_name_;
  ServerMetrics& metrics_;
  InflightBudget& budget_;
  const bool enabled_;
  std::string folder_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;  // a job queued or finished, or stopping
  std::map<std::string, std::shared_ptr<Job>> jobs_;
  std::deque<std::shared_ptr<Job>> queue_;
  // Jobs queued or running (the job cap); changed under mutex_, read by retry_after_seconds.
  std::atomic<size_t> active_{0};
  uint64_t bytes_ = 0;  // MP4 bytes of the stored jobs (and the one being written)
  uint64_t seq_ = 0;
  std::atomic<double> mean_job_ms_{0};
  std::atomic<bool> stopping_{false};
  bool stopped_ = false;
  std::vector<std::thread> workers_;  // the job threads
};

VideoApi::VideoApi(pipeline::Pipeline& pipeline, VideoOptions options, std::string model_name,
                   ServerMetrics& metrics, InflightBudget& budget)
    : impl_(std::make_unique<Impl>(pipeline, std::move(options), std::move(model_name), metrics,
                                   budget)) {}
VideoApi::~VideoApi() { stop(); }
void VideoApi::add_routes(httplib::Server& server) { impl_->add_routes(server); }
void VideoApi::stop() { impl_->stop(); }
std::string VideoApi::prometheus() const { return impl_->prometheus(); }

bool VideoApi::is_content_path(const std::string& path) {
  constexpr std::string_view kPrefix = "/v1/videos/", kSuffix = "/content";
  if (path.size() <= kPrefix.size() + kSuffix.size() || path.compare(0, kPrefix.size(), kPrefix) ||
      path.compare(path.size() - kSuffix.size(), kSuffix.size(), kSuffix)) {
    return false;
  }
  const auto id =
      std::string_view(path).substr(kPrefix.size(), path.size() - kPrefix.size() - kSuffix.size());
  return id.find('/') == std::string_view::npos;
}

}  // namespace omni::http
