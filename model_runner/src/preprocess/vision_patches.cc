// Qwen2VLImageProcessorPil's pipeline for one image (transformers 5.x,
// models/qwen2_vl/image_processing_pil_qwen2_vl.py): smart_resize, Pillow's bicubic resize on
// uint8, rescale and normalize in numpy's float64 / float32 steps, then patchify.
#include <ATen/ops/empty.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cpu_offload/check.h"
#include "model_runner/preprocess/image.h"
#include "model_runner/weights/hf_config.h"

namespace omni::models {
namespace {

// ------------------------------------------------------------- Pillow's resampling (Resample.c)

// Pillow's resampling filters (Resample.c): the kernel and its support in input pixels at
// scale 1.
struct ResampleFilter {
  double (*kernel)(double);
  double support;
};

// Bicubic with a = -0.5.
double bicubic_filter(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

double sinc_filter(double x) {
  if (x == 0.0) return 1.0;
  constexpr double kPi = 3.14159265358979323846;  // M_PI, as Pillow uses
  x = x * kPi;
  return std::sin(x) / x;
}

// Lanczos-3: the sinc truncated by a sinc three times wider.
double lanczos_filter(double x) {
  if (-3.0 <= x && x < 3.0) return sinc_filter(x) * sinc_filter(x / 3);
  return 0.0;
}

constexpr ResampleFilter kBicubic{bicubic_filter, 2.0};
constexpr ResampleFilter kLanczos{lanczos_filter, 3.0};

// Fixed-point coefficients for 8-bit images: 32 bits minus 8 for the value and 2 for overshoot.
constexpr int kPrecisionBits = 32 - 8 - 2;

// One output pixel's window of input pixels and their fixed-point weights.
struct Coefficients {
  int64_t ksize = 0;             // weights per output pixel (the window may use fewer)
  std::vector<int64_t> bounds;   // [out * 2] = first input pixel, [out * 2 + 1] = count
  std::vector<int32_t> weights;  // [out * ksize + k]
};

// precompute_coeffs + normalize_coeffs_8bpc for the box [0, in_size) mapped onto out_size.
Coefficients precompute_coefficients(int64_t in_size, int64_t out_size,
                                     const ResampleFilter& filter) {
  // Pillow computes in double from float box coordinates; sizes are exact in both.
  const double scale = static_cast<double>(static_cast<float>(in_size)) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = filter.support * filterscale;
  Coefficients c;
  c.ksize = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  c.bounds.resize(static_cast<size_t>(out_size) * 2);
  c.weights.assign(static_cast<size_t>(out_size * c.ksize), 0);
  std::vector<double> k(static_cast<size_t>(c.ksize));
  for (int64_t xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    // (int) truncates toward zero, as in C: Pillow's rounding, kept bit for bit.
    // NOLINTNEXTLINE(bugprone-incorrect-roundings)
    int64_t xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    // NOLINTNEXTLINE(bugprone-incorrect-roundings)
    int64_t xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int64_t x = 0; x < xmax; ++x) {
      const double w = filter.kernel((x + xmin - center + 0.5) * ss);
      k[x] = w;
      ww += w;
    }
    for (int64_t x = 0; x < xmax; ++x) {
      if (ww != 0.0) k[x] /= ww;
    }
    int32_t* out = c.weights.data() + xx * c.ksize;
    for (int64_t x = 0; x < xmax; ++x) {
      const double v = k[x] * (1 << kPrecisionBits);
      out[x] = static_cast<int32_t>(k[x] < 0 ? -0.5 + v : 0.5 + v);
    }
    c.bounds[xx * 2] = xmin;
    c.bounds[xx * 2 + 1] = xmax;
  }
  return c;
}

inline uint8_t clip8(int32_t in) {
  if (in >= (1 << kPrecisionBits << 8)) return 255;
  if (in <= 0) return 0;
  return static_cast<uint8_t>(in >> kPrecisionBits);
}

// ImagingResampleHorizontal_8bpc on RGB rows [row_begin, row_begin + rows).
RgbImage resample_horizontal(const RgbImage& in, int64_t row_begin, int64_t rows, int64_t out_width,
                             const Coefficients& c) {
  RgbImage out;
  out.height = rows;
  out.width = out_width;
  out.pixels.resize(static_cast<size_t>(rows * out_width * 3));
  for (int64_t y = 0; y < rows; ++y) {
    const uint8_t* src = in.pixels.data() + (row_begin + y) * in.width * 3;
    uint8_t* dst = out.pixels.data() + y * out_width * 3;
    for (int64_t xx = 0; xx < out_width; ++xx) {
      const int64_t xmin = c.bounds[xx * 2], xmax = c.bounds[xx * 2 + 1];
      const int32_t* k = c.weights.data() + xx * c.ksize;
      int32_t ss0 = 1 << (kPrecisionBits - 1), ss1 = ss0, ss2 = ss0;
      for (int64_t x = 0; x < xmax; ++x) {
        const uint8_t* p = src + (x + xmin) * 3;
        ss0 += p[0] * k[x];
        ss1 += p[1] * k[x];
        ss2 += p[2] * k[x];
      }
      dst[xx * 3] = clip8(ss0);
      dst[xx * 3 + 1] = clip8(ss1);
      dst[xx * 3 + 2] = clip8(ss2);
    }
  }
  return out;
}

// ImagingResampleVertical_8bpc; `row_offset` is subtracted from the bounds (Pillow shifts them
// when the horizontal pass only produced the rows the vertical one reads).
RgbImage resample_vertical(const RgbImage& in, int64_t out_height, const Coefficients& c,
                           int64_t row_offset) {
  RgbImage out;
  out.height = out_height;
  out.width = in.width;
  out.pixels.resize(static_cast<size_t>(out_height * in.width * 3));
  const int64_t stride = in.width * 3;
  // Row by row into one accumulator per sample: each sum adds the same terms in the same order
  // as Pillow's per-pixel loop, and the inner loop vectorizes.
  std::vector<int32_t> ss(static_cast<size_t>(stride));
  for (int64_t yy = 0; yy < out_height; ++yy) {
    const int64_t ymin = c.bounds[yy * 2] - row_offset, ymax = c.bounds[yy * 2 + 1];
    const int32_t* k = c.weights.data() + yy * c.ksize;
    std::fill(ss.begin(), ss.end(), 1 << (kPrecisionBits - 1));
    for (int64_t y = 0; y < ymax; ++y) {
      const uint8_t* src = in.pixels.data() + (y + ymin) * stride;
      const int32_t ky = k[y];
      for (int64_t i = 0; i < stride; ++i) ss[i] += src[i] * ky;
    }
    uint8_t* dst = out.pixels.data() + yy * stride;
    for (int64_t i = 0; i < stride; ++i) dst[i] = clip8(ss[i]);
  }
  return out;
}

void check_image(const RgbImage& image, const char* what) {
  OMNI_CHECK(image.height > 0 && image.width > 0, what, ": empty image (", image.width, "x",
             image.height, ")");
  OMNI_CHECK(image.pixels.size() == static_cast<size_t>(image.height * image.width * 3), what, ": ",
             image.width, "x", image.height, " RGB image holds ", image.pixels.size(),
             " bytes, expected ", image.height * image.width * 3);
}

void validate(const VisionPatchOptions& opt, const std::string& source) {
  OMNI_CHECK(opt.patch_size > 0, source, ": patch_size must be positive, got ", opt.patch_size);
  OMNI_CHECK(opt.temporal_patch_size > 0, source, ": temporal_patch_size must be positive, got ",
             opt.temporal_patch_size);
  OMNI_CHECK(opt.merge_size > 0, source, ": merge_size must be positive, got ", opt.merge_size);
  OMNI_CHECK(opt.min_pixels > 0 && opt.max_pixels >= opt.min_pixels, source,
             ": need 0 < min_pixels <= max_pixels, got min_pixels ", opt.min_pixels,
             " and max_pixels ", opt.max_pixels);
  for (int c = 0; c < 3; ++c) {
    OMNI_CHECK(std::isfinite(opt.image_mean[c]), source, ": image_mean[", c, "] is not finite");
    OMNI_CHECK(std::isfinite(opt.image_std[c]) && opt.image_std[c] != 0.0, source, ": image_std[",
               c, "] must be finite and non-zero, got ", opt.image_std[c]);
  }
}

// image_mean / image_std: a number (for every channel) or a list of 3.
std::array<double, 3> channel_values(const HfConfig& cfg, const std::string& key,
                                     const std::array<double, 3>& default_value) {
  if (!cfg.has(key)) return default_value;
  const nlohmann::json& v = cfg.raw().at(key);
  if (v.is_number()) {
    const double x = v.get<double>();
    return {x, x, x};
  }
  OMNI_CHECK(v.is_array() && v.size() == 3, cfg.source(), ": ", key,
             " must be a number or a list of 3 numbers, got ", v.dump());
  std::array<double, 3> out{};
  for (size_t c = 0; c < 3; ++c) {
    OMNI_CHECK(v[c].is_number(), cfg.source(), ": ", key, "[", c,
               "] is not a number: ", v[c].dump());
    out[c] = v[c].get<double>();
  }
  return out;
}

}  // namespace

std::pair<int64_t, int64_t> smart_resize(int64_t height, int64_t width, int64_t factor,
                                         int64_t min_pixels, int64_t max_pixels) {
  OMNI_CHECK(height > 0 && width > 0, "smart_resize: image of ", width, "x", height,
             " pixels has an empty side");
  OMNI_CHECK(factor > 0, "smart_resize: factor must be positive, got ", factor);
  const double h = static_cast<double>(height), w = static_cast<double>(width);
  const double f = static_cast<double>(factor);
  const double ratio = std::max(h, w) / std::min(h, w);
  if (ratio > 200) {
    OMNI_THROW("smart_resize: absolute aspect ratio must be smaller than 200, got ", ratio, " (",
               width, "x", height, ")");
  }
  // Python's round() rounds halves to even, as nearbyint does in the default rounding mode.
  int64_t h_bar = static_cast<int64_t>(std::nearbyint(h / f)) * factor;
  int64_t w_bar = static_cast<int64_t>(std::nearbyint(w / f)) * factor;
  if (h_bar * w_bar > max_pixels) {
    const double beta = std::sqrt((h * w) / static_cast<double>(max_pixels));
    h_bar = std::max(factor, static_cast<int64_t>(std::floor(h / beta / f)) * factor);
    w_bar = std::max(factor, static_cast<int64_t>(std::floor(w / beta / f)) * factor);
  } else if (h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / (h * w));
    h_bar = static_cast<int64_t>(std::ceil(h * beta / f)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(w * beta / f)) * factor;
  }
  OMNI_CHECK(h_bar > 0 && w_bar > 0, "smart_resize: image of ", width, "x", height,
             " pixels is too small: it resizes to ", w_bar, "x", h_bar,
             " (min_pixels = ", min_pixels, ")");
  return {h_bar, w_bar};
}

