#include "bpe_model.h"

#include <algorithm>
#include <queue>

#include "cpu_offload/check.h"
#include "utf8.h"

namespace omni::models {
namespace {

// One symbol of a word being merged: a doubly linked list over the initial characters.
struct Symbol {
  int32_t id;
  int prev;  // -1: none
  int next;  // -1: none
  bool removed;
};

// A candidate merge of the symbol at `pos` with its right neighbour.
struct Candidate {
  uint32_t rank;
  int pos;
  int32_t new_id;
};

// Lowest rank first, then leftmost: the order Hugging Face's BinaryHeap pops its merges in.
struct LaterCandidate {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  }
};

}  // namespace

BpeModel::BpeModel(const JsonField& model) {
  // Options that change what a BPE model produces are either implemented or refused.
  if (const auto dropout = model.find("dropout"); dropout && dropout->number() != 0.0) {
    dropout->fail("BPE dropout (random merges at encode time) is not supported");
  }
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!model.get_string(affix, "").empty()) {
      model.get(affix).fail("is not supported (byte-level BPE has none)");
    }
  }
  if (model.get_bool("byte_fallback", false)) {
    model.get("byte_fallback").fail("true is not supported (byte-level BPE needs none)");
  }
  parse_vocab(model.get("vocab"));
  if (const auto unk = model.find("unk_token")) {
    const auto id = token_to_id(unk->string());
    if (!id) unk->fail("'" + unk->string() + "' is not in model.vocab");
    unk_id_ = *id;
  }
  fuse_unk_ = model.get_bool("fuse_unk", false);
  ignore_merges_ = model.get_bool("ignore_merges", false);
  parse_merges(model.get("merges"));
}

void BpeModel::parse_vocab(const JsonField& vocab) {
  if (!vocab.json().is_object()) {
    vocab.fail(std::string("must be an object, got ") + vocab.json().type_name());
  }
  vocab_.reserve(vocab.json().size());
  for (const auto& [token, value] : vocab.json().items()) {
    const JsonField entry(value, vocab.source(), vocab.path() + "." + token);
    const int64_t id = entry.integer();
    if (id < 0 || id > INT32_MAX) entry.fail("id must be in [0, 2^31)");
    vocab_.emplace(token, static_cast<int32_t>(id));
    max_token_chars_ = std::max(max_token_chars_, utf8::count_chars(token));
  }
  // Decoding needs the reverse. Should two tokens share an id, the lexicographically smallest
  // wins (Hugging Face's pick depends on hash order).
  for (const auto& [token, id] : vocab_) {
    const std::string* existing = tokens_by_id_.emplace(id, &token).first->second;
    if (token < *existing) tokens_by_id_[id] = &token;
  }
}

void BpeModel::parse_merges(const JsonField& merges) {
  uint32_t rank = 0;
  for (const JsonField& merge : merges.items()) {
    std::string left, right;
    if (merge.json().is_string()) {
      // "a b", Hugging Face's older format: exactly one space (the byte-level alphabet writes
      // a space as "Ġ", so tokens contain none).
      const std::string line = merge.string();
      if (line.rfind("#version", 0) == 0) continue;  // a merges.txt header, not a merge
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        merge.fail("'" + line + "' is not two tokens separated by one space");
      }
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else if (merge.json().is_array()) {
      const auto parts = merge.items();
      if (parts.size() != 2) merge.fail("must be a pair of tokens");
      left = parts[0].string();
      right = parts[1].string();
    } else {
      merge.fail(std::string("must be a string \"a b\" or a pair [\"a\", \"b\"], got ") +
                 merge.json().type_name());
    }
    const auto id_of = [&](const std::string& token) {
      const auto id = token_to_id(token);
      if (!id) merge.fail("token '" + token + "' is not in model.vocab");
      return *id;
    };
    const int32_t left_id = id_of(left);
    const int32_t right_id = id_of(right);
    const int32_t new_id = id_of(left + right);
    // A pair listed twice keeps its later rank, as in Hugging Face's map.
    merges_[pair_key(left_id, right_id)] = Merge{rank, new_id};
    ++rank;
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  const auto it = tokens_by_id_.find(id);
  return it == tokens_by_id_.end() ? nullptr : it->second;
}

std::vector<int32_t> BpeModel::merge_word(std::string_view word) const {
  // Initial symbols: one per character; unknown characters become the unknown token (runs of
  // them one token with fuse_unk) or vanish without one.
  std::vector<Symbol> symbols;
  bool pending_unk = false;
  const auto flush_unk = [&] {
    if (pending_unk) symbols.push_back({*unk_id_, 0, 0, false});
    pending_unk = false;
  };
  for (size_t pos = 0; pos < word.size();) {
    const size_t n = utf8::char_length(word, pos);
    const auto id = token_to_id(word.substr(pos, n));
    pos += n;
    if (id) {
      flush_unk();
      symbols.push_back({*id, 0, 0, false});
    } else if (unk_id_) {
      if (!fuse_unk_) flush_unk();
      pending_unk = true;
    }
  }
  flush_unk();
  const int count = static_cast<int>(symbols.size());
  for (int i = 0; i < count; ++i) {
    symbols[i].prev = i - 1;
    symbols[i].next = i + 1 < count ? i + 1 : -1;
  }

  // Apply merges lowest rank first, leftmost first among equals, re-checking each candidate
  // against the current neighbours (entries go stale as symbols merge): Hugging Face's
  // Word::merge_all.
  std::priority_queue<Candidate, std::vector<Candidate>, LaterCandidate> queue;
  const auto push_candidate = [&](int pos) {
    const int next = symbols[pos].next;
    if (next < 0) return;
    const auto it = merges_.find(pair_key(symbols[pos].id, symbols[next].id));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.new_id});
  };
  for (int i = 0; i + 1 < count; ++i) push_candidate(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.removed || left.next < 0) continue;
    const int right_pos = left.next;
    Symbol& right = symbols[right_pos];
    const auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;  // stale
    left.id = top.new_id;
    left.next = right.next;
    right.removed = true;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) push_candidate(left.prev);
    push_candidate(top.pos);
  }

  std::vector<int32_t> ids;
  for (const Symbol& s : symbols) {
    if (!s.removed) ids.push_back(s.id);
  }
  return ids;
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const auto id = token_to_id(word)) {
      ids->push_back(*id);
      return;
    }
  }
  const std::string key(word);
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto it = cache_.find(key);
    if (it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> merged = merge_word(word);
  ids->insert(ids->end(), merged.begin(), merged.end());
  if (word.size() < kMaxCachedWordBytes) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(key, std::move(merged));
  }
}

}  // namespace omni::models
