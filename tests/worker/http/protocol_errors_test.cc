// Every way parse_chat_completion refuses a request: status, code, the field's path and the
// message, as OpenAI clients show them.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "tests/worker/http/protocol_test_util.h"

namespace omni::http {
namespace {

using testing::json;

struct ErrorCase {
  std::string name;
  std::function<void(json&)> edit;  // applied to the minimal valid request
  int status;
  std::string code, param, phrase;
};

json user_parts(json parts) {
  return json::array({{{"role", "user"}, {"content", std::move(parts)}}});
}

json part(const std::string& type, json value) {
  return {{"type", type}, {type, std::move(value)}};
}

const std::string kWav64 = base64_encode(testing::wav_file());

std::vector<ErrorCase> error_cases() {
  return {
      // the body
      {"not an object", [](json& b) { b = json::array({1}); }, 400, "invalid_type", "",
       "expected a JSON object"},
      {"unknown field", [](json& b) { b["temprature"] = 1; }, 400, "unknown_field", "temprature",
       "unknown field 'temprature'"},
      {"unknown null field", [](json& b) { b["logit_bias"] = nullptr; }, 400, "unknown_field",
       "logit_bias", "unknown field"},
      {"tools",
       [](json& b) {
         b["tools"] = {{{"type", "function"}}};
       },
       400, "unsupported", "tools", "tool calling is not supported"},
      {"tool_choice", [](json& b) { b["tool_choice"] = "auto"; }, 400, "unsupported", "tool_choice",
       "tool calling"},
      {"response_format",
       [](json& b) {
         b["response_format"] = {{"type", "json_object"}};
       },
       400, "unsupported", "response_format", "response formats"},
      {"n = 2", [](json& b) { b["n"] = 2; }, 400, "unsupported", "n", "n = 1"},
      {"logprobs", [](json& b) { b["logprobs"] = true; }, 400, "unsupported", "logprobs",
       "logprobs are not supported"},
      {"top_logprobs", [](json& b) { b["top_logprobs"] = 3; }, 400, "unsupported", "top_logprobs",
       "logprobs"},
      {"presence_penalty", [](json& b) { b["presence_penalty"] = 0.5; }, 400, "unsupported",
       "presence_penalty", "repetition_penalty"},
      {"frequency_penalty type", [](json& b) { b["frequency_penalty"] = "0"; }, 400, "invalid_type",
       "frequency_penalty", "expected a number"},
      // model
      {"no model", [](json& b) { b.erase("model"); }, 400, "missing_field", "model",
       "'model' is required"},
      {"null model", [](json& b) { b["model"] = nullptr; }, 400, "missing_field", "model",
       "required"},
      {"model type", [](json& b) { b["model"] = 5; }, 400, "invalid_type", "model",
       "expected a string, got an integer"},
      {"empty model", [](json& b) { b["model"] = ""; }, 400, "invalid_value", "model",
       "must not be empty"},
      // messages
      {"no messages", [](json& b) { b.erase("messages"); }, 400, "missing_field", "messages",
       "'messages' is required"},
      {"messages type", [](json& b) { b["messages"] = "hi"; }, 400, "invalid_type", "messages",
       "expected an array"},
      {"empty messages", [](json& b) { b["messages"] = json::array(); }, 400, "invalid_value",
       "messages", "at least one message"},
      {"message type", [](json& b) { b["messages"] = {1}; }, 400, "invalid_type", "messages[0]",
       "expected an object"},
      {"no role", [](json& b) { b["messages"][0].erase("role"); }, 400, "missing_field",
       "messages[0].role", "required"},
      {"role type", [](json& b) { b["messages"][0]["role"] = 1; }, 400, "invalid_type",
       "messages[0].role", "expected a string"},
      {"unknown role", [](json& b) { b["messages"][0]["role"] = "tool"; }, 400, "invalid_value",
       "messages[0].role", "unknown role 'tool'"},
      {"unknown message field", [](json& b) { b["messages"][0]["tool_calls"] = json::array(); },
       400, "unknown_field", "messages[0].tool_calls", "unknown field"},
      {"assistant last",
       [](json& b) {
         b["messages"].push_back({{"role", "assistant"}, {"content", "Hi!"}});
       },
       400, "invalid_value", "messages[1]", "the last message must be a user turn"},
      {"system last",
       [](json& b) {
         b["messages"].push_back({{"role", "system"}, {"content", "Obey."}});
       },
       400, "invalid_value", "messages[1]", "not 'system'"},
      {"assistant image",
       [](json& b) {
         b["messages"].push_back(
             {{"role", "assistant"}, {"content", {part("image_url", {{"url", "data:,x"}})}}});
         b["messages"].push_back({{"role", "user"}, {"content", "And?"}});
       },
       400, "unsupported", "messages[1].content[0].type", "assistant turns hold text parts only"},
      {"assistant null content",
       [](json& b) {
         b["messages"].push_back({{"role", "assistant"}, {"content", nullptr}});
         b["messages"].push_back({{"role", "user"}, {"content", "And?"}});
       },
       400, "missing_field", "messages[1].content", "required"},
      {"system only", [](json& b) { b["messages"][0]["role"] = "system"; }, 400, "missing_field",
       "messages", "a user message"},
      {"no content", [](json& b) { b["messages"][0].erase("content"); }, 400, "missing_field",
       "messages[0].content", "required"},
      {"content type", [](json& b) { b["messages"][0]["content"] = 3; }, 400, "invalid_type",
       "messages[0].content", "expected a string or an array of content parts"},
      {"system image",
       [](json& b) {
         b["messages"].insert(
             b["messages"].begin(),
             json({{"role", "system"}, {"content", {part("image_url", {{"url", "data:,x"}})}}}));
       },
       400, "unsupported", "messages[0].content[0].type", "text parts only"},
      // content parts
      {"part type", [](json& b) { b["messages"] = user_parts({1}); }, 400, "invalid_type",
       "messages[0].content[0]", "expected an object"},
      {"part without type",
       [](json& b) {
         b["messages"] = user_parts({{{"text", "hi"}}});
       },
       400, "missing_field", "messages[0].content[0].type", "required"},
      {"unknown part type", [](json& b) { b["messages"] = user_parts({part("hologram", 1)}); }, 400,
       "invalid_value", "messages[0].content[0].type", "unknown content part type"},
      {"video part",
       [](json& b) {
         b["messages"] = user_parts({part("video_url", {{"url", "data:,x"}})});
       },
       400, "unsupported", "messages[0].content[0].type", "'video_url' are not supported"},
      {"text part without text",
       [](json& b) {
         b["messages"] = user_parts({{{"type", "text"}}});
       },
       400, "missing_field", "messages[0].content[0].text", "required"},
      {"unknown part field",
       [](json& b) {
         b["messages"] = user_parts({{{"type", "text"}, {"text", "hi"}, {"lang", "en"}}});
       },
       400, "unknown_field", "messages[0].content[0].lang", "unknown field"},
      {"input_audio without data",
       [](json& b) {
         b["messages"] = user_parts(
             {{{"type", "text"}, {"text", "hi"}}, part("input_audio", {{"format", "wav"}})});
       },
       400, "missing_field", "messages[0].content[1].input_audio.data", "required"},
      {"input_audio without format",
       [](json& b) {
         b["messages"] = user_parts({part("input_audio", {{"data", kWav64}})});
       },
       400, "missing_field", "messages[0].content[0].input_audio.format", "required"},
      {"input_audio ogg",
       [](json& b) {
         b["messages"] = user_parts({part("input_audio", {{"data", kWav64}, {"format", "ogg"}})});
       },
       400, "unsupported", "messages[0].content[0].input_audio.format", "wav, mp3, flac"},
      {"input_audio not an object",
       [](json& b) { b["messages"] = user_parts({part("input_audio", kWav64)}); }, 400,
       "invalid_type", "messages[0].content[0].input_audio", "expected an object"},
      {"input_audio wrong alphabet",
       [](json& b) {
         b["messages"] =
             user_parts({part("input_audio", {{"data", "UklG-_=="}, {"format", "wav"}})});
       },
       400, "invalid_base64", "messages[0].content[0].input_audio.data", "not valid base64"},
      {"input_audio truncated",
       [](json& b) {
         b["messages"] = user_parts({part(
             "input_audio", {{"data", kWav64.substr(0, kWav64.size() - 3)}, {"format", "wav"}})});
       },
       400, "invalid_base64", "messages[0].content[0].input_audio.data", "padded"},
      {"input_audio data URL",
       [](json& b) {
         b["messages"] = user_parts({part(
             "input_audio", {{"data", "data:audio/wav;base64," + kWav64}, {"format", "wav"}})});
       },
       400, "invalid_base64", "messages[0].content[0].input_audio.data", "not a data: URL"},
      {"empty audio",
       [](json& b) {
         b["messages"] = user_parts({part("input_audio", {{"data", ""}, {"format", "wav"}})});
       },
       400, "invalid_value", "messages[0].content[0].input_audio.data", "empty"},
      {"remote image",
       [](json& b) {
         b["messages"] = user_parts({{{"type", "text"}, {"text", "look"}},
                                     part("image_url", {{"url", "https://example.com/cat.png"}})});
       },
       400, "remote_url", "messages[0].content[1].image_url.url",
       "fetching URLs is not supported: send the bytes as a data: URL"},
      {"remote audio",
       [](json& b) {
         b["messages"] = user_parts({part("audio_url", {{"url", "http://example.com/a.wav"}})});
       },
       400, "remote_url", "messages[0].content[0].audio_url.url", "fetching URLs is not supported"},
      {"image without url",
       [](json& b) { b["messages"] = user_parts({part("image_url", json::object())}); }, 400,
       "missing_field", "messages[0].content[0].image_url.url", "required"},
      {"image bad base64",
       [](json& b) {
         b["messages"] =
             user_parts({part("image_url", {{"url", "data:image/png;base64,iVBORw0K*"}})});
       },
       400, "invalid_base64", "messages[0].content[0].image_url.url", "not valid base64"},
      {"webp image",
       [](json& b) {
         b["messages"] = user_parts({part("image_url", {{"url", "data:image/webp;base64,UklG"}})});
       },
       400, "unsupported", "messages[0].content[0].image_url.url", "(PNG, JPEG)"},
      {"image of text",
       [](json& b) {
         b["messages"] = user_parts({part("image_url", {{"url", "data:text/plain,hello"}})});
       },
       400, "invalid_value", "messages[0].content[0].image_url.url",
       "expected an image media type"},
      {"unknown image bytes",
       [](json& b) {
         b["messages"] = user_parts({part("image_url", {{"url", "data:;base64,Zm9v"}})});
       },
       400, "unsupported", "messages[0].content[0].image_url.url", "not PNG or JPEG"},
      {"ogg audio_url",
       [](json& b) {
         b["messages"] =
             user_parts({part("audio_url", {{"url", "data:audio/ogg;base64,T2dnUw=="}})});
       },
       400, "unsupported", "messages[0].content[0].audio_url.url", "(wav, mp3, flac)"},
      // output
      {"unknown modality",
       [](json& b) {
         b["modalities"] = {"text", "video"};
       },
       400, "invalid_value", "modalities[1]", "unknown modality 'video'"},
      {"no modality", [](json& b) { b["modalities"] = json::array(); }, 400, "invalid_value",
       "modalities", "at least one"},
      {"modalities type", [](json& b) { b["modalities"] = "text"; }, 400, "invalid_type",
       "modalities", "expected an array of strings"},
      {"audio.format mp3",
       [](json& b) {
         b["audio"] = {{"format", "mp3"}};
       },
       400, "unsupported", "audio.format", "only \"wav\""},
      {"audio field",
       [](json& b) {
         b["audio"] = {{"speed", 2}};
       },
       400, "unknown_field", "audio.speed", "unknown field"},
      {"speaker and voice",
       [](json& b) {
         b["speaker"] = "ethan";
         b["audio"] = {{"voice", "chelsie"}};
       },
       400, "invalid_value", "speaker", "differ"},
      {"speaker type", [](json& b) { b["speaker"] = 1; }, 400, "invalid_type", "speaker",
       "expected a string"},
      // sampling
      {"temperature type", [](json& b) { b["temperature"] = "hot"; }, 400, "invalid_type",
       "temperature", "expected a number, got a string"},
      {"temperature high", [](json& b) { b["temperature"] = 2.5; }, 400, "invalid_value",
       "temperature", "between 0 and 2"},
      {"temperature negative", [](json& b) { b["temperature"] = -0.1; }, 400, "invalid_value",
       "temperature", "between 0 and 2"},
      // Logits divided by 1e-300 overflow inside the sampler: refused here instead.
      {"temperature tiny", [](json& b) { b["temperature"] = 1e-300; }, 400, "invalid_value",
       "temperature", "0 (greedy) or at least 1e-05"},
      {"top_p 0", [](json& b) { b["top_p"] = 0; }, 400, "invalid_value", "top_p", "(0, 1]"},
      {"top_p 1.5", [](json& b) { b["top_p"] = 1.5; }, 400, "invalid_value", "top_p", "(0, 1]"},
      {"top_k -2", [](json& b) { b["top_k"] = -2; }, 400, "invalid_value", "top_k", ">= 0"},
      {"top_k fraction", [](json& b) { b["top_k"] = 1.5; }, 400, "invalid_type", "top_k",
       "expected an integer"},
      {"top_k bool", [](json& b) { b["top_k"] = true; }, 400, "invalid_type", "top_k",
       "expected an integer, got a boolean"},
      {"repetition_penalty 0", [](json& b) { b["repetition_penalty"] = 0; }, 400, "invalid_value",
       "repetition_penalty", "> 0"},
      {"repetition_penalty tiny", [](json& b) { b["repetition_penalty"] = 1e-300; }, 400,
       "invalid_value", "repetition_penalty", "between 0.01 and 100"},
      {"repetition_penalty huge", [](json& b) { b["repetition_penalty"] = 1e300; }, 400,
       "invalid_value", "repetition_penalty", "between 0.01 and 100"},
      {"max_tokens 0", [](json& b) { b["max_tokens"] = 0; }, 400, "invalid_value", "max_tokens",
       ">= 1"},
      {"max_completion_tokens -5", [](json& b) { b["max_completion_tokens"] = -5; }, 400,
       "invalid_value", "max_completion_tokens", ">= 1"},
      {"max_tokens disagree",
       [](json& b) {
         b["max_tokens"] = 10;
         b["max_completion_tokens"] = 11;
       },
       400, "invalid_value", "max_completion_tokens", "differ"},
      {"max_tokens huge", [](json& b) { b["max_tokens"] = 1e30; }, 400, "invalid_value",
       "max_tokens", "out of range"},
      {"max_tokens beyond int64", [](json& b) { b["max_tokens"] = 18446744073709551615ull; }, 400,
       "invalid_value", "max_tokens", "out of range"},
      {"seed negative", [](json& b) { b["seed"] = -1; }, 400, "invalid_value", "seed", ">= 0"},
      {"seed string", [](json& b) { b["seed"] = "42"; }, 400, "invalid_type", "seed",
       "expected an integer"},
      {"five stops",
       [](json& b) {
         b["stop"] = {"a", "b", "c", "d", "e"};
       },
       400, "invalid_value", "stop", "at most 4"},
      {"empty stop", [](json& b) { b["stop"] = ""; }, 400, "invalid_value", "stop",
       "must not be empty"},
      {"empty stop in list",
       [](json& b) {
         b["stop"] = {"a", ""};
       },
       400, "invalid_value", "stop[1]", "must not be empty"},
      {"stop type",
       [](json& b) {
         b["stop"] = {"a", 1};
       },
       400, "invalid_type", "stop[1]", "expected a string"},
      // streaming
      {"stream type", [](json& b) { b["stream"] = "yes"; }, 400, "invalid_type", "stream",
       "expected a boolean"},
      {"stream_options without stream",
       [](json& b) {
         b["stream_options"] = {{"include_usage", true}};
       },
       400, "invalid_value", "stream_options", "only allowed when 'stream' is true"},
      {"stream_options field",
       [](json& b) {
         b["stream"] = true;
         b["stream_options"] = {{"continuous_usage_stats", true}};
       },
       400, "unknown_field", "stream_options.continuous_usage_stats", "unknown field"},
  };
}

TEST(ParseChatCompletionErrors, EachRefusalNamesItsField) {
  for (const ErrorCase& c : error_cases()) {
    SCOPED_TRACE(c.name);
    json body = testing::minimal_request();
    c.edit(body);
    const ApiError e = testing::parse_error_of(body);
    EXPECT_EQ(e.status, c.status);
    EXPECT_EQ(e.type, "invalid_request_error");
    EXPECT_EQ(e.code, c.code);
    EXPECT_EQ(e.param, c.param);
    EXPECT_NE(e.message.find(c.phrase), std::string::npos) << e.message;
    // The error body as clients read it.
    const json error = json::parse(e.json())["error"];
    EXPECT_EQ(error["message"], e.message);
    EXPECT_EQ(error["code"], c.code);
    if (c.param.empty()) {
      EXPECT_TRUE(error["param"].is_null());
    } else {
      EXPECT_EQ(error["param"], c.param);
    }
  }
}

TEST(ParseChatCompletionErrors, NotJsonGivesTheBytePosition) {
  const ApiError e = testing::parse_error(std::string(R"({"model": "m", "messages": [}])"));
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "invalid_json");
  EXPECT_EQ(e.param, "");
  EXPECT_NE(e.message.find("(byte 29)"), std::string::npos) << e.message;
}

TEST(ParseChatCompletionErrors, TooManyMessages) {
  ParseLimits limits;
  limits.max_messages = 3;
  json body = testing::minimal_request();
  for (int i = 0; i < 3; ++i) {
    body["messages"].insert(body["messages"].begin(), json({{"role", "system"}, {"content", "s"}}));
  }
  const ApiError e = testing::parse_error_of(body, limits);
  EXPECT_EQ(e.status, 413);
  EXPECT_EQ(e.code, "request_too_large");
  EXPECT_EQ(e.param, "messages");
  EXPECT_NE(e.message.find("at most 3"), std::string::npos) << e.message;
  body["messages"].erase(0);
  EXPECT_NO_THROW(parse_chat_completion(body.dump(), limits));
}

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

// A PNG signature and IHDR declaring width x height; no pixel data (nothing is decoded here).
std::string png_header(uint32_t width, uint32_t height) {
  return std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16) + be32(width) + be32(height) +
         std::string("\x08\x02\0\0\0", 5);
}

