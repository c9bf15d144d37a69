// Fixtures for the weight-loading tests: a fresh directory per test, raw safetensors bytes
// (to build files our writer refuses to produce), error-text checks and peak memory.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "cpu_offload/check.h"

namespace omni::models::testing {

// A directory under ::testing::TempDir() named after the process and the test, created empty
// and removed afterwards, so fixtures of one test (or an earlier run) never leak into another.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string("omni_weights_") + std::to_string(::getpid()) + "_" +
                       info->test_suite_name() + "_" + info->name();
    for (char& c : name) {
      if (c == '/') c = '_';  // parameterized test names contain '/'
    }
    dir_ = std::filesystem::path(::testing::TempDir()) / name;
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string dir() const { return dir_.string(); }

 private:
  std::filesystem::path dir_;
};

// A field of /proc/self/status in bytes ("VmRSS", "VmHWM").
inline size_t status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1)) * 1024;
  }
  return 0;
}

// Growth of the peak resident set while `fn` runs; nullopt where /proc/self/clear_refs cannot
// reset the peak (it needs Linux >= 4.0 and the right to write it).
template <typename Fn>
std::optional<size_t> peak_rss_growth(Fn&& fn) {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  if (!clear.good()) return std::nullopt;
  const size_t before = status_bytes("VmRSS");
  fn();
  const size_t peak = status_bytes("VmHWM");
  return peak > before ? peak - before : 0;
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// 8-byte little-endian `header_size` (the header's real size unless given), the header, then
// `data_size` bytes counting up from 0.
inline void write_raw_safetensors(const std::string& path, const std::string& header,
                                  size_t data_size, int64_t header_size = -1) {
  const uint64_t n = header_size < 0 ? header.size() : static_cast<uint64_t>(header_size);
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  bytes += header;
  for (size_t i = 0; i < data_size; ++i) bytes.push_back(static_cast<char>(i & 0xff));
  write_bytes(path, bytes);
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The message of the omni::Error `f` throws; a test failure (and "") if it throws none.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const omni::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an omni::Error";
  return "";
}

}  // namespace omni::models::testing

#define EXPECT_CONTAINS(text, part)                          \
  EXPECT_NE(std::string(text).find(part), std::string::npos) \
      << "expected to find \"" << (part) << "\" in \"" << (text) << "\""
