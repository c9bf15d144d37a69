// The condition images of diffusers' QwenImageEditPipeline and QwenImageEditPlusPipeline, sized
// and resampled as they do it: each image resized (Pillow's LANCZOS) to the area the pipeline
// wants at its own aspect ratio, once for the text encoder's vision tower and once for the VAE.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "model_runner/preprocess/image.h"

namespace omni::models {

// Which diffusers pipeline a Qwen-Image folder holds (model_index.json's _class_name).
enum class QwenImageVariant {
  kTextToImage,  // QwenImagePipeline
  kEdit,         // QwenImageEditPipeline: one image, 1024^2 for the vision tower and the VAE
  kEditPlus,     // QwenImageEditPlusPipeline: images, 384^2 for the vision tower, 1024^2 VAE
};

// The pipelines' calculate_dimensions: the {width, height} of area `target_area` at width /
// height `ratio`, each rounded (half to even) to a multiple of 32.
std::pair<int64_t, int64_t> qwen_image_calculate_dimensions(double target_area, double ratio);

struct QwenImageEditImages {
  std::vector<RgbImage> condition;  // what the processor gets (the vision tower's input)
  std::vector<RgbImage> vae;        // what the VAE encodes
};

// The images of an edit request, as `variant` prepares them (Edit takes exactly one, Edit-Plus
// one or more; throws otherwise, or for an empty image).
QwenImageEditImages prepare_qwen_image_edit_images(QwenImageVariant variant,
                                                   const std::vector<RgbImage>& images);

// VaeImageProcessor.preprocess of an image already at its size: [1, 3, 1, H, W] float32,
// x / 255 then 2 x - 1 in float32.
at::Tensor qwen_image_vae_pixels(const RgbImage& image);

}  // namespace omni::models
