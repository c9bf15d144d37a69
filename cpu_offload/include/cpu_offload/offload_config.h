// What the user asks of the engine. Parsed at the edges (CLI, YAML) into this struct.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace omni::offload {

enum class Strategy { kNone, kModelLevel, kLayerwise, kComponent };
enum class Granularity { kBlock, kPhase };
// Component offload: when offloaded components leave the device.
enum class ComponentPolicy {
  kAlternating,  // when another one needs the room (all others at once without a budget)
  kSequential,   // right after each of its forwards
};

Strategy parse_strategy(const std::string& text);        // none | model | layerwise | component
Granularity parse_granularity(const std::string& text);  // block | phase
ComponentPolicy parse_component_policy(const std::string& text);  // alternating | sequential
std::string to_string(Strategy strategy);
std::string to_string(Granularity granularity);
std::string to_string(ComponentPolicy policy);

struct OffloadConfig {
  // Model-level offload (vLLM-Omni's "cpu offload"): component groups in mutual exclusion.
  bool model_level = false;
  // Layerwise offload: stream the DiT's blocks through a window of device slots.
  bool layerwise = false;
  // Component offload for AR models (the thinker's visual / audio_tower, ...): the matched
  // components come to the device when called and leave by `component_policy`.
  bool component = false;
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
  // Component: dotted module paths; a '*' or '?' matches within one path segment
  // ("visual", "audio_tower", "thinker.*"). Nested matches belong to the outermost.
  std::vector<std::string> components;
  ComponentPolicy component_policy = ComponentPolicy::kAlternating;

  // Device bytes the weights may use (0: no budget).
  //   model-level: when the current group, the next one and the resident weights fit, the
  //     next group is copied while the current one computes; 0 keeps strict exclusion.
  //   component (alternating): components stay on the device until a load would exceed it,
  //     then the least recently used ones leave; 0 makes every other component leave.
  size_t device_budget_bytes = 0;
  // Component: the budget as a fraction of the device's memory (used when > 0 and no byte
  // budget is set).
  double device_budget_fraction = 0;

  static OffloadConfig for_strategy(Strategy strategy);
  // The strategy that runs; when several are enabled: layerwise, then component, then
  // model-level (logged).
  Strategy strategy() const;
  // Throws omni::Error naming the bad field and value.
  void validate() const;
};

}  // namespace omni::offload
