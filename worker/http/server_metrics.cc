#include "worker/http/server_metrics.h"

#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>
#include <vector>

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

namespace {

using Json = nlohmann::json;

// A label value as the text format wants it: backslash, quote and newline escaped.
std::string label(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

struct Family {
  const char* name;
  const char* type;
  const char* help;
  std::vector<std::pair<std::string, double>> samples;  // label set, value
};

void write_family(std::ostream& out, const Family& f) {
  if (f.samples.empty()) return;
  out << "# HELP " << f.name << " " << f.help << "\n# TYPE " << f.name << " " << f.type << "\n";
  for (const auto& [labels, value] : f.samples) out << f.name << labels << " " << value << "\n";
}

// Resident set of this process (the server: with --model, every stage's host memory too).
double resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  double pages_total = 0, pages_resident = 0;
  if (!(statm >> pages_total >> pages_resident)) return 0;
  return pages_resident * static_cast<double>(::sysconf(_SC_PAGESIZE));
}

}  // namespace

std::string offload_metrics(const std::string& stats_json) {
  Family up{"omni_stage_up", "gauge", "1 when the stage answered its statistics, else 0.", {}};
  Family moved{"omni_offload_bytes_moved_total",
               "counter",
               "Weight bytes copied from host to device by the stage's offload.",
               {}};
  Family loads{"omni_offload_loads_total", "counter", "Weight units loaded to the device.", {}};
  Family stall{
      "omni_offload_stall_seconds_total", "counter", "Time compute waited for weight copies.", {}};
  Family device{"omni_device_weight_bytes", "gauge", "Weight bytes on the device now.", {}};
  Family peak{"omni_device_weight_peak_bytes", "gauge", "Peak weight bytes on the device.", {}};
  Family host{"omni_host_weight_bytes", "gauge", "Host bytes holding offloaded weights.", {}};
  Family params{"omni_weight_bytes", "gauge", "The stage's parameter and buffer bytes.", {}};
  Family held{"omni_device_ledger_held_bytes",
              "gauge",
              "Bytes the device ledger has granted on a device.",
              {}};
  Family evictions{"omni_device_ledger_evictions_total",
                   "counter",
                   "Stages told to give their weights back to make room.",
                   {}};
  Json all;
  try {
    all = Json::parse(stats_json);
  } catch (const std::exception&) {
    all = Json::object();
  }
  for (const auto& [name, value] : all.items()) {
    if (name == "device_ledger") {
      for (const auto& [dev, d] : value.items()) {
        const std::string l = "{device=\"" + label(dev) + "\"}";
        held.samples.emplace_back(l, d.value("held", 0.0));
        evictions.samples.emplace_back(l, d.value("evictions", 0.0));
      }
      continue;
    }
    const std::string l = "{stage=\"" + label(name) + "\"}";
    // A worker's Stats RPC wraps the stage's figures: {"server": ..., "stage": {...}}.
    const Json& s = value.contains("stage") ? value["stage"] : value;
    const bool answered = !value.contains("error") && s.contains("bytes_h2d");
    up.samples.emplace_back(l, answered ? 1 : 0);
    if (!answered) continue;
    moved.samples.emplace_back(l, s.value("bytes_h2d", 0.0));
    loads.samples.emplace_back(l, s.value("loads", 0.0));
    stall.samples.emplace_back(l, s.value("stall_ms", 0.0) / 1000);
    device.samples.emplace_back(l, s.value("current_device_bytes", 0.0));
    peak.samples.emplace_back(l, s.value("peak_device_bytes", 0.0));
    host.samples.emplace_back(l, s.value("host_bytes", 0.0));
    params.samples.emplace_back(l, s.value("param_bytes", 0.0));
  }
  std::ostringstream out;
  out.precision(15);
  for (const auto* f :
       {&up, &moved, &loads, &stall, &device, &peak, &host, &params, &held, &evictions}) {
    write_family(out, *f);
  }
  out << "# HELP omni_process_resident_bytes Resident memory of the server process.\n"
      << "# TYPE omni_process_resident_bytes gauge\nomni_process_resident_bytes "
      << resident_bytes() << "\n";
  return out.str();
}

}  // namespace omni::http
