// PNG (libpng) and JPEG (libjpeg-turbo) decoding into the RGB image that transformers'
// load_image(path) returns: Image.open, ImageOps.exif_transpose, Image.convert("RGB") (Pillow 13).
// That is what Hugging Face's chat template hands the image processor for a {"type": "image",
// "path" | "url" | "image": ...} entry (processor -> image_processor.fetch_images ->
// load_image), so the processor's own convert_to_rgb, which composites transparency onto white,
// never sees an alpha channel on that path: convert("RGB") drops alpha and transparent keys.
//
// Both libraries report errors by longjmp()ing out of their own C frames. The functions that
// call setjmp() (png_read_layout, png_decode_rows, png_read_trailer, jpeg_read_layout,
// jpeg_start, jpeg_decode_rows) hold only trivially destructible locals and write their results
// through pointers to objects that live in the caller, which also owns the library's state
// through an RAII guard: a longjmp then skips no destructor, and an exception (std::bad_alloc
// from a buffer) still frees the decoder. The callbacks the libraries call never throw; they
// record the message and longjmp.
#include <cstdio>  // before jpeglib.h, which uses FILE

#include <fcntl.h>
#include <jerror.h>  // JWRN_JPEG_EOF
#include <jpeglib.h>
#include <png.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <csetjmp>
#include <cstdint>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <string_view>
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

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

std::string_view as_view(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// -------------------------------------------------------------------------------- orientation
//
// ImageOps.exif_transpose(image) reads image.getexif()'s Orientation tag (274): EXIF from the
// file (a JPEG APP1 "Exif" segment, a PNG eXIf chunk, or a PNG text chunk "Raw profile type
// exif" in hex), or when the EXIF holds no such tag, the first `tiff:Orientation="N"` /
// `<tiff:Orientation>N` in the XMP packet. Values 2..8 select a transposition; anything else
// (1, 0, 9, a string, ...) none. The functions below follow Pillow 13's parsing step by step,
// including where it raises (then the image does not load in Python either, and we throw).

struct ExifTag {
  enum Kind { kAbsent, kPresent, kInvalid } kind = kAbsent;
  int orientation = 1;        // kPresent: 2..8, or 1 for a value selecting no transposition
  const char* why = nullptr;  // kInvalid: what Pillow fails on
};

uint64_t read_uint(const uint8_t* p, int bytes, bool big_endian) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    const int shift = 8 * (big_endian ? bytes - 1 - i : i);
    v |= uint64_t{p[i]} << shift;
  }
  return v;
}

// The bytes per value of the TIFF field types Pillow's ImageFileDirectory_v2 loads (byte,
// ascii, short, long, rational, sbyte, undefined, sshort, slong, srational, float, double, ifd,
// long8); 0 for the types it skips.
int tiff_unit_size(uint16_t type) {
  static constexpr int kSize[17] = {0, 1, 1, 2, 4, 8, 1, 1, 2, 4, 8, 4, 8, 4, 0, 0, 8};
  return type < 17 ? kSize[type] : 0;
}

// The Orientation value as Pillow compares it with the keys 2..8 of exif_transpose's table: the
// first value of the field (Pillow warns and keeps the first when there are more), numbers
// compared by value (6.0 and the rational 12/2 select 6), bytes and strings never match.
int orientation_value(uint16_t type, const uint8_t* p, bool big_endian) {
  auto pick = [](double v) {
    return v >= 2 && v <= 8 && v == std::floor(v) ? static_cast<int>(v) : 1;
  };
  switch (type) {
    case 3:
    case 4:
    case 13:
    case 16: {
      const uint64_t v = read_uint(p, tiff_unit_size(type), big_endian);
      return v >= 2 && v <= 8 ? static_cast<int>(v) : 1;
    }
    case 6:
      return pick(static_cast<int8_t>(p[0]));
    case 8:
      return pick(static_cast<int16_t>(read_uint(p, 2, big_endian)));
    case 9:
      return pick(static_cast<int32_t>(read_uint(p, 4, big_endian)));
    case 11: {
      const auto bits = static_cast<uint32_t>(read_uint(p, 4, big_endian));
      float f;
      std::memcpy(&f, &bits, sizeof(f));
      return pick(f);
    }
    case 12: {
      const uint64_t bits = read_uint(p, 8, big_endian);
      double d;
      std::memcpy(&d, &bits, sizeof(d));
      return pick(d);
    }
    case 5:
    case 10: {  // IFDRational: n / 0 is NaN, otherwise an exact fraction
      int64_t num = static_cast<int64_t>(read_uint(p, 4, big_endian));
      int64_t den = static_cast<int64_t>(read_uint(p + 4, 4, big_endian));
      if (type == 10) {
        num = static_cast<int32_t>(num);
        den = static_cast<int32_t>(den);
      }
      for (int k = 2; k <= 8 && den != 0; ++k) {
        if (num == k * den) return k;
      }
      return 1;
    }
    default:
      return 1;  // byte / undefined (bytes), ascii (str)
  }
}

