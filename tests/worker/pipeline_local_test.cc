// The orchestrator over in-process stages (a runner per stage, each loading only its part of
// the checkpoint) on the tiny Qwen3-Omni fixture: text and audio stream while the stages
// overlap, and a run gives what a fresh pipeline gives, bitwise (pipeline_parity_test holds it
// to Hugging Face); text-only requests run the thinker alone;
// a failing stage fails the request naming it, without hanging; callbacks can cancel; the
// deadline reaches stages that wait on their input; a thinker stage with its MoE experts in a
// device expert cache answers the same and reports the cache in its stats.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cctype>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cpu_offload/check.h"
#include "tiny_request.h"
#include "worker/config/stage_overrides.h"
#include "worker/pipeline/local_pipeline.h"
#include "worker/pipeline/local_stages.h"
#include "worker/pipeline/pipeline.h"
#include "worker/pipeline/stop_strings.h"
#include "worker/qwen3_omni/stage_params.h"

namespace omni::pipeline {
namespace {

using testing::omni;

const std::string kDir = std::string(OMNI_FIXTURES_DIR) + "/qwen3_omni_tiny";

Request request(bool media = true) { return testing::tiny_request(kDir, media); }

std::shared_ptr<Stage> local(const std::string& model_stage, int id,
                             const models::RunnerOffloadOptions& offload = {}) {
  LocalStageOptions o;
  o.name = "stage " + std::to_string(id) + " (" + model_stage + ")";
  o.model_stage = model_stage;
  o.model_dir = kDir;
  o.offload = offload;
  return make_local_stage(o);
}

std::vector<PipelineStage> local_stages() {
  return {{0, "thinker", {}, local("thinker", 0)},
          {1, "talker", {0}, local("talker", 1)},
          {2, "code2wav", {1}, local("code2wav", 2)}};
}

// What a fresh pipeline of the three stages answers to request().
const PipelineResult& reference() {
  static const PipelineResult result = Pipeline(local_stages()).generate(request());
  return result;
}

// A stage's parameters: in one process the struct itself reaches the stage (no JSON); from the
// wire, its JSON reads back to the same values, ordered parts included.
TEST(StageParams, TheStructInProcessAndItsJsonOverTheWire) {
  ThinkerParams p;
  p.text = "unused";
  p.system_prompt = "be brief";
  using Kind = models::ChatPart::Kind;
  p.history = {{"user", {{Kind::kText, "hi"}, {Kind::kAudio, ""}}},
               {"assistant", {{Kind::kText, "<|im_start|>"}}}};
  p.parts = {{Kind::kImage, ""}, {Kind::kText, "and this?"}};
  p.sampling.top_k = 7;
  p.handoff = true;
  p.stop = {"\n\n"};
  const auto typed = std::make_shared<const ThinkerParams>(p);
  StageCall call;
  call.params = typed;
  EXPECT_EQ(params_as<ThinkerParams>(call, thinker_params).get(), typed.get());

  call.params = std::make_shared<const JsonParams>(typed->to_json());
  const auto back = params_as<ThinkerParams>(call, thinker_params);
  EXPECT_NE(back.get(), typed.get());
  EXPECT_EQ(back->to_json(), typed->to_json());
  ASSERT_EQ(back->history.size(), 2u);
  ASSERT_EQ(back->history[0].parts.size(), 2u);
  EXPECT_EQ(back->history[0].parts[1].kind, Kind::kAudio);
  EXPECT_EQ(back->history[1].parts[0].text, "<|im_start|>");
  ASSERT_EQ(back->parts.size(), 2u);
  EXPECT_EQ(back->parts[0].kind, Kind::kImage);
  EXPECT_EQ(back->sampling.top_k, 7);
  EXPECT_TRUE(back->handoff);

  // No parameters: the kind's defaults; malformed JSON: a bad request naming the kind.
  call.params = nullptr;
  EXPECT_EQ(params_as<Code2WavParams>(call, code2wav_params)->stream.chunk_frames,
            Code2WavParams{}.stream.chunk_frames);
  call.params = std::make_shared<const JsonParams>(R"({"history": [{"role": "user",
      "parts": [{"type": "video"}]}]})");
  try {
    params_as<ThinkerParams>(call, thinker_params);
    FAIL() << "expected an error";
  } catch (const StageError& e) {
    EXPECT_EQ(e.code(), StageError::Code::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("thinker parameters"), std::string::npos) << e.what();
  }
}