// A JPEG with an APP0 segment, then SOF0 declaring width x height (16 bits each).
std::string jpeg_header(uint16_t width, uint16_t height) {
  std::string b("\xFF\xD8\xFF\xE0\x00\x10JFIF\0\x01\x01\0\0\x01\0\x01\0\0", 20);
  b += std::string("\xFF\xC0\x00\x11\x08", 5);
  b += {static_cast<char>(height >> 8), static_cast<char>(height & 0xff),
        static_cast<char>(width >> 8), static_cast<char>(width & 0xff)};
  return b + std::string("\x03\x01\x22\x00\x02\x11\x01\x03\x11\x01", 10);
}

json image(const std::string& bytes, const std::string& type) {
  return part("image_url", {{"url", "data:image/" + type + ";base64," + base64_encode(bytes)}});
}

// Pixels are counted from the PNG and JPEG headers before anything is decoded: a 12000x12000
// PNG of a few hundred bytes would decode to 432 MB.
TEST(ParseChatCompletionErrors, ImagePixelsOverTheBudgetAreRefusedFromTheirHeaders) {
  ParseLimits limits;
  limits.max_image_pixels = 3000 * 3000;
  json body = testing::minimal_request();
  body["messages"] = user_parts({image(png_header(2000, 2000), "png")});
  EXPECT_NO_THROW(parse_chat_completion(body.dump(), limits));
  for (const auto& big :
       {image(png_header(12000, 12000), "png"), image(jpeg_header(12000, 12000), "jpeg")}) {
    body["messages"] = user_parts({big});
    const ApiError e = testing::parse_error_of(body, limits);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "media_too_large");
    EXPECT_EQ(e.param, "messages[0].content[0].image_url.url");
    EXPECT_NE(e.message.find("12000x12000"), std::string::npos) << e.message;
  }
  // The budget is per request: three images of 2000x2000 exceed 3000x3000 together.
  const json small = image(jpeg_header(2000, 2000), "jpeg");
  body["messages"] = user_parts({small, small});
  EXPECT_NO_THROW(parse_chat_completion(body.dump(), limits));
  body["messages"] = user_parts({small, small, small});
  EXPECT_EQ(testing::parse_error_of(body, limits).param, "messages[0].content[2].image_url.url");
}

