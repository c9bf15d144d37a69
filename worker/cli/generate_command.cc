#include "worker/cli/generate_command.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iterator>
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
#include "worker/cli/generate_backend.h"
#include "worker/cli/generate_video.h"
#include "worker/http/chat_request.h"
#include "worker/pipeline/elapsed.h"
#include "worker/pipeline/model_family.h"

namespace omni::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

using pipeline::ms_since;

// Mistakes in what the user typed: the reason alone, without the source location OMNI_THROW
// adds for internal errors.
template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  throw omni::Error(omni::detail::str_cat(parts...));
}

// --messages FILE: an OpenAI `messages` list (or a request object holding one), read by the
// parser `serve` uses, into the request's conversation and its media as bytes.
void read_messages(const std::string& path, models::ChatRequest& chat,
                   std::vector<pipeline::MediaFile>& media) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("--messages '", path, "': cannot read the file");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const Json parsed = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  const Json* messages = parsed.is_array()                                   ? &parsed
                         : parsed.is_object() && parsed.contains("messages") ? &parsed["messages"]
                                                                             : nullptr;
  if (messages == nullptr) {
    throw BadInput("--messages '" + path +
                   "': expected JSON holding a list of messages, or an object with \"messages\"");
  }
  const Json body{{"model", "generate"}, {"messages", *messages}};
  try {
    http::to_conversation(http::parse_chat_completion(body.dump()), chat, media);
  } catch (const http::ApiException& e) {
    throw BadInput("--messages '" + path + "': " + e.what());
  }
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
  if (!o.messages.empty()) require_file("--messages", o.messages);
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

}  // namespace

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
    // A checkpoint's family is known before it loads; a stage config's once its stages are up.
    if (o.stage_configs_path.empty()) {
      const auto& family = pipeline::family_of_checkpoint(o.model);
      const auto& kinds = family.stage_kinds();
      const auto any = [&](bool pipeline::StageKind::*answers) {
        return std::any_of(kinds.begin(), kinds.end(), [&](const auto& k) { return k.*answers; });
      };
      const auto images = family.image_defaults(o.model);
      check_flags_apply(o,
                        any(&pipeline::StageKind::answers_video)    ? DiffusionOutput::kVideo
                        : any(&pipeline::StageKind::answers_images) ? DiffusionOutput::kImages
                                                                    : DiffusionOutput::kNone,
                        images ? images->max_input_images : -1);
    }
    pipeline::Request request = to_request(o);
    std::vector<pipeline::MediaFile> media;
    if (!o.messages.empty()) read_messages(o.messages, request.chat, media);
    const models::WavFormat format = wav_format(o);
    const auto load_start = Clock::now();

    std::unique_ptr<GenerateBackend> backend;
    if (!o.stage_configs_path.empty()) {
      progress("starting the stages of " + o.stage_configs_path);
      backend = make_pipeline_backend(o);
    } else {
      const std::string device = resolved_device(o.device);
      progress("loading " + o.model + " (" + device + ", " +
               config::given_value(o.engine, "dtype").value_or("auto") + ")");
      backend = make_model_backend(o, device);
    }
    const double load_ms = ms_since(load_start);
    progress("ready in " + std::to_string(static_cast<int64_t>(load_ms)) + " ms");
    const std::string source = o.stage_configs_path.empty() ? o.model : o.stage_configs_path;
    const DiffusionOutput output = diffusion_output(*backend);
    if (!o.stage_configs_path.empty()) check_flags_apply(o, output);
    if (output == DiffusionOutput::kVideo) {
      run_video(o, io, *backend, load_ms);
      return 0;
    }
    if (output == DiffusionOutput::kImages) {
      run_images(o, io, *backend, load_ms);
      return 0;
    }

    if (request.audio_output && !backend->answers_audio()) {
      if (o.modalities_given) {
        fail("'", source,
             "' has no stage that speaks: it answers in text only (--modalities text)");
      }
      note("'" + source + "' has no stage that speaks: answering in text only");
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
    const auto answer = backend->generate(
        request,
        [&](const std::string& text) {
          if (!stream_text || text.empty()) return;
          io.out << text << std::flush;
          line_open = true;
        },
        o.messages.empty() ? nullptr : &media);
    const pipeline::AudioResult& audio = answer.audio;
    if (stream_text) {
      io.out << "\n" << std::flush;
      line_open = false;
    }

    const int64_t samples = num_samples(audio.waveform);
    const int64_t sample_rate = audio.sample_rate > 0 ? audio.sample_rate : 24000;
    const double audio_seconds = static_cast<double>(samples) / sample_rate;
    if (write) {
      const at::Tensor waveform =
          audio.waveform.defined() ? audio.waveform : at::empty({0}, at::kFloat);
      models::write_wav(o.output_wav, waveform, sample_rate, format);
      std::ostringstream line;
      line << "wrote " << o.output_wav << " (" << std::fixed << std::setprecision(2)
           << audio_seconds << " s, " << sample_rate << " Hz, " << o.wav_format << ")";
      progress(line.str());
    }

    if (o.json) {
      Json j;
      j["text"] = answer.text;
      j["token_ids"] = answer.tokens;
      j["finish_reason"] = answer.finish_reason;
      j["audio_finish_reason"] = audio.finish_reason;
      j["codes"] = codes_json(audio.codes);
      j["wav"] = write ? Json(o.output_wav) : Json(nullptr);
      j["audio_seconds"] = audio_seconds;
      j["sample_rate"] = sample_rate;
      j["speaker"] = request.audio_output ? Json(audio.voice) : Json(nullptr);
      Json timings(answer.timings);
      timings["load_ms"] = load_ms;  // the pipeline's start, which the request's timings leave out
      j["timings"] = timings;
      j["offload"] = Json::parse(backend->offload_json());
      // replace: text from the tokenizer is valid UTF-8, but a user path need not be.
      io.out << j.dump(-1, ' ', false, Json::error_handler_t::replace) << std::endl;
    }
    return 0;
  } catch (...) {
    if (line_open) io.out << std::endl;
    return report_command_error(std::current_exception(), "vllm-omni", io.err);
  }
}

}  // namespace omni::cli