// Slows a stage's packets down, so that a test of overlap between stages does not race.
class SlowStage : public Stage {
 public:
  explicit SlowStage(std::shared_ptr<Stage> inner) : inner_(std::move(inner)) {}
  const std::string& name() const override { return inner_->name(); }
  void run(const StageCall& call, PacketQueue& input, const PacketSink& sink,
           const CancelToken& cancel) override {
    inner_->run(
        call, input,
        [&](StagePacket&& p) {
          std::this_thread::sleep_for(std::chrono::milliseconds(40));
          sink(std::move(p));
        },
        cancel);
  }
  std::string stats_json() override { return inner_->stats_json(); }
  StageInfo info() override { return inner_->info(); }
  uint64_t set_device_released(bool r) override { return inner_->set_device_released(r); }
  uint64_t device_bytes() override { return inner_->device_bytes(); }

 private:
  std::shared_ptr<Stage> inner_;
};

TEST(PipelineLocal, StreamsTextAndAudioWhileTheStagesOverlap) {
  const auto& ref = reference();
  ASSERT_GE(ref.tokens.size(), 2u);
  ASSERT_GT(ref.audio.codes.size(1), 0);
  // The talker's frames slowed to 40 ms each: without it, the tiny talker can finish before
  // code2wav's first chunk (it did under ASan), and the overlap checked below is a race.
  auto stages = local_stages();
  stages[1].stage = std::make_shared<SlowStage>(stages[1].stage);
  Pipeline pipeline(stages);
  std::vector<at::Tensor> chunks;
  std::string streamed_text;
  PipelineCallbacks cb;
  cb.on_audio = [&](const at::Tensor& s) {
    chunks.push_back(s.clone());
    return true;
  };
  cb.on_text = [&](const std::string& t) {
    streamed_text += t;
    return true;
  };
  const auto got = pipeline.generate(request(), cb);
  EXPECT_EQ(got.tokens, ref.tokens);
  EXPECT_EQ(got.finish_reason, ref.finish_reason);
  EXPECT_EQ(got.text, streamed_text);
  EXPECT_FALSE(got.text.empty());
  ASSERT_TRUE(got.audio.codes.defined());
  EXPECT_TRUE(at::equal(got.audio.codes, ref.audio.codes));
  EXPECT_EQ(got.audio.finish_reason, ref.audio.finish_reason);
  ASSERT_TRUE(got.audio.waveform.defined());
  EXPECT_TRUE(at::equal(got.audio.waveform, ref.audio.waveform.to(at::kFloat)));
  EXPECT_EQ(got.audio.streamed_samples, ref.audio.streamed_samples);
  EXPECT_GT(got.timings.at("time_to_first_audio_ms"), 0);
  EXPECT_EQ(got.audio.voice, "ethan");
  EXPECT_GT(got.bytes_between_stages, 0u);
  // The first audio left code2wav before the talker finished (the stages overlap).
  const auto& talker = got.stage_metrics.at("stage 1 (talker)");
  const auto& code2wav = got.stage_metrics.at("stage 2 (code2wav)");
  EXPECT_LT(code2wav.at("first_packet_ms"), talker.at("done_ms"))
      << ref.audio.codes.size(1) << " frames; the talker sleeps 40 ms before each";
}

// The thinker's packets slowed down: the talker must start speaking while the thinker still
// writes (it reads each text row when it needs it), and the frames must not change.
TEST(PipelineLocal, TheTalkerSpeaksWhileTheThinkerStillWrites) {
  const auto& ref = reference();
  auto stages = local_stages();
  stages[0].stage = std::make_shared<SlowStage>(stages[0].stage);
  Pipeline pipeline(stages);
  const auto got = pipeline.generate(request());
  EXPECT_EQ(got.tokens, ref.tokens);
  EXPECT_TRUE(at::equal(got.audio.codes, ref.audio.codes));
  EXPECT_TRUE(at::equal(got.audio.waveform, ref.audio.waveform.to(at::kFloat)));
  const auto& thinker = got.stage_metrics.at("stage 0 (thinker)");
  const auto& talker = got.stage_metrics.at("stage 1 (talker)");
  // 12 packets of 40 ms: the thinker ends after ~480 ms; the first frame comes after ~2 packets.
  EXPECT_LT(talker.at("first_packet_ms"), thinker.at("done_ms") - 200)
      << "first frame at " << talker.at("first_packet_ms") << " ms, thinker done at "
      << thinker.at("done_ms") << " ms";
}

