// write_npy: NumPy's .npy format 1.0 as numpy.lib.format writes it (numpy >= 1.24): magic,
// version, little-endian header length, then the header dict's repr, room for the first axis to
// grow, spaces up to a multiple of 64 bytes and '\n'; then the float32 data in C order.
#include <ATen/ATen.h>

#include <cstdint>
#include <string>

#include "cpu_offload/check.h"
#include "model_runner/output/frames_writer.h"
#include "output/atomic_file.h"
#include "output/frames_check.h"

namespace omni::models {
namespace {

// numpy.lib.format: ARRAY_ALIGN and GROWTH_AXIS_MAX_DIGITS (spare spaces so that the shape's
// first axis can be rewritten in place with up to 21 digits).
constexpr size_t kAlign = 64;
constexpr size_t kGrowthDigits = 21;
constexpr size_t kMagicLen = 8;  // "\x93NUMPY" + major + minor

std::string npy_header(const at::IntArrayRef shape) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) {
    dict += std::to_string(shape[i]);
    dict += i + 1 < shape.size() ? ", " : (shape.size() == 1 ? ",)" : ")");
  }
  dict += ", }";
  const size_t first_digits = std::to_string(shape[0]).size();
  dict.append(kGrowthDigits > first_digits ? kGrowthDigits - first_digits : 0, ' ');
  // numpy pads a full kAlign when already aligned (padlen = 64 - (n % 64)).
  const size_t pad = kAlign - (kMagicLen + 2 + dict.size() + 1) % kAlign;
  dict.append(pad, ' ');
  dict += '\n';
  OMNI_CHECK(dict.size() <= 0xffff, "NPY header of ", dict.size(), " bytes needs format 2.0");
  std::string out("\x93NUMPY\x01\x00", kMagicLen);
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>(dict.size() >> 8);
  return out + dict;
}

}  // namespace

void write_npy(const std::string& path, const at::Tensor& frames) {
  const at::Tensor data = output::checked_frames(frames, "write_npy", path);
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "'<f4' is written from host floats");
  const std::string header = npy_header(data.sizes());
  output::AtomicFile file(path, "NPY");
  file.write_all(header.data(), header.size());
  file.write_all(data.data_ptr<float>(), static_cast<size_t>(data.numel()) * sizeof(float));
  file.commit();
}

}  // namespace omni::models
