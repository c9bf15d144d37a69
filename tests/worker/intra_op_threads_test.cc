// vllm-omni's LibTorch intra-op threads: one unless OMP_NUM_THREADS is set, and then untouched.
#include "worker/cli/intra_op_threads.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

namespace {

// Restores OMP_NUM_THREADS and LibTorch's thread count when a test ends.
class IntraOpThreads : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* v = std::getenv("OMP_NUM_THREADS")) saved_env_ = v;
    saved_threads_ = at::get_num_threads();
  }
  void TearDown() override {
    if (saved_env_) {
      setenv("OMP_NUM_THREADS", saved_env_->c_str(), 1);
    } else {
      unsetenv("OMP_NUM_THREADS");
    }
    at::set_num_threads(saved_threads_);
  }
  std::optional<std::string> saved_env_;
  int saved_threads_ = 1;
};

TEST_F(IntraOpThreads, OneWhenTheEnvironmentSaysNothing) {
  at::set_num_threads(2);
  unsetenv("OMP_NUM_THREADS");
  EXPECT_EQ(omni::cli::default_intra_op_threads(), 1);
  EXPECT_EQ(at::get_num_threads(), 1);
}

TEST_F(IntraOpThreads, OmpNumThreadsIsLeftToDecide) {
  at::set_num_threads(2);
  setenv("OMP_NUM_THREADS", "2", 1);
  EXPECT_EQ(omni::cli::default_intra_op_threads(), 2);
  EXPECT_EQ(at::get_num_threads(), 2);
}

}  // namespace
