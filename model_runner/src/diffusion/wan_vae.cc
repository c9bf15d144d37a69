#include "model_runner/diffusion/wan_vae.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <utility>

#include "cpu_offload/check.h"
#include "model_runner/layers.h"
#include "model_runner/weights/hf_config.h"
#include "model_runner/weights/load_weights.h"
#include "model_runner/weights/safetensors.h"
#include "module_tree.h"

namespace omni::models {
namespace {

// The last min(T, n) frames of x, copied (the cache must not keep the chunk alive).
at::Tensor last_frames(const at::Tensor& x, int64_t n) {
  const int64_t t = x.size(2);
  const int64_t k = std::min(t, n);
  return x.narrow(2, t - k, k).clone();
}

// WanRMS_norm without bias: F.normalize over channels (in float32 for half types), times
// sqrt(dim) and gamma (shaped [C, 1, 1, 1] or [C, 1, 1] to broadcast).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& gamma) {
  const bool half = x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16;
  const at::Tensor xf = half ? x.to(at::kFloat) : x;
  const auto denom = at::linalg_vector_norm(xf, 2, {1}, true).clamp_min(1e-12);
  const auto normalized = (xf / denom).to(x.scalar_type());
  return normalized * std::sqrt(static_cast<double>(x.size(1))) * gamma;
}

at::Tensor register_gamma(torch::nn::Module& parent, const std::string& name, int64_t dim,
                          bool images, at::ScalarType dtype) {
  auto norm = group(parent, name);
  std::vector<int64_t> shape{dim, 1, 1};
  if (!images) shape.push_back(1);
  return norm->register_parameter("gamma", uninitialized(shape, dtype), false);
}

// The usual cached call of a causal conv: cache the input's last 2 frames (topped up with the
// previous cache's last frame when the chunk has only one), run with the previous cache.
at::Tensor cached_conv(const WanCausalConv3d& conv, const at::Tensor& x, WanFeatureCache& cache) {
  const size_t i = cache.next();
  at::Tensor cache_x = last_frames(x, 2);
  const at::Tensor previous = cache.slots[i];
  if (cache_x.size(2) < 2 && previous.defined()) {
    cache_x = at::cat({previous.narrow(2, previous.size(2) - 1, 1), cache_x}, 2);
  }
  auto out = conv.forward(x, previous);
  cache.slots[i] = cache_x;
  return out;
}

// [B, C, T, H, W] -> [B * T, C, H, W] and back.
at::Tensor frames_to_batch(const at::Tensor& x) {
  return x.permute({0, 2, 1, 3, 4})
      .reshape({x.size(0) * x.size(2), x.size(1), x.size(3), x.size(4)});
}
at::Tensor batch_to_frames(const at::Tensor& x, int64_t batch) {
  return x.view({batch, -1, x.size(1), x.size(2), x.size(3)}).permute({0, 2, 1, 3, 4});
}

// nn.Conv2d's parameters ("weight", "bias").
class Conv2dParams : public torch::nn::Module {
 public:
  Conv2dParams(int64_t in, int64_t out, int64_t k, at::ScalarType dtype)
      : torch::nn::Module("Conv2d") {
    weight = register_parameter("weight", uninitialized({out, in, k, k}, dtype), false);
    bias = register_parameter("bias", uninitialized({out}, dtype), false);
  }
  at::Tensor weight, bias;
};

// WanResidualBlock: norm1, silu, conv1, norm2, silu, conv2, plus conv_shortcut (1x1x1) when
// the channel count changes.
class ResidualBlock : public WanVAELayer {
 public:
  ResidualBlock(int64_t in, int64_t out, at::ScalarType dtype) : WanVAELayer("WanResidualBlock") {
    gamma1_ = register_gamma(*this, "norm1", in, false, dtype);
    conv1_ =
        child<WanCausalConv3d>(*this, "conv1", in, out, std::vector<int64_t>{3, 3, 3},
                               std::vector<int64_t>{1, 1, 1}, std::vector<int64_t>{1, 1, 1}, dtype);
    gamma2_ = register_gamma(*this, "norm2", out, false, dtype);
    conv2_ =
        child<WanCausalConv3d>(*this, "conv2", out, out, std::vector<int64_t>{3, 3, 3},
                               std::vector<int64_t>{1, 1, 1}, std::vector<int64_t>{1, 1, 1}, dtype);
    if (in != out) {
      shortcut_ = child<WanCausalConv3d>(
          *this, "conv_shortcut", in, out, std::vector<int64_t>{1, 1, 1},
          std::vector<int64_t>{1, 1, 1}, std::vector<int64_t>{0, 0, 0}, dtype);
    }
  }
  at::Tensor forward(const at::Tensor& x, WanFeatureCache& cache, bool) override {
    const at::Tensor h = shortcut_ ? shortcut_->forward(x) : x;
    auto y = cached_conv(*conv1_, at::silu(rms_norm(x, gamma1_)), cache);
    y = cached_conv(*conv2_, at::silu(rms_norm(y, gamma2_)), cache);
    return y + h;
  }

