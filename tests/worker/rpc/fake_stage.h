// A Stage without a model for the RPC tests: what it does is chosen per request by the call's
// parameters' text, so one server serves every scenario:
//   "add:<k>"   one output per input packet as it arrives: every tensor + k, every token + k,
//               text + "!"; first one packet per media file (its bytes as a uint8 tensor
//               "media:<name>"); then a finished packet.
//   "invalid"   throws StageError kInvalidArgument "unknown speaker 'x'".
//   "runtime"   throws std::runtime_error "model exploded".
//   "loop"      emits one packet, then waits until cancelled (recording when), then throws
//               kCancelled.
//   "sleep:<ms>" waits ms (or until cancelled), then emits a finished packet.
// It records what the tests check: the last call's deadline, when it saw cancellation.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

#include "tests/worker/rpc/packet_tensors.h"
#include "worker/pipeline/stage.h"

namespace omni::rpc::testing {

class FakeStage : public pipeline::Stage {
 public:
  using Clock = std::chrono::steady_clock;

  const std::string& name() const override { return name_; }

  void run(const pipeline::StageCall& call, pipeline::PacketQueue& input,
           const pipeline::PacketSink& sink, const pipeline::CancelToken& cancel) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      last_deadline_ = call.deadline;
    }
    ++runs_started;
    const std::string mode = call.params ? call.params->to_json() : "";
    if (mode.rfind("add:", 0) == 0) return add(std::stod(mode.substr(4)), call, input, sink);
    if (mode == "invalid") {
      throw pipeline::StageError(pipeline::StageError::Code::kInvalidArgument, name_,
                                 "unknown speaker 'x'");
    }
    if (mode == "runtime") throw std::runtime_error("model exploded");
    if (mode == "loop") {
      pipeline::StagePacket first;
      first.tokens = {1};
      sink(std::move(first));
      while (!cancel.wait_for(std::chrono::milliseconds(5))) {
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        cancel_seen_ = Clock::now();
      }
      saw_cancel = true;
      throw pipeline::StageError(pipeline::StageError::Code::kCancelled, name_, "cancelled");
    }
    if (mode.rfind("sleep:", 0) == 0) {
      if (cancel.wait_for(std::chrono::milliseconds(std::stoi(mode.substr(6))))) {
        saw_cancel = true;
        throw pipeline::StageError(pipeline::StageError::Code::kCancelled, name_, "cancelled");
      }
      pipeline::StagePacket done;
      done.finished = true;
      done.finish_reason = "stop";
      sink(std::move(done));
      return;
    }
    throw pipeline::StageError(pipeline::StageError::Code::kInvalidArgument, name_,
                               "unknown mode " + mode);
  }

  std::string stats_json() override { return "{\"fake\": 1}"; }
  pipeline::StageInfo info() override {
    pipeline::StageInfo i;
    i.model_stage = "fake";
    i.param_bytes = 1000;
    i.voices = {"ethan", "chelsie"};
    i.audio_sample_rate = 24000;
    i.family_json = R"({"codes_per_frame":16})";
    return i;
  }
  uint64_t set_device_released(bool release) override {
    device_bytes_ = release ? 0 : 1000;
    return 1000;
  }
  uint64_t device_bytes() override { return device_bytes_; }

  Clock::time_point last_deadline() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return last_deadline_;
  }
  Clock::time_point cancel_seen() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return cancel_seen_;
  }

  std::atomic<int> runs_started{0};
  std::atomic<bool> saw_cancel{false};

 private:
  void add(double k, const pipeline::StageCall& call, pipeline::PacketQueue& input,
           const pipeline::PacketSink& sink) {
    for (const auto& file : call.media) {
      pipeline::StagePacket packet;
      at::Tensor bytes = at::empty({static_cast<int64_t>(file.data.size())}, at::kByte);
      if (!file.data.empty()) std::memcpy(bytes.data_ptr(), file.data.data(), file.data.size());
      testing::add_tensor(packet, "media:" + file.name, bytes);
      sink(std::move(packet));
    }
    int inputs = 0;
    while (std::optional<pipeline::StagePacket> in = input.pop()) {
      ++inputs;
      pipeline::StagePacket out;
      for (int64_t token : in->tokens) out.tokens.push_back(token + static_cast<int64_t>(k));
      out.text = in->text + "!";
      for (const auto& [name, tensor] : testing::tensors_of(*in))
        testing::add_tensor(out, name, tensor + k);
      sink(std::move(out));
    }
    pipeline::StagePacket done;
    done.finished = true;
    done.finish_reason = "stop";
    done.metrics["inputs"] = inputs;
    sink(std::move(done));
  }

  const std::string name_ = "stage 1 (fake)";
  mutable std::mutex mutex_;
  Clock::time_point last_deadline_, cancel_seen_;
  std::atomic<uint64_t> device_bytes_{1000};
};

}  // namespace omni::rpc::testing
