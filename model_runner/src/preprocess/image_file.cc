// PNG (libpng) and JPEG (libjpeg-turbo) decoding into the RGB image Pillow and transformers'
// convert_to_rgb produce.
//
// Both libraries report errors by longjmp()ing out of their own C frames. The functions that
// call setjmp() (png_read_layout, png_decode_rows, jpeg_read_layout, jpeg_start,
// jpeg_decode_rows) hold only trivially destructible locals and write their results through
// pointers to objects that live in the caller, which also owns the library's state through an
// RAII guard: a longjmp then skips no destructor, and an exception (std::bad_alloc from a
// buffer) still frees the decoder. The callbacks the libraries call never throw; they record
// the message and longjmp.
#include <cstdio>  // before jpeglib.h, which uses FILE

#include <fcntl.h>
#include <jerror.h>  // JWRN_JPEG_EOF
#include <jpeglib.h>
#include <png.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csetjmp>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cpu_offload/check.h"
#include "model_runner/preprocess/image.h"

namespace omni::models {
namespace {

// Pillow refuses images above twice Image.MAX_IMAGE_PIXELS (a "decompression bomb").
constexpr uint64_t kMaxPixels = 2ull * (1024ull * 1024 * 1024 / 4 / 3);

std::string in_image(const std::string& name) { return "image '" + name + "': "; }

void check_dimensions(uint64_t width, uint64_t height, const std::string& name) {
  if (width == 0 || height == 0)
    OMNI_THROW(in_image(name), "empty image (", width, "x", height, ")");
  if (width * height > kMaxPixels) {
    OMNI_THROW(in_image(name), width, "x", height, " pixels exceed the limit of ", kMaxPixels,
               " (Pillow's decompression-bomb limit)");
  }
}

// transformers' convert_to_rgb for an image with transparency: Image.alpha_composite onto an
// opaque white background, in Pillow's fixed-point arithmetic (AlphaComposite.c, 7 precision
// bits, division by 255 as ((x >> 8) + x) >> 8). Checked against Pillow for all 256 x 256
// (value, alpha) pairs.
inline uint8_t over_white(uint32_t value, uint32_t alpha) {
  if (alpha == 0) return 255;
  constexpr uint32_t kBits = 7;
  const uint32_t out_a255 = alpha * 255 + 255 * (255 - alpha);
  const uint32_t coef1 = alpha * 255 * 255 * (1u << kBits) / out_a255;
  const uint32_t coef2 = 255 * (1u << kBits) - coef1;
  const uint32_t tmp = value * coef1 + 255 * coef2 + (0x80u << kBits);
  return static_cast<uint8_t>(((((tmp >> 8) + tmp) >> 8)) >> kBits);
}

// ---------------------------------------------------------------------------------------- PNG

struct PngSource {
  const uint8_t* data;
  size_t size;
  size_t pos;
  char message[256];
};

void png_on_error(png_structp png, png_const_charp message) {
  auto* src = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(src->message, sizeof(src->message), "%s", message);
  png_longjmp(png, 1);
}

void png_on_warning(png_structp, png_const_charp) {}  // Pillow ignores what libpng warns about

void png_read_memory(png_structp png, png_bytep out, png_size_t length) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (length > src->size - src->pos) png_error(png, "truncated file (unexpected end of data)");
  std::memcpy(out, src->data + src->pos, length);
  src->pos += length;
}

// libpng's read and info structures, destroyed on every way out.
struct PngGuard {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~PngGuard() {
    if (png != nullptr) png_destroy_read_struct(&png, info != nullptr ? &info : nullptr, nullptr);
  }
};

// What the header says and how the rows come out of libpng after the transformations.
struct PngLayout {
  png_uint_32 width, height;
  int file_bit_depth;
  int bit_depth;   // of the rows handed back: 8 or 16
  int color_type;  // of the file
  int channels;    // of the rows handed back
  size_t row_bytes;
  bool has_key;  // tRNS holds a transparent gray value or RGB colour
  png_uint_16 key_gray, key_red, key_green, key_blue;
};

// Phase 1: signature, header, transformations. Returns false with src->message set on error.
bool png_read_layout(png_structp png, png_infop info, PngSource* src, PngLayout* layout) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_read_fn(png, src, png_read_memory);
  png_read_info(png, info);
  int interlace = 0;
  png_get_IHDR(png, info, &layout->width, &layout->height, &layout->bit_depth, &layout->color_type,
               &interlace, nullptr, nullptr);
  layout->file_bit_depth = layout->bit_depth;
  layout->has_key = false;
  if (png_get_valid(png, info, PNG_INFO_tRNS) != 0 &&
      (layout->color_type == PNG_COLOR_TYPE_GRAY || layout->color_type == PNG_COLOR_TYPE_RGB)) {
    png_color_16p key = nullptr;
    png_get_tRNS(png, info, nullptr, nullptr, &key);
    if (key != nullptr) {
      layout->has_key = true;
      layout->key_gray = key->gray;
      layout->key_red = key->red;
      layout->key_green = key->green;
      layout->key_blue = key->blue;
    }
  }
  // Palettes become RGB (RGBA when tRNS gives palette entries an alpha), and 1/2/4-bit gray
  // becomes 8-bit scaled to 0..255 as Pillow's "1" / "L;2" / "L;4" unpackers do. Transparent
  // gray and RGB keys are applied below, as Pillow applies them (after its own conversion).
  if (layout->color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (layout->color_type == PNG_COLOR_TYPE_GRAY && layout->bit_depth < 8) {
    png_set_expand_gray_1_2_4_to_8(png);
  }
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  layout->bit_depth = png_get_bit_depth(png, info);
  layout->channels = png_get_channels(png, info);
  layout->row_bytes = png_get_rowbytes(png, info);
  return true;
}

// Phase 2: the pixels, into `rows` (which point into a buffer the caller sized).
bool png_decode_rows(png_structp png, png_bytepp rows) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_image(png, rows);
  return true;  // png_read_end is not needed: like Pillow, ignore what follows the pixels
}

