// Stage configs: the shipped YAML files, both layouts, every validation error with its exact
// "file:line:col" prefix, the command-line overrides and their precedence, byte sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cpu_offload/option_values.h"
#include "worker/config/engine_options.h"
#include "worker/config/stage_overrides.h"
#include "worker/config/stage_yaml.h"

namespace omni::config {
namespace {

namespace fs = std::filesystem;

const std::string kName = "p.yaml";

// This program links no model family, so it names the stage kinds of the shipped configs itself,
// as the Qwen3-Omni and Wan families register them in vllm-omni.
[[maybe_unused]] const bool kKindsNamed = [] {
  for (const char* kind : {"thinker", "talker", "code2wav", "diffusion", "diffusion_encode",
                           "diffusion_denoise", "diffusion_decode"}) {
    add_model_stage_name(kind);
  }
  return true;
}();

// The error `fn` throws ("" when it throws none).
template <typename F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// "p.yaml:LINE:COL" of the `nth` occurrence of `needle` in `text` (1-based, as messages count).
std::string pos_of(const std::string& text, const std::string& needle, int nth = 1) {
  size_t at = std::string::npos;
  for (int i = 0; i < nth; ++i) at = text.find(needle, at == std::string::npos ? 0 : at + 1);
  if (at == std::string::npos) return "<'" + needle + "' not in the text>";
  const size_t line_start =
      text.rfind('\n', at) == std::string::npos ? 0 : text.rfind('\n', at) + 1;
  const auto line = 1 + std::count(text.begin(), text.begin() + at, '\n');
  return kName + ":" + std::to_string(line) + ":" + std::to_string(at - line_start + 1);
}

::testing::AssertionResult IsError(const std::string& error, const std::string& prefix,
                                   const std::string& phrase) {
  if (error.empty()) return ::testing::AssertionFailure() << "no error was thrown";
  if (error.rfind(prefix + ": ", 0) != 0) {
    return ::testing::AssertionFailure()
           << "'" << error << "' does not start with '" << prefix << ": '";
  }
  if (error.find(phrase) == std::string::npos) {
    return ::testing::AssertionFailure() << "'" << error << "' does not contain '" << phrase << "'";
  }
  return ::testing::AssertionSuccess();
}

class StageConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::path(::testing::TempDir()) / "stage_config_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    fs::create_directories(dir_ / "m");
    fs::create_directories(dir_ / "m2");
  }
  void TearDown() override { fs::remove_all(dir_); }

  PipelineConfig parse(const std::string& yaml) {
    return parse_pipeline_config(yaml, kName, dir_.string());
  }
  std::string parse_error(const std::string& yaml) {
    return error_of([&] { parse(yaml); });
  }

  fs::path dir_;
};

// One valid stage around a replaceable part: the base of many error tests.
std::string one_stage(const std::string& engine_extra, const std::string& stage_extra = "") {
  return "stage_args:\n"
         "  - stage_id: 0\n"
         "    engine_args:\n"
         "      model_stage: thinker\n"
         "      model: m\n" +
         engine_extra +
         "    final_output: true\n"
         "    final_output_type: text\n" +
         stage_extra;
}

// --- the shipped files -------------------------------------------------------------------------

TEST(ShippedConfigs, TinyParsesWithAnAbsoluteExistingModel) {
  const auto config =
      load_pipeline_config(std::string(OMNI_SOURCE_DIR) + "/stage_configs/qwen3_omni_tiny.yaml");
  ASSERT_EQ(config.stages.size(), 3u);
  const fs::path fixture =
      fs::canonical(fs::path(OMNI_SOURCE_DIR) / "tests/fixtures/qwen3_omni_tiny");
  for (const auto& s : config.stages) {
    EXPECT_TRUE(fs::path(s.engine.model).is_absolute()) << s.engine.model;
    EXPECT_TRUE(fs::is_directory(s.engine.model)) << s.engine.model;
    EXPECT_EQ(fs::canonical(s.engine.model), fixture);
    EXPECT_EQ(s.runtime.devices, "cpu");
    EXPECT_EQ(s.engine.dtype, "float32");
    EXPECT_FALSE(s.engine.cpu_offload_enabled);
    EXPECT_EQ(s.engine.model_arch, "Qwen3OmniMoeForConditionalGeneration");
  }
  EXPECT_EQ(config.stage(0).engine.model_stage, "thinker");
  EXPECT_EQ(config.stage(1).engine.model_stage, "talker");
  EXPECT_EQ(config.stage(2).engine.model_stage, "code2wav");
  EXPECT_EQ(config.stage(2).stage_type, "generation");
  EXPECT_EQ(config.stage(0).sampling.temperature, 0.4);
  EXPECT_EQ(config.stage(0).sampling.top_p, 0.9);
  EXPECT_EQ(config.stage(0).sampling.top_k, 1);
  EXPECT_EQ(config.stage(0).sampling.max_tokens, 2048);
  EXPECT_EQ(config.stage(1).sampling.stop_token_ids, std::vector<int64_t>({230}));
  EXPECT_EQ(config.stage(2).final_output_type, "audio");
  EXPECT_EQ(config.topological_order(), std::vector<int64_t>({0, 1, 2}));
  EXPECT_EQ(config.entry_stages(), std::vector<int64_t>({0}));
}