// Pillow's Exif.load(data) followed by Exif.get(274): one or two leading "Exif\0\0" are dropped;
// an empty block holds no tags; a block that does not start with a TIFF byte-order mark, is
// shorter than a TIFF header, or claims BigTIFF makes Pillow raise. IFD0 is read as
// ImageFileDirectory_v2.load reads it: the first entry of a tag wins, fields of unknown types or
// with no values are skipped, so is a field whose data would overrun the block's size in total,
// and reading stops (keeping what it has) where an entry or a field's data runs past the end.
ExifTag exif_orientation(std::string_view exif) {
  for (int i = 0; i < 2 && starts_with(exif, std::string_view("Exif\0\0", 6)); ++i) {
    exif.remove_prefix(6);
  }
  if (exif.empty()) return {};
  const auto* d = reinterpret_cast<const uint8_t*>(exif.data());
  const size_t size = exif.size();
  static const std::array<std::string_view, 6> kPrefixes = {
      std::string_view("MM\0*", 4), std::string_view("II*\0", 4), std::string_view("MM*\0", 4),
      std::string_view("II\0*", 4), std::string_view("MM\0+", 4), std::string_view("II+\0", 4)};
  if (std::none_of(kPrefixes.begin(), kPrefixes.end(),
                   [&](std::string_view p) { return starts_with(exif, p); })) {
    return {ExifTag::kInvalid, 1, "EXIF data is not a TIFF structure"};
  }
  // Pillow reads the IFD offset from the first 8 bytes; for BigTIFF ("II+" only: Pillow tests
  // the third byte) it looks for 8 more bytes that it never read, and fails.
  if (size < 8) return {ExifTag::kInvalid, 1, "EXIF data shorter than a TIFF header"};
  if (d[2] == '+') return {ExifTag::kInvalid, 1, "BigTIFF EXIF data"};
  const bool big = d[0] == 'M';
  const uint64_t ifd = read_uint(d + 4, 4, big);
  if (ifd + 2 > size) return {};
  const uint64_t count = read_uint(d + ifd, 2, big);
  uint64_t pos = ifd + 2, total = 0;
  std::set<uint16_t> kept;
  for (uint64_t i = 0; i < count; ++i, pos += 12) {
    if (pos + 12 > size) return {};
    const auto tag = static_cast<uint16_t>(read_uint(d + pos, 2, big));
    const auto type = static_cast<uint16_t>(read_uint(d + pos + 2, 2, big));
    const uint64_t values = read_uint(d + pos + 4, 4, big);
    if (kept.count(tag) != 0) continue;
    const int unit = tiff_unit_size(type);
    if (unit == 0) continue;
    const uint64_t bytes = values * unit;
    const uint8_t* field = d + pos + 8;
    if (bytes > 4) {
      const uint64_t offset = read_uint(field, 4, big);
      total += bytes;
      if (total > size) continue;            // "Tag data larger than file": skipped
      if (offset + bytes > size) return {};  // a short read ends the directory
      field = d + offset;
    }
    if (bytes == 0) continue;
    kept.insert(tag);
    if (tag == 274) return {ExifTag::kPresent, orientation_value(type, field, big), nullptr};
  }
  return {};
}

