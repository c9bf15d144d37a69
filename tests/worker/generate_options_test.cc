// `vllm-omni generate` options, parsed in this process: the runner's defaults, every flag on
// its field of the request or of the options each stage of `--model` runs with, and the bad
// command lines (status 2, one line).
#include "worker/cli/generate_options.h"

#include <gtest/gtest.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "worker/cli/app.h"
#include "worker/cli/generate_backend.h"
#include "worker/config/engine_options.h"
#include "worker/config/stage_overrides.h"
#include "worker/pipeline/local_pipeline.h"

#include "tiny_request.h"

namespace omni::cli {
namespace {

using testing::omni;

struct Parsed {
  std::optional<int> status;  // nullopt: parsed, the subcommand would run
  std::string out, err;
  CommandLine commands;
};

Parsed parse(std::vector<std::string> args) {
  args.insert(args.begin(), "vllm-omni");
  Parsed p;
  auto app = make_app(p.commands);
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  p.status = parse_command_line(*app, static_cast<int>(argv.size()), argv.data(), out, err);
  p.out = out.str();
  p.err = err.str();
  return p;
}

// `generate --model m --prompt p` plus `extra`; fails the test unless it parses.
GenerateOptions generate(std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"generate", "--model", "m", "--prompt", "p"};
  args.insert(args.end(), extra.begin(), extra.end());
  Parsed p = parse(args);
  EXPECT_FALSE(p.status.has_value()) << p.err;
  return p.commands.generate;
}

// What `generate --model` runs the stage `model_stage` of the fixture checkpoint with: the flags
// applied to its stage config as the command applies them. The fixture stands in for the
// command line's "m", which does not exist.
pipeline::LocalStageOptions stage_options(GenerateOptions o, const std::string& model_stage) {
  o.model = OMNI_FIXTURES_DIR "/qwen3_omni_tiny";
  const std::string device = o.device == "cuda" ? "cuda" : "cpu";
  for (const auto& s : model_stage_config(o, device).stages) {
    if (s.engine.model_stage == model_stage) return pipeline::local_stage_options(s, device);
  }
  ADD_FAILURE() << "no stage " << model_stage;
  return {};
}

void expect_same(const models::SamplingParams& a, const models::SamplingParams& b) {
  EXPECT_EQ(a.temperature, b.temperature);
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.top_p, b.top_p);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.greedy, b.greedy);
  EXPECT_EQ(a.repetition_penalty, b.repetition_penalty);
  EXPECT_EQ(a.max_new_tokens, b.max_new_tokens);
  EXPECT_EQ(a.stop_token_ids, b.stop_token_ids);
  EXPECT_EQ(a.suppress_tokens, b.suppress_tokens);
}

