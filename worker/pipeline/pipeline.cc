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
#include "worker/pipeline/stage_kind.h"

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
  if (p.payload) {
    for (const auto& [name, t] : p.payload->tensors()) bytes += t.nbytes();
  }
  for (const auto& f : p.frames) bytes += f.size() * sizeof(int64_t);
  if (p.audio.defined()) bytes += p.audio.nbytes();
  return bytes;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

std::atomic<uint64_t> next_request{1};

}  // namespace

Pipeline::Pipeline(const std::vector<PipelineStage>& stages) {
  std::map<int64_t, const PipelineStage*> by_id;
  for (const auto& s : stages) {
    OMNI_CHECK(s.stage != nullptr, "pipeline stage ", s.id, " has no stage");
    OMNI_CHECK(find_stage_kind(s.model_stage) != nullptr, "pipeline stage ", s.id,
               ": no stage kind is called '", s.model_stage, "' (", stage_kind_names(), ")");
    OMNI_CHECK(by_id.emplace(s.id, &s).second, "pipeline stage id ", s.id, " is used twice");
  }
  // Topological order (the config checks cycles; this keeps the orchestrator honest too).
  std::set<int64_t> placed;
  while (stages_.size() < stages.size()) {
    bool progress = false;
    for (const auto& s : stages) {
      if (placed.count(s.id)) continue;
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
  // What each kind reads; the first stage of each kind answers the request.
  bool entry = false;
  std::set<std::string> answering;
  for (const auto& s : stages_) {
    const StageKind& kind = *find_stage_kind(s.model_stage);
    kinds_.push_back(&kind);
    primary_.push_back(answering.insert(kind.name).second);
    if (kind.reads.empty()) {
      OMNI_CHECK(s.sources.empty(), "pipeline stage ", s.id, " (", kind.name,
                 ") reads the request and no other stage: it takes no engine_input_source");
      entry = true;
      continue;
    }
    OMNI_CHECK(!s.sources.empty(), "pipeline stage ", s.id, " (", kind.name,
               ") needs an engine_input_source of kind ", join(kind.reads));
    const Handoff* named = nullptr;
    if (!s.input_func.empty()) {
      named = find_handoff(s.input_func);
      OMNI_CHECK(named != nullptr, "pipeline stage ", s.id, " (", kind.name,
                 "): no hand-off is called '", s.input_func,
                 "' (custom_process_input_func: ", handoff_names(), ")");
    }
    for (const auto src : s.sources) {
      const std::string& from = by_id.at(src)->model_stage;
      OMNI_CHECK(std::find(kind.reads.begin(), kind.reads.end(), from) != kind.reads.end(),
                 "pipeline stage ", s.id, " (", kind.name, ") cannot read stage ", src, " (", from,
                 "): it reads ", join(kind.reads));
      OMNI_CHECK(named == nullptr || (named->from == from && named->to == kind.name),
                 "pipeline stage ", s.id, " (", kind.name, "): custom_process_input_func ",
                 named->name, " hands ", named->from, " to ", named->to, ", not stage ", src, " (",
                 from, ") to ", kind.name);
      const Handoff* h = named != nullptr ? named : default_handoff(from, kind.name);
      if (h != nullptr) handoffs_[{src, s.id}] = h;
    }
  }
  OMNI_CHECK(entry, "the pipeline has no stage that reads the request (", stage_kind_names(), ")");
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

StageInfo Pipeline::info_of(size_t index) {
  // Asked once per stage: a remote stage's info is a call, and what it says is fixed.
  std::lock_guard<std::mutex> lock(info_mutex_);
  auto it = info_.find(index);
  if (it == info_.end()) it = info_.emplace(index, stages_[index].stage->info()).first;
  return it->second;
}

StageInfo Pipeline::voice_info() {
  for (size_t i = 0; i < stages_.size(); ++i) {
    if (kinds_[i]->has_voices) return info_of(i);
  }
  return {};
}

bool Pipeline::has_speech() const {
  return std::any_of(kinds_.begin(), kinds_.end(),
                     [](const StageKind* k) { return k->answers_audio; });
}

bool Pipeline::has_video() const {
  return std::any_of(kinds_.begin(), kinds_.end(),
                     [](const StageKind* k) { return k->answers_video; });
}

bool Pipeline::has_images() const {
  return std::any_of(kinds_.begin(), kinds_.end(),
                     [](const StageKind* k) { return k->answers_images; });
}

std::vector<std::string> Pipeline::voices() { return voice_info().voices; }

std::string Pipeline::default_voice() { return voice_info().default_voice; }

int64_t Pipeline::audio_sample_rate() {
  for (size_t i = 0; i < stages_.size(); ++i) {
    if (kinds_[i]->answers_audio) return info_of(i).audio_sample_rate;
  }
  return 0;
}

std::pair<uint64_t, int64_t> Pipeline::prompt_limit() {
  for (size_t i = 0; i < stages_.size(); ++i) {
    const StageInfo info = info_of(i);
    if (info.max_prompt_bytes > 0) return {info.max_prompt_bytes, info.context_tokens};
  }
  return {0, 0};
}

PipelineResult Pipeline::generate(const Request& request, const PipelineCallbacks& callbacks,
                                  Clock::time_point deadline, const std::vector<MediaFile>* media) {
  const auto start = Clock::now();
  OMNI_CHECK(request.text_output || request.audio_output,
             "the request asks for no output: set text and/or audio");
  OMNI_CHECK(!request.audio_output || has_speech(),
             "audio output was requested but no stage of the pipeline answers with audio");
  const bool speak = request.audio_output;

  // The stages this request runs (a speech stage only when audio is asked for, and only when
  // its sources run), and their parameters; the stages that read the request get its media.
  std::vector<const PipelineStage*> active;
  std::map<int64_t, size_t> index;  // stage id -> position in stages_
  std::set<int64_t> runs;
  for (size_t i = 0; i < stages_.size(); ++i) {
    const auto& s = stages_[i];
    const bool sources_run = std::all_of(s.sources.begin(), s.sources.end(),
                                         [&](int64_t src) { return runs.count(src) > 0; });
    if ((kinds_[i]->speech && !speak) || !sources_run) continue;
    active.push_back(&s);
    index[s.id] = i;
    runs.insert(s.id);
  }
  const std::string request_id = "req-" + std::to_string(next_request++);
  std::vector<MediaFile> request_media;
  if (media) {
    request_media = *media;
  } else {
    const auto add = [&](const char* kind, const models::ChatMedia& f) {
      request_media.push_back(f.path.empty() ? MediaFile{kind, f.name, f.data}
                                             : MediaFile{kind, f.path, read_media(kind, f.path)});
    };
    for (const auto& f : request.chat.audio_files) add("audio", f);
    for (const auto& f : request.chat.image_files) add("image", f);
  }
  std::map<int64_t, StageCall> calls;
  for (const auto* s : active) {
    const StageKind& kind = *kinds_[index[s->id]];
    StageCall call;
    call.request_id = request_id;
    call.deadline = deadline;
    call.params = kind.params(request, speak);
    if (kind.reads.empty()) call.media = request_media;
    calls[s->id] = std::move(call);
  }

  std::map<int64_t, std::unique_ptr<PacketQueue>> inputs;
  std::map<int64_t, std::vector<int64_t>> consumers;
  std::map<int64_t, size_t> open_sources;  // a stage's input ends when all its sources did
  for (const auto* s : active) {
    inputs[s->id] = std::make_unique<PacketQueue>();
    open_sources[s->id] = s->sources.size();
    for (const auto src : s->sources) consumers[src].push_back(s->id);
  }

  CancelToken cancel;
  std::mutex mutex;  // guards everything below, and serialises the callbacks
  std::condition_variable done_changed;
  size_t running = active.size();
  std::exception_ptr error;     // the first failure (not counting the cancellations it caused)
  bool user_cancelled = false;  // a callback returned false
  PipelineResult result;

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
    const size_t i = index[s.id];
    StageAnswer answer(request, callbacks, result, s.stage->name(), primary_[i]);
    answer.now_ms = now_ms;
    return kinds_[i]->collect(p, answer);
  };

  std::vector<std::thread> threads;
  for (const auto* s : active) {
    threads.emplace_back([&, s] {
      // A failure ends every consumer's input at once; a finished source ends it when the
      // consumer's last source finishes.
      const auto close_consumers = [&](const std::exception_ptr& e) {
        for (const auto c : consumers[s->id]) {
          bool last = true;
          {
            std::lock_guard<std::mutex> lock(mutex);
            if (!e) last = --open_sources[c] == 0;
          }
          if (e || last) inputs[c]->close(e);
        }
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
              packet.source = s->id;
              // Each consumer gets what its hand-off takes of the packet: a copy for all but the
              // last, which takes the packet itself (one token's rows are not copied).
              const auto give = [&](int64_t consumer, StagePacket p) {
                const auto h = handoffs_.find({s->id, consumer});
                inputs[consumer]->push(h == handoffs_.end() ? std::move(p)
                                                            : h->second->apply(std::move(p)));
              };
              for (size_t i = 0; i + 1 < cs.size(); ++i) give(cs[i], packet);
              if (!cs.empty()) give(cs.back(), std::move(packet));
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
  // for their input, or one between its input's packets, would not see it from a callback soon.
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
  if (user_cancelled) {
    if (result.finish_reason.empty()) result.finish_reason = "cancelled";
    if (speak) result.audio.finish_reason = "cancelled";
  }
  for (const auto* s : active) {
    const size_t i = index[s->id];
    StageAnswer answer(request, callbacks, result, s->stage->name(), primary_[i]);
    answer.metrics = &result.stage_metrics[s->stage->name()];
    answer.info = [this, i] { return info_of(i); };
    if (kinds_[i]->finish) kinds_[i]->finish(answer);
  }
  result.timings["total_ms"] = ms_between(start, Clock::now());
  return result;
}

}  // namespace omni::pipeline