 private:
  at::Tensor gamma1_, gamma2_;
  std::shared_ptr<WanCausalConv3d> conv1_, conv2_, shortcut_;
};

// WanAttentionBlock: single-head self-attention over each frame's pixels.
class AttentionBlock : public torch::nn::Module {
 public:
  AttentionBlock(int64_t dim, at::ScalarType dtype) : torch::nn::Module("WanAttentionBlock") {
    gamma_ = register_gamma(*this, "norm", dim, true, dtype);
    to_qkv_ = child<Conv2dParams>(*this, "to_qkv", dim, 3 * dim, 1, dtype);
    proj_ = child<Conv2dParams>(*this, "proj", dim, dim, 1, dtype);
  }
  at::Tensor forward(const at::Tensor& x) const {
    const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), w = x.size(4);
    auto y = rms_norm(frames_to_batch(x), gamma_);
    auto qkv = at::conv2d(y, to_qkv_->weight, to_qkv_->bias);
    qkv = qkv.reshape({b * t, 1, 3 * c, h * w}).permute({0, 1, 3, 2}).contiguous();
    auto parts = qkv.chunk(3, -1);
    y = at::scaled_dot_product_attention(parts[0], parts[1], parts[2]);
    y = y.squeeze(1).permute({0, 2, 1}).reshape({b * t, c, h, w});
    y = at::conv2d(y, proj_->weight, proj_->bias);
    return y.view({b, t, c, h, w}).permute({0, 2, 1, 3, 4}) + x;
  }

 private:
  at::Tensor gamma_;
  std::shared_ptr<Conv2dParams> to_qkv_, proj_;
};

// WanMidBlock: resnets.0, then attentions.0 and resnets.1.
class MidBlock : public WanVAELayer {
 public:
  MidBlock(int64_t dim, at::ScalarType dtype) : WanVAELayer("WanMidBlock") {
    auto attentions = register_module("attentions", torch::nn::ModuleList());
    attention_ = std::make_shared<AttentionBlock>(dim, dtype);
    attentions->push_back(attention_);
    auto resnets = register_module("resnets", torch::nn::ModuleList());
    for (auto& r : resnets_) {
      r = std::make_shared<ResidualBlock>(dim, dim, dtype);
      resnets->push_back(r);
    }
  }
  at::Tensor forward(const at::Tensor& x, WanFeatureCache& cache, bool) override {
    auto y = resnets_[0]->forward(x, cache, false);
    y = attention_->forward(y);
    return resnets_[1]->forward(y, cache, false);
  }

 private:
  std::shared_ptr<AttentionBlock> attention_;
  std::shared_ptr<ResidualBlock> resnets_[2];
};

enum class ResampleMode { kUpsample2d, kUpsample3d, kDownsample2d, kDownsample3d };

// WanResample: a per-frame 2x spatial resample ("resample.1" the conv), and for the 3-D modes a
// causal time_conv doubling (up) or halving (down) the frames, under the cache.
class Resample : public WanVAELayer {
 public:
  Resample(int64_t dim, ResampleMode mode, int64_t up_out_dim, at::ScalarType dtype)
      : WanVAELayer("WanResample"), mode_(mode) {
    const bool up = mode == ResampleMode::kUpsample2d || mode == ResampleMode::kUpsample3d;
    conv_ =
        child<Conv2dParams>(*group(*this, "resample"), "1", dim, up ? up_out_dim : dim, 3, dtype);
    if (mode == ResampleMode::kUpsample3d) {
      time_conv_ = child<WanCausalConv3d>(
          *this, "time_conv", dim, 2 * dim, std::vector<int64_t>{3, 1, 1},
          std::vector<int64_t>{1, 1, 1}, std::vector<int64_t>{1, 0, 0}, dtype);
    } else if (mode == ResampleMode::kDownsample3d) {
      time_conv_ = child<WanCausalConv3d>(
          *this, "time_conv", dim, dim, std::vector<int64_t>{3, 1, 1},
          std::vector<int64_t>{2, 1, 1}, std::vector<int64_t>{0, 0, 0}, dtype);
    }
  }

