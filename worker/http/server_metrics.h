// The server's counters, exported at GET /metrics in the Prometheus text format: requests by
// HTTP status, generated tokens and audio, time to first token and to first audio (histograms),
// request durations, and per stage the time from the request's start to its last packet.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "worker/pipeline/pipeline.h"

namespace omni::http {

class ServerMetrics {
 public:
  void count_request(int status);
  void observe_ttft(double ms);
  void observe_ttfa(double ms);
  // A finished answer: its tokens, codec frames, audio and stage latencies.
  void count_done(const pipeline::PipelineResult& result, double total_ms);
  std::string prometheus() const;

 private:
  // Cumulative buckets (ms), as Prometheus histograms.
  struct Histogram {
    static constexpr std::array<double, 12> kBounds = {10,   25,   50,   100,   250,   500,
                                                       1000, 2500, 5000, 10000, 30000, 60000};
    std::array<uint64_t, kBounds.size()> buckets{};
    uint64_t count = 0;
    double sum = 0;
    void observe(double ms);
    void write(std::ostream& out, const std::string& name, const std::string& help) const;
  };

  mutable std::mutex mutex_;
  std::map<int, uint64_t> requests_;
  uint64_t tokens_ = 0, frames_ = 0;
  double audio_seconds_ = 0;
  Histogram ttft_, ttfa_, duration_;
  std::map<std::string, Histogram> stage_done_;
};

// The stages' offload figures (Pipeline::stats_json) and this process's resident memory as
// Prometheus gauges and counters, one sample per stage (label `stage`) or device (`device`):
// bytes moved to the device, loads, stall time, device / peak device / host weight bytes, the
// device ledger's held bytes and evictions, and whether the stage answered.
std::string offload_metrics(const std::string& stats_json);

}  // namespace omni::http