// Image.getexif()'s XMP fallback: re.search(r'tiff:Orientation(="|>)([0-9])', xmp).
std::optional<int> xmp_orientation(std::string_view xmp) {
  constexpr std::string_view kKey = "tiff:Orientation";
  for (size_t at = xmp.find(kKey); at != std::string_view::npos; at = xmp.find(kKey, at + 1)) {
    size_t p = at + kKey.size();
    if (p < xmp.size() && xmp[p] == '>') {
      p += 1;
    } else if (p + 1 < xmp.size() && xmp[p] == '=' && xmp[p + 1] == '"') {
      p += 2;
    } else {
      continue;
    }
    if (p < xmp.size() && xmp[p] >= '0' && xmp[p] <= '9') return xmp[p] - '0';
  }
  return std::nullopt;
}

// exif_transpose's Image.transpose: 2 FLIP_LEFT_RIGHT, 3 ROTATE_180, 4 FLIP_TOP_BOTTOM,
// 5 TRANSPOSE, 6 ROTATE_270 (a quarter turn clockwise), 7 TRANSVERSE, 8 ROTATE_90. Output pixel
// (x, y) comes from (y, x) when the axes swap (5..8), then mirrored in x and / or y.
RgbImage apply_orientation(RgbImage image, int orientation) {
  if (orientation < 2 || orientation > 8) return image;
  const bool swap = orientation >= 5;
  const bool mirror_x =
      orientation == 2 || orientation == 3 || orientation == 7 || orientation == 8;
  const bool mirror_y =
      orientation == 3 || orientation == 4 || orientation == 6 || orientation == 7;
  const int64_t h = image.height, w = image.width;
  RgbImage out;
  out.height = swap ? w : h;
  out.width = swap ? h : w;
  out.pixels.resize(image.pixels.size());
  for (int64_t y = 0; y < out.height; ++y) {
    for (int64_t x = 0; x < out.width; ++x) {
      int64_t sx = swap ? y : x, sy = swap ? x : y;
      if (mirror_x) sx = w - 1 - sx;
      if (mirror_y) sy = h - 1 - sy;
      std::memcpy(&out.pixels[(y * out.width + x) * 3], &image.pixels[(sy * w + sx) * 3], 3);
    }
  }
  return out;
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
  int bit_depth;  // of the rows handed back: 8 or 16
  int channels;   // of the rows handed back
  size_t row_bytes;
};

// Phase 1: signature, header, transformations. Returns false with src->message set on error.
bool png_read_layout(png_structp png, png_infop info, PngSource* src, PngLayout* layout) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_read_fn(png, src, png_read_memory);
  png_read_info(png, info);
  // Pillow checks the CRC of every chunk before the image data (libpng too, for the critical
  // ones; the ancillary ones are checked in walk_png) but not those of IDAT and after: neither
  // does libpng from here on.
  png_set_crc_action(png, PNG_CRC_QUIET_USE, PNG_CRC_QUIET_USE);
  int color_type = 0;
  png_get_IHDR(png, info, &layout->width, &layout->height, &layout->bit_depth, &color_type, nullptr,
               nullptr, nullptr);
  // Palettes become RGB (RGBA when tRNS gives palette entries an alpha, which convert("RGB")
  // drops again), and 1/2/4-bit gray becomes 8-bit scaled to 0..255 as Pillow's "1" / "L;2" /
  // "L;4" unpackers do. A tRNS key (a transparent gray value or RGB colour) changes no pixel:
  // convert("RGB") ignores it.
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color_type == PNG_COLOR_TYPE_GRAY && layout->bit_depth < 8) {
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
  return true;
}

// Phase 3: the chunks after the image data, for the text libpng decompresses (zTXt, compressed
// iTXt) and walk_png needs. What fails here is judged by walk_png as Pillow judges it.
bool png_read_trailer(png_structp png, png_infop info) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_end(png, info);
  return true;
}

uint32_t crc32(const uint8_t* data, size_t size, uint32_t crc = 0) {
  static const std::array<uint32_t, 256> kTable = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) != 0 ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = kTable[(crc ^ data[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

// Python's strict UTF-8 decoder (no overlong forms, surrogates or code points past U+10FFFF).
bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<uint8_t>(s[i]);
    int n = 0;
    uint8_t lo = 0x80, hi = 0xbf;
    if (c < 0x80) {
      i += 1;
      continue;
    } else if (c >= 0xc2 && c <= 0xdf) {
      n = 1;
    } else if (c >= 0xe0 && c <= 0xef) {
      n = 2;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      n = 3;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;
    for (int k = 1; k <= n; ++k) {
      const auto b = static_cast<uint8_t>(s[i + k]);
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xbf)) return false;
    }
    i += n + 1;
  }
  return true;
}