RgbImage decode_png(const uint8_t* data, size_t size, const std::string& name) {
  PngSource src{data, size, 0, {}};
  PngGuard guard;
  guard.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_on_error, png_on_warning);
  OMNI_CHECK(guard.png != nullptr, in_image(name), "libpng could not allocate a reader");
  guard.info = png_create_info_struct(guard.png);
  OMNI_CHECK(guard.info != nullptr, in_image(name), "libpng could not allocate a reader");

  PngLayout layout{};
  if (!png_read_layout(guard.png, guard.info, &src, &layout)) {
    OMNI_THROW(in_image(name), "invalid PNG: ", src.message);
  }
  check_dimensions(layout.width, layout.height, name);
  const int sample_bytes = layout.bit_depth == 16 ? 2 : 1;
  OMNI_CHECK(layout.bit_depth == 8 || layout.bit_depth == 16, in_image(name),
             "unexpected PNG bit depth ", layout.bit_depth, " after expansion");
  OMNI_CHECK(layout.row_bytes == static_cast<size_t>(layout.width) * layout.channels * sample_bytes,
             in_image(name), "unexpected PNG row size ", layout.row_bytes);

  std::vector<uint8_t> raw(layout.row_bytes * layout.height);
  std::vector<png_bytep> rows(layout.height);
  for (png_uint_32 y = 0; y < layout.height; ++y) rows[y] = raw.data() + y * layout.row_bytes;
  if (!png_decode_rows(guard.png, rows.data())) {
    OMNI_THROW(in_image(name), "corrupt PNG: ", src.message);
  }

  // Samples as Pillow reads them: 16-bit ones are big-endian and Pillow keeps the high byte
  // ("RGB;16B", "RGBA;16B", "LA;16B"), except 16-bit gray, opened as "I;16" and clamped to 255
  // when converted to RGB.
  const bool gray = layout.channels <= 2;
  const bool clamp16 = layout.bit_depth == 16 && layout.channels == 1;
  auto sample = [&](const uint8_t* p) -> uint32_t {
    if (sample_bytes == 1) return p[0];
    if (clamp16) return std::min<uint32_t>((uint32_t{p[0]} << 8) | p[1], 255);
    return p[0];
  };
  // Pillow's transparent key ("transparency" in info) is the raw tRNS value compared with the
  // converted 8-bit pixel; mode "1" maps it to 0 / 255 first.
  uint32_t key_gray = layout.key_gray;
  if (layout.file_bit_depth == 1) key_gray = key_gray != 0 ? 255 : 0;
  RgbImage image;
  image.height = layout.height;
  image.width = layout.width;
  image.pixels.resize(static_cast<size_t>(layout.width) * layout.height * 3);
  const bool has_alpha = layout.channels == 2 || layout.channels == 4;
  for (png_uint_32 y = 0; y < layout.height; ++y) {
    const uint8_t* in = rows[y];
    uint8_t* out = image.pixels.data() + static_cast<size_t>(y) * layout.width * 3;
    for (png_uint_32 x = 0; x < layout.width; ++x, in += layout.channels * sample_bytes, out += 3) {
      uint32_t r, g, b, a = 255;
      if (gray) {
        r = g = b = sample(in);
        if (has_alpha) a = sample(in + sample_bytes);
      } else {
        r = sample(in);
        g = sample(in + sample_bytes);
        b = sample(in + 2 * sample_bytes);
        if (has_alpha) a = sample(in + 3 * sample_bytes);
      }
      if (layout.has_key) {
        const bool transparent =
            gray ? r == key_gray
                 : r == layout.key_red && g == layout.key_green && b == layout.key_blue;
        if (transparent) a = 0;
      }
      if (a != 255) {
        r = over_white(r, a);
        g = over_white(g, a);
        b = over_white(b, a);
      }
      out[0] = static_cast<uint8_t>(r);
      out[1] = static_cast<uint8_t>(g);
      out[2] = static_cast<uint8_t>(b);
    }
  }
  return image;
}