TEST(GenerateOptions, DefaultsAreTheRunners) {
  const GenerateOptions o = generate();
  EXPECT_EQ(o.model, "m");
  EXPECT_EQ(o.prompt, "p");
  EXPECT_FALSE(o.modalities_given);
  EXPECT_TRUE(o.wants_text());
  EXPECT_TRUE(o.wants_audio());
  EXPECT_EQ(o.max_tokens, 2048);

  const pipeline::Request request = to_request(o);
  const pipeline::Request runner_default;
  expect_same(omni(request).sampling.thinker, omni(runner_default).sampling.thinker);
  expect_same(omni(request).sampling.talker, omni(runner_default).sampling.talker);
  expect_same(omni(request).sampling.code_predictor, omni(runner_default).sampling.code_predictor);
  EXPECT_EQ(request.chat.text, "p");
  EXPECT_TRUE(request.chat.audio_files.empty());
  EXPECT_TRUE(request.chat.image_files.empty());
  EXPECT_EQ(request.chat.system_prompt, "");
  EXPECT_TRUE(request.text_output);
  EXPECT_TRUE(request.audio_output);
  EXPECT_EQ(request.voice, "");
  EXPECT_EQ(omni(request).max_audio_frames, 4096);
  EXPECT_EQ(omni(request).max_audio_frames, omni(runner_default).max_audio_frames);
  EXPECT_EQ(omni(request).stream.first_chunk_frames,
            omni(runner_default).stream.first_chunk_frames);
  EXPECT_EQ(omni(request).stream.chunk_frames, omni(runner_default).stream.chunk_frames);
  EXPECT_EQ(omni(request).stream.left_context_frames,
            omni(runner_default).stream.left_context_frames);

  EXPECT_EQ(o.model, "m");
  EXPECT_EQ(o.device, "auto");
  for (const char* name : {"thinker", "talker", "code2wav"}) {
    SCOPED_TRACE(name);
    const pipeline::LocalStageOptions stage = stage_options(o, name);
    EXPECT_EQ(stage.dtype, at::ScalarType::Undefined);  // auto: the checkpoint's
    EXPECT_FALSE(stage.offload.cpu_offload_enabled);
    EXPECT_EQ(stage.offload.components, (std::vector<std::string>{"visual", "audio_tower"}));
    EXPECT_EQ(stage.offload.strategy, "alternating");
    EXPECT_TRUE(stage.offload.pin_memory);
    EXPECT_EQ(stage.offload.device_budget_bytes, 0u);
    EXPECT_FALSE(stage.offload.layerwise);
    EXPECT_EQ(stage.offload.num_gpu_layers, 1);
    EXPECT_FALSE(stage.offload_stage);
    EXPECT_EQ(stage.device, offload::DeviceKind::kCpuSim);
  }
  EXPECT_EQ(wav_format(o), models::WavFormat::kPcm16);
  EXPECT_EQ(o.output_wav, "");
  EXPECT_FALSE(o.json);
}

