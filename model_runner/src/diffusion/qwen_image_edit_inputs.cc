#include "model_runner/diffusion/qwen_image_edit_inputs.h"

#include <ATen/ops/empty.h>

#include <cmath>

#include "cpu_offload/check.h"

namespace omni::models {
namespace {

// The pipelines' VAE_IMAGE_SIZE (Edit's only size) and Edit-Plus's CONDITION_IMAGE_SIZE.
constexpr double kVaeImageArea = 1024.0 * 1024.0;
constexpr double kPlusConditionArea = 384.0 * 384.0;

double aspect_ratio(const RgbImage& image) {
  OMNI_CHECK(image.height > 0 && image.width > 0, "an image to edit is empty (", image.width, "x",
             image.height, ")");
  return static_cast<double>(image.width) / static_cast<double>(image.height);
}

}  // namespace

std::pair<int64_t, int64_t> qwen_image_calculate_dimensions(double target_area, double ratio) {
  const double width = std::sqrt(target_area * ratio);
  const double height = width / ratio;
  // Python's round() rounds halves to even, as nearbyint does in the default rounding mode.
  return {static_cast<int64_t>(std::nearbyint(width / 32)) * 32,
          static_cast<int64_t>(std::nearbyint(height / 32)) * 32};
}

QwenImageEditImages prepare_qwen_image_edit_images(QwenImageVariant variant,
                                                   const std::vector<RgbImage>& images) {
  OMNI_CHECK(variant != QwenImageVariant::kTextToImage,
             "a text-to-image Qwen-Image folder takes no image to edit");
  OMNI_CHECK(!images.empty(), "an image edit needs an image");
  OMNI_CHECK(variant == QwenImageVariant::kEditPlus || images.size() == 1,
             "QwenImageEditPipeline edits one image, got ", images.size(),
             " (QwenImageEditPlusPipeline folders take several)");
  QwenImageEditImages out;
  for (const auto& image : images) {
    const double ratio = aspect_ratio(image);
    const auto [vae_w, vae_h] = qwen_image_calculate_dimensions(kVaeImageArea, ratio);
    OMNI_CHECK(vae_w > 0 && vae_h > 0, "an image of ", image.width, "x", image.height,
               " is too narrow to edit: it resizes to ", vae_w, "x", vae_h);
    // Edit resizes once and hands the same image to both; Edit-Plus resizes the original twice.
    out.vae.push_back(resize_lanczos(image, vae_h, vae_w));
    if (variant == QwenImageVariant::kEdit) {
      out.condition.push_back(out.vae.back());
    } else {
      const auto [w, h] = qwen_image_calculate_dimensions(kPlusConditionArea, ratio);
      OMNI_CHECK(w > 0 && h > 0, "an image of ", image.width, "x", image.height,
                 " is too narrow to edit: it resizes to ", w, "x", h);
      out.condition.push_back(resize_lanczos(image, h, w));
    }
  }
  return out;
}

at::Tensor qwen_image_vae_pixels(const RgbImage& image) {
  float table[256];
  for (int v = 0; v < 256; ++v) {
    const float x = static_cast<float>(v) / 255.0f;  // numpy: float32 array / 255.0
    table[v] = 2.0f * x - 1.0f;
  }
  const int64_t h = image.height, w = image.width;
  at::Tensor out = at::empty({1, 3, 1, h, w}, at::kFloat);
  float* dst = out.data_ptr<float>();
  for (int64_t c = 0; c < 3; ++c) {
    for (int64_t i = 0; i < h * w; ++i) *dst++ = table[image.pixels[i * 3 + c]];
  }
  return out;
}

}  // namespace omni::models
