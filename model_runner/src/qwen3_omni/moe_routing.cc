#include "model_runner/qwen3_omni/moe_routing.h"

#include <ATen/ATen.h>

#include <optional>

#include "cpu_offload/check.h"

namespace omni::models::qwen3_omni {

MoeRouting route_tokens(const at::Tensor& top_index, const at::Tensor& top_weights,
                        int64_t num_experts) {
  OMNI_CHECK(top_index.dim() == 2 && top_weights.sizes() == top_index.sizes(),
             "MoE routing wants top_index and top_weights [tokens, top_k] of one shape, got ",
             top_index.sizes(), " and ", top_weights.sizes());
  MoeRouting routing;
  routing.top_k = top_index.size(1);
  // Each token's experts in increasing order (the router gives them by weight; a token's
  // experts are distinct, so there are no ties): the [tokens, top_k] layout the outputs are
  // summed in then adds them in the reference's order.
  auto [by_expert, slot] = at::sort(top_index, /*dim=*/-1);
  auto flat_ids = by_expert.flatten();
  // Stable, so that the rows of one expert stay in token order. (The optional<bool> spelled
  // out: a plain `true` would pick the sort(self, dim, descending) overload.)
  auto [sorted_ids, order] = at::sort(flat_ids, std::optional<bool>(true), /*dim=*/0);
  routing.order = order;
  routing.tokens = at::div(order, routing.top_k, "trunc");
  routing.weights = top_weights.gather(-1, slot).flatten().index_select(0, order);

  const int64_t rows = flat_ids.numel();
  if (rows <= num_experts) {
    routing.plan = MoeRouting::Plan::kDecode;
    const auto ids = sorted_ids.cpu();  // the one copy to the host: rows values
    ++routing.host_copies;
    const auto* id = ids.data_ptr<int64_t>();
    for (int64_t begin = 0; begin < rows;) {
      int64_t end = begin + 1;
      while (end < rows && id[end] == id[begin]) ++end;
      routing.experts.push_back({id[begin], begin, end});
      begin = end;
    }
  } else {
    routing.plan = MoeRouting::Plan::kPrefill;
    // offsets[e] = the first sorted row of expert e, i.e. the running sum of the per-expert
    // counts, read off the sorted ids. Not at::bincount + cumsum: bincount on CUDA reads its
    // input's min and max on the host to size the output, a synchronization of its own.
    const auto bounds = at::arange(num_experts + 1, flat_ids.options());
    const auto offsets = at::searchsorted(sorted_ids, bounds).cpu();  // the one copy: E + 1
    ++routing.host_copies;
    const auto* offset = offsets.data_ptr<int64_t>();
    for (int64_t e = 0; e < num_experts; ++e) {
      if (offset[e + 1] > offset[e]) routing.experts.push_back({e, offset[e], offset[e + 1]});
    }
  }
  return routing;
}

at::Tensor combine_expert_outputs(at::Tensor sorted_outputs, const MoeRouting& routing) {
  const int64_t rows = sorted_outputs.size(0);
  const int64_t hidden = sorted_outputs.size(1);
  sorted_outputs.mul_(routing.weights.unsqueeze(-1));
  auto per_slot = at::empty_like(sorted_outputs).index_copy_(0, routing.order, sorted_outputs);
  return per_slot.view({rows / routing.top_k, routing.top_k, hidden}).sum(1);
}

}  // namespace omni::models::qwen3_omni