// One entry of Pillow's PngImageFile.info that getexif() reads.
struct PngInfoValue {
  bool present = false;
  bool is_str = false;   // Pillow holds a str (from a text chunk) where getexif() wants bytes
  bool unknown = false;  // from a compressed chunk whose text libpng could not give us
  std::string value;
};

// The info entries getexif() looks at, as Pillow's chunk handlers leave them after reading
// the whole file (exif_transpose calls load(), which reads the chunks after the image data).
struct PngInfo {
  PngInfoValue exif;         // "exif": an eXIf chunk ("Exif\0\0" + data) or a text chunk "exif"
  PngInfoValue raw_profile;  // "Raw profile type exif" (ImageMagick, exiftool): hex
  PngInfoValue xmp_text;     // "XML:com.adobe.xmp" (str)
  PngInfoValue xmp;          // "xmp": iTXt "XML:com.adobe.xmp" as bytes, or a text chunk "xmp"
};

PngInfoValue* info_slot(PngInfo* info, std::string_view key) {
  if (key == "exif") return &info->exif;
  if (key == "Raw profile type exif") return &info->raw_profile;
  if (key == "XML:com.adobe.xmp") return &info->xmp_text;
  if (key == "xmp") return &info->xmp;
  return nullptr;
}

void set_info(PngInfo* info, std::string_view key, bool is_str, const std::string* value) {
  PngInfoValue* slot = info_slot(info, key);
  if (slot == nullptr) return;
  slot->present = true;
  slot->is_str = is_str;
  slot->unknown = value == nullptr;
  slot->value = value != nullptr ? *value : std::string();
}

// The text libpng decompressed from zTXt and compressed iTXt chunks, in file order.
struct PngCompressedText {
  bool itxt;
  std::string key, text;
};

std::vector<PngCompressedText> png_compressed_texts(png_structp png, png_infop info) {
  std::vector<PngCompressedText> out;
  png_textp text = nullptr;
  int count = 0;
  png_get_text(png, info, &text, &count);
  for (int i = 0; i < count; ++i) {
    const int c = text[i].compression;
    if (c != PNG_TEXT_COMPRESSION_zTXt && c != PNG_ITXT_COMPRESSION_zTXt) continue;
    const bool itxt = c == PNG_ITXT_COMPRESSION_zTXt;
    const size_t length = itxt ? text[i].itxt_length : text[i].text_length;
    out.push_back(
        {itxt, text[i].key, std::string(text[i].text, text[i].text != nullptr ? length : 0)});
  }
  return out;
}