TEST(ShippedConfigs, RealCheckpointParsesWithTheReferenceValues) {
  const std::string path = std::string(OMNI_SOURCE_DIR) + "/stage_configs/qwen3_omni_moe.yaml";
  const auto config = load_pipeline_config(path, /*check_model_dirs=*/false);
  EXPECT_EQ(config.path, path);
  ASSERT_EQ(config.stages.size(), 3u);

  const auto& thinker = config.stage(0);
  EXPECT_EQ(thinker.stage_type, "llm");
  EXPECT_EQ(thinker.engine.model_stage, "thinker");
  EXPECT_EQ(thinker.engine.model_arch, "Qwen3OmniMoeForConditionalGeneration");
  EXPECT_EQ(thinker.engine.model, "/models/Qwen3-Omni-30B-A3B-Instruct");
  EXPECT_TRUE(thinker.engine_input_source.empty());
  EXPECT_TRUE(thinker.final_output);
  EXPECT_EQ(thinker.final_output_type, "text");
  EXPECT_EQ(thinker.sampling.temperature, 0.4);
  EXPECT_EQ(thinker.sampling.top_p, 0.9);
  EXPECT_EQ(thinker.sampling.top_k, 1);
  EXPECT_EQ(thinker.sampling.max_tokens, 2048);
  EXPECT_EQ(thinker.sampling.seed, 42u);
  EXPECT_EQ(thinker.sampling.repetition_penalty, 1.05);
  EXPECT_TRUE(thinker.engine.cpu_offload_enabled);
  EXPECT_EQ(thinker.engine.cpu_offload_components,
            std::vector<std::string>({"visual", "audio_tower"}));
  EXPECT_EQ(thinker.engine.dtype, "bfloat16");
  EXPECT_TRUE(thinker.is_comprehension);
  EXPECT_EQ(thinker.engine.ignored.at("gpu_memory_utilization"), "0.6");
  EXPECT_EQ(thinker.engine.ignored.at("engine_output_type"), "latent");

  const auto& talker = config.stage(1);
  EXPECT_EQ(talker.engine.model_stage, "talker");
  EXPECT_EQ(talker.engine_input_source, std::vector<int64_t>({0}));
  EXPECT_FALSE(talker.final_output);
  EXPECT_EQ(talker.sampling.temperature, 0.9);
  EXPECT_EQ(talker.sampling.top_k, 50);
  EXPECT_FALSE(talker.sampling.top_p.has_value());
  EXPECT_EQ(talker.sampling.max_tokens, 4096);
  EXPECT_EQ(talker.sampling.seed, 42u);
  EXPECT_EQ(talker.sampling.repetition_penalty, 1.05);
  EXPECT_EQ(talker.sampling.stop_token_ids, std::vector<int64_t>({2150}));
  EXPECT_FALSE(talker.engine.cpu_offload_enabled);

  const auto& code2wav = config.stage(2);
  EXPECT_EQ(code2wav.stage_type, "generation");
  EXPECT_EQ(code2wav.engine.model_stage, "code2wav");
  EXPECT_EQ(code2wav.engine_input_source, std::vector<int64_t>({1}));
  EXPECT_TRUE(code2wav.final_output);
  EXPECT_EQ(code2wav.final_output_type, "audio");
  EXPECT_EQ(code2wav.sampling.temperature, 0.0);
  EXPECT_EQ(code2wav.sampling.max_tokens, 65536);
  EXPECT_EQ(code2wav.sampling.repetition_penalty, 1.1);
  for (const auto& s : config.stages) EXPECT_EQ(s.runtime.devices, "0");

  // With the check, the placeholder path is reported where it is written.
  if (!fs::exists("/models/Qwen3-Omni-30B-A3B-Instruct")) {
    const std::string error = error_of([&] { load_pipeline_config(path); });
    EXPECT_NE(error.find("'/models/Qwen3-Omni-30B-A3B-Instruct' does not exist"), std::string::npos)
        << error;
    EXPECT_EQ(error.rfind(path + ":", 0), 0u) << error;
  }
}

TEST(ShippedConfigs, AMissingFileIsAConfigError) {
  const std::string error = error_of([] { load_pipeline_config("/nonexistent/x.yaml"); });
  EXPECT_TRUE(IsError(error, "/nonexistent/x.yaml", "cannot read the file"));
  const std::string dir = std::string(OMNI_SOURCE_DIR) + "/stage_configs";
  EXPECT_TRUE(IsError(error_of([&] { load_pipeline_config(dir); }), dir, "is a directory"));
}

// --- the two layouts ---------------------------------------------------------------------------

void expect_same_stage(const StageConfig& a, const StageConfig& b) {
  EXPECT_EQ(a.stage_id, b.stage_id);
  EXPECT_EQ(a.stage_type, b.stage_type);
  EXPECT_EQ(a.runtime.devices, b.runtime.devices);
  EXPECT_EQ(a.runtime.address, b.runtime.address);
  EXPECT_EQ(a.runtime.max_batch_size, b.runtime.max_batch_size);
  EXPECT_EQ(a.runtime.process, b.runtime.process);
  const auto &x = a.engine, &y = b.engine;
  EXPECT_EQ(x.model_stage, y.model_stage);
  EXPECT_EQ(x.model_arch, y.model_arch);
  EXPECT_EQ(x.model, y.model);
  EXPECT_EQ(x.cpu_offload_enabled, y.cpu_offload_enabled);
  EXPECT_EQ(x.cpu_offload_components, y.cpu_offload_components);
  EXPECT_EQ(x.cpu_offload_strategy, y.cpu_offload_strategy);
  EXPECT_EQ(x.cpu_offload_pin_memory, y.cpu_offload_pin_memory);
  EXPECT_EQ(x.enable_cpu_offload, y.enable_cpu_offload);
  EXPECT_EQ(x.enable_layerwise_offload, y.enable_layerwise_offload);
  EXPECT_EQ(x.layerwise_num_gpu_layers, y.layerwise_num_gpu_layers);
  EXPECT_EQ(x.gpu_memory_budget, y.gpu_memory_budget);
  EXPECT_EQ(x.dtype, y.dtype);
  EXPECT_EQ(x.offload_stage, y.offload_stage);
  EXPECT_EQ(x.ignored, y.ignored);
  EXPECT_EQ(a.engine_input_source, b.engine_input_source);
  EXPECT_EQ(a.final_output, b.final_output);
  EXPECT_EQ(a.final_output_type, b.final_output_type);
  EXPECT_EQ(a.sampling.temperature, b.sampling.temperature);
  EXPECT_EQ(a.sampling.top_p, b.sampling.top_p);
  EXPECT_EQ(a.sampling.top_k, b.sampling.top_k);
  EXPECT_EQ(a.sampling.max_tokens, b.sampling.max_tokens);
  EXPECT_EQ(a.sampling.seed, b.sampling.seed);
  EXPECT_EQ(a.sampling.repetition_penalty, b.sampling.repetition_penalty);
  EXPECT_EQ(a.sampling.stop_token_ids, b.sampling.stop_token_ids);
  EXPECT_EQ(a.sampling.greedy, b.sampling.greedy);
  EXPECT_EQ(a.custom_process_input_func, b.custom_process_input_func);
  EXPECT_EQ(a.is_comprehension, b.is_comprehension);
}

const char kNested[] = R"(stage_args:
  - stage_id: 0
    runtime:
      devices: "0"
      max_batch_size: 2
    engine_args:
      model_stage: thinker
      model_arch: Qwen3OmniMoeForConditionalGeneration
      model: m
      dtype: bf16
      cpu_offload_enabled: true
      cpu_offload_components: [visual]
      cpu_offload_strategy: sequential
      gpu_memory_budget: 2GiB
      enforce_eager: true
    final_output: true
    final_output_type: text
    is_comprehension: true
    default_sampling_params:
      temperature: 0.4
      top_k: 1
      seed: 7
      detokenize: true
  - stage_id: 1
    stage_type: generation
    runtime:
      devices: "0,1"
      address: localhost:50051
    engine_args:
      model_stage: talker
      model: ./m2/
      enable_layerwise_offload: true
      layerwise_num_gpu_layers: 2
      cpu_offload_pin_memory: false
    engine_input_source: [0]
    custom_process_input_func: a.b.c
    default_sampling_params:
      stop_token_ids: [2150, 2151]
      greedy: true
)";