  at::Tensor forward(const at::Tensor& input, WanFeatureCache& cache, bool) override {
    at::Tensor x = input;
    const int64_t b = x.size(0);
    if (mode_ == ResampleMode::kUpsample3d) {
      const size_t i = cache.next();
      if (!cache.slots[i].defined() && !cache.rep[i]) {
        cache.rep[i] = true;  // the first chunk: no temporal upsampling
      } else {
        const int64_t c = x.size(1), t = x.size(2), h = x.size(3), w = x.size(4);
        at::Tensor cache_x = last_frames(x, 2);
        const at::Tensor previous = cache.slots[i];
        if (cache_x.size(2) < 2) {
          cache_x = cache.rep[i]
                        ? at::cat({at::zeros_like(cache_x), cache_x}, 2)
                        : at::cat({previous.narrow(2, previous.size(2) - 1, 1), cache_x}, 2);
        }
        x = cache.rep[i] ? time_conv_->forward(x) : time_conv_->forward(x, previous);
        cache.slots[i] = cache_x;
        cache.rep[i] = false;
        // [B, 2C, T] -> [B, C, 2T], the two halves interleaved frame by frame.
        x = x.reshape({b, 2, c, t, h, w});
        x = at::stack({x.select(1, 0), x.select(1, 1)}, 3).reshape({b, c, 2 * t, h, w});
      }
    }
    auto y = frames_to_batch(x);
    if (mode_ == ResampleMode::kUpsample2d || mode_ == ResampleMode::kUpsample3d) {
      // nearest-exact at an integer factor of 2 is plain nearest; done in float32 like WanUpsample.
      y = at::upsample_nearest2d(y.to(at::kFloat), {2 * y.size(2), 2 * y.size(3)})
              .to(x.scalar_type());
      y = at::conv2d(y, conv_->weight, conv_->bias, 1, 1);
    } else {
      y = at::constant_pad_nd(y, {0, 1, 0, 1});
      y = at::conv2d(y, conv_->weight, conv_->bias, 2);
    }
    x = batch_to_frames(y, b);
    if (mode_ == ResampleMode::kDownsample3d) {
      const size_t i = cache.next();
      if (!cache.slots[i].defined()) {
        cache.slots[i] = x.clone();  // the first chunk: no temporal downsampling
      } else {
        const at::Tensor previous = cache.slots[i];
        at::Tensor cache_x = last_frames(x, 1);
        x = time_conv_->forward(at::cat({previous.narrow(2, previous.size(2) - 1, 1), x}, 2));
        cache.slots[i] = cache_x;
      }
    }
    return x;
  }

 private:
  ResampleMode mode_;
  std::shared_ptr<Conv2dParams> conv_;
  std::shared_ptr<WanCausalConv3d> time_conv_;
};

// AvgDown3D: mean over groups of the space-to-channel rearrangement (front-padding the frames
// to a multiple of factor_t).
at::Tensor avg_down(const at::Tensor& input, int64_t out_channels, int64_t ft, int64_t fs) {
  const int64_t pad_t = (ft - input.size(2) % ft) % ft;
  const at::Tensor x = pad_t ? at::constant_pad_nd(input, {0, 0, 0, 0, pad_t, 0}) : input;
  const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), w = x.size(4);
  const int64_t factor = ft * fs * fs;
  auto y = x.view({b, c, t / ft, ft, h / fs, fs, w / fs, fs})
               .permute({0, 1, 3, 5, 7, 2, 4, 6})
               .contiguous()
               .view({b, out_channels, c * factor / out_channels, t / ft, h / fs, w / fs});
  return y.mean(2);
}

// DupUp3D: channel-to-space/time duplication; the first chunk drops its first ft - 1 frames.
at::Tensor dup_up(const at::Tensor& x, int64_t out_channels, int64_t ft, int64_t fs,
                  bool first_chunk) {
  const int64_t repeats = out_channels * ft * fs * fs / x.size(1);
  const int64_t b = x.size(0), t = x.size(2), h = x.size(3), w = x.size(4);
  auto y = x.repeat_interleave(repeats, 1)
               .view({b, out_channels, ft, fs, fs, t, h, w})
               .permute({0, 1, 5, 2, 6, 3, 7, 4})
               .contiguous()
               .view({b, out_channels, t * ft, h * fs, w * fs});
  if (first_chunk) y = y.narrow(2, ft - 1, y.size(2) - (ft - 1));
  return y;
}

