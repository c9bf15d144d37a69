// The HTTP front end (worker/http/chat_server.h) under clients at once, in this process: the
// server's threads, its running-request slots, streams, cancellation and metrics together:
// plain and streamed requests from several threads get the same greedy answer, clients that
// leave mid-stream free their slot, and /health and /metrics answer meanwhile.
//
// The pipeline is the tiny Qwen3-Omni checkpoint's stages in this process.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "worker/http/chat_server.h"
#include "worker/http/stage_errors.h"
#include "worker/pipeline/local_stages.h"
#include "worker/pipeline/pipeline.h"

namespace omni::http {
namespace {

using Json = nlohmann::json;

const std::string kDir = std::string(OMNI_FIXTURES_DIR) + "/qwen3_omni_tiny";

std::shared_ptr<pipeline::Stage> local(const std::string& model_stage, int id) {
  pipeline::LocalStageOptions o;
  o.name = "stage " + std::to_string(id) + " (" + model_stage + ")";
  o.model_stage = model_stage;
  o.model_dir = kDir;
  return pipeline::make_local_stage(o);
}

std::string body(bool stream, bool speech) {
  Json b = {{"model", "tiny"},
            {"messages", Json::array({{{"role", "user"}, {"content", "Describe the sound."}}})},
            {"modalities", speech ? Json::array({"text", "audio"}) : Json::array({"text"})},
            {"temperature", 0},
            {"max_tokens", 6},
            {"max_audio_frames", 4},
            {"stream", stream}};
  return b.dump();
}

// The text of a streamed answer: its text deltas joined.
std::string streamed_text(const std::string& sse) {
  std::string text;
  size_t pos = 0;
  while ((pos = sse.find("data: ", pos)) != std::string::npos) {
    const size_t end = sse.find("\n\n", pos);
    const std::string data = sse.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]") break;
    const Json chunk = Json::parse(data);
    if (chunk.value("modality", "") != "text") continue;
    const auto& delta = chunk["choices"][0]["delta"];
    if (delta.contains("content") && delta["content"].is_string()) {
      text += delta["content"].get<std::string>();
    }
  }
  return text;
}

TEST(ChatServerConcurrency, ClientsAtOnceGetTheirAnswersAndLeavingOnesFreeTheirSlots) {
  pipeline::Pipeline pipeline({{0, "thinker", {}, local("thinker", 0)},
                               {1, "talker", {0}, local("talker", 1)},
                               {2, "code2wav", {1}, local("code2wav", 2)}});
  ServerOptions o;
  o.port = 0;
  o.model_name = "tiny";
  o.max_concurrent_requests = 8;  // every client below gets in
  ChatServer server(pipeline, o);
  server.start();
  const int port = server.port();
  const auto client = [port] {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port);
    c->set_read_timeout(300, 0);
    return c;
  };

  const auto first = client()->Post("/v1/chat/completions", body(false, false), "application/json");
  ASSERT_TRUE(first);
  ASSERT_EQ(first->status, 200) << first->body;
  const std::string answer =
      Json::parse(first->body)["choices"][0]["message"]["content"].get<std::string>();
  ASSERT_FALSE(answer.empty());

  std::atomic<bool> done{false};
  std::atomic<int> health_failures{0}, metrics_reads{0};
  std::thread watcher([&] {
    auto c = client();
    while (!done) {
      const auto h = c->Get("/health");
      if (!h || h->status != 200) ++health_failures;
      const auto m = c->Get("/metrics");
      if (m && m->status == 200) ++metrics_reads;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  std::vector<std::string> texts(6);
  std::vector<std::thread> clients;
  for (int i = 0; i < 6; ++i) {
    clients.emplace_back([&, i] {
      auto c = client();
      if (i % 3 == 0) {  // a streamed answer, read to the end
        const auto r = c->Post("/v1/chat/completions", body(true, i == 0), "application/json");
        if (r && r->status == 200) texts[i] = streamed_text(r->body);
      } else if (i % 3 == 1) {
        const auto r = c->Post("/v1/chat/completions", body(false, false), "application/json");
        if (r && r->status == 200) {
          texts[i] = Json::parse(r->body)["choices"][0]["message"]["content"].get<std::string>();
        }
      } else {  // leaves after the first streamed piece
        httplib::Request req;
        req.method = "POST";
        req.path = "/v1/chat/completions";
        req.body = body(true, true);
        req.set_header("Content-Type", "application/json");
        req.content_receiver = [](const char*, size_t, uint64_t, uint64_t) { return false; };
        c->send(req);
        texts[i] = answer;  // nothing to compare
      }
    });
  }
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(texts[i], answer) << "client " << i;

  // The leaving clients' requests wind down and free their slots (the running gauge reaches
  // 0); then as many requests at once as allowed all get in.
  const auto running = [&] {
    const auto m = client()->Get("/metrics");
    const std::string key = "\nomni_requests_running ";
    const size_t at = m ? m->body.find(key) : std::string::npos;
    return at == std::string::npos ? -1 : std::stoi(m->body.substr(at + key.size()));
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (running() != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(running(), 0);
  std::vector<std::thread> again;
  std::atomic<int> ok{0};
  for (int i = 0; i < o.max_concurrent_requests; ++i) {
    again.emplace_back([&] {
      const auto r = client()->Post("/v1/chat/completions", body(false, false), "application/json");
      if (r && r->status == 200) ++ok;
    });
  }
  for (auto& t : again) t.join();
  EXPECT_EQ(ok, o.max_concurrent_requests);
  done = true;
  watcher.join();
  EXPECT_EQ(health_failures, 0);
  EXPECT_GT(metrics_reads, 0);
  server.stop();
}

// What a client sees of each stage failure: the status an OpenAI client acts on (it retries 429
// and 503 with backoff), never an internal message.
TEST(StageErrorStatus, EachStageErrorCodeHasItsHttpStatus) {
  using Code = pipeline::StageError::Code;
  const std::vector<std::pair<Code, int>> expected = {{Code::kInvalidArgument, 400},
                                                      {Code::kDeadlineExceeded, 504},
                                                      {Code::kResourceExhausted, 429},
                                                      {Code::kUnavailable, 503},
                                                      {Code::kInternal, 500}};
  for (const auto& [code, status] : expected) {
    const ApiError a = stage_error(pipeline::StageError(code, "stage 0 (thinker)", "at capacity"));
    EXPECT_EQ(a.status, status) << static_cast<int>(code);
    EXPECT_NE(a.message.find("error id"), std::string::npos) << a.message;
  }
  EXPECT_EQ(stage_error(pipeline::StageError(Code::kResourceExhausted, "", "full")).type,
            "rate_limit_error");
}

}  // namespace
}  // namespace omni::http
