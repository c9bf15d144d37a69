// The stage pipeline with real worker processes on loopback (the tiny Qwen3-Omni checkpoint of
// stage_configs/qwen3_omni_tiny.yaml):
//   - `vllm-omni generate --stage-configs-path` writes the same text, codes and WAV bytes as the
//     in-process `vllm-omni generate`, with and without --cpu-offload-components thinker,talker;
//   - bad configs and flags exit 2 with a message naming the file:line:col or the flag;
//   - a worker killed mid-request fails that request naming the stage; it is restarted and the
//     next request succeeds; a failing stage answers with an error, the others keep serving;
//   - 32 concurrent requests each equal their own single-request output;
//   - a worker with a token refuses a client without it and keeps serving; the workers a
//     launcher starts get a token of their own (in their environment, not their command line)
//     and refuse a local process without it;
//   - an upstream packet that never ends fails its request at the worker's limit without the
//     worker's memory growing past it;
//   - expert offload from --cpu-offload-experts / --expert-cache-budget and from the YAML keys
//     (cpu_offload_experts, expert_cache_budget, expert_prefetch, expert_miss_policy,
//     expert_eviction) reaches the thinker, changes nothing, and the thinker's stats report the
//     expert cache; so does the disk tier (--host-memory-budget, host_memory_budget, disk_read).
#include <ATen/ATen.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "cpu_offload/check.h"
#include "process.h"
#include "stage.grpc.pb.h"
#include "worker/config/stage_overrides.h"
#include "worker/config/stage_yaml.h"
#include "worker/process/stage_launcher.h"
#include "worker/qwen3_omni/stage_params.h"
#include "worker/rpc/auth.h"
#include "worker/rpc/stage_client.h"

#include "tiny_request.h"