// WanResidualDownBlock (Wan2.2): resnets, an optional downsampler, plus AvgDown3D of the input.
class ResidualDownBlock : public WanVAELayer {
 public:
  ResidualDownBlock(int64_t in, int64_t out, int64_t num_res_blocks, bool temporal, bool down,
                    at::ScalarType dtype)
      : WanVAELayer("WanResidualDownBlock"), out_(out), ft_(temporal ? 2 : 1), fs_(down ? 2 : 1) {
    OMNI_CHECK(in * ft_ * fs_ * fs_ % out == 0, "AutoencoderKLWan: AvgDown3D of ", in,
               " channels by ", ft_ * fs_ * fs_, " is not divisible into ", out);
    resnets_ = register_module("resnets", torch::nn::ModuleList());
    for (int64_t j = 0; j < num_res_blocks; ++j) {
      resnets_->push_back(std::make_shared<ResidualBlock>(j == 0 ? in : out, out, dtype));
    }
    if (down) {
      downsampler_ = child<Resample>(
          *this, "downsampler", out,
          temporal ? ResampleMode::kDownsample3d : ResampleMode::kDownsample2d, out, dtype);
    }
  }
  at::Tensor forward(const at::Tensor& input, WanFeatureCache& cache, bool) override {
    at::Tensor x = input;
    for (const auto& r : *resnets_) x = r->as<WanVAELayer>()->forward(x, cache, false);
    if (downsampler_) x = downsampler_->forward(x, cache, false);
    return x + avg_down(input, out_, ft_, fs_);
  }

 private:
  int64_t out_, ft_, fs_;
  torch::nn::ModuleList resnets_;
  std::shared_ptr<Resample> downsampler_;
};

// WanUpBlock (Wan2.1: resnets, upsamplers.0) and WanResidualUpBlock (Wan2.2: resnets,
// upsampler, plus DupUp3D of the input when it upsamples).
class UpBlock : public WanVAELayer {
 public:
  UpBlock(int64_t in, int64_t out, int64_t num_res_blocks, bool residual, bool up, bool temporal,
          at::ScalarType dtype)
      : WanVAELayer(residual ? "WanResidualUpBlock" : "WanUpBlock"),
        residual_(residual && up),
        out_(out),
        ft_(temporal ? 2 : 1) {
    if (residual_) {
      OMNI_CHECK(out * ft_ * 4 % in == 0, "AutoencoderKLWan: DupUp3D of ", in,
                 " channels does not divide ", out, " x ", ft_ * 4);
    }
    resnets_ = register_module("resnets", torch::nn::ModuleList());
    for (int64_t j = 0; j <= num_res_blocks; ++j) {
      resnets_->push_back(std::make_shared<ResidualBlock>(j == 0 ? in : out, out, dtype));
    }
    if (up) {
      const auto mode = temporal ? ResampleMode::kUpsample3d : ResampleMode::kUpsample2d;
      if (residual) {
        upsampler_ = child<Resample>(*this, "upsampler", out, mode, out, dtype);
      } else {
        auto list = register_module("upsamplers", torch::nn::ModuleList());
        upsampler_ = std::make_shared<Resample>(out, mode, out / 2, dtype);
        list->push_back(upsampler_);
      }
    }
  }
  at::Tensor forward(const at::Tensor& input, WanFeatureCache& cache, bool first_chunk) override {
    at::Tensor x = input;
    for (const auto& r : *resnets_) x = r->as<WanVAELayer>()->forward(x, cache, false);
    if (upsampler_) x = upsampler_->forward(x, cache, false);
    if (residual_) x = x + dup_up(input, out_, ft_, 2, first_chunk);
    return x;
  }

 private:
  bool residual_;
  int64_t out_, ft_;
  torch::nn::ModuleList resnets_;
  std::shared_ptr<Resample> upsampler_;
};

std::shared_ptr<WanCausalConv3d> conv3(torch::nn::Module& parent, const std::string& name,
                                       int64_t in, int64_t out, at::ScalarType dtype) {
  return child<WanCausalConv3d>(parent, name, in, out, std::vector<int64_t>{3, 3, 3},
                                std::vector<int64_t>{1, 1, 1}, std::vector<int64_t>{1, 1, 1},
                                dtype);
}

std::shared_ptr<WanCausalConv3d> conv1(torch::nn::Module& parent, const std::string& name,
                                       int64_t dim, at::ScalarType dtype) {
  return child<WanCausalConv3d>(parent, name, dim, dim, std::vector<int64_t>{1, 1, 1},
                                std::vector<int64_t>{1, 1, 1}, std::vector<int64_t>{0, 0, 0},
                                dtype);
}

