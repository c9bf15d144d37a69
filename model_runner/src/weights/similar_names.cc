#include "similar_names.h"

#include <algorithm>
#include <utility>

namespace omni::models::detail {
namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitute = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, substitute});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

std::vector<std::string> similar_names(const std::string& wanted,
                                       const std::vector<std::string>& candidates, size_t limit) {
  std::vector<std::pair<size_t, const std::string*>> scored;
  scored.reserve(candidates.size());
  for (const auto& c : candidates) scored.emplace_back(edit_distance(wanted, c), &c);
  const size_t n = std::min(limit, scored.size());
  std::partial_sort(scored.begin(), scored.begin() + n, scored.end(),
                    [](const auto& x, const auto& y) {
                      return x.first != y.first ? x.first < y.first : *x.second < *y.second;
                    });
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) out.push_back(*scored[i].second);
  return out;
}

std::string similar_names_suffix(const std::string& wanted,
                                 const std::vector<std::string>& candidates) {
  const auto names = similar_names(wanted, candidates);
  if (names.empty()) return "";
  std::string out = "; similar: ";
  for (size_t i = 0; i < names.size(); ++i) out += (i ? ", '" : "'") + names[i] + "'";
  return out;
}

}  // namespace omni::models::detail
