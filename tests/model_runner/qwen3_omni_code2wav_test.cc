// Qwen3-Omni's code2wav and the streaming decoder against the Hugging Face reference
// (transformers 5.23.0, fp32) on the tiny random checkpoint of tests/fixtures/qwen3_omni_tiny
// (make_qwen3_omni_fixture.py): the talker's codes of three prompts -> waveforms within 1e-4,
// the streamed schedules equal to the reference's chunked decode, the flat cost of a long
// stream, and the errors. The tiny model's sliding window is 8 frames: the 24-frame waveforms
// (one chunk of 24 frames) and the 20-frame second chunk of the 4/25/25 stream exercise it.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cpu_offload/check.h"
#include "cpu_offload/hooks.h"
#include "model_runner/qwen3_omni/code2wav.h"
#include "model_runner/qwen3_omni/code2wav_stream.h"
#include "model_runner/weights/hf_config.h"
#include "model_runner/weights/load_weights.h"
#include "model_runner/weights/safetensors.h"

namespace omni::models::qwen3_omni {
namespace {

namespace fs = std::filesystem;
const std::string kDir = std::string(OMNI_FIXTURES_DIR) + "/qwen3_omni_tiny";

const SafetensorsFile& reference() {
  static const SafetensorsFile file = SafetensorsFile::open(kDir + "/reference.safetensors");
  return file;
}

Code2WavConfig fixture_config() { return parse_code2wav_config(HfConfig::load(kDir)); }

std::shared_ptr<Code2Wav> load_code2wav() {
  auto model = std::make_shared<Code2Wav>(fixture_config(), at::kFloat);
  load_weights(*model, SafetensorsCheckpoint::open(kDir), "code2wav.");
  return model;
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR_HAS(message, ...)                                                      \
  do {                                                                                      \
    const std::string m = (message);                                                        \
    EXPECT_FALSE(m.empty()) << "no error";                                                  \
    for (const std::string part : {__VA_ARGS__}) {                                          \
      EXPECT_NE(m.find(part), std::string::npos) << "missing \"" << part << "\" in: " << m; \
    }                                                                                       \
  } while (0)

// The reference's stream_decode (make_qwen3_omni_fixture.py) written out with forward().
at::Tensor stream_decode(Code2Wav& model, const at::Tensor& codes, int64_t first, int64_t chunk,
                         int64_t context) {
  std::vector<at::Tensor> wavs;
  const int64_t frames = codes.size(1);
  for (int64_t start = 0, size = first; start < frames; size = chunk) {
    const int64_t end = std::min(start + size, frames);
    const int64_t ctx = std::min(context, start);
    auto wav = model.forward(codes.narrow(1, start - ctx, end - start + ctx)).reshape({-1});
    wavs.push_back(wav.narrow(0, ctx * model.samples_per_frame(),
                              wav.size(0) - ctx * model.samples_per_frame()));
    start = end;
  }
  return at::cat(wavs, 0);
}

// Feeds `codes` in pieces of `piece` frames (the last may be shorter) and finishes.
at::Tensor stream_in_pieces(Code2WavStreamer& streamer, const at::Tensor& codes, int64_t piece) {
  std::vector<at::Tensor> out;
  for (int64_t start = 0; start < codes.size(1); start += piece) {
    out.push_back(streamer.push(codes.narrow(1, start, std::min(piece, codes.size(1) - start))));
  }
  out.push_back(streamer.finish());
  return at::cat(out, 0);
}

// ---------------------------------------------------------------------------- config

TEST(Qwen3OmniCode2Wav, ConfigMatchesTheCheckpoint) {
  const auto cfg = fixture_config();
  EXPECT_EQ(cfg.codebook_size, 128);
  EXPECT_EQ(cfg.hidden_size, 32);
  EXPECT_EQ(cfg.num_attention_heads, 4);
  EXPECT_EQ(cfg.num_key_value_heads, 4);
  EXPECT_EQ(cfg.head_dim, 8);
  EXPECT_EQ(cfg.intermediate_size, 64);
  EXPECT_EQ(cfg.num_hidden_layers, 2);
  EXPECT_EQ(cfg.num_quantizers, 16);
  EXPECT_EQ(cfg.sliding_window, 8);
  EXPECT_DOUBLE_EQ(cfg.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(cfg.rope_theta, 10000.0);
  EXPECT_EQ(cfg.upsample_rates, (std::vector<int64_t>{8, 5, 4, 3}));
  EXPECT_EQ(cfg.upsampling_ratios, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(cfg.decoder_dim, 64);
  EXPECT_EQ(cfg.samples_per_frame(), 1920);
}

std::string config_with(const std::string& code2wav_fields) {
  return R"({"architectures": ["Qwen3OmniMoeForConditionalGeneration"], "code2wav_config": {)" +
         code2wav_fields + "}}";
}

Code2WavConfig parse_inline(const std::string& fields) {
  return parse_code2wav_config(HfConfig::parse(config_with(fields), "inline config.json"));
}

TEST(Qwen3OmniCode2Wav, ConfigOfTheReleasedLayoutAndDefaults) {
  // The released checkpoint's config.json (transformers 4.x) has rope_theta at the top level.
  auto cfg = parse_inline(R"("rope_theta": 12345, "hidden_size": 64, "num_attention_heads": 8,
                                "num_key_value_heads": 2)");
  EXPECT_DOUBLE_EQ(cfg.rope_theta, 12345.0);
  EXPECT_EQ(cfg.head_dim, 8);
  // Absent fields take Qwen3OmniMoeCode2WavConfig's defaults.
  cfg = parse_inline("");
  EXPECT_EQ(cfg.hidden_size, 1024);
  EXPECT_EQ(cfg.head_dim, 64);
  EXPECT_EQ(cfg.sliding_window, 72);
  EXPECT_EQ(cfg.samples_per_frame(), 1920);
  // An explicit head_dim wins.
  EXPECT_EQ(parse_inline(R"("head_dim": 32)").head_dim, 32);
}

TEST(Qwen3OmniCode2Wav, ConfigErrorsNameTheField) {
  EXPECT_ERROR_HAS(error_of([] { parse_inline(R"("hidden_act": "gelu")"); }), "inline config.json",
                   "code2wav_config.hidden_act", "silu");
  EXPECT_ERROR_HAS(error_of([] { parse_inline(R"("hidden_size": 30, "num_attention_heads": 4)"); }),
                   "code2wav_config.num_attention_heads", "divide");
  EXPECT_ERROR_HAS(error_of([] { parse_inline(R"("num_key_value_heads": 5)"); }),
                   "code2wav_config.num_key_value_heads");
  EXPECT_ERROR_HAS(error_of([] { parse_inline(R"("codebook_size": 0)"); }),
                   "code2wav_config.codebook_size", "> 0");
  EXPECT_ERROR_HAS(error_of([] { parse_inline(R"("decoder_dim": 60)"); }),
                   "code2wav_config.decoder_dim");
  EXPECT_ERROR_HAS(error_of([] { parse_inline(R"("upsample_rates": [8, 0])"); }),
                   "code2wav_config.upsample_rates");
  EXPECT_ERROR_HAS(
      error_of([] { parse_inline(R"("rope_parameters": {"rope_type": "yarn", "factor": 2})"); }),
      "code2wav_config.rope_parameters.rope_type", "yarn");
  EXPECT_ERROR_HAS(error_of([] { parse_inline(R"("sliding_window": "x")"); }),
                   "code2wav_config.sliding_window");
  EXPECT_ERROR_HAS(error_of([] {
                     parse_code2wav_config(HfConfig::parse(
                         R"({"architectures": ["Qwen3OmniMoeThinkerForConditionalGeneration"]})",
                         "thinker config.json"));
                   }),
                   "thinker config.json", "code2wav_config", "missing");
}

// ---------------------------------------------------------------------------- weights

TEST(Qwen3OmniCode2Wav, LoadBindsEveryCode2WavTensor) {
  const auto checkpoint = SafetensorsCheckpoint::open(kDir);
  int64_t on_disk = 0;
  for (const auto& name : checkpoint.names()) on_disk += name.rfind("code2wav.", 0) == 0;
  Code2Wav model(fixture_config(), at::kFloat);
  const auto report = load_weights(model, checkpoint, "code2wav.");
  EXPECT_EQ(report.tensors, on_disk);
  EXPECT_GT(on_disk, 100);
  EXPECT_EQ(report.converted, 0);
}

class Code2WavCheckpointCopy : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("omni_code2wav_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const auto file = SafetensorsFile::open(kDir + "/model.safetensors");
    for (const auto& name : file.names()) {
      if (name.rfind("code2wav.", 0) == 0) tensors_.emplace_back(name, file.tensor(name).clone());
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string load_error() {
    const std::string path = (dir_ / "model.safetensors").string();
    write_safetensors(path, tensors_);
    Code2Wav model(fixture_config(), at::kFloat);
    return error_of([&] { load_weights(model, SafetensorsCheckpoint::open(path), "code2wav."); });
  }

  fs::path dir_;
  std::vector<std::pair<std::string, at::Tensor>> tensors_;
};

TEST_F(Code2WavCheckpointCopy, TheUntouchedCopyLoads) { EXPECT_EQ(load_error(), ""); }

TEST_F(Code2WavCheckpointCopy, AMissingTensorIsNamed) {
  const std::string missing = "code2wav.decoder.2.block.3.conv1.conv.weight";
  tensors_.erase(std::remove_if(tensors_.begin(), tensors_.end(),
                                [&](const auto& p) { return p.first == missing; }),
                 tensors_.end());
  EXPECT_ERROR_HAS(load_error(), missing.c_str(), "model.safetensors");
}

TEST_F(Code2WavCheckpointCopy, AnExtraTensorIsNamed) {
  tensors_.emplace_back("code2wav.pre_transformer.layers.2.input_layernorm.weight", at::ones({32}));
  EXPECT_ERROR_HAS(load_error(), "code2wav.pre_transformer.layers.2.input_layernorm.weight",
                   "does not have");
}

TEST_F(Code2WavCheckpointCopy, AMisShapedTensorIsNamed) {
  for (auto& [name, t] : tensors_) {
    if (name == "code2wav.upsample.1.1.pwconv1.weight") t = t.narrow(0, 0, 100).clone();
  }
  EXPECT_ERROR_HAS(load_error(), "code2wav.upsample.1.1.pwconv1.weight", "[100, 32]", "[128, 32]");
}

// ---------------------------------------------------------------------------- waveforms

class Code2WavPrompt : public ::testing::TestWithParam<std::string> {};

TEST_P(Code2WavPrompt, WaveformMatchesTheReference) {
  auto model = load_code2wav();
  const auto codes = reference().tensor("speech_" + GetParam() + "_codes");
  const auto expected = reference().tensor("speech_" + GetParam() + "_wav");
  ASSERT_EQ(codes.sizes(), (std::vector<int64_t>{16, 24}));
  const auto wav = chunked_decode(*model, codes);  // chunk 300, context 25: one chunk of 24
  ASSERT_EQ(wav.sizes(), expected.sizes());
  EXPECT_EQ(wav.size(0), 24 * 1920 - 555);
  EXPECT_EQ(wav.scalar_type(), at::kFloat);
  EXPECT_TRUE(wav.device().is_cpu());
  const double diff = max_abs_diff(wav, expected);
  RecordProperty("max_abs_diff", std::to_string(diff));
  std::cout << "code2wav " << GetParam() << " waveform max abs diff vs HF: " << diff << "\n";
  EXPECT_LE(diff, 1e-4);
  // The reference's own waveform is not flat: the comparison means something.
  EXPECT_GT(expected.abs().max().item<double>(), 1e-3);

  // One forward over the 24 frames is that single chunk.
  const auto direct = model->forward(codes);
  ASSERT_EQ(direct.sizes(), (std::vector<int64_t>{1, 1, 24 * 1920 - 555}));
  EXPECT_TRUE(at::equal(direct.reshape({-1}), wav));
  EXPECT_LE(direct.abs().max().item<double>(), 1.0);
}

INSTANTIATE_TEST_SUITE_P(Prompts, Code2WavPrompt, ::testing::Values("text", "audio", "image"));

TEST(Qwen3OmniCode2Wav, TheSlidingWindowShapesTheWaveform) {
  // Without the window of 8 (every earlier frame visible) the 24-frame waveform is no longer
  // the reference's: the parity above really checks the sliding-window mask.
  auto cfg = fixture_config();
  cfg.sliding_window = 1000;
  Code2Wav unwindowed(cfg, at::kFloat);
  load_weights(unwindowed, SafetensorsCheckpoint::open(kDir), "code2wav.");
  const auto wav = chunked_decode(unwindowed, reference().tensor("speech_text_codes"));
  EXPECT_GT(max_abs_diff(wav, reference().tensor("speech_text_wav")), 1e-4);
}

TEST(Qwen3OmniCode2Wav, ForwardTakesCodesOnAnyIntegerDtypeAndLength) {
  auto model = load_code2wav();
  const auto codes = reference().tensor("speech_text_codes");
  for (int64_t frames : {1, 3, 9}) {
    const auto wav = model->forward(codes.narrow(1, 0, frames));
    EXPECT_EQ(wav.size(-1), frames * 1920 - 555) << frames;
  }
  EXPECT_TRUE(at::equal(model->forward(codes.to(at::kInt)), model->forward(codes)));
  // Non-contiguous codes (a transposed [T, 16] buffer) decode the same.
  const auto transposed = codes.t().contiguous().t();
  EXPECT_TRUE(at::equal(model->forward(transposed), model->forward(codes)));
}

TEST(Qwen3OmniCode2Wav, ChunkedDecodeHonoursTheChunkSchedule) {
  auto model = load_code2wav();
  const auto codes = reference().tensor("speech_text_codes");
  // Chunks of 10 frames (longer than the window of 8) with 5 frames of context.
  const auto chunked = chunked_decode(*model, codes, 10, 5);
  EXPECT_EQ(chunked.size(0), 24 * 1920 - 3 * 555);
  EXPECT_TRUE(at::equal(chunked, stream_decode(*model, codes, 10, 10, 5)));
  EXPECT_EQ(chunked_decode(*model, codes.narrow(1, 0, 0)).numel(), 0);
}

TEST(Qwen3OmniCode2Wav, ForwardRunsThroughItsHooks) {
  struct Counter : offload::ModelHook {
    int pre = 0, post = 0;
    void pre_forward(torch::nn::Module&, const std::string&, offload::HookArgs&) override { ++pre; }
    void post_forward(torch::nn::Module&, const std::string&, c10::IValue&) override { ++post; }
  };
  auto model = load_code2wav();
  auto counter = std::make_shared<Counter>();
  model->hooks().attach("forward", "counter", counter);
  const auto codes = reference().tensor("speech_text_codes");
  chunked_decode(*model, codes, 10, 5);
  EXPECT_EQ(counter->pre, 3);
  EXPECT_EQ(counter->post, 3);
  model->hooks().detach_all();
}

// ---------------------------------------------------------------------------- streaming

struct Schedule {
  int64_t first, chunk, context;
  std::string name() const {
    return std::to_string(first) + "_" + std::to_string(chunk) + "_" + std::to_string(context);
  }
};

class Code2WavStream : public ::testing::TestWithParam<Schedule> {};

TEST_P(Code2WavStream, EqualsTheReferenceStreamWhateverThePieces) {
  const auto s = GetParam();
  auto model = load_code2wav();
  const auto codes = reference().tensor("speech_text_codes");
  const auto expected = reference().tensor("speech_text_stream_" + s.name());
  Code2WavStreamer streamer(*model, {s.first, s.chunk, s.context});

  const auto one_at_a_time = stream_in_pieces(streamer, codes, 1);
  ASSERT_EQ(one_at_a_time.sizes(), expected.sizes());
  const double diff = max_abs_diff(one_at_a_time, expected);
  std::cout << "code2wav stream " << s.name() << " max abs diff vs HF: " << diff << "\n";
  EXPECT_LE(diff, 1e-4);
  EXPECT_EQ(streamer.stats().samples, expected.size(0));
  EXPECT_EQ(streamer.stats().frames_received, 24);
  EXPECT_EQ(streamer.stats().frames_emitted, 24);

  for (int64_t piece : {2, 5, 7, 24}) {
    streamer.reset();
    EXPECT_TRUE(at::equal(stream_in_pieces(streamer, codes, piece), one_at_a_time)) << piece;
  }
  // And exactly the reference's algorithm run here.
  EXPECT_TRUE(at::equal(one_at_a_time, stream_decode(*model, codes, s.first, s.chunk, s.context)));
}

INSTANTIATE_TEST_SUITE_P(Schedules, Code2WavStream,
                         ::testing::Values(Schedule{4, 25, 25}, Schedule{2, 5, 3}),
                         [](const auto& param_info) { return param_info.param.name(); });

TEST(Qwen3OmniCode2Wav, StreamReturnsEachChunkWhenItCompletes) {
  auto model = load_code2wav();
  const auto codes = reference().tensor("speech_text_codes");
  Code2WavStreamer streamer(*model, {2, 5, 3});
  std::vector<int64_t> sizes;
  for (int64_t t = 0; t < 24; ++t) sizes.push_back(streamer.push(codes.narrow(1, t, 1)).numel());
  // Chunks end after frames 2, 7, 12, 17, 22; each gives n * 1920 - 555 samples.
  for (int64_t t = 0; t < 24; ++t) {
    const bool ends = t == 1 || t == 6 || t == 11 || t == 16 || t == 21;
    EXPECT_EQ(sizes[t], ends ? (t == 1 ? 2 : 5) * 1920 - 555 : 0) << "frame " << t;
  }
  EXPECT_EQ(streamer.pending_frames(), 2);
  EXPECT_EQ(streamer.buffered_frames(), 5);  // 3 of context + 2 pending
  EXPECT_EQ(streamer.finish().numel(), 2 * 1920 - 555);
  EXPECT_EQ(streamer.stats().chunks, 6);
  EXPECT_EQ(streamer.finish().numel(), 0);
  EXPECT_TRUE(streamer.finished());
}

TEST(Qwen3OmniCode2Wav, LongStreamCostsTheSamePerFrame) {
  auto model = load_code2wav();
  const auto base = reference().tensor("speech_text_codes");
  const int64_t frames = 200;
  const auto codes = at::cat(std::vector<at::Tensor>(9, base), 1).narrow(1, 0, frames).contiguous();
  const Code2WavStreamOptions options;  // 4, 25, 25
  Code2WavStreamer streamer(*model, options);
  std::vector<at::Tensor> out;
  int64_t most_decoded_at_once = 0;
  for (int64_t t = 0; t < frames; ++t) {
    const int64_t before = streamer.stats().frames_decoded;
    out.push_back(streamer.push(codes.narrow(1, t, 1)));
    most_decoded_at_once = std::max(most_decoded_at_once, streamer.stats().frames_decoded - before);
    ASSERT_LE(streamer.buffered_frames(), options.left_context_frames + options.chunk_frames)
        << "frame " << t;
  }
  out.push_back(streamer.finish());
  const auto& st = streamer.stats();
  // 4 frames, then 7 chunks of 25, then 21 in finish().
  EXPECT_EQ(st.chunks, 9);
  EXPECT_LE(st.frames_decoded, frames + st.chunks * options.left_context_frames);
  EXPECT_EQ(st.frames_decoded, frames + 4 + 7 * 25);  // contexts: 4, then 25 each
  EXPECT_LE(most_decoded_at_once, options.left_context_frames + options.chunk_frames);
  EXPECT_LE(st.max_buffered_frames, options.left_context_frames + options.chunk_frames);
  EXPECT_EQ(st.frames_emitted, frames);
  const auto streamed = at::cat(out, 0);
  EXPECT_EQ(st.samples, streamed.size(0));
  EXPECT_EQ(streamed.size(0), frames * 1920 - st.chunks * 555);
  EXPECT_TRUE(at::equal(streamed, stream_decode(*model, codes, 4, 25, 25)));
}

TEST(Qwen3OmniCode2Wav, StreamWithoutContextKeepsOnlyPendingFrames) {
  auto model = load_code2wav();
  const auto codes = reference().tensor("speech_text_codes");
  Code2WavStreamer streamer(*model, {3, 9, 0});
  const auto streamed = stream_in_pieces(streamer, codes, 4);
  EXPECT_EQ(streamer.stats().frames_decoded, 24);
  EXPECT_LE(streamer.stats().max_buffered_frames, 9);
  EXPECT_TRUE(at::equal(streamed, stream_decode(*model, codes, 3, 9, 0)));
}

// ---------------------------------------------------------------------------- errors

TEST(Qwen3OmniCode2Wav, BadCodesAreRejectedWithTheReason) {
  auto model = load_code2wav();
  const auto codes = reference().tensor("speech_text_codes").clone();
  EXPECT_ERROR_HAS(error_of([&] { model->forward(codes.narrow(0, 0, 15)); }), "num_quantizers = 16",
                   "[15, 24]", "code groups");
  EXPECT_ERROR_HAS(error_of([&] { model->forward(codes.unsqueeze(0)); }), "[1, 16, 24]");
  EXPECT_ERROR_HAS(error_of([&] { model->forward(codes.to(at::kFloat)); }), "integers");
  EXPECT_ERROR_HAS(error_of([&] { model->forward(codes.narrow(1, 0, 0)); }), "at least one frame");
  auto bad = codes.clone();
  bad[3][7] = 128;
  EXPECT_ERROR_HAS(error_of([&] { model->forward(bad); }), "code 128", "group 3", "frame 7",
                   "codebook_size = 128");
  bad = codes.clone();
  bad[0][20] = -1;
  EXPECT_ERROR_HAS(error_of([&] { chunked_decode(*model, bad, 8, 2); }), "code -1", "frame 20");
  EXPECT_ERROR_HAS(error_of([&] { chunked_decode(*model, codes, 0, 2); }), "chunk_size");
  EXPECT_ERROR_HAS(error_of([&] { chunked_decode(*model, codes, 8, -1); }), "left_context");
}

TEST(Qwen3OmniCode2Wav, BadStreamOptionsAndFramesAreRejected) {
  auto model = load_code2wav();
  const auto make = [&](Code2WavStreamOptions options) {
    return error_of([&] { Code2WavStreamer streamer(*model, options); });
  };
  EXPECT_ERROR_HAS(make({0, 25, 25}), "first_chunk_frames", ">= 1", "got 0");
  EXPECT_ERROR_HAS(make({4, 0, 25}), "chunk_frames", ">= 1");
  EXPECT_ERROR_HAS(make({4, 25, -1}), "left_context_frames", ">= 0", "got -1");

  const auto codes = reference().tensor("speech_text_codes").clone();
  Code2WavStreamer streamer(*model, {2, 5, 3});
  streamer.push(codes.narrow(1, 0, 3));
  auto bad = codes.narrow(1, 3, 2).clone();
  bad[5][1] = 4096;
  // The frame index counts from the start of the stream.
  EXPECT_ERROR_HAS(error_of([&] { streamer.push(bad); }), "code 4096", "group 5", "frame 4");
  EXPECT_ERROR_HAS(error_of([&] { streamer.push(codes.narrow(0, 0, 8)); }), "num_quantizers = 16");
  EXPECT_ERROR_HAS(error_of([&] { streamer.push(codes.narrow(1, 0, 0)); }), "at least one frame");
  // A rejected push leaves the stream as it was.
  EXPECT_EQ(streamer.stats().frames_received, 3);
  streamer.finish();
  EXPECT_ERROR_HAS(error_of([&] { streamer.push(codes.narrow(1, 0, 1)); }), "after finish()");
  streamer.reset();
  EXPECT_EQ(streamer.push(codes.narrow(1, 0, 2)).numel(), 2 * 1920 - 555);
}

// ---------------------------------------------------------------------------- CUDA

TEST(Qwen3OmniCode2Wav, CudaEqualsCpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  auto model = load_code2wav();
  const auto codes = reference().tensor("speech_text_codes");
  const auto cpu = chunked_decode(*model, codes);
  model->to(at::Device(at::kCUDA));
  const auto wav = model->forward(codes);  // CPU codes, CUDA module
  EXPECT_TRUE(wav.is_cuda());
  const auto gpu = chunked_decode(*model, codes.to(at::kCUDA));
  EXPECT_TRUE(gpu.device().is_cpu());
  EXPECT_LE(max_abs_diff(gpu, cpu), 1e-4);
  EXPECT_LE(max_abs_diff(gpu, reference().tensor("speech_text_wav")), 1e-4);
  Code2WavStreamer streamer(*model, {4, 25, 25});
  EXPECT_LE(max_abs_diff(stream_in_pieces(streamer, codes.to(at::kCUDA), 1),
                         reference().tensor("speech_text_stream_4_25_25")),
            1e-4);
}

}  // namespace
}  // namespace omni::models::qwen3_omni