namespace {

// Image.resize((width, height), filter) on 8-bit RGB.
RgbImage resize_rgb(const RgbImage& image, int64_t height, int64_t width,
                    const ResampleFilter& filter, const char* what) {
  check_image(image, what);
  OMNI_CHECK(height > 0 && width > 0, what, ": target size ", width, "x", height,
             " has an empty side");
  // Image.resize returns a copy when nothing changes; a side that keeps its size skips its pass.
  if (height == image.height && width == image.width) return image;
  const Coefficients horizontal = precompute_coefficients(image.width, width, filter);
  const Coefficients vertical = precompute_coefficients(image.height, height, filter);
  if (width == image.width) return resample_vertical(image, height, vertical, 0);
  if (height == image.height) return resample_horizontal(image, 0, image.height, width, horizontal);
  // Both passes round to uint8, so their order matters. Pillow 13 (python-pillow/Pillow#9549)
  // runs the vertical pass first when the height shrinks by more than twice as many pixels as
  // the width does; earlier Pillow versions always ran the horizontal pass first. (Pillow then
  // skips the columns the horizontal pass does not read; computing them changes nothing.)
  const bool vertical_first =
      height < image.height && image.height - height > 2 * (image.width - width);
  if (vertical_first) {
    const RgbImage rows = resample_vertical(image, height, vertical, 0);
    return resample_horizontal(rows, 0, height, width, horizontal);
  }
  // The horizontal pass only produces the rows the vertical pass reads.
  const int64_t first_row = vertical.bounds[0];
  const int64_t last_row =
      vertical.bounds[(height - 1) * 2] + vertical.bounds[(height - 1) * 2 + 1];
  const RgbImage rows =
      resample_horizontal(image, first_row, last_row - first_row, width, horizontal);
  return resample_vertical(rows, height, vertical, first_row);
}

}  // namespace

