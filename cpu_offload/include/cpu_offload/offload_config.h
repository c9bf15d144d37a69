// What the user asks of the engine. Parsed at the edges (CLI, YAML) into this struct.
#pragma once

#include <cstddef>
#include <string>

namespace omni::offload {

enum class Strategy { kNone, kModelLevel, kLayerwise };
enum class Granularity { kBlock, kPhase };

Strategy parse_strategy(const std::string& text);        // none | model | layerwise
Granularity parse_granularity(const std::string& text);  // block | phase
std::string to_string(Strategy strategy);
std::string to_string(Granularity granularity);

struct OffloadConfig {
  // Model-level offload (vLLM-Omni's "cpu offload"): component groups in mutual exclusion.
  bool model_level = false;
  // Layerwise offload: stream the DiT's blocks through a window of device slots.
  bool layerwise = false;
  // Keep host slabs in pinned memory (faster, overlappable copies).
  bool pin_memory = true;

  // Layerwise: units on the device ahead of the one computing (the window depth).
  int num_gpu_layers = 1;
  // Layerwise: a unit is a whole block, or a phase of one (attention, cross-attention, FFN).
  Granularity granularity = Granularity::kBlock;
  // Layerwise: fraction of each block list that is streamed (the first blocks); the rest stays
  // resident. 1 streams every block.
  double offload_ratio = 1.0;

  // Model-level: the VAE joins the mutual exclusion instead of staying resident.
  bool strict_vae = false;
  // Model-level: device bytes the weights may use. When the current group, the next one and
  // the resident weights fit, the next group is copied while the current one computes.
  // 0 keeps strict mutual exclusion.
  size_t device_budget_bytes = 0;

  static OffloadConfig for_strategy(Strategy strategy);
  // The strategy that runs; when both are enabled, layerwise wins (logged once).
  Strategy strategy() const;
  // Throws omni::Error naming the bad field and value.
  void validate() const;
};

}  // namespace omni::offload
