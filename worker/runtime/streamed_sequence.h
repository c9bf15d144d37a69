// A sequence fed by its source stage while it runs (a stage that speaks what its source writes,
// as it writes): the request's thread delivers the source's packets, the loop's thread takes
// them before a step. A request may pass through several loops in turn (legs), one inbox
// throughout.
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "worker/pipeline/stage.h"
#include "worker/runtime/engine_loop.h"

namespace omni::pipeline {

// The source's packets not yet taken. Any thread.
class StreamInbox {
 public:
  // nullopt: the source's stream ended.
  void deliver(std::optional<StagePacket> packet);
  // The packets delivered since the last call. `*ended` turns true once the stream ended and
  // every packet of it was taken.
  std::deque<StagePacket> take(bool* ended);

 private:
  std::mutex mutex_;
  std::deque<StagePacket> packets_;  // under mutex_
  bool ended_ = false;               // under mutex_
};

class StreamedSequence : public EngineSequence {
 public:
  // The sequences of one request's legs share its inbox.
  explicit StreamedSequence(std::shared_ptr<StreamInbox> inbox = std::make_shared<StreamInbox>())
      : inbox_(std::move(inbox)) {}
  // The loop's thread: see StreamInbox::take.
  std::deque<StagePacket> take_input(bool* ended) { return inbox_->take(ended); }
  const std::shared_ptr<StreamInbox>& inbox() const { return inbox_; }
  // Once the loop closed its queue without an error: whether the request's last packet went
  // out (true) or the next leg carries on.
  virtual bool request_done() const { return true; }

 private:
  std::shared_ptr<StreamInbox> inbox_;
};

// One loop a request runs on, with its sequence there (sharing the request's inbox).
struct StreamLeg {
  EngineLoop* loop = nullptr;
  std::shared_ptr<StreamedSequence> seq;
};

// The request's side of its legs, run one after another: delivers `input`'s packets to their
// inbox on a thread of its own (reading the source to its end), submits each leg's sequence
// once the last leg's queue closed without the request being done, and passes what the loops
// emit to `sink`. An error on either side cancels the sequences (each leaves its batch at once)
// and is rethrown here, as is a loop's error for its sequence.
void run_streamed(const std::vector<StreamLeg>& legs, PacketQueue& input, const PacketSink& sink,
                  const CancelToken& cancel);

}  // namespace omni::pipeline
