// /metrics from the stages' statistics (worker/http/server_metrics.h): the offload families of
// every stage, and the expert cache's and disk tiers' families only for a stage that has them.
#include "worker/http/server_metrics.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace omni::http {
namespace {

bool has_line(const std::string& body, const std::string& line) {
  return ("\n" + body).find("\n" + line + "\n") != std::string::npos;
}

TEST(ServerMetrics, ExpertCacheAndDiskTierFamiliesForTheStagesThatHaveThem) {
  // Every stage's figures, a worker's with its counters under "worker".
  const std::string stats = R"json({
    "stage 0 (thinker)": {"worker": {}, 
      "bytes_h2d": 10, "loads": 1, "stall_ms": 0, "current_device_bytes": 0,
      "peak_device_bytes": 0, "host_bytes": 0, "param_bytes": 5,
      "disk": {"read_bytes": 777, "wait_ms": 0, "entries": 3},
      "expert_cache": {"hits": 7, "misses": 3, "host_computed": 1, "bytes_h2d": 4096,
                       "stall_ms": 1500, "device_bytes": 8192,
                       "disk": {"read_bytes": 12345, "wait_ms": 250, "entries": 4}}},
    "stage 1 (talker)": {"bytes_h2d": 0, "loads": 0, "stall_ms": 0, "param_bytes": 2}})json";
  const std::string body = offload_metrics(stats);
  const std::string thinker = "{stage=\"stage 0 (thinker)\"}";
  EXPECT_TRUE(has_line(body, "omni_expert_cache_hits_total" + thinker + " 7")) << body;
  EXPECT_TRUE(has_line(body, "omni_expert_cache_misses_total" + thinker + " 3")) << body;
  EXPECT_TRUE(has_line(body, "omni_expert_cache_host_computed_total" + thinker + " 1")) << body;
  EXPECT_TRUE(has_line(body, "omni_expert_cache_bytes_moved_total" + thinker + " 4096")) << body;
  EXPECT_TRUE(has_line(body, "omni_expert_cache_stall_seconds_total" + thinker + " 1.5")) << body;
  EXPECT_TRUE(has_line(body, "omni_expert_cache_device_bytes" + thinker + " 8192")) << body;
  EXPECT_TRUE(has_line(
      body, "omni_disk_read_bytes_total{stage=\"stage 0 (thinker)\",tier=\"experts\"} 12345"))
      << body;
  EXPECT_TRUE(has_line(body,
                       "omni_disk_wait_seconds_total{stage=\"stage 0 (thinker)\",tier=\"experts\"} "
                       "0.25"))
      << body;
  EXPECT_TRUE(
      has_line(body, "omni_disk_read_bytes_total{stage=\"stage 0 (thinker)\",tier=\"layers\"} 777"))
      << body;
  EXPECT_TRUE(
      has_line(body, "omni_disk_cache_entries{stage=\"stage 0 (thinker)\",tier=\"experts\"} 4"))
      << body;
  // The talker has no experts and no disk tier: none of their samples.
  EXPECT_EQ(body.find("omni_expert_cache_hits_total{stage=\"stage 1 (talker)\"}"),
            std::string::npos);
  EXPECT_TRUE(has_line(body, "omni_weight_bytes{stage=\"stage 1 (talker)\"} 2")) << body;

  // Without expert offload anywhere, the families are not written at all.
  const std::string plain = offload_metrics(R"json({"stage 1 (talker)": {"bytes_h2d": 0}})json");
  EXPECT_EQ(plain.find("omni_expert_cache"), std::string::npos) << plain;
  EXPECT_EQ(plain.find("omni_disk_"), std::string::npos) << plain;
}

// A batching stage's loop and KV blocks, also while a step runs (no offload figures then).
TEST(ServerMetrics, EngineFamiliesOfABatchingStage) {
  const std::string stats = R"json({
    "stage 0 (thinker)": {"running": true,
      "engine": {"running": 3, "waiting": 2, "steps": 40, "batch_rows": 100, "last_batch": 3,
                 "queue_ms_total": 250, "admitted": 9, "kv_blocks_used": 12,
                 "kv_blocks_reserved": 30, "kv_blocks_total": 64}}})json";
  const std::string body = offload_metrics(stats);
  const std::string l = "{stage=\"stage 0 (thinker)\"}";
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"omni_engine_running_requests", "3"}, {"omni_engine_waiting_requests", "2"},
      {"omni_engine_steps_total", "40"},     {"omni_engine_batch_rows_total", "100"},
      {"omni_engine_last_batch_size", "3"},  {"omni_engine_queue_seconds_total", "0.25"},
      {"omni_engine_admitted_total", "9"},   {"omni_kv_blocks_used", "12"},
      {"omni_kv_blocks_reserved", "30"},     {"omni_kv_blocks_total", "64"}};
  for (const auto& [metric, value] : expected) {
    std::string line = metric;
    line += l;
    line += " ";
    line += value;
    EXPECT_TRUE(has_line(body, line)) << line << "\n" << body;
  }
  EXPECT_TRUE(has_line(body, "omni_stage_up" + l + " 0")) << body;  // mid-step: no offload figures
}

}  // namespace
}  // namespace omni::http
