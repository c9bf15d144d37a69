#include "cpu_offload/offload_stats.h"

#include <iomanip>
#include <sstream>

#include "json_text.h"

namespace omni::offload {

std::string OffloadStats::to_json(bool with_units) const {
  std::ostringstream os;
  os << std::fixed << std::setprecision(3);
  os << "{\"strategy\": " << json_quoted(strategy) << ", \"device\": " << json_quoted(device)
     << ", \"param_bytes\": " << param_bytes << ", \"resident_bytes\": " << resident_bytes
     << ", \"max_unit_bytes\": " << max_unit_bytes << ", \"host_bytes\": " << host_bytes
     << ", \"peak_device_bytes\": " << peak_device_bytes
     << ", \"current_device_bytes\": " << current_device_bytes
     << ", \"allocator_reserved_peak_bytes\": " << allocator_reserved_peak_bytes
     << ", \"allocator_allocated_peak_bytes\": " << allocator_allocated_peak_bytes
     << ", \"host_peak_bytes\": " << host_peak_bytes << ", \"bytes_h2d\": " << bytes_h2d
     << ", \"loads\": " << loads << ", \"sync_loads\": " << sync_loads
     << ", \"buffer_reuses\": " << buffer_reuses << ", \"copy_ms\": " << copy_ms
     << ", \"stall_ms\": " << stall_ms;
  if (with_units) {
    os << ", \"units\": [";
    for (size_t i = 0; i < units.size(); ++i) {
      const auto& u = units[i];
      os << (i ? ", " : "") << "{\"name\": " << json_quoted(u.name) << ", \"bytes\": " << u.bytes
         << ", \"loads\": " << u.loads << ", \"sync_loads\": " << u.sync_loads
         << ", \"copy_ms\": " << u.copy_ms << ", \"compute_ms\": " << u.compute_ms
         << ", \"stall_ms\": " << u.stall_ms << "}";
    }
    os << "]";
  }
  os << "}";
  return os.str();
}

}  // namespace omni::offload
