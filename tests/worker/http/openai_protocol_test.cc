// parse_chat_completion on valid requests, and its robustness: deep JSON, huge numbers, random
// bytes, and mutations of a valid body never end in anything but ApiException.
#include "worker/http/openai_protocol.h"

#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>

#include "tests/worker/http/protocol_test_util.h"

namespace omni::http {
namespace {

using testing::json;

TEST(ParseChatCompletion, MinimalRequestGetsTheDefaults) {
  const auto r = parse_chat_completion(testing::minimal_request().dump());
  EXPECT_EQ(r.model, "qwen3-omni");
  EXPECT_EQ(text_of(r.parts), "Hello");
  EXPECT_EQ(r.system_prompt, "");
  EXPECT_TRUE(r.audio.empty());
  EXPECT_TRUE(r.images.empty());
  EXPECT_EQ(r.modalities, (std::vector<std::string>{"text", "audio"}));
  EXPECT_FALSE(r.modalities_given);
  EXPECT_EQ(r.speaker, "");
  EXPECT_EQ(r.audio_format, "wav");
  EXPECT_FALSE(r.temperature || r.top_p || r.repetition_penalty || r.top_k || r.max_tokens ||
               r.seed);
  EXPECT_TRUE(r.stop.empty());
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.include_usage);
}

// A conversation: the system prompt, then every earlier turn in order (a later system message
// is a turn of its own), the last user turn's parts to answer, every user turn's media in one
// list, each turn's parts in their order; text parts join with nothing between, as the chat
// template joins them.
TEST(ParseChatCompletion, MultiTurnConversation) {
  const std::string wav64 = base64_encode(testing::wav_file());
  const json audio = {{"type", "input_audio"},
                      {"input_audio", {{"data", wav64}, {"format", "wav"}}}};
  const json body = {
      {"model", "qwen3-omni"},
      {"messages",
       {{{"role", "system"}, {"content", "You are Qwen."}},
        {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "What is this?"}}, audio}}},
        {{"role", "assistant"}, {"content", "A dog barking."}},
        {{"role", "developer"}, {"content", "Answer in French."}},
        {{"role", "assistant"},
         {"content",
          {{{"type", "text"}, {"text", "D'accord."}}, {{"type", "text"}, {"text", "!"}}}}},
        {{"role", "user"}, {"content", {audio, {{"type", "text"}, {"text", "And this?"}}}}}}}};
  const auto r = parse_chat_completion(body.dump());
  EXPECT_EQ(r.system_prompt, "You are Qwen.");
  ASSERT_EQ(r.history.size(), 4u);
  EXPECT_EQ(r.history[0].role, "user");
  using Kind = ContentPart::Kind;
  const auto kinds = [](const std::vector<ContentPart>& parts) {
    std::vector<Kind> out;
    for (const auto& p : parts) out.push_back(p.kind);
    return out;
  };
  EXPECT_EQ(text_of(r.history[0].parts), "What is this?");
  EXPECT_EQ(kinds(r.history[0].parts), (std::vector<Kind>{Kind::kText, Kind::kAudio}));
  EXPECT_EQ(r.history[1].role, "assistant");
  EXPECT_EQ(text_of(r.history[1].parts), "A dog barking.");
  EXPECT_EQ(r.history[2].role, "system");
  EXPECT_EQ(text_of(r.history[2].parts), "Answer in French.");
  EXPECT_EQ(text_of(r.history[3].parts), "D'accord.!");
  EXPECT_EQ(kinds(r.history[3].parts), (std::vector<Kind>{Kind::kText, Kind::kText}));
  EXPECT_EQ(kinds(r.parts), (std::vector<Kind>{Kind::kAudio, Kind::kText}));
  EXPECT_EQ(text_of(r.parts), "And this?");
  EXPECT_EQ(r.audio.size(), 2u);
  EXPECT_EQ(r.audio[1].param, "messages[5].content[0]");
}

