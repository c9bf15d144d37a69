// One stage of a pipeline (a model family's kind of stage), whatever runs it: a runner in this
// process (LocalStage, worker/pipeline/local_stages.h) or a worker reached over gRPC
// (RemoteStage, worker/rpc/stage_client.h). The orchestrator (worker/pipeline/pipeline.h) runs
// the same code over both, so the in-process and the multi-process pipeline give the same
// outputs by construction; the worker (worker/rpc/stage_server.h) is a gRPC server around a
// LocalStage.
//
// A request is a call of Stage::run: the stage reads its parameters from the call, its
// upstream's packets from `input` as they arrive (a consumer starts while its source still
// writes), and writes its own packets to `sink` as it produces them. What a family's packets
// hold is the family's to document (the stages.h of its folder).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace omni::pipeline {

// Tensors by name: the form a payload takes on the wire.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// The tensor called `name` of `tensors`, or an undefined tensor.
at::Tensor named_tensor(const NamedTensors& tensors, const std::string& name);

// What a stage hands its consumers beyond text, codec frames and audio: a struct of its
// family's (the rows a second model reads, latents, the decoded frames). In one process the
// consumer gets the struct the producer wrote, shared, its tensors where they are; across
// processes the gRPC layer sends tensors() and the consumer's reader builds the struct again
// (payload_as).
struct Payload {
  virtual ~Payload() = default;
  virtual NamedTensors tensors() const = 0;
};

// A payload as it came over the wire, for the consumer's reader.
struct WirePayload : Payload {
  explicit WirePayload(NamedTensors t) : named(std::move(t)) {}
  NamedTensors tensors() const override { return named; }
  NamedTensors named;
};

// What a stage emits for a request (and what its downstream receives).
struct StagePacket {
  std::vector<int64_t> tokens;               // a text stage: tokens sampled since the last packet
  std::string text;                          // a text stage: their text (whole UTF-8 characters)
  std::vector<std::vector<int64_t>> frames;  // an audio codec's frames
  at::Tensor audio;                          // float32 samples of one streamed audio chunk (CPU)
  std::shared_ptr<const Payload> payload;    // null: none
  bool finished = false;                     // the stage's last packet for the request
  std::string finish_reason;                 // with finished
  std::map<std::string, double> metrics;     // with finished: the stage's timings
  int64_t source = -1;  // the stage that wrote it (set by the orchestrator as it forwards it)

  // The payload's tensor called `name`, or an undefined tensor (for tools and tests: a kind
  // reads its payload with payload_as).
  at::Tensor tensor(const std::string& name) const;
};

// The packet's payload as `T`: the struct itself in one process, or `read` of the tensors that
// came over the wire; null when the packet has none.
template <typename T>
std::shared_ptr<const T> payload_as(const StagePacket& packet, T (*read)(const NamedTensors&)) {
  if (!packet.payload) return nullptr;
  if (auto typed = std::dynamic_pointer_cast<const T>(packet.payload)) return typed;
  return std::make_shared<const T>(read(packet.payload->tensors()));
}

// An input file of the request, carried as bytes (a remote worker has no access to our files).
struct MediaFile {
  std::string kind;  // "audio" | "image"
  std::string name;  // as the user gave it
  std::string data;
};

// A stage's parameters for one request: its kind's own struct, defined in its family's folder.
// In one process the struct reaches the stage as it is; the gRPC layer sends to_json() and the
// worker hands the stage a JsonParams, which the stage's kind parses.
struct StageParams {
  virtual ~StageParams() = default;
  virtual std::string to_json() const = 0;
};

// Parameters as they came over the wire: JSON text for the stage's kind to read.
struct JsonParams : StageParams {
  explicit JsonParams(std::string text) : json(std::move(text)) {}
  std::string to_json() const override { return json; }
  std::string json;
};

struct StageCall {
  std::string request_id;
  std::shared_ptr<const StageParams> params;  // null: the kind's defaults
  std::vector<MediaFile> media;
  // The request's deadline (steady clock); max() = none.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
};

// The call's parameters as `T`: the struct itself in one process, or `parse` of the JSON that
// came over the wire; the kind's defaults when the call has none.
template <typename T>
std::shared_ptr<const T> params_as(const StageCall& call, T (*parse)(const std::string&)) {
  if (!call.params) return std::make_shared<const T>();
  if (auto typed = std::dynamic_pointer_cast<const T>(call.params)) return typed;
  return std::make_shared<const T>(parse(call.params->to_json()));
}

