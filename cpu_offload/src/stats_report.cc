#include "cpu_offload/stats_report.h"

#include "cpu_offload/check.h"

namespace omni::offload {
namespace {

// `object` (a JSON object's text) with `"key": value` added as its last member.
std::string with_member(std::string object, const std::string& key, const std::string& value) {
  OMNI_CHECK(object.size() >= 2 && object.back() == '}', "not a JSON object: ", object);
  object.pop_back();
  const bool empty = object.find_first_not_of(" \n", 1) == std::string::npos;  // "{"
  if (!empty) object += ", ";
  return object + "\"" + key + "\": " + value + "}";
}

}  // namespace

std::string offload_report_json(OffloadBackend& backend, ExpertCache* experts) {
  std::string json = backend.stats().to_json();
  if (const auto disk = backend.disk_stats()) json = with_member(json, "disk", disk->to_json());
  if (experts != nullptr) {
    std::string e = experts->stats().to_json();
    if (const DiskTier* disk = experts->disk()) e = with_member(e, "disk", disk->stats().to_json());
    json = with_member(json, "expert_cache", e);
  }
  return json;
}

}  // namespace omni::offload