TEST(ParseChatCompletionErrors, TooManyMediaItems) {
  ParseLimits limits;
  limits.max_media_items = 2;
  json audio = part("input_audio", {{"data", kWav64}, {"format", "wav"}});
  json body = testing::minimal_request();
  body["messages"] = user_parts({audio, audio});
  EXPECT_NO_THROW(parse_chat_completion(body.dump(), limits));
  body["messages"] = user_parts({audio, audio, audio});
  const ApiError e = testing::parse_error_of(body, limits);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "media_too_large");
  EXPECT_EQ(e.param, "messages[0].content[2].input_audio.data");
  EXPECT_NE(e.message.find("more than 2 media parts"), std::string::npos) << e.message;
}

// Internal errors as clients see them: no source locations, check conditions or media folders.
TEST(PublicErrorMessage, DropsLocationsConditionsAndTempFolders) {
  EXPECT_EQ(public_error_message("SamplingParams.temperature must be finite (expected "
                                 "std::isfinite(t) && (t > 0)) [sampler.cc:50]"),
            "SamplingParams.temperature must be finite");
  EXPECT_EQ(public_error_message("stage 0 (thinker): the prompt is too long [generate.cc:17]"),
            "stage 0 (thinker): the prompt is too long");
  EXPECT_EQ(public_error_message("audio file '/tmp/omni-media-Ab12Cd/input-0.wav' has 0 frames "
                                 "[audio_file.cc:80]"),
            "audio file 'input-0.wav' has 0 frames");
  // The MP4 encoder's and the video jobs' folders too (a failed video job's error).
  EXPECT_EQ(public_error_message("cannot write '/tmp/omni-mp4-x1Y2z3/video.mp4': no frames"),
            "cannot write 'video.mp4': no frames");
  EXPECT_EQ(public_error_message("cannot open /var/tmp/omni-videos-AbCdEf/video_1.mp4"),
            "cannot open video_1.mp4");
  EXPECT_EQ(public_error_message("omni-mp4-short/x"), "omni-mp4-short/x");
  // Nothing else changes: user text in brackets, other paths.
  EXPECT_EQ(public_error_message("unknown token [x] in '/data/model'"),
            "unknown token [x] in '/data/model'");
}

