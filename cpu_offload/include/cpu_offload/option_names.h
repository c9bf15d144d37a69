// The names the engine's option parsers accept (offload_config.h, transfer_engine.h), listed
// once for every front end that checks a value before the engine sees it: the command lines'
// validators, the stage YAML's errors and the parsers' own messages. Standard C++ only: the
// YAML layer includes it and builds without LibTorch.
#pragma once

#include <string>
#include <vector>

namespace omni::offload::names {

// Each list starts with the default.
inline const std::vector<std::string>& component_policies() {  // parse_component_policy
  static const std::vector<std::string> names{"alternating", "sequential"};
  return names;
}
inline const std::vector<std::string>& expert_miss_policies() {  // parse_expert_miss_policy
  static const std::vector<std::string> names{"fetch", "host", "auto"};
  return names;
}
inline const std::vector<std::string>& expert_evictions() {  // parse_expert_eviction
  static const std::vector<std::string> names{"layer", "lru"};
  return names;
}
inline const std::vector<std::string>& disk_reads() {  // parse_disk_read
  static const std::vector<std::string> names{"pread", "mmap"};
  return names;
}
inline const std::vector<std::string>& device_kinds() {  // parse_device_kind (also takes aliases)
  static const std::vector<std::string> names{"auto", "cpu", "cuda"};
  return names;
}

// "a, b or c", for error messages.
inline std::string listed(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " or " : ", ";
    out += names[i];
  }
  return out;
}

}  // namespace omni::offload::names