// patchify / unpatchify of diffusers' Wan VAE: the channel index is c * p * p + pw * p + ph
// (the width offset before the height offset).
at::Tensor patchify(const at::Tensor& x, int64_t p) {
  if (p == 1) return x;
  const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), w = x.size(4);
  OMNI_CHECK(h % p == 0 && w % p == 0, "AutoencoderKLWan: video height ", h, " and width ", w,
             " must be multiples of patch_size ", p);
  return x.view({b, c, t, h / p, p, w / p, p})
      .permute({0, 1, 6, 4, 2, 3, 5})
      .contiguous()
      .view({b, c * p * p, t, h / p, w / p});
}

at::Tensor unpatchify(const at::Tensor& x, int64_t p) {
  if (p == 1) return x;
  const int64_t b = x.size(0), t = x.size(2), h = x.size(3), w = x.size(4);
  const int64_t c = x.size(1) / (p * p);
  return x.view({b, c, p, p, t, h, w})
      .permute({0, 1, 4, 5, 3, 6, 2})
      .contiguous()
      .view({b, c, t, h * p, w * p});
}

void check_field(const HfConfig& json, const std::string& cls, bool ok, const std::string& field,
                 const std::string& value, const std::string& why) {
  OMNI_CHECK(ok, json.source(), ": field '", field, "' = ", value, " is not supported by ", cls,
             ": ", why);
}

std::string dump(const HfConfig& json, const std::string& field) {
  return json.raw().contains(field) ? json.raw()[field].dump() : "(absent)";
}

// The latents_mean / latents_std defaults of both diffusers classes (Wan2.1's tables, z_dim 16).
constexpr double kDefaultLatentsMean[] = {-0.7571, -0.7089, -0.9113, 0.1075,  -0.1745, 0.9653,
                                          -0.1517, 1.5508,  0.4134,  -0.0715, 0.5517,  -0.3632,
                                          -0.1922, -0.9497, 0.2503,  -0.2921};
constexpr double kDefaultLatentsStd[] = {2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708,
                                         2.6052, 2.0743, 3.2687, 2.1526, 2.8652, 1.5579,
                                         1.6382, 1.1253, 2.8251, 1.9160};

}  // namespace

WanVAEConfig WanVAEConfig::from_hf(const HfConfig& json) {
  const std::string cls = json.get_string("_class_name", "AutoencoderKLWan");
  const bool qwen = cls == "AutoencoderKLQwenImage";
  // Names the class the config declares (the Wan one when it is neither).
  const std::string model = qwen ? cls : "AutoencoderKLWan";
  auto check = [&json, &model](bool ok, const std::string& field, const std::string& value,
                               const std::string& why) {
    check_field(json, model, ok, field, value, why);
  };
  check(cls == "AutoencoderKLWan" || qwen, "_class_name", "\"" + cls + "\"",
        "expected \"AutoencoderKLWan\" or \"AutoencoderKLQwenImage\"");
  WanVAEConfig c;
  auto positive = [&json, &check](const char* field, int64_t fallback) {
    const int64_t v = json.get_int(field, fallback);
    check(v > 0, field, std::to_string(v), "must be positive");
    return v;
  };
  c.base_dim = positive("base_dim", 96);
  c.z_dim = positive("z_dim", 16);
  c.dim_mult = json.get_int_list("dim_mult", std::vector<int64_t>{1, 2, 4, 4});
  check(!c.dim_mult.empty() &&
            std::all_of(c.dim_mult.begin(), c.dim_mult.end(), [](int64_t m) { return m > 0; }),
        "dim_mult", dump(json, "dim_mult"), "expected a non-empty list of positive integers");
  c.num_res_blocks = positive("num_res_blocks", 2);
  if (qwen) {
    // AutoencoderKLQwenImage is the Wan2.1 design: one `input_channels` for the encoder's input
    // and the decoder's output, and none of AutoencoderKLWan's Wan2.2 fields (decoder_base_dim,
    // is_residual, in/out_channels, patch_size, scale_factor_*), which diffusers ignores in its
    // config as we do here.
    c.in_channels = c.out_channels = positive("input_channels", 3);
    c.decoder_base_dim = c.base_dim;
    c.is_residual = false;
    c.patch_size = 1;
  } else {
    c.decoder_base_dim =
        json.has("decoder_base_dim") ? positive("decoder_base_dim", 96) : c.base_dim;
    c.is_residual = json.get_bool("is_residual", false);
    c.in_channels = positive("in_channels", 3);
    c.out_channels = positive("out_channels", 3);
    c.patch_size = json.has("patch_size") ? positive("patch_size", 1) : 1;
    c.scale_factor_temporal = positive("scale_factor_temporal", 4);
    c.scale_factor_spatial = positive("scale_factor_spatial", 8);
  }

  if (json.has("temperal_downsample")) {
    const auto& raw = json.raw()["temperal_downsample"];
    bool ok = raw.is_array();
    c.temperal_downsample.clear();
    if (ok) {
      for (const auto& v : raw) {
        ok = ok && v.is_boolean();
        if (ok) c.temperal_downsample.push_back(v.get<bool>());
      }
    }
    check(ok, "temperal_downsample", raw.dump(), "expected a list of booleans");
  }
  check(c.temperal_downsample.size() + 1 >= c.dim_mult.size(), "temperal_downsample",
        dump(json, "temperal_downsample"),
        "needs an entry for each of the len(dim_mult) - 1 = " +
            std::to_string(c.dim_mult.size() - 1) + " downsampling stages");
  if (qwen) {
    // Not config fields there: the factors the stages give (diffusers' spatial ratio,
    // 2 ** len(temperal_downsample), is the same with one entry per downsampling stage).
    c.scale_factor_spatial = int64_t{1} << (c.dim_mult.size() - 1);
    c.scale_factor_temporal = 1;
    for (size_t i = 0; i + 1 < c.dim_mult.size(); ++i) {
      if (c.temperal_downsample[i]) c.scale_factor_temporal *= 2;
    }
  }

  if (json.has("attn_scales")) {
    const auto& raw = json.raw()["attn_scales"];
    check(raw.is_array() && raw.empty(), "attn_scales", raw.dump(),
          "attention in the down blocks is not implemented; expected []");
  }

  // Absent tables: diffusers' defaults (Wan2.1's, in both classes) when z_dim is their 16;
  // identity scaling otherwise (diffusers' 16-entry defaults cannot scale other latents).
  const bool default_tables = c.z_dim == 16;
  auto read_floats = [&](const char* field, const double* defaults, double fallback) {
    std::vector<double> out(static_cast<size_t>(c.z_dim), fallback);
    if (default_tables) out.assign(defaults, defaults + 16);
    if (!json.has(field)) return out;
    const auto& raw = json.raw()[field];
    bool ok = raw.is_array() && raw.size() == static_cast<size_t>(c.z_dim);
    for (size_t i = 0; ok && i < raw.size(); ++i) {
      ok = raw[i].is_number();
      if (ok) out[i] = raw[i].get<double>();
    }
    check(ok, field, raw.dump(),
          "expected a list of z_dim = " + std::to_string(c.z_dim) + " numbers");
    return out;
  };
  c.latents_mean = read_floats("latents_mean", kDefaultLatentsMean, 0.0);
  c.latents_std = read_floats("latents_std", kDefaultLatentsStd, 1.0);
  for (double s : c.latents_std) {
    check(s != 0.0, "latents_std", dump(json, "latents_std"), "entries must be non-zero");
  }
  return c;
}

