// Qwen2.5-VL's vision side against transformers 5.24.0 (tests/fixtures/qwen2_5_vl_vision_tiny,
// written by make_qwen2_5_vl_vision_fixture.py): the image processor's patches, the window
// layout, the vision tower (windowed and full-attention blocks) over three images, the 3-D rope
// positions of a left-padded batch of prompts holding them, and the decoder's last hidden state
// with the image embeddings spliced in; then the hookable blocks, both checkpoint layouts,
// Qwen2.5-Omni's split q / k / v, and the errors for bad config fields, a missing weight and
// inputs that do not fit together.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cpu_offload/check.h"
#include "cpu_offload/hooks.h"
#include "model_runner/preprocess/image.h"
#include "model_runner/qwen2_5/decoder.h"
#include "model_runner/qwen2_5/image_inputs.h"
#include "model_runner/qwen2_5/rope_index.h"
#include "model_runner/qwen2_5/vision_config.h"
#include "model_runner/qwen2_5/vision_tower.h"
#include "model_runner/weights/load_weights.h"
#include "model_runner/weights/safetensors.h"
#include "qwen2_5/vision_windows.h"
#include "weights_test_util.h"

namespace omni::models {
namespace {

using testing::error_of;

const std::string kDir = std::string(OMNI_FIXTURES_DIR) + "/qwen2_5_vl_vision_tiny";

// The fixture's images in prompt order: a, b (first prompt), b (second prompt).
const std::vector<std::array<int64_t, 3>> kGrids = {{1, 6, 10}, {1, 12, 4}, {1, 12, 4}};
constexpr int64_t kTokensA = 15, kTokensB = 12;  // merged patches of a and b

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// Rows of `hidden` [B, L, H] where `mask` [B, L] is 1, concatenated: [tokens, H].
at::Tensor valid_rows(const at::Tensor& hidden, const at::Tensor& mask) {
  return hidden.reshape({-1, hidden.size(2)})
      .index_select(0, at::nonzero(mask.reshape(-1)).squeeze(1));
}

at::Tensor ref(const std::string& name) {
  static const SafetensorsFile file = SafetensorsFile::open(kDir + "/reference.safetensors");
  return file.tensor(name);
}

RgbImage rgb(const at::Tensor& pixels) {  // uint8 [H, W, 3]
  RgbImage image;
  image.height = pixels.size(0);
  image.width = pixels.size(1);
  image.pixels.resize(static_cast<size_t>(pixels.numel()));
  std::memcpy(image.pixels.data(), pixels.contiguous().data_ptr<uint8_t>(), image.pixels.size());
  return image;
}

std::vector<int64_t> longs(const at::Tensor& t) {
  const auto c = t.to(at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

qwen2_5::RopeIndex fixture_positions() {
  return qwen2_5::rope_index(ref("input_ids"), ref("attention_mask"), kGrids,
                             qwen2_5::ImageTokenIds::load(kDir),
                             qwen2_5::VisionConfig::load(kDir).spatial_merge_size);
}

TEST(Qwen25VlVision, ProcessorPatchesMatchTransformers) {
  const auto options = vision_options_from_preprocessor_config(kDir);
  EXPECT_EQ(options.patch_size, 4);
  EXPECT_EQ(options.min_pixels, 256);
  EXPECT_EQ(options.max_pixels, 1024);
  const auto a = image_to_patches(rgb(ref("image_a_rgb")), options);
  const auto b = image_to_patches(rgb(ref("image_b_rgb")), options);
  EXPECT_EQ(a.grid_thw, kGrids[0]);
  EXPECT_EQ(b.grid_thw, kGrids[1]);
  EXPECT_TRUE(
      at::equal(ref("image_grid_thw"),
                at::tensor(std::vector<int64_t>{1, 6, 10, 1, 12, 4, 1, 12, 4}).view({3, 3})));
  const auto pixels = at::cat({a.pixel_values, b.pixel_values, b.pixel_values});
  ASSERT_EQ(pixels.sizes(), ref("pixel_values").sizes());
  EXPECT_TRUE(pixels.equal(ref("pixel_values")))
      << "not bit-identical, max abs diff " << max_abs_diff(pixels, ref("pixel_values"));
}

TEST(Qwen25VlVision, WindowsMatchTransformers) {
  std::vector<int64_t> grid;
  for (const auto& thw : kGrids) grid.insert(grid.end(), thw.begin(), thw.end());
  const auto windows = qwen2_5::vision_windows(grid, 2, 16, 4);
  EXPECT_EQ(windows.merged_order, longs(ref("window_index")));
  EXPECT_EQ(windows.bounds, longs(ref("cu_window_seqlens")));
}

TEST(Qwen25VlVision, TowerMatchesTransformers) {
  c10::InferenceMode guard;
  const auto tower = qwen2_5::load_vision_tower(kDir, at::kFloat);
  EXPECT_EQ(tower->config().depth, 3);
  EXPECT_EQ(tower->config().head_dim, 16);
  EXPECT_EQ(tower->config().fullatt_block_indexes, (std::vector<int64_t>{1}));
  const auto out = tower->forward(ref("pixel_values"), kGrids);
  ASSERT_EQ(out.sizes(), ref("image_embeds").sizes());
  ASSERT_EQ(out.scalar_type(), at::kFloat);
  const double diff = max_abs_diff(out, ref("image_embeds"));
  std::cout << "qwen2.5-vl vision tower max abs diff vs transformers: " << diff << "\n";
  EXPECT_LE(diff, 1e-4);

  // Each image alone gives its rows of the batch: attention never crosses images.
  const auto pixels = ref("pixel_values");
  const auto a = tower->forward(pixels.narrow(0, 0, 60), {kGrids[0]});
  const auto b = tower->forward(pixels.narrow(0, 60, 48), {kGrids[1]});
  EXPECT_LE(max_abs_diff(a, out.narrow(0, 0, kTokensA)), 1e-5);
  EXPECT_LE(max_abs_diff(b, out.narrow(0, kTokensA, kTokensB)), 1e-5);
}

TEST(Qwen25VlVision, WindowedBlocksAttendInsideWindows) {
  // The same weights with every block attending over the whole image: different embeddings, so
  // the fixture does exercise the windows.
  c10::InferenceMode guard;
  auto config = qwen2_5::VisionConfig::load(kDir);
  config.fullatt_block_indexes = {0, 1, 2};
  qwen2_5::VisionTower full(config, at::kFloat);
  const auto checkpoint = SafetensorsCheckpoint::open(kDir);
  load_weights(full, checkpoint, qwen2_5::vision_prefix(checkpoint));
  const double diff = max_abs_diff(full.forward(ref("pixel_values"), kGrids), ref("image_embeds"));
  EXPECT_GT(diff, 1e-2);
}

TEST(Qwen25VlVision, RopeIndexMatchesTransformers) {
  const auto tokens = qwen2_5::ImageTokenIds::load(kDir);
  // The processor marks exactly the <|image_pad|> tokens as images.
  EXPECT_TRUE(at::equal(ref("mm_token_type_ids"),
                        ref("input_ids").eq(tokens.image_token_id).to(at::kLong)));
  const auto positions = fixture_positions();
  ASSERT_EQ(positions.position_ids.sizes(), ref("position_ids").sizes());
  EXPECT_TRUE(at::equal(positions.position_ids, ref("position_ids")))
      << positions.position_ids << "\nexpected\n"
      << ref("position_ids");
  EXPECT_TRUE(at::equal(positions.rope_deltas, ref("rope_deltas")));

  // Alone and unpadded, the second prompt gets the positions of its tokens in the batch.
  const auto mask = ref("attention_mask");
  const int64_t n = mask[1].sum().item<int64_t>(), length = mask.size(1);
  const auto alone = qwen2_5::rope_index(ref("input_ids")[1].narrow(0, length - n, n).view({1, n}),
                                         {}, {kGrids[2]}, tokens, 2);
  EXPECT_TRUE(at::equal(alone.position_ids.select(1, 0),
                        ref("position_ids").select(1, 1).narrow(1, length - n, n)));
  EXPECT_EQ(alone.rope_deltas.item<int64_t>(), ref("rope_deltas")[1][0].item<int64_t>());
}

TEST(Qwen25VlVision, MultimodalHiddenStateMatchesTransformers) {
  c10::InferenceMode guard;
  const auto decoder = qwen2_5::load_text_decoder(kDir, at::kFloat);
  const auto tower = qwen2_5::load_vision_tower(kDir, at::kFloat);
  const auto tokens = qwen2_5::ImageTokenIds::load(kDir);
  const auto ids = ref("input_ids");
  const auto mask = ref("attention_mask");
  const auto embeds = qwen2_5::splice_image_embeds(
      decoder->embed(ids), ids, tower->forward(ref("pixel_values"), kGrids), tokens.image_token_id);
  const auto positions = fixture_positions().position_ids;
  const auto hidden = decoder->forward_embeds(embeds, mask, positions);
  ASSERT_EQ(hidden.sizes(), ref("last_hidden_state").sizes());
  // Left padding: compared where the tokens are (a padded query sees no key).
  const double diff =
      max_abs_diff(valid_rows(hidden, mask), valid_rows(ref("last_hidden_state"), mask));
  std::cout << "qwen2.5-vl multimodal last hidden state max abs diff vs transformers: " << diff
            << "\n";
  EXPECT_LE(diff, 1e-4);

  // Sequential positions (what diffusers' QwenImageEditPipeline gets without mm_token_type_ids)
  // are a different input: the 3-D positions do matter here.
  const auto sequential = decoder->forward_embeds(embeds, mask);
  EXPECT_GT(max_abs_diff(valid_rows(sequential, mask), valid_rows(ref("last_hidden_state"), mask)),
            1e-2);
}

TEST(Qwen25VlVision, Bfloat16StaysClose) {
  c10::InferenceMode guard;
  const auto tower = qwen2_5::load_vision_tower(kDir);  // the checkpoint's bfloat16
  ASSERT_EQ(tower->dtype(), at::kBFloat16);
  const auto out = tower->forward(ref("pixel_values"), kGrids);
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);
  const auto expected = ref("image_embeds");
  // bf16 keeps ~3 significant digits; a wrong op would be off by the output's own scale.
  const double rel = max_abs_diff(out, expected) / expected.abs().max().item<double>();
  std::cout << "qwen2.5-vl vision tower bf16 max abs diff / max |ref|: " << rel << "\n";
  EXPECT_LE(rel, 0.05);
}

class CountingHook : public offload::ModelHook {
 public:
  void pre_forward(torch::nn::Module&, const std::string&, offload::HookArgs&) override { ++calls; }
  int calls = 0;
};

TEST(Qwen25VlVision, BlocksAreHookableUnits) {
  const auto tower = qwen2_5::load_vision_tower(kDir, at::kFloat);
  ASSERT_EQ(tower->num_blocks(), 3);
  std::vector<std::shared_ptr<CountingHook>> hooks;
  for (int64_t i = 0; i < tower->num_blocks(); ++i) {
    const std::string path = "blocks." + std::to_string(i);
    offload::HookableModule& block = offload::find_hookable(*tower, path);
    EXPECT_EQ(&block, &tower->block(i)) << path;
    hooks.push_back(std::make_shared<CountingHook>());
    block.hooks().attach("forward", "count", hooks.back());
  }
  auto whole = std::make_shared<CountingHook>();
  tower->hooks().attach("forward", "count", whole);

  c10::InferenceMode guard;
  const auto out = tower->forward(ref("pixel_values"), kGrids);
  for (const auto& hook : hooks) EXPECT_EQ(hook->calls, 1);
  EXPECT_EQ(whole->calls, 1);
  EXPECT_LE(max_abs_diff(out, ref("image_embeds")), 1e-4);

  const auto params = tower->named_parameters();
  EXPECT_TRUE(params.contains("patch_embed.proj.weight"));
  EXPECT_FALSE(params.contains("patch_embed.proj.bias"));
  EXPECT_TRUE(params.contains("blocks.2.attn.qkv.bias"));
  EXPECT_TRUE(params.contains("blocks.2.mlp.gate_proj.bias"));
  EXPECT_TRUE(params.contains("blocks.0.norm1.weight"));
  EXPECT_FALSE(params.contains("blocks.0.norm1.bias"));
  EXPECT_TRUE(params.contains("merger.ln_q.weight"));
  EXPECT_TRUE(params.contains("merger.mlp.2.bias"));
}

TEST(Qwen25VlVision, InputsThatDoNotFitAreRefused) {
  c10::InferenceMode guard;
  const auto tokens = qwen2_5::ImageTokenIds::load(kDir);
  const auto ids = ref("input_ids");
  const auto mask = ref("attention_mask");
  // One grid short, one too many, a grid of another size, a video token.
  EXPECT_CONTAINS(error_of([&] {
                    qwen2_5::rope_index(ids, mask, {kGrids[0], kGrids[1]}, tokens, 2);
                  }),
                  "more images");
  EXPECT_CONTAINS(
      error_of([&] {
        qwen2_5::rope_index(ids, mask, {kGrids[0], kGrids[1], kGrids[2], kGrids[2]}, tokens, 2);
      }),
      "4 image grid(s) given");
  EXPECT_CONTAINS(error_of([&] {
                    qwen2_5::rope_index(ids, mask, {kGrids[1], kGrids[0], kGrids[2]}, tokens, 2);
                  }),
                  "needs 12 image tokens");
  auto video = ids.clone();
  video[0][2] = tokens.video_token_id;
  EXPECT_CONTAINS(error_of([&] { qwen2_5::rope_index(video, mask, kGrids, tokens, 2); }), "video");

  const auto embeds = at::zeros({2, ids.size(1), 32});
  EXPECT_CONTAINS(
      error_of([&] {
        qwen2_5::splice_image_embeds(embeds, ids, at::zeros({38, 32}), tokens.image_token_id);
      }),
      "39 image tokens");
  const auto tower = qwen2_5::load_vision_tower(kDir, at::kFloat);
  EXPECT_CONTAINS(error_of([&] { tower->forward(ref("pixel_values"), {kGrids[0]}); }),
                  "grid_thw describes 60 patches");
  EXPECT_CONTAINS(error_of([&] {
                    tower->forward(ref("pixel_values"), {{1, 6, 9}});
                  }),
                  "multiples of spatial_merge_size");
}

class Qwen25VlVisionFiles : public testing::TempDirTest {
 protected:
  // The fixture's folder with `edit` applied to config.json and each tensor name passed through
  // `rename` ("" drops it).
  void copy_model(
      const std::function<void(nlohmann::json&)>& edit,
      const std::function<std::string(const std::string&)>& rename = [](const std::string& name) {
        return name;
      }) {
    auto config = nlohmann::json::parse(testing::read_bytes(kDir + "/config.json"));
    edit(config);
    testing::write_bytes(path("config.json"), config.dump(2));
    const auto weights = SafetensorsFile::open(kDir + "/model.safetensors");
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& name : weights.names()) {
      const std::string to = rename(name);
      if (!to.empty()) tensors.emplace_back(to, weights.tensor(name));
    }
    write_safetensors(path("model.safetensors"), tensors);
  }
};

TEST_F(Qwen25VlVisionFiles, LoadsTheModelVisualLayout) {
  // transformers 4.52+'s in-memory names: model.visual.*, model.language_model.*.
  copy_model([](nlohmann::json&) {},
             [](const std::string& name) {
               if (name.rfind("model.", 0) == 0) return "model.language_model." + name.substr(6);
               if (name.rfind("visual.", 0) == 0) return "model." + name;
               return name;
             });
  c10::InferenceMode guard;
  const auto tower = qwen2_5::load_vision_tower(dir(), at::kFloat);
  EXPECT_LE(max_abs_diff(tower->forward(ref("pixel_values"), kGrids), ref("image_embeds")), 1e-4);
  EXPECT_EQ(qwen2_5::vision_prefix(SafetensorsCheckpoint::open(dir()), ""), "model.visual.");
}

TEST_F(Qwen25VlVisionFiles, LoadsSplitQkvLikeQwen25Omni) {
  // Qwen2.5-Omni's vision encoder keeps attn.q, attn.k, attn.v apart: the same tower once the
  // fused rows are cut in three, found from the checkpoint or from the config's model_type.
  for (const bool by_config : {false, true}) {
    copy_model([&](nlohmann::json& c) {
      if (by_config) c["vision_config"]["model_type"] = "qwen2_5_omni_vision_encoder";
    });
    const auto weights = SafetensorsFile::open(kDir + "/model.safetensors");
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& name : weights.names()) {
      const auto cut = name.find(".attn.qkv.");
      if (cut == std::string::npos) {
        tensors.emplace_back(name, weights.tensor(name));
        continue;
      }
      const auto parts = weights.tensor(name).chunk(3, 0);
      const std::string head = name.substr(0, cut) + ".attn.", tail = name.substr(cut + 10);
      for (int i = 0; i < 3; ++i) {
        std::string split = head;
        split += "qkv"[i];
        split += ".";
        split += tail;
        tensors.emplace_back(split, parts[i].clone());
      }
    }
    write_safetensors(path("model.safetensors"), tensors);
    if (by_config) {
      EXPECT_TRUE(qwen2_5::VisionConfig::load(dir()).split_qkv);
    }
    c10::InferenceMode guard;
    const auto tower = qwen2_5::load_vision_tower(dir(), at::kFloat);
    EXPECT_TRUE(tower->named_parameters().contains("blocks.1.attn.k.bias"));
    EXPECT_LE(max_abs_diff(tower->forward(ref("pixel_values"), kGrids), ref("image_embeds")), 1e-4);
  }
}

TEST_F(Qwen25VlVisionFiles, BadConfigFieldsAreNamed) {
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](nlohmann::json& c) { c["vision_config"]["hidden_act"] = "gelu"; },
       "vision_config.hidden_act"},
      {[](nlohmann::json& c) { c["vision_config"]["num_heads"] = 3; }, "vision_config.num_heads"},
      {[](nlohmann::json& c) { c["vision_config"]["num_heads"] = 16; },  // head_dim 2
       "vision_config.num_heads"},
      {[](nlohmann::json& c) { c["vision_config"]["window_size"] = 4; },
       "vision_config.window_size"},
      {[](nlohmann::json& c) {
         c["vision_config"]["fullatt_block_indexes"] = {1, -1};
       },
       "vision_config.fullatt_block_indexes"},
      {[](nlohmann::json& c) { c["vision_config"]["rope_parameters"]["rope_type"] = "default"; },
       "vision_config.rope_parameters.rope_type"},
      {[](nlohmann::json& c) { c["vision_config"]["spatial_merge_size"] = 0; },
       "vision_config.spatial_merge_size"},
      {[](nlohmann::json& c) { c["vision_config"].erase("depth"); }, "vision_config.depth"},
  };
  for (const auto& [edit, field] : cases) {
    copy_model(edit);
    const std::string error = error_of([&] { qwen2_5::load_vision_tower(dir()); });
    EXPECT_CONTAINS(error, field);
    EXPECT_CONTAINS(error, path("config.json"));
  }
  copy_model([](nlohmann::json& c) { c["image_token_id"] = -1; });
  const std::string error = error_of([&] { qwen2_5::ImageTokenIds::load(dir()); });
  EXPECT_CONTAINS(error, "image_token_id");
  EXPECT_CONTAINS(error, path("config.json"));
}

