#include "worker/http/chat_server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <map>
#include <sstream>
#include <thread>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "cpu_offload/check.h"
#include "cpu_offload/logging.h"
#include "worker/http/admission_queue.h"
#include "worker/http/api_error.h"
#include "worker/http/ascii_text.h"
#include "worker/http/base64.h"
#include "worker/http/bounded_http_server.h"
#include "worker/http/chat_request.h"
#include "worker/http/error_response.h"
#include "worker/http/image_api.h"
#include "worker/http/inflight_budget.h"
#include "worker/http/openai_protocol.h"
#include "worker/http/playground.h"
#include "worker/http/request_guard.h"
#include "worker/http/request_json.h"
#include "worker/http/server_metrics.h"
#include "worker/http/sse_queue.h"
#include "worker/http/stage_errors.h"
#include "worker/http/video_api.h"
#include "worker/http/wav_bytes.h"
#include "worker/pipeline/elapsed.h"

namespace omni::http {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

using pipeline::ms_since;

// The bytes the request this thread serves holds in the budget: its body from the head on,
// then what parsing and answering it add. Set by the pre-routing check, read by the handler on
// the same thread; BoundedHttpServer owns it until the response has been written.
thread_local std::weak_ptr<InflightBudget::Lease> t_lease;

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A request value quoted in an error: its first 64 bytes (a 1 MB "model" is not echoed whole).
std::string truncated(const std::string& value) {
  constexpr size_t kMax = 64;
  return value.size() <= kMax ? value : value.substr(0, kMax) + "...";
}

// What a chat request holds beyond its body once parsed: the JSON values, the parsed texts and
// media (about the body again), then its images decoded (RGB and float patches) and its audio
// decoded to samples.
uint64_t parsed_bytes(const ChatCompletionRequest& r, size_t body_bytes) {
  uint64_t audio = 0;
  for (const auto& a : r.audio) audio += a.data.size();
  return static_cast<uint64_t>(r.json_values) * detail::kJsonValueBytes + body_bytes +
         r.image_pixels * 16 + audio * 8;
}

// Streamed events a slow client has not read yet, at most: beyond, it is dropped (the request
// is cancelled) rather than held without bound.
constexpr size_t kMaxUnsentStreamBytes = size_t{16} << 20;

}  // namespace

