// The built vllm-omni run as a process: --help, bad command lines (exit 2, one line on stderr,
// nothing on stdout) and runtime errors (exit 1, one "vllm-omni: error: ..." line).
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <ostream>
#include <string>
#include <vector>

#include "process.h"

namespace omni::cli {
namespace {

using process::count_lines;
using process::ProcessResult;

const std::string kFixture = std::string(OMNI_FIXTURES_DIR) + "/qwen3_omni_tiny";

ProcessResult vllm_omni(std::vector<std::string> args) {
  args.insert(args.begin(), OMNI_VLLM_OMNI);
  return process::run_process(args);
}

#define EXPECT_CONTAINS(text, part)                          \
  EXPECT_NE(std::string(text).find(part), std::string::npos) \
      << "expected to find \"" << (part) << "\" in \"" << (text) << "\""

TEST(VllmOmniProcess, GenerateHelpListsEveryOptionWithItsDefault) {
  const auto r = vllm_omni({"generate", "--help"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.err, "");
  for (const char* flag : {"--model",
                           "--prompt",
                           "--audio",
                           "--image",
                           "--system",
                           "--speaker",
                           "--modalities",
                           "--max-tokens",
                           "--max-audio-frames",
                           "--greedy",
                           "--seed",
                           "--temperature",
                           "--top-p",
                           "--top-k",
                           "--repetition-penalty",
                           "--talker-temperature",
                           "--talker-top-k",
                           "--talker-top-p",
                           "--talker-repetition-penalty",
                           "--output-wav",
                           "--wav-format",
                           "--stream-first-chunk",
                           "--stream-chunk",
                           "--stream-left-context",
                           "--cpu-offload-components",
                           "--cpu-offload-strategy",
                           "--gpu-memory-budget",
                           "--cpu-offload-budget",
                           "--no-cpu-offload-pin-memory,--no-pin-memory",
                           "--cpu-offload-pin-memory",
                           "--cpu-offload-enabled",
                           "--enable-cpu-offload",
                           "--stage-configs-path",
                           "--stage-overrides",
                           "--stage-init-timeout",
                           "--request-timeout",
                           "--auth-token-file",
                           "--tls-ca-file",
                           "--enable-layerwise-offload",
                           "--layerwise-num-gpu-layers",
                           "--device",
                           "--dtype",
                           "--json"}) {
    // The name, then its type or description (a long name's description starts on the next
    // line).
    const std::string name = std::string("  ") + flag;
    EXPECT_TRUE(r.out.find(name + " ") != std::string::npos ||
                r.out.find(name + "\n") != std::string::npos)
        << "expected to find \"" << name << "\" in \"" << r.out << "\"";
  }
  // Defaults, from the runner's headers (CLI11 prints them as =value).
  for (const char* shown : {"--max-tokens N=2048",
                            "--max-audio-frames N=4096",
                            "--temperature X=0.4",
                            "--top-p X=0.9",
                            "--top-k N=1",
                            "--repetition-penalty X=1.05",
                            "--talker-temperature X=0.9",
                            "--talker-top-k N=50",
                            "--talker-top-p X=1",
                            "--talker-repetition-penalty X=1.05",
                            "--wav-format pcm16|f32=pcm16",
                            "--stream-first-chunk N=4",
                            "--stream-chunk N=25",
                            "--stream-left-context N=25",
                            "--modalities text|audio|text,audio=text,audio",
                            "--cpu-offload-strategy alternating|sequential=alternating",
                            "--gpu-memory-budget BYTES=0",
                            "--stage-init-timeout SECONDS=600",
                            "--layerwise-num-gpu-layers N=1",
                            "--device auto|cpu|cuda=auto",
                            "--dtype auto|float32|bfloat16|float16=auto"}) {
    EXPECT_CONTAINS(r.out, shown);
  }
}

TEST(VllmOmniProcess, TopLevelHelpListsTheSubcommands) {
  const auto r = vllm_omni({"--help"});
  EXPECT_EQ(r.status, 0);
  EXPECT_CONTAINS(r.out, "generate");
}

struct BadCommandLine {
  std::vector<std::string> args;
  std::string message;  // part of the one line on stderr
};

// The arguments, as the test's name in ctest (the default would dump the struct's bytes).
void PrintTo(const BadCommandLine& c, std::ostream* os) {
  if (c.args.empty()) *os << "(no arguments)";
  for (size_t i = 0; i < c.args.size(); ++i) *os << (i ? " " : "") << c.args[i];
}

class VllmOmniBadCommandLine : public ::testing::TestWithParam<BadCommandLine> {};

TEST_P(VllmOmniBadCommandLine, ExitsTwoWithOneLineSayingWhy) {
  const auto r = vllm_omni(GetParam().args);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(count_lines(r.err), 1u) << r.err;
  EXPECT_EQ(r.err.rfind("vllm-omni: error: ", 0), 0u) << r.err;
  EXPECT_CONTAINS(r.err, GetParam().message);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, VllmOmniBadCommandLine,
    ::testing::Values(
        BadCommandLine{{}, "a subcommand is required"},
        BadCommandLine{{"chat"}, "unknown subcommand 'chat'"},
        BadCommandLine{{"generate", "--model", "m", "--prompt", "p", "--bogus"}, "--bogus"},
        BadCommandLine{{"generate", "--prompt", "p"},
                       "--model or --stage-configs-path is required"},
        BadCommandLine{{"generate", "--model", "m", "--prompt", "p", "--max-tokens", "2.5"},
                       "--max-tokens: expected an integer >= 1, got '2.5'"},
        BadCommandLine{{"generate", "--model", "m", "--prompt", "p", "--wav-format", "mp3"},
                       "--wav-format: expected one of pcm16, f32; got 'mp3'"},
        BadCommandLine{{"generate", "--model", "m", "--prompt", "p", "--modalities", "video"},
                       "--modalities: expected one of text, audio; got 'video'"}));

TEST(VllmOmniProcess, AMissingModelDirectoryExitsOneNamingIt) {
  const auto r = vllm_omni({"generate", "--model", "/nonexistent", "--prompt", "hi"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "vllm-omni: error: model directory '/nonexistent' does not exist\n");
}

TEST(VllmOmniProcess, AMissingInputFileExitsOneBeforeLoading) {
  const auto r = vllm_omni(
      {"generate", "--model", kFixture, "--prompt", "hi", "--audio", "/nonexistent/a.wav"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "vllm-omni: error: audio file '/nonexistent/a.wav' does not exist\n");
}

TEST(VllmOmniProcess, AnOutputWavInAMissingFolderExitsOneBeforeLoading) {
  const auto r = vllm_omni(
      {"generate", "--model", kFixture, "--prompt", "hi", "--output-wav", "/nonexistent/o.wav"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(count_lines(r.err), 1u) << r.err;
  EXPECT_CONTAINS(r.err, "folder '/nonexistent' does not exist");
}

// The runner refuses the request before generating; its message lists the known speakers.
TEST(VllmOmniProcess, AnUnknownSpeakerExitsOneListingTheKnownOnes) {
  const auto r = vllm_omni({"generate", "--model", kFixture, "--prompt", "hi", "--speaker",
                            "nobody", "--max-tokens", "2", "--json"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "");
  // stderr: the runner's load log, then exactly one error line, the last.
  const std::string last = r.err.substr(r.err.rfind("vllm-omni: "));
  EXPECT_EQ(count_lines(last), 1u) << r.err;
  EXPECT_EQ(last.rfind("vllm-omni: error: ", 0), 0u) << r.err;
  EXPECT_CONTAINS(last, "nobody");
  for (const char* name : {"aiden", "chelsie", "ethan"}) EXPECT_CONTAINS(last, name);
}

// --request-timeout holds with --model as with a stage YAML: a request that runs past it stops
// and fails with one line naming the part at work (a long answer takes the tiny model seconds).
TEST(VllmOmniProcess, ARequestPastItsTimeoutStopsAndFailsNamingThePartAtWork) {
  const auto start = std::chrono::steady_clock::now();
  const auto r =
      vllm_omni({"generate", "--model", kFixture, "--prompt", "tell me a long story",
                 "--max-tokens", "2048", "--max-audio-frames", "4096", "--request-timeout", "0.2"});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.status, 1) << r.err;
  const std::string last = r.err.substr(r.err.rfind("vllm-omni: "));
  EXPECT_EQ(count_lines(last), 1u) << r.err;
  EXPECT_CONTAINS(last, "vllm-omni: error: the request ran past --request-timeout (0.2 s) while");
  EXPECT_LT(seconds, 30.0);
}

// A checkpoint whose code2wav has 8 quantizers for the talker's 16 code groups: every command
// refuses it at load with the same message (generate and serve with --model, and generate
// through stage workers, whose failing worker's last lines the launcher shows).
TEST(VllmOmniProcess, AMixedCheckpointIsRefusedByEveryCommandWithOneMessage) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("omni_mixed_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f :
       {"config.json", "model.safetensors", "tokenizer.json", "preprocessor_config.json"}) {
    fs::copy_file(fs::path(kFixture) / f, dir / f);
  }
  {
    std::ifstream in(dir / "config.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto at = text.find("\"num_quantizers\": 16");
    ASSERT_NE(at, std::string::npos);
    text.replace(at, 20, "\"num_quantizers\": 8");
    std::ofstream(dir / "config.json", std::ios::trunc) << text;
  }
  const std::string message =
      "code2wav_config.num_quantizers 8 differs from talker_config.num_code_groups 16";
  const auto generate = vllm_omni({"generate", "--model", dir.string(), "--prompt", "hi"});
  EXPECT_EQ(generate.status, 1) << generate.err;
  EXPECT_CONTAINS(generate.err, message);
  if (vllm_omni({"serve", "--help"}).status == 0) {  // a build with the server parts
    const auto serve = vllm_omni({"serve", "--model", dir.string(), "--port", "0"});
    EXPECT_EQ(serve.status, 1) << serve.err;
    EXPECT_CONTAINS(serve.err, message);
    std::string yaml = "stage_args:\n";
    const char* stages[] = {"thinker", "talker", "code2wav"};
    for (int id = 0; id < 3; ++id) {
      yaml += "  - stage_id: " + std::to_string(id) + "\n    runtime: {devices: cpu}\n" +
              "    engine_args: {model_stage: " + stages[id] + ", model: " + dir.string() +
              "}\n    engine_input_source: [" + (id == 0 ? "" : std::to_string(id - 1)) + "]\n" +
              (id == 0 ? "    final_output: true\n    final_output_type: text\n" : "") +
              (id == 2 ? "    final_output: true\n    final_output_type: audio\n" : "");
    }
    std::ofstream(dir / "stages.yaml") << yaml;
    const auto workers = vllm_omni(
        {"generate", "--stage-configs-path", (dir / "stages.yaml").string(), "--prompt", "hi"});
    EXPECT_EQ(workers.status, 1) << workers.err;
    EXPECT_CONTAINS(workers.err, message);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace omni::cli
