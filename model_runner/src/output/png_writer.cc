// write_png and encode_png_bytes: 8-bit RGB PNGs through libpng, encoded in memory (and then, for
// write_png, written atomically).
// libpng reports errors by longjmp()ing out of its C frames: png_encode_rows, the function that
// calls setjmp(), holds only trivially destructible locals; the caller owns libpng's state
// through an RAII guard. The callbacks never throw (an exception must not cross libpng's C
// frames): they record the message and longjmp.
#include <png.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "cpu_offload/check.h"
#include "model_runner/output/frames_writer.h"
#include "output/atomic_file.h"
#include "output/frames_check.h"

namespace omni::models {
namespace {

namespace fs = std::filesystem;

struct PngSink {
  std::string bytes;
  char message[256] = {};
};

void png_on_error(png_structp png, png_const_charp message) {
  auto* sink = static_cast<PngSink*>(png_get_error_ptr(png));
  std::snprintf(sink->message, sizeof(sink->message), "%s", message);
  png_longjmp(png, 1);
}

void png_on_warning(png_structp, png_const_charp) {}

void png_append(png_structp png, png_bytep data, png_size_t length) {
  auto* sink = static_cast<PngSink*>(png_get_io_ptr(png));
  bool ok = true;
  try {
    sink->bytes.append(reinterpret_cast<const char*>(data), length);
  } catch (const std::bad_alloc&) {
    ok = false;
  }
  if (!ok) png_error(png, "out of memory");
}

void png_flush(png_structp) {}

struct PngWriteGuard {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~PngWriteGuard() {
    if (png != nullptr) png_destroy_write_struct(&png, info != nullptr ? &info : nullptr);
  }
};

// Header, rows, end. Returns false with sink->message set on error.
bool png_encode_rows(png_structp png, png_infop info, PngSink* sink, png_uint_32 width,
                     png_uint_32 height, png_bytepp rows) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_write_fn(png, sink, png_append, png_flush);
  png_set_IHDR(png, info, width, height, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  png_write_image(png, rows);
  png_write_end(png, info);
  return true;
}

// One [H, W, 3] uint8 frame as PNG bytes.
std::string encode_png(const at::Tensor& frame, const std::string& path) {
  const auto height = static_cast<png_uint_32>(frame.size(0));
  const auto width = static_cast<png_uint_32>(frame.size(1));
  std::vector<png_bytep> rows(height);
  auto* base = frame.data_ptr<uint8_t>();
  for (png_uint_32 y = 0; y < height; ++y) rows[y] = base + static_cast<size_t>(y) * width * 3;
  PngSink sink;
  PngWriteGuard guard;
  guard.png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &sink, png_on_error, png_on_warning);
  OMNI_CHECK(guard.png != nullptr, "cannot write PNG '", path, "': libpng: out of memory");
  guard.info = png_create_info_struct(guard.png);
  OMNI_CHECK(guard.info != nullptr, "cannot write PNG '", path, "': libpng: out of memory");
  if (!png_encode_rows(guard.png, guard.info, &sink, width, height, rows.data())) {
    OMNI_THROW("cannot write PNG '", path, "': libpng: ", sink.message);
  }
  return std::move(sink.bytes);
}

// `frames` checked and quantized as every PNG writer takes them: uint8 [F, H, W, 3].
at::Tensor png_pixels(const at::Tensor& frames, const char* who, const std::string& path) {
  const at::Tensor data = output::checked_frames(frames, who, path);
  OMNI_CHECK(data.size(1) <= PNG_UINT_31_MAX && data.size(2) <= PNG_UINT_31_MAX, who, " '", path,
             "': frames of ", data.size(1), "x", data.size(2), " are too large for PNG");
  return output::quantize_rgb8(data, who, path);
}

}  // namespace

std::vector<std::string> png_frame_paths(const std::string& path, int64_t count) {
  OMNI_CHECK(count > 0, "png_frame_paths '", path, "': need at least one frame, got ", count);
  if (count == 1) return {path};
  const fs::path target(path);
  const std::string stem = target.stem().string(), ext = target.extension().string();
  const size_t digits = std::max<size_t>(4, std::to_string(count - 1).size());
  std::vector<std::string> paths;
  paths.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const std::string number = std::to_string(i);
    std::string name = stem;
    name.append(1, '_').append(digits - number.size(), '0').append(number).append(ext);
    paths.push_back((target.parent_path() / name).string());
  }
  return paths;
}

std::vector<std::string> encode_png_bytes(const at::Tensor& frames) {
  const at::Tensor pixels = png_pixels(frames, "encode_png_bytes", "(in memory)");
  std::vector<std::string> pngs;
  pngs.reserve(static_cast<size_t>(pixels.size(0)));
  for (int64_t i = 0; i < pixels.size(0); ++i) pngs.push_back(encode_png(pixels[i], "(in memory)"));
  return pngs;
}

void write_png(const std::string& path, const at::Tensor& frames) {
  const at::Tensor pixels = png_pixels(frames, "write_png", path);
  const std::vector<std::string> paths = png_frame_paths(path, pixels.size(0));
  // Every frame is finished in its temporary file before any is renamed into place.
  std::vector<std::unique_ptr<output::AtomicFile>> files;
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string bytes = encode_png(pixels[static_cast<int64_t>(i)], paths[i]);
    files.push_back(std::make_unique<output::AtomicFile>(paths[i], "PNG"));
    files.back()->write_all(bytes.data(), bytes.size());
    files.back()->finish();
  }
  size_t published = 0;
  try {
    for (; published < files.size(); ++published) files[published]->publish();
  } catch (...) {
    for (size_t i = 0; i < published; ++i) std::remove(paths[i].c_str());
    throw;
  }
}

}  // namespace omni::models
