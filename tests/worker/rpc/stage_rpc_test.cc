// StageServer and RemoteStage over loopback, with the fake stage of fake_stage.h: outputs,
// streaming, in-band errors, cancellation, deadlines, auth, worker death, drain, concurrency,
// health, the unary RPCs and TLS.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "stage.grpc.pb.h"
#include "tests/worker/rpc/fake_stage.h"
#include "tests/worker/rpc/packet_tensors.h"
#include "worker/rpc/stage_client.h"
#include "worker/rpc/stage_server.h"
#include "worker/rpc/wire.h"

namespace omni::rpc {
namespace {

using pipeline::PacketQueue;
using pipeline::StageCall;
using pipeline::StageError;
using pipeline::StagePacket;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// What one run() gave: the packets, or the error.
struct Result {
  std::vector<StagePacket> packets;
  std::optional<StageError> error;
  std::string other_error;  // an exception that is not a StageError
};

Result run_remote(RemoteStage& stage, const StageCall& call, PacketQueue& input,
                  const pipeline::CancelToken& cancel,
                  const std::function<void(const StagePacket&)>& on_packet = nullptr) {
  Result result;
  try {
    stage.run(
        call, input,
        [&](StagePacket&& p) {
          if (on_packet) on_packet(p);
          result.packets.push_back(std::move(p));
        },
        cancel);
  } catch (const StageError& e) {
    result.error = e;
  } catch (const std::exception& e) {
    result.other_error = e.what();
  }
  return result;
}

Result run_remote(RemoteStage& stage, const std::string& params,
                  std::vector<StagePacket> inputs = {}) {
  StageCall call;
  call.request_id = "r";
  call.params = std::make_shared<const pipeline::JsonParams>(params);
  PacketQueue input;
  for (auto& p : inputs) input.push(std::move(p));
  input.close();
  pipeline::CancelToken cancel;
  return run_remote(stage, call, input, cancel);
}

// Runs f on another thread and fails the test (instead of hanging) when it takes over `limit`.
template <typename F>
auto bounded(F f, milliseconds limit) {
  auto future = std::async(std::launch::async, std::move(f));
  if (future.wait_for(limit) != std::future_status::ready) {
    ADD_FAILURE() << "did not finish within " << limit.count() << " ms";
    std::abort();  // a hung call cannot be joined: stop here with a clear message
  }
  return future.get();
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

class StageRpcTest : public ::testing::Test {
 protected:
  void SetUp() override { start(ServerOptions{}); }

  void start(const ServerOptions& options) {
    server_.reset();
    server_ = std::make_unique<StageServer>(stage_, 1, "fake", options);
    server_->start();
  }
  ClientOptions client_options() const {
    ClientOptions options;
    options.name = "stage 1 (remote fake)";
    return options;
  }
  RemoteStage client() const { return RemoteStage(server_->address(), client_options()); }

  testing::FakeStage stage_;
  std::unique_ptr<StageServer> server_;
};

TEST_F(StageRpcTest, TransformsPacketsAndMediaIncludingA10MBTensor) {
  RemoteStage remote = client();
  std::vector<StagePacket> inputs(3);
  inputs[0].tokens = {1, 2, 3};
  inputs[0].text = "a";
  testing::add_tensor(inputs[1], "big", at::randn({2621440}));  // 10 MiB each way
  testing::add_tensor(inputs[2], "ids", at::arange(5, at::kLong));
  testing::add_tensor(inputs[2], "half", at::randn({64}).to(at::kBFloat16));
  std::vector<StagePacket> expected_inputs;
  for (const auto& p : inputs) expected_inputs.push_back(p);

  StageCall call;
  call.params = std::make_shared<const pipeline::JsonParams>("add:1");
  call.media = {{"audio", "speech.wav", std::string(3000000, '\x07') + "end"},
                {"image", "cat.png", "\x89PNG"}};
  PacketQueue input;
  for (auto& p : inputs) input.push(std::move(p));
  input.close();
  pipeline::CancelToken cancel;
  const Result r = run_remote(remote, call, input, cancel);
  ASSERT_FALSE(r.error) << r.error->what();
  ASSERT_EQ(r.packets.size(), 2u + 3u + 1u);  // media, one per input, finished

  for (size_t i = 0; i < 2; ++i) {
    const at::Tensor bytes = r.packets[i].tensor("media:" + call.media[i].name);
    ASSERT_TRUE(bytes.defined());
    ASSERT_EQ(static_cast<size_t>(bytes.numel()), call.media[i].data.size());
    EXPECT_EQ(std::string(static_cast<const char*>(bytes.data_ptr()), bytes.numel()),
              call.media[i].data);
  }
  EXPECT_EQ(r.packets[2].tokens, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(r.packets[2].text, "a!");
  EXPECT_TRUE(at::equal(r.packets[3].tensor("big"), expected_inputs[1].tensor("big") + 1));
  EXPECT_TRUE(at::equal(r.packets[4].tensor("ids"), at::arange(1, 6, at::kLong)));
  EXPECT_TRUE(at::equal(r.packets[4].tensor("half"), expected_inputs[2].tensor("half") + 1));
  EXPECT_TRUE(r.packets.back().finished);
  EXPECT_EQ(r.packets.back().finish_reason, "stop");
  EXPECT_EQ(r.packets.back().metrics.at("inputs"), 3);
  EXPECT_EQ(stage_.last_deadline(), Clock::time_point::max());  // the call had none
}

TEST_F(StageRpcTest, StageStartsWhileTheUpstreamStillWrites) {
  RemoteStage remote = client();
  StageCall call;
  call.params = std::make_shared<const pipeline::JsonParams>("add:1");
  PacketQueue input;
  std::atomic<int64_t> first_output_ns{0}, last_push_ns{0};
  std::thread feeder([&] {
    for (int i = 0; i < 5; ++i) {
      std::this_thread::sleep_for(milliseconds(100));
      StagePacket p;
      p.tokens = {i};
      if (i == 4) last_push_ns = Clock::now().time_since_epoch().count();
      input.push(std::move(p));
    }
    input.close();
  });
  pipeline::CancelToken cancel;
  const Result r = run_remote(remote, call, input, cancel, [&](const StagePacket&) {
    if (first_output_ns == 0) first_output_ns = Clock::now().time_since_epoch().count();
  });
  feeder.join();
  ASSERT_FALSE(r.error) << r.error->what();
  ASSERT_EQ(r.packets.size(), 6u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(r.packets[i].tokens, (std::vector<int64_t>{i + 1}));
  EXPECT_LT(first_output_ns.load(), last_push_ns.load())
      << "the first output came only after the last input";
}

TEST_F(StageRpcTest, StageErrorsComeBackInBandAndTheServerKeepsServing) {
  RemoteStage remote = client();
  Result r = run_remote(remote, "invalid");
  ASSERT_TRUE(r.error);
  EXPECT_EQ(r.error->code(), StageError::Code::kInvalidArgument);
  EXPECT_EQ(r.error->stage(), "stage 1 (fake)");
  EXPECT_EQ(r.error->message(), "unknown speaker 'x'");

  r = run_remote(remote, "runtime");
  ASSERT_TRUE(r.error);
  EXPECT_EQ(r.error->code(), StageError::Code::kInternal);
  EXPECT_EQ(r.error->stage(), "stage 1 (fake)");
  EXPECT_TRUE(contains(r.error->message(), "model exploded")) << r.error->what();

  StagePacket p;
  p.tokens = {41};
  std::vector<StagePacket> inputs;
  inputs.push_back(p);
  r = run_remote(remote, "add:1", std::move(inputs));
  ASSERT_FALSE(r.error) << r.error->what();
  EXPECT_EQ(r.packets.at(0).tokens, (std::vector<int64_t>{42}));
  const std::string counters = server_->counters_json();
  EXPECT_TRUE(contains(counters, "\"requests_failed\": 2")) << counters;
  EXPECT_TRUE(contains(counters, "\"requests_completed\": 1")) << counters;
}

TEST_F(StageRpcTest, ClientCancellationReachesTheStageWithinASecond) {
  RemoteStage remote = client();
  StageCall call;
  call.params = std::make_shared<const pipeline::JsonParams>("loop");
  PacketQueue input;
  input.close();
  pipeline::CancelToken cancel;
  Clock::time_point cancelled_at;
  const Result r = bounded(
      [&] {
        return run_remote(remote, call, input, cancel, [&](const StagePacket&) {
          cancelled_at = Clock::now();
          cancel.cancel();
        });
      },
      milliseconds(5000));
  ASSERT_TRUE(r.error);
  EXPECT_EQ(r.error->code(), StageError::Code::kCancelled) << r.error->what();
  const auto deadline = Clock::now() + milliseconds(1000);
  while (!stage_.saw_cancel && Clock::now() < deadline)
    std::this_thread::sleep_for(milliseconds(5));
  ASSERT_TRUE(stage_.saw_cancel) << "the stage never saw the cancellation";
  EXPECT_LT(stage_.cancel_seen() - cancelled_at, milliseconds(1000));
}

TEST_F(StageRpcTest, DeadlineBecomesTheCallsAndEndsItInTime) {
  RemoteStage remote = client();
  StageCall call;
  call.params = std::make_shared<const pipeline::JsonParams>("sleep:5000");
  call.deadline = Clock::now() + milliseconds(300);
  PacketQueue input;
  input.close();
  pipeline::CancelToken cancel;
  const auto start = Clock::now();
  const Result r =
      bounded([&] { return run_remote(remote, call, input, cancel); }, milliseconds(5000));
  const auto took = Clock::now() - start;
  ASSERT_TRUE(r.error);
  EXPECT_EQ(r.error->code(), StageError::Code::kDeadlineExceeded) << r.error->what();
  EXPECT_EQ(r.error->stage(), "stage 1 (remote fake)");
  EXPECT_LT(took, milliseconds(1000));
  // The stage got the deadline, on its own steady clock, within a few ms of the client's.
  const auto seen = stage_.last_deadline();
  ASSERT_NE(seen, Clock::time_point::max());
  EXPECT_LT(std::chrono::abs(seen - call.deadline), milliseconds(50));
}

TEST_F(StageRpcTest, TokenIsRequiredExceptForHealth) {
  ServerOptions options;
  options.token = "s3cret";
  start(options);

  ClientOptions none = client_options();
  ClientOptions wrong = client_options();
  wrong.token = "guess";
  ClientOptions right = client_options();
  right.token = "s3cret";

  ::testing::internal::CaptureStderr();
  RemoteStage no_token(server_->address(), none);
  const Result r1 = run_remote(no_token, "add:1");
  RemoteStage wrong_token(server_->address(), wrong);
  const Result r2 = run_remote(wrong_token, "add:1");
  std::string stats_error;
  try {
    no_token.stats_json();
  } catch (const StageError& e) {
    stats_error = e.what();
  }
  const std::string log = ::testing::internal::GetCapturedStderr();

  for (const Result* r : {&r1, &r2}) {
    ASSERT_TRUE(r->error);
    EXPECT_EQ(r->error->code(), StageError::Code::kInvalidArgument);
    EXPECT_TRUE(contains(r->error->what(), "refused the token")) << r->error->what();
    EXPECT_EQ(r->error->stage(), "stage 1 (remote fake)");
  }
  EXPECT_TRUE(contains(stats_error, "refused the token")) << stats_error;
  EXPECT_TRUE(contains(log, "refused request from ipv4:127.0.0.1:")) << log;
  EXPECT_TRUE(contains(log, "missing token")) << log;
  EXPECT_TRUE(contains(log, "wrong token")) << log;

  RemoteStage good(server_->address(), right);
  const Result ok = run_remote(good, "add:1");
  ASSERT_FALSE(ok.error) << ok.error->what();
  EXPECT_TRUE(ok.packets.back().finished);
  std::string why;
  EXPECT_TRUE(wait_healthy(server_->address(), none, milliseconds(2000), &why)) << why;
  EXPECT_TRUE(contains(server_->counters_json(), "\"requests_refused\": 3"))
      << server_->counters_json();
}

TEST_F(StageRpcTest, WorkerShutDownMidStreamIsUnavailableNamingTheStage) {
  RemoteStage remote = client();
  StageCall call;
  call.params = std::make_shared<const pipeline::JsonParams>("loop");
  PacketQueue input;  // left open: the upstream is still "running"
  pipeline::CancelToken cancel;
  std::thread killer;
  const auto start = Clock::now();
  const Result r = bounded(
      [&] {
        return run_remote(remote, call, input, cancel, [&](const StagePacket&) {
          killer = std::thread([&] { server_->shutdown(milliseconds(0)); });
        });
      },
      milliseconds(5000));
  killer.join();
  ASSERT_TRUE(r.error) << r.other_error;
  EXPECT_EQ(r.error->code(), StageError::Code::kUnavailable) << r.error->what();
  EXPECT_TRUE(contains(r.error->what(), "stage 1")) << r.error->what();
  EXPECT_LT(Clock::now() - start, milliseconds(3000));

  // Nobody listens any more: a new request fails at once, also kUnavailable.
  ClientOptions quick = client_options();
  quick.connect_timeout = milliseconds(300);
  RemoteStage late(server_->address(), quick);
  const Result gone = bounded([&] { return run_remote(late, "add:1"); }, milliseconds(5000));
  ASSERT_TRUE(gone.error);
  EXPECT_EQ(gone.error->code(), StageError::Code::kUnavailable) << gone.error->what();
  EXPECT_TRUE(contains(gone.error->what(), server_->address())) << gone.error->what();
}

TEST_F(StageRpcTest, DrainLetsRunningRequestsFinishAndRefusesNewOnes) {
  RemoteStage remote = client();
  auto running = std::async(std::launch::async, [&] { return run_remote(remote, "sleep:300"); });
  while (stage_.runs_started == 0) std::this_thread::sleep_for(milliseconds(1));
  const auto start = Clock::now();
  auto drain = std::async(std::launch::async, [&] { server_->shutdown(milliseconds(2000)); });

  // Health turns NOT_SERVING as the drain begins (the drain runs on another thread: poll).
  std::string why;
  const auto limit = Clock::now() + milliseconds(1000);
  while (wait_healthy(server_->address(), {}, milliseconds(200), &why) && Clock::now() < limit) {
  }
  EXPECT_TRUE(contains(why, "NOT_SERVING")) << why;
  const Result refused = run_remote(remote, "add:1");
  ASSERT_TRUE(refused.error);
  EXPECT_EQ(refused.error->code(), StageError::Code::kUnavailable) << refused.error->what();

  const Result r = running.get();
  ASSERT_FALSE(r.error) << r.error->what();
  EXPECT_TRUE(r.packets.back().finished);
  drain.get();
  EXPECT_LT(Clock::now() - start, milliseconds(1500)) << "the drain waited for its full grace";
}

TEST_F(StageRpcTest, ConcurrentRequestsEachGetTheirOwnOutput) {
  RemoteStage remote = client();
  constexpr int kRequests = 32;
  std::vector<std::future<Result>> results;
  for (int i = 0; i < kRequests; ++i) {
    results.push_back(std::async(std::launch::async, [&remote, i] {
      StagePacket p;
      testing::add_tensor(p, "x", at::full({1000}, 10.0 * i));
      std::vector<StagePacket> inputs;
      inputs.push_back(std::move(p));
      return run_remote(remote, "add:" + std::to_string(i), std::move(inputs));
    }));
  }
  for (int i = 0; i < kRequests; ++i) {
    const Result r = results[i].get();
    ASSERT_FALSE(r.error) << i << ": " << r.error->what();
    ASSERT_EQ(r.packets.size(), 2u);
    EXPECT_TRUE(at::equal(r.packets[0].tensor("x"), at::full({1000}, 11.0 * i))) << i;
  }
}

// What a client other than RemoteStage could send: the server validates it and answers in-band.
TEST_F(StageRpcTest, ProtocolErrorsOfARawClientAreInvalidArgument) {
  const auto stub = proto::StageService::NewStub(make_channel(server_->address(), {}));
  const auto first_error = [&](const std::vector<proto::RunRequest>& requests) {
    grpc::ClientContext context;
    auto stream = stub->Run(&context);
    for (const auto& r : requests) stream->Write(r);
    stream->WritesDone();
    proto::RunResponse response;
    proto::StageError error;
    while (stream->Read(&response)) {
      if (response.has_error()) error = response.error();
    }
    EXPECT_TRUE(stream->Finish().ok());
    return error;
  };

  proto::RunRequest upstream;
  upstream.mutable_upstream()->set_text_delta("x");
  proto::StageError error = first_error({upstream});
  EXPECT_EQ(error.code(), proto::StageError::INVALID_ARGUMENT);
  EXPECT_TRUE(contains(error.message(), "header")) << error.message();

  proto::RunRequest header;
  header.mutable_header()->set_params_json("add:1");
  proto::RunRequest bad = upstream;
  proto::Tensor* t = bad.mutable_upstream()->add_tensors();
  t->set_name("rows");
  t->set_dtype("float32");
  t->add_shape(4);
  t->set_total_bytes(16);
  t->set_offset(8);  // a chunk without its start
  t->set_data(std::string(8, '\0'));
  error = first_error({header, bad});
  EXPECT_EQ(error.code(), proto::StageError::INVALID_ARGUMENT);
  EXPECT_TRUE(contains(error.message(), "tensor 'rows'")) << error.message();
  EXPECT_EQ(error.stage(), "stage 1 (fake)");
}

// Whole packets count too: a request whose upstream brings in more than the server's
// max_upstream_bytes fails naming the limit, however small each packet is (the stage may keep
// all of them); the next request starts from nothing again.
TEST_F(StageRpcTest, UpstreamPacketsOfARequestStopAtTheServersLimit) {
  ServerOptions options;
  options.max_upstream_bytes = 1 << 20;
  start(options);
  RemoteStage remote = client();
  std::vector<StagePacket> inputs(200);
  for (auto& p : inputs) testing::add_tensor(p, "rows", at::zeros({2560}));  // 10 KiB each
  const Result r = run_remote(remote, "add:1", inputs);
  ASSERT_TRUE(r.error) << "200 packets of 10 KiB passed a 1 MiB limit";
  EXPECT_EQ(r.error->code(), StageError::Code::kInvalidArgument) << r.error->what();
  EXPECT_TRUE(contains(r.error->what(), "limit of 1048576 bytes for all upstream packets"))
      << r.error->what();
  EXPECT_EQ(r.error->stage(), "stage 1 (fake)");
  EXPECT_LT(r.packets.size(), 100u);  // the fake stage answered the packets before the limit

  inputs.resize(50);
  const Result ok = run_remote(remote, "add:1", inputs);
  ASSERT_FALSE(ok.error) << ok.error->what();
  EXPECT_EQ(ok.packets.size(), 51u);
}

TEST_F(StageRpcTest, WaitHealthy) {
  std::string why;
  EXPECT_TRUE(wait_healthy(server_->address(), {}, milliseconds(2000), &why)) << why;
  const auto start = Clock::now();
  EXPECT_FALSE(wait_healthy("127.0.0.1:1", {}, milliseconds(300), &why));
  EXPECT_LT(Clock::now() - start, milliseconds(2000));
  EXPECT_TRUE(contains(why, "127.0.0.1:1")) << why;
  EXPECT_TRUE(contains(why, "UNAVAILABLE")) << why;
}

TEST_F(StageRpcTest, StatsInfoAndDevice) {
  RemoteStage remote = client();
  const std::string stats = remote.stats_json();
  // The stage's figures as an in-process stage gives them, the worker's counters beside them.
  const auto j = nlohmann::json::parse(stats);
  EXPECT_EQ(j.value("fake", 0), 1) << stats;
  EXPECT_TRUE(j["worker"].contains("requests_started")) << stats;
  const WorkerInfo info = remote.worker_info();
  EXPECT_EQ(info.stage, "stage 1 (fake)");
  EXPECT_EQ(info.stage_id, 1);
  EXPECT_EQ(info.model_stage, "fake");
  EXPECT_EQ(info.pid, ::getpid());
  // The info crosses the wire as JSON and reads back field by field.
  const pipeline::StageInfo got = remote.info();
  EXPECT_EQ(got.model_stage, "fake");
  EXPECT_EQ(got.param_bytes, 1000u);
  EXPECT_EQ(got.device_weight_bytes, 0u);
  EXPECT_EQ(got.voices, (std::vector<std::string>{"ethan", "chelsie"}));
  EXPECT_EQ(got.audio_sample_rate, 24000);
  EXPECT_EQ(got.family_json, R"({"codes_per_frame":16})");
  // A worker from before device_weight_bytes: the ledger counts its param_bytes.
  EXPECT_EQ(info_from_json(R"({"param_bytes": 7})").device_weight_bytes, 7u);
  EXPECT_THROW(info_from_json("[1]"), pipeline::StageError);
  EXPECT_THROW(info_from_json(R"({"voices": 3})"), pipeline::StageError);
  EXPECT_EQ(remote.device_bytes(), 1000u);
  EXPECT_EQ(remote.set_device_released(true), 1000u);
  EXPECT_EQ(remote.device_bytes(), 0u);  // the query moved nothing back
  EXPECT_EQ(remote.set_device_released(false), 1000u);
  EXPECT_EQ(remote.device_bytes(), 1000u);
}

TEST_F(StageRpcTest, Tls) {
  if (std::system("command -v openssl >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "no openssl command to make a self-signed certificate";
  }
  char dir_template[] = "/tmp/omni_rpc_tls_XXXXXX";
  const std::string dir = ::mkdtemp(dir_template);
  const std::string cert = dir + "/cert.pem", key = dir + "/key.pem";
  const std::string command =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost -addext "
      "'subjectAltName=DNS:localhost,IP:127.0.0.1' -keyout " +
      key + " -out " + cert + " >/dev/null 2>&1";
  if (std::system(command.c_str()) != 0) {
    GTEST_SKIP() << "openssl could not make a self-signed certificate: " << command;
  }
  ServerOptions options;
  options.tls_cert_file = cert;
  options.tls_key_file = key;
  start(options);

  ClientOptions tls = client_options();
  tls.tls_ca_file = cert;
  RemoteStage secure(server_->address(), tls);
  const Result ok = run_remote(secure, "add:1");
  ASSERT_FALSE(ok.error) << ok.error->what();
  EXPECT_TRUE(ok.packets.back().finished);
  std::string why;
  EXPECT_TRUE(wait_healthy(server_->address(), tls, milliseconds(2000), &why)) << why;

  ClientOptions plain = client_options();  // no TLS against a TLS server
  plain.connect_timeout = milliseconds(300);
  RemoteStage insecure(server_->address(), plain);
  const Result bad = bounded([&] { return run_remote(insecure, "add:1"); }, milliseconds(5000));
  ASSERT_TRUE(bad.error);
  EXPECT_EQ(bad.error->code(), StageError::Code::kUnavailable) << bad.error->what();
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace omni::rpc