WanVAEConfig WanVAEConfig::load(const std::string& path) { return from_hf(HfConfig::load(path)); }

size_t WanFeatureCache::next() {
  if (index == slots.size()) {
    slots.emplace_back();
    rep.push_back(false);
  }
  return index++;
}

void WanFeatureCache::clear() {
  slots.clear();
  rep.clear();
  index = 0;
}

WanCausalConv3d::WanCausalConv3d(int64_t in, int64_t out, std::vector<int64_t> kernel,
                                 std::vector<int64_t> stride, std::vector<int64_t> padding,
                                 at::ScalarType dtype)
    : torch::nn::Module("WanCausalConv3d"),
      stride_(std::move(stride)),
      padding_(std::move(padding)) {
  weight = register_parameter(
      "weight", uninitialized({out, in, kernel[0], kernel[1], kernel[2]}, dtype), false);
  bias = register_parameter("bias", uninitialized({out}, dtype), false);
}

at::Tensor WanCausalConv3d::forward(const at::Tensor& x, const at::Tensor& cache) const {
  at::Tensor h = x;
  int64_t pad_t = 2 * padding_[0];
  if (cache.defined() && pad_t > 0) {
    h = at::cat({cache.to(x.device()), h}, 2);
    pad_t -= cache.size(2);
  }
  if (pad_t != 0 || padding_[1] != 0 || padding_[2] != 0) {
    h = at::constant_pad_nd(h, {padding_[2], padding_[2], padding_[1], padding_[1], pad_t, 0});
  }
  return at::conv3d(h, weight, bias, stride_);
}

