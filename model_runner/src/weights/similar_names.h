// "Did you mean": the names closest to a missing one, for error messages about checkpoints
// and configs with thousands of entries where a typo or a wrong prefix is the usual cause.
#pragma once

#include <string>
#include <vector>

namespace omni::models::detail {

// Up to `limit` candidates closest to `wanted` by edit distance, closest first (ties in
// alphabetical order).
std::vector<std::string> similar_names(const std::string& wanted,
                                       const std::vector<std::string>& candidates,
                                       size_t limit = 5);

// "; similar: a, b, c" or "" when there are no candidates, ready to append to a message.
std::string similar_names_suffix(const std::string& wanted,
                                 const std::vector<std::string>& candidates);

}  // namespace omni::models::detail
