#include "worker/cli/generate_command.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu_offload/check.h"
#include "cpu_offload/logging.h"
#include "cpu_offload/stats_report.h"
#include "model_runner/output/wav_writer.h"
#include "model_runner/tokenizer/text_stream.h"
#include "worker/cli/generate_pipeline.h"

namespace omni::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

// Mistakes in what the user typed: the reason alone, without the source location OMNI_THROW
// adds for internal errors.
template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  throw omni::Error(omni::detail::str_cat(parts...));
}

void require_file(const std::string& kind, const std::string& path) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (!fs::exists(status)) fail(kind, " file '", path, "' does not exist");
  if (fs::is_directory(status)) fail(kind, " file '", path, "' is a directory");
}

// Mistakes found before the model loads, which can take minutes for a real checkpoint.
void check_paths(const GenerateOptions& o) {
  std::error_code ec;
  if (o.stage_configs_path.empty()) {
    const auto model = fs::status(o.model, ec);
    if (!fs::exists(model)) fail("model directory '", o.model, "' does not exist");
    if (!fs::is_directory(model)) fail("model directory '", o.model, "' is not a directory");
  }
  for (const auto& f : o.audio) require_file("audio", f);
  for (const auto& f : o.image) require_file("image", f);
  if (!o.output_wav.empty() && o.wants_audio()) {
    const fs::path wav(o.output_wav);
    const fs::path folder = wav.has_parent_path() ? wav.parent_path() : fs::path(".");
    if (!fs::is_directory(folder, ec)) {
      fail("--output-wav '", o.output_wav, "': folder '", folder.string(), "' does not exist");
    }
    if (fs::is_directory(wav, ec)) {
      fail("--output-wav '", o.output_wav, "' is a directory");
    }
  }
}

Json timings_json(const models::OmniTimings& t) {
  return Json{{"load_ms", t.load_ms},
              {"thinker_prefill_ms", t.thinker_prefill_ms},
              {"thinker_decode_tokens_per_s", t.thinker_decode_tokens_per_s},
              {"talker_ms", t.talker_ms},
              {"talker_frames_per_s", t.talker_frames_per_s},
              {"code_predictor_ms", t.code_predictor_ms},
              {"code2wav_ms", t.code2wav_ms},
              {"code2wav_real_time_factor", t.code2wav_real_time_factor},
              {"time_to_first_audio_ms", t.time_to_first_audio_ms},
              {"total_ms", t.total_ms}};
}

// codes [num_code_groups, frames] -> a list of frames, each num_code_groups codes.
Json codes_json(const at::Tensor& codes) {
  Json frames = Json::array();
  if (!codes.defined() || codes.numel() == 0) return frames;
  const at::Tensor by_frame = codes.to(at::kCPU, at::kLong).t().contiguous();
  const int64_t groups = by_frame.size(1);
  const int64_t* p = by_frame.data_ptr<int64_t>();
  for (int64_t f = 0; f < by_frame.size(0); ++f) {
    frames.push_back(std::vector<int64_t>(p + f * groups, p + (f + 1) * groups));
  }
  return frames;
}

int64_t num_samples(const at::Tensor& waveform) {
  return waveform.defined() ? waveform.numel() : 0;
}

// The checkpoint in this process (OmniRunner).
class InProcessBackend : public GenerateBackend {
 public:
  explicit InProcessBackend(const GenerateOptions& o)
      : timeout_s_(o.request_timeout_s),
        runner_(models::OmniRunner::load(to_runner_options(o),
                                         offload::make_transfer_engine(device_kind(o)))) {}
  bool has_talker() override { return runner_->has_talker(); }
  std::string default_speaker() override { return runner_->default_speaker(); }
  Answer generate(const models::OmniRequest& request,
                  const std::function<void(const std::string&)>& on_text) override {
    // --request-timeout: each part's callback stops the request once the deadline has passed,
    // and the error names the part that was at work, as the stage pipeline's does.
    const auto deadline =
        timeout_s_ > 0
            ? Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s_ * 1000))
            : Clock::time_point::max();
    std::string late;
    const auto in_time = [&](const char* part) {
      if (Clock::now() < deadline) return true;
      late = part;
      return false;
    };
    models::TextStreamDecoder decoder(runner_->tokenizer());
    models::OmniCallbacks callbacks;
    callbacks.on_token = [&](int64_t token) {
      on_text(decoder.push(token));
      return in_time("thinker");
    };
    callbacks.on_frame = [&](const std::vector<int64_t>&) { return in_time("talker"); };
    callbacks.on_audio = [&](const at::Tensor&) { return in_time("code2wav"); };
    Answer answer;
    answer.result = runner_->generate(request, callbacks);
    if (!late.empty()) {
      std::ostringstream why;
      why << "the request ran past --request-timeout (" << timeout_s_ << " s) while the " << late
          << " was at work";
      throw std::runtime_error(why.str());
    }
    on_text(decoder.finish());
    std::vector<int32_t> ids(answer.result.tokens.begin(), answer.result.tokens.end());
    answer.text = runner_->tokenizer().decode(ids, /*skip_special=*/true);
    return answer;
  }
  std::string offload_json() override {
    return offload::offload_report_json(runner_->offload(), runner_->expert_cache());
  }

 private:
  double timeout_s_;
  std::unique_ptr<models::OmniRunner> runner_;
};

}  // namespace