TEST(ParseChatCompletionErrors, TooManyMediaBytes) {
  const std::string wav = testing::wav_file();
  ParseLimits limits;
  limits.max_media_bytes = 2 * wav.size();
  json body = testing::minimal_request();
  json audio = part("input_audio", {{"data", base64_encode(wav)}, {"format", "wav"}});
  body["messages"] = user_parts({audio, audio});
  EXPECT_NO_THROW(parse_chat_completion(body.dump(), limits));
  body["messages"][0]["content"].push_back(
      part("image_url", {{"url", "data:image/png;base64," + base64_encode(testing::png_file())}}));
  const ApiError e = testing::parse_error_of(body, limits);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "media_too_large");
  EXPECT_EQ(e.param, "messages[0].content[2].image_url.url");
}

// A sample rate far from speech's is refused from the WAV or FLAC header, naming the field:
// a WAV declared at 1 Hz would be resampled to 16000 times its size before any other check.
TEST(ParseChatCompletionErrors, AudioSampleRatesOutsideTheRangeAreRefusedFromTheirHeaders) {
  std::string wav = testing::wav_file();
  ASSERT_EQ(wav.compare(12, 4, "fmt "), 0);
  json body = testing::minimal_request();
  const auto with_rate = [](std::string bytes, size_t at, const std::string& rate) {
    bytes.replace(at, rate.size(), rate);
    return bytes;
  };
  body["messages"] =
      user_parts({part("input_audio", {{"data", base64_encode(wav)}, {"format", "wav"}})});
  EXPECT_NO_THROW(parse_chat_completion(body.dump(), ParseLimits{}));
  for (const std::string& rate : {std::string("\x01\0\0\0", 4), std::string("\0\x10\x0e\0", 4)}) {
    const std::string bad = with_rate(wav, 24, rate);  // 1 Hz, then 921600 Hz
    body["messages"] =
        user_parts({part("input_audio", {{"data", base64_encode(bad)}, {"format", "wav"}})});
    const ApiError e = testing::parse_error_of(body, ParseLimits{});
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "unsupported_sample_rate");
    EXPECT_EQ(e.param, "messages[0].content[0].input_audio.data");
    body["messages"] =
        user_parts({part("audio_url", {{"url", "data:audio/wav;base64," + base64_encode(bad)}})});
    EXPECT_EQ(testing::parse_error_of(body, ParseLimits{}).param,
              "messages[0].content[0].audio_url.url");
  }
  // FLAC: "fLaC", a STREAMINFO block header, then the rate in 20 bits at the block's byte 10.
  std::string flac("fLaC\0\0\0\x22", 8);
  flac += std::string(10, '\0') + std::string("\0\0\x10", 3) + std::string(21, '\0');  // 1 Hz
  body["messages"] =
      user_parts({part("input_audio", {{"data", base64_encode(flac)}, {"format", "flac"}})});
  const ApiError e = testing::parse_error_of(body, ParseLimits{});
  EXPECT_EQ(e.code, "unsupported_sample_rate");
  EXPECT_NE(e.message.find("declares 1 Hz"), std::string::npos) << e.message;
}