TEST(StopStringCutter, HoldsBackWhatMayBecomeAStopStringAndCutsBeforeIt) {
  StopStringCutter cut({"World", "!!"});
  EXPECT_EQ(cut.push("Hello "), "Hello ");
  EXPECT_EQ(cut.push("Wor"), "");    // may become "World"
  EXPECT_EQ(cut.push("k"), "Work");  // it did not
  EXPECT_EQ(cut.push(" !"), " ");    // "!" may become "!!"
  EXPECT_EQ(cut.push("! and more"), "");
  EXPECT_TRUE(cut.stopped());
  EXPECT_EQ(cut.push("later"), "");
  EXPECT_EQ(cut.finish(), "");

  StopStringCutter none({});
  EXPECT_EQ(none.push("abc"), "abc");
  EXPECT_FALSE(none.stopped());
  StopStringCutter tail({"xyz"});
  EXPECT_EQ(tail.push("abx"), "ab");
  EXPECT_EQ(tail.finish(), "x");  // the answer ended: what was held back is text after all
  // Multi-byte characters: a held-back end starts at a character.
  StopStringCutter utf8({"\u00e9t\u00e9"});
  EXPECT_EQ(utf8.push("caf\u00e9"), "caf");
  EXPECT_EQ(utf8.push("s"), "\u00e9s");
}

// A stop string ends the thinker's answer before it (finish reason stop), and the talker still
// speaks what came before.
TEST(PipelineLocal, AStopStringEndsTheAnswerBeforeIt) {
  Pipeline pipeline(local_stages());
  auto r = request(false);
  omni(r).sampling.thinker.max_new_tokens = 12;
  const auto whole = pipeline.generate(r);
  // A stop string from inside the answer: an ASCII character not seen before it (the tiny
  // model's text is noise, and a byte of a multi-byte character would not be text).
  std::string stop;
  for (size_t i = 1; i < whole.text.size() && stop.empty(); ++i) {
    const char c = whole.text[i];
    if (std::isalnum(static_cast<unsigned char>(c)) && whole.text.find(c) == i) stop = {c};
  }
  ASSERT_FALSE(stop.empty()) << whole.text;
  r.stop_strings = {stop};
  const auto cut = pipeline.generate(r);
  EXPECT_EQ(cut.text, whole.text.substr(0, whole.text.find(stop)));
  EXPECT_EQ(cut.finish_reason, "stop");
  EXPECT_LT(cut.tokens.size(), whole.tokens.size());
  if (cut.tokens.size() >= 2) {
    EXPECT_GT(cut.audio.codes.size(1), 0);
  }
}

TEST(PipelineLocal, TextOnlyRunsTheThinkerAlone) {
  Pipeline pipeline(local_stages());
  auto r = request(false);
  r.audio_output = false;
  const auto got = pipeline.generate(r);
  EXPECT_FALSE(got.tokens.empty());
  EXPECT_EQ(got.stage_metrics.size(), 1u);
  EXPECT_TRUE(got.stage_metrics.count("stage 0 (thinker)"));
  EXPECT_FALSE(got.audio.codes.defined());
}

// A stage with every weight resident can offload nothing: 0, not param_bytes less the padded
// resident bytes wrapped around (it reported 18446744073709543040).
TEST(PipelineLocal, AResidentStageReportsNoOffloadableBytes) {
  for (const char* model_stage : {"thinker", "talker", "code2wav"}) {
    SCOPED_TRACE(model_stage);
    const StageInfo info = local(model_stage, 0)->info();
    EXPECT_EQ(info.model_stage, model_stage);
    EXPECT_GT(info.param_bytes, 0u);
    EXPECT_EQ(info.offloadable_bytes, 0u);
    EXPECT_EQ(info.device_weight_bytes, info.param_bytes);
  }
}