TEST(GenerateOptions, EveryFlagReachesItsField) {
  const GenerateOptions o = generate({"--audio",
                                      "a.wav",
                                      "--audio",
                                      "b.flac",
                                      "--image",
                                      "i.png",
                                      "--system",
                                      "be brief",
                                      "--speaker",
                                      "Chelsie",
                                      "--modalities",
                                      "audio",
                                      "--max-tokens",
                                      "7",
                                      "--max-audio-frames",
                                      "24",
                                      "--temperature",
                                      "0.7",
                                      "--top-p",
                                      "0.5",
                                      "--top-k",
                                      "3",
                                      "--repetition-penalty",
                                      "1.2",
                                      "--talker-temperature",
                                      "0.6",
                                      "--talker-top-k",
                                      "9",
                                      "--talker-top-p",
                                      "0.8",
                                      "--talker-repetition-penalty",
                                      "1.3",
                                      "--output-wav",
                                      "o.wav",
                                      "--wav-format",
                                      "f32",
                                      "--stream-first-chunk",
                                      "2",
                                      "--stream-chunk",
                                      "5",
                                      "--stream-left-context",
                                      "0",
                                      "--cpu-offload-components",
                                      "talker,code2wav",
                                      "--cpu-offload-strategy",
                                      "sequential",
                                      "--cpu-offload-budget",
                                      "8GB",
                                      "--no-pin-memory",
                                      "--enable-layerwise-offload",
                                      "--layerwise-num-gpu-layers",
                                      "3",
                                      "--device",
                                      "cuda",
                                      "--dtype",
                                      "bfloat16",
                                      "--json",
                                      "--seed",
                                      "42"});
  const pipeline::Request r = to_request(o);
  const auto paths = [](const std::vector<models::ChatMedia>& files) {
    std::vector<std::string> out;
    for (const auto& f : files) out.push_back(f.path);
    return out;
  };
  EXPECT_EQ(paths(r.chat.audio_files), (std::vector<std::string>{"a.wav", "b.flac"}));
  EXPECT_EQ(paths(r.chat.image_files), (std::vector<std::string>{"i.png"}));
  EXPECT_EQ(r.chat.system_prompt, "be brief");
  EXPECT_EQ(r.voice, "Chelsie");
  EXPECT_TRUE(o.modalities_given);
  EXPECT_FALSE(r.text_output);
  EXPECT_TRUE(r.audio_output);
  EXPECT_EQ(omni(r).sampling.thinker.max_new_tokens, 7);
  EXPECT_EQ(omni(r).max_audio_frames, 24);
  EXPECT_EQ(omni(r).sampling.thinker.temperature, 0.7);
  EXPECT_EQ(omni(r).sampling.thinker.top_p, 0.5);
  EXPECT_EQ(omni(r).sampling.thinker.top_k, 3);
  EXPECT_EQ(omni(r).sampling.thinker.repetition_penalty, 1.2);
  EXPECT_EQ(omni(r).sampling.talker.temperature, 0.6);
  EXPECT_EQ(omni(r).sampling.talker.top_k, 9);
  EXPECT_EQ(omni(r).sampling.talker.top_p, 0.8);
  EXPECT_EQ(omni(r).sampling.talker.repetition_penalty, 1.3);
  EXPECT_FALSE(omni(r).sampling.thinker.greedy);
  models::OmniSampling seeded;
  seeded.set_seed(42);
  EXPECT_EQ(omni(r).sampling.thinker.seed, seeded.thinker.seed);
  EXPECT_EQ(omni(r).sampling.talker.seed, seeded.talker.seed);
  EXPECT_EQ(omni(r).sampling.code_predictor.seed, seeded.code_predictor.seed);
  EXPECT_EQ(omni(r).stream.first_chunk_frames, 2);
  EXPECT_EQ(omni(r).stream.chunk_frames, 5);
  EXPECT_EQ(omni(r).stream.left_context_frames, 0);
  EXPECT_EQ(o.output_wav, "o.wav");
  EXPECT_EQ(wav_format(o), models::WavFormat::kFloat32);
  EXPECT_TRUE(o.json);

  // --cpu-offload-components naming stages: those stages give the device back between their
  // turns (offload_stage); the thinker keeps its own settings.
  EXPECT_FALSE(stage_options(o, "thinker").offload_stage);
  for (const char* name : {"talker", "code2wav"}) EXPECT_TRUE(stage_options(o, name).offload_stage);
  for (const char* name : {"thinker", "talker", "code2wav"}) {
    SCOPED_TRACE(name);
    const pipeline::LocalStageOptions stage = stage_options(o, name);
    EXPECT_EQ(stage.offload.device_budget_bytes, 8000000000u);
    EXPECT_FALSE(stage.offload.pin_memory);
    EXPECT_EQ(stage.dtype, at::kBFloat16);
    EXPECT_EQ(stage.device, offload::DeviceKind::kCuda);
  }
  // A stage that moves as a whole is one component; the thinker streams its layers.
  const pipeline::LocalStageOptions thinker = stage_options(o, "thinker");
  EXPECT_EQ(thinker.offload.strategy, "sequential");
  EXPECT_TRUE(thinker.offload.layerwise);
  EXPECT_EQ(thinker.offload.num_gpu_layers, 3);
}

TEST(GenerateOptions, GreedyAndSeedApplyToEveryStage) {
  const pipeline::Request r = to_request(generate({"--greedy", "--seed", "7"}));
  models::OmniSampling expected;
  expected.set_greedy(true);
  expected.set_seed(7);
  expect_same(omni(r).sampling.thinker, expected.thinker);
  expect_same(omni(r).sampling.talker, expected.talker);
  expect_same(omni(r).sampling.code_predictor, expected.code_predictor);
  EXPECT_TRUE(omni(r).sampling.thinker.is_greedy());
  EXPECT_TRUE(omni(r).sampling.talker.is_greedy());
  EXPECT_TRUE(omni(r).sampling.code_predictor.is_greedy());
}

