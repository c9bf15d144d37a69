#include "unigram_model.h"

#include <algorithm>
#include <cstdio>

#include "cpu_offload/check.h"
#include "utf8.h"

namespace omni::models {

UnigramModel::UnigramModel(const JsonField& model) {
  const JsonField vocab = model.get("vocab");
  const std::vector<JsonField> entries = vocab.items();
  if (entries.empty()) vocab.fail("is empty");
  pieces_.reserve(entries.size());
  scores_.reserve(entries.size());
  for (const JsonField& entry : entries) {
    const std::vector<JsonField> pair = entry.items();
    if (pair.size() != 2) entry.fail("must be a [piece, score] pair");
    pieces_.push_back(pair[0].string());
    scores_.push_back(pair[1].number());
  }
  double min_score = scores_[0];
  for (size_t id = 0; id < pieces_.size(); ++id) {
    if (pieces_[id].empty()) entries[id].fail("is an empty piece");
    if (!ids_.emplace(pieces_[id], static_cast<int32_t>(id)).second) {
      entries[id].fail("piece '" + pieces_[id] + "' appears twice");
    }
    max_piece_bytes_ = std::max(max_piece_bytes_, pieces_[id].size());
    min_score = std::min(min_score, scores_[id]);
  }
  unk_score_ = min_score - 10.0;
  if (const auto unk = model.find("unk_id")) {
    const int64_t id = unk->integer();
    if (id < 0 || static_cast<size_t>(id) >= pieces_.size()) {
      unk->fail("id " + std::to_string(id) + " is outside model.vocab");
    }
    unk_id_ = static_cast<int32_t>(id);
  }
  byte_fallback_ = model.get_bool("byte_fallback", false);
}

std::optional<int32_t> UnigramModel::token_to_id(std::string_view token) const {
  const auto it = ids_.find(token);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

const std::string* UnigramModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= pieces_.size()) return nullptr;
  return &pieces_[static_cast<size_t>(id)];
}

void UnigramModel::tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  // best[end]: the best path over word[0, end): its score, where its last piece starts, and
  // that piece's id. Visited in order of start, then piece length, replacing only on a strictly
  // higher score, as Hugging Face's encode_optimized.
  struct Node {
    double score = 0;
    size_t start = std::string_view::npos;
    int32_t id = -1;
  };
  const int32_t unk = unk_id_.value_or(-1);
  std::vector<Node> best(word.size() + 1);
  best[0].start = 0;
  for (size_t start = 0; start < word.size();) {
    const size_t char_len = utf8::char_length(word, start);
    const double till_here = best[start].score;
    bool has_single_char = false;
    const size_t max_len = std::min(max_piece_bytes_, word.size() - start);
    for (size_t len = 1; len <= max_len; ++len) {
      const auto it = ids_.find(word.substr(start, len));
      if (it == ids_.end()) continue;
      Node& target = best[start + len];
      const double candidate = scores_[static_cast<size_t>(it->second)] + till_here;
      if (target.start == std::string_view::npos || candidate > target.score) {
        target = {candidate, start, it->second};
      }
      if (len == char_len) has_single_char = true;
    }
    if (!has_single_char) {
      Node& target = best[start + char_len];
      const double candidate = unk_score_ + till_here;
      if (target.start == std::string_view::npos || candidate > target.score) {
        target = {candidate, start, unk};
      }
    }
    start += char_len;
  }
  // Back from the end; consecutive unknown pieces become one string (fuse_unk).
  std::vector<std::string_view> strings;
  size_t unk_begin = std::string_view::npos;
  size_t unk_end = 0;
  for (size_t end = word.size(); end > 0;) {
    const Node& node = best[end];
    if (unk_id_ && node.id == unk) {
      if (unk_begin == std::string_view::npos) unk_end = end;
      unk_begin = node.start;
    } else {
      if (unk_begin != std::string_view::npos) {
        strings.push_back(word.substr(unk_begin, unk_end - unk_begin));
        unk_begin = std::string_view::npos;
      }
      strings.push_back(word.substr(node.start, end - node.start));
    }
    end = node.start;
  }
  if (unk_begin != std::string_view::npos) {
    strings.push_back(word.substr(unk_begin, unk_end - unk_begin));
  }
  for (auto it = strings.rbegin(); it != strings.rend(); ++it) {
    if (const auto id = token_to_id(*it)) {
      ids->push_back(*id);
      continue;
    }
    if (byte_fallback_) {
      std::vector<int32_t> bytes;
      for (const char c : *it) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", static_cast<unsigned char>(c));
        const auto id = token_to_id(name);
        if (!id) break;
        bytes.push_back(*id);
      }
      if (bytes.size() == it->size()) {
        ids->insert(ids->end(), bytes.begin(), bytes.end());
        continue;
      }
    }
    if (!unk_id_)
      OMNI_THROW("Unigram: '", std::string(*it), "' has no piece and there is no unk_id");
    ids->push_back(*unk_id_);
  }
}

}  // namespace omni::models
