// Image inputs for the Qwen3-Omni thinker: decode a file (PNG through libpng, JPEG through
// libjpeg-turbo, the decoders Pillow uses) into the 8-bit RGB image Hugging Face's chat template
// hands the image processor for an image given by path (transformers' load_image: Image.open,
// ImageOps.exif_transpose, convert("RGB")), then turn it into the vision encoder's flattened
// patches exactly as Qwen2VLImageProcessorPil does (smart_resize, Pillow's bicubic resampling,
// rescale 1/255, normalize, temporal repeat, merge-ordered patch layout).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace omni::models {

// 8-bit RGB, row-major, channels last: pixels[(y * width + x) * 3 + c].
struct RgbImage {
  int64_t height = 0, width = 0;
  std::vector<uint8_t> pixels;
};

// Decodes a PNG or JPEG image held in memory (the format is taken from the magic bytes, not the
// name). `name` only labels error messages. The result equals transformers' load_image() of
// that file (what the chat template does with a path, URL or base64 image), with Pillow 13:
//  - the EXIF orientation is applied as ImageOps.exif_transpose applies it: the Orientation
//    tag of a JPEG's APP1 EXIF, a PNG's eXIf chunk or its "Raw profile type exif" text, or,
//    when the EXIF has no such tag, tiff:Orientation in the XMP packet; values 2..8 flip or
//    rotate the image (5..8 swap width and height);
//  - then convert("RGB"): grayscale is replicated into the three channels, palettes are
//    expanded, and alpha (an alpha channel, or a tRNS chunk) is dropped: a transparent pixel
//    keeps its stored colour, nothing is composited. (The processor's own convert_to_rgb, which
//    composites transparency onto white, then has nothing to do: it matters only for PIL
//    images handed to the processor directly, which this API does not take.) 16-bit PNG
//    samples become 8-bit as Pillow makes them: the high byte, except 16-bit grayscale without
//    alpha, which Pillow opens as "I;16" and clamps to 255.
// Throws omni::Error naming `name` and the problem: not an image, an unsupported format (GIF,
// WebP, BMP, CMYK JPEG, ...), truncated or corrupt data, more pixels than Pillow's
// decompression-bomb limit, or metadata load_image fails on too (EXIF that is not a TIFF
// structure, a PNG chunk with a bad CRC before the image data, ...). A refusal Python does not
// share: an orientation that depends on a compressed PNG text chunk libpng cannot decompress.
RgbImage decode_image(const uint8_t* data, size_t size, const std::string& name);

// Reads and decodes `path` (see decode_image); a missing or unreadable file throws naming it.
RgbImage read_image_file(const std::string& path);

// The fields of a preprocessor_config.json that the vision patches depend on. The defaults are
// Qwen2VLImageProcessorPil's class defaults for the pixel bounds (size.shortest_edge = 56 * 56,
// size.longest_edge = 28 * 28 * 1280) with Qwen3-Omni's vision settings (patch 16, merge 2,
// temporal patch 2, mean = std = 0.5). A checkpoint's own preprocessor_config.json overrides
// them: read it with vision_options_from_preprocessor_config().
struct VisionPatchOptions {
  int64_t patch_size = 16;
  int64_t temporal_patch_size = 2;
  int64_t merge_size = 2;
  int64_t min_pixels = 56 * 56;
  int64_t max_pixels = 28 * 28 * 1280;
  std::array<double, 3> image_mean{0.5, 0.5, 0.5};
  std::array<double, 3> image_std{0.5, 0.5, 0.5};
};

// Reads patch_size, temporal_patch_size, merge_size, the pixel bounds (size.shortest_edge /
// size.longest_edge, overridden by min_pixels / max_pixels as the processor's constructor
// does), image_mean and image_std from `dir_or_file` (a preprocessor_config.json or a
// directory holding one). Absent fields and a missing file give `defaults`. Throws when a
// field is invalid or asks for processing this code does not do (do_resize, do_rescale,
// do_normalize or do_convert_rgb false, a resample other than bicubic, a rescale_factor other
// than 1/255).
VisionPatchOptions vision_options_from_preprocessor_config(const std::string& dir_or_file,
                                                           const VisionPatchOptions& defaults = {});

// The vision encoder's input for one image: pixel_values float32
// [grid_t * grid_h * grid_w, 3 * temporal_patch_size * patch_size * patch_size] and
// grid_thw = {grid_t, grid_h, grid_w} (grid_t = 1 for an image), equal to
// Qwen2VLImageProcessorPil(...)(images=[image])["pixel_values"] and ["image_grid_thw"][0].
struct VisionPatches {
  at::Tensor pixel_values;
  std::array<int64_t, 3> grid_thw{};
};

// Hugging Face's smart_resize: {height, width} rounded to multiples of `factor` (Python's
// round-half-to-even), then scaled down or up so the area lies within [min_pixels, max_pixels]
// with the aspect ratio kept. Same floating-point steps as the Python, so the same result.
// Throws when the aspect ratio exceeds 200 (as HF does), when a side is not positive, or when
// the result would be empty.
std::pair<int64_t, int64_t> smart_resize(int64_t height, int64_t width, int64_t factor,
                                         int64_t min_pixels, int64_t max_pixels);

// Pillow's Image.resize((width, height), Image.BICUBIC) on an RGB image, bit for bit: separable
// convolution (horizontal pass, then vertical) with the a = -0.5 cubic kernel whose support
// widens by the downscale factor (antialiasing), coefficients normalized and quantized to 22
// fractional bits, each pass rounded and clamped to uint8. Returns a copy when the size is
// unchanged.
RgbImage resize_bicubic(const RgbImage& image, int64_t height, int64_t width);

// Pillow's Image.resize((width, height), Image.LANCZOS) the same way (Lanczos-3 kernel, support
// 3 widened by the downscale factor): what diffusers' VaeImageProcessor.resize does to a PIL
// image (its default resample).
RgbImage resize_lanczos(const RgbImage& image, int64_t height, int64_t width);

// The processor's pipeline for one image: resize to smart_resize(h, w, patch * merge, ...)
// (bicubic; no resampling when that is the image's size), x / 255 in float64 rounded to
// float32, (x - mean) / std in float32, the frame repeated temporal_patch_size times, then
// flattened into patches in the processor's order: merge groups row-major, the
// merge_size x merge_size patches of a group row-major, and within a patch channel, time, row,
// column.
VisionPatches image_to_patches(const RgbImage& image, const VisionPatchOptions& options = {});

}  // namespace omni::models