// cpu_offload_experts on the thinker stage: the same tokens, codes and waveform as the plain
// single-process runner, and the stage's stats carry the expert cache's figures.
TEST(PipelineLocal, ExpertOffloadChangesNothingAndTheStatsReportTheCache) {
  using Json = nlohmann::json;
  const auto& ref = reference();
  // The tiny fixture: 16 experts (2 MoE layers x 8) of 24576 bytes.
  const uint64_t expert = 24576;
  struct Mode {
    std::string policy;
    bool prefetch;
  };
  for (const Mode& mode : {Mode{"fetch", true}, Mode{"host", false}}) {
    SCOPED_TRACE(mode.policy);
    models::RunnerOffloadOptions offload;
    offload.cpu_offload_experts = true;
    offload.expert_cache_budget_fraction = 0.25;
    offload.expert_prefetch = mode.prefetch;
    offload.expert_miss_policy = mode.policy;
    auto thinker = local("thinker", 0, offload);
    // Before any request: the cache is there, untouched.
    auto stats = Json::parse(thinker->stats_json());
    ASSERT_TRUE(stats.contains("expert_cache")) << stats.dump();
    EXPECT_EQ(stats["expert_cache"]["uses"], 0);
    EXPECT_EQ(stats["expert_cache"]["tokens"], 0);

    Pipeline pipeline({{0, "thinker", {}, thinker},
                       {1, "talker", {0}, local("talker", 1)},
                       {2, "code2wav", {1}, local("code2wav", 2)}});
    const auto got = pipeline.generate(request());
    EXPECT_EQ(got.tokens, ref.tokens);
    ASSERT_TRUE(got.audio.codes.defined());
    EXPECT_TRUE(at::equal(got.audio.codes, ref.audio.codes));
    EXPECT_TRUE(at::equal(got.audio.waveform, ref.audio.waveform.to(at::kFloat)));

    stats = Json::parse(thinker->stats_json());
    const auto& e = stats["expert_cache"];
    EXPECT_EQ(e["experts"], 16);
    EXPECT_EQ(e["expert_bytes"], expert);
    EXPECT_EQ(e["budget_bytes"], 4 * expert);  // 25% of the experts' bytes
    EXPECT_GT(e["uses"].get<uint64_t>(), 0u);
    EXPECT_EQ(e["uses"].get<uint64_t>(), e["hits"].get<uint64_t>() + e["misses"].get<uint64_t>());
    EXPECT_EQ(e["tokens"].get<size_t>(), got.tokens.size());
    EXPECT_DOUBLE_EQ(e["bytes_h2d_per_token"].get<double>(),
                     e["bytes_h2d"].get<double>() / static_cast<double>(got.tokens.size()));
    for (const char* key : {"host_computed", "prefetched", "stall_ms", "hit_rate", "slots"}) {
      EXPECT_TRUE(e.contains(key)) << key;
    }
    if (mode.policy == "host") {
      // Every miss computed where it lies, nothing copied, no device slots.
      EXPECT_EQ(e["host_computed"], e["misses"]);
      EXPECT_EQ(e["bytes_h2d"], 0);
      EXPECT_EQ(e["slots"], 0);
      EXPECT_EQ(e["prefetched"], 0);
    } else {
      EXPECT_EQ(e["host_computed"], 0);
      EXPECT_EQ(e["slots"], 4);
      EXPECT_GT(e["bytes_h2d"].get<uint64_t>(), 0u);
      EXPECT_GT(e["prefetched"].get<uint64_t>(), 0u);
    }
    // The backend's figures are still there, at the top level.
    EXPECT_TRUE(stats.contains("bytes_h2d")) << stats.dump();
  }
  // Without cpu_offload_experts there is no expert cache to report.
  EXPECT_FALSE(Json::parse(local("thinker", 0)->stats_json()).contains("expert_cache"));
}

