// Responses, streamed chunks, server-sent events and error bodies, parsed back as a client would.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>

#include "worker/http/api_error.h"
#include "worker/http/openai_protocol.h"

namespace omni::http {
namespace {

using nlohmann::json;

AudioOutput audio_output() {
  AudioOutput a;
  a.id = "audio-1";
  a.wav_base64 = "UklGRg==";
  a.expires_at = 1700003600;
  a.transcript = "Hello there.";
  return a;
}

TEST(CompletionJson, TextAndAudioAreTwoChoices) {
  const json r =
      json::parse(completion_json("chatcmpl-1", "qwen3-omni", 1700000000,
                                  std::string("Hello there."), audio_output(), "stop", {12, 5}));
  EXPECT_EQ(r["id"], "chatcmpl-1");
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["created"], 1700000000);
  EXPECT_EQ(r["model"], "qwen3-omni");
  ASSERT_EQ(r["choices"].size(), 2u);
  const json& text = r["choices"][0];
  EXPECT_EQ(text["index"], 0);
  EXPECT_EQ(text["message"]["role"], "assistant");
  EXPECT_EQ(text["message"]["content"], "Hello there.");
  EXPECT_FALSE(text["message"].contains("audio"));
  EXPECT_EQ(text["finish_reason"], "stop");
  EXPECT_TRUE(text["logprobs"].is_null());
  const json& audio = r["choices"][1];
  EXPECT_EQ(audio["index"], 1);
  EXPECT_EQ(audio["message"]["role"], "assistant");
  EXPECT_TRUE(audio["message"]["content"].is_null());
  EXPECT_EQ(audio["message"]["audio"]["id"], "audio-1");
  EXPECT_EQ(audio["message"]["audio"]["data"], "UklGRg==");
  EXPECT_EQ(audio["message"]["audio"]["expires_at"], 1700003600);
  EXPECT_EQ(audio["message"]["audio"]["transcript"], "Hello there.");
  EXPECT_EQ(audio["finish_reason"], "stop");
  EXPECT_EQ(r["usage"]["prompt_tokens"], 12);
  EXPECT_EQ(r["usage"]["completion_tokens"], 5);
  EXPECT_EQ(r["usage"]["total_tokens"], 17);
}

TEST(CompletionJson, AudioOnlyIsChoiceZero) {
  const json r =
      json::parse(completion_json("c", "m", 1, std::nullopt, audio_output(), "length", {1, 2}));
  ASSERT_EQ(r["choices"].size(), 1u);
  EXPECT_EQ(r["choices"][0]["index"], 0);
  EXPECT_EQ(r["choices"][0]["message"]["audio"]["transcript"], "Hello there.");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
}

TEST(CompletionJson, TextOnlyAndNoFinishReason) {
  const json r = json::parse(completion_json("c", "m", 1, std::string("hi"), std::nullopt, "", {}));
  ASSERT_EQ(r["choices"].size(), 1u);
  EXPECT_EQ(r["choices"][0]["message"]["content"], "hi");
  EXPECT_TRUE(r["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(r["usage"]["total_tokens"], 0);
}

TEST(CompletionJson, InvalidUtf8IsReplaced) {
  const std::string out =
      completion_json("c", "m", 1, std::string("caf\xC3"), std::nullopt, "stop", {});
  const json r = json::parse(out);
  EXPECT_EQ(r["choices"][0]["message"]["content"], "caf\xEF\xBF\xBD");  // U+FFFD
}

TEST(ChunkJson, FirstMiddleAndLast) {
  const json first = json::parse(chunk_json("c", "m", 7, "text", "He", true, std::nullopt));
  EXPECT_EQ(first["id"], "c");
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["created"], 7);
  EXPECT_EQ(first["model"], "m");
  EXPECT_EQ(first["modality"], "text");
  ASSERT_EQ(first["choices"].size(), 1u);
  EXPECT_EQ(first["choices"][0]["index"], 0);
  EXPECT_EQ(first["choices"][0]["delta"], (json{{"role", "assistant"}, {"content", "He"}}));
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(first.contains("usage"));

  const json audio = json::parse(chunk_json("c", "m", 7, "audio", "UklGRg==", false, std::nullopt));
  EXPECT_EQ(audio["modality"], "audio");
  EXPECT_EQ(audio["choices"][0]["delta"], (json{{"content", "UklGRg=="}}));

  const json last = json::parse(chunk_json("c", "m", 7, "text", "", false, std::string("stop")));
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");

  // A reply whose only chunk is its end still says who speaks.
  const json only = json::parse(chunk_json("c", "m", 7, "text", "", true, std::string("stop")));
  EXPECT_EQ(only["choices"][0]["delta"], (json{{"role", "assistant"}, {"content", ""}}));
}

TEST(ChunkJson, UsageChunkHasNoChoices) {
  const json u = json::parse(usage_chunk_json("c", "m", 7, {3, 4}));
  EXPECT_EQ(u["object"], "chat.completion.chunk");
  EXPECT_EQ(u["choices"], json::array());
  EXPECT_EQ(u["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(u["usage"]["completion_tokens"], 4);
  EXPECT_EQ(u["usage"]["total_tokens"], 7);
}

TEST(Sse, EventsAreOneLineEach) {
  const std::string chunk = chunk_json("c", "m", 7, "text", "line 1\nline 2", true, std::nullopt);
  const std::string event = sse_event(chunk);
  EXPECT_EQ(event.rfind("data: ", 0), 0u);
  EXPECT_EQ(event.substr(event.size() - 2), "\n\n");
  EXPECT_EQ(event.find('\n'), event.size() - 2);  // the text's newline is escaped
  EXPECT_EQ(json::parse(event.substr(6))["choices"][0]["delta"]["content"], "line 1\nline 2");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
}

TEST(ApiErrorJson, OpenAiShape) {
  const json e = json::parse(bad_request("bad", "messages[0]", "invalid_value").json());
  EXPECT_EQ(e, (json{{"error",
                      {{"message", "bad"},
                       {"type", "invalid_request_error"},
                       {"param", "messages[0]"},
                       {"code", "invalid_value"}}}}));
  const json s = json::parse(server_error("boom \xFF").json());
  EXPECT_TRUE(s["error"]["param"].is_null());
  EXPECT_TRUE(s["error"]["code"].is_null());
  EXPECT_EQ(s["error"]["type"], "server_error");
  EXPECT_EQ(s["error"]["message"], "boom \xEF\xBF\xBD");
  EXPECT_EQ(server_error("x").status, 500);
  EXPECT_EQ(unauthorized("x").status, 401);
  EXPECT_EQ(unauthorized("x").type, "authentication_error");
  EXPECT_EQ(model_not_found("x").status, 404);
  EXPECT_EQ(model_not_found("x").code, "model_not_found");
  EXPECT_EQ(model_not_found("x").param, "model");
  EXPECT_EQ(rate_limited("x").status, 429);
  EXPECT_EQ(rate_limited("x").type, "rate_limit_error");
  EXPECT_EQ(request_too_large("x").status, 413);
  const ApiException ex(bad_request("why"));
  EXPECT_STREQ(ex.what(), "why");
  EXPECT_EQ(ex.error().status, 400);
}

}  // namespace
}  // namespace omni::http