RgbImage resize_bicubic(const RgbImage& image, int64_t height, int64_t width) {
  return resize_rgb(image, height, width, kBicubic, "resize_bicubic");
}

RgbImage resize_lanczos(const RgbImage& image, int64_t height, int64_t width) {
  return resize_rgb(image, height, width, kLanczos, "resize_lanczos");
}

VisionPatches image_to_patches(const RgbImage& image, const VisionPatchOptions& opt) {
  check_image(image, "image_to_patches");
  validate(opt, "VisionPatchOptions");
  const int64_t patch = opt.patch_size, merge = opt.merge_size, temporal = opt.temporal_patch_size;
  const auto [height, width] =
      smart_resize(image.height, image.width, patch * merge, opt.min_pixels, opt.max_pixels);
  const RgbImage resized = resize_bicubic(image, height, width);

  // rescale: uint8 -> float64 * (1 / 255) -> float32; normalize: (x - mean) / std in float32
  // with mean and std cast to float32. Both depend only on the byte, so a table per channel
  // gives numpy's results exactly.
  float table[3][256];
  for (int c = 0; c < 3; ++c) {
    const float mean = static_cast<float>(opt.image_mean[c]);
    const float std = static_cast<float>(opt.image_std[c]);
    for (int v = 0; v < 256; ++v) {
      const float x = static_cast<float>(static_cast<double>(v) * (1.0 / 255.0));
      table[c][v] = (x - mean) / std;
    }
  }

  // patchify: the image [C, gh/m, m, P, gw/m, m, P] transposed to [gh/m, gw/m, m, m, C, P, P],
  // each patch repeated over time, flattened to [gh * gw, C * T * P * P].
  const int64_t grid_h = height / patch, grid_w = width / patch;
  const int64_t channels = 3;
  const int64_t patch_dim = channels * temporal * patch * patch;
  at::Tensor pixel_values = at::empty({grid_h * grid_w, patch_dim}, at::kFloat);
  float* out = pixel_values.data_ptr<float>();
  const uint8_t* px = resized.pixels.data();
  for (int64_t gy = 0; gy < grid_h / merge; ++gy) {
    for (int64_t gx = 0; gx < grid_w / merge; ++gx) {
      for (int64_t my = 0; my < merge; ++my) {
        for (int64_t mx = 0; mx < merge; ++mx) {
          const int64_t y0 = (gy * merge + my) * patch, x0 = (gx * merge + mx) * patch;
          for (int64_t c = 0; c < channels; ++c) {
            float* first = out;
            for (int64_t py = 0; py < patch; ++py) {
              const uint8_t* row = px + ((y0 + py) * width + x0) * channels + c;
              for (int64_t pxl = 0; pxl < patch; ++pxl) *out++ = table[c][row[pxl * channels]];
            }
            for (int64_t t = 1; t < temporal; ++t) {
              std::copy(first, first + patch * patch, out);
              out += patch * patch;
            }
          }
        }
      }
    }
  }
  return {pixel_values, {1, grid_h, grid_w}};
}

