// The supervisor of a pipeline's local workers: starts them side by side, restarts one that dies,
// stops them all.
#include <algorithm>
#include <thread>
#include <utility>

#include "worker/process/process_helpers.h"
#include "worker/process/worker_process.h"

namespace omni::pipeline {
namespace {

using Clock = std::chrono::steady_clock;
using detail::format_duration;
using detail::registry;
using std::chrono::milliseconds;

}  // namespace

struct WorkerSupervisor::Slot {
  enum class State { kStarting, kUp, kRestarting, kFailed, kStopped };

  // The supervisor stops its processes itself: the shutdown handler need not know them.
  explicit Slot(WorkerSpec spec) : process(std::move(spec)) {
    auto& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    reg.processes.erase(&process);
  }

  WorkerProcess process;
  State state = State::kStarting;
  std::string address;
  uint64_t generation = 0;
  int restarts_in_a_row = 0;
  Clock::time_point up_since;
  std::exception_ptr start_error;  // the first start failed
  std::string failure;             // with kFailed: why
  std::thread watcher;
};

WorkerSupervisor::WorkerSupervisor() : WorkerSupervisor(Options()) {}

WorkerSupervisor::WorkerSupervisor(Options options) : options_(options) {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.supervisors.insert(this);
}

WorkerSupervisor::~WorkerSupervisor() {
  {
    auto& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    reg.supervisors.erase(this);
  }
  stop_all();
}

std::shared_ptr<WorkerSupervisor::Slot> WorkerSupervisor::slot_locked(size_t index) const {
  if (index >= slots_.size()) {
    throw std::out_of_range("worker index " + std::to_string(index) + " of " +
                            std::to_string(slots_.size()));
  }
  return slots_[index];
}

size_t WorkerSupervisor::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_.size();
}

std::string WorkerSupervisor::address(size_t index) const {
  std::lock_guard<std::mutex> lock(mu_);
  return slot_locked(index)->address;
}

uint64_t WorkerSupervisor::generation(size_t index) const {
  std::lock_guard<std::mutex> lock(mu_);
  return slot_locked(index)->generation;
}

pid_t WorkerSupervisor::pid(size_t index) const {
  std::lock_guard<std::mutex> lock(mu_);
  return slot_locked(index)->process.pid();
}

void WorkerSupervisor::set_callbacks(
    std::function<void(size_t, int)> on_exit,
    std::function<void(size_t, const std::string&)> on_restarted,
    std::function<void(size_t, const std::string&)> on_restart_failed) {
  std::lock_guard<std::mutex> lock(mu_);
  on_exit_ = std::move(on_exit);
  on_restarted_ = std::move(on_restarted);
  on_restart_failed_ = std::move(on_restart_failed);
}

std::vector<std::string> WorkerSupervisor::start_all(std::vector<WorkerSpec> specs) {
  // The processes are made outside mu_ (their constructor takes the registry's lock).
  std::vector<std::shared_ptr<Slot>> slots;
  for (auto& spec : specs) slots.push_back(std::make_shared<Slot>(std::move(spec)));
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& slot : slots_) {
      if (slot->watcher.joinable()) {
        throw std::logic_error(
            "WorkerSupervisor::start_all: the workers of the last start_all are still managed; "
            "call stop_all first");
      }
    }
    slots_ = slots;
    stopping_ = false;
    cancel_ = false;
    failed_ = false;
  }
  // One watcher per worker: it starts its worker (all in parallel), then watches it.
  std::vector<std::thread> watchers;
  try {
    for (size_t i = 0; i < slots.size(); ++i) {
      watchers.emplace_back(&WorkerSupervisor::watch, this, i, slots[i]);
    }
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      cancel_ = true;
    }
    cv_.notify_all();
    for (auto& watcher : watchers) watcher.join();
    for (auto& slot : slots) slot->process.stop();
    throw;
  }
  std::unique_lock<std::mutex> lock(mu_);
  for (size_t i = 0; i < slots.size(); ++i) slots[i]->watcher = std::move(watchers[i]);
  cv_.wait(lock, [&] {
    if (failed_ || stopping_) return true;
    return std::all_of(slots.begin(), slots.end(),
                       [](const auto& slot) { return slot->state != Slot::State::kStarting; });
  });
  if (failed_ || stopping_) {
    const bool failed = failed_;
    const std::exception_ptr error = failed ? slots[first_failure_]->start_error : nullptr;
    lock.unlock();
    stop_all();
    if (error) std::rethrow_exception(error);
    throw std::runtime_error("the workers were stopped before all of them were ready");
  }
  std::vector<std::string> addresses;
  for (const auto& slot : slots) addresses.push_back(slot->address);
  return addresses;
}

