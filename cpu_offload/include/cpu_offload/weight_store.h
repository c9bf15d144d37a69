// Offload units and their host slabs.
//
// An offload unit (a block, a phase of a block, a component, or the resident set) keeps all
// its tensors, of every dtype, in one contiguous aligned host slab, so the unit moves to the
// device in a single copy. Packing a unit releases each tensor's original storage: the
// weights are never held twice in host memory. On the device, the unit's tensors are views
// into an engine-owned buffer (a slot); the module's parameters are rebound to those views
// in place, so model code sees ordinary parameters. Nothing is ever copied back.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cpu_offload/transfer_engine.h"

namespace omni::offload {

struct UnitTensor {
  std::string name;  // dotted path from the root module
  // Shares its TensorImpl with the module's parameter or buffer: rebinding this tensor
  // rebinds the module's.
  at::Tensor tensor;
  size_t offset = 0;  // byte offset in the slab
  size_t nbytes = 0;
  std::vector<int64_t> sizes;
  at::ScalarType dtype = at::kFloat;
};

class OffloadUnit {
 public:
  // Packs `tensors` into one slab from `engine` (pinned if `pin`) and releases their storage.
  OffloadUnit(std::string name, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
              TransferEngine& engine, bool pin);

  const std::string& name() const { return name_; }
  const std::vector<UnitTensor>& tensors() const { return tensors_; }
  // Slab size: the tensors' bytes plus alignment padding.
  size_t bytes() const { return bytes_; }
  // Sum of the tensors' own bytes.
  size_t tensor_bytes() const { return tensor_bytes_; }
  const HostBuffer& host() const { return host_; }

  // The copy that brings this unit to `dst` at `dst_offset`.
  CopyOp copy_to(const DeviceBuffer& dst, size_t dst_offset) const;
  // Rebinds every tensor as a view into `buffer` at `offset` (the unit must be there).
  void bind(const DeviceBuffer& buffer, size_t offset);
  // Rebinds every tensor to an empty placeholder: a forward that runs without the unit
  // loaded fails loudly instead of computing with stale or missing weights.
  void unbind();
  bool bound() const { return bound_; }
  // Drops the host slab (for units that stay on the device for good).
  void release_host() { host_ = HostBuffer(); }

 private:
  std::string name_;
  std::vector<UnitTensor> tensors_;
  size_t bytes_ = 0;
  size_t tensor_bytes_ = 0;
  HostBuffer host_;
  bool bound_ = false;
};

// A view of `sizes`/`dtype` at byte `offset` of `storage_owner`'s storage.
at::Tensor make_view(const at::Tensor& storage_owner, size_t offset, at::IntArrayRef sizes,
                     at::ScalarType dtype);

}  // namespace omni::offload
