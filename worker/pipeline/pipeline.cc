#include "worker/pipeline/pipeline.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "cpu_offload/check.h"
#include "model_runner/qwen3_omni/talker_handoff.h"
#include "worker/pipeline/stage_params.h"

namespace omni::pipeline {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

std::string read_media(const std::string& kind, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  OMNI_CHECK(in.good(), kind, " file '", path, "' cannot be read");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

uint64_t packet_bytes(const StagePacket& p) {
  uint64_t bytes = p.tokens.size() * sizeof(int64_t) + p.text.size();
  for (const auto& [name, t] : p.tensors) bytes += t.nbytes();
  for (const auto& f : p.frames) bytes += f.size() * sizeof(int64_t);
  if (p.audio.defined()) bytes += p.audio.nbytes();
  return bytes;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::atomic<uint64_t> next_request{1};

}  // namespace

Pipeline::Pipeline(const std::vector<PipelineStage>& stages) {
  std::map<int64_t, const PipelineStage*> by_id;
  for (const auto& s : stages) {
    OMNI_CHECK(s.stage != nullptr, "pipeline stage ", s.id, " has no stage");
    OMNI_CHECK(
        s.model_stage == "thinker" || s.model_stage == "talker" || s.model_stage == "code2wav",
        "pipeline stage ", s.id, ": model_stage '", s.model_stage,
        "' is not supported by the Qwen3-Omni pipeline (thinker, talker, code2wav)");
    OMNI_CHECK(by_id.emplace(s.id, &s).second, "pipeline stage id ", s.id, " is used twice");
  }
  // Topological order (the config checks cycles; this keeps the orchestrator honest too).
  std::set<int64_t> placed;
  while (stages_.size() < stages.size()) {
    bool progress = false;
    for (const auto& s : stages) {
      if (placed.count(s.id)) continue;
      OMNI_CHECK(s.sources.size() <= 1, "pipeline stage ", s.id,
                 ": more than one engine_input_source is not supported yet");
      bool ready = true;
      for (const auto src : s.sources) {
        OMNI_CHECK(by_id.count(src), "pipeline stage ", s.id, " reads stage ", src,
                   ", which does not exist");
        ready = ready && placed.count(src);
      }
      if (!ready) continue;
      stages_.push_back(s);
      placed.insert(s.id);
      progress = true;
    }
    OMNI_CHECK(progress, "the pipeline's engine_input_source links form a cycle");
  }
  const auto* thinker = find("thinker");
  OMNI_CHECK(thinker != nullptr && thinker->sources.empty(),
             "the pipeline needs a thinker stage with no engine_input_source");
  const auto* talker = find("talker");
  const auto* code2wav = find("code2wav");
  if (talker) {
    OMNI_CHECK(talker->sources == std::vector<int64_t>{thinker->id}, "the talker stage (",
               talker->id, ") must read the thinker stage (", thinker->id, ")");
  }
  if (code2wav) {
    OMNI_CHECK(talker && code2wav->sources == std::vector<int64_t>{talker->id},
               "the code2wav stage (", code2wav->id, ") must read the talker stage");
  }
}

const PipelineStage* Pipeline::find(const std::string& model_stage) const {
  for (const auto& s : stages_) {
    if (s.model_stage == model_stage) return &s;
  }
  return nullptr;
}

std::string Pipeline::stats_json() {
  Json all = Json::object();
  if (ledger_) all["device_ledger"] = Json::parse(ledger_->stats_json());
  for (const auto& s : stages_) {
    try {
      all[s.stage->name()] = Json::parse(s.stage->stats_json());
    } catch (const std::exception& e) {
      all[s.stage->name()] = Json{{"error", e.what()}};
    }
  }
  return all.dump();
}

std::string Pipeline::talker_info() {
  // Asked once: a remote talker's info is a call, and its speakers and code groups are fixed.
  std::lock_guard<std::mutex> lock(info_mutex_);
  if (talker_info_.empty()) {
    const auto* talker = find("talker");
    talker_info_ = talker ? talker->stage->info_json() : "{}";
  }
  return talker_info_;
}

bool Pipeline::has_speech() const { return find("talker") && find("code2wav"); }

std::vector<std::string> Pipeline::speakers() {
  return Json::parse(talker_info()).value("speakers", std::vector<std::string>{});
}

std::string Pipeline::default_speaker() {
  return Json::parse(talker_info()).value("default_speaker", std::string());
}

PipelineResult Pipeline::generate(const models::OmniRequest& request,
                                  const PipelineCallbacks& callbacks, Clock::time_point deadline,
                                  const std::vector<MediaFile>* media) {
  const auto start = Clock::now();
  OMNI_CHECK(request.text_output || request.audio_output,
             "the request asks for no output: set text and/or audio");
  OMNI_CHECK(!request.audio_output || has_speech(),
             "audio output was requested but the pipeline has no talker and code2wav stages");
  const bool speak = request.audio_output;

  // The stages this request runs, and what each reads.
  std::vector<const PipelineStage*> active;
  for (const auto& s : stages_) {
    if (s.model_stage == "thinker" || speak) active.push_back(&s);
  }
  const std::string request_id = "req-" + std::to_string(next_request++);
  std::map<int64_t, StageCall> calls;
  for (const auto* s : active) {
    StageCall call;
    call.request_id = request_id;
    call.deadline = deadline;
    if (s->model_stage == "thinker") {
      ThinkerParams p;
      p.text = request.chat.text;
      p.system_prompt = request.chat.system_prompt;
      p.history = request.chat.history;
      p.sampling = request.sampling.thinker;
      p.handoff = speak;
      p.stop = request.stop_strings;
      call.params_json = to_json(p);
      if (media) {
        call.media = *media;
      } else {
        for (const auto& f : request.chat.audio_files) {
          call.media.push_back({"audio", f, read_media("audio", f)});
        }
        for (const auto& f : request.chat.image_files) {
          call.media.push_back({"image", f, read_media("image", f)});
        }
      }
    } else if (s->model_stage == "talker") {
      TalkerParams p;
      p.speaker = request.speaker;
      p.talker = request.sampling.talker;
      p.code_predictor = request.sampling.code_predictor;
      p.max_frames = request.max_audio_frames;
      call.params_json = to_json(p);
    } else {
      Code2WavParams p;
      p.stream_audio = request.stream_audio;
      p.stream = request.stream;
      call.params_json = to_json(p);
    }
    calls[s->id] = std::move(call);
  }

  std::map<int64_t, std::unique_ptr<PacketQueue>> inputs;
  std::map<int64_t, std::vector<int64_t>> consumers;
  for (const auto* s : active) {
    inputs[s->id] = std::make_unique<PacketQueue>();
    for (const auto src : s->sources) consumers[src].push_back(s->id);
  }

  CancelToken cancel;
  std::mutex mutex;  // guards everything below, and serialises the callbacks
  std::condition_variable done_changed;
  size_t running = active.size();
  std::exception_ptr error;     // the first failure (not counting the cancellations it caused)
  bool user_cancelled = false;  // a callback returned false
  PipelineResult result;
  result.omni.audio_finish_reason = "none";
  std::vector<std::vector<int64_t>> frames;

  const auto record_error = [&](std::exception_ptr e, bool is_cancel) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!error && !(is_cancel && (user_cancelled || cancel.cancelled()))) error = std::move(e);
  };

