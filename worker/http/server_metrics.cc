#include "worker/http/server_metrics.h"

#include <ostream>
#include <sstream>

namespace omni::http {

void ServerMetrics::Histogram::observe(double ms) {
  for (size_t i = 0; i < kBounds.size(); ++i) {
    if (ms <= kBounds[i]) ++buckets[i];
  }
  ++count;
  sum += ms;
}

void ServerMetrics::Histogram::write(std::ostream& out, const std::string& name,
                                     const std::string& help) const {
  out << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
  for (size_t i = 0; i < kBounds.size(); ++i) {
    out << name << "_bucket{le=\"" << kBounds[i] << "\"} " << buckets[i] << "\n";
  }
  out << name << "_bucket{le=\"+Inf\"} " << count << "\n";
  out << name << "_sum " << sum << "\n" << name << "_count " << count << "\n";
}

void ServerMetrics::count_request(int status) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++requests_[status];
}

void ServerMetrics::observe_ttft(double ms) {
  std::lock_guard<std::mutex> lock(mutex_);
  ttft_.observe(ms);
}

void ServerMetrics::observe_ttfa(double ms) {
  std::lock_guard<std::mutex> lock(mutex_);
  ttfa_.observe(ms);
}

void ServerMetrics::count_done(const pipeline::PipelineResult& r, double total_ms) {
  std::lock_guard<std::mutex> lock(mutex_);
  tokens_ += r.omni.tokens.size();
  if (r.omni.codes.defined() && r.omni.codes.dim() == 2) {
    frames_ += static_cast<uint64_t>(r.omni.codes.size(1));
  }
  if (r.omni.waveform.defined()) {
    audio_seconds_ += static_cast<double>(r.omni.waveform.numel()) / r.omni.sample_rate;
  }
  duration_.observe(total_ms);
  for (const auto& [stage, m] : r.stage_metrics) {
    const auto it = m.find("done_ms");
    if (it != m.end()) stage_done_[stage].observe(it->second);
  }
}

std::string ServerMetrics::prometheus() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::ostringstream out;
  out << "# HELP omni_requests_total Requests answered, by HTTP status.\n"
      << "# TYPE omni_requests_total counter\n";
  for (const auto& [status, n] : requests_) {
    out << "omni_requests_total{status=\"" << status << "\"} " << n << "\n";
  }
  out << "# HELP omni_generated_tokens_total Tokens the thinker generated.\n"
      << "# TYPE omni_generated_tokens_total counter\nomni_generated_tokens_total " << tokens_
      << "\n# HELP omni_audio_frames_total Codec frames the talker generated (80 ms each).\n"
      << "# TYPE omni_audio_frames_total counter\nomni_audio_frames_total " << frames_
      << "\n# HELP omni_audio_seconds_total Seconds of speech returned.\n"
      << "# TYPE omni_audio_seconds_total counter\nomni_audio_seconds_total " << audio_seconds_
      << "\n";
  ttft_.write(out, "omni_time_to_first_token_ms", "From the request to its first text.");
  ttfa_.write(out, "omni_time_to_first_audio_ms", "From the request to its first audio.");
  duration_.write(out, "omni_request_duration_ms", "From the request to its last byte.");
  for (const auto& [stage, h] : stage_done_) {
    std::string name = "omni_stage_done_ms";
    std::ostringstream labelled;
    h.write(labelled, name, "From the request to a stage's last packet.");
    // One histogram per stage: label every sample line with the stage.
    std::istringstream lines(labelled.str());
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("#", 0) == 0) {
        if (&stage == &stage_done_.begin()->first) out << line << "\n";
        continue;
      }
      const auto brace = line.find('{');
      const auto space = line.find(' ');
      if (brace != std::string::npos && brace < space) {
        out << line.substr(0, brace + 1) << "stage=\"" << stage << "\"," << line.substr(brace + 1)
            << "\n";
      } else {
        out << line.substr(0, space) << "{stage=\"" << stage << "\"}" << line.substr(space) << "\n";
      }
    }
  }
  return out.str();
}

}  // namespace omni::http
