// Reading back a float32 C-order .npy as numpy.save writes it (what `generate --output X.npy`
// writes), for the end-to-end tests.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace omni::testing {

inline at::Tensor read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_GE(bytes.size(), 10u) << path;
  if (bytes.size() < 10) return {};
  EXPECT_EQ(bytes.substr(0, 6), "\x93NUMPY");
  const size_t header_len = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
  const std::string header = bytes.substr(10, header_len);
  EXPECT_NE(header.find("'descr': '<f4'"), std::string::npos) << header;
  const auto open = header.find("'shape': (") + 10;
  std::vector<int64_t> shape;
  for (size_t i = open; header[i] != ')';) {
    size_t used = 0;
    shape.push_back(std::stoll(header.substr(i), &used));
    i += used;
    while (header[i] == ',' || header[i] == ' ') ++i;
  }
  auto t = at::empty(shape, at::kFloat);
  EXPECT_EQ(bytes.size() - 10 - header_len, static_cast<size_t>(t.nbytes()));
  std::memcpy(t.data_ptr<float>(), bytes.data() + 10 + header_len, t.nbytes());
  return t;
}

}  // namespace omni::testing