// --------------------------------------------------------------------------------------- JPEG

struct JpegErrors {
  jpeg_error_mgr mgr;  // first member: libjpeg hands back a pointer to it
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool truncated;
};

void jpeg_on_error(j_common_ptr cinfo) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, errors->message);
  std::longjmp(errors->jump, 1);
}

// Warnings (corrupt but decodable data) are ignored as Pillow ignores them, except running out
// of data: libjpeg then pads with gray, where Pillow raises "image file is truncated".
void jpeg_on_message(j_common_ptr cinfo, int level) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) errors->truncated = true;
}

struct JpegGuard {
  jpeg_decompress_struct cinfo{};
  bool created = false;
  ~JpegGuard() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
};

// Phase 1: header and output colour space. Returns false with errors->message set on error.
bool jpeg_read_layout(JpegGuard* guard, JpegErrors* errors, const uint8_t* data, size_t size) {
  jpeg_decompress_struct* cinfo = &guard->cinfo;
  cinfo->err = jpeg_std_error(&errors->mgr);
  errors->mgr.error_exit = jpeg_on_error;
  errors->mgr.emit_message = jpeg_on_message;
  if (setjmp(errors->jump)) return false;
  guard->created = true;  // jpeg_destroy_decompress is safe on a zeroed, half-created struct
  jpeg_create_decompress(cinfo);
  jpeg_mem_src(cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(cinfo, TRUE);
  // Pillow decodes YCbCr and RGB JPEGs as "RGB" and grayscale ones as "L", with libjpeg's
  // defaults (islow IDCT, fancy upsampling).
  if (cinfo->jpeg_color_space == JCS_GRAYSCALE) {
    cinfo->out_color_space = JCS_GRAYSCALE;
  } else if (cinfo->jpeg_color_space == JCS_YCbCr || cinfo->jpeg_color_space == JCS_RGB) {
    cinfo->out_color_space = JCS_RGB;
  }
  return true;
}

// Phase 2: decompress into `out` (sized by the caller for output_components channels).
bool jpeg_decode_rows(JpegGuard* guard, JpegErrors* errors, uint8_t* out, size_t row_bytes) {
  jpeg_decompress_struct* cinfo = &guard->cinfo;
  if (setjmp(errors->jump)) return false;
  while (cinfo->output_scanline < cinfo->output_height) {
    JSAMPROW row = out + static_cast<size_t>(cinfo->output_scanline) * row_bytes;
    jpeg_read_scanlines(cinfo, &row, 1);
  }
  jpeg_finish_decompress(cinfo);
  return true;
}

bool jpeg_start(JpegGuard* guard, JpegErrors* errors) {
  if (setjmp(errors->jump)) return false;
  jpeg_start_decompress(&guard->cinfo);
  return true;
}

RgbImage decode_jpeg(const uint8_t* data, size_t size, const std::string& name) {
  JpegGuard guard;
  JpegErrors errors{};
  if (!jpeg_read_layout(&guard, &errors, data, size)) {
    OMNI_THROW(in_image(name), "invalid JPEG: ", errors.message);
  }
  const J_COLOR_SPACE space = guard.cinfo.jpeg_color_space;
  if (space == JCS_CMYK || space == JCS_YCCK) {
    OMNI_THROW(in_image(name), "unsupported format: CMYK JPEG (convert it to RGB first)");
  }
  OMNI_CHECK(space == JCS_GRAYSCALE || space == JCS_YCbCr || space == JCS_RGB, in_image(name),
             "unsupported format: JPEG colour space ", static_cast<int>(space));
  check_dimensions(guard.cinfo.image_width, guard.cinfo.image_height, name);
  if (!jpeg_start(&guard, &errors)) OMNI_THROW(in_image(name), "corrupt JPEG: ", errors.message);
  if (errors.truncated) OMNI_THROW(in_image(name), "truncated JPEG (unexpected end of data)");

  const int64_t width = guard.cinfo.output_width, height = guard.cinfo.output_height;
  const int channels = guard.cinfo.output_components;
  OMNI_CHECK(channels == 1 || channels == 3, in_image(name), "unexpected JPEG output with ",
             channels, " components");
  std::vector<uint8_t> decoded(static_cast<size_t>(width * height * channels));
  if (!jpeg_decode_rows(&guard, &errors, decoded.data(), static_cast<size_t>(width * channels))) {
    OMNI_THROW(in_image(name), "corrupt JPEG: ", errors.message);
  }
  if (errors.truncated) OMNI_THROW(in_image(name), "truncated JPEG (unexpected end of data)");

  RgbImage image;
  image.height = height;
  image.width = width;
  if (channels == 3) {
    image.pixels = std::move(decoded);
  } else {
    image.pixels.resize(static_cast<size_t>(width * height * 3));
    for (size_t i = 0; i < decoded.size(); ++i) {
      image.pixels[3 * i] = image.pixels[3 * i + 1] = image.pixels[3 * i + 2] = decoded[i];
    }
  }
  return image;
}

template <size_t N>  // N counts the literal's terminating NUL, which is not compared
bool starts_with(const uint8_t* data, size_t size, const char (&magic)[N], size_t offset = 0) {
  return size >= offset + N - 1 && std::memcmp(data + offset, magic, N - 1) == 0;
}

}  // namespace