// A stage that fails, or never finishes, in place of the talker.
class BrokenStage : public Stage {
 public:
  explicit BrokenStage(bool hang) : hang_(hang) {}
  const std::string& name() const override { return name_; }
  void run(const StageCall&, PacketQueue& input, const PacketSink&,
           const CancelToken& cancel) override {
    if (!hang_) throw std::runtime_error("the talker's weights are on fire");
    while (!cancel.wait_for(std::chrono::milliseconds(10))) {
    }
    saw_cancel = true;
    (void)input;
  }
  std::string stats_json() override { return "{}"; }
  StageInfo info() override {
    StageInfo i;
    i.voices = {"ethan"};
    i.default_voice = "ethan";
    return i;
  }
  uint64_t set_device_released(bool) override { return 0; }
  uint64_t device_bytes() override { return 0; }
  bool saw_cancel = false;

 private:
  bool hang_;
  std::string name_ = "stage 1 (talker)";
};

TEST(PipelineLocal, AFailingStageFailsTheRequestNamingIt) {
  auto stages = local_stages();
  stages[1].stage = std::make_shared<BrokenStage>(false);
  Pipeline pipeline(stages);
  try {
    pipeline.generate(request(false));
    FAIL() << "no error";
  } catch (const StageError& e) {
    EXPECT_EQ(e.code(), StageError::Code::kInternal);
    EXPECT_EQ(e.stage(), "stage 1 (talker)");
    EXPECT_NE(std::string(e.what()).find("on fire"), std::string::npos) << e.what();
  }
  // The pipeline still serves.
  auto r = request(false);
  r.audio_output = false;
  EXPECT_FALSE(pipeline.generate(r).tokens.empty());
}