TEST(GenerateOptions, ModalitiesAndOffloadLists) {
  EXPECT_FALSE(to_request(generate({"--modalities", "text"})).audio_output);
  EXPECT_TRUE(to_request(generate({"--modalities", "text"})).text_output);
  const auto both = generate({"--modalities", "audio,text"});
  EXPECT_TRUE(both.wants_audio() && both.wants_text() && both.modalities_given);
  const auto star = stage_options(generate({"--cpu-offload-components", "thinker.*"}), "thinker");
  EXPECT_TRUE(star.offload.cpu_offload_enabled);
  EXPECT_EQ(star.offload.components, (std::vector<std::string>{"thinker.*"}));
  // Repeated flags add to the list (module names to every stage, stage names to those stages);
  // binary suffixes are powers of 1024.
  const auto repeated = generate({"--cpu-offload-components", "visual", "--cpu-offload-components",
                                  "talker", "--cpu-offload-budget", "2GiB"});
  EXPECT_EQ(stage_options(repeated, "thinker").offload.components,
            (std::vector<std::string>{"visual"}));
  EXPECT_FALSE(stage_options(repeated, "thinker").offload_stage);
  EXPECT_TRUE(stage_options(repeated, "talker").offload_stage);
  EXPECT_EQ(stage_options(repeated, "thinker").offload.device_budget_bytes, size_t{2} << 30);
  EXPECT_EQ(stage_options(generate({"--dtype", "float16"}), "talker").dtype, at::kHalf);
}

// The batching flags reach the stage's engine loop: off by default, chunked prefill on with
// its per-step token budget.
TEST(GenerateOptions, ChunkedPrefillFlagsReachTheEngineLoop) {
  const auto plain = stage_options(generate({}), "thinker").limits;
  EXPECT_FALSE(plain.chunked_prefill);
  EXPECT_EQ(plain.max_num_batched_tokens, 8192);
  const auto chunked = stage_options(
      generate({"--enable-chunked-prefill", "--max-num-batched-tokens", "256"}), "thinker");
  EXPECT_TRUE(chunked.limits.chunked_prefill);
  EXPECT_EQ(chunked.limits.max_num_batched_tokens, 256);
}

TEST(GenerateOptions, ExpertOffloadFlags) {
  const auto off = stage_options(generate({}), "thinker").offload;
  EXPECT_FALSE(off.cpu_offload_experts);
  const auto pct =
      stage_options(generate({"--cpu-offload-experts", "--expert-cache-budget", "10%"}), "thinker");
  EXPECT_TRUE(pct.offload.cpu_offload_experts);
  EXPECT_DOUBLE_EQ(pct.offload.expert_cache_budget_fraction, 0.10);
  EXPECT_EQ(pct.offload.expert_cache_budget_bytes, 0u);
  const auto bytes = stage_options(
      generate({"--cpu-offload-experts", "--expert-cache-budget", "2GiB"}), "thinker");
  EXPECT_EQ(bytes.offload.expert_cache_budget_bytes, size_t{2} << 30);
  // The default budget: a quarter of all experts' bytes.
  const auto plain = stage_options(generate({"--cpu-offload-experts"}), "thinker");
  EXPECT_DOUBLE_EQ(plain.offload.expert_cache_budget_fraction, 0.25);
  // The policy flags, and their defaults (the runner's).
  const models::RunnerOffloadOptions runner_defaults;
  EXPECT_EQ(plain.offload.expert_prefetch, runner_defaults.expert_prefetch);
  EXPECT_EQ(plain.offload.expert_miss_policy, runner_defaults.expert_miss_policy);
  EXPECT_EQ(plain.offload.expert_eviction, runner_defaults.expert_eviction);
  EXPECT_EQ(plain.offload.disk_read, runner_defaults.disk_read);
  const auto policy = stage_options(
      generate({"--cpu-offload-experts", "--no-expert-prefetch", "--expert-miss-policy", "auto",
                "--expert-eviction", "lru", "--host-memory-budget", "3GiB", "--disk-read", "mmap"}),
      "thinker");
  EXPECT_FALSE(policy.offload.expert_prefetch);
  EXPECT_EQ(policy.offload.expert_miss_policy, "auto");
  EXPECT_EQ(policy.offload.expert_eviction, "lru");
  EXPECT_EQ(policy.offload.host_memory_budget_bytes, size_t{3} << 30);
  EXPECT_EQ(policy.offload.disk_read, "mmap");
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--cpu-offload-experts", "--expert-miss-policy", "sometimes"},
           {"--cpu-offload-experts", "--expert-eviction", "fifo"},
           {"--disk-read", "tape"}}) {
    std::vector<std::string> line = {"generate", "--model", "m", "--prompt", "p"};
    line.insert(line.end(), args.begin(), args.end());
    const Parsed p = parse(line);
    ASSERT_TRUE(p.status.has_value()) << args.back();
    EXPECT_NE(p.err.find(args[args.size() - 2]), std::string::npos) << p.err;
    EXPECT_NE(p.err.find(args.back()), std::string::npos) << p.err;
  }
  for (const char* flag : {"--no-expert-prefetch", "--expert-miss-policy", "--expert-eviction"}) {
    std::vector<std::string> line = {"generate", "--model", "m", "--prompt", "p", flag};
    if (std::string(flag) != "--no-expert-prefetch") line.push_back("fetch");
    if (std::string(flag) == "--expert-eviction") line.back() = "lru";
    const Parsed p = parse(line);
    ASSERT_TRUE(p.status.has_value()) << flag;
    EXPECT_NE(p.err.find(std::string(flag) + " requires --cpu-offload-experts"), std::string::npos)
        << p.err;
  }
  const Parsed bad = parse({"generate", "--model", "m", "--prompt", "p", "--cpu-offload-experts",
                            "--expert-cache-budget", "lots"});
  ASSERT_TRUE(bad.status.has_value());
  EXPECT_NE(bad.err.find("--expert-cache-budget"), std::string::npos) << bad.err;
  const Parsed alone =
      parse({"generate", "--model", "m", "--prompt", "p", "--expert-cache-budget", "10%"});
  ASSERT_TRUE(alone.status.has_value());
  EXPECT_NE(alone.err.find("--expert-cache-budget requires --cpu-offload-experts"),
            std::string::npos)
      << alone.err;
}