RgbImage decode_image(const uint8_t* data, size_t size, const std::string& name) {
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (size >= 8 && std::memcmp(data, kPng, 8) == 0) return decode_png(data, size, name);
  if (size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) {
    return decode_jpeg(data, size, name);
  }
  if (size == 0) OMNI_THROW(in_image(name), "empty file");
  const char* format = nullptr;
  if (starts_with(data, size, "GIF87a") || starts_with(data, size, "GIF89a")) format = "GIF";
  if (starts_with(data, size, "RIFF") && starts_with(data, size, "WEBP", 8)) format = "WebP";
  if (starts_with(data, size, "BM")) format = "BMP";
  if (starts_with(data, size, "II*\0") || starts_with(data, size, "MM\0*")) format = "TIFF";
  if (starts_with(data, size, "ftyp", 4)) format = "HEIF/AVIF";
  if (format != nullptr) {
    OMNI_THROW(in_image(name), "unsupported format: ", format, " (only PNG and JPEG are read)");
  }
  OMNI_THROW(in_image(name), "not a PNG or JPEG image (unrecognized leading bytes)");
}

RgbImage read_image_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    OMNI_THROW("cannot open image '", path, "': ", std::strerror(err));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    OMNI_THROW("cannot read image '", path, "': not a regular file");
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      OMNI_THROW("cannot read image '", path, "': ", std::strerror(err));
    }
    if (n == 0) break;  // the file shrank meanwhile: decode what is there
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  return decode_image(bytes.data(), bytes.size(), path);
}

}  // namespace omni::models