void WorkerSupervisor::watch(size_t index, const std::shared_ptr<Slot>& slot) {
  try {
    std::string address = slot->process.start_impl(&cancel_);
    std::lock_guard<std::mutex> lock(mu_);
    slot->state = Slot::State::kUp;
    slot->address = std::move(address);
    slot->generation = 1;
    slot->up_since = Clock::now();
    cv_.notify_all();
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mu_);
    slot->state = Slot::State::kFailed;
    slot->start_error = std::current_exception();
    slot->failure = e.what();
    if (!failed_ && !stopping_) {
      failed_ = true;
      first_failure_ = index;
    }
    cv_.notify_all();
    return;
  }

  const std::string& name = slot->process.name_;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait_for(lock, options_.poll_interval, [&] { return stopping_; });
    if (stopping_) return;
    if (slot->process.running()) {
      if (Clock::now() - slot->up_since >= options_.healthy_after) slot->restarts_in_a_row = 0;
      continue;
    }
    // It died: tell, then restart it until it is up or the restarts in a row are spent.
    const int status = slot->process.exit_status().value_or(-1);
    std::string last_error = name + " " + slot->process.exit_description();
    slot->state = Slot::State::kRestarting;
    cv_.notify_all();
    auto on_exit = on_exit_;
    lock.unlock();
    if (on_exit) on_exit(index, status);
    lock.lock();
    bool retry = false;  // the last restart attempt failed: wait a little before the next
    for (;;) {
      if (retry) {
        const auto backoff = std::min<milliseconds>(
            options_.poll_interval * (1 << std::min(slot->restarts_in_a_row, 6)),
            std::chrono::seconds(5));
        cv_.wait_for(lock, backoff, [&] { return stopping_; });
      }
      if (stopping_) return;
      if (slot->restarts_in_a_row >= options_.max_restarts) {
        slot->state = Slot::State::kFailed;
        slot->failure = name;
        slot->failure += " is down: gave up after " + std::to_string(options_.max_restarts) +
                         " restart(s) in a row (last: " + last_error + ")";
        cv_.notify_all();
        auto on_failed = on_restart_failed_;
        const std::string message = slot->failure;
        lock.unlock();
        if (on_failed) on_failed(index, message);
        return;
      }
      ++slot->restarts_in_a_row;
      lock.unlock();
      std::string address;
      try {
        address = slot->process.start_impl(&cancel_);
      } catch (const std::exception& e) {
        last_error = e.what();
        lock.lock();
        retry = true;
        continue;
      }
      lock.lock();
      if (stopping_) return;  // stop_all stops it
      slot->state = Slot::State::kUp;
      slot->address = address;
      ++slot->generation;
      slot->up_since = Clock::now();
      cv_.notify_all();
      auto on_restarted = on_restarted_;
      lock.unlock();
      if (on_restarted) on_restarted(index, address);
      lock.lock();
      break;
    }
  }
}

std::string WorkerSupervisor::wait_ready(size_t index, milliseconds timeout,
                                         uint64_t min_generation) {
  const auto deadline = Clock::now() + timeout;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    const auto slot = slot_locked(index);
    const std::string& name = slot->process.name_;
    switch (slot->state) {
      case Slot::State::kUp:
        if (slot->generation >= min_generation && slot->process.running()) return slot->address;
        break;
      case Slot::State::kFailed:
        throw std::runtime_error(slot->failure);
      case Slot::State::kStopped:
        throw std::runtime_error(name + " is stopped");
      default:
        break;
    }
    if (stopping_) throw std::runtime_error(name + " is being stopped");
    const auto now = Clock::now();
    if (now >= deadline) {
      throw std::runtime_error(name + " was not ready within " + format_duration(timeout));
    }
    // Wakes on every change, and each poll interval to notice a death the watcher has not yet.
    cv_.wait_until(lock, std::min(deadline, now + options_.poll_interval));
  }
}

void WorkerSupervisor::stop_all(milliseconds grace) {
  std::vector<std::shared_ptr<Slot>> slots;
  std::vector<std::thread> watchers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cancel_ = true;  // aborts a start in progress, without waiting for its timeout
    slots = slots_;
    for (const auto& slot : slots) {
      if (slot->watcher.joinable()) watchers.push_back(std::move(slot->watcher));
    }
  }
  cv_.notify_all();
  if (slots.size() == 1) {
    slots[0]->process.stop(grace);
  } else if (!slots.empty()) {
    std::vector<std::thread> stoppers;
    for (const auto& slot : slots) {
      stoppers.emplace_back([&slot, grace] { slot->process.stop(grace); });
    }
    for (auto& stopper : stoppers) stopper.join();
  }
  for (auto& watcher : watchers) {
    if (watcher.get_id() == std::this_thread::get_id()) {
      watcher.detach();  // stop_all from a callback: documented as not allowed; don't deadlock
    } else {
      watcher.join();
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& slot : slots) {
      if (slot->state != Slot::State::kFailed) slot->state = Slot::State::kStopped;
    }
  }
  cv_.notify_all();
}

}  // namespace omni::pipeline