std::string one_line(std::string message) {
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) {
    message.pop_back();
  }
  for (char& c : message) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return message;
}

int run_generate(const GenerateOptions& o, const CommandIo& io) {
  bool line_open = false;  // streamed text not yet ended by a newline
  const auto progress = [&](const std::string& line) {
    if (io.progress) io.err << "vllm-omni: " << line << std::endl;
  };
  const auto note = [&](const std::string& line) {
    io.err << "vllm-omni: note: " << line << std::endl;
  };
  try {
    check_paths(o);
    models::OmniRequest request = to_request(o);
    const models::WavFormat format = wav_format(o);
    const auto load_start = Clock::now();

    std::unique_ptr<GenerateBackend> backend;
    if (!o.stage_configs_path.empty()) {
      progress("starting the stages of " + o.stage_configs_path);
      backend = make_pipeline_backend(o);
    } else {
      progress("loading " + o.model + " (" + resolved_device(o.device) + ", " + o.dtype + ")");
      backend = std::make_unique<InProcessBackend>(o);
    }
    progress("ready in " + std::to_string(static_cast<int64_t>(ms_since(load_start))) + " ms");
    const std::string source = o.stage_configs_path.empty() ? o.model : o.stage_configs_path;

    if (request.audio_output && !backend->has_talker()) {
      if (o.modalities_given) {
        fail("'", source, "' has no talker: it answers in text only (--modalities text)");
      }
      note("'" + source + "' has no talker: answering in text only");
      request.audio_output = false;
    }
    const bool write = request.audio_output && !o.output_wav.empty();
    if (request.audio_output && o.output_wav.empty()) {
      note("no --output-wav: the audio is not written (its codes and timings are reported)");
    }
    if (!request.audio_output && !o.output_wav.empty()) {
      note("no audio asked for: --output-wav '" + o.output_wav + "' is not written");
    }

    const bool stream_text = !o.json && request.text_output;
    progress("generating");
    const auto answer = backend->generate(request, [&](const std::string& text) {
      if (!stream_text || text.empty()) return;
      io.out << text << std::flush;
      line_open = true;
    });
    const models::OmniResult& result = answer.result;
    if (stream_text) {
      io.out << "\n" << std::flush;
      line_open = false;
    }

    const int64_t samples = num_samples(result.waveform);
    const double audio_seconds =
        result.sample_rate > 0 ? static_cast<double>(samples) / result.sample_rate : 0.0;
    if (write) {
      const at::Tensor waveform =
          result.waveform.defined() ? result.waveform : at::empty({0}, at::kFloat);
      models::write_wav(o.output_wav, waveform, result.sample_rate, format);
      std::ostringstream line;
      line << "wrote " << o.output_wav << " (" << std::fixed << std::setprecision(2)
           << audio_seconds << " s, " << result.sample_rate << " Hz, " << o.wav_format << ")";
      progress(line.str());
    }

    if (o.json) {
      Json j;
      j["text"] = answer.text;
      j["token_ids"] = result.tokens;
      j["finish_reason"] = result.finish_reason;
      j["audio_finish_reason"] = result.audio_finish_reason;
      j["codes"] = codes_json(result.codes);
      j["wav"] = write ? Json(o.output_wav) : Json(nullptr);
      j["audio_seconds"] = audio_seconds;
      j["sample_rate"] = result.sample_rate;
      j["speaker"] = request.audio_output
                         ? Json(o.speaker.empty() ? backend->default_speaker() : lower(o.speaker))
                         : Json(nullptr);
      j["timings"] = timings_json(result.timings);
      j["offload"] = Json::parse(backend->offload_json());
      // replace: text from the tokenizer is valid UTF-8, but a user path need not be.
      io.out << j.dump(-1, ' ', false, Json::error_handler_t::replace) << std::endl;
    }
    return 0;
  } catch (const BadInput& e) {
    if (line_open) io.out << std::endl;
    io.err << "vllm-omni: error: " << one_line(e.what()) << std::endl;
    return 2;
  } catch (const c10::Error& e) {
    if (line_open) io.out << std::endl;
    io.err << "vllm-omni: error: " << one_line(e.what_without_backtrace()) << std::endl;
  } catch (const omni::Error& e) {
    if (line_open) io.out << std::endl;
    // The reason only: where in the source it was thrown is for developers (OMNI_LOG_LEVEL=debug
    // keeps it).
    std::string why = e.what();
    const auto at = why.rfind(" [");
    if (log_level() > LogLevel::kDebug && at != std::string::npos && !why.empty() &&
        why.back() == ']') {
      why.resize(at);
    }
    io.err << "vllm-omni: error: " << one_line(why) << std::endl;
  } catch (const std::exception& e) {
    if (line_open) io.out << std::endl;
    io.err << "vllm-omni: error: " << one_line(e.what()) << std::endl;
  }
  return 1;
}

}  // namespace omni::cli