VisionPatchOptions vision_options_from_preprocessor_config(const std::string& dir_or_file,
                                                           const VisionPatchOptions& defaults) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool is_dir = fs::is_directory(dir_or_file, ec);
  const std::string file =
      is_dir ? (fs::path(dir_or_file) / "preprocessor_config.json").string() : dir_or_file;
  VisionPatchOptions opt = defaults;
  if (!fs::exists(file, ec)) {
    // A model directory without the file gets the defaults; a missing file path is a typo.
    OMNI_CHECK(is_dir, "preprocessor config '", dir_or_file, "' does not exist");
    return opt;
  }
  const HfConfig cfg = HfConfig::load(file);
  opt.patch_size = cfg.get_int("patch_size", opt.patch_size);
  opt.temporal_patch_size = cfg.get_int("temporal_patch_size", opt.temporal_patch_size);
  opt.merge_size = cfg.get_int("merge_size", opt.merge_size);
  // Qwen2VLImageProcessorPil.__init__: size {shortest_edge, longest_edge}, then min_pixels /
  // max_pixels override its two fields.
  opt.min_pixels = cfg.get_int("size.shortest_edge", opt.min_pixels);
  opt.max_pixels = cfg.get_int("size.longest_edge", opt.max_pixels);
  opt.min_pixels = cfg.get_int("min_pixels", opt.min_pixels);
  opt.max_pixels = cfg.get_int("max_pixels", opt.max_pixels);
  opt.image_mean = channel_values(cfg, "image_mean", opt.image_mean);
  opt.image_std = channel_values(cfg, "image_std", opt.image_std);
  for (const char* flag : {"do_resize", "do_rescale", "do_normalize", "do_convert_rgb"}) {
    OMNI_CHECK(cfg.get_bool(flag, true), file, ": ", flag,
               " is false; only the processor's default pipeline (resize, rescale, normalize, "
               "RGB) is implemented");
  }
  const int64_t resample = cfg.get_int("resample", 3);
  OMNI_CHECK(resample == 3, file, ": resample is ", resample,
             "; only bicubic (3, the processor's default) is implemented");
  const double rescale = cfg.get_double("rescale_factor", 1.0 / 255.0);
  OMNI_CHECK(rescale == 1.0 / 255.0, file, ": rescale_factor is ", rescale,
             "; only 1/255 (the processor's default) is implemented");
  validate(opt, file);
  return opt;
}

}  // namespace omni::models