TEST_F(Qwen25VlVisionFiles, MissingWeightIsNamed) {
  const std::string missing = "visual.blocks.1.mlp.up_proj.bias";
  copy_model([](nlohmann::json&) {},
             [&](const std::string& name) { return name == missing ? "" : name; });
  EXPECT_CONTAINS(error_of([&] { qwen2_5::load_vision_tower(dir()); }), missing);
}

TEST(Qwen25VlVision, MatchesTransformersOnCuda) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  c10::InferenceMode guard;
  const at::Device cuda(at::kCUDA);
  const auto decoder = qwen2_5::load_text_decoder(kDir, at::kFloat);
  const auto tower = qwen2_5::load_vision_tower(kDir, at::kFloat);
  decoder->to(cuda);
  tower->to(cuda);
  const auto image_embeds = tower->forward(ref("pixel_values"), kGrids);
  ASSERT_TRUE(image_embeds.is_cuda());
  // TF32 is off by default in LibTorch; allow for the GPU kernels' summation order.
  const double tower_diff = max_abs_diff(image_embeds.cpu(), ref("image_embeds"));
  std::cout << "qwen2.5-vl vision tower (CUDA) max abs diff: " << tower_diff << "\n";
  EXPECT_LE(tower_diff, 1e-3);

  const auto ids = ref("input_ids").to(cuda);
  const auto mask = ref("attention_mask");
  const auto embeds = qwen2_5::splice_image_embeds(
      decoder->embed(ids), ids, image_embeds, qwen2_5::ImageTokenIds::load(kDir).image_token_id);
  const auto hidden =
      decoder->forward_embeds(embeds, mask.to(cuda), fixture_positions().position_ids);
  const double diff =
      max_abs_diff(valid_rows(hidden.cpu(), mask), valid_rows(ref("last_hidden_state"), mask));
  std::cout << "qwen2.5-vl multimodal last hidden state (CUDA) max abs diff: " << diff << "\n";
  EXPECT_LE(diff, 1e-3);
}

}  // namespace
}  // namespace omni::models
