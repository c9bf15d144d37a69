// OpenAI's `stop`: the answer ends at the first of some strings, which is not part of it. The
// text streams, so a piece that could still grow into a stop string ("Hel" for "Hello") is
// held back until it cannot; text is released only in whole characters (a stop string starts
// at a character, so a held-back suffix does too).
#pragma once

#include <string>
#include <vector>

namespace omni::pipeline {

class StopStringCutter {
 public:
  explicit StopStringCutter(std::vector<std::string> stops);

  // The text that can be released once `piece` is appended. After a stop string appeared it
  // ends just before it, stopped() is true and later pieces release nothing.
  std::string push(const std::string& piece);
  // What is still held back, at the end of the answer (nothing after a stop).
  std::string finish();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace omni::pipeline
