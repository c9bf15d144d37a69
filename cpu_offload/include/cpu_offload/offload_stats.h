// Figures every backend reports: what moved, how long it took, what it cost in memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace omni::offload {

struct UnitStats {
  std::string name;
  size_t bytes = 0;         // slab bytes
  uint64_t loads = 0;       // copies of this unit to the device
  uint64_t sync_loads = 0;  // loads not prefetched: the unit ran out of the expected order
  double copy_ms = 0;       // time its copies took on the copy stream
  double compute_ms = 0;    // time its forwards took
  double stall_ms = 0;      // time compute waited for its copy
};

struct OffloadStats {
  std::string strategy;
  std::string device;
  size_t param_bytes = 0;        // the model's distinct parameters and buffers
  size_t resident_bytes = 0;     // device bytes of the weights that never move
  size_t max_unit_bytes = 0;     // largest unit (layerwise) or group (model-level)
  size_t host_bytes = 0;         // host bytes holding weights (the slabs)
  size_t peak_device_bytes = 0;  // peak device bytes held for weights
  size_t current_device_bytes = 0;
  // Beside the engine's own counters, what the device allocator saw (CUDA's caching allocator:
  // weights, activations and whatever else the process allocated; the simulated device: the
  // engine's buffers, so both equal peak_device_bytes) and the host peak (pinned and pageable
  // buffers of the engine: slabs, staging buffers, disk cache), since the last reset_stats().
  size_t allocator_reserved_peak_bytes = 0;
  size_t allocator_allocated_peak_bytes = 0;
  size_t host_peak_bytes = 0;
  uint64_t bytes_h2d = 0;
  uint64_t loads = 0;
  uint64_t sync_loads = 0;
  uint64_t buffer_reuses = 0;  // loads into a device buffer an earlier load left (component)
  double copy_ms = 0;
  double stall_ms = 0;
  std::vector<UnitStats> units;

  // One JSON object; with_units adds the per-unit table.
  std::string to_json(bool with_units = false) const;
};

}  // namespace omni::offload