  // Handles one packet of stage `s` (under `mutex`); false: a callback cancelled the request.
  const auto collect = [&](const PipelineStage& s, const StagePacket& p) -> bool {
    auto& metrics = result.stage_metrics[s.stage->name()];
    const double now_ms = ms_between(start, Clock::now());
    if (!metrics.count("first_packet_ms")) metrics["first_packet_ms"] = now_ms;
    if (p.finished) {
      metrics["done_ms"] = now_ms;
      for (const auto& [k, v] : p.metrics) metrics[k] = v;
    }
    bool go_on = true;
    if (s.model_stage == "thinker") {
      for (const auto t : p.tokens) {
        result.omni.tokens.push_back(t);
        if (request.text_output && callbacks.on_token && !callbacks.on_token(t)) go_on = false;
      }
      result.text += p.text;
      if (request.text_output && !p.text.empty() && callbacks.on_text &&
          !callbacks.on_text(p.text)) {
        go_on = false;
      }
      if (p.finished) result.omni.finish_reason = p.finish_reason;
    } else if (s.model_stage == "talker") {
      for (const auto& f : p.frames) {
        frames.push_back(f);
        if (callbacks.on_frame && !callbacks.on_frame(f)) go_on = false;
      }
      if (p.finished) result.omni.audio_finish_reason = p.finish_reason;
    } else {
      if (p.audio.defined() && p.audio.numel() > 0) {
        if (result.omni.streamed_samples == 0) {
          result.omni.timings.time_to_first_audio_ms = now_ms;
        }
        result.omni.streamed_samples += p.audio.numel();
        if (callbacks.on_audio && !callbacks.on_audio(p.audio)) go_on = false;
      }
      if (p.finished) {
        const auto waveform = p.tensor("waveform");
        if (waveform.defined()) result.omni.waveform = waveform;
      }
    }
    return go_on;
  };

