// The wire tests build and read packets by named tensors: a packet's payload as its wire form.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "worker/pipeline/stage.h"

namespace omni::rpc::testing {

// Adds `tensor` as `name` to the payload of `p` (a WirePayload).
inline void add_tensor(pipeline::StagePacket& p, std::string name, at::Tensor tensor) {
  pipeline::NamedTensors all = p.payload ? p.payload->tensors() : pipeline::NamedTensors{};
  all.emplace_back(std::move(name), std::move(tensor));
  p.payload = std::make_shared<const pipeline::WirePayload>(std::move(all));
}

inline pipeline::NamedTensors tensors_of(const pipeline::StagePacket& p) {
  return p.payload ? p.payload->tensors() : pipeline::NamedTensors{};
}

}  // namespace omni::rpc::testing