const char kFlat[] = R"(async_chunk: true
connectors:
  shm: {name: SharedMemoryConnector}
stages:
  - stage_id: 0
    runtime:
      devices: "0"
      max_batch_size: 2
    model_stage: thinker
    model_arch: Qwen3OmniMoeForConditionalGeneration
    model: m
    dtype: bf16
    cpu_offload_enabled: true
    cpu_offload_components: [visual]
    cpu_offload_strategy: sequential
    gpu_memory_budget: 2GiB
    enforce_eager: true
    final_output: true
    final_output_type: text
    is_comprehension: true
    default_sampling_params:
      temperature: 0.4
      top_k: 1
      seed: 7
      detokenize: true
  - stage_id: 1
    stage_type: generation
    devices: "0,1"
    address: localhost:50051
    model_stage: talker
    model: ./m2/
    enable_layerwise_offload: true
    layerwise_num_gpu_layers: 2
    cpu_offload_pin_memory: false
    engine_input_source: [0]
    custom_process_input_func: a.b.c
    default_sampling_params:
      stop_token_ids: [2150, 2151]
      greedy: true
)";

TEST_F(StageConfigTest, FlatStagesLayoutParsesToTheSameStructsAsStageArgs) {
  const auto nested = parse(kNested);
  const auto flat = parse(kFlat);
  ASSERT_EQ(nested.stages.size(), 2u);
  ASSERT_EQ(flat.stages.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    SCOPED_TRACE("stage " + std::to_string(i));
    expect_same_stage(nested.stages[i], flat.stages[i]);
  }
  // And the values are the ones written.
  const auto& s0 = nested.stage(0);
  EXPECT_EQ(s0.runtime.max_batch_size, 2);
  EXPECT_EQ(s0.engine.model, (dir_ / "m").string());
  EXPECT_EQ(s0.engine.dtype, "bfloat16");
  EXPECT_EQ(s0.engine.cpu_offload_components, std::vector<std::string>({"visual"}));
  EXPECT_EQ(s0.engine.cpu_offload_strategy, "sequential");
  EXPECT_EQ(s0.engine.gpu_memory_budget, 2ull << 30);
  EXPECT_EQ(s0.engine.ignored.at("enforce_eager"), "true");
  EXPECT_EQ(s0.engine.ignored.at("default_sampling_params.detokenize"), "true");
  EXPECT_EQ(s0.sampling.seed, 7u);
  EXPECT_FALSE(s0.sampling.max_tokens.has_value());
  EXPECT_EQ(s0.location.str(), kName + ":2:5");
  const auto& s1 = nested.stage(1);
  EXPECT_EQ(s1.runtime.devices, "0,1");
  EXPECT_EQ(s1.runtime.address, "localhost:50051");
  EXPECT_EQ(s1.engine.model, (dir_ / "m2").string());  // normalised, no trailing '/'
  EXPECT_TRUE(s1.engine.enable_layerwise_offload);
  EXPECT_EQ(s1.engine.layerwise_num_gpu_layers, 2);
  EXPECT_FALSE(s1.engine.cpu_offload_pin_memory);
  EXPECT_EQ(s1.engine.cpu_offload_components,
            std::vector<std::string>({"visual", "audio_tower"}));  // the default
  EXPECT_EQ(s1.sampling.stop_token_ids, std::vector<int64_t>({2150, 2151}));
  EXPECT_EQ(s1.sampling.greedy, true);
  EXPECT_EQ(flat.ignored.at("async_chunk"), "true");
  EXPECT_EQ(flat.ignored.at("connectors"), "{shm: {name: SharedMemoryConnector}}");
}

TEST_F(StageConfigTest, DefaultsDtypesAndTheTopLevelDtype) {
  auto config = parse(one_stage(""));
  const auto& s = config.stage(0);
  EXPECT_EQ(s.stage_type, "llm");
  EXPECT_EQ(s.runtime.devices, "0");
  EXPECT_EQ(s.runtime.max_batch_size, 8);
  EXPECT_FALSE(s.engine.cpu_offload_enabled);
  EXPECT_EQ(s.engine.cpu_offload_strategy, "alternating");
  EXPECT_EQ(s.engine.gpu_memory_budget, 0u);
  EXPECT_EQ(s.engine.dtype, "");
  EXPECT_FALSE(s.sampling.temperature.has_value());

  for (const auto& [given, normal] :
       std::vector<std::pair<std::string, std::string>>{{"float", "float32"},
                                                        {"fp32", "float32"},
                                                        {"bfloat16", "bfloat16"},
                                                        {"fp16", "float16"},
                                                        {"half", "float16"},
                                                        {"FLOAT16", "float16"},
                                                        {"auto", ""}}) {
    EXPECT_EQ(parse(one_stage("      dtype: " + given + "\n")).stage(0).engine.dtype, normal)
        << given;
  }
  // A top-level dtype is the default of the stages that set none.
  EXPECT_EQ(parse("dtype: bf16\n" + one_stage("")).stage(0).engine.dtype, "bfloat16");
  EXPECT_EQ(parse("dtype: bf16\n" + one_stage("      dtype: float32\n")).stage(0).engine.dtype,
            "float32");
  // Byte sizes: integers and units.
  EXPECT_EQ(parse(one_stage("      gpu_memory_budget: 8GB\n")).stage(0).engine.gpu_memory_budget,
            8000000000u);
  EXPECT_EQ(
      parse(one_stage("      gpu_memory_budget: 1048576\n")).stage(0).engine.gpu_memory_budget,
      1048576u);
  // Components as one comma-separated string.
  EXPECT_EQ(parse(one_stage("      cpu_offload_components: \"visual, thinker.*\"\n"))
                .stage(0)
                .engine.cpu_offload_components,
            std::vector<std::string>({"visual", "thinker.*"}));
}

TEST_F(StageConfigTest, TopologicalOrderEntryStagesAndLookup) {
  const std::string yaml = R"(stage_args:
  - stage_id: 5
    engine_args: {model_stage: code2wav, model: m}
    engine_input_source: [3]
    final_output: true
    final_output_type: audio
  - stage_id: 3
    engine_args: {model_stage: talker, model: m}
    engine_input_source: [1, 4]
  - stage_id: 4
    engine_args: {model_stage: thinker, model: m}
  - stage_id: 1
    engine_args: {model_stage: thinker, model: m}
)";
  const auto config = parse(yaml);
  EXPECT_EQ(config.topological_order(), std::vector<int64_t>({4, 1, 3, 5}));
  EXPECT_EQ(config.entry_stages(), std::vector<int64_t>({4, 1}));
  EXPECT_EQ(config.stage(3).engine.model_stage, "talker");
  const std::string error = error_of([&] { config.stage(7); });
  EXPECT_TRUE(IsError(error, kName, "no stage 7 (stages: 5, 3, 4, 1)"));
}

