// Typed values of the stage config's keys (stage_values.cc): each reads a RawValue for `key`,
// checks its type and range, and throws ConfigError prefixed with the value's position. Shared by
// the schema (stage_fields.cc); not an API.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/config/stage_config.h"

namespace omni::config::detail {

std::string lower(std::string s);        // ASCII
std::string trim(const std::string& s);  // blanks and line breaks at both ends
bool to_bool(const std::string& key, const RawValue& v);
uint64_t to_uint(const std::string& key, const RawValue& v);
double to_double(const std::string& key, const RawValue& v);
std::string to_string(const std::string& key, const RawValue& v);
std::vector<std::string> to_string_list(const std::string& key, const RawValue& v);
// One of `valid`, else an error suggesting the closest.
std::string one_of(const std::string& key, const RawValue& v,
                   const std::vector<std::string>& valid);
std::string to_devices(const std::string& key, const RawValue& v);  // "0", "0,1" or "cpu"
std::string to_address(const std::string& key, const RawValue& v);  // "host:port"
// An existing directory (when the context checks), absolute against context.base_dir.
std::string to_model_dir(const std::string& key, const RawValue& v, const SetContext& context);
// Bytes: an integer, or a string with KB/MB/GB/TB or KiB/MiB/GiB/TiB.
uint64_t to_byte_size(const std::string& key, const RawValue& v);
// "25%" or bytes.
std::string to_expert_budget(const std::string& key, const RawValue& v);

}  // namespace omni::config::detail
