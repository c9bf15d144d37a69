#include "worker/qwen3_omni/payloads.h"

#include "cpu_offload/check.h"
#include "worker/pipeline/local_stage_base.h"

namespace omni::pipeline {

NamedTensors ThinkerRows::tensors() const {
  NamedTensors out;
  if (first) {
    std::vector<int64_t> grids;
    for (const auto& g : image_grids) grids.insert(grids.end(), g.begin(), g.end());
    out.emplace_back("prompt_ids", local::ids_tensor(prompt_ids));
    out.emplace_back("tts_embeds", tts_embeds);
    out.emplace_back("stop_tokens", local::ids_tensor(stop_tokens));
    out.emplace_back("image_grids", local::ids_tensor(grids).reshape(
                                        {static_cast<int64_t>(image_grids.size()), 3}));
  }
  if (embeds.defined()) {
    out.emplace_back("embeds", embeds);
    out.emplace_back("hidden", hidden);
  }
  return out;
}

ThinkerRows ThinkerRows::read(const NamedTensors& wire) {
  ThinkerRows r;
  const at::Tensor prompt_ids = named_tensor(wire, "prompt_ids");
  r.first = prompt_ids.defined();
  if (r.first) {
    r.prompt_ids = local::ids_from(prompt_ids);
    r.tts_embeds = named_tensor(wire, "tts_embeds");
    r.stop_tokens = local::ids_from(named_tensor(wire, "stop_tokens"));
    const auto g = local::ids_from(named_tensor(wire, "image_grids"));
    OMNI_CHECK(g.size() % 3 == 0, "a thinker packet's image_grids holds ", g.size(),
               " values, not (t, h, w) triples");
    for (size_t i = 0; i < g.size(); i += 3) r.image_grids.push_back({g[i], g[i + 1], g[i + 2]});
  }
  r.embeds = named_tensor(wire, "embeds");
  r.hidden = named_tensor(wire, "hidden");
  OMNI_CHECK(r.embeds.defined() == r.hidden.defined(),
             "a thinker packet carries embeds without hidden rows or the reverse");
  return r;
}

DecodedWaveform DecodedWaveform::read(const NamedTensors& wire) {
  DecodedWaveform w;
  w.waveform = named_tensor(wire, "waveform");
  return w;
}

}  // namespace omni::pipeline
