#include "worker/runtime/streamed_sequence.h"

#include <atomic>
#include <exception>
#include <thread>
#include <utility>

namespace omni::pipeline {

void StreamInbox::deliver(std::optional<StagePacket> packet) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (packet) {
    packets_.push_back(std::move(*packet));
  } else {
    ended_ = true;
  }
}

std::deque<StagePacket> StreamInbox::take(bool* ended) {
  std::lock_guard<std::mutex> lock(mutex_);
  *ended = ended_;
  return std::exchange(packets_, {});
}

void run_streamed(const std::vector<StreamLeg>& legs, PacketQueue& input, const PacketSink& sink,
                  const CancelToken& cancel) {
  const auto& inbox = legs.front().seq->inbox();
  // The leg the request is on: a packet wakes its loop only (a wake makes a loop look at every
  // sequence it holds). Set before the leg is submitted, and read after a packet is delivered,
  // so a leg submitted meanwhile finds the packet in the inbox when it starts.
  std::atomic<size_t> current{0};
  const auto cancel_all = [&] {
    for (const auto& leg : legs) {
      leg.seq->cancel();
      leg.loop->wake();
    }
  };
  std::exception_ptr input_error;
  std::thread reader([&] {
    try {
      while (true) {
        auto packet = input.pop(&cancel);
        const bool end = !packet;
        inbox->deliver(std::move(packet));
        legs[current.load()].loop->wake();
        if (end) break;
      }
    } catch (...) {
      input_error = std::current_exception();
      cancel_all();
    }
  });
  std::exception_ptr output_error;
  try {
    for (size_t i = 0; i < legs.size(); ++i) {
      const auto& leg = legs[i];
      current.store(i);
      leg.loop->submit(leg.seq);
      while (auto packet = leg.seq->out.pop(&cancel)) sink(std::move(*packet));
      if (leg.seq->request_done()) break;
    }
  } catch (...) {
    output_error = std::current_exception();
    cancel_all();  // the client went away or the request failed: leave the batch at once
  }
  reader.join();
  if (input_error) std::rethrow_exception(input_error);
  if (output_error) std::rethrow_exception(output_error);
}

}  // namespace omni::pipeline
