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
  tokens_ += r.tokens.size();
  const auto& audio = r.audio;
  if (audio.codes.defined() && audio.codes.dim() == 2) {
    frames_ += static_cast<uint64_t>(audio.codes.size(1));
  }
  if (audio.waveform.defined() && audio.sample_rate > 0) {
    audio_seconds_ += static_cast<double>(audio.waveform.numel()) / audio.sample_rate;
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
      if (line.rfind('#', 0) == 0) {
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
  Family budget{"omni_device_ledger_budget_bytes",
                "gauge",
                "The device budget its stages share (--gpu-memory-budget, or the stages that stay "
                "plus the largest that moves).",
                {}};
  Family held{"omni_device_ledger_held_bytes",
              "gauge",
              "Bytes the device ledger has granted on a device.",
              {}};
  Family evictions{"omni_device_ledger_evictions_total",
                   "counter",
                   "Stages told to give their weights back to make room.",
                   {}};
  // Expert-level MoE offload (the thinker's "expert_cache") and the disk tiers ("disk" of the
  // layers, "expert_cache.disk" of the experts), where a stage has them.
  Family expert_hits{
      "omni_expert_cache_hits_total", "counter", "Routed experts found on the device.", {}};
  Family expert_misses{"omni_expert_cache_misses_total",
                       "counter",
                       "Routed experts not on the device (fetched or computed on the host).",
                       {}};
  Family expert_host{"omni_expert_cache_host_computed_total",
                     "counter",
                     "Expert misses computed on the host instead of fetched.",
                     {}};
  Family expert_moved{"omni_expert_cache_bytes_moved_total",
                      "counter",
                      "Expert bytes copied from host to device.",
                      {}};
  Family expert_stall{"omni_expert_cache_stall_seconds_total",
                      "counter",
                      "Time compute waited for expert copies.",
                      {}};
  Family expert_device{
      "omni_expert_cache_device_bytes", "gauge", "Device bytes of the expert cache's slots.", {}};
  Family disk_read{"omni_disk_read_bytes_total",
                   "counter",
                   "Weight bytes the disk tier read from the checkpoint's files.",
                   {}};
  Family disk_wait{"omni_disk_wait_seconds_total",
                   "counter",
                   "Time compute waited for the disk tier's reads.",
                   {}};
  Family disk_entries{
      "omni_disk_cache_entries", "gauge", "Host entries of the disk tier's cache.", {}};
  // Continuous batching ("engine" of a batching stage: its loop and its KV blocks).
  Family running{"omni_engine_running_requests", "gauge", "Requests in the stage's batch.", {}};
  Family waiting{"omni_engine_waiting_requests",
                 "gauge",
                 "Requests queued for the stage's batch (waiting for room or KV blocks).",
                 {}};
  Family steps{"omni_engine_steps_total", "counter", "Batched decode steps the stage ran.", {}};
  Family rows{"omni_engine_batch_rows_total",
              "counter",
              "Sequences stepped, summed over steps (divided by the steps: the mean batch size).",
              {}};
  Family last_batch{"omni_engine_last_batch_size", "gauge", "Batch size of the last step.", {}};
  Family queue{"omni_engine_queue_seconds_total",
               "counter",
               "Time admitted requests waited in the stage's queue.",
               {}};
  Family admitted{"omni_engine_admitted_total", "counter", "Requests admitted to a batch.", {}};
  Family busy{"omni_engine_busy_seconds_total",
              "counter",
              "Time the stage spent running its batches (over wall time: how saturated it is).",
              {}};
  Family kv_used{"omni_kv_blocks_used", "gauge", "KV cache blocks allocated now.", {}};
  Family kv_reserved{
      "omni_kv_blocks_reserved",
      "gauge",
      "KV cache blocks the running requests would hold at their longest (prompt plus "
      "max_tokens); admission counts the blocks in use, not these.",
      {}};
  Family kv_total{
      "omni_kv_blocks_total", "gauge", "KV cache blocks the stage may hold (0: no limit).", {}};
  // Each family's sample: a field of a stage's JSON, times a scale (ms -> s).
  struct Field {
    Family* family;
    const char* key;
    double scale;
  };
  const auto add_fields = [](const std::vector<Field>& fields, const std::string& l,
                             const Json& j) {
    for (const auto& f : fields) f.family->samples.emplace_back(l, j.value(f.key, 0.0) * f.scale);
  };
  const std::vector<Field> engine_fields = {{&running, "running", 1},
                                            {&waiting, "waiting", 1},
                                            {&steps, "steps", 1},
                                            {&rows, "batch_rows", 1},
                                            {&last_batch, "last_batch", 1},
                                            {&queue, "queue_ms_total", 1e-3},
                                            {&admitted, "admitted", 1},
                                            {&busy, "busy_ms_total", 1e-3},
                                            {&kv_used, "kv_blocks_used", 1},
                                            {&kv_reserved, "kv_blocks_reserved", 1},
                                            {&kv_total, "kv_blocks_total", 1}};
  const std::vector<Field> offload_fields = {
      {&moved, "bytes_h2d", 1},        {&loads, "loads", 1},
      {&stall, "stall_ms", 1e-3},      {&device, "current_device_bytes", 1},
      {&peak, "peak_device_bytes", 1}, {&host, "host_bytes", 1},
      {&params, "param_bytes", 1}};
  const std::vector<Field> expert_fields = {
      {&expert_hits, "hits", 1},          {&expert_misses, "misses", 1},
      {&expert_host, "host_computed", 1}, {&expert_moved, "bytes_h2d", 1},
      {&expert_stall, "stall_ms", 1e-3},  {&expert_device, "device_bytes", 1}};
  auto add_disk = [&](const std::string& stage, const char* tier, const Json& d) {
    const std::string l = "{stage=\"" + label(stage) + "\",tier=\"" + tier + "\"}";
    disk_read.samples.emplace_back(l, d.value("read_bytes", 0.0));
    disk_wait.samples.emplace_back(l, d.value("wait_ms", 0.0) / 1000);
    disk_entries.samples.emplace_back(l, d.value("entries", 0.0));
  };
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
        budget.samples.emplace_back(l, d.value("budget", 0.0));
        held.samples.emplace_back(l, d.value("held", 0.0));
        evictions.samples.emplace_back(l, d.value("evictions", 0.0));
      }
      continue;
    }
    const std::string l = "{stage=\"" + label(name) + "\"}";
    const Json& s = value;
    // Live even while a step runs (the offload figures may then be missing).
    if (s.contains("engine") && s["engine"].is_object()) add_fields(engine_fields, l, s["engine"]);
    const bool answered = !value.contains("error") && s.contains("bytes_h2d");
    up.samples.emplace_back(l, answered ? 1 : 0);
    if (!answered) continue;
    add_fields(offload_fields, l, s);
    if (s.contains("disk") && s["disk"].is_object()) add_disk(name, "layers", s["disk"]);
    if (!s.contains("expert_cache") || !s["expert_cache"].is_object()) continue;
    const Json& e = s["expert_cache"];
    add_fields(expert_fields, l, e);
    if (e.contains("disk") && e["disk"].is_object()) add_disk(name, "experts", e["disk"]);
  }
  std::ostringstream out;
  out.precision(15);
  for (const auto* f : {&up,           &moved,         &loads,         &stall,       &device,
                        &peak,         &host,          &params,        &budget,      &held,
                        &evictions,    &expert_hits,   &expert_misses, &expert_host, &expert_moved,
                        &expert_stall, &expert_device, &disk_read,     &disk_wait,   &disk_entries,
                        &running,      &waiting,       &steps,         &rows,        &last_batch,
                        &queue,        &admitted,      &busy,          &kv_used,     &kv_reserved,
                        &kv_total}) {
    write_family(out, *f);
  }
  out << "# HELP omni_process_resident_bytes Resident memory of the server process.\n"
      << "# TYPE omni_process_resident_bytes gauge\nomni_process_resident_bytes "
      << resident_bytes() << "\n";
  return out.str();
}

}  // namespace omni::http
