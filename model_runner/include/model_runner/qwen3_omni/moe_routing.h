// Top-k MoE routing grouped on the device: which rows each expert takes, found without a host
// synchronization per expert. Every (token, expert) pair is sorted by expert once, on the
// device; each hit expert then reads one contiguous range of the sorted rows, and the host
// learns those ranges from a single small copy per layer (it needs them to slice the rows and
// to call the experts).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace omni::models::qwen3_omni {

// Sorted rows [begin, end) go to `expert`.
struct ExpertRows {
  int64_t expert = 0;
  int64_t begin = 0;
  int64_t end = 0;
};

struct MoeRouting {
  // How the host learned the ranges (the experts then run the same way in both):
  //  kDecode: few rows (tokens * top_k <= num_experts): the sorted expert ids were copied.
  //  kPrefill: more rows: the per-expert offsets [num_experts + 1] were copied instead,
  //            so the copy stays num_experts + 1 values however long the prompt.
  enum class Plan { kDecode, kPrefill };
  Plan plan = Plan::kDecode;
  int64_t top_k = 0;
  // One entry per sorted row, rows grouped by expert in increasing order, and within an expert
  // by token (the order of the reference's per-expert loop):
  at::Tensor order;    // [tokens * top_k] int64: the row's place in the [tokens, top_k] layout
  at::Tensor tokens;   // [tokens * top_k] int64: the token the row belongs to
  at::Tensor weights;  // [tokens * top_k]: the row's routing weight
  std::vector<ExpertRows> experts;  // the hit experts only, in increasing order
  int64_t host_copies = 0;          // device-to-host copies made while routing (one)
};

// top_index, top_weights [tokens, top_k]: the router's choice per token (distinct experts).
MoeRouting route_tokens(const at::Tensor& top_index, const at::Tensor& top_weights,
                        int64_t num_experts);

// The experts' outputs for the sorted rows [tokens * top_k, hidden] (consumed: weighted in
// place) -> [tokens, hidden]: each row weighted by its routing weight, then summed per token
// with the token's experts in increasing order, the order in which the reference's per-expert
// index_add_ adds them (the same floats on the CPU). A scatter to distinct places (index_copy_)
// and a sum over top_k rather than one index_add_: index_add_ on CUDA adds with atomics, so
// with top_k >= 3 the order of a token's additions, and then its float result, would change
// from run to run and offloaded runs would no longer equal resident ones bit for bit.
at::Tensor combine_expert_outputs(at::Tensor sorted_outputs, const MoeRouting& routing);

}  // namespace omni::models::qwen3_omni
