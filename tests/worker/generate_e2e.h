// What the end-to-end tests of `vllm-omni generate` on diffusion models share: a private temp
// folder per test, and running the command with --json to read back its one JSON line.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "process.h"

namespace omni::cli {

class GenerateE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("vllm_omni_e2e_" + std::to_string(::getpid()) + "_" + info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // `generate` with `args` (and --json); the JSON it prints, null after a failure.
  static nlohmann::json generate_json(const std::vector<std::string>& args) {
    std::vector<std::string> command = {OMNI_VLLM_OMNI, "generate"};
    command.insert(command.end(), args.begin(), args.end());
    command.push_back("--json");
    const process::ProcessResult r = process::run_process(command);
    EXPECT_EQ(r.status, 0) << r.err;
    if (r.status != 0) return nlohmann::json();
    EXPECT_EQ(process::count_lines(r.out), 1u) << r.out;
    return nlohmann::json::parse(r.out);
  }

 private:
  std::filesystem::path dir_;
};

}  // namespace omni::cli