struct BadCase {
  std::vector<std::string> args;  // after `generate --model m --prompt p` unless `whole`
  std::string message;            // the line, after "vllm-omni: error: "
  bool whole = false;
};

// The arguments, as the test's name in ctest (the default would dump the struct's bytes).
void PrintTo(const BadCase& c, std::ostream* os) {
  if (c.args.empty()) *os << "(no arguments)";
  for (size_t i = 0; i < c.args.size(); ++i) *os << (i ? " " : "") << c.args[i];
}

class GenerateBadCommandLine : public ::testing::TestWithParam<BadCase> {};

TEST_P(GenerateBadCommandLine, IsStatusTwoWithOneLine) {
  std::vector<std::string> args = GetParam().args;
  if (!GetParam().whole) {
    const std::vector<std::string> base = {"generate", "--model", "m", "--prompt", "p"};
    args.insert(args.begin(), base.begin(), base.end());
  }
  const Parsed p = parse(args);
  ASSERT_TRUE(p.status.has_value());
  EXPECT_EQ(*p.status, 2);
  EXPECT_EQ(p.out, "");
  EXPECT_EQ(p.err, "vllm-omni: error: " + GetParam().message + "\n");
}

const std::string kSee = " (see 'vllm-omni generate --help')";
#if defined(OMNI_HAVE_HTTP)
const std::string kSubcommands = "generate, worker, serve";
#elif defined(OMNI_HAVE_SERVER)
const std::string kSubcommands = "generate, worker";
#else
const std::string kSubcommands = "generate";
#endif

