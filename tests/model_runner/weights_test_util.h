// Fixtures for the weight-loading tests: a fresh directory per test, raw safetensors bytes
// (to build files our writer refuses to produce) and error-text checks.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
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