// --- errors ------------------------------------------------------------------------------------

TEST_F(StageConfigTest, YamlSyntaxErrorHasThePosition) {
  // The flow list is not closed; yaml-cpp notices at the ':' of the next line's key.
  EXPECT_TRUE(IsError(parse_error("stage_args: [1, 2\nstages: 3\n"), kName + ":2:7",
                      "end of sequence flow not found"));
  EXPECT_TRUE(IsError(parse_error("a: b: c\n"), kName + ":1:5", "illegal map value"));
}

TEST_F(StageConfigTest, UnknownKeysSuggestTheClosest) {
  std::string yaml = one_stage("", "    default_sampling_params:\n      temperatur: 0.5\n");
  std::string error = parse_error(yaml);
  EXPECT_TRUE(IsError(error, pos_of(yaml, "temperatur"),
                      "unknown key 'temperatur' in default_sampling_params; did you mean "
                      "'temperature'?"));
  EXPECT_EQ(error.find("known keys"), std::string::npos) << error;  // nothing else listed

  yaml = one_stage("      cpu_offload_component: [visual]\n");  // a prefix of the right key
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "cpu_offload_component"),
                      "did you mean 'cpu_offload_components'?"));

  yaml = one_stage("      enforce_eagr: true\n");  // an ignored vLLM-Omni key is suggested too
  EXPECT_TRUE(
      IsError(parse_error(yaml), pos_of(yaml, "enforce_eagr"), "did you mean 'enforce_eager'?"));

  yaml = one_stage("      frobnicate: 1\n");
  error = parse_error(yaml);
  EXPECT_TRUE(IsError(error, pos_of(yaml, "frobnicate"),
                      "unknown key 'frobnicate' in engine_args (known keys: model_stage, "));
  EXPECT_EQ(error.find("did you mean"), std::string::npos) << error;

  yaml = "stage_argz:\n" + one_stage("").substr(std::string("stage_args:\n").size());
  EXPECT_TRUE(IsError(parse_error(yaml), kName + ":1:1",
                      "unknown key 'stage_argz' in the top level; did you mean 'stage_args'?"));

  yaml = one_stage("", "    runtime:\n      device: \"0\"\n");
  EXPECT_TRUE(
      IsError(parse_error(yaml), pos_of(yaml, "device:"), "in runtime; did you mean 'devices'?"));

  // An engine key at the stage level of the nested layout says where it belongs.
  yaml = one_stage("", "    dtype: float32\n");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "dtype"), "belongs under engine_args"));
  yaml = one_stage("", "    runtime: {}\n    devices: \"0\"\n");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "devices"), "belongs under runtime"));

  // A key given twice in one mapping.
  yaml = one_stage("      model: m2\n");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "model:", 2),
                      "'model' is given twice (first at " + pos_of(yaml, "model:") + ")"));
}

TEST_F(StageConfigTest, WrongTypesNameTheKeyAndTheExpectedType) {
  std::string yaml = R"(stage_args:
  - stage_id: 0
    engine_args: {model_stage: thinker, model: m}
    final_output: maybe
)";
  EXPECT_TRUE(IsError(parse_error(yaml), kName + ":4:19",
                      "final_output: expected a boolean (true or false), got 'maybe'"));

  yaml = one_stage("");
  yaml.replace(yaml.find("stage_id: 0"), 11, "stage_id: abc");
  EXPECT_TRUE(
      IsError(parse_error(yaml), kName + ":2:15", "stage_id: expected an integer, got 'abc'"));

  yaml = "stage_args:\n  - stage_id: 0\n    engine_args: [model_stage, model]\n";
  EXPECT_TRUE(
      IsError(parse_error(yaml), kName + ":3:18", "engine_args: expected a mapping, got a list"));

  yaml = "stage_args:\n  stage_id: 0\n";
  EXPECT_TRUE(IsError(parse_error(yaml), kName + ":2:3",
                      "stage_args: expected a list of stages, got a mapping"));

  yaml = "stage_args:\n  - 0\n";
  EXPECT_TRUE(IsError(parse_error(yaml), kName + ":2:5", "a stage must be a mapping"));

  yaml = one_stage("      layerwise_num_gpu_layers: \"2\"\n");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "\"2\""),
                      "layerwise_num_gpu_layers: expected an integer, got the string \"2\""));

  yaml = one_stage("", "    engine_input_source: 0\n");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "0\n", 2),
                      "engine_input_source: expected a list of integers"));

  yaml = one_stage("", "    default_sampling_params:\n      temperature: hot\n");
  EXPECT_TRUE(
      IsError(parse_error(yaml), pos_of(yaml, "hot"), "temperature: expected a number, got 'hot'"));

  yaml = one_stage("", "    runtime:\n      devices: gpu0\n");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "gpu0"),
                      "devices: expected \"cpu\" or device indices"));

  yaml = one_stage("", "    runtime:\n      address: localhost\n");
  EXPECT_TRUE(
      IsError(parse_error(yaml), pos_of(yaml, "localhost"), "address: expected \"host:port\""));

  EXPECT_TRUE(IsError(parse_error("- 1\n"), kName + ":1:1", "expected a mapping"));
  EXPECT_TRUE(IsError(parse_error(""), kName + ":1:1", "empty"));
}

TEST_F(StageConfigTest, ModelDirectoryMustExist) {
  std::string yaml = one_stage("");
  yaml.replace(yaml.find("model: m"), 8, "model: nope/deeper");
  const std::string error = parse_error(yaml);
  EXPECT_TRUE(IsError(error, pos_of(yaml, "nope"),
                      "model: the directory '" + (dir_ / "nope/deeper").string() +
                          "' does not exist ('nope/deeper' resolved against '" + dir_.string() +
                          "')"));
  // Without the check the path is still made absolute.
  const auto config = parse_pipeline_config(yaml, kName, dir_.string(), false);
  EXPECT_EQ(config.stage(0).engine.model, (dir_ / "nope/deeper").string());

  std::ofstream(dir_ / "file") << "x";
  yaml.replace(yaml.find("nope/deeper"), 11, (dir_ / "file").string());
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, dir_.string()), "is not a directory"));

  yaml =
      "stage_args:\n  - stage_id: 0\n    engine_args:\n      model_stage: thinker\n"
      "    final_output: true\n    final_output_type: text\n";
  EXPECT_TRUE(IsError(parse_error(yaml), kName + ":3:5",
                      "stage 0 has no model (the checkpoint directory)"));
  yaml =
      "stage_args:\n  - stage_id: 0\n    engine_args:\n      model: m\n"
      "    final_output: true\n    final_output_type: text\n";
  EXPECT_TRUE(IsError(parse_error(yaml), kName + ":3:5",
                      "stage 0 has no model_stage (thinker, talker, code2wav, diffusion, "
                      "diffusion_encode, diffusion_denoise, diffusion_decode)"));
}