// What the orchestrator needs of a stage's model, fixed once it is loaded. The gRPC layer
// carries it as JSON (worker/rpc/wire.h).
struct StageInfo {
  std::string model_stage;
  uint64_t param_bytes = 0;          // all its weights
  uint64_t offloadable_bytes = 0;    // those that can leave the device
  uint64_t device_weight_bytes = 0;  // its weights' bytes on the device when loaded
  uint64_t device_kv_bytes = 0;      // a KV pool it holds on the device from its start
  // A stage that chooses the voice of the audio: the voices it knows (lower case) and its
  // default.
  std::vector<std::string> voices;
  std::string default_voice;
  int64_t audio_sample_rate = 0;  // a stage that answers audio: its samples per second
  // The family's own facts of the stage, as JSON text for its kinds to read (the gRPC layer
  // carries it as it is).
  std::string family_json;
  // A stage that reads the prompt's text: its context in tokens, and the most bytes of text
  // that could fit it (context x the tokenizer's longest token): more is refused before it is
  // tokenized. 0: no limit known.
  int64_t context_tokens = 0;
  uint64_t max_prompt_bytes = 0;
};

// Why a stage failed; the orchestrator turns it into the request's error.
class StageError : public std::runtime_error {
 public:
  // kUnavailable: the stage cannot serve (shutting down, unreachable); kResourceExhausted: it is
  // at capacity (a bounded queue is full), so the same request may succeed later.
  enum class Code {
    kInternal,
    kInvalidArgument,
    kCancelled,
    kDeadlineExceeded,
    kUnavailable,
    kResourceExhausted
  };
  StageError(Code code, std::string stage, const std::string& message)
      : std::runtime_error(stage.empty() ? message : stage + ": " + message),
        code_(code),
        stage_(std::move(stage)),
        message_(message) {}
  Code code() const { return code_; }
  const std::string& stage() const { return stage_; }
  const std::string& message() const { return message_; }  // without the stage name

 private:
  Code code_;
  std::string stage_, message_;
};

const char* code_name(StageError::Code code);

// Set once, read by every thread working on a request: cancellation (a client went away, an
// error elsewhere in the pipeline) and the deadline.
class CancelToken {
 public:
  void cancel() {
    std::lock_guard<std::mutex> lock(mutex_);
    cancelled_ = true;
    changed_.notify_all();
  }
  bool cancelled() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return cancelled_;
  }
  // Waits up to `timeout` for cancel(); true when cancelled.
  bool wait_for(std::chrono::milliseconds timeout) const {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, timeout, [&] { return cancelled_; });
  }

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  bool cancelled_ = false;
};

// Packets from one stage to the next, in order. The producer closes it after its last packet
// (or with an error, which the consumer's pop rethrows); pop blocks until a packet, the end, or
// cancellation.
class PacketQueue {
 public:
  void push(StagePacket packet);
  // No more packets. An error makes pop throw it once the queued packets are read.
  void close(std::exception_ptr error = nullptr);
  // The next packet; nullopt at the end. Throws the producer's error, or StageError kCancelled
  // when `cancel` (if given) fires while waiting.
  std::optional<StagePacket> pop(const CancelToken* cancel = nullptr);
  bool closed() const;
  // Blocks until the producer closed the queue (every packet is in it), or throws StageError
  // kCancelled when `cancel` fires first.
  void wait_closed(const CancelToken& cancel);

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<StagePacket> packets_;
  bool closed_ = false;
  std::exception_ptr error_;
};

// Receives a stage's packets as they are produced. Throws StageError kCancelled to stop the
// stage (the receiver went away).
using PacketSink = std::function<void(StagePacket&&)>;

class Stage {
 public:
  virtual ~Stage() = default;
  // "stage 1 (<its kind>)": every error names it.
  virtual const std::string& name() const = 0;
  // Runs one request to its end: reads `input` (closed at once for an entry stage), writes to
  // `sink`, the last packet with finished set. Honours `cancel` and the call's deadline between
  // steps. Throws StageError (a bad request, a failure, cancellation). Concurrent calls are
  // allowed; a stage may run them one after the other.
  virtual void run(const StageCall& call, PacketQueue& input, const PacketSink& sink,
                   const CancelToken& cancel) = 0;
  // Offload statistics, device and host bytes, as JSON text. Answers at once: while a request
  // runs, a stage may give the figures of its last idle moment.
  virtual std::string stats_json() = 0;
  // What the orchestrator needs of the stage's model. Answers at once.
  virtual StageInfo info() = 0;
  // The device budget ledger: release = move the stage's offloadable weights to the host (the
  // stage is idle and another stage on the device needs the room); false = bring them back.
  // Returns the bytes moved. A stage with nothing offloadable moves nothing.
  virtual uint64_t set_device_released(bool release) = 0;
  // Bytes the stage's weights hold on its device now.
  virtual uint64_t device_bytes() = 0;
};

}  // namespace omni::pipeline