class ChatServer::Impl {
 public:
  Impl(pipeline::Pipeline& pipeline, ServerOptions options)
      : pipeline_(pipeline),
        options_(std::move(options)),
        budget_(
            options_.max_inflight_bytes != 0
                ? options_.max_inflight_bytes
                : default_inflight_bytes(4 * static_cast<uint64_t>(options_.max_request_bytes))),
        admission_(options_.max_concurrent_requests, options_.max_queued_requests,
                   options_.queue_timeout) {
    server_ = std::make_unique<BoundedHttpServer>(options_.connections, options_.tls_cert,
                                                  options_.tls_key);
    server_->set_payload_max_length(options_.max_request_bytes);
    if (options_.limits.max_text_bytes == 0) {
      // Text that could not fit the model's context is refused before it is even parsed.
      const auto [bytes, tokens] = pipeline_.prompt_limit();
      options_.limits.max_text_bytes = bytes;
      options_.limits.text_limit_why =
          "the model's context of " + std::to_string(tokens) + " tokens";
    }
    access_.api_key = options_.api_key;
    access_.metrics_public = options_.metrics_public;
    access_.max_body_bytes = options_.max_request_bytes;
    // Before the body is read: what its limit cannot bound, and what a web page could send.
    hosts_ = host_policy(options_.host, !options_.api_key.empty(), options_.allowed_hosts);
    server_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      const auto refusal = refuse_from_head(req, true);
      if (!refusal) return httplib::Server::HandlerResponse::Unhandled;
      // The body was not read: the connection cannot carry another request.
      res.set_header("Connection", "close");
      BoundedHttpServer::close_after_response();
      answer_error(res, *refusal);
      return httplib::Server::HandlerResponse::Handled;
    });
    // A client that asks before sending its body learns the refusal before it sends a byte.
    server_->set_expect_100_continue_handler(
        [this](const httplib::Request& req, httplib::Response& res) {
          const auto refusal = refuse_from_head(req, false);
          if (!refusal) return 100;
          answer_error(res, *refusal);
          return refusal->status;
        });
    server_->set_range_routes([](const HttpHead& head) {
      return (head.method == "GET" || head.method == "HEAD") &&
             VideoApi::is_content_path(head.path());
    });
    server_->set_overflow_answer([this](const HttpHead& head) { return overflow_answer(head); });
    // CORS, for the origins named only: browsers ask first (OPTIONS, no key), then read
    // answers that carry their origin.
    server_->Options(R"(/v1/.*)",
                     [](const httplib::Request&, httplib::Response& res) { res.status = 204; });
    server_->set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      const std::string origin = req.get_header_value("Origin");
      if (!origin_allowed(origin, options_.allowed_origins)) return;
      res.set_header("Access-Control-Allow-Origin", origin);
      res.set_header("Vary", "Origin");
      if (req.method == "OPTIONS") {
        res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
        res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
        res.set_header("Access-Control-Max-Age", "600");
      }
    });
    server_->set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      // httplib's own refusals (a body over the limit, an unknown route) as OpenAI errors;
      // httplib calls this for every status >= 400, also for the errors the handlers wrote.
      if (!res.body.empty()) return;
      if (res.status == 413) {
        ApiError e;
        e.status = 413;
        e.message = "the request body is larger than --max-request-bytes (" +
                    std::to_string(options_.max_request_bytes) + " bytes)";
        e.code = "request_too_large";
        write_error(res, e);
      } else if (res.status == 404) {
        ApiError e;
        e.status = 404;
        e.type = "not_found_error";
        e.message = "no route " + truncated(req.method) + " " + truncated(req.path);
        write_error(res, e);
      }
      metrics_.count_request(res.status);
    });
    server_->set_exception_handler(
        [this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
          ApiError e;
          e.status = 500;
          e.type = "server_error";
          try {
            std::rethrow_exception(std::move(ep));
          } catch (const std::exception& ex) {
            e.message = published(ex.what());
          } catch (...) {
            e.message = "unknown error";
          }
          write_error(res, e);
          metrics_.count_request(500);
        });
    server_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(health_json(&res.status), "application/json");
    });
    server_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      // "speakers" and "default_speaker" are ours: the voices the model speaks with (the
      // playground's menu).
      res.set_content(Json{{"object", "list"},
                           {"data",
                            {{{"id", options_.model_name},
                              {"object", "model"},
                              {"created", started_},
                              {"owned_by", "omni-offload"},
                              {"speakers", pipeline_.voices()},
                              {"default_speaker", pipeline_.default_voice()},
                              // Ours too: /v1/videos answers (the playground's video tab),
                              // /v1/images/generations answers, and how many images an edit
                              // may give /v1/images/edits (0: none).
                              {"video", pipeline_.has_video()},
                              {"image", pipeline_.has_images()},
                              {"image_edit", images_->max_input_images()}}}}}
                          .dump(),
                      "application/json");
    });
    server_->Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(playground_html(), "text/html; charset=utf-8");
    });
    server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_text(), "text/plain; version=0.0.4");
    });
    VideoOptions videos = options_.videos;
    videos.queue_timeout = options_.queue_timeout;
    videos_ = std::make_unique<VideoApi>(pipeline_, videos, options_.model_name, metrics_, budget_);
    videos_->add_routes(*server_);
    ImageOptions images = options_.images;
    images.queue_timeout = options_.queue_timeout;
    images_ = std::make_unique<ImageApi>(pipeline_, images, options_.model_name, metrics_, budget_);
    images_->add_routes(*server_);
    server_->Post("/v1/chat/completions",
                  [this](const httplib::Request& req, httplib::Response& res) {
                    chat_completions(req, res);
                  });
  }

  void start() {
    port_ = options_.port == 0
                ? server_->bind_to_any_port(options_.host)
                : (server_->bind_to_port(options_.host, options_.port) ? options_.port : -1);
    if (port_ < 0) {
      throw std::runtime_error("cannot listen on " + options_.host + ":" +
                               std::to_string(options_.port));
    }
    if (!BoundedHttpServer::widen_listen_backlog(port_)) {
      log_warning("serve: could not raise the listen backlog of port ", port_,
                  "; bursts of connections may wait");
    }
    log_info("serve: requests may hold ", budget_.limit() >> 20,
             " MiB at once (--max-inflight-bytes); ", options_.max_concurrent_requests,
             " chat requests run at once, ", options_.max_queued_requests, " wait");
    thread_ = std::thread([this] { server_->listen_after_bind(); });
  }
  int port() const { return port_; }
  void stop() {
    admission_.stop();  // queued requests answer 503 at once
    videos_->stop();    // a /v1/videos/sync handler waiting for its job returns
    images_->stop();    // image requests waiting answer 503, the running one is cancelled
    server_->stop();
    if (thread_.joinable()) thread_.join();
  }
  void wait() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  // The refusal of a request from its head, or nullopt. `take_body` (the pre-routing check, not
  // the 100-continue one): the body's bytes are taken from the budget here, before httplib
  // reads them, and kept until the request has been answered.
  std::optional<ApiError> refuse_from_head(const httplib::Request& req, bool take_body) {
    RequestHead head{req.method, [&req](const std::string& name) {
                       std::vector<std::string> values;
                       const auto range = req.headers.equal_range(name);
                       for (auto it = range.first; it != range.second; ++it) {
                         values.push_back(it->second);
                       }
                       return values;
                     }};
    head.path = req.path;
    if (auto refusal = refuse_request_head(head, hosts_)) return refusal;
    if (auto refusal = refuse_request_access(head, access_)) return refusal;
    t_lease.reset();
    if (!take_body || !takes_body(head)) return std::nullopt;
    const uint64_t length = req.get_header_value<uint64_t>("Content-Length");
    // A form's parts are copied out of the body as it is read; JSON is read into one string.
    const uint64_t bytes = req.is_multipart_form_data() ? 2 * length : length;
    auto lease = std::make_shared<InflightBudget::Lease>(budget_.lease());
    if (!lease->grow(bytes)) return budget_refusal(bytes);
    if (!req.is_multipart_form_data()) const_cast<httplib::Request&>(req).body.reserve(length);
    t_lease = lease;
    BoundedHttpServer::hold_until_answered(std::move(lease));
    return std::nullopt;
  }

  ApiError budget_refusal(uint64_t bytes) const {
    ApiError e;
    e.status = bytes > budget_.limit() ? 413 : 503;
    e.type = e.status == 503 ? "server_error" : "invalid_request_error";
    e.code = e.status == 503 ? "server_busy" : "request_too_large";
    e.message = e.status == 503
                    ? "the server holds as many request bytes as --max-inflight-bytes (" +
                          std::to_string(budget_.limit()) + ") allows: try again shortly"
                    : "the request needs " + std::to_string(bytes) +
                          " bytes, more than --max-inflight-bytes (" +
                          std::to_string(budget_.limit()) + ")";
    return e;
  }

  // An error answer, counted; 429 and 503 say when to come back.
  void answer_error(httplib::Response& res, const ApiError& e) {
    http::answer_error(res, e, admission_.retry_after_seconds(), metrics_);
  }

  // What a connection over the caps is answered, from its head (overflow_lane.h).
  std::string overflow_answer(const HttpHead& head) {
    const bool get = head.method == "GET" || head.method == "HEAD";
    if (get && head.path() == "/health") {
      int status = 200;
      const std::string body = health_json(&status);
      return raw_http_response(status, "application/json", body);
    }
    if (get && head.path() == "/metrics" &&
        (options_.metrics_public || options_.api_key.empty() ||
         key_matches(head.value("Authorization"), options_.api_key))) {
      return raw_http_response(200, "text/plain; version=0.0.4", metrics_text());
    }
    ApiError e;
    e.status = 503;
    e.type = "server_error";
    e.code = "too_many_connections";
    e.message =
        "the server (or this client's share of it) has too many open connections: "
        "try again later";
    metrics_.count_request(503);
    return raw_http_response(503, "application/json", e.json(), "Retry-After: 1\r\n");
  }

  std::string health_json(int* status) {
    std::string why;
    const bool ok = !options_.healthy || options_.healthy(&why);
    *status = ok ? 200 : 503;
    return Json{{"status", ok ? "ok" : "unhealthy"}, {"detail", why}}.dump();
  }

  std::string metrics_text() {
    return metrics_.prometheus() + admission_metrics() + connection_metrics() +
           videos_->prometheus() + images_->prometheus() + offload_metrics(pipeline_.stats_json());
  }

  // The request as the pipeline takes it.
  pipeline::Request to_pipeline(const ChatCompletionRequest& r,
                                std::vector<pipeline::MediaFile>& media) {
    pipeline::Request o;
    to_conversation(r, o.chat, media);
    const auto has = [&](const char* m) {
      return std::find(r.modalities.begin(), r.modalities.end(), m) != r.modalities.end();
    };
    o.text_output = true;  // the text is the transcript of the audio either way
    o.audio_output = has("audio") && pipeline_.has_speech();
    if (has("audio") && !pipeline_.has_speech() && r.modalities_given) {
      throw ApiException(
          bad_request("the model answers in text only: ask for modalities "
                      "[\"text\"]",
                      "modalities", "unsupported"));
    }
    o.voice = r.speaker;
    o.sampling.temperature = r.temperature;
    o.sampling.top_p = r.top_p;
    o.sampling.top_k = r.top_k;
    o.sampling.repetition_penalty = r.repetition_penalty;
    o.sampling.max_tokens = r.max_tokens;
    o.sampling.max_audio_frames = r.max_audio_frames;
    o.sampling.seed = r.seed;
    o.stop_strings = r.stop;
    // The request's own values win over these (Request::sampling).
    if (options_.sampling_defaults) options_.sampling_defaults(o);
    return o;
  }

  void check_model_and_speaker(const ChatCompletionRequest& r) {
    if (pipeline_.has_images()) {
      throw ApiException(bad_request("the model '" + options_.model_name +
                                         "' makes images, not chat answers: use POST "
                                         "/v1/images/generations",
                                     "model", "unsupported"));
    }
    if (pipeline_.has_video()) {
      // A diffusion pipeline would make a whole default-sized video and answer no text.
      throw ApiException(bad_request("the model '" + options_.model_name +
                                         "' makes video, not chat answers: use POST /v1/videos",
                                     "model", "unsupported"));
    }
    if (r.model != options_.model_name) {
      ApiError e;
      e.status = 404;
      e.type = "not_found_error";
      e.param = "model";
      e.code = "model_not_found";
      e.message = "the model '" + truncated(r.model) + "' does not exist: this server serves '" +
                  options_.model_name + "'";
      throw ApiException(e);
    }
    if (!r.speaker.empty() && pipeline_.has_speech()) {
      const auto known = pipeline_.voices();
      if (std::find(known.begin(), known.end(), ascii_lower(r.speaker)) == known.end()) {
        std::string list;
        for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
        throw ApiException(
            bad_request("unknown speaker '" + truncated(r.speaker) + "' (known: " + list + ")",
                        "speaker", "unknown_speaker"));
      }
    }
  }

  // A place among the running requests, after a wait in the queue; false with the refusal
  // answered.
  bool admit(AdmissionQueue::Slot& slot, httplib::Response& res) {
    const int socket = BoundedHttpServer::current_socket();
    const auto outcome =
        admission_.acquire(slot, [socket] { return BoundedHttpServer::client_gone(socket); });
    ApiError e;
    switch (outcome) {
      case AdmissionQueue::Outcome::kAdmitted:
        return true;
      case AdmissionQueue::Outcome::kGone:
        metrics_.count_request(499);
        return false;
      case AdmissionQueue::Outcome::kQueueFull:
        e = rate_limited("more than --max-concurrent-requests (" +
                         std::to_string(options_.max_concurrent_requests) +
                         ") requests are running and --max-queued-requests (" +
                         std::to_string(options_.max_queued_requests) +
                         ") are waiting: try again later");
        e.code = "too_many_requests";
        break;
      case AdmissionQueue::Outcome::kTimedOut:
        e = server_error("the request waited --queue-timeout (" +
                         std::to_string(options_.queue_timeout.count() / 1000.0) +
                         " s) for a running place: try again later");
        e.status = 503;
        e.code = "queue_timeout";
        break;
      case AdmissionQueue::Outcome::kStopping:
        e = server_error("the server is stopping");
        e.status = 503;
        e.code = "shutting_down";
        break;
    }
    answer_error(res, e);
    return false;
  }

  void chat_completions(const httplib::Request& req, httplib::Response& res) {
    const auto start = Clock::now();
    const auto lease = t_lease.lock();  // the body's bytes, taken from the head
    ChatCompletionRequest parsed;
    std::vector<pipeline::MediaFile> media;
    pipeline::Request request;
    // A full queue refuses before the body is parsed.
    if (admission_.full()) {
      AdmissionQueue::Slot none;
      admit(none, res);
      return;
    }
    try {
      parsed = parse_chat_completion(req.body, options_.limits);
      const uint64_t bytes = parsed_bytes(parsed, req.body.size());
      if (lease == nullptr || !lease->grow(bytes)) throw ApiException(budget_refusal(bytes));
      check_model_and_speaker(parsed);
      request = to_pipeline(parsed, media);
    } catch (const ApiException& e) {
      answer_error(res, e.error());
      return;
    }
    auto slot = std::make_shared<AdmissionQueue::Slot>();
    if (!admit(*slot, res)) return;
    if (parsed.stream) {
      stream(parsed, std::move(request), std::move(media), start, slot, res);
    } else {
      answer(parsed, request, media, start, *lease, res);
    }
  }

  void answer(const ChatCompletionRequest& parsed, const pipeline::Request& request,
              const std::vector<pipeline::MediaFile>& media, Clock::time_point start,
              InflightBudget::Lease& lease, httplib::Response& res) {
    try {
      pipeline::PipelineCallbacks callbacks;
      // A client that gave up: stop the stages and free the slot (the pipeline polls this).
      callbacks.cancelled = [socket = BoundedHttpServer::current_socket()] {
        return BoundedHttpServer::client_gone(socket);
      };
      bool first_text = true;
      callbacks.on_text = [&](const std::string&) {
        if (first_text) metrics_.observe_ttft(ms_since(start));
        first_text = false;
        return true;
      };
      const auto result = pipeline_.generate(request, callbacks, Clock::time_point::max(), &media);
      std::optional<AudioOutput> audio;
      if (request.audio_output && result.audio.waveform.defined()) {
        const auto samples = result.audio.waveform.to(at::kFloat).contiguous();
        // The WAV, its base64 and the JSON that quotes it, held until the answer is sent.
        const uint64_t wav = 44 + 2 * static_cast<uint64_t>(samples.numel());
        if (!lease.grow(wav + 2 * (wav / 3 * 4 + 4))) {
          throw ApiException(budget_refusal(lease.bytes() + wav));
        }
        AudioOutput a;
        a.id = random_id("audio-");
        a.wav_base64 =
            base64_encode(wav_bytes(samples.data_ptr<float>(), static_cast<size_t>(samples.numel()),
                                    result.audio.sample_rate));
        a.expires_at = unix_now() + 3600;
        a.transcript = result.text;
        audio = a;
        metrics_.observe_ttfa(ms_since(start));
      }
      Usage usage = usage_of(result);
      const bool text_asked = std::find(parsed.modalities.begin(), parsed.modalities.end(),
                                        "text") != parsed.modalities.end();
      res.set_content(
          completion_json(random_id("chatcmpl-"), options_.model_name, unix_now(),
                          text_asked ? std::optional<std::string>(result.text) : std::nullopt,
                          audio, finish_reason(result.finish_reason), usage),
          "application/json");
      metrics_.count_done(result, ms_since(start));
      metrics_.count_request(result.finish_reason == "cancelled" ? 499 : 200);
    } catch (const ApiException& e) {
      answer_error(res, e.error());
    } catch (const pipeline::StageError& e) {
      answer_error(res, stage_error(e));
    } catch (const std::exception& e) {
      answer_error(res, server_error(published(e.what())));
    }
  }

  void stream(const ChatCompletionRequest& parsed, pipeline::Request request,
              std::vector<pipeline::MediaFile> media, Clock::time_point start,
              const std::shared_ptr<AdmissionQueue::Slot>& slot, httplib::Response& res) {
    const std::string id = random_id("chatcmpl-");
    const int64_t created = unix_now();
    const std::string model = options_.model_name;
    auto queue = std::make_shared<SseQueue>(
        [id, model, created](const std::string& text, bool first) {
          return sse_event(chunk_json(id, model, created, "text", text, first, std::nullopt));
        },
        kMaxUnsentStreamBytes);
    const bool include_usage = parsed.include_usage;
    request.waveform = false;  // the answer is the streamed chunks
    // The pipeline runs on a thread of its own; the HTTP thread writes what it produces.
    auto worker = std::make_shared<std::thread>([this, queue, id, created, model, include_usage,
                                                 start, slot, request = std::move(request),
                                                 media = std::move(media)]() mutable {
      bool first = true;
      bool first_audio = true;
      int sample_rate = 0;  // the audio stage's, asked before the first chunk
      pipeline::PipelineCallbacks callbacks;
      callbacks.cancelled = [&] { return queue->gone(); };
      callbacks.on_text = [&](const std::string& text) {
        if (first) metrics_.observe_ttft(ms_since(start));
        queue->push_text(text, first);
        first = false;
        return !queue->gone();
      };
      callbacks.on_audio = [&](const at::Tensor& samples) {
        const auto s = samples.to(at::kFloat).contiguous();
        if (first_audio) metrics_.observe_ttfa(ms_since(start));
        first_audio = false;
        queue->push(sse_event(
            chunk_json(id, model, created, "audio",
                       base64_encode(wav_bytes(s.data_ptr<float>(), static_cast<size_t>(s.numel()),
                                               sample_rate)),
                       false, std::nullopt)));
        return !queue->gone();
      };
      int status = 200;
      std::string tail;  // the events after the pipeline is done
      try {
        if (request.audio_output) sample_rate = static_cast<int>(pipeline_.audio_sample_rate());
        const auto result =
            pipeline_.generate(request, callbacks, Clock::time_point::max(), &media);
        tail = sse_event(
            chunk_json(id, model, created, "text", "", first, finish_reason(result.finish_reason)));
        if (include_usage)
          tail += sse_event(usage_chunk_json(id, model, created, usage_of(result)));
        metrics_.count_done(result, ms_since(start));
        if (queue->gone()) status = 499;
      } catch (const pipeline::StageError& e) {
        const auto a = stage_error(e);
        status = a.status;
        tail = sse_event(a.json());
      } catch (const std::exception& e) {
        ApiError a = server_error(published(e.what()));
        status = a.status;
        tail = sse_event(a.json());
      }
      // The place goes back before the last events leave: a client that sends its next
      // request as soon as it reads [DONE] finds it free.
      slot->release();
      queue->push(tail + sse_done());
      metrics_.count_request(status);
      queue->finish();
    });
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [queue](size_t, httplib::DataSink& sink) {
          const auto taken = queue->take(std::chrono::milliseconds(100));
          if (!taken.events.empty() &&
              !(sink.is_writable() && sink.write(taken.events.data(), taken.events.size()))) {
            queue->client_left();  // the callbacks cancel the request in every stage
            return false;
          }
          if (taken.done) sink.done();
          return true;
        },
        [queue, worker, slot](bool) {
          // The response is over (sent, or the client left): wait for the pipeline to stop.
          queue->client_left();
          if (worker->joinable()) worker->join();
          slot->release();
        });
  }

  static std::string finish_reason(const std::string& thinker) {
    return thinker == "length" ? "length" : "stop";
  }

  static Usage usage_of(const pipeline::PipelineResult& r) {
    Usage u;
    for (const auto& [stage, m] : r.stage_metrics) {
      const auto it = m.find("prompt_tokens");
      if (it != m.end()) u.prompt_tokens = static_cast<int64_t>(it->second);
    }
    u.completion_tokens = static_cast<int64_t>(r.tokens.size());
    return u;
  }

  std::string admission_metrics() const {
    std::ostringstream out;
    const auto gauge = [&](const char* name, const char* help, uint64_t value) {
      out << "# HELP " << name << " " << help << "\n# TYPE " << name << " gauge\n"
          << name << " " << value << "\n";
    };
    const auto counter = [&](const char* name, const char* help, uint64_t value) {
      out << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n"
          << name << " " << value << "\n";
    };
    gauge("omni_requests_running", "Chat requests running now.",
          static_cast<uint64_t>(admission_.running()));
    gauge("omni_requests_queued", "Chat requests waiting for a running place.",
          static_cast<uint64_t>(admission_.queued()));
    counter("omni_requests_queue_full_total", "Chat requests refused with 429: the queue was full.",
            admission_.refused_full());
    counter("omni_requests_queue_timeout_total",
            "Chat requests refused with 503 after waiting --queue-timeout.",
            admission_.timed_out());
    gauge("omni_inflight_bytes", "Bytes requests hold now (bodies, parsed JSON, media, answers).",
          budget_.used());
    gauge("omni_inflight_bytes_peak", "The most bytes requests held at once.", budget_.peak());
    gauge("omni_inflight_bytes_limit", "--max-inflight-bytes.", budget_.limit());
    counter("omni_inflight_refused_total",
            "Requests refused because their bytes did not fit --max-inflight-bytes.",
            budget_.refused());
    return out.str();
  }

  std::string connection_metrics() const {
    return "# HELP omni_http_connections_open HTTP connections open now.\n"
           "# TYPE omni_http_connections_open gauge\nomni_http_connections_open " +
           std::to_string(server_->open_connections()) +
           "\n# HELP omni_http_connections_refused_total Connections refused over every cap.\n"
           "# TYPE omni_http_connections_refused_total counter\n"
           "omni_http_connections_refused_total " +
           std::to_string(server_->refused_connections()) +
           "\n# HELP omni_http_connections_overflowed_total Connections over --max-connections "
           "or --max-connections-per-client, answered from their head alone.\n"
           "# TYPE omni_http_connections_overflowed_total counter\n"
           "omni_http_connections_overflowed_total " +
           std::to_string(server_->overflowed_connections()) +
           "\n# HELP omni_http_connections_evicted_total Idle connections closed to make room "
           "for a client that held fewer.\n# TYPE omni_http_connections_evicted_total counter\n"
           "omni_http_connections_evicted_total " +
           std::to_string(server_->evicted_connections()) +
           "\n# HELP omni_http_connections_failed_total Connections closed on an error of the "
           "server's own.\n# TYPE omni_http_connections_failed_total counter\n"
           "omni_http_connections_failed_total " +
           std::to_string(server_->failed_connections()) +
           "\n# HELP omni_http_requests_timed_out_total Connections closed because a request "
           "head or body missed its deadline.\n# TYPE omni_http_requests_timed_out_total "
           "counter\nomni_http_requests_timed_out_total " +
           std::to_string(server_->timed_out_requests()) + "\n";
  }

  pipeline::Pipeline& pipeline_;
  ServerOptions options_;
  HostPolicy hosts_;
  AccessPolicy access_;
  ServerMetrics metrics_;  // before the video jobs and the server, which count into it
  InflightBudget budget_;
  AdmissionQueue admission_;
  // Before server_: destroyed after it, as its handlers use the jobs.
  std::unique_ptr<VideoApi> videos_;
  std::unique_ptr<ImageApi> images_;
  std::unique_ptr<BoundedHttpServer> server_;
  std::thread thread_;
  int port_ = -1;
  int64_t started_ = unix_now();
};

ChatServer::ChatServer(pipeline::Pipeline& pipeline, ServerOptions options)
    : impl_(std::make_unique<Impl>(pipeline, std::move(options))) {}
ChatServer::~ChatServer() { stop(); }
void ChatServer::start() { impl_->start(); }
int ChatServer::port() const { return impl_->port(); }
void ChatServer::stop() { impl_->stop(); }
void ChatServer::wait() { impl_->wait(); }

}  // namespace omni::http