TEST(ParseChatCompletion, FullRequestWithEveryField) {
  const std::string wav = testing::wav_file(), png = testing::png_file(),
                    flac = testing::flac_file();
  const json body = {
      {"model", "qwen3-omni"},
      {"messages",
       {{{"role", "system"}, {"content", "You are Qwen."}},
        {{"role", "developer"},
         {"content",
          {{{"type", "text"}, {"text", "Be brief."}}, {{"type", "text"}, {"text", "Be kind."}}}}},
        {{"role", "user"},
         {"name", "ann"},
         {"content",
          {{{"type", "text"}, {"text", "What do you hear"}},
           {{"type", "input_audio"},
            {"input_audio", {{"data", base64_encode(wav)}, {"format", "WAV"}}}},
           {{"type", "image_url"},
            {"image_url",
             {{"url", "data:image/png;base64," + base64_encode(png)}, {"detail", "high"}}}},
           {{"type", "audio_url"},
            {"audio_url", {{"url", "data:audio/flac;base64," + base64_encode(flac)}}}},
           {{"type", "text"}, {"text", "and see?"}}}}}}},
      {"modalities", {"audio", "text", "audio"}},
      {"audio", {{"voice", "Chelsie"}, {"format", "wav"}}},
      {"temperature", 0.7},
      {"top_p", 0.8},
      {"top_k", 20},
      {"repetition_penalty", 1.1},
      {"max_completion_tokens", 100},
      {"max_tokens", 100.0},
      {"seed", 18446744073709551615ull},
      {"stop", {"x", "y"}},
      {"stream", true},
      {"stream_options", {{"include_usage", true}}},
      // accepted and ignored
      {"user", "u-1"},
      {"n", 1},
      {"logprobs", false},
      {"top_logprobs", 0},
      {"frequency_penalty", 0},
      {"presence_penalty", 0.0},
      {"parallel_tool_calls", true},
      {"metadata", {{"k", "v"}}},
      {"store", false},
      {"service_tier", "auto"},
      {"tools", json::array()},
      {"tool_choice", "none"},
      {"response_format", {{"type", "text"}}}};
  const auto r = parse_chat_completion(body.dump());
  EXPECT_EQ(r.model, "qwen3-omni");
  // Only the first message is the system prompt; the developer message is a system turn.
  EXPECT_EQ(r.system_prompt, "You are Qwen.");
  ASSERT_EQ(r.history.size(), 1u);
  EXPECT_EQ(r.history[0].role, "system");
  EXPECT_EQ(text_of(r.history[0].parts), "Be brief.Be kind.");
  EXPECT_EQ(text_of(r.parts), "What do you hearand see?");
  ASSERT_EQ(r.parts.size(), 5u);
  EXPECT_EQ(r.parts[1].kind, ContentPart::Kind::kAudio);
  EXPECT_EQ(r.parts[2].kind, ContentPart::Kind::kImage);
  EXPECT_EQ(r.parts[3].kind, ContentPart::Kind::kAudio);
  ASSERT_EQ(r.audio.size(), 2u);
  EXPECT_EQ(r.audio[0].kind, "audio");
  EXPECT_EQ(r.audio[0].format, "wav");
  EXPECT_EQ(r.audio[0].data, wav);
  EXPECT_EQ(r.audio[0].param, "messages[2].content[1]");
  EXPECT_EQ(r.audio[1].format, "flac");
  EXPECT_EQ(r.audio[1].data, flac);
  EXPECT_EQ(r.audio[1].param, "messages[2].content[3]");
  ASSERT_EQ(r.images.size(), 1u);
  EXPECT_EQ(r.images[0].kind, "image");
  EXPECT_EQ(r.images[0].format, "png");
  EXPECT_EQ(r.images[0].data, png);
  EXPECT_EQ(r.images[0].param, "messages[2].content[2]");
  EXPECT_EQ(r.modalities, (std::vector<std::string>{"audio", "text"}));
  EXPECT_TRUE(r.modalities_given);
  EXPECT_EQ(r.speaker, "Chelsie");
  EXPECT_EQ(r.audio_format, "wav");
  EXPECT_EQ(r.temperature, 0.7);
  EXPECT_EQ(r.top_p, 0.8);
  EXPECT_EQ(r.top_k, 20);
  EXPECT_EQ(r.repetition_penalty, 1.1);
  EXPECT_EQ(r.max_tokens, 100);
  EXPECT_EQ(r.seed, 18446744073709551615ull);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"x", "y"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

TEST(ParseChatCompletion, SpeakerFieldOrAudioVoice) {
  json body = testing::minimal_request();
  body["speaker"] = "Ethan";
  EXPECT_EQ(parse_chat_completion(body.dump()).speaker, "Ethan");
  body["audio"] = {{"voice", "ethan"}};  // the same name in another case: no conflict
  EXPECT_EQ(parse_chat_completion(body.dump()).speaker, "Ethan");
  body.erase("speaker");
  EXPECT_EQ(parse_chat_completion(body.dump()).speaker, "ethan");
}

TEST(ParseChatCompletion, NullMeansAbsentAndSmallConveniences) {
  json body = testing::minimal_request();
  for (const char* key : {"temperature", "top_p", "top_k", "max_tokens", "seed", "stop", "stream",
                          "stream_options", "modalities", "audio", "speaker", "n", "tools"}) {
    body[key] = nullptr;
  }
  body["max_completion_tokens"] = 1e3;  // an integer written as a float
  body["top_k"] = -1;                   // off, normalised to 0
  body["stop"] = "END";                 // one string
  const auto r = parse_chat_completion(body.dump());
  EXPECT_FALSE(r.temperature.has_value());
  EXPECT_EQ(r.max_tokens, 1000);
  EXPECT_EQ(r.top_k, 0);
  EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
  EXPECT_FALSE(r.modalities_given);
}

TEST(ParseChatCompletion, MediaFormatsFromMediaTypesAndBytes) {
  json body = testing::minimal_request();
  const std::string jpeg("\xFF\xD8\xFF\xE0rest", 8);
  body["messages"][0]["content"] = {
      {{"type", "image_url"},
       {"image_url", {{"url", "data:image/jpeg;base64," + base64_encode(jpeg)}}}},
      {{"type", "image_url"},
       {"image_url", {{"url", "data:;base64," + base64_encode(testing::png_file())}}}},
      {{"type", "audio_url"},
       {"audio_url", {{"url", "data:audio/x-wav;base64," + base64_encode(testing::wav_file())}}}},
      {{"type", "audio_url"},
       {"audio_url",
        {{"url", "data:application/octet-stream;base64," + base64_encode(testing::wav_file())}}}},
      {{"type", "audio_url"}, {"audio_url", {{"url", "data:audio/mpeg;base64,SUQz"}}}},
      {{"type", "input_audio"}, {"input_audio", {{"data", "SUQz"}, {"format", "mp3"}}}}};
  const auto r = parse_chat_completion(body.dump());
  ASSERT_EQ(r.images.size(), 2u);
  EXPECT_EQ(r.images[0].format, "jpeg");
  EXPECT_EQ(r.images[1].format, "png");
  ASSERT_EQ(r.audio.size(), 4u);
  EXPECT_EQ(r.audio[0].format, "wav");
  EXPECT_EQ(r.audio[1].format, "wav");
  EXPECT_EQ(r.audio[2].format, "mp3");
  EXPECT_EQ(r.audio[3].format, "mp3");
  EXPECT_EQ(text_of(r.parts), "");
}

TEST(ParseChatCompletion, BracketsInsideStringsDoNotCountAsDepth) {
  json body = testing::minimal_request();
  body["messages"][0]["content"] = std::string(100000, '[') + "\"\\\"{{{" + std::string(50, '{');
  EXPECT_EQ(text_of(parse_chat_completion(body.dump()).parts), body["messages"][0]["content"]);
}

// --- robustness ---------------------------------------------------------------------------

TEST(ParseChatCompletion, DeepJsonIsRefusedQuickly) {
  const auto start = std::chrono::steady_clock::now();
  for (const char open : {'[', '{'}) {
    std::string body = "{\"model\": \"m\", \"messages\": ";
    for (int i = 0; i < 100000; ++i) body += open == '[' ? "[" : "{\"a\":";
    const ApiError e = testing::parse_error(body);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "invalid_json");
    EXPECT_NE(e.message.find("more than 32 levels"), std::string::npos) << e.message;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  ParseLimits tight;
  tight.max_depth = 2;
  EXPECT_EQ(testing::parse_error(testing::minimal_request().dump(), tight).code, "invalid_json");
}

TEST(ParseChatCompletion, NumbersBeyondADoubleAreRefused) {
  for (const char* number : {"1e400", "-1e400", "1.5e99999"}) {
    const std::string body = R"({"model": "m", "temperature": )" + std::string(number) +
                             R"(, "messages": [{"role": "user", "content": "hi"}]})";
    const ApiError e = testing::parse_error(body);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "invalid_value") << number;
    EXPECT_NE(e.message.find("out of range"), std::string::npos) << e.message;
  }
  // A huge integer becomes a double, finite but out of range for an int64.
  json body = testing::minimal_request();
  body["max_tokens"] = 1e30;
  EXPECT_EQ(testing::parse_error_of(body).param, "max_tokens");
  const std::string big = R"({"model": "m", "seed": 123456789012345678901234567890,
                              "messages": [{"role": "user", "content": "hi"}]})";
  EXPECT_EQ(testing::parse_error(big).code, "invalid_value");
}

