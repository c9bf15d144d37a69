// Per-unit figures from an OffloadStats by unit name; a missing unit fails the test.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "cpu_offload/offload_stats.h"

namespace omni::testing {

inline const offload::UnitStats* find_unit(const offload::OffloadStats& s,
                                           const std::string& name) {
  for (const auto& u : s.units) {
    if (u.name == name) return &u;
  }
  ADD_FAILURE() << "no unit " << name;
  return nullptr;
}

inline size_t unit_bytes(const offload::OffloadStats& s, const std::string& name) {
  const auto* u = find_unit(s, name);
  return u ? u->bytes : 0;
}

inline uint64_t unit_loads(const offload::OffloadStats& s, const std::string& name) {
  const auto* u = find_unit(s, name);
  return u ? u->loads : 0;
}

}  // namespace omni::testing
