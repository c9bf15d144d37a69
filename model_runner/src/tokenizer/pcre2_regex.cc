#include "pcre2_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>

#include "cpu_offload/check.h"
#include "utf8.h"

namespace omni::models {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(code, buffer, sizeof(buffer));
  return n < 0 ? "PCRE2 error " + std::to_string(code) : reinterpret_cast<const char*>(buffer);
}

pcre2_code* as_code(void* p) { return static_cast<pcre2_code*>(p); }

struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

}  // namespace

Pcre2Regex::Pcre2Regex(const std::string& pattern, Syntax syntax, std::string what)
    : code_(nullptr), what_(std::move(what)) {
  uint32_t options = PCRE2_UTF | PCRE2_UCP;
  if (syntax == Syntax::kLiteral) options |= PCRE2_LITERAL;
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                        &error, &offset, nullptr);
  if (code_ == nullptr) {
    OMNI_THROW(what_, ": PCRE2 cannot compile it: ", pcre2_message(error), " (at offset ", offset,
               " of /", pattern, "/)");
  }
  // Without a JIT (an unsupported CPU, or PCRE2 built without it) the interpreter does the same.
  jit_ = pcre2_jit_compile(as_code(code_), PCRE2_JIT_COMPLETE) == 0;
}

Pcre2Regex::~Pcre2Regex() { pcre2_code_free(as_code(code_)); }

bool Pcre2Regex::search(std::string_view text, size_t start, void* match_data, size_t* begin,
                        size_t* end) const {
  auto* md = static_cast<pcre2_match_data*>(match_data);
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // The caller validated the text once; PCRE2 need not check it again at every start.
  int rc =
      pcre2_match(as_code(code_), subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
    // The JIT's 32 KiB stack is too small for this text: the interpreter keeps its
    // backtracking on the heap.
    rc = pcre2_match(as_code(code_), subject, text.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                     md, nullptr);
  }
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    OMNI_THROW(what_, ": regex match failed on a text of ", text.size(),
               " bytes: ", pcre2_message(rc));
  }
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(md);
  OMNI_CHECK(ovector[0] <= ovector[1], what_, ": \\K in a pre-tokenizer regex is not supported");
  *begin = ovector[0];
  *end = ovector[1];
  return true;
}

void Pcre2Regex::for_each_match(std::string_view text,
                                const std::function<void(size_t, size_t)>& fn) const {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(
      pcre2_match_data_create_from_pattern(as_code(code_), nullptr));
  OMNI_CHECK(md != nullptr, what_, ": out of memory for regex match data");
  size_t start = 0;
  size_t last_end = std::string_view::npos;
  while (start <= text.size()) {
    size_t begin, end;
    if (!search(text, start, md.get(), &begin, &end)) break;
    if (begin == end && end == last_end) {
      if (start == text.size()) break;
      start += utf8::char_length(text, start);
      continue;
    }
    fn(begin, end);
    start = end;
    last_end = end;
  }
}

std::vector<std::pair<size_t, size_t>> Pcre2Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  for_each_match(text, [&](size_t begin, size_t end) { matches.emplace_back(begin, end); });
  return matches;
}

}  // namespace omni::models