TEST(ParseChatCompletion, RandomBytesAreInvalidJson) {
  std::mt19937 rng(11);
  for (int round = 0; round < 200; ++round) {
    std::string body(1 + rng() % 512, '\0');
    for (char& c : body) c = static_cast<char>(rng() & 0xFF);
    if (round % 2 == 0) body[0] = '{';  // and some that start like an object
    const ApiError e = testing::parse_error(body);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "invalid_json") << round;
    EXPECT_NE(e.message.find("not valid JSON (byte "), std::string::npos) << e.message;
    // The error body is valid UTF-8 JSON even when the message quotes invalid bytes.
    EXPECT_TRUE(json::accept(e.json()));
  }
  EXPECT_EQ(testing::parse_error("").code, "invalid_json");
  EXPECT_EQ(testing::parse_error("{\"model\": \"m\"} trailing").code, "invalid_json");
  EXPECT_EQ(testing::parse_error("{\"model\": \"\xff\"}").code, "invalid_json");
  EXPECT_EQ(testing::parse_error(R"({"model": "\ud800"})").code, "invalid_json");
}

TEST(ParseChatCompletion, MutatedBodiesThrowOnlyApiException) {
  json valid = testing::minimal_request();
  valid["messages"] = {
      {{"role", "system"}, {"content", "sys"}},
      {{"role", "user"},
       {"content",
        {{{"type", "text"}, {"text", "hi"}},
         {{"type", "input_audio"},
          {"input_audio",
           {{"data", base64_encode(testing::wav_file().substr(0, 60))}, {"format", "wav"}}}},
         {{"type", "image_url"},
          {"image_url",
           {{"url", "data:image/png;base64," + base64_encode(testing::png_file())}}}}}}}};
  valid["temperature"] = 0.5;
  valid["max_tokens"] = 16;
  valid["stop"] = {"a"};
  valid["stream"] = true;
  valid["stream_options"] = {{"include_usage", true}};
  valid["modalities"] = {"text"};
  const std::string base = valid.dump();
  ASSERT_NO_THROW(parse_chat_completion(base));

  const std::string interesting = "{}[]\",:\\0123456789-+.eEtruefalsnul \x01\x7f\x80\xff";
  std::mt19937 rng(5);
  int accepted = 0, refused = 0;
  for (int round = 0; round < 2000; ++round) {
    std::string body = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits && !body.empty(); ++k) {
      const size_t at = rng() % body.size();
      switch (rng() % 5) {
        case 0:  // flip bits of a byte
          body[at] = static_cast<char>(body[at] ^ (1 << (rng() % 8)));
          break;
        case 1:  // truncate
          body.resize(at);
          break;
        case 2:  // insert a byte that JSON cares about
          body.insert(at, 1, interesting[rng() % interesting.size()]);
          break;
        case 3:  // delete a stretch
          body.erase(at, 1 + rng() % 8);
          break;
        default:  // duplicate a stretch
          body.insert(at, body.substr(rng() % body.size(), 1 + rng() % 16));
          break;
      }
    }
    try {
      parse_chat_completion(body);
      ++accepted;
    } catch (const ApiException& e) {
      ++refused;
      EXPECT_TRUE(e.error().status == 400 || e.error().status == 413) << body;
      EXPECT_FALSE(e.error().message.empty());
      EXPECT_TRUE(json::accept(e.error().json()));
    } catch (const std::exception& e) {
      ADD_FAILURE() << "threw " << typeid(e).name() << " (" << e.what() << ") for " << body;
    } catch (...) {
      ADD_FAILURE() << "threw a non-exception for " << body;
    }
  }
  // Both outcomes happen: the mutations are neither all harmless nor all fatal.
  EXPECT_GT(accepted, 0);
  EXPECT_GT(refused, 1000);
}

}  // namespace
}  // namespace omni::http
