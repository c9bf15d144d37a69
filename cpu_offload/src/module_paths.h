// Dotted module/tensor paths. Internal to the engine.
#pragma once

#include <string>

namespace omni::offload {

// True when `name` is `prefix` or lies below it ("a.b.c" is under "a.b", not under "a.bc");
// everything is under the empty prefix.
inline bool path_is_under(const std::string& name, const std::string& prefix) {
  return prefix.empty() || name == prefix ||
         (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
          name[prefix.size()] == '.');
}

}  // namespace omni::offload
