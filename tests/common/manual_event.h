// An event the test completes itself: it stands for compute that has not finished yet, so a
// copy ordered after it stays pending for as long as the test wants.
#pragma once

#include <chrono>
#include <future>

#include "cpu_offload/transfer_engine.h"

namespace omni::testing {

class ManualEvent final : public offload::Event::Impl {
 public:
  ManualEvent() : future_(promise_.get_future().share()) {}
  bool ready() const override {
    return future_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }
  void host_wait() const override { future_.wait(); }
  void fire() { promise_.set_value(); }

 private:
  std::promise<void> promise_;
  std::shared_future<void> future_;
};

}  // namespace omni::testing