TEST(ParseChatCompletionErrors, AudioOfTooManyChannelsIsRefusedFromItsHeader) {
  json body = testing::minimal_request();
  std::string wav = testing::wav_file();
  ASSERT_EQ(wav.compare(12, 4, "fmt "), 0);
  wav[22] = '\x00';  // fmt's channel count (little-endian 16 bits at byte 22): 1024
  wav[23] = '\x04';
  body["messages"] =
      user_parts({part("input_audio", {{"data", base64_encode(wav)}, {"format", "wav"}})});
  const ApiError e = testing::parse_error_of(body, ParseLimits{});
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "unsupported_channels");
  EXPECT_NE(e.message.find("1024 channels"), std::string::npos) << e.message;
  wav[22] = '\x08';  // 8: the limit
  wav[23] = '\x00';
  body["messages"] =
      user_parts({part("input_audio", {{"data", base64_encode(wav)}, {"format", "wav"}})});
  EXPECT_NO_THROW(parse_chat_completion(body.dump(), ParseLimits{}));
}

TEST(ParseChatCompletionErrors, TextOverTheContextIsRefusedBeforeItIsParsed) {
  ParseLimits limits;
  limits.max_text_bytes = 100;
  limits.text_limit_why = "the model's context of 10 tokens";
  json body = testing::minimal_request();
  body["messages"] = json::array({{{"role", "system"}, {"content", std::string(60, 'a')}},
                                  {{"role", "user"}, {"content", std::string(40, 'b')}}});
  EXPECT_NO_THROW(parse_chat_completion(body.dump(), limits));  // 100 bytes: the limit
  body["messages"][1]["content"] = user_parts({part("text", std::string(41, 'b'))})[0]["content"];
  const ApiError e = testing::parse_error_of(body, limits);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "context_length_exceeded");
  EXPECT_EQ(e.param, "messages");
  EXPECT_NE(e.message.find("the model's context of 10 tokens"), std::string::npos) << e.message;
  // Counted as the decoded text: 50 escaped two-byte characters are 100 bytes, not 300.
  std::string escaped;
  for (int i = 0; i < 50; ++i) escaped += "\\u00e9";
  const std::string raw =
      R"({"model": "m", "messages": [{"role": "user", "content": ")" + escaped + R"("}]})";
  EXPECT_NO_THROW(parse_chat_completion(raw, limits));
  EXPECT_EQ(testing::parse_error(raw.substr(0, raw.size() - 4) + R"(\u00e9"}]})", limits).code,
            "context_length_exceeded");
  // A surrogate pair is one four-byte character.
  std::string pairs;
  for (int i = 0; i < 25; ++i) pairs += "\\ud83d\\ude00";
  EXPECT_NO_THROW(parse_chat_completion(
      R"({"model": "m", "messages": [{"role": "user", "content": ")" + pairs + R"("}]})", limits));
  // Media and other strings are not text.
  body = testing::minimal_request();
  body["user"] = std::string(500, 'u');
  EXPECT_NO_THROW(parse_chat_completion(body.dump(), limits));
}