TEST_F(StageConfigTest, UnknownEnumValues) {
  std::string yaml = one_stage("");
  yaml.replace(yaml.find("thinker"), 7, "thinkr");
  EXPECT_TRUE(IsError(parse_error(yaml), kName + ":4:20",
                      "model_stage: unknown value 'thinkr'; did you mean 'thinker'? (valid: "
                      "thinker, talker, code2wav, diffusion, diffusion_encode, "
                      "diffusion_denoise, diffusion_decode)"));

  yaml = one_stage("", "    stage_type: autoregressive\n");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "autoregressive"),
                      "stage_type: unknown value 'autoregressive' (valid: llm, generation, "
                      "diffusion)"));

  yaml = one_stage("");
  yaml.replace(yaml.find("type: text"), 10, "type: video");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "video"),
                      "final_output_type: unknown value 'video' (valid: text, audio, image)"));

  yaml = one_stage("      cpu_offload_strategy: sequental\n");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "sequental"), "did you mean 'sequential'?"));

  yaml = one_stage("      dtype: float64\n");
  EXPECT_TRUE(
      IsError(parse_error(yaml), pos_of(yaml, "float64"),
              "dtype: unknown value 'float64'; did you mean 'float32'? (valid: auto, float32, "
              "bfloat16, float16)"));
}

const char kTwoStages[] = R"(stage_args:
  - stage_id: 0
    engine_args: {model_stage: thinker, model: m}
    final_output: true
    final_output_type: text
  - stage_id: 0
    engine_args: {model_stage: talker, model: m}
    engine_input_source: [0]
)";

TEST_F(StageConfigTest, StageIds) {
  std::string yaml = kTwoStages;
  EXPECT_TRUE(IsError(parse_error(yaml), kName + ":6:15",
                      "stage_id 0 is used twice (first at " + kName + ":2:15)"));

  yaml = one_stage("");
  yaml.replace(yaml.find("stage_id: 0"), 11, "stage_id: -1");
  EXPECT_TRUE(IsError(parse_error(yaml), kName + ":2:15", "stage_id must be >= 0, got -1"));

  yaml = one_stage("");
  yaml.replace(yaml.find("stage_id: 0"), 11, "stage_type: llm");
  EXPECT_TRUE(IsError(parse_error(yaml), kName + ":2:5", "the stage has no stage_id"));
}

TEST_F(StageConfigTest, GraphErrors) {
  std::string yaml = kTwoStages;
  yaml.replace(yaml.rfind("stage_id: 0"), 11, "stage_id: 1");
  yaml.replace(yaml.find("[0]"), 3, "[0, 2]");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "2]"),
                      "engine_input_source: no stage 2 (stages: 0, 1)"));

  yaml.replace(yaml.find("[0, 2]"), 6, "[0, 1]");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "1]"),
                      "stage 1 lists itself in engine_input_source"));

  yaml = R"(stage_args:
  - stage_id: 0
    engine_args: {model_stage: thinker, model: m}
    final_output: true
    final_output_type: text
  - stage_id: 1
    engine_args: {model_stage: talker, model: m}
    engine_input_source: [0, 3]
  - stage_id: 2
    engine_args: {model_stage: code2wav, model: m}
    engine_input_source: [1]
  - stage_id: 3
    engine_args: {model_stage: code2wav, model: m}
    engine_input_source: [2]
)";
  EXPECT_TRUE(IsError(parse_error(yaml), kName + ":6:5",
                      "engine_input_source forms a cycle: stage 1 -> stage 2 -> stage 3 -> "
                      "stage 1"));

  yaml = R"(stage_args:
  - stage_id: 0
    engine_args: {model_stage: thinker, model: m}
    engine_input_source: [1]
    final_output: true
    final_output_type: text
  - stage_id: 1
    engine_args: {model_stage: talker, model: m}
    engine_input_source: [0]
)";
  EXPECT_TRUE(IsError(parse_error(yaml), kName + ":1:1",
                      "no entry stage: every stage has an engine_input_source"));

  yaml = R"(stage_args:
  - stage_id: 0
    engine_args: {model_stage: thinker, model: m}
  - stage_id: 1
    engine_args: {model_stage: talker, model: m}
    engine_input_source: [0, 0]
)";
  EXPECT_TRUE(
      IsError(parse_error(yaml), kName + ":6:30", "engine_input_source lists stage 0 twice"));
}

TEST_F(StageConfigTest, FinalOutputErrors) {
  std::string yaml =
      "stage_args:\n  - stage_id: 0\n    engine_args: {model_stage: thinker, "
      "model: m}\n    final_output: false\n";
  EXPECT_TRUE(IsError(parse_error(yaml), kName + ":1:1", "no stage has final_output: true"));

  yaml =
      "stage_args:\n  - stage_id: 0\n    engine_args: {model_stage: thinker, model: m}\n"
      "    final_output: true\n";
  EXPECT_TRUE(IsError(parse_error(yaml), kName + ":4:19",
                      "stage 0: final_output is true but final_output_type is not set"));

  EXPECT_TRUE(
      IsError(parse_error("stage_args: []\n"), kName + ":1:1", "the pipeline has no stages"));
}

TEST_F(StageConfigTest, LayoutErrors) {
  const std::string body = one_stage("").substr(std::string("stage_args:\n").size());
  const std::string yaml = "stage_args:\n" + body + "stages:\n" + body;
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "stages:"),
                      "both 'stage_args' (the nested layout) and 'stages' (the flat one) are "
                      "given (the first at " +
                          kName + ":1:1)"));
  EXPECT_TRUE(IsError(parse_error("async_chunk: true\n"), kName + ":1:1",
                      "no 'stage_args' or 'stages' list"));
  // The flat layout: a runtime key both flat and nested.
  const std::string flat =
      "stages:\n  - stage_id: 0\n    model_stage: thinker\n    model: m\n"
      "    runtime: {devices: \"0\"}\n    devices: \"1\"\n"
      "    final_output: true\n    final_output_type: text\n";
  EXPECT_TRUE(IsError(parse_error(flat), kName + ":6:5",
                      "'devices' is given twice (first at " + kName + ":5:15)"));
}

