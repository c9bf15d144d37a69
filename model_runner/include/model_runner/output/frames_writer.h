// Writes generated video frames (what diffusers returns with output_type="np": float32
// [F, H, W, 3], RGB in [0, 1]) as an H.264 MP4, PNG images or a NumPy .npy file. Every file is
// written atomically (a temporary file next to the target, renamed over it once complete), so a
// failed or interrupted run never leaves a half-written file behind.
//
// Common to all writers: `frames` is a 4-D [F, H, W, 3] floating-point tensor on any device
// (converted to float32 on the CPU) with F, H and W positive; anything else throws omni::Error
// naming the path and the problem before any file exists. The folder must exist; an existing
// target is replaced.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace omni::models {

// NumPy .npy, format 1.0, '<f4', shape (F, H, W, 3), C order: byte for byte what numpy.save
// writes for that float32 array (header padded with spaces to a multiple of 64 bytes, ending in
// '\n', with numpy's spare room for the first axis to grow). Values are written bit for bit,
// NaN and infinities included.
void write_npy(const std::string& path, const at::Tensor& frames);

// 8-bit RGB PNG(s), values round(clamp(x, 0, 1) * 255) rounded half to even in float32, as
// diffusers' numpy_to_pil ((x * 255).round().astype("uint8")) after its clamp. One frame goes to
// `path` itself; F > 1 frames go to numbered files next to it, "<stem>_0000<ext>",
// "<stem>_0001<ext>", ... (at least 4 digits; see png_frame_paths). Every frame is encoded and
// flushed to a temporary file before any is renamed into place; should a rename then fail, the
// files already renamed are removed (older files of those names are then gone too). NaN or infinite
// values throw naming the first one: 8-bit pixels have no way to say them, and they mean a bug
// upstream.
void write_png(const std::string& path, const at::Tensor& frames);

// The PNG files write_png would write, one per frame, as bytes (for an HTTP response: the images
// API answers diffusers' output_type="pil" PNGs so). Throws as write_png, naming no path.
std::vector<std::string> encode_png_bytes(const at::Tensor& frames);

// The files write_png(path, frames) writes for `count` frames, in frame order.
std::vector<std::string> png_frame_paths(const std::string& path, int64_t count);

// Whether this build writes MP4: false where FFmpeg's libraries were missing when it was
// configured (write_mp4 and encode_mp4_bytes then throw saying so).
bool mp4_supported();

// H.264 (libx264, crf 18, preset medium, yuv420p, BT.601 limited range as ffmpeg's rgb24 ->
// yuv420p conversion makes it) in an MP4 container with "+faststart" (the index before the data,
// so that a browser can play while downloading), `fps` frames per second (1 to 1000; 16 for
// Wan2.1 / Wan2.2 A14B, 24 for TI2V-5B). Pixels are quantized as write_png quantizes them.
// yuv420p needs even sizes: an odd width or height throws naming the size (the frames are not
// padded or cropped behind the caller's back). NaN or infinite values throw as in write_png.
void write_mp4(const std::string& path, const at::Tensor& frames, int64_t fps);

// The bytes write_mp4 would write (for an HTTP response); goes through a temporary file in the
// system's temporary folder, removed before returning.
std::string encode_mp4_bytes(const at::Tensor& frames, int64_t fps);

// Picks the writer by the extension of `path` (case-insensitive): .mp4 (write_mp4 at `fps`),
// .png (write_png) or .npy (write_npy); `fps` is ignored for the last two. Any other extension
// throws listing the three.
void write_frames(const std::string& path, const at::Tensor& frames, int64_t fps);

}  // namespace omni::models