// Pillow's reading of the chunk stream, next to libpng's, for what changes the result:
//  - before the first IDAT Pillow verifies every chunk's CRC and refuses the file on a mismatch
//    (libpng only warns about, and drops, a bad ancillary chunk);
//  - the chunks getexif() reads (eXIf, tEXt, zTXt, iTXt) from the signature to IEND, later ones
//    replacing earlier ones, as PngStream's chunk handlers store them (for an animated PNG,
//    up to the second frame's fcTL);
//  - after the image data, a chunk cut short by the end of the file makes load() raise, and
//    an invalid chunk header ends the reading quietly.
// The compressed chunks' text comes from libpng (`compressed`, in file order; libpng drops
// chunks it cannot decompress, which Pillow reads as empty or skips): a chunk without its
// libpng text leaves its entry unknown, which is an error only if the orientation needs it.
// Not mirrored: Pillow's 64 MB limit on all text, and its 1 MB limit on one chunk for chunks
// libpng dropped (libpng keeps at most 8 MB).
PngInfo walk_png(const uint8_t* data, size_t size, const std::string& name,
                 const std::vector<PngCompressedText>& compressed) {
  constexpr size_t kMaxTextChunk = 1 << 20;  // PngImagePlugin.MAX_TEXT_CHUNK
  PngInfo info;
  size_t next_text = 0;
  // The decompressed text of the next compressed chunk, if libpng's next entry is that chunk.
  auto take = [&](bool itxt, std::string_view key) -> const std::string* {
    if (next_text >= compressed.size() || compressed[next_text].itxt != itxt ||
        compressed[next_text].key != key) {
      return nullptr;
    }
    const std::string& text = compressed[next_text++].text;
    if (text.size() > kMaxTextChunk) {
      OMNI_THROW(in_image(name), "a compressed PNG text chunk '", key, "' holds more than ",
                 kMaxTextChunk, " bytes (Pillow's MAX_TEXT_CHUNK; Pillow refuses it too)");
    }
    return &text;
  };
  bool image_data = false, animated = false, seen_actl = false;
  for (size_t pos = 8; pos + 8 <= size;) {
    const auto length = static_cast<uint32_t>(read_uint(data + pos, 4, true));
    const std::string_view type = as_view(data + pos + 4, 4);
    if (!std::all_of(type.begin(), type.end(), [](char c) {
          return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_';
        })) {
      break;
    }
    if (type == "IEND" || (image_data && animated && type == "fcTL")) break;
    const size_t start = pos + 8;
    if (length > size - start) {
      if (image_data) {
        OMNI_THROW(in_image(name), "truncated PNG: chunk '", type,
                   "' after the image data runs past the end of the file");
      }
      break;  // libpng has already refused this file
    }
    const std::string_view body = as_view(data + start, length);
    pos = start + length + 4;
    if (type == "IDAT") {
      image_data = true;
      continue;
    }
    if (!image_data) {
      if (pos > size || crc32(data + pos - 8 - length, length + 4) !=
                            static_cast<uint32_t>(read_uint(data + pos - 4, 4, true))) {
        OMNI_THROW(in_image(name), "broken PNG: bad CRC in chunk '", type,
                   "' (Pillow refuses the file)");
      }
    }
    if (type == "eXIf") {
      info.exif = {true, false, false, "Exif" + std::string(2, '\0') + std::string(body)};
    } else if (type == "acTL") {
      if (length < 8) OMNI_THROW(in_image(name), "APNG with a truncated acTL chunk");
      const uint64_t frames = read_uint(data + start, 4, true);
      animated = !seen_actl && frames > 1 && frames <= 0x80000000u;
      seen_actl = true;
    } else if (type == "tEXt" || type == "zTXt" || type == "iTXt") {
      const size_t nul = body.find('\0');
      const std::string_view key = body.substr(0, nul);
      std::string_view rest = nul == std::string_view::npos ? "" : body.substr(nul + 1);
      if (type == "tEXt") {
        const std::string value(rest);
        if (!key.empty()) set_info(&info, key, key != "exif", &value);
      } else if (type == "zTXt") {
        if (!rest.empty() && rest[0] != 0) {
          OMNI_THROW(in_image(name), "unknown compression method ", int{uint8_t(rest[0])},
                     " in zTXt chunk (Pillow refuses the file)");
        }
        // Python inflates nothing into "" where libpng drops the chunk.
        static const std::string kEmpty;
        const std::string* text = rest.size() <= 1 ? &kEmpty : take(false, key);
        if (!key.empty()) set_info(&info, key, true, text);
      } else {  // iTXt: keyword, flag, method, language, translated keyword, text
        if (nul == std::string_view::npos || rest.size() < 2) continue;
        const bool flagged = rest[0] != 0, method0 = rest[1] == 0;
        rest.remove_prefix(2);
        const size_t a = rest.find('\0');
        const size_t b = a == std::string_view::npos ? a : rest.find('\0', a + 1);
        if (b == std::string_view::npos) continue;
        const std::string_view lang = rest.substr(0, a), translated = rest.substr(a + 1, b - a - 1);
        std::string raw(rest.substr(b + 1));
        const std::string* text = &raw;
        if (flagged) {
          if (!method0) continue;
          // Python inflates an empty stream into "", where libpng drops the chunk.
          text = raw.empty() ? &raw : take(true, key);
          if (text == nullptr) {  // Pillow may have stored it or skipped it: unknown
            if (info_slot(&info, key) != nullptr) set_info(&info, key, true, nullptr);
            if (key == "XML:com.adobe.xmp") set_info(&info, "xmp", false, nullptr);
            continue;
          }
        }
        if (key == "XML:com.adobe.xmp") set_info(&info, "xmp", false, text);
        if (!valid_utf8(lang) || !valid_utf8(translated) || !valid_utf8(*text)) continue;
        set_info(&info, key, true, text);
      }
    }
  }
  return info;
}