TEST_F(StageConfigTest, ValueRanges) {
  std::string yaml = one_stage("      layerwise_num_gpu_layers: 0\n");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "0\n", 2),
                      "layerwise_num_gpu_layers must be >= 1, got 0"));

  yaml = one_stage("      gpu_memory_budget: 20GX\n");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "20GX"),
                      "gpu_memory_budget: unknown unit 'GX' in '20GX'"));

  const auto sampling = [](const std::string& line) {
    return one_stage("", "    default_sampling_params:\n      " + line + "\n");
  };
  yaml = sampling("max_tokens: -5");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "-5"), "max_tokens must be >= 1, got -5"));
  yaml = sampling("top_p: 0");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "0\n", 2), "top_p must be in (0, 1], got 0"));
  yaml = sampling("top_p: 1.5");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "1.5"), "top_p must be in (0, 1]"));
  EXPECT_NO_THROW(parse(sampling("top_p: 1")));
  yaml = sampling("temperature: -0.1");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "-0.1"), "temperature must be >= 0"));
  EXPECT_NO_THROW(parse(sampling("temperature: 0")));
  yaml = sampling("seed: -1");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "-1"), "seed must be >= 0"));
  yaml = sampling("stop_token_ids: [1, -2]");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "-2"), "token ids are >= 0"));
  yaml = one_stage("", "    runtime: {max_batch_size: 0}\n");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "0}"), "max_batch_size must be >= 1"));
}

// --- flags and --stage-overrides ---------------------------------------------------------------

const char kThree[] = R"(stage_args:
  - stage_id: 0
    engine_args:
      model_stage: thinker
      model: m
      dtype: float32
      cpu_offload_components: [audio_tower]
    final_output: true
    final_output_type: text
    default_sampling_params: {temperature: 0.4, top_k: 1}
  - stage_id: 1
    engine_args: {model_stage: talker, model: m, cpu_offload_enabled: true}
    engine_input_source: [0]
  - stage_id: 2
    engine_args: {model_stage: code2wav, model: m}
    engine_input_source: [1]
    final_output: true
    final_output_type: audio
)";

TEST_F(StageConfigTest, PrecedenceOverridesThenFlagsThenYamlThenDefaults) {
  auto config = parse(kThree);
  const EngineFlags flags = {engine_flag("dtype", {"bf16"}),
                             engine_flag("layerwise_num_gpu_layers", {"3"})};
  apply_stage_flags(config, flags,
                    R"({"0": {"dtype": "float16", "gpu_memory_budget": "20GiB",
                              "default_sampling_params": {"temperature": 0.7, "max_tokens": 9},
                              "runtime": {"devices": "1", "max_batch_size": 4}},
                        "2": {"layerwise_num_gpu_layers": 5, "gpu_memory_budget": 1000,
                              "enforce_eager": true}})");
  const auto& s0 = config.stage(0);
  EXPECT_EQ(s0.engine.dtype, "float16");                // overrides > flags > YAML
  EXPECT_EQ(config.stage(1).engine.dtype, "bfloat16");  // flags > default
  EXPECT_EQ(config.stage(2).engine.dtype, "bfloat16");
  EXPECT_EQ(s0.engine.gpu_memory_budget, 20ull << 30);
  EXPECT_EQ(config.stage(2).engine.gpu_memory_budget, 1000u);
  EXPECT_EQ(config.stage(1).engine.gpu_memory_budget, 0u);        // default
  EXPECT_EQ(s0.engine.layerwise_num_gpu_layers, 3);               // flags
  EXPECT_EQ(config.stage(2).engine.layerwise_num_gpu_layers, 5);  // overrides > flags
  EXPECT_EQ(s0.sampling.temperature, 0.7);                        // overrides > YAML
  EXPECT_EQ(s0.sampling.top_k, 1);                                // YAML kept
  EXPECT_EQ(s0.sampling.max_tokens, 9);
  EXPECT_EQ(s0.runtime.devices, "1");
  EXPECT_EQ(s0.runtime.max_batch_size, 4);
  EXPECT_EQ(config.stage(2).engine.ignored.at("enforce_eager"), "true");
  EXPECT_EQ(s0.engine.cpu_offload_components, std::vector<std::string>({"audio_tower"}));
  EXPECT_TRUE(config.stage(1).engine.cpu_offload_enabled);

  // null = the default again.
  apply_stage_flags(config, {}, R"({"0": {"dtype": null,
                                          "default_sampling_params": {"temperature": null}}})");
  EXPECT_EQ(config.stage(0).engine.dtype, "");
  EXPECT_FALSE(config.stage(0).sampling.temperature.has_value());
  EXPECT_EQ(config.stage(0).sampling.top_k, 1);

  // Empty overrides and no flags change nothing.
  const auto before = config.stage(1).engine.dtype;
  apply_stage_flags(config, {}, "  ");
  EXPECT_EQ(config.stage(1).engine.dtype, before);
}

TEST_F(StageConfigTest, ComponentFlagSelectsStagesOrModules) {
  {  // Stage names only: offload_stage on those stages, components and enabled untouched.
    auto config = parse(kThree);
    const EngineFlags flags = {engine_flag("cpu_offload_components", {"thinker", "code2wav"})};
    apply_stage_flags(config, flags, "");
    EXPECT_TRUE(config.stage(0).engine.offload_stage);
    EXPECT_FALSE(config.stage(1).engine.offload_stage);
    EXPECT_TRUE(config.stage(2).engine.offload_stage);
    EXPECT_FALSE(config.stage(0).engine.cpu_offload_enabled);
    EXPECT_TRUE(config.stage(1).engine.cpu_offload_enabled);
    EXPECT_EQ(config.stage(0).engine.cpu_offload_components,
              std::vector<std::string>({"audio_tower"}));
    EXPECT_EQ(config.stage(2).engine.cpu_offload_components,
              std::vector<std::string>({"visual", "audio_tower"}));
  }
  {  // Mixed: the module names replace every stage's components and enable component offload.
    auto config = parse(kThree);
    const EngineFlags flags = {
        engine_flag("cpu_offload_components", {"talker", "visual", "thinker.*, visual"})};
    apply_stage_flags(config, flags, "");
    for (const auto& s : config.stages) {
      EXPECT_EQ(s.engine.cpu_offload_components, std::vector<std::string>({"visual", "thinker.*"}));
      EXPECT_TRUE(s.engine.cpu_offload_enabled);
      EXPECT_EQ(s.engine.offload_stage, s.engine.model_stage == "talker");
    }
  }
  {  // An explicit --cpu-offload-enabled wins over the one the module names imply; overrides win.
    auto config = parse(kThree);
    const EngineFlags flags = {engine_flag("cpu_offload_components", {"visual"}),
                               engine_flag("cpu_offload_enabled", {"false"}),
                               engine_flag("cpu_offload_strategy", {"sequential"}),
                               engine_flag("cpu_offload_pin_memory", {"false"}),
                               engine_flag("enable_cpu_offload", {"true"}),
                               engine_flag("enable_layerwise_offload", {"true"}),
                               engine_flag("gpu_memory_budget", {"123"})};
    apply_stage_flags(config, flags, R"({"1": {"cpu_offload_enabled": true,
                                               "cpu_offload_components": "audio_tower"}})");
    EXPECT_FALSE(config.stage(0).engine.cpu_offload_enabled);
    EXPECT_TRUE(config.stage(1).engine.cpu_offload_enabled);
    EXPECT_EQ(config.stage(1).engine.cpu_offload_components,
              std::vector<std::string>({"audio_tower"}));
    for (const auto& s : config.stages) {
      EXPECT_EQ(s.engine.cpu_offload_strategy, "sequential");
      EXPECT_FALSE(s.engine.cpu_offload_pin_memory);
      EXPECT_TRUE(s.engine.enable_cpu_offload);
      EXPECT_TRUE(s.engine.enable_layerwise_offload);
      EXPECT_EQ(s.engine.gpu_memory_budget, 123u);
    }
  }
}