TEST(ParseChatCompletionErrors, JsonValuesAreBoundedWhileParsing) {
  ParseLimits limits;
  limits.max_json_values = 100;
  std::string many = R"({"model": "m", "messages": [)";
  for (int i = 0; i < 200; ++i) many += "{},";
  many += "{}]}";
  const ApiError e = testing::parse_error(many, limits);
  EXPECT_EQ(e.status, 413);
  EXPECT_EQ(e.code, "request_too_large");
  EXPECT_NE(e.message.find("100 JSON values"), std::string::npos) << e.message;
  // Containers, keys and values of the minimal request: ten, bounded from above.
  const size_t made = parse_chat_completion(testing::minimal_request().dump(), limits).json_values;
  EXPECT_GE(made, 6u);
  EXPECT_LE(made, 16u);
}

TEST(ParseChatCompletionErrors, LongFieldNamesAreNotEchoedWhole) {
  json body = testing::minimal_request();
  body[std::string(1 << 20, 'k')] = 1;
  const ApiError e = testing::parse_error_of(body);
  EXPECT_EQ(e.code, "unknown_field");
  EXPECT_LT(e.json().size(), 1000u);
  EXPECT_EQ(e.param, std::string(64, 'k') + "...");
}

}  // namespace
}  // namespace omni::http
