// Tokens, TLS files and the listen rule, without a request.
#include "worker/rpc/auth.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "cpu_offload/logging.h"
#include "tests/worker/rpc/fake_stage.h"
#include "worker/rpc/stage_server.h"

namespace omni::rpc {
namespace {

std::string temp_file(const std::string& content) {
  char path[] = "/tmp/omni_rpc_auth_XXXXXX";
  const int fd = ::mkstemp(path);
  EXPECT_GE(fd, 0);
  ::close(fd);
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(AuthTest, TokenFileIsReadWithoutTrailingWhitespace) {
  const std::string path = temp_file("s3cret \t\n\n");
  EXPECT_EQ(read_token_file(path), "s3cret");
  std::remove(path.c_str());
}

TEST(AuthTest, EmptyOrMissingTokenFileIsAnErrorNamingTheFile) {
  const std::string path = temp_file(" \n");
  const std::string empty = error_of([&] { read_token_file(path); });
  EXPECT_NE(empty.find(path), std::string::npos) << empty;
  EXPECT_NE(empty.find("empty"), std::string::npos) << empty;
  std::remove(path.c_str());
  const std::string missing = error_of([] { read_token_file("/nonexistent/token"); });
  EXPECT_NE(missing.find("/nonexistent/token"), std::string::npos) << missing;
}

TEST(AuthTest, TlsFilesErrorsNameTheFile) {
  const std::string bad = temp_file("not a certificate");
  std::string error = error_of([&] { server_credentials(bad, bad); });
  EXPECT_NE(error.find(bad), std::string::npos) << error;
  error = error_of([] { channel_credentials("/nonexistent/ca.pem"); });
  EXPECT_NE(error.find("/nonexistent/ca.pem"), std::string::npos) << error;
  error = error_of([&] { server_credentials(bad, ""); });
  EXPECT_NE(error.find("--tls-key"), std::string::npos) << error;
  std::remove(bad.c_str());
}

TEST(AuthTest, ConstantTimeEqual) {
  EXPECT_TRUE(constant_time_equal("abc", "abc"));
  EXPECT_FALSE(constant_time_equal("abc", "abd"));
  EXPECT_FALSE(constant_time_equal("abc", "abcd"));
  EXPECT_FALSE(constant_time_equal("abcd", "abc"));
  EXPECT_FALSE(constant_time_equal("abc", ""));
  EXPECT_TRUE(constant_time_equal("", ""));
}

TEST(AuthTest, RandomTokensAre256BitsOfHexAndDiffer) {
  const std::string a = random_token(), b = random_token();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos) << a;
  EXPECT_NE(a, b);
}

TEST(AuthTest, LoopbackAddresses) {
  for (const char* a : {"127.0.0.1:0", "127.1.2.3:50051", "localhost:1", "[::1]:0", "::1",
                        "unix:/tmp/worker.sock", "ipv4:127.0.0.1:5"}) {
    EXPECT_TRUE(is_loopback_address(a)) << a;
  }
  for (const char* a : {"0.0.0.0:0", "[::]:0", "10.0.0.5:50051", "example.com:1",
                        "127.example.com:1", "[2001:db8::1]:80"}) {
    EXPECT_FALSE(is_loopback_address(a)) << a;
  }
}

TEST(AuthTest, NonLoopbackListenerNeedsTlsOrToken) {
  testing::FakeStage stage;
  ServerOptions open;
  open.listen_address = "0.0.0.0:0";
  const std::string error = error_of([&] { StageServer server(stage, 1, "fake", open); });
  EXPECT_NE(error.find("0.0.0.0:0"), std::string::npos) << error;
  EXPECT_NE(error.find("without TLS or a token"), std::string::npos) << error;
  EXPECT_THROW(StageServer(stage, 1, "fake", open), std::invalid_argument);

  ServerOptions with_token = open;
  with_token.token = "s3cret";
  StageServer server(stage, 1, "fake", with_token);
  ASSERT_NO_THROW(server.start());
  EXPECT_GT(server.port(), 0);

  ServerOptions allowed = open;
  allowed.allow_insecure_nonloopback = true;
  EXPECT_NO_THROW(StageServer(stage, 1, "fake", allowed));
}

}  // namespace
// A client retrying a wrong token in a loop gets `burst` lines a window; the rest are counted
// and the count is written when the next window opens.
TEST(AuthTest, RefusedCallsAreLoggedAtABoundedRate) {
  RateLimitedLog log(LogLevel::kWarning, std::chrono::milliseconds(300), 3);
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 50; ++i) log.write("refused request from ipv4:10.0.0.9:1: wrong token");
  std::string text = ::testing::internal::GetCapturedStderr();
  const auto lines = [](const std::string& t, const std::string& what) {
    size_t n = 0;
    for (size_t at = t.find(what); at != std::string::npos; at = t.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(lines(text, "refused request from ipv4:10.0.0.9:1: wrong token"), 3u) << text;
  std::this_thread::sleep_for(std::chrono::milliseconds(350));
  ::testing::internal::CaptureStderr();
  log.write("refused request from ipv4:10.0.0.9:1: missing token");
  text = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(text.find("47 more lines of this kind were left out"), std::string::npos) << text;
  EXPECT_EQ(lines(text, "refused request from ipv4:10.0.0.9:1: missing token"), 1u) << text;
}

}  // namespace omni::rpc