TEST_F(StageConfigTest, FlagErrorsNameTheFlag) {
  auto config = parse(kThree);
  EngineFlags flags = {engine_flag("cpu_offload_strategy", {"alternatin"})};
  EXPECT_TRUE(IsError(error_of([&] { apply_stage_flags(config, flags, ""); }),
                      "--cpu-offload-strategy", "did you mean 'alternating'?"));
  flags = {engine_flag("dtype", {"int8"})};
  EXPECT_TRUE(IsError(error_of([&] { apply_stage_flags(config, flags, ""); }), "--dtype",
                      "unknown value 'int8'"));
  flags = {engine_flag("layerwise_num_gpu_layers", {"0"})};
  EXPECT_TRUE(IsError(error_of([&] { apply_stage_flags(config, flags, ""); }),
                      "--layerwise-num-gpu-layers", "must be >= 1"));
  flags = {engine_flag("cpu_offload_components", {"visual", ""})};
  EXPECT_TRUE(IsError(error_of([&] { apply_stage_flags(config, flags, ""); }),
                      "--cpu-offload-components", "an empty name"));
  // The alias names the flag the user typed.
  flags = {{"gpu_memory_budget", "--cpu-offload-budget", {"lots"}}};
  EXPECT_TRUE(IsError(error_of([&] { apply_stage_flags(config, flags, ""); }),
                      "--cpu-offload-budget", "'lots' is not a byte size"));
}

TEST_F(StageConfigTest, OverridesErrors) {
  auto config = parse(kThree);
  const auto error = [&](const std::string& json) {
    auto copy = config;
    return error_of([&] { apply_stage_flags(copy, {}, json); });
  };
  EXPECT_TRUE(IsError(error("{\"0\": {\"dtype\": }"), "--stage-overrides",
                      "not valid JSON: parse error at line 1, column 17"));
  EXPECT_TRUE(
      IsError(error("[1, 2]"), "--stage-overrides", "expected a JSON object keyed by stage id"));
  EXPECT_TRUE(IsError(error(R"({"5": {"dtype": "float32"}})"), "--stage-overrides",
                      "no stage 5 (stages: 0, 1, 2)"));
  EXPECT_TRUE(IsError(error(R"({"thinker": {}})"), "--stage-overrides",
                      "'thinker' is not a stage id (stages: 0, 1, 2)"));
  EXPECT_TRUE(IsError(error(R"({"0": 3})"), "--stage-overrides: stage 0",
                      "expected an object of engine_args keys, got 3"));
  std::string e = error(R"({"0": {"dtyp": "float32"}})");
  EXPECT_TRUE(IsError(e, "--stage-overrides: stage 0",
                      "unknown key 'dtyp' in the stage's overrides; did you mean 'dtype'?"));
  EXPECT_TRUE(IsError(error(R"({"0": {"default_sampling_params": {"top_kk": 3}}})"),
                      "--stage-overrides: stage 0: default_sampling_params",
                      "did you mean 'top_k'?"));
  EXPECT_TRUE(IsError(error(R"({"0": {"runtime": {"devices": [0]}}})"),
                      "--stage-overrides: stage 0: runtime", "devices: expected a string"));
  EXPECT_TRUE(IsError(error(R"({"0": {"runtime": []}})"), "--stage-overrides: stage 0: runtime",
                      "expected an object, got an array"));
  EXPECT_TRUE(IsError(error(R"({"1": {"cpu_offload_enabled": "yes"}})"),
                      "--stage-overrides: stage 1",
                      "cpu_offload_enabled: expected a boolean (true or false), got the string "
                      "\"yes\""));
  EXPECT_TRUE(IsError(error(R"({"1": {"layerwise_num_gpu_layers": 1.5}})"),
                      "--stage-overrides: stage 1",
                      "layerwise_num_gpu_layers: expected an integer, got '1.5'"));
  EXPECT_TRUE(IsError(error(R"({"1": {"gpu_memory_budget": "lots"}})"),
                      "--stage-overrides: stage 1", "gpu_memory_budget: 'lots' is not a byte"));
  EXPECT_TRUE(IsError(error(R"({"0": {"default_sampling_params": {"top_p": 2}}})"),
                      "--stage-overrides: stage 0: default_sampling_params",
                      "top_p must be in (0, 1], got 2"));
  EXPECT_TRUE(IsError(error(R"({"0": {"model": "/nonexistent/checkpoint"}})"),
                      "--stage-overrides: stage 0",
                      "model: the directory '/nonexistent/checkpoint' does not exist"));
  // The result is validated again.
  EXPECT_TRUE(IsError(error(R"({"1": {"model_stage": null}})"), "--stage-overrides",
                      "the result is invalid: " + kName + ":11:5: stage 1 has no model_stage"));
  // A valid model override resolves against the current directory.
  auto copy = config;
  apply_stage_flags(copy, {}, "{\"0\": {\"model\": \"" + (dir_ / "m2").string() + "\"}}");
  EXPECT_EQ(copy.stage(0).engine.model, (dir_ / "m2").string());
}

// --- byte sizes --------------------------------------------------------------------------------

