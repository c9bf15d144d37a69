#include "worker/http/image_api.h"

#include <httplib.h>

#include <atomic>
#include <optional>
#include <sstream>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "model_runner/output/frames_writer.h"
#include "worker/http/admission_queue.h"
#include "worker/http/base64.h"
#include "worker/http/bounded_http_server.h"
#include "worker/http/error_response.h"
#include "worker/http/image_request.h"
#include "worker/http/inflight_budget.h"
#include "worker/http/request_json.h"
#include "worker/http/server_metrics.h"
#include "worker/http/stage_errors.h"
#include "worker/pipeline/elapsed.h"
#include "worker/pipeline/pipeline.h"

namespace omni::http {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

class ImageApi::Impl {
 public:
  Impl(pipeline::Pipeline& pipeline, ImageOptions options, std::string model_name,
       ServerMetrics& metrics, InflightBudget& budget)
      : pipeline_(pipeline),
        options_(options),
        model_name_(std::move(model_name)),
        metrics_(metrics),
        budget_(budget),
        enabled_(pipeline_.has_images()),
        // One runs: the stage computes one request at a time, the rest would wait inside it
        // with no bound.
        queue_(1, options_.max_queued, options_.queue_timeout) {
    if (options_.max_pixels <= 0) {
      options_.max_pixels = 4.0 * static_cast<double>(options_.default_width) *
                            static_cast<double>(options_.default_height);
    }
  }

  void add_routes(httplib::Server& server) {
    server.Post("/v1/images/generations",
                [this](const httplib::Request& req, httplib::Response& res) {
                  if (!ready(res)) return;
                  generate(req, res);
                });
    server.Post("/v1/images/edits", [this](const httplib::Request& req, httplib::Response& res) {
      if (!ready(res)) return;
      edit(req, res);
    });
  }

  void stop() {
    stopping_ = true;
    queue_.stop();
  }

  int64_t max_input_images() const {
    if (!enabled_) return 0;
    return options_.max_input_images < 0 ? kMaxEditUploads : options_.max_input_images;
  }

  std::string prometheus() const {
    std::ostringstream out;
    const auto metric = [&](const char* name, const char* type, const char* help, uint64_t v) {
      out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n"
          << name << " " << v << "\n";
    };
    metric("omni_image_requests_running", "gauge", "Image requests running now.",
           static_cast<uint64_t>(queue_.running()));
    metric("omni_image_requests_queued", "gauge", "Image requests waiting for the running one.",
           static_cast<uint64_t>(queue_.queued()));
    metric("omni_images_generated_total", "counter",
           "Images answered by /v1/images/generations and /v1/images/edits.", images_.load());
    metric("omni_image_edits_total", "counter", "Requests answered by /v1/images/edits.",
           edits_.load());
    return out.str();
  }

 private:
  void send(httplib::Response& res, const ApiError& e) {
    answer_error(res, e, queue_.retry_after_seconds(), metrics_);
  }

  ApiError no_images() const {
    return api_error(400, "invalid_request_error", "unsupported",
                     "the model '" + model_name_ +
                         "' makes no images: /v1/images needs a diffusers image folder "
                         "(model_index.json naming QwenImagePipeline) as --model",
                     "model");
  }

  bool ready(httplib::Response& res) {
    if (enabled_) return true;
    send(res, no_images());
    return false;
  }

  // The caps of a request: width x height x n, and the bytes its images hold.
  std::optional<ApiError> too_costly(const ImageRequest& r, uint64_t* bytes) const {
    const auto& d = r.diffusion;
    // The field to change: n when several images were asked for, else the size.
    const std::string param = d.num_images.value_or(1) > 1 ? "n" : "size";
    const double pixels = static_cast<double>(d.width.value_or(options_.default_width)) *
                          static_cast<double>(d.height.value_or(options_.default_height)) *
                          static_cast<double>(d.num_images.value_or(1));
    if (pixels > options_.max_pixels) {
      return api_error(400, "invalid_request_error", "request_too_large",
                       "the request's width x height x n is " + detail::format_number(pixels) +
                           ", more than --max-image-request-pixels (" +
                           detail::format_number(options_.max_pixels) +
                           "): ask for a smaller size or fewer images",
                       param);
    }
    *bytes = static_cast<uint64_t>(pixels) * kBytesPerPixel;
    if (*bytes > budget_.limit()) {
      return api_error(400, "invalid_request_error", "request_too_large",
                       "the request's images would hold " + std::to_string(*bytes) +
                           " bytes, more than --max-inflight-bytes (" +
                           std::to_string(budget_.limit()) +
                           "): ask for a smaller size or fewer images",
                       param);
    }
    return std::nullopt;
  }

  // A place to run after those ahead; false with the refusal answered.
  bool admit(AdmissionQueue::Slot& slot, int socket, httplib::Response& res) {
    switch (queue_.acquire(slot, [socket] { return BoundedHttpServer::client_gone(socket); })) {
      case AdmissionQueue::Outcome::kAdmitted:
        return true;
      case AdmissionQueue::Outcome::kGone:
        metrics_.count_request(499);
        return false;
      case AdmissionQueue::Outcome::kQueueFull: {
        ApiError e =
            rate_limited("an image request is running and --max-queued-images (" +
                         std::to_string(options_.max_queued) + ") are waiting: try again later");
        e.code = "too_many_requests";
        send(res, e);
        return false;
      }
      case AdmissionQueue::Outcome::kTimedOut:
        send(res, api_error(503, "server_error", "queue_timeout",
                            "the request waited --queue-timeout for the image requests ahead "
                            "of it: try again later"));
        return false;
      case AdmissionQueue::Outcome::kStopping:
        break;
    }
    send(res, api_error(503, "server_error", "shutting_down", "the server is stopping"));
    return false;
  }