// bytes.fromhex("".join(text.split("\n")[3:])), as getexif() decodes "Raw profile type exif":
// nullopt where Python raises (a character that is neither hex nor whitespace, an odd digit).
std::optional<std::string> from_hex_profile(std::string_view text) {
  std::string digits;
  int newlines = 0;
  for (const char c : text) {
    if (c == '\n') {
      ++newlines;
    } else if (newlines >= 3) {
      digits.push_back(c);
    }
  }
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  auto space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  std::string out;
  for (size_t i = 0; i < digits.size();) {
    if (space(digits[i])) {
      ++i;
      continue;
    }
    if (i + 1 >= digits.size() || hex(digits[i]) < 0 || hex(digits[i + 1]) < 0) return std::nullopt;
    out.push_back(static_cast<char>(hex(digits[i]) * 16 + hex(digits[i + 1])));
    i += 2;
  }
  return out;
}

// getexif() on a PNG, then exif_transpose's choice: the transposition code (1 = none).
int png_orientation(const PngInfo& info, const std::string& name) {
  auto unsupported = [&](const char* key) {
    OMNI_THROW(in_image(name), "the orientation depends on the compressed PNG text chunk '", key,
               "', which libpng could not decompress as Python's zlib does; re-save the image "
               "without it");
  };
  std::optional<std::string> exif;
  if (info.exif.present) {
    if (info.exif.is_str || info.exif.unknown) {
      OMNI_THROW(in_image(name),
                 "a compressed or international PNG text chunk named 'exif' "
                 "(Pillow fails on it too)");
    }
    exif = info.exif.value;
  } else if (info.raw_profile.present) {
    if (info.raw_profile.unknown) unsupported("Raw profile type exif");
    exif = from_hex_profile(info.raw_profile.value);
    if (!exif) {
      OMNI_THROW(in_image(name),
                 "the PNG text chunk 'Raw profile type exif' is not valid hex "
                 "(Pillow refuses it too)");
    }
  }
  if (exif) {
    const ExifTag tag = exif_orientation(*exif);
    if (tag.kind == ExifTag::kInvalid) {
      OMNI_THROW(in_image(name), "invalid EXIF data: ", tag.why, " (Pillow refuses it too)");
    }
    if (tag.kind == ExifTag::kPresent) return tag.orientation;
  }
  // The XMP fallback reads "XML:com.adobe.xmp" if it is not empty, else "xmp".
  const PngInfoValue& text = info.xmp_text;
  if (text.present && (text.unknown || !text.value.empty())) {
    if (text.unknown) unsupported("XML:com.adobe.xmp");
    return xmp_orientation(text.value).value_or(1);
  }
  if (info.xmp.present && (info.xmp.unknown || !info.xmp.value.empty())) {
    if (info.xmp.unknown) unsupported("XML:com.adobe.xmp");
    if (info.xmp.is_str) {
      OMNI_THROW(in_image(name), "a PNG text chunk named 'xmp' (Pillow fails on it too)");
    }
    return xmp_orientation(info.xmp.value).value_or(1);
  }
  return 1;
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
  png_read_trailer(guard.png, guard.info);
  const PngInfo info = walk_png(data, size, name, png_compressed_texts(guard.png, guard.info));
  const int orientation = png_orientation(info, name);

  // convert("RGB") of the mode Pillow opens: 16-bit samples are big-endian and Pillow keeps the
  // high byte ("RGB;16B", "RGBA;16B", "LA;16B"), except 16-bit gray, opened as "I;16" and
  // clamped to 255. Alpha (and a tRNS key) is dropped, not composited: the colour channels of a
  // transparent pixel come through as they are stored.
  const bool gray = layout.channels <= 2;
  const bool clamp16 = layout.bit_depth == 16 && layout.channels == 1;
  auto sample = [&](const uint8_t* p) -> uint8_t {
    if (sample_bytes == 1) return p[0];
    if (clamp16) return static_cast<uint8_t>(std::min((p[0] << 8) | p[1], 255));
    return p[0];
  };
  RgbImage image;
  image.height = layout.height;
  image.width = layout.width;
  image.pixels.resize(static_cast<size_t>(layout.width) * layout.height * 3);
  const size_t stride = static_cast<size_t>(layout.channels) * sample_bytes;
  for (png_uint_32 y = 0; y < layout.height; ++y) {
    const uint8_t* in = rows[y];
    uint8_t* out = image.pixels.data() + static_cast<size_t>(y) * layout.width * 3;
    for (png_uint_32 x = 0; x < layout.width; ++x, in += stride, out += 3) {
      if (gray) {
        out[0] = out[1] = out[2] = sample(in);
      } else {
        out[0] = sample(in);
        out[1] = sample(in + sample_bytes);
        out[2] = sample(in + 2 * sample_bytes);
      }
    }
  }
  return apply_orientation(std::move(image), orientation);
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

// Phase 1: header, APP0/APP1 segments and output colour space. Returns false with
// errors->message set on error.
bool jpeg_read_layout(JpegGuard* guard, JpegErrors* errors, const uint8_t* data, size_t size) {
  jpeg_decompress_struct* cinfo = &guard->cinfo;
  cinfo->err = jpeg_std_error(&errors->mgr);
  errors->mgr.error_exit = jpeg_on_error;
  errors->mgr.emit_message = jpeg_on_message;
  if (setjmp(errors->jump)) return false;
  guard->created = true;  // jpeg_destroy_decompress is safe on a zeroed, half-created struct
  jpeg_create_decompress(cinfo);
  jpeg_mem_src(cinfo, data, static_cast<unsigned long>(size));
  jpeg_save_markers(cinfo, JPEG_APP0, 0xffff);      // JFIF (density)
  jpeg_save_markers(cinfo, JPEG_APP0 + 1, 0xffff);  // EXIF, XMP
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

// The orientation exif_transpose reads from a JPEG's segments (before the first scan, as Pillow
// reads them): "exif" is the first APP1 "Exif\0\0" segment with the later ones appended (less
// their prefix), "xmp" the last APP1 XMP packet. While opening, JpegImageFile reads the DPI
// from the EXIF when no JFIF segment gives it, and swallows an error there; the Exif object
// stays cached as loaded, so exif_transpose then sees no orientation (and no XMP) instead of
// raising.
int jpeg_orientation(const jpeg_decompress_struct& cinfo, const std::string& name) {
  constexpr std::string_view kExif("Exif\0\0", 6), kXmp("http://ns.adobe.com/xap/1.0/\0", 29);
  std::optional<std::string> exif, xmp;
  bool dpi = false;
  for (jpeg_saved_marker_ptr m = cinfo.marker_list; m != nullptr; m = m->next) {
    const std::string_view s = as_view(m->data, m->data_length);
    if (m->marker == JPEG_APP0 && starts_with(s, "JFIF")) {
      if (s.size() < 7) OMNI_THROW(in_image(name), "invalid JPEG: JFIF segment too short");
      if (s.size() >= 12 && (s[7] == 1 || s[7] == 2)) dpi = true;
    } else if (m->marker == JPEG_APP0 + 1 && starts_with(s, kExif)) {
      if (exif) {
        exif->append(s.substr(6));
      } else {
        exif = std::string(s);
      }
    } else if (m->marker == JPEG_APP0 + 1 && starts_with(s, kXmp)) {
      xmp = std::string(s.substr(kXmp.size()));
    }
  }
  if (exif) {
    const ExifTag tag = exif_orientation(*exif);
    if (tag.kind == ExifTag::kInvalid) {
      if (!dpi) return 1;
      OMNI_THROW(in_image(name), "invalid EXIF data: ", tag.why, " (Pillow refuses it too)");
    }
    if (tag.kind == ExifTag::kPresent) return tag.orientation;
  }
  if (xmp && !xmp->empty()) return xmp_orientation(*xmp).value_or(1);
  return 1;
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
  const int orientation = jpeg_orientation(guard.cinfo, name);
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
  return apply_orientation(std::move(image), orientation);
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