  std::vector<std::thread> threads;
  for (const auto* s : active) {
    threads.emplace_back([&, s] {
      const auto close_consumers = [&](const std::exception_ptr& e) {
        for (const auto c : consumers[s->id]) inputs[c]->close(e);
      };
      try {
        // A grant on the device, if the stages share one: on a device that cannot hold them
        // all, only once the input is complete (a stage holding a grant never waits on another).
        struct Grant {
          DeviceLedger* ledger = nullptr;
          int64_t id = 0;
          ~Grant() {
            if (ledger) ledger->release(id);
          }
        } grant;
        if (ledger_) {
          if (ledger_->constrained(s->id) && !s->sources.empty()) {
            inputs[s->id]->wait_closed(cancel);
          }
          ledger_->acquire(s->id, cancel);
          grant.ledger = ledger_.get();
          grant.id = s->id;
        }
        s->stage->run(
            calls[s->id], *inputs[s->id],
            [&](StagePacket&& packet) {
              {
                std::lock_guard<std::mutex> lock(mutex);
                if (!consumers[s->id].empty()) {
                  result.bytes_between_stages += packet_bytes(packet);
                }
                if (!collect(*s, packet)) {
                  user_cancelled = true;
                  cancel.cancel();
                }
              }
              if (cancel.cancelled()) {
                throw StageError(StageError::Code::kCancelled, "", "the request was cancelled");
              }
              const auto& cs = consumers[s->id];
              // Copies for all consumers but the last, which takes the packet.
              for (size_t i = 0; i + 1 < cs.size(); ++i) inputs[cs[i]]->push(packet);
              if (!cs.empty()) inputs[cs.back()]->push(std::move(packet));
            },
            cancel);
        close_consumers(nullptr);
      } catch (const StageError& e) {
        const bool is_cancel = e.code() == StageError::Code::kCancelled;
        record_error(std::make_exception_ptr(StageError(
                         e.code(), e.stage().empty() ? s->stage->name() : e.stage(), e.message())),
                     is_cancel);
        cancel.cancel();
        close_consumers(std::make_exception_ptr(
            StageError(StageError::Code::kCancelled, "", "the request was cancelled")));
      } catch (const std::exception& e) {
        record_error(std::make_exception_ptr(
                         StageError(StageError::Code::kInternal, s->stage->name(), e.what())),
                     false);
        cancel.cancel();
        close_consumers(std::make_exception_ptr(
            StageError(StageError::Code::kCancelled, "", "the request was cancelled")));
      }
      std::lock_guard<std::mutex> lock(mutex);
      --running;
      done_changed.notify_all();
    });
  }

  // The deadline: stages blocked on their input would not notice it, so the orchestrator
  // cancels them all and names the stages still at work.
  // The caller's cancellation (a client that went away) is polled here too: stages that wait
  // for their input, or a talker between text rows, would not see it from a callback soon.
  {
    std::unique_lock<std::mutex> lock(mutex);
    const auto finished = [&] { return running == 0; };
    bool in_time = true;
    while (!finished()) {
      const auto wake = std::min(deadline, Clock::now() + std::chrono::milliseconds(20));
      done_changed.wait_until(lock, wake, finished);
      if (finished()) break;
      if (callbacks.cancelled && !user_cancelled && callbacks.cancelled()) {
        user_cancelled = true;
        cancel.cancel();
      }
      if (Clock::now() >= deadline) {
        in_time = false;
        break;
      }
    }
    if (!in_time) {
      std::string busy;
      for (const auto* s : active) {
        const auto& m = result.stage_metrics[s->stage->name()];
        if (!m.count("done_ms")) busy += (busy.empty() ? "" : ", ") + s->stage->name();
      }
      if (!error) {
        error = std::make_exception_ptr(
            StageError(StageError::Code::kDeadlineExceeded, busy,
                       "the request's deadline passed before the stage finished"));
      }
      cancel.cancel();
    }
  }
  for (auto& t : threads) t.join();
  if (error && !user_cancelled) std::rethrow_exception(error);

  // ---- the result
  auto& r = result.omni;
  if (user_cancelled) {
    if (r.finish_reason.empty()) r.finish_reason = "cancelled";
    if (speak) r.audio_finish_reason = "cancelled";
  }
  if (speak) {
    const auto groups = Json::parse(talker_info()).value("num_code_groups", 16);
    r.codes = models::qwen3_omni::frames_to_codes(frames, groups);
    result.speaker = request.speaker.empty() ? default_speaker() : lower(request.speaker);
  }
  auto metric = [&](const std::string& model_stage, const std::string& key) {
    const auto* s = find(model_stage);
    if (!s) return 0.0;
    const auto& m = result.stage_metrics[s->stage->name()];
    const auto it = m.find(key);
    return it == m.end() ? 0.0 : it->second;
  };
  r.timings.thinker_prefill_ms = metric("thinker", "prefill_ms");
  r.timings.thinker_decode_tokens_per_s = metric("thinker", "decode_tokens_per_s");
  if (speak) {
    r.timings.talker_ms = metric("talker", "talker_ms");
    r.timings.talker_frames_per_s = metric("talker", "frames_per_s");
    r.timings.code_predictor_ms = metric("talker", "code_predictor_ms");
    r.timings.code2wav_ms = metric("code2wav", "code2wav_ms");
    if (r.waveform.defined() && r.waveform.numel() > 0) {
      const double audio_s = static_cast<double>(r.waveform.numel()) / r.sample_rate;
      r.timings.code2wav_real_time_factor = r.timings.code2wav_ms / 1000.0 / audio_s;
      if (!request.stream_audio) r.timings.time_to_first_audio_ms = metric("code2wav", "done_ms");
    }
  }
  r.timings.total_ms = ms_between(start, Clock::now());
  return result;
}

}  // namespace omni::pipeline