INSTANTIATE_TEST_SUITE_P(
    Cases, GenerateBadCommandLine,
    ::testing::Values(
        BadCase{{},
                "a subcommand is required (one of: " + kSubcommands + ") (see 'vllm-omni --help')",
                true},
        BadCase{
            {"train"},
            "unknown subcommand 'train' (one of: " + kSubcommands + ") (see 'vllm-omni --help')",
            true},
        BadCase{{"generate", "--prompt", "p"},
                "--model or --stage-configs-path is required" + kSee,
                true},
        BadCase{{"generate", "--model", "m", "--stage-configs-path", "s.yaml", "--prompt", "p"},
                "--model excludes --stage-configs-path" + kSee,
                true},
        BadCase{{"generate", "--model", "m"}, "--prompt or --messages is required" + kSee, true},
        BadCase{{"--bogus"}, "The following argument was not expected: --bogus" + kSee},
        BadCase{{"--audio", "a.wav", "b.wav"},
                "The following argument was not expected: b.wav" + kSee},
        BadCase{{"--max-tokens"}, "--max-tokens: 1 required N missing" + kSee},
        BadCase{{"--max-tokens", "2.5"},
                "--max-tokens: expected an integer >= 1, got '2.5'" + kSee},
        BadCase{{"--max-tokens", "0"}, "--max-tokens: expected an integer >= 1, got '0'" + kSee},
        BadCase{{"--max-audio-frames", "x"},
                "--max-audio-frames: expected an integer >= 1, got 'x'" + kSee},
        BadCase{{"--stream-left-context", "-1"},
                "--stream-left-context: expected an integer >= 0, got '-1'" + kSee},
        BadCase{{"--top-k", "-2"}, "--top-k: expected an integer >= 0, got '-2'" + kSee},
        BadCase{{"--wav-format", "mp3"},
                "--wav-format: expected one of pcm16, f32; got 'mp3'" + kSee},
        BadCase{{"--modalities", "video"},
                "--modalities: expected one of text, audio; got 'video'" + kSee},
        BadCase{{"--modalities", "text,video"},
                "--modalities: expected one of text, audio; got 'video'" + kSee},
        BadCase{{"--device", "tpu"}, "--device: expected one of auto, cpu, cuda; got 'tpu'" + kSee},
        BadCase{{"--dtype", "int8"},
                "--dtype: unknown value 'int8' (valid: auto, float32, bfloat16, float16)" + kSee},
        BadCase{{"--seed", "-1"}, "--seed: expected an unsigned 64-bit integer, got '-1'" + kSee},
        BadCase{{"--seed", "99999999999999999999"},
                "--seed: expected an unsigned 64-bit integer, got '99999999999999999999'" + kSee},
        BadCase{{"--temperature", "-0.1"},
                "--temperature: expected a number >= 0, got '-0.1'" + kSee},
        BadCase{{"--top-p", "1.5"}, "--top-p: expected a number in (0, 1], got '1.5'" + kSee},
        BadCase{{"--talker-top-p", "0"},
                "--talker-top-p: expected a number in (0, 1], got '0'" + kSee},
        BadCase{{"--repetition-penalty", "0"},
                "--repetition-penalty: expected a number > 0, got '0'" + kSee},
        BadCase{{"--talker-temperature", "nan"},
                "--talker-temperature: expected a number >= 0, got 'nan'" + kSee},
        BadCase{{"--cpu-offload-strategy", "sequential"},
                "--cpu-offload-strategy requires --cpu-offload-components" + kSee},
        BadCase{
            {"--cpu-offload-components", "talker", "--cpu-offload-strategy", "lru"},
            "--cpu-offload-strategy: unknown value 'lru' (valid: alternating, sequential)" + kSee},
        BadCase{{"--cpu-offload-components", "talker", "--cpu-offload-budget", "-5"},
                "--cpu-offload-budget: a byte size cannot be negative: '-5'" + kSee},
        BadCase{{"--messages", "m.json"}, "--prompt excludes --messages" + kSee},
        BadCase{{"--layerwise-num-gpu-layers", "2"},
                "--layerwise-num-gpu-layers requires --enable-layerwise-offload" + kSee},
        BadCase{{"--enable-layerwise-offload", "--layerwise-num-gpu-layers", "0"},
                "--layerwise-num-gpu-layers: must be >= 1, got 0" + kSee}));

