// parse_image_request and parse_image_edit_form: what a POST /v1/images/generations body or a
// /v1/images/edits form asks the image stage for, and every way it is refused (status, code, the
// field and the message, as OpenAI clients show them).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

#include "worker/http/api_error.h"
#include "worker/http/image_request.h"

namespace omni::http {
namespace {

using json = nlohmann::json;

json minimal() { return {{"prompt", "a red fox"}}; }

TEST(ImageRequest, MinimalLeavesTheModelsDefaults) {
  const ImageRequest r = parse_image_request(minimal().dump());
  EXPECT_EQ(r.prompt, "a red fox");
  EXPECT_EQ(r.model, "");
  EXPECT_EQ(r.size, "");
  const auto& d = r.diffusion;
  EXPECT_FALSE(d.width || d.height || d.num_images || d.num_inference_steps || d.true_cfg_scale ||
               d.seed || d.negative_prompt || d.num_frames || d.guidance_scale);
}

TEST(ImageRequest, EveryField) {
  json b = minimal();
  b["model"] = "qwen-image";
  b["n"] = 3;
  b["size"] = "32x48";
  b["response_format"] = "b64_json";
  b["negative_prompt"] = "blurry";
  b["num_inference_steps"] = 3;
  b["true_cfg_scale"] = 4;
  b["seed"] = 11;
  const ImageRequest r = parse_image_request(b.dump());
  EXPECT_EQ(r.model, "qwen-image");
  EXPECT_EQ(r.size, "32x48");
  const auto& d = r.diffusion;
  EXPECT_EQ(d.width, 32);
  EXPECT_EQ(d.height, 48);
  EXPECT_EQ(d.num_images, 3);
  EXPECT_EQ(d.negative_prompt, "blurry");
  EXPECT_EQ(d.num_inference_steps, 3);
  EXPECT_EQ(d.true_cfg_scale, 4.0);
  EXPECT_EQ(d.seed, 11u);
}

TEST(ImageRequest, NullIsNotGiven) {
  json b = minimal();
  b["n"] = nullptr;
  b["size"] = nullptr;
  b["response_format"] = nullptr;
  const ImageRequest r = parse_image_request(b.dump());
  EXPECT_FALSE(r.diffusion.num_images || r.diffusion.width);
}

struct ErrorCase {
  std::string name;
  std::function<void(json&)> edit;  // applied to the minimal request
  std::string code, param, message;
};

std::vector<ErrorCase> error_cases() {
  return {
      {"not an object", [](json& b) { b = json::array({1}); }, "invalid_type", "",
       "invalid type for the request body: expected a JSON object, got an array"},
      {"no prompt", [](json& b) { b.erase("prompt"); }, "missing_field", "prompt",
       "'prompt' is required"},
      {"empty prompt", [](json& b) { b["prompt"] = ""; }, "invalid_value", "prompt",
       "invalid value for 'prompt': must not be empty"},
      {"prompt not text", [](json& b) { b["prompt"] = 7; }, "invalid_type", "prompt",
       "invalid type for 'prompt': expected a string, got an integer"},
      {"unknown field", [](json& b) { b["quality"] = "hd"; }, "unknown_field", "quality",
       "unknown field 'quality'"},
      {"a video field", [](json& b) { b["num_frames"] = 5; }, "unknown_field", "num_frames",
       "unknown field 'num_frames'"},
      {"url", [](json& b) { b["response_format"] = "url"; }, "unsupported", "response_format",
       "\"url\" is not supported: this server stores no image files; ask for \"b64_json\""},
      {"another format", [](json& b) { b["response_format"] = "png"; }, "invalid_value",
       "response_format", "invalid value for 'response_format': must be \"b64_json\", got 'png'"},
      {"n = 0", [](json& b) { b["n"] = 0; }, "invalid_value", "n",
       "invalid value for 'n': must be from 1 to 10, got 0"},
      {"n = 11", [](json& b) { b["n"] = 11; }, "invalid_value", "n",
       "invalid value for 'n': must be from 1 to 10, got 11"},
      {"n fractional", [](json& b) { b["n"] = 1.5; }, "invalid_type", "n",
       "invalid type for 'n': expected an integer, got a number"},
      {"n as text", [](json& b) { b["n"] = "2"; }, "invalid_type", "n",
       "invalid type for 'n': expected an integer, got a string"},
      {"size without x", [](json& b) { b["size"] = "1024"; }, "invalid_value", "size",
       "invalid value for 'size': must be \"WIDTHxHEIGHT\" (e.g. \"1024x1024\"), got '1024'"},
      {"size with letters", [](json& b) { b["size"] = "auto"; }, "invalid_value", "size",
       "invalid value for 'size': must be \"WIDTHxHEIGHT\" (e.g. \"1024x1024\"), got 'auto'"},
      {"size not multiple of 16", [](json& b) { b["size"] = "1000x1024"; }, "invalid_value", "size",
       "invalid value for 'size': width and height must be multiples of 16, got '1000x1024'"},
      {"size too large", [](json& b) { b["size"] = "8192x16"; }, "invalid_value", "size",
       "invalid value for 'size': width and height must be from 2 to 4096, got '8192x16'"},
      {"size not text", [](json& b) { b["size"] = 1024; }, "invalid_type", "size",
       "invalid type for 'size': expected a string, got an integer"},
      {"steps = 0", [](json& b) { b["num_inference_steps"] = 0; }, "invalid_value",
       "num_inference_steps",
       "invalid value for 'num_inference_steps': must be from 1 to 1000, got 0"},
      {"true_cfg_scale < 0", [](json& b) { b["true_cfg_scale"] = -1; }, "invalid_value",
       "true_cfg_scale", "invalid value for 'true_cfg_scale': must be from 0 to 100"},
      {"negative seed", [](json& b) { b["seed"] = -1; }, "invalid_value", "seed",
       "invalid value for 'seed': must be >= 0"},
      {"long negative prompt", [](json& b) { b["negative_prompt"] = std::string(70000, 'a'); },
       "invalid_value", "negative_prompt",
       "invalid value for 'negative_prompt': is 70000 bytes, at most 65536 are accepted"},
  };
}

TEST(ImageRequest, RefusalsNameTheField) {
  for (const ErrorCase& c : error_cases()) {
    SCOPED_TRACE(c.name);
    json b = minimal();
    c.edit(b);
    try {
      parse_image_request(b.dump());
      ADD_FAILURE() << "no error for " << b.dump().substr(0, 200);
    } catch (const ApiException& e) {
      EXPECT_EQ(e.error().status, 400);
      EXPECT_EQ(e.error().type, "invalid_request_error");
      EXPECT_EQ(e.error().code, c.code);
      EXPECT_EQ(e.error().param, c.param);
      EXPECT_EQ(e.error().message, c.message);
    }
  }
}

TEST(ImageRequest, NotJson) {
  try {
    parse_image_request("{\"prompt\": ");
    FAIL();
  } catch (const ApiException& e) {
    EXPECT_EQ(e.error().status, 400);
    EXPECT_EQ(e.error().code, "invalid_json");
  }
}

// An edit form: text fields as strings (numbers too), images as uploads.
std::vector<FormField> edit_form() {
  return {{"prompt", "make the fox blue", false},
          {"image", "\x89PNG-one", true},
          {"n", "2", false},
          {"size", "32x48", false},
          {"seed", "7", false},
          {"true_cfg_scale", "4.5", false},
          {"image[]", "\x89PNG-two", true}};
}

ApiError edit_error(const std::vector<FormField>& fields, int64_t max_images = 4) {
  try {
    parse_image_edit_form(fields, max_images);
  } catch (const ApiException& e) {
    return e.error();
  }
  ADD_FAILURE() << "no error";
  return {};
}

TEST(ImageEditForm, ImagesInOrderAndTheFieldsAsJson) {
  const ImageEditRequest e = parse_image_edit_form(edit_form(), 4);
  ASSERT_EQ(e.images.size(), 2u);
  EXPECT_EQ(e.images[0].data, "\x89PNG-one");
  EXPECT_EQ(e.images[1].data, "\x89PNG-two");
  EXPECT_EQ(e.request.prompt, "make the fox blue");
  const auto& d = e.request.diffusion;
  EXPECT_EQ(d.num_images, 2);
  EXPECT_EQ(d.width, 32);
  EXPECT_EQ(d.height, 48);
  EXPECT_EQ(d.seed, 7u);
  EXPECT_EQ(d.true_cfg_scale, 4.5);
  // A prompt of digits stays text.
  auto digits = edit_form();
  digits[0].value = "1984";
  EXPECT_EQ(parse_image_edit_form(digits, 4).request.prompt, "1984");
}

TEST(ImageEditForm, RefusalsNameTheField) {
  auto form = edit_form();
  EXPECT_EQ(edit_error(form, 1).param, "image");
  EXPECT_EQ(edit_error(form, 1).message,
            "invalid value for 'image': this model edits at most 1 image, got 2");
  std::vector<FormField> no_image = {{"prompt", "x", false}};
  EXPECT_EQ(edit_error(no_image).code, "missing_field");
  EXPECT_EQ(edit_error(no_image).param, "image");
  auto text_image = no_image;
  text_image.push_back({"image", "abc", false});
  EXPECT_EQ(edit_error(text_image).param, "image");
  auto empty = no_image;
  empty.push_back({"image", "", true});
  EXPECT_EQ(edit_error(empty).message, "invalid value for 'image': image 1 is an empty file");
  auto mask = edit_form();
  mask.push_back({"mask", "\x89PNG", true});
  EXPECT_EQ(edit_error(mask).param, "mask");
  EXPECT_EQ(edit_error(mask).code, "unsupported");
  auto other = edit_form();
  other.push_back({"reference", "data", true});
  EXPECT_EQ(edit_error(other).param, "reference");
  auto twice = edit_form();
  twice.push_back({"seed", "8", false});
  EXPECT_EQ(edit_error(twice).param, "seed");
  auto bad_n = edit_form();
  bad_n[2].value = "abc";
  EXPECT_EQ(edit_error(bad_n).param, "n");
  EXPECT_EQ(edit_error(bad_n).code, "invalid_type");
  auto unknown = edit_form();
  unknown.push_back({"quality", "hd", false});
  EXPECT_EQ(edit_error(unknown).code, "unknown_field");
  auto no_prompt = edit_form();
  no_prompt.erase(no_prompt.begin());
  EXPECT_EQ(edit_error(no_prompt).param, "prompt");
}

}  // namespace
}  // namespace omni::http