  void generate(const httplib::Request& req, httplib::Response& res) {
    ImageRequest r;
    try {
      r = parse_image_request(req.body);
    } catch (const ApiException& e) {
      send(res, e.error());
      return;
    }
    if (options_.max_input_images > 0) {
      send(res, api_error(400, "invalid_request_error", "missing_field",
                          "the model '" + model_name_ +
                              "' edits images: POST the image(s) with the prompt to "
                              "/v1/images/edits",
                          "image"));
      return;
    }
    run(res, r, {});
  }

  void edit(const httplib::Request& req, httplib::Response& res) {
    if (options_.max_input_images == 0) {
      send(res, api_error(400, "invalid_request_error", "unsupported",
                          "the model '" + model_name_ +
                              "' makes images from text only: use /v1/images/generations",
                          "image"));
      return;
    }
    if (!req.is_multipart_form_data()) {
      send(res, api_error(415, "invalid_request_error", "unsupported_media_type",
                          "an edit is a multipart/form-data body with the image(s) to edit, as "
                          "OpenAI's SDK sends it"));
      return;
    }
    ImageEditRequest e;
    try {
      std::vector<FormField> fields;
      for (const auto& [name, part] : req.files) {
        fields.push_back({name, part.content, !part.filename.empty()});
      }
      e = parse_image_edit_form(fields, max_input_images());
    } catch (const ApiException& error) {
      send(res, error.error());
      return;
    }
    std::vector<pipeline::MediaFile> media;
    for (size_t i = 0; i < e.images.size(); ++i) {
      media.push_back({"image", "image " + std::to_string(i + 1), std::move(e.images[i].data)});
    }
    if (run(res, e.request, media)) ++edits_;
  }

  // Admits and runs a parsed request; true when answered with images.
  bool run(httplib::Response& res, const ImageRequest& r,
           const std::vector<pipeline::MediaFile>& media) {
    const auto start = Clock::now();
    uint64_t bytes = 0;
    if (!r.model.empty() && r.model != model_name_) {
      const std::string shown = r.model.size() <= 64 ? r.model : r.model.substr(0, 64) + "...";
      send(res, model_not_found("the model '" + shown + "' does not exist: this server serves '" +
                                model_name_ + "'"));
      return false;
    }
    if (const auto e = too_costly(r, &bytes)) {
      send(res, *e);
      return false;
    }
    const int socket = BoundedHttpServer::current_socket();
    AdmissionQueue::Slot slot;
    if (!admit(slot, socket, res)) return false;
    InflightBudget::Lease lease = budget_.lease();
    if (!lease.grow(bytes)) {
      send(res, api_error(503, "server_error", "server_busy",
                          "the server holds as many request bytes as --max-inflight-bytes "
                          "allows: try again shortly"));
      return false;
    }
    pipeline::Request request;
    request.chat.text = r.prompt;
    request.text_output = true;
    request.audio_output = false;
    request.parts.get<models::DiffusionRequest>() = r.diffusion;
    pipeline::PipelineCallbacks callbacks;
    // A client that left, or a server that stops: the stage ends at its next step.
    callbacks.cancelled = [this, socket] {
      return stopping_.load() || BoundedHttpServer::client_gone(socket);
    };
    try {
      const auto result =
          pipeline_.generate(request, callbacks, std::chrono::steady_clock::time_point::max(),
                             media.empty() ? nullptr : &media);
      if (!result.images.defined()) {
        if (stopping_) {
          send(res, api_error(503, "server_error", "shutting_down", "the server is stopping"));
        } else {
          metrics_.count_request(499);  // nobody is left to answer
        }
        return false;
      }
      Json data = Json::array();
      for (const std::string& png : models::encode_png_bytes(result.images)) {
        data.push_back(Json{{"b64_json", base64_encode(png)}});
      }
      res.set_content(Json{{"created", unix_now()}, {"data", data}}.dump(), "application/json");
      images_ += data.size();
      metrics_.count_done(result, pipeline::ms_since(start));
      metrics_.count_request(200);
      return true;
    } catch (const ApiException& e) {
      send(res, e.error());
    } catch (const pipeline::StageError& e) {
      send(res, stage_error(e));
    } catch (const std::exception& e) {
      send(res, server_error(published(e.what())));
    }
    return false;
  }

  pipeline::Pipeline& pipeline_;
  ImageOptions options_;
  const std::string model_name_;
  ServerMetrics& metrics_;
  InflightBudget& budget_;
  const bool enabled_;
  AdmissionQueue queue_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> images_{0};
  std::atomic<uint64_t> edits_{0};
};

ImageApi::ImageApi(pipeline::Pipeline& pipeline, ImageOptions options, std::string model_name,
                   ServerMetrics& metrics, InflightBudget& budget)
    : impl_(std::make_unique<Impl>(pipeline, options, std::move(model_name), metrics, budget)) {}
ImageApi::~ImageApi() { stop(); }
void ImageApi::add_routes(httplib::Server& server) { impl_->add_routes(server); }
void ImageApi::stop() { impl_->stop(); }
std::string ImageApi::prometheus() const { return impl_->prometheus(); }
int64_t ImageApi::max_input_images() const { return impl_->max_input_images(); }

}  // namespace omni::http