// One table registers the engine flags of every command: each flag, under each of its names,
// gives the same recorded value on generate, serve and worker, and the stage ends up with the
// same field whichever command parsed it.
TEST(EngineFlags, EveryCommandRegistersTheWholeTableWithOneMeaning) {
  const std::map<std::string, std::string> sample = {{"cpu_offload_components", "visual"},
                                                     {"cpu_offload_strategy", "sequential"},
                                                     {"layerwise_num_gpu_layers", "2"},
                                                     {"gpu_memory_budget", "1GiB"},
                                                     {"dtype", "bf16"},
                                                     {"expert_cache_budget", "10%"},
                                                     {"expert_miss_policy", "host"},
                                                     {"expert_eviction", "lru"},
                                                     {"host_memory_budget", "2GiB"},
                                                     {"disk_read", "mmap"},
                                                     {"max_num_seqs", "4"},
                                                     {"max_num_batched_tokens", "512"},
                                                     {"block_size", "32"},
                                                     {"kv_cache_memory_bytes", "64MiB"}};
  const auto generate_flags = [](CommandLine& c) -> config::EngineFlags& {
    return c.generate.engine;
  };
  std::vector<
      std::pair<std::vector<std::string>, std::function<config::EngineFlags&(CommandLine&)>>>
      bases = {{{"generate", "--model", "m", "--prompt", "p"}, generate_flags}};
#if defined(OMNI_HAVE_SERVER)
  bases.push_back({{"worker", "--stage-configs-path", "s.yaml", "--stage-id", "0"},
                   [](CommandLine& c) -> config::EngineFlags& { return c.worker.engine; }});
#endif
#if defined(OMNI_HAVE_HTTP)
  bases.push_back({{"serve", "--model", "m"},
                   [](CommandLine& c) -> config::EngineFlags& { return c.serve.engine; }});
#endif
  size_t checked = 0;
  for (const config::EngineOption& option : config::engine_options()) {
    std::vector<std::pair<std::string, std::string>> names;  // flag, the value it records
    for (const auto& f : option.flags) {
      names.push_back(
          {f, option.type == config::EngineOption::Type::kFlag ? "true" : sample.at(option.key)});
    }
    for (const auto& f : option.negated) names.push_back({f, "false"});
    for (const auto& [flag, value] : names) {
      for (const auto& [base, flags_of] : bases) {
        SCOPED_TRACE(base.front() + " " + flag);
        std::vector<std::string> args = base;
        args.push_back(flag);
        if (option.type != config::EngineOption::Type::kFlag) args.push_back(value);
        // What the flag refines, where no stage config could have turned it on.
        if (!option.needs_any.empty()) {
          const auto* needed = config::find_engine_option(option.needs_any.front());
          args.push_back(needed->flags.front());
          if (needed->type != config::EngineOption::Type::kFlag) args.push_back("visual");
        }
        Parsed p = parse(args);
        ASSERT_FALSE(p.status.has_value()) << p.err;
        const config::EngineFlags& got = flags_of(p.commands);
        const auto it = std::find_if(got.begin(), got.end(), [&](const config::EngineFlag& f) {
          return f.key == option.key;
        });
        ASSERT_NE(it, got.end());
        // A value names the flag typed (its errors do); a switch its group's first name.
        const bool negated =
            std::find(option.negated.begin(), option.negated.end(), flag) != option.negated.end();
        EXPECT_EQ(it->flag, option.type != config::EngineOption::Type::kFlag ? flag
                            : negated ? option.negated.front()
                                      : option.flags.front());
        EXPECT_EQ(it->values, std::vector<std::string>{value});
        // The stage's field, as config::apply_stage_flags sets it from this command's flags.
        config::PipelineConfig one;
        one.stages.emplace_back();
        one.stages[0].stage_id = 0;
        one.stages[0].engine.model_stage = "thinker";
        one.stages[0].engine.model = "m";
        one.stages[0].final_output = true;
        one.stages[0].final_output_type = "text";
        config::EngineFlags just_this = {*it};
        config::apply_stage_flags(one, just_this, "");
        config::StageEngineArgs want;
        config::detail::RawValue raw;
        raw.kind = config::detail::RawValue::Kind::kScalar;
        raw.text = value;
        option.set(want, raw, {});
        if (option.key != "cpu_offload_components") {
          EXPECT_EQ(option.get(one.stages[0].engine), option.get(want));
        }
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, bases.size() * 18);
}

TEST(GenerateOptions, HelpIsStatusZeroOnStdout) {
  const Parsed p = parse({"generate", "--help"});
  ASSERT_TRUE(p.status.has_value());
  EXPECT_EQ(*p.status, 0);
  EXPECT_EQ(p.err, "");
  EXPECT_NE(p.out.find("--cpu-offload-components"), std::string::npos);
}

}  // namespace
}  // namespace omni::cli