namespace omni::pipeline {
namespace {

using testing::omni;

namespace fs = std::filesystem;
using Json = nlohmann::json;

const std::string kSource = OMNI_SOURCE_DIR;
const std::string kTinyYaml = kSource + "/stage_configs/qwen3_omni_tiny.yaml";
const std::string kFixture = kSource + "/tests/fixtures/qwen3_omni_tiny";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

fs::path temp_dir() {
  auto dir = fs::temp_directory_path() /
             ("omni-workers-" + std::to_string(::getpid()) + "-" +
              std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  fs::create_directories(dir);
  return dir;
}

process::ProcessResult vllm_omni(std::vector<std::string> args) {
  args.insert(args.begin(), OMNI_VLLM_OMNI);
  return process::run_process(args);
}

// One greedy answer with speech, from `source` ({"--model", dir} or {"--stage-configs-path", f}).
struct Answer {
  Json json;
  std::string wav;
  std::string log;  // stderr
};

Answer answer(const std::vector<std::string>& source, const std::vector<std::string>& extra = {}) {
  const auto wav = temp_dir() / "answer.wav";
  std::vector<std::string> args = {"generate",
                                   "--prompt",
                                   "Describe the sound and the picture.",
                                   "--audio",
                                   kFixture + "/audio.wav",
                                   "--image",
                                   kFixture + "/image.png",
                                   "--greedy",
                                   "--max-tokens",
                                   "12",
                                   "--max-audio-frames",
                                   "10",
                                   "--output-wav",
                                   wav.string(),
                                   "--json"};
  args.insert(args.end(), source.begin(), source.end());
  args.insert(args.end(), extra.begin(), extra.end());
  const auto r = vllm_omni(args);
  EXPECT_EQ(r.status, 0) << r.err;
  Answer a;
  a.json = Json::parse(r.out);
  a.wav = read_file(wav.string());
  a.log = r.err;
  fs::remove_all(wav.parent_path());
  return a;
}

void expect_same(const Answer& got, const Answer& want) {
  EXPECT_EQ(got.json["text"], want.json["text"]);
  EXPECT_EQ(got.json["token_ids"], want.json["token_ids"]);
  EXPECT_EQ(got.json["codes"], want.json["codes"]);
  EXPECT_EQ(got.json["finish_reason"], want.json["finish_reason"]);
  EXPECT_EQ(got.json["audio_finish_reason"], want.json["audio_finish_reason"]);
  EXPECT_EQ(got.json["speaker"], want.json["speaker"]);
  EXPECT_FALSE(want.wav.empty());
  EXPECT_TRUE(got.wav == want.wav) << "the WAV files differ";
}

const Answer& in_process() {
  static const Answer a = answer({"--model", kFixture});
  return a;
}

TEST(PipelineWorkers, GenerateThroughWorkersEqualsInProcess) {
  const auto got = answer({"--stage-configs-path", kTinyYaml});
  expect_same(got, in_process());
  // Three stages reported their offload stats (one worker each).
  EXPECT_EQ(got.json["offload"].size(), 3u) << got.json["offload"].dump();
}

// The shipped YAML with a fourth stage of an existing kind on a second branch: a second
// code2wav worker reads the talker too. It runs through the same orchestrator, and the answer
// is the in-process one.
TEST(PipelineWorkers, AFourthStageOnASecondBranchRuns) {
  std::string yaml = read_file(kTinyYaml);
  for (size_t at; (at = yaml.find("../tests/fixtures/qwen3_omni_tiny")) != std::string::npos;) {
    yaml.replace(at, std::string("../tests/fixtures/qwen3_omni_tiny").size(), kFixture);
  }
  yaml +=
      "\n  - stage_id: 3\n    runtime: {devices: cpu}\n    engine_args: {model_stage: code2wav, "
      "model: " +
      kFixture +
      ", dtype: float32}\n    engine_input_source: [1]\n"
      "    final_output: true\n    final_output_type: audio\n";
  const fs::path dir = temp_dir();
  const std::string path = (dir / "four_stages.yaml").string();
  std::ofstream(path) << yaml;
  const auto got = answer({"--stage-configs-path", path});
  expect_same(got, in_process());
  EXPECT_TRUE(got.json["offload"].contains("stage 3 (code2wav)")) << got.json["offload"].dump();
  fs::remove_all(dir);
}

TEST(PipelineWorkers, ThinkerTalkerOffloadChangesNothing) {
  const auto got =
      answer({"--stage-configs-path", kTinyYaml}, {"--cpu-offload-components", "thinker,talker"});
  expect_same(got, in_process());
  const auto in_process_offload =
      answer({"--model", kFixture}, {"--cpu-offload-components", "thinker,talker"});
  expect_same(in_process_offload, in_process());
  // code2wav as a stage that gives its weights back too, and module names inside the stages.
  expect_same(
      answer({"--stage-configs-path", kTinyYaml},
             {"--cpu-offload-components", "talker,code2wav", "--gpu-memory-budget", "3100000"}),
      in_process());
  expect_same(answer({"--stage-configs-path", kTinyYaml},
                     {"--cpu-offload-components", "visual,audio_tower,code_predictor"}),
              in_process());
}

TEST(PipelineWorkers, BadConfigsAndFlagsExit2) {
  const auto dir = temp_dir();
  const auto bad = dir / "bad.yaml";
  std::string yaml = read_file(kTinyYaml);
  yaml.replace(yaml.find("model_stage: talker"), 19, "model_stage: talkr");
  // The relative model paths must still resolve: keep the file next to the fixture's config.
  const auto copy =
      fs::path(kSource) / "stage_configs" / ("bad-" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(copy) << yaml;
  auto r = vllm_omni({"generate", "--stage-configs-path", copy.string(), "--prompt", "hi"});
  fs::remove(copy);
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find(copy.filename().string() + ":"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("talker"), std::string::npos) << r.err;

  r = vllm_omni({"generate", "--stage-configs-path", kTinyYaml, "--prompt", "hi",
                 "--stage-overrides", "{\"7\": {\"dtype\": \"float32\"}}"});
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("--stage-overrides"), std::string::npos) << r.err;

  r = vllm_omni(
      {"generate", "--stage-configs-path", kTinyYaml, "--model", kFixture, "--prompt", "hi"});
  EXPECT_EQ(r.status, 2) << r.err;

  r = vllm_omni(
      {"worker", "--stage-configs-path", kTinyYaml, "--stage-id", "1", "--listen", "0.0.0.0:0"});
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("loopback"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

// The pids of `parent`'s children (Linux: /proc/PID/task/TID/children).
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> pids;
  std::error_code ec;
  for (const auto& task : fs::directory_iterator("/proc/" + std::to_string(parent) + "/task", ec)) {
    std::ifstream in(task.path() / "children");
    for (pid_t pid; in >> pid;) pids.push_back(pid);
  }
  return pids;
}

// The value of `name` in process `pid`'s environment (/proc/PID/environ), "" when it has none.
std::string environment_value(pid_t pid, const std::string& name) {
  const std::string text = read_file("/proc/" + std::to_string(pid) + "/environ");
  const std::string prefix = name + "=";
  for (size_t pos = 0, end; pos < text.size(); pos = end + 1) {
    end = text.find('\0', pos);
    if (end == std::string::npos) end = text.size();
    if (text.compare(pos, prefix.size(), prefix) == 0) {
      return text.substr(pos + prefix.size(), end - pos - prefix.size());
    }
  }
  return "";
}

TEST(PipelineWorkers, SigtermStopsTheWorkersItStarted) {
  // A long answer, so that the signal arrives while the workers are up.
  std::vector<std::string> args = {OMNI_VLLM_OMNI, "generate", "--stage-configs-path",
                                   kTinyYaml,      "--prompt", "Tell a long story.",
                                   "--max-tokens", "2048",     "--max-audio-frames",
                                   "4096",         "--json"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  ASSERT_EQ(::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  std::vector<pid_t> workers;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (workers.size() < 3 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    workers = children_of(pid);
  }
  ASSERT_EQ(workers.size(), 3u) << "the three workers did not start";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::kill(pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  // 143 = 128 + SIGTERM, unless the answer happened to finish first (0).
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_TRUE(WEXITSTATUS(status) == 143 || WEXITSTATUS(status) == 0) << WEXITSTATUS(status);
  // The workers are gone: no process left behind.
  for (const pid_t w : workers) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (::kill(w, 0) == 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_NE(::kill(w, 0), 0) << "worker " << w << " outlived the orchestrator";
  }
}

// ---- the orchestrator in this process, workers as processes

LauncherOptions launcher_options() {
  LauncherOptions o;
  o.config = config::load_pipeline_config(kTinyYaml);
  o.worker_executable = OMNI_VLLM_OMNI;
  o.init_timeout = std::chrono::seconds(120);
  return o;
}

Request request(const std::string& text) {
  Request r;
  r.chat.text = text;
  omni(r).sampling.set_greedy(true);
  omni(r).sampling.thinker.max_new_tokens = 10;
  omni(r).max_audio_frames = 8;
  return r;
}

TEST(PipelineWorkers, AKilledWorkerFailsItsRequestAndIsRestarted) {
  StageLauncher launcher(launcher_options());
  auto& pipeline = launcher.pipeline();
  const auto before = pipeline.generate(request("Count to three."));
  ASSERT_GT(before.audio.codes.size(1), 0);
  auto* supervisor = launcher.supervisor();
  ASSERT_NE(supervisor, nullptr);
  const int talker = launcher.supervisor_index(1);
  ASSERT_GE(talker, 0);
  const auto generation = supervisor->generation(talker);
  const std::string token = environment_value(supervisor->pid(talker), rpc::kWorkerTokenEnv);
  EXPECT_FALSE(token.empty());

  // SIGKILL the talker's worker at its first frame: the request fails naming it, in time.
  PipelineCallbacks cb;
  bool killed = false;
  cb.on_frame = [&](const std::vector<int64_t>&) {
    if (!killed) ::kill(supervisor->pid(talker), SIGKILL);
    killed = true;
    return true;
  };
  const auto start = std::chrono::steady_clock::now();
  try {
    pipeline.generate(request("Count to three."), cb, start + std::chrono::seconds(60));
    FAIL() << "the request survived its stage's death";
  } catch (const StageError& e) {
    EXPECT_EQ(e.stage(), "stage 1 (talker)") << e.what();
    EXPECT_EQ(e.code(), StageError::Code::kUnavailable) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  supervisor->wait_ready(talker, std::chrono::seconds(120), generation + 1);
  EXPECT_GT(supervisor->generation(talker), generation);
  // The restarted worker has the token the launcher's clients send.
  EXPECT_EQ(environment_value(supervisor->pid(talker), rpc::kWorkerTokenEnv), token);
  const auto after = pipeline.generate(request("Count to three."));
  EXPECT_EQ(after.tokens, before.tokens);
  EXPECT_TRUE(at::equal(after.audio.codes, before.audio.codes));
  EXPECT_TRUE(at::equal(after.audio.waveform, before.audio.waveform));
}

TEST(PipelineWorkers, ABadRequestFailsAloneAndTheWorkersKeepServing) {
  StageLauncher launcher(launcher_options());
  auto r = request("Hello.");
  r.voice = "nobody";
  try {
    launcher.pipeline().generate(r);
    FAIL() << "an unknown speaker was accepted";
  } catch (const StageError& e) {
    EXPECT_EQ(e.stage(), "stage 1 (talker)") << e.what();
    EXPECT_EQ(e.code(), StageError::Code::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("nobody"), std::string::npos) << e.what();
  }
  EXPECT_GT(launcher.pipeline().generate(request("Hello.")).audio.codes.size(1), 0);
}

TEST(PipelineWorkers, ConcurrentRequestsEachGetTheirOwnAnswer) {
  StageLauncher launcher(launcher_options());
  auto& pipeline = launcher.pipeline();
  constexpr int kRequests = 32;
  std::vector<std::string> prompts;
  for (int i = 0; i < kRequests; ++i) {
    prompts.push_back("Request " + std::to_string(i) + ": say something about " +
                      std::to_string(i * 7 % 13) + ".");
  }
  // Alone first, one after the other.
  std::vector<PipelineResult> alone;
  for (const auto& p : prompts) alone.push_back(pipeline.generate(request(p)));
  // Then all at once.
  std::vector<std::future<PipelineResult>> futures;
  for (const auto& p : prompts) {
    futures.push_back(
        std::async(std::launch::async, [&, p] { return pipeline.generate(request(p)); }));
  }
  int distinct = 0;
  for (int i = 0; i < kRequests; ++i) {
    const auto got = futures[i].get();
    EXPECT_EQ(got.tokens, alone[i].tokens) << "request " << i;
    EXPECT_EQ(got.text, alone[i].text) << "request " << i;
    ASSERT_TRUE(got.audio.codes.defined());
    EXPECT_TRUE(at::equal(got.audio.codes, alone[i].audio.codes)) << "request " << i;
    EXPECT_TRUE(at::equal(got.audio.waveform, alone[i].audio.waveform)) << "request " << i;
    distinct += i > 0 && alone[i].tokens != alone[0].tokens;
  }
  EXPECT_GT(distinct, 0) << "the prompts should not all give the same answer";
}

// The tiny checkpoint's thinker: 16 experts (2 MoE layers x 8) of 24576 bytes.
TEST(PipelineWorkers, ExpertOffloadFromFlagsAndYamlChangesNothing) {
  const uint64_t expert = 24576;
  const std::vector<std::string> flags = {"--cpu-offload-experts", "--expert-cache-budget", "25%"};
  // In process, then through workers (the flags become every stage's keys).
  expect_same(answer({"--model", kFixture}, flags), in_process());
  const auto got = answer({"--stage-configs-path", kTinyYaml}, flags);
  expect_same(got, in_process());
  // A device budget that holds the stages only with the experts in a cache: the ledger counts
  // the thinker as its non-expert weights plus the cache (2,013,312 - 16 x 24576 + 4 x 24576),
  // not all its weights (the three stages' 3,800,100 bytes would exceed 3,600,000).
  {
    const auto budgeted = answer({"--stage-configs-path", kTinyYaml},
                                 {"--cpu-offload-experts", "--expert-cache-budget", "25%",
                                  "--gpu-memory-budget", "3600000"});
    expect_same(budgeted, in_process());
    const auto& ledger = budgeted.json["offload"]["device_ledger"]["local/cpu"];
    ASSERT_TRUE(ledger.is_object()) << budgeted.json["offload"].dump();
    EXPECT_EQ(ledger["stages"]["stage 0 (thinker)"]["bytes"], 2013312 - 12 * expert)
        << ledger.dump();
    EXPECT_EQ(ledger["held"], 3800100 - 12 * expert) << ledger.dump();
  }
  // --host-memory-budget below the experts' bytes: in process and through workers, the experts
  // are read from the checkpoint (the disk tier), and nothing changes.
  {
    const std::vector<std::string> disk = {"--cpu-offload-experts", "--expert-cache-budget",
                                           "49152", "--host-memory-budget", "98304"};
    setenv("OMNI_LOG_LEVEL", "info", 1);  // the tier's one line says what it holds
    const auto local = answer({"--model", kFixture}, disk);
    unsetenv("OMNI_LOG_LEVEL");
    expect_same(local, in_process());
    EXPECT_NE(local.log.find("expert disk tier: 16 units read from the checkpoint on demand, 4 "
                             "host entries"),
              std::string::npos)
        << local.log;
    // In process, --json's offload object carries the cache and its tier too.
    const auto& ld = local.json["offload"]["stage 0 (thinker)"]["expert_cache"]["disk"];
    ASSERT_TRUE(ld.is_object()) << local.json["offload"].dump();
    EXPECT_EQ(ld["entries"], 4);
    EXPECT_EQ(ld["acquires"], local.json["offload"]["stage 0 (thinker)"]["expert_cache"]["loads"]);
    const auto workers = answer({"--stage-configs-path", kTinyYaml}, disk);
    expect_same(workers, in_process());
    const auto& d = workers.json["offload"]["stage 0 (thinker)"]["expert_cache"]["disk"];
    ASSERT_TRUE(d.is_object()) << workers.json["offload"].dump();
    EXPECT_EQ(d["entries"], 4);
    EXPECT_GT(d["reads"].get<uint64_t>(), 0u);
  }
  // The flags for the keys with defaults: a miss computed where the expert lies, no prefetch;
  // then mmap reads of the checkpoint with LRU eviction. In process and through workers.
  {
    const std::vector<std::string> host = {
        "--cpu-offload-experts", "--expert-cache-budget", "50%", "--expert-miss-policy", "host",
        "--no-expert-prefetch"};
    const std::vector<std::string> mmap = {"--cpu-offload-experts",
                                           "--expert-cache-budget",
                                           "49152",
                                           "--expert-eviction",
                                           "lru",
                                           "--host-memory-budget",
                                           "98304",
                                           "--disk-read",
                                           "mmap"};
    for (const auto& source : std::vector<std::vector<std::string>>{
             {"--model", kFixture}, {"--stage-configs-path", kTinyYaml}}) {
      SCOPED_TRACE(source.front());
      const auto cache = [&](const Answer& a) -> const Json& {
        return a.json["offload"]["stage 0 (thinker)"]["expert_cache"];
      };
      const auto h = answer(source, host);
      expect_same(h, in_process());
      const auto& e = cache(h);
      ASSERT_TRUE(e.is_object()) << h.json["offload"].dump();
      EXPECT_EQ(e["slots"], 0);  // the host policy copies nothing
      EXPECT_GT(e["misses"].get<uint64_t>(), 0u);
      EXPECT_EQ(e["host_computed"], e["misses"]);
      EXPECT_EQ(e["prefetched"], 0);
      EXPECT_EQ(e["bytes_h2d"], 0);
      const auto m = answer(source, mmap);
      expect_same(m, in_process());
      const auto& d = cache(m)["disk"];
      ASSERT_TRUE(d.is_object()) << m.json["offload"].dump();
      EXPECT_EQ(d["entries"], 0);  // mmap: the page cache is the cache
      EXPECT_EQ(d["acquires"], cache(m)["loads"]);
    }
  }
  {
    const auto& e = got.json["offload"]["stage 0 (thinker)"]["expert_cache"];
    ASSERT_TRUE(e.is_object()) << got.json["offload"].dump();
    EXPECT_EQ(e["experts"], 16);
    EXPECT_EQ(e["budget_bytes"], 4 * expert);
    EXPECT_EQ(e["slots"], 4);
    EXPECT_GT(e["uses"].get<uint64_t>(), 0u);
    EXPECT_GT(e["prefetched"].get<uint64_t>(), 0u);  // expert_prefetch defaults to true
    EXPECT_EQ(e["host_computed"], 0);                // expert_miss_policy defaults to fetch
    EXPECT_GT(e["tokens"].get<uint64_t>(), 0u);
    EXPECT_TRUE(e.contains("bytes_h2d_per_token"));
    EXPECT_TRUE(e.contains("stall_ms"));
    // Only the thinker has experts.
    EXPECT_FALSE(got.json["offload"]["stage 1 (talker)"].contains("expert_cache"));
  }

  // The YAML keys on the thinker stage (a copy of the tiny config with an absolute model path).
  struct Keys {
    std::string yaml;
    std::function<void(const Json&)> check;
  };
  const std::vector<Keys> variants = {
      {"      cpu_offload_experts: true\n      expert_cache_budget: 50%\n"
       "      expert_miss_policy: host\n",
       [&](const Json& e) {
         EXPECT_EQ(e["budget_bytes"], 8 * expert);
         EXPECT_EQ(e["slots"], 0);  // the host policy copies nothing
         EXPECT_GT(e["misses"].get<uint64_t>(), 0u);
         EXPECT_EQ(e["host_computed"], e["misses"]);
         EXPECT_EQ(e["bytes_h2d"], 0);
       }},
      {"      cpu_offload_experts: true\n      expert_cache_budget: 393216\n"
       "      expert_prefetch: false\n      expert_miss_policy: fetch\n",
       [&](const Json& e) {
         EXPECT_EQ(e["budget_bytes"], 16 * expert);
         EXPECT_EQ(e["slots"], 16);
         EXPECT_EQ(e["prefetched"], 0);
         EXPECT_EQ(e["host_computed"], 0);
         EXPECT_GT(e["loads"].get<uint64_t>(), 0u);
         EXPECT_LE(e["loads"].get<uint64_t>(), 16u);  // every expert fits: one load each
       }},
      // The disk tier: 4 experts' bytes of host memory for 16 experts, so they stay in the
      // checkpoint and are read into 4 host entries when fetched; LRU in the device cache.
      {"      cpu_offload_experts: true\n      expert_cache_budget: 49152\n"
       "      host_memory_budget: 98304\n      expert_eviction: lru\n",
       [&](const Json& e) {
         EXPECT_EQ(e["slots"], 2);
         const auto& d = e["disk"];
         ASSERT_TRUE(d.is_object()) << e.dump();
         EXPECT_EQ(d["entries"], 4);
         EXPECT_EQ(d["entry_bytes"], expert);
         EXPECT_GT(d["reads"].get<uint64_t>(), 0u);
         // Every expert copied to the device was acquired from the tier.
         EXPECT_EQ(d["acquires"], e["loads"]);
       }},
      {"      cpu_offload_experts: true\n      expert_cache_budget: 49152\n"
       "      host_memory_budget: 98304\n      disk_read: mmap\n",
       [&](const Json& e) {
         const auto& d = e["disk"];
         ASSERT_TRUE(d.is_object()) << e.dump();
         EXPECT_EQ(d["entries"], 0);  // the page cache is the cache
         EXPECT_EQ(d["acquires"], e["loads"]);
       }},
  };
  const std::string tiny = read_file(kTinyYaml);
  for (const auto& v : variants) {
    SCOPED_TRACE(v.yaml);
    std::string yaml = tiny;
    const std::string rel = "../tests/fixtures/qwen3_omni_tiny";
    for (size_t at = yaml.find(rel); at != std::string::npos; at = yaml.find(rel, at)) {
      yaml.replace(at, rel.size(), kFixture);
      at += kFixture.size();
    }
    const std::string anchor = "      model_stage: thinker\n";
    ASSERT_NE(yaml.find(anchor), std::string::npos);
    yaml.insert(yaml.find(anchor) + anchor.size(), v.yaml);
    const auto dir = temp_dir();
    const auto path = (dir / "experts.yaml").string();
    std::ofstream(path) << yaml;
    const auto a = answer({"--stage-configs-path", path});
    fs::remove_all(dir);
    expect_same(a, in_process());
    const auto& e = a.json["offload"]["stage 0 (thinker)"]["expert_cache"];
    ASSERT_TRUE(e.is_object()) << a.json["offload"].dump();
    EXPECT_EQ(e["uses"].get<uint64_t>(), e["hits"].get<uint64_t>() + e["misses"].get<uint64_t>());
    v.check(e);
  }
}

// The tiny checkpoint's weight bytes per stage (float32): thinker 2,013,312, talker 1,005,056,
// code2wav 781,732. A budget of 3,000,000 holds code2wav (resident) with the thinker or the
// talker, not both: they take turns, and the outputs do not change.
TEST(PipelineWorkers, ASharedDeviceBudgetMakesTheThinkerAndTalkerTakeTurns) {
  StageLauncher plain(launcher_options());
  const auto want1 = plain.pipeline().generate(request("Count to three."));
  const auto want2 = plain.pipeline().generate(request("Name a colour."));

  auto options = launcher_options();
  config::EngineFlags flags = {config::engine_flag("cpu_offload_components", {"thinker", "talker"}),
                               config::engine_flag("gpu_memory_budget", {"3000000"})};
  config::apply_stage_flags(options.config, flags, "");
  StageLauncher shared(options);
  ASSERT_NE(shared.pipeline().device_ledger(), nullptr);
  for (int round = 0; round < 2; ++round) {
    const auto got1 = shared.pipeline().generate(request("Count to three."));
    const auto got2 = shared.pipeline().generate(request("Name a colour."));
    EXPECT_EQ(got1.tokens, want1.tokens);
    EXPECT_TRUE(at::equal(got1.audio.codes, want1.audio.codes));
    EXPECT_TRUE(at::equal(got1.audio.waveform, want1.audio.waveform));
    EXPECT_EQ(got2.tokens, want2.tokens);
    EXPECT_TRUE(at::equal(got2.audio.codes, want2.audio.codes));
  }
  const auto stats = Json::parse(shared.stats_json());
  const auto& device = stats["device_ledger"]["local/cpu"];
  EXPECT_EQ(device["budget"], 3000000);
  EXPECT_LE(device["held"].get<uint64_t>(), 3000000u);
  const auto& stages = device["stages"];
  // Each request moves the thinker out for the talker and back: 4 requests, 4 turns each way
  // (the first thinker load needs no eviction).
  EXPECT_GE(stages["stage 0 (thinker)"]["evictions"].get<int>(), 3) << device.dump();
  EXPECT_GE(stages["stage 1 (talker)"]["evictions"].get<int>(), 3) << device.dump();
  EXPECT_EQ(stages["stage 2 (code2wav)"]["evictions"], 0);
  // A text prompt loads the thinker's decoder and lm_head, not its encoders: an eviction gives
  // back those, less than the whole stage.
  const auto released = stages["stage 0 (thinker)"]["bytes_released"].get<uint64_t>();
  EXPECT_GT(released, 0u);
  EXPECT_LT(released, stages["stage 0 (thinker)"]["evictions"].get<uint64_t>() * 2013312u);
  // The workers' own stats: the thinker's two parts were loaded once per turn.
  EXPECT_GE(stats["stage 0 (thinker)"]["loads"].get<int>(), 2 * 4) << stats.dump();

  // All three stages give their weights back: a budget for the largest alone runs them one
  // after the other, each evicting the one before.
  auto one_at_a_time = launcher_options();
  flags = {config::engine_flag("cpu_offload_components", {"thinker", "talker", "code2wav"}),
           config::engine_flag("gpu_memory_budget", {"2100000"})};
  config::apply_stage_flags(one_at_a_time.config, flags, "");
  {
    StageLauncher turns(one_at_a_time);
    for (int round = 0; round < 2; ++round) {
      const auto got = turns.pipeline().generate(request("Count to three."));
      EXPECT_EQ(got.tokens, want1.tokens);
      EXPECT_TRUE(at::equal(got.audio.codes, want1.audio.codes));
      EXPECT_TRUE(at::equal(got.audio.waveform, want1.audio.waveform));
    }
    const auto ledger = Json::parse(turns.stats_json())["device_ledger"]["local/cpu"];
    EXPECT_GE(ledger["stages"]["stage 2 (code2wav)"]["evictions"].get<int>(), 1) << ledger.dump();
    EXPECT_GE(ledger["evictions"].get<int>(), 4) << ledger.dump();
  }

  // A budget that cannot hold code2wav plus the largest stage that moves is refused up front.
  auto tight = launcher_options();
  flags = {config::engine_flag("cpu_offload_components", {"thinker", "talker"}),
           config::engine_flag("gpu_memory_budget", {"2000000"})};
  config::apply_stage_flags(tight.config, flags, "");
  try {
    StageLauncher refused(tight);
    FAIL() << "a budget below the largest stage was accepted";
  } catch (const omni::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot hold"), std::string::npos) << e.what();
  }
}

TEST(PipelineWorkers, AWorkerWithATokenRefusesOthersAndKeepsServing) {
  const auto dir = temp_dir();
  const auto token_file = dir / "token";
  std::ofstream(token_file) << "s3cret-token\n";
  // A worker started by hand, as on another host, with a token.
  WorkerSpec spec;
  spec.name = "stage 2 (code2wav)";
  spec.argv = {
      OMNI_VLLM_OMNI, "worker",      "--stage-configs-path", kTinyYaml,          "--stage-id", "2",
      "--listen",     "127.0.0.1:0", "--auth-token-file",    token_file.string()};
  spec.log_path = (dir / "worker.log").string();
  WorkerProcess worker(spec);
  const auto address = worker.start();

  rpc::ClientOptions wrong;
  wrong.name = "stage 2 (code2wav)";
  wrong.token = "guess";
  rpc::RemoteStage intruder(address, wrong);
  PacketQueue input;
  input.close();
  CancelToken cancel;
  StageCall call;
  call.params = std::make_shared<const Code2WavParams>();
  EXPECT_THROW(intruder.run(
                   call, input, [](StagePacket&&) {}, cancel),
               StageError);

  // The orchestrator with the right token reaches it through runtime.address.
  auto options = launcher_options();
  for (auto& s : options.config.stages) {
    if (s.stage_id == 2) s.runtime.address = address;
  }
  options.token = "s3cret-token";
  StageLauncher launcher(options);
  const auto got = launcher.pipeline().generate(request("Hello."));
  EXPECT_GT(got.audio.codes.size(1), 0);
  worker.stop();
  const auto log = read_file(spec.log_path);
  EXPECT_NE(log.find("refused"), std::string::npos) << log;
  fs::remove_all(dir);
}

// Every worker a launcher starts refuses a local process that lacks the launch's token: Info,
// Run and Device(release) alike (the last moves nothing); the launcher's own calls pass. The
// token lies in the worker's environment, not on its command line (anyone may read that).
TEST(PipelineWorkers, LaunchedWorkersRefuseACallerWithoutTheirToken) {
  auto options = launcher_options();
  config::EngineFlags flags = {config::engine_flag("cpu_offload_components", {"talker"})};
  config::apply_stage_flags(options.config, flags, "");
  StageLauncher launcher(options);
  auto* supervisor = launcher.supervisor();
  ASSERT_NE(supervisor, nullptr);
  const std::string token = environment_value(supervisor->pid(0), rpc::kWorkerTokenEnv);
  EXPECT_GE(token.size(), 32u) << "at least 128 bits in hex";
  EXPECT_EQ(token.find_first_not_of("0123456789abcdef"), std::string::npos) << token;
  for (size_t i = 0; i < supervisor->size(); ++i) {
    const std::string proc = "/proc/" + std::to_string(supervisor->pid(i));
    EXPECT_EQ(environment_value(supervisor->pid(i), rpc::kWorkerTokenEnv), token) << i;
    const std::string cmdline = read_file(proc + "/cmdline");
    EXPECT_NE(cmdline.find("--stage-id"), std::string::npos) << "the command line was read";
    EXPECT_EQ(cmdline.find(token), std::string::npos) << cmdline;
  }
  // A second launch has a token of its own.
  {
    StageLauncher other(launcher_options());
    EXPECT_NE(environment_value(other.supervisor()->pid(0), rpc::kWorkerTokenEnv), token);
  }

  // The talker after a request holds its weights on its device; the launcher's calls pass.
  ASSERT_GT(launcher.pipeline().generate(request("Hello.")).audio.codes.size(1), 0);
  Stage& own = *launcher.pipeline().stages().at(1).stage;
  const uint64_t held = own.device_bytes();
  ASSERT_GT(held, 0u);
  const auto counters = [&] { return Json::parse(own.stats_json())["worker"]; };
  const Json before = counters();

  const std::string address = supervisor->address(launcher.supervisor_index(1));
  const auto stub = proto::StageService::NewStub(rpc::make_channel(address, {}));
  for (const std::string& sent : {std::string(), std::string("0123456789abcdef")}) {
    SCOPED_TRACE(sent.empty() ? "no token" : "a wrong token");
    const auto context = [&](grpc::ClientContext& c) {
      if (!sent.empty()) c.AddMetadata(rpc::kAuthMetadataKey, rpc::bearer(sent));
      c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    };
    {
      grpc::ClientContext c;
      context(c);
      proto::InfoResponse info;
      EXPECT_EQ(stub->Info(&c, proto::InfoRequest(), &info).error_code(),
                grpc::StatusCode::UNAUTHENTICATED);
    }
    {
      grpc::ClientContext c;
      context(c);
      proto::DeviceRequest release;
      release.set_release(true);
      proto::DeviceResponse moved;
      EXPECT_EQ(stub->Device(&c, release, &moved).error_code(), grpc::StatusCode::UNAUTHENTICATED);
      EXPECT_EQ(moved.moved_bytes(), 0u);
    }
    {
      grpc::ClientContext c;
      context(c);
      auto stream = stub->Run(&c);
      proto::RunRequest header;
      header.mutable_header()->set_params_json(TalkerParams().to_json());
      stream->Write(header);
      stream->WritesDone();
      proto::RunResponse response;
      int responses = 0;
      while (stream->Read(&response)) ++responses;
      EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
      EXPECT_EQ(responses, 0);
    }
  }
  EXPECT_EQ(own.device_bytes(), held) << "a refused Device(release) moved weights";
  const Json after = counters();
  EXPECT_EQ(after["requests_started"], before["requests_started"]) << after.dump();
  EXPECT_EQ(after["requests_refused"].get<int>(), before["requests_refused"].get<int>() + 6)
      << after.dump();
  // With the token the same calls pass: the release moves what the refused one would have.
  {
    grpc::ClientContext c;
    c.AddMetadata(rpc::kAuthMetadataKey, rpc::bearer(token));
    proto::InfoResponse info;
    ASSERT_TRUE(stub->Info(&c, proto::InfoRequest(), &info).ok());
    EXPECT_EQ(info.pid(), supervisor->pid(launcher.supervisor_index(1)));
  }
  EXPECT_GT(own.set_device_released(true), 0u);
  EXPECT_LT(own.device_bytes(), held);
  own.set_device_released(false);
  // Health probes need no secret.
  std::string why;
  EXPECT_TRUE(rpc::wait_healthy(address, {}, std::chrono::seconds(5), &why)) << why;
  EXPECT_TRUE(launcher.healthy(&why)) << why;
  EXPECT_GT(launcher.pipeline().generate(request("Hello.")).audio.codes.size(1), 0);
}

// A process's resident memory at its highest from now on: VmHWM after resetting it
// (/proc/PID/clear_refs, Linux 4.0+), and VmRSS sampled every 2 ms in case the reset is refused.
class PeakMemory {
 public:
  explicit PeakMemory(pid_t pid) : proc_("/proc/" + std::to_string(pid)) {
    std::ofstream(proc_ + "/clear_refs") << "5";
    start_ = kib("VmRSS:");
    // The reset took when the high-water mark is back at the current size.
    hwm_reset_ = kib("VmHWM:") <= start_ + 1024;
    sampler_ = std::thread([this] {
      while (!stop_) {
        peak_ = std::max(peak_.load(), kib("VmRSS:"));
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    });
  }
  ~PeakMemory() { stop(); }
  // Bytes above the resident size at construction.
  uint64_t growth() {
    stop();
    uint64_t peak = std::max(peak_.load(), kib("VmRSS:"));
    if (hwm_reset_) peak = std::max(peak, kib("VmHWM:"));
    return peak > start_ ? (peak - start_) * 1024 : 0;
  }
  uint64_t start_bytes() const { return start_ * 1024; }

 private:
  uint64_t kib(const std::string& field) const {
    std::ifstream in(proc_ + "/status");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(field, 0) == 0) return std::stoull(line.substr(field.size()));
    }
    return 0;
  }
  void stop() {
    stop_ = true;
    if (sampler_.joinable()) sampler_.join();
  }
  const std::string proc_;
  uint64_t start_ = 0;
  bool hwm_reset_ = false;
  std::atomic<uint64_t> peak_{0};
  std::atomic<bool> stop_{false};
  std::thread sampler_;
};

// A hostile client's Run: one upstream packet whose `more` never ends, 1 MiB of token ids per
// message (8 MiB in memory each). The worker, limited by --max-upstream-bytes to 16 MiB, answers
// INVALID_ARGUMENT naming the limit, its memory grows by less than 100 MB over the attack
// (unbounded, 40 messages would take it past 300 MB), and it serves a good request after.
TEST(PipelineWorkers, AnUpstreamPacketThatNeverEndsStopsAtTheWorkersLimit) {
  const auto dir = temp_dir();
  WorkerSpec spec;
  spec.name = "stage 2 (code2wav)";
  spec.argv = {OMNI_VLLM_OMNI, "worker",      "--stage-configs-path", kTinyYaml, "--stage-id", "2",
               "--listen",     "127.0.0.1:0", "--max-upstream-bytes", "16MiB"};
  spec.log_path = (dir / "worker.log").string();
  WorkerProcess worker(spec);
  const std::string address = worker.start();

  PeakMemory memory(worker.pid());
  const auto stub = proto::StageService::NewStub(rpc::make_channel(address, {}));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = stub->Run(&context);
  proto::RunRequest header;
  header.mutable_header()->set_params_json(Code2WavParams().to_json());
  ASSERT_TRUE(stream->Write(header));
  constexpr int kMessages = 40;
  std::atomic<int> sent{0};
  std::thread writer([&] {
    proto::RunRequest message;
    message.mutable_upstream()->set_more(true);
    for (int i = 0; i < (1 << 20); ++i) message.mutable_upstream()->add_token_ids(1);
    while (sent < kMessages && stream->Write(message)) ++sent;
    stream->WritesDone();
  });
  proto::RunResponse response;
  proto::StageError error;
  while (stream->Read(&response)) {
    if (response.has_error()) error = response.error();
  }
  writer.join();
  EXPECT_TRUE(stream->Finish().ok());
  const uint64_t growth = memory.growth();
  EXPECT_EQ(error.code(), proto::StageError::INVALID_ARGUMENT) << error.message();
  EXPECT_NE(error.message().find("token ids"), std::string::npos) << error.message();
  EXPECT_NE(error.message().find("limit of 16777216 bytes"), std::string::npos) << error.message();
  EXPECT_LT(growth, 100000000u) << "from " << memory.start_bytes() << " bytes resident";
  std::cout << "[ figures  ] " << sent << " messages of 1 MiB sent; the worker grew by "
            << growth / 1e6 << " MB from " << memory.start_bytes() / 1e6 << " MB" << std::endl;

  // A good request after it: a few codec frames decode to a waveform.
  rpc::RemoteStage code2wav(address);
  StagePacket frames;
  for (int64_t f = 0; f < 8; ++f) {
    std::vector<int64_t> codes;
    for (int64_t g = 0; g < 16; ++g) codes.push_back((f * 16 + g) % 128);
    frames.frames.push_back(std::move(codes));
  }
  frames.finished = true;
  PacketQueue input;
  input.push(std::move(frames));
  input.close();
  StageCall call;
  call.params = std::make_shared<const Code2WavParams>();
  CancelToken cancel;
  at::Tensor waveform;
  code2wav.run(
      call, input,
      [&](StagePacket&& p) {
        if (p.tensor("waveform").defined()) waveform = p.tensor("waveform");
      },
      cancel);
  ASSERT_TRUE(waveform.defined());
  EXPECT_GT(waveform.numel(), 0);
  worker.stop();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace omni::pipeline
