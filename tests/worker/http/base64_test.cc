// Base64 (RFC 4648) and data: URLs (RFC 2397).
#include "worker/http/base64.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "worker/http/api_error.h"

namespace omni::http {
namespace {

TEST(Base64, Rfc4648Vectors) {
  const std::pair<std::string, std::string> vectors[] = {{"", ""},
                                                         {"f", "Zg=="},
                                                         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"},
                                                         {"foob", "Zm9vYg=="},
                                                         {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : vectors) {
    EXPECT_EQ(base64_encode(plain), encoded);
    const auto decoded = base64_decode(encoded);
    ASSERT_TRUE(decoded.has_value()) << encoded;
    EXPECT_EQ(*decoded, plain);
  }
}

TEST(Base64, RoundTripsRandomBytesOfEveryLength) {
  std::mt19937 rng(7);
  for (size_t length = 0; length <= 300; ++length) {
    std::string bytes(length, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() & 0xFF);
    const std::string encoded = base64_encode(bytes);
    EXPECT_EQ(encoded.size(), (length + 2) / 3 * 4);
    const auto decoded = base64_decode(encoded);
    ASSERT_TRUE(decoded.has_value()) << length;
    EXPECT_EQ(*decoded, bytes) << length;
  }
}

TEST(Base64, AllByteValuesUseTheStandardAlphabet) {
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes.push_back(static_cast<char>(i));
  const std::string encoded = base64_encode(bytes);
  EXPECT_NE(encoded.find('+'), std::string::npos);
  EXPECT_NE(encoded.find('/'), std::string::npos);
  EXPECT_EQ(base64_decode(encoded), bytes);
}

TEST(Base64, RejectsWhatIsNotStrictBase64) {
  for (const char* bad : {
           "Zm9",       // truncated: not a multiple of 4
           "Zg",        // padding left out
           "Zm9v\n",    // a line break
           "Zm 9v",     // whitespace
           " Zm9v",     //
           "Zm9-",      // the URL-safe alphabet
           "Zm9_",      //
           "Zm9*",      // outside any alphabet
           "Z===",      // three '=' can never be
           "====",      //
           "Zg==Zg==",  // padding in the middle
           "Z=g=",      //
           "Zh==",      // unused bits set ("Zg==" is the only encoding of "f")
           "Zm9=",      // likewise ("Zm8=")
       }) {
    EXPECT_FALSE(base64_decode(bad).has_value()) << bad;
  }
  EXPECT_FALSE(base64_decode(std::string("Zm9v\0\0\0\0", 8)).has_value());
}

ApiError data_url_error(const std::string& url) {
  try {
    parse_data_url(url, "messages[0].content[1].image_url.url");
  } catch (const ApiException& e) {
    return e.error();
  }
  ADD_FAILURE() << "no error for " << url;
  return {};
}

TEST(DataUrl, DecodesBase64AndPercentEncodedData) {
  const DataUrl a = parse_data_url("data:image/png;base64," + base64_encode("\x89PNG"), "p");
  EXPECT_EQ(a.media_type, "image/png");
  EXPECT_EQ(a.data, "\x89PNG");
  // Parameters are ignored, the media type is lower case, the scheme any case.
  const DataUrl b = parse_data_url("DATA:Audio/WAV;name=x.wav;base64,Zm9v", "p");
  EXPECT_EQ(b.media_type, "audio/wav");
  EXPECT_EQ(b.data, "foo");
  const DataUrl c = parse_data_url("data:,a%20b%2Cc", "p");
  EXPECT_EQ(c.media_type, "");
  EXPECT_EQ(c.data, "a b,c");
  const DataUrl d = parse_data_url("data:text/plain;charset=utf-8;base64,", "p");
  EXPECT_EQ(d.media_type, "text/plain");
  EXPECT_EQ(d.data, "");
}

TEST(DataUrl, RefusesRemoteUrls) {
  for (const char* url : {"https://example.com/a.png", "http://10.0.0.1/a.wav",
                          "file:///etc/passwd", "/tmp/a.png", ""}) {
    const ApiError e = data_url_error(url);
    EXPECT_EQ(e.status, 400) << url;
    EXPECT_EQ(e.code, "remote_url") << url;
    EXPECT_EQ(e.param, "messages[0].content[1].image_url.url") << url;
    EXPECT_NE(e.message.find("fetching URLs is not supported"), std::string::npos) << e.message;
  }
}

TEST(DataUrl, RefusesBadPayloads) {
  for (const char* url : {"data:image/png;base64,Zm9", "data:image/png;base64,Zm9-",
                          "data:image/png;base64,Zm9v Zm9v"}) {
    const ApiError e = data_url_error(url);
    EXPECT_EQ(e.code, "invalid_base64") << url;
    EXPECT_EQ(e.param, "messages[0].content[1].image_url.url");
  }
  for (const char* url :
       {"data:image/png;base64", "data:a%2", "data:,%zz", "data:image/png;base64;x=y,Zm9v"}) {
    EXPECT_EQ(data_url_error(url).code, "invalid_value") << url;
  }
}

}  // namespace
}  // namespace omni::http