WanVAEEncoder::WanVAEEncoder(const WanVAEConfig& c, at::ScalarType dtype)
    : HookableModule("WanEncoder3d") {
  std::vector<int64_t> dims{c.base_dim};
  for (int64_t m : c.dim_mult) dims.push_back(c.base_dim * m);
  conv_in_ = conv3(*this, "conv_in", c.in_channels, dims[0], dtype);
  down_blocks_ = register_module("down_blocks", torch::nn::ModuleList());
  const size_t stages = c.dim_mult.size();
  for (size_t i = 0; i < stages; ++i) {
    const bool last = i + 1 == stages;
    const bool temporal = !last && c.temperal_downsample[i];
    if (c.is_residual) {
      down_blocks_->push_back(std::make_shared<ResidualDownBlock>(
          dims[i], dims[i + 1], c.num_res_blocks, temporal, !last, dtype));
      continue;
    }
    int64_t in = dims[i];
    for (int64_t j = 0; j < c.num_res_blocks; ++j) {
      down_blocks_->push_back(std::make_shared<ResidualBlock>(in, dims[i + 1], dtype));
      in = dims[i + 1];
    }
    if (!last) {
      down_blocks_->push_back(std::make_shared<Resample>(
          dims[i + 1], temporal ? ResampleMode::kDownsample3d : ResampleMode::kDownsample2d,
          dims[i + 1], dtype));
    }
  }
  mid_block_ = child<MidBlock>(*this, "mid_block", dims.back(), dtype);
  norm_out_gamma_ = register_gamma(*this, "norm_out", dims.back(), false, dtype);
  conv_out_ = conv3(*this, "conv_out", dims.back(), 2 * c.z_dim, dtype);
}

at::Tensor WanVAEEncoder::forward(const at::Tensor& chunk) {
  return invoke("forward", {chunk},
                [this](offload::HookArgs& a) -> c10::IValue {
                  cache_.rewind();
                  auto x = cached_conv(*conv_in_, a[0].toTensor(), cache_);
                  for (const auto& layer : *down_blocks_) {
                    x = layer->as<WanVAELayer>()->forward(x, cache_, false);
                  }
                  x = mid_block_->forward(x, cache_, false);
                  x = at::silu(rms_norm(x, norm_out_gamma_));
                  return cached_conv(*conv_out_, x, cache_);
                })
      .toTensor();
}

WanVAEDecoder::WanVAEDecoder(const WanVAEConfig& c, at::ScalarType dtype)
    : HookableModule("WanDecoder3d") {
  const int64_t dim = c.decoder_base_dim;
  std::vector<int64_t> dims{dim * c.dim_mult.back()};
  for (auto it = c.dim_mult.rbegin(); it != c.dim_mult.rend(); ++it) dims.push_back(dim * *it);
  const size_t stages = c.dim_mult.size();
  // diffusers' temperal_upsample: the whole temperal_downsample list reversed.
  std::vector<bool> temporal_up(c.temperal_downsample.rbegin(), c.temperal_downsample.rend());

  conv_in_ = conv3(*this, "conv_in", c.z_dim, dims[0], dtype);
  mid_block_ = child<MidBlock>(*this, "mid_block", dims[0], dtype);
  up_blocks_ = register_module("up_blocks", torch::nn::ModuleList());
  for (size_t i = 0; i < stages; ++i) {
    int64_t in = dims[i];
    if (i > 0 && !c.is_residual) in /= 2;
    const bool up = i + 1 != stages;
    const bool temporal = up && temporal_up[i];
    up_blocks_->push_back(std::make_shared<UpBlock>(in, dims[i + 1], c.num_res_blocks,
                                                    c.is_residual, up, temporal, dtype));
  }
  norm_out_gamma_ = register_gamma(*this, "norm_out", dims.back(), false, dtype);
  conv_out_ = conv3(*this, "conv_out", dims.back(), c.out_channels, dtype);
}

at::Tensor WanVAEDecoder::forward(const at::Tensor& chunk, bool first_chunk) {
  return invoke("forward", {chunk, first_chunk},
                [this](offload::HookArgs& a) -> c10::IValue {
                  const bool first = a[1].toBool();
                  cache_.rewind();
                  auto x = cached_conv(*conv_in_, a[0].toTensor(), cache_);
                  x = mid_block_->forward(x, cache_, first);
                  for (const auto& layer : *up_blocks_) {
                    x = layer->as<WanVAELayer>()->forward(x, cache_, first);
                  }
                  x = at::silu(rms_norm(x, norm_out_gamma_));
                  return cached_conv(*conv_out_, x, cache_);
                })
      .toTensor();
}

AutoencoderKLWan::AutoencoderKLWan(const WanVAEConfig& c, at::ScalarType dtype)
    : HookableModule("AutoencoderKLWan", {"decode", "encode"}), c_(c) {
  encoder_ = child<WanVAEEncoder>(*this, "encoder", c, dtype);
  quant_conv_ = conv1(*this, "quant_conv", 2 * c.z_dim, dtype);
  post_quant_conv_ = conv1(*this, "post_quant_conv", c.z_dim, dtype);
  decoder_ = child<WanVAEDecoder>(*this, "decoder", c, dtype);
}

