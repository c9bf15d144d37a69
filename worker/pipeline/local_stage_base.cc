#include "worker/pipeline/local_stage_base.h"

#include <ATen/ATen.h>

namespace omni::pipeline::local {

void check_going(const StageCall& call, const CancelToken& cancel) {
  if (cancel.cancelled()) {
    throw StageError(StageError::Code::kCancelled, "", "the request was cancelled");
  }
  if (Clock::now() >= call.deadline) {
    throw StageError(StageError::Code::kDeadlineExceeded, "", "the request's deadline passed");
  }
}

at::Tensor cpu(const at::Tensor& t) { return t.to(at::kCPU).contiguous(); }

at::Tensor ids_tensor(const std::vector<int64_t>& ids) { return at::tensor(ids, at::kLong); }

std::vector<int64_t> ids_from(const at::Tensor& t) {
  const auto c = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

Json kv_stats(const KvStats& kv) {
  return {{"kv_block_size", kv.block_size},
          {"kv_block_bytes", kv.block_bytes},
          {"kv_blocks_total", kv.total_blocks},
          {"kv_blocks_reserved", kv.reserved},
          {"kv_blocks_used", kv.used},
          {"kv_pool_bytes", kv.pool_bytes},
          {"kv_reallocations", kv.reallocations},
          {"kv_bytes_copied", kv.bytes_copied},
          {"kv_preemptions", kv.preemptions},
          {"kv_resumed", kv.resumed},
          {"kv_admission_waits", kv.admission_waits}};
}

Json engine_stats(const EngineLoop& loop) {
  const auto e = loop.stats();
  return {{"running", e.running},
          {"waiting", e.waiting},
          {"steps", e.steps},
          {"admitted", e.admitted},
          {"finished", e.finished},
          {"cancelled", e.cancelled},
          {"failed", e.failed},
          {"refused", e.refused},
          {"last_batch", e.last_batch},
          {"max_batch", e.max_batch},
          {"mean_batch", e.mean_batch()},
          {"batch_rows", e.batch_rows},
          {"queue_ms_total", e.queue_ms_total},
          {"busy_ms_total", e.busy_ms_total},
          {"prefill_chunks", e.prefill_chunks},
          {"prefill_tokens", e.prefill_tokens},
          {"chunked_prefill", loop.limits().chunked_prefill},
          {"max_num_seqs", loop.limits().max_num_seqs}};
}

std::string offload_stats_json(offload::OffloadBackend& backend) {
  return backend.stats().to_json();
}

models::RunnerOffloadOptions whole_stage_offload(bool pin_memory) {
  models::RunnerOffloadOptions o;
  o.cpu_offload_enabled = true;
  o.components = {"thinker.*"};
  o.strategy = "alternating";
  o.pin_memory = pin_memory;
  o.device_budget_bytes = size_t{1} << 62;
  return o;
}

}  // namespace omni::pipeline::local