TEST(PipelineLocal, TheDeadlineCancelsAStageThatDoesNotFinish) {
  auto stages = local_stages();
  auto broken = std::make_shared<BrokenStage>(true);
  stages[1].stage = broken;
  Pipeline pipeline(stages);
  const auto start = std::chrono::steady_clock::now();
  try {
    pipeline.generate(request(false), {}, start + std::chrono::milliseconds(1500));
    FAIL() << "no error";
  } catch (const StageError& e) {
    EXPECT_EQ(e.code(), StageError::Code::kDeadlineExceeded) << e.what();
    EXPECT_NE(e.stage().find("talker"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_TRUE(broken->saw_cancel);
}

TEST(PipelineLocal, ACallbackCancelsEveryStage) {
  Pipeline pipeline(local_stages());
  PipelineCallbacks cb;
  int frames = 0;
  cb.on_frame = [&](const std::vector<int64_t>&) { return ++frames < 2; };
  const auto got = pipeline.generate(request(false), cb);
  EXPECT_EQ(frames, 2);
  EXPECT_EQ(got.audio.finish_reason, "cancelled");
}

// A fourth stage of an existing kind on a second branch (two code2wav stages reading one
// talker): the orchestrator runs it as it runs any graph; the first answers, the second's
// waveform is the same.
TEST(PipelineLocal, ASecondCode2WavBranchRunsBesideTheFirst) {
  auto stages = local_stages();
  stages.push_back({3, "code2wav", {1}, local("code2wav", 3)});
  Pipeline pipeline(stages);
  const auto& ref = reference();
  const auto got = pipeline.generate(request());
  EXPECT_EQ(got.tokens, ref.tokens);
  EXPECT_TRUE(at::equal(got.audio.codes, ref.audio.codes));
  EXPECT_TRUE(at::equal(got.audio.waveform, ref.audio.waveform));
  ASSERT_EQ(got.branch_outputs.count("stage 3 (code2wav)"), 1u);
  EXPECT_TRUE(at::equal(got.branch_outputs.at("stage 3 (code2wav)"), ref.audio.waveform));
  EXPECT_EQ(got.stage_metrics.size(), 4u);
}

// Each stage reads the packets of its sources, marked with the stage that wrote them, as its
// hand-off gives them: the talker gets the thinker's tokens and rows but not its text.
TEST(PipelineLocal, PacketsCarryTheStageThatWroteThem) {
  class Recorder : public Stage {
   public:
    explicit Recorder(std::shared_ptr<Stage> inner) : inner_(std::move(inner)) {}
    const std::string& name() const override { return inner_->name(); }
    void run(const StageCall& call, PacketQueue& input, const PacketSink& sink,
             const CancelToken& cancel) override {
      PacketQueue seen;
      std::thread copy([&] {
        while (auto p = input.pop(&cancel)) {
          sources.insert(p->source);
          tokens += p->tokens.size();
          text += p->text;
          seen.push(std::move(*p));
        }
        seen.close();
      });
      try {
        inner_->run(call, seen, sink, cancel);
      } catch (...) {
        copy.join();
        throw;
      }
      copy.join();
    }
    std::string stats_json() override { return inner_->stats_json(); }
    StageInfo info() override { return inner_->info(); }
    uint64_t set_device_released(bool r) override { return inner_->set_device_released(r); }
    uint64_t device_bytes() override { return inner_->device_bytes(); }
    std::set<int64_t> sources;
    size_t tokens = 0;
    std::string text;

   private:
    std::shared_ptr<Stage> inner_;
  };
  auto stages = local_stages();
  auto talker = std::make_shared<Recorder>(stages[1].stage);
  auto recorder = std::make_shared<Recorder>(stages[2].stage);
  stages[1].stage = talker;
  stages[2].stage = recorder;
  // As the shipped YAML names it (vLLM-Omni's dotted path).
  stages[1].input_func =
      "vllm_omni.model_executor.stage_input_processors.qwen3_omni.thinker2talker";
  Pipeline pipeline(stages);
  const auto got = pipeline.generate(request(false));
  EXPECT_EQ(recorder->sources, (std::set<int64_t>{1}));
  EXPECT_EQ(talker->sources, (std::set<int64_t>{0}));
  EXPECT_FALSE(got.text.empty());
  EXPECT_EQ(talker->tokens, got.tokens.size());
  EXPECT_EQ(talker->text, "");
}

// Keys a stage kind does not read, given a value other than their default, are named once at
// its start; the keys it reads and the defaults are not. The command line sets a key on every
// stage, so one flag can be meant for one stage and ignored by the others.
TEST(PipelineLocal, KeysAStageDoesNotReadAreNamedAtItsStart) {
  auto config = checkpoint_stage_config(kDir, "cpu", "auto");
  EXPECT_EQ(ignored_engine_keys(config.stages[2]), std::vector<std::string>{});
  config::apply_stage_flags(config,
                            {config::engine_flag("enable_layerwise_offload", {"true"}),
                             config::engine_flag("kv_cache_memory_bytes", {"64MiB"}),
                             config::engine_flag("enable_chunked_prefill", {"true"}),
                             config::engine_flag("max_num_seqs", {"4"})},
                            "");
  ASSERT_EQ(config.stages.size(), 3u);
  EXPECT_EQ(ignored_engine_keys(config.stages[0]), std::vector<std::string>{});
  // The talker's KV has a pool of its own; its prompt runs whole.
  EXPECT_EQ(ignored_engine_keys(config.stages[1]),
            std::vector<std::string>{"enable_chunked_prefill"});
  EXPECT_EQ(ignored_engine_keys(config.stages[2]),
            (std::vector<std::string>{"enable_layerwise_offload", "enable_chunked_prefill",
                                      "kv_cache_memory_bytes"}));
}

TEST(PipelineLocal, RejectsAGraphItCannotRun) {
  auto stages = local_stages();
  stages[2].sources = {0};
  EXPECT_THROW(Pipeline{stages}, omni::Error);
  stages = local_stages();
  stages.erase(stages.begin());
  EXPECT_THROW(Pipeline{stages}, omni::Error);
  // A hand-off that does not exist, or that connects other kinds.
  const auto error = [](const std::vector<PipelineStage>& s) {
    try {
      Pipeline p(s);
    } catch (const omni::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  stages = local_stages();
  stages[1].input_func = "my.module.thinker2speech";
  EXPECT_NE(error(stages).find("no hand-off is called 'my.module.thinker2speech' "
                               "(custom_process_input_func: thinker2talker, talker2code2wav)"),
            std::string::npos)
      << error(stages);
  stages[1].input_func = "talker2code2wav";
  EXPECT_NE(error(stages).find("custom_process_input_func talker2code2wav hands talker to "
                               "code2wav, not stage 0 (thinker) to talker"),
            std::string::npos)
      << error(stages);
}

}  // namespace
}  // namespace omni::pipeline
