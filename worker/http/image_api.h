// /v1/images, OpenAI's images API in vLLM-Omni's shape, on a pipeline with an image stage:
//   POST /v1/images/generations  makes n images of a prompt and answers them at once:
//                                {"created", "data": [{"b64_json": "<PNG, base64>"}, ...]}
//   POST /v1/images/edits        the same from a multipart/form-data body holding the images to
//                                edit (`image`, repeatable) and the same fields; a model that
//                                makes images from text only answers 400
// A request runs on its own HTTP thread, one at a time (the stage computes one request at a
// time anyway); the others wait in a bounded queue (more get 429, a wait past --queue-timeout
// 503, both with Retry-After). A request's width x height x n is capped, and the bytes its
// images hold while they are encoded are taken from the server's byte budget before it runs. A
// client that leaves cancels its request. The key is checked before any handler runs
// (chat_server.h). A pipeline without an image stage answers these routes 400 saying the model
// makes no images.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "worker/http/api_error.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace omni::pipeline {
class Pipeline;
}

namespace omni::http {

class InflightBudget;
class ServerMetrics;

struct ImageOptions {
  int max_queued = 16;  // requests waiting while one runs; more get 429
  // How long a request waits for the one running before it (then 503).
  std::chrono::milliseconds queue_timeout{60000};
  // The model's default size, for a request that names none.
  int64_t default_width = 1024, default_height = 1024;
  // width x height x n a request may ask for; 0: 4 times the default size.
  double max_pixels = 0;
  // Images an edit may give (the checkpoint's ImageDefaults): 0 for a text-to-image model
  // (edits refused), -1 when not known (stage configs: up to kMaxEditUploads, the stage refuses
  // a count its model cannot take). A model that edits answers generations 400 (it needs an image).
  int64_t max_input_images = -1;
};

// The most images one edit may upload when the model's own count is not known.
constexpr int64_t kMaxEditUploads = 4;

class ImageApi {
 public:
  ImageApi(pipeline::Pipeline& pipeline, ImageOptions options, std::string model_name,
           ServerMetrics& metrics, InflightBudget& budget);
  ~ImageApi();
  ImageApi(const ImageApi&) = delete;
  ImageApi& operator=(const ImageApi&) = delete;

  void add_routes(httplib::Server& server);
  // Waiting requests answer 503 at once; the running one is cancelled. Idempotent.
  void stop();
  // Prometheus gauges and counters: requests running and waiting, images made.
  std::string prometheus() const;

  // Images an edit may give: /v1/models' "image_edit" (0: none).
  int64_t max_input_images() const;

  // What one pixel of an image holds while it is made and answered: the float RGB image the
  // pipeline returns, its 8-bit copy, the PNG, its base64 and the JSON that quotes it.
  static constexpr uint64_t kBytesPerPixel = 32;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace omni::http