TEST(ParseByteSize, UnitsAndErrors) {
  EXPECT_EQ(offload::values::parse_byte_size("0"), 0u);
  EXPECT_EQ(offload::values::parse_byte_size("123"), 123u);
  EXPECT_EQ(offload::values::parse_byte_size("512B"), 512u);
  EXPECT_EQ(offload::values::parse_byte_size("20GiB"), 20ull << 30);
  EXPECT_EQ(offload::values::parse_byte_size("8GB"), 8000000000ull);
  EXPECT_EQ(offload::values::parse_byte_size("1 KiB"), 1024u);
  EXPECT_EQ(offload::values::parse_byte_size("3kb"), 3000u);
  EXPECT_EQ(offload::values::parse_byte_size("5MiB"), 5ull << 20);
  EXPECT_EQ(offload::values::parse_byte_size("7MB"), 7000000u);
  EXPECT_EQ(offload::values::parse_byte_size("2TiB"), 2ull << 40);
  EXPECT_EQ(offload::values::parse_byte_size("2TB"), 2000000000000ull);
  EXPECT_EQ(offload::values::parse_byte_size("1.5GB"), 1500000000ull);
  EXPECT_EQ(offload::values::parse_byte_size("0.5GiB"), 1ull << 29);
  EXPECT_EQ(offload::values::parse_byte_size(" 42 "), 42u);
  EXPECT_EQ(offload::values::parse_byte_size("18446744073709551615"), 18446744073709551615ull);

  const auto reason = [](const std::string& text) -> std::string {
    try {
      offload::values::parse_byte_size(text);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(reason("").find("empty"), std::string::npos);
  EXPECT_NE(reason("-1GB").find("cannot be negative"), std::string::npos);
  EXPECT_NE(reason("12XB").find("unknown unit 'XB'"), std::string::npos);
  EXPECT_NE(reason("12G").find("unknown unit 'G'"), std::string::npos);
  EXPECT_NE(reason("GB").find("is not a byte size"), std::string::npos);
  EXPECT_NE(reason("1.5").find("not a whole number of bytes"), std::string::npos);
  EXPECT_NE(reason("18446744073709551616").find("too large"), std::string::npos);
  EXPECT_NE(reason("20000000TiB").find("too large"), std::string::npos);
}

TEST_F(StageConfigTest, ExpertOffloadKeysAndFlags) {
  auto config =
      parse(one_stage("      cpu_offload_experts: true\n      expert_cache_budget: 10%\n"
                      "      expert_prefetch: false\n      expert_miss_policy: host\n"));
  const auto& e = config.stages.at(0).engine;
  EXPECT_TRUE(e.cpu_offload_experts);
  EXPECT_EQ(e.expert_cache_budget, "10%");
  EXPECT_FALSE(e.expert_prefetch);
  EXPECT_EQ(e.expert_miss_policy, "host");
  EXPECT_EQ(parse(one_stage("      expert_cache_budget: 768MiB\n"))
                .stages.at(0)
                .engine.expert_cache_budget,
            "805306368");
  const StageEngineArgs defaults;
  EXPECT_FALSE(defaults.cpu_offload_experts);
  EXPECT_EQ(defaults.expert_cache_budget, "25%");

  std::string yaml = one_stage("      expert_cache_budget: 150%\n");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "150%"),
                      "expert_cache_budget: '150%' must be a percentage in (0%, 100%]"));
  yaml = one_stage("      expert_cache_budget: 0\n");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "0\n", 2), "expert_cache_budget: 0 bytes"));
  yaml = one_stage("      expert_miss_policy: sometimes\n");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "sometimes"), "unknown value 'sometimes'"));

  // The global flags set every stage; a bad budget names the flag.
  config = parse(kThree);
  EngineFlags flags = {engine_flag("cpu_offload_experts", {"true"}),
                       engine_flag("expert_cache_budget", {"50%"})};
  apply_stage_flags(config, flags, "");
  for (const auto& stage : config.stages) {
    EXPECT_TRUE(stage.engine.cpu_offload_experts);
    EXPECT_EQ(stage.engine.expert_cache_budget, "50%");
  }
  flags = {engine_flag("expert_cache_budget", {"lots"})};
  EXPECT_TRUE(IsError(error_of([&] { apply_stage_flags(config, flags, ""); }),
                      "--expert-cache-budget", "expert_cache_budget"));
}

TEST_F(StageConfigTest, ExpertEvictionAndDiskTierKeysAndFlags) {
  auto config = parse(one_stage(
      "      expert_eviction: lru\n      host_memory_budget: 3GiB\n      disk_read: mmap\n"));
  const auto& e = config.stages.at(0).engine;
  EXPECT_EQ(e.expert_eviction, "lru");
  EXPECT_EQ(e.host_memory_budget, 3ull << 30);
  EXPECT_EQ(e.disk_read, "mmap");
  const StageEngineArgs defaults;
  EXPECT_EQ(defaults.expert_eviction, "layer");
  EXPECT_EQ(defaults.host_memory_budget, 0u);
  EXPECT_EQ(defaults.disk_read, "pread");

  std::string yaml = one_stage("      expert_eviction: fifo\n");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "fifo"), "unknown value 'fifo'"));
  yaml = one_stage("      disk_read: o_direct\n");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "o_direct"), "unknown value 'o_direct'"));
  yaml = one_stage("      host_memory_budget: 3G\n");
  EXPECT_TRUE(IsError(parse_error(yaml), pos_of(yaml, "3G"), "unknown unit 'G'"));

  // --host-memory-budget sets every stage; --stage-overrides one of them.
  config = parse(kThree);
  EngineFlags flags = {engine_flag("host_memory_budget", {"8GiB"})};
  apply_stage_flags(config, flags, R"({"0": {"expert_eviction": "lru", "disk_read": "mmap"}})");
  for (const auto& stage : config.stages) EXPECT_EQ(stage.engine.host_memory_budget, 8ull << 30);
  EXPECT_EQ(config.stages.at(0).engine.expert_eviction, "lru");
  EXPECT_EQ(config.stages.at(0).engine.disk_read, "mmap");
  EXPECT_EQ(config.stages.at(1).engine.expert_eviction, "layer");
  EXPECT_TRUE(
      IsError(error_of([&] { apply_stage_flags(config, {}, R"({"0": {"disk_read": "tape"}})"); }),
              "--stage-overrides", "disk_read"));
  // The expert policy and disk read flags set every stage; a bad value names the flag.
  config = parse(kThree);
  flags = {engine_flag("expert_prefetch", {"false"}), engine_flag("expert_miss_policy", {"host"}),
           engine_flag("expert_eviction", {"lru"}), engine_flag("disk_read", {"mmap"})};
  apply_stage_flags(config, flags, R"({"1": {"expert_miss_policy": "auto"}})");
  for (const auto& stage : config.stages) {
    EXPECT_FALSE(stage.engine.expert_prefetch);
    EXPECT_EQ(stage.engine.expert_eviction, "lru");
    EXPECT_EQ(stage.engine.disk_read, "mmap");
  }
  EXPECT_EQ(config.stages.at(0).engine.expert_miss_policy, "host");
  EXPECT_EQ(config.stages.at(1).engine.expert_miss_policy, "auto");  // the override wins
  flags = {engine_flag("expert_eviction", {"fifo"})};
  EXPECT_TRUE(IsError(error_of([&] { apply_stage_flags(config, flags, ""); }), "--expert-eviction",
                      "fifo"));
  flags = {engine_flag("disk_read", {"tape"})};
  EXPECT_TRUE(
      IsError(error_of([&] { apply_stage_flags(config, flags, ""); }), "--disk-read", "tape"));
}

}  // namespace
}  // namespace omni::config
