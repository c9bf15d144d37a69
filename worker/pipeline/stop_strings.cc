#include "worker/pipeline/stop_strings.h"

#include <algorithm>

namespace omni::pipeline {

StopStringCutter::StopStringCutter(std::vector<std::string> stops) {
  for (auto& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

std::string StopStringCutter::push(const std::string& piece) {
  if (stopped_) return "";
  held_ += piece;
  size_t cut = std::string::npos;
  for (const auto& s : stops_) cut = std::min(cut, held_.find(s));
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, cut);
    held_.clear();
    return out;
  }
  // Hold back the longest end of the text that is the start of a stop string.
  size_t keep = 0;
  for (const auto& s : stops_) {
    for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStringCutter::finish() {
  std::string out = stopped_ ? "" : held_;
  held_.clear();
  return out;
}

}  // namespace omni::pipeline