at::Tensor AutoencoderKLWan::decode(const at::Tensor& latents) {
  std::vector<at::Tensor> frames;
  decode_chunks(latents, [&](const at::Tensor& chunk) { frames.push_back(chunk); });
  return at::cat(frames, 2);
}

void AutoencoderKLWan::decode_chunks(const at::Tensor& latents,
                                     const std::function<void(const at::Tensor&)>& on_chunk) {
  invoke("decode", {latents}, [&](offload::HookArgs& a) -> c10::IValue {
    const at::Tensor z = a[0].toTensor();
    OMNI_CHECK(z.dim() == 5 && z.size(1) == c_.z_dim,
               "AutoencoderKLWan::decode: latents must be [B, ", c_.z_dim, ", F, h, w], got ",
               z.sizes());
    const auto x = post_quant_conv_->forward(z);
    decoder_->clear_cache();
    try {
      for (int64_t i = 0; i < x.size(2); ++i) {
        const auto out = decoder_->forward(x.narrow(2, i, 1), i == 0);
        // unpatchify and clamp act frame by frame: apply them per chunk.
        on_chunk(at::clamp(unpatchify(out, c_.patch_size), -1.0, 1.0));
      }
    } catch (...) {
      decoder_->clear_cache();  // the cache holds a chunk's features: not kept past the call
      throw;
    }
    decoder_->clear_cache();
    return c10::IValue();
  });
}

WanLatentDistribution AutoencoderKLWan::encode(const at::Tensor& video) {
  const auto result = invoke("encode", {video}, [this](offload::HookArgs& a) -> c10::IValue {
    const at::Tensor v = a[0].toTensor();
    const int64_t pp = c_.patch_size * c_.patch_size;
    OMNI_CHECK(v.dim() == 5 && v.size(1) * pp == c_.in_channels,
               "AutoencoderKLWan::encode: video must be [B, ", c_.in_channels / pp,
               ", T, H, W], got ", v.sizes());
    const auto x = patchify(v, c_.patch_size);
    const int64_t frames = x.size(2);
    // The first frame alone, then groups of 4; frames past the last full group are
    // dropped, as diffusers' chunking (1 + (T - 1) // 4 chunks) drops them.
    encoder_->clear_cache();
    std::vector<at::Tensor> chunks;
    chunks.push_back(encoder_->forward(x.narrow(2, 0, 1)));
    for (int64_t i = 1; i <= (frames - 1) / 4; ++i) {
      chunks.push_back(encoder_->forward(x.narrow(2, 1 + 4 * (i - 1), 4)));
    }
    encoder_->clear_cache();
    const auto moments = quant_conv_->forward(at::cat(chunks, 2)).chunk(2, 1);
    return c10::ivalue::Tuple::create({moments[0], at::clamp(moments[1], -30.0, 20.0)});
  });
  const auto& parts = result.toTupleRef().elements();
  return {parts[0].toTensor(), parts[1].toTensor()};
}

at::Tensor AutoencoderKLWan::normalize_latents(const at::Tensor& latents, StdScaling how) const {
  const auto opts = at::TensorOptions().dtype(at::kDouble);
  const auto mean = at::tensor(c_.latents_mean, opts).to(at::kFloat).view({1, -1, 1, 1, 1});
  const auto std = at::tensor(c_.latents_std, opts).to(at::kFloat).view({1, -1, 1, 1, 1});
  const auto centred = latents - mean.to(latents.options());
  if (how == StdScaling::kDivide) return centred / std.to(latents.options());
  return centred * (1.0 / std).to(latents.options());
}

at::Tensor AutoencoderKLWan::denormalize_latents(const at::Tensor& latents) const {
  const auto opts = at::TensorOptions().dtype(at::kDouble);
  const auto mean = at::tensor(c_.latents_mean, opts).to(at::kFloat).view({1, -1, 1, 1, 1});
  const auto inv_std =
      (1.0 / at::tensor(c_.latents_std, opts).to(at::kFloat)).view({1, -1, 1, 1, 1});
  return latents / inv_std.to(latents.options()) + mean.to(latents.options());
}

std::shared_ptr<AutoencoderKLWan> load_wan_vae(const std::string& dir, at::ScalarType dtype) {
  const auto config = WanVAEConfig::load(dir);
  const auto checkpoint = SafetensorsCheckpoint::open(dir);
  auto model = std::make_shared<AutoencoderKLWan>(config, dtype);
  load_weights(*model, checkpoint, "");
  return model;
}

}  // namespace omni::models
